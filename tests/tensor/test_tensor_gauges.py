"""Observable gauges of tensor metrics: one per family and meter, fanned out to sources; a
failing source loses only its own points; read through an InMemoryMetricReader."""

from __future__ import annotations

import logging
import math

import pytest
from support import import_or_unavailable

import_or_unavailable("torch")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from otel_training import testing  # noqa: E402
from otel_training.semconv.metrics import METRICS  # noqa: E402
from otel_training.tensor import TENSOR_FAMILIES, TensorMetricGauges, layer_attributes  # noqa: E402

GRAD = "megatron.training.tensor.grad_norm"
ROUTER = "megatron.training.tensor.router_balance"


class Source:
    """A source of fixed values."""

    def __init__(self, values: dict[str, list[tuple[dict, float]]]) -> None:
        self.values = values

    def observe(self, family):
        return self.values.get(family, [])


class Raising:
    def __init__(self) -> None:
        self.calls = 0

    def observe(self, family):
        self.calls += 1
        raise RuntimeError("layer tensor was freed")


@pytest.fixture
def meter_and_reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider.get_meter("test"), reader
    provider.shutdown()


def _collect(reader) -> dict[str, dict[str, float]]:
    found: dict[str, dict[str, float]] = {}
    for name, point in testing.points(reader.get_metrics_data()):
        key = "|".join(str(v) for v in point.attributes.values())
        found.setdefault(name, {})[key] = point.value
    return found


def test_every_family_has_one_gauge_per_meter_with_its_registry_unit(meter_and_reader):
    """for_meter makes one observable gauge per family, once; unit and description from semconv."""
    meter, _ = meter_and_reader
    gauges = TensorMetricGauges.for_meter(meter)
    assert TensorMetricGauges.for_meter(meter) is gauges
    assert set(gauges.instruments) == set(TENSOR_FAMILIES)
    assert len(TENSOR_FAMILIES) == 12
    for family, instrument in gauges.instruments.items():
        assert (instrument.unit, instrument.description) == (
            METRICS[family].unit,
            METRICS[family].description,
        )


def test_one_callback_fans_out_to_every_source(meter_and_reader):
    """Two sources on the same meter both reach the one gauge of a family."""
    meter, reader = meter_and_reader
    gauges = TensorMetricGauges.for_meter(meter)
    a = Source({GRAD: [(layer_attributes("decoder.layers.0"), 1.0)]})
    b = Source({GRAD: [(layer_attributes("decoder.layers.1"), 2.0)]})
    gauges.add_source(a)
    gauges.add_source(b)
    assert _collect(reader)[GRAD] == {"decoder.layers.0": 1.0, "decoder.layers.1": 2.0}


def test_a_raising_source_loses_only_its_own_points_and_logs_once(meter_and_reader, caplog):
    """Other sources of the same family, and other families, keep their points."""
    meter, reader = meter_and_reader
    gauges = TensorMetricGauges.for_meter(meter)
    good = Source(
        {
            GRAD: [(layer_attributes("global"), 3.0)],
            ROUTER: [({"megatron.training.layer": "decoder.layers.0",
                       "megatron.training.router.statistic": "dead_fraction"}, 0.25)],
        }
    )  # fmt: skip
    raising = Raising()
    gauges.add_source(raising)
    gauges.add_source(good)
    with caplog.at_level(logging.WARNING, logger="otel_training.tensor.gauges"):
        for _ in range(5):
            found = _collect(reader)
    assert found[GRAD] == {"global": 3.0}
    assert found[ROUTER] == {"decoder.layers.0|dead_fraction": 0.25}
    assert raising.calls == 5 * len(TENSOR_FAMILIES)
    per_family = [r for r in caplog.records if "layer tensor was freed" in r.getMessage()]
    assert len(per_family) == len(TENSOR_FAMILIES)  # once per family and cause, not per export


def test_non_finite_values_are_not_observed(meter_and_reader):
    """NaN and infinite values are skipped (the SDK would drop them silently)."""
    meter, reader = meter_and_reader
    source = Source(
        {
            GRAD: [
                (layer_attributes("decoder.layers.0"), math.nan),
                (layer_attributes("decoder.layers.1"), math.inf),
                (layer_attributes("global"), 5.0),
            ]
        }
    )
    TensorMetricGauges.for_meter(meter).add_source(source)
    assert _collect(reader)[GRAD] == {"global": 5.0}


def test_sources_are_held_weakly_and_removable(meter_and_reader):
    """A dropped source stops being read; remove() stops it at once."""
    import gc

    meter, reader = meter_and_reader
    gauges = TensorMetricGauges.for_meter(meter)
    kept = Source({GRAD: [(layer_attributes("decoder.layers.0"), 1.0)]})
    remove = gauges.add_source(kept)
    gauges.add_source(Source({GRAD: [(layer_attributes("decoder.layers.1"), 2.0)]}))
    gc.collect()
    assert _collect(reader)[GRAD] == {"decoder.layers.0": 1.0}
    remove()
    assert GRAD not in _collect(reader)


def test_a_meter_that_refuses_gauges_does_not_raise(caplog):
    """Gauge creation failures are logged, never raised."""

    class Refusing:
        def create_observable_gauge(self, *args, **kwargs):
            raise RuntimeError("no")

    with caplog.at_level(logging.WARNING):
        gauges = TensorMetricGauges(Refusing())
    assert gauges.instruments == {}
    assert caplog.records


# -- a second set of gauges on one meter --------------------------------------------------------


def test_a_set_built_after_for_meter_is_read_by_the_first_sets_gauges(meter_and_reader):
    """The constructor on a meter that has gauges creates none (the SDK would ignore their
    callbacks): its sources are read by the first set's gauges, beside the first set's."""
    meter, reader = meter_and_reader
    first = TensorMetricGauges.for_meter(meter)
    a = Source({GRAD: [(layer_attributes("decoder.layers.0"), 1.0)]})
    b = Source({GRAD: [(layer_attributes("decoder.layers.1"), 2.0)]})
    first.add_source(a)
    second = TensorMetricGauges(meter)
    second.add_source(b)
    assert second.instruments is first.instruments
    assert _collect(reader)[GRAD] == {"decoder.layers.0": 1.0, "decoder.layers.1": 2.0}


def test_for_meter_after_the_constructor_returns_the_constructors_set(meter_and_reader):
    """An observer (for_meter) after a set built with the constructor records into that set's
    gauges; the families the first set lacked are created then."""
    meter, reader = meter_and_reader
    first = TensorMetricGauges(meter, families=[GRAD])
    a = Source({GRAD: [(layer_attributes("decoder.layers.0"), 1.0)]})
    first.add_source(a)
    assert set(first.instruments) == {GRAD}
    assert TensorMetricGauges.for_meter(meter) is first
    second = TensorMetricGauges(meter)
    router = ({"megatron.training.layer": "decoder.layers.0",
               "megatron.training.router.statistic": "dead_fraction"}, 0.25)  # fmt: skip
    b = Source({GRAD: [(layer_attributes("global"), 3.0)], ROUTER: [router]})
    second.add_source(b)
    assert set(first.instruments) == set(TENSOR_FAMILIES)
    found = _collect(reader)
    assert found[GRAD] == {"decoder.layers.0": 1.0, "global": 3.0}
    assert found[ROUTER] == {"decoder.layers.0|dead_fraction": 0.25}


def test_a_set_on_a_new_pipelines_meter_records_after_a_proxy_scope_moved_onto_it():
    """Gauges on otel_training.get_meter() in one pipeline, configure() again, then a set built
    with the constructor on the new pipeline's meter of the same scope: both sets export there."""
    import otel_training

    testing.configure_in_memory()
    on_proxy = Source({GRAD: [(layer_attributes("decoder.layers.0"), 1.0)]})
    TensorMetricGauges.for_meter(otel_training.get_meter()).add_source(on_proxy)
    telemetry = testing.configure_in_memory()
    on_pipeline = Source({GRAD: [(layer_attributes("decoder.layers.1"), 2.0)]})
    TensorMetricGauges(telemetry.meter).add_source(on_pipeline)
    values = {p.attributes["megatron.training.layer"]: p.value for _, p in telemetry.points(GRAD)}
    assert values == {"decoder.layers.0": 1.0, "decoder.layers.1": 2.0}


def test_a_set_built_on_a_proxy_meter_follows_its_scope_into_the_next_pipeline():
    """The constructor on otel_training.get_meter() is read with the scope's sources, in the
    pipeline configured now and in the next one."""
    import otel_training

    first = testing.configure_in_memory()
    source = Source({GRAD: [(layer_attributes("global"), 4.0)]})
    gauges = TensorMetricGauges(otel_training.get_meter())
    gauges.add_source(source)
    assert [p.value for _, p in first.points(GRAD)] == [4.0]
    second = testing.configure_in_memory()
    assert [p.value for _, p in second.points(GRAD)] == [4.0]
    assert set(gauges.instruments) == set(TENSOR_FAMILIES)
