"""record_training_metrics: Megatron-LM's contract, and what otel-training adds to it."""

from __future__ import annotations

import gc
import logging
import math
import threading
import weakref
from fractions import Fraction

import numpy as np
import pytest
from doc_rules import documents
from opentelemetry import metrics as metrics_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    InMemoryMetricReader,
    Sum,
)
from support import import_or_unavailable, metrics_of

from otel_training import testing
from otel_training.metrics import instruments
from otel_training.metrics.instruments import record_training_metrics
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_METRIC,
    MEGATRON_TRAINING_NONFINITE_VALUES,
)

P = "megatron.training."
ALL_EIGHT = dict(
    step_duration_ms=123.5,
    loss=2.75,
    throughput_tflops=410.0,
    grad_norm=0.9,
    skipped_iters=2,
    learning_rate=1e-4,
    tokens_per_sec=50000.0,
    memory_allocated_gb=64.25,
)
KIND = {
    "step_duration_ms": "histogram",
    "loss": "gauge",
    "throughput_tflops": "gauge",
    "grad_norm": "gauge",
    "skipped_iters": "counter",
    "learning_rate": "gauge",
    "tokens_per_sec": "gauge",
    "memory_allocated_gb": "gauge",
}


class RecordingInstrument:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.values: list[object] = []
        self.threads: list[str] = []

    def _take(self, value, attributes=None) -> None:
        self.values.append(value)
        self.threads.append(threading.current_thread().name)

    record = set = add = _take


class RecordingMeter:
    """A meter with only the three factories Megatron-LM's module calls."""

    def __init__(self) -> None:
        self.instruments: dict[str, RecordingInstrument] = {}
        self.create_calls = 0

    def _create(self, kind, name, unit=None, description=None):
        self.create_calls += 1
        self.instruments[name] = RecordingInstrument(kind)
        return self.instruments[name]

    def create_histogram(self, name, unit=None, description=None):
        return self._create("histogram", name)

    def create_gauge(self, name, unit=None, description=None):
        return self._create("gauge", name)

    def create_counter(self, name, unit=None, description=None):
        return self._create("counter", name)


class BrokenMeter:
    def create_histogram(self, *args, **kwargs):
        raise RuntimeError("meter is broken")

    create_gauge = create_counter = create_histogram


def sdk_meter():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    return provider, reader, provider.get_meter("test")


def collected(reader, name=None):
    instruments.flush_deferred(5.0)
    return testing.points(reader.get_metrics_data(), name)


def metric_objects(reader):
    return {metric.name: metric for metric in metrics_of(reader.get_metrics_data())}


# -- Megatron-LM's contract -------------------------------------------------------------


def test_module_exposes_megatron_names():
    """The module has every module-level name of Megatron-LM's training_metrics module."""
    for name in (
        "MEGATRON_TRAINING_STEP_DURATION_MS",
        "MEGATRON_TRAINING_LOSS",
        "MEGATRON_TRAINING_THROUGHPUT_TFLOPS",
        "MEGATRON_TRAINING_GRAD_NORM",
        "MEGATRON_TRAINING_SKIPPED_ITERS",
        "MEGATRON_TRAINING_LEARNING_RATE",
        "MEGATRON_TRAINING_TOKENS_PER_SEC",
        "MEGATRON_TRAINING_MEMORY_ALLOCATED_GB",
        "metrics",
        "_TRAINING_INSTRUMENTS",
        "_get_training_instruments",
        "record_training_metrics",
    ):
        assert hasattr(instruments, name), name
    assert isinstance(instruments._TRAINING_INSTRUMENTS, weakref.WeakKeyDictionary)
    assert instruments.metrics is metrics_api
    assert instruments.MEGATRON_TRAINING_LOSS == P + "loss"


def test_creates_eight_instruments_of_megatron_kinds_once():
    """The first call creates the eight instruments with Megatron's kinds; later calls none."""
    meter = RecordingMeter()
    record_training_metrics(meter, loss=1.0)
    assert {n: i.kind for n, i in meter.instruments.items()} == {
        P + key: kind for key, kind in KIND.items()
    }
    record_training_metrics(meter, loss=2.0)
    assert meter.create_calls == 8


def test_records_every_value_on_its_instrument():
    """Each keyword lands on its own instrument, exactly once."""
    meter = RecordingMeter()
    record_training_metrics(meter, **ALL_EIGHT)
    for key, value in ALL_EIGHT.items():
        assert meter.instruments[P + key].values == [value], key


@pytest.mark.parametrize("key", list(KIND))
def test_one_value_in_isolation(key):
    """An int given for one metric reaches only that metric's instrument, unchanged in value."""
    meter = RecordingMeter()
    record_training_metrics(meter, **{key: 1})
    for name, instrument in meter.instruments.items():
        assert instrument.values == ([1] if name == P + key else []), name


@documents("README.md", "`megatron.training.skipped_iters` | Counter (added only when > 0)")
@pytest.mark.parametrize("value,expected", [(0, []), (1, [1]), (5, [5]), (-3, [])])
def test_counter_only_adds_positive(value, expected):
    """skipped_iters is added only when > 0."""
    meter = RecordingMeter()
    record_training_metrics(meter, skipped_iters=value)
    assert meter.instruments[P + "skipped_iters"].values == expected


@pytest.mark.parametrize("key", ["loss", "grad_norm", "learning_rate", "step_duration_ms"])
def test_zero_is_recorded(key):
    """A zero loss is a real observation and is recorded."""
    meter = RecordingMeter()
    record_training_metrics(meter, **{key: 0.0})
    assert meter.instruments[P + key].values == [0.0]


def test_grad_norm_becomes_a_float():
    """grad_norm given as an object with __float__ is recorded as a plain float at once."""

    class Scalar:
        def __float__(self):
            return 1.5

    meter = RecordingMeter()
    record_training_metrics(meter, grad_norm=Scalar())
    (value,) = meter.instruments[P + "grad_norm"].values
    assert value == 1.5 and type(value) is float


def test_cache_is_weak_and_per_meter():
    """Each meter gets its own instruments, and the cache never keeps a meter alive."""
    first, second = RecordingMeter(), RecordingMeter()
    record_training_metrics(first, loss=1.0)
    record_training_metrics(second, loss=2.0)
    assert first.instruments[P + "loss"].values == [1.0]
    assert second.instruments[P + "loss"].values == [2.0]
    assert len(instruments._TRAINING_INSTRUMENTS) == 2
    del first, second
    gc.collect()
    assert len(instruments._TRAINING_INSTRUMENTS) == 0


def test_broken_meter_is_logged_once_and_not_cached(caplog):
    """A meter whose factories raise is logged once, never cached, and nothing raises."""
    meter = BrokenMeter()
    with caplog.at_level(logging.WARNING):
        record_training_metrics(meter, loss=1.0)
        record_training_metrics(meter, loss=1.0)
    assert caplog.text.count("Failed to create training metric instruments") == 1
    assert len(instruments._TRAINING_INSTRUMENTS) == 0


def test_no_op_without_opentelemetry(monkeypatch):
    """With `metrics` set to None (no opentelemetry), nothing is created."""
    monkeypatch.setattr(instruments, "metrics", None)
    meter = RecordingMeter()
    record_training_metrics(meter, loss=1.0)
    assert meter.create_calls == 0


# -- through the SDK ------------------------------------------------------------------------


@documents("README.md", "Rank identity is never a point attribute")
@documents(
    "README.md",
    "The first eight keep Megatron-LM's names, kinds and units",
)
@documents("README.md", "`megatron.training.step_duration_ms` | Histogram, unit `ms`")
def test_sdk_names_kinds_units_and_values():
    """Through the SDK the eight metrics arrive with Megatron's kinds, units and values."""
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, **ALL_EIGHT)
    found = metric_objects(reader)
    assert set(found) == {P + key for key in KIND}
    assert isinstance(found[P + "step_duration_ms"].data, Histogram)
    assert found[P + "step_duration_ms"].unit == "ms"
    assert isinstance(found[P + "skipped_iters"].data, Sum)
    assert found[P + "skipped_iters"].data.is_monotonic
    for key in ("loss", "throughput_tflops", "grad_norm", "learning_rate", "tokens_per_sec"):
        metric = found[P + key]
        assert isinstance(metric.data, Gauge), key
        assert metric.unit == "", key
        assert metric.data.data_points[0].value == ALL_EIGHT[key]
        assert dict(metric.data.data_points[0].attributes) == {}
    histogram = found[P + "step_duration_ms"].data.data_points[0]
    assert (histogram.count, histogram.sum) == (1, 123.5)


@pytest.mark.parametrize(
    "value",
    [np.float32(2.5), np.float64(2.5), "2.5", Fraction(5, 2), np.array(2.5), True],
    ids=["np.float32", "np.float64", "str", "Fraction", "np.array-0d", "bool"],
)
def test_accepts_what_float_accepts(value):
    """numpy scalars, strings and other float()-able values are recorded as numbers."""
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, loss=value)
    ((_, point),) = collected(reader, P + "loss")
    assert point.value == float(value)


def test_accepts_cpu_torch_scalars():
    """A 0-d CPU torch tensor is recorded as its number."""
    torch = import_or_unavailable("torch")
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, loss=torch.tensor(1091.08), skipped_iters=torch.tensor(2))
    ((_, loss),) = collected(reader, P + "loss")
    assert loss.value == pytest.approx(1091.08, rel=1e-6)
    ((_, skipped),) = collected(reader, P + "skipped_iters")
    assert skipped.value == 2


@pytest.mark.parametrize("bad", ["abc", object(), [1.0, 2.0], None.__class__], ids=str)
def test_values_that_are_not_numbers_are_dropped_with_one_warning(bad, caplog):
    """A value that cannot be a number is dropped with one warning and never raises."""
    _, reader, meter = sdk_meter()
    with caplog.at_level(logging.WARNING, logger="otel_training.metrics.instruments"):
        for _ in range(3):
            record_training_metrics(meter, loss=bad, learning_rate=3e-4)
    assert len([r for r in caplog.records if "loss" in r.getMessage()]) == 1
    assert collected(reader, P + "loss") == []
    ((_, lr),) = collected(reader, P + "learning_rate")
    assert lr.value == 3e-4


def test_multi_element_tensor_is_dropped():
    """A tensor with more than one element is not a scalar: dropped, not raised."""
    torch = import_or_unavailable("torch")
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, loss=torch.ones(3))
    assert collected(reader, P + "loss") == []


def test_negative_step_duration_is_dropped_with_a_warning(caplog):
    """A negative duration cannot be a histogram value: one warning, nothing recorded."""
    _, reader, meter = sdk_meter()
    with caplog.at_level(logging.WARNING, logger="otel_training.metrics.instruments"):
        record_training_metrics(meter, step_duration_ms=-5.0)
        record_training_metrics(meter, step_duration_ms=-6.0)
    assert len(caplog.records) == 1
    assert collected(reader, P + "step_duration_ms") == []


@documents(
    "README.md", "NaN/±Inf values given to `record_training_metrics`, by `megatron.training.metric`"
)
@documents("limits.md", "NaN and infinity are counted")
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float64("nan"), "nan"])
def test_nonfinite_values_are_counted_per_metric(bad, caplog):
    """NaN/Inf never vanish: the counter appears with the first one and counts per metric."""
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, loss=2.0, grad_norm=1.0)
    assert collected(reader, MEGATRON_TRAINING_NONFINITE_VALUES) == []
    with caplog.at_level(logging.WARNING, logger="otel_training.metrics.instruments"):
        record_training_metrics(meter, loss=bad, grad_norm=bad)
        record_training_metrics(meter, loss=bad)
    counts = {
        point.attributes[MEGATRON_TRAINING_METRIC]: point.value
        for _, point in collected(reader, MEGATRON_TRAINING_NONFINITE_VALUES)
    }
    assert counts == {P + "loss": 2, P + "grad_norm": 1}
    ((_, loss),) = collected(reader, P + "loss")
    assert loss.value == 2.0
    nonfinite_warnings = [r for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(nonfinite_warnings) == 2  # one per metric


def test_nonfinite_counter_is_not_created_early():
    """A meter that never sees NaN has exactly Megatron's eight instruments."""
    meter = RecordingMeter()
    for _ in range(5):
        record_training_metrics(meter, **ALL_EIGHT)
    assert len(meter.instruments) == 8


# -- deferred reads of device tensors (case A6) ------------------------------------------------


class DeviceScalar:
    """A CUDA-like 0-d tensor stub that records every scalar read and its thread."""

    is_cuda = True
    device = "cuda:0"

    def __init__(self, value: float, gate: threading.Event | None = None) -> None:
        self._value = value
        self._gate = gate
        self.reads: list[str] = []

    def _read(self) -> float:
        self.reads.append(threading.current_thread().name)
        if self._gate is not None:
            self._gate.wait(5)
        return self._value

    __float__ = _read

    def item(self) -> float:
        return self._read()


def test_device_tensors_are_never_read_on_the_calling_thread():
    """Case A6: no scalar read inside record(); the exported value is the plain number."""
    _, reader, meter = sdk_meter()
    loss, grad_norm = DeviceScalar(2.5), DeviceScalar(1091.08)
    record_training_metrics(meter, loss=loss, grad_norm=grad_norm, learning_rate=3e-4)
    caller = threading.current_thread().name
    assert instruments.flush_deferred(5.0)
    assert caller not in loss.reads + grad_norm.reads
    assert loss.reads and grad_norm.reads
    values = {name: point.value for name, point in collected(reader)}
    assert values[P + "grad_norm"] == 1091.08
    assert values[P + "loss"] == 2.5
    assert values[P + "learning_rate"] == 3e-4


def test_record_returns_while_a_device_read_waits():
    """record() returns while the device value is still pending, and order is kept."""
    _, reader, meter = sdk_meter()
    gate = threading.Event()
    slow = DeviceScalar(7.0, gate)
    record_training_metrics(meter, loss=slow)
    record_training_metrics(meter, loss=3.0)  # queued behind the pending device read
    assert not instruments.flush_deferred(0.05)
    gate.set()
    assert instruments.flush_deferred(5.0)
    ((_, point),) = collected(reader, P + "loss")
    assert point.value == 3.0


def test_nonfinite_device_value_is_counted():
    """A NaN that arrives through the deferred path is counted like any other."""
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, loss=DeviceScalar(math.nan))
    ((_, point),) = collected(reader, MEGATRON_TRAINING_NONFINITE_VALUES)
    assert point.value == 1


# -- instrument cache and registration (case A3) -----------------------------------------------


def test_case_a3_cache_and_registration(caplog):
    """Case A3: 8 instruments for 10,000 calls, per-provider points, weak cache, conflicts."""
    provider1, reader1, m1 = sdk_meter()
    with caplog.at_level(logging.WARNING):
        for i in range(10_000):
            record_training_metrics(m1, loss=float(i), step_duration_ms=1.0)
    assert len(instruments._TRAINING_INSTRUMENTS[m1]) == 8
    assert len(m1._instrument_id_instrument) == 8
    assert not [r for r in caplog.records if "already" in r.getMessage().lower()]

    provider2 = MeterProvider(metric_readers=[reader2 := InMemoryMetricReader()])
    m2 = provider2.get_meter("test")
    for _ in range(10):
        record_training_metrics(m2, loss=42.0)
    assert [p.value for _, p in collected(reader2, P + "loss")] == [42.0]
    assert [p.value for _, p in collected(reader1, P + "loss")] == [9999.0]
    size = len(instruments._TRAINING_INSTRUMENTS)
    m2_ref, p2_ref = weakref.ref(m2), weakref.ref(provider2)
    provider2.shutdown()
    del m2, provider2, reader2
    gc.collect()
    assert m2_ref() is None and p2_ref() is None
    assert len(instruments._TRAINING_INSTRUMENTS) == size - 1

    # Step 4: the user's own "loss" of another kind and unit, then the library's.
    provider3, reader3, m3 = sdk_meter()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        m3.create_counter(P + "loss", unit="1", description="user's own")
        record_training_metrics(m3, loss=2.0)
        record_training_metrics(m3, loss=2.0)
    assert len([r for r in caplog.records if P + "loss" in r.getMessage()]) <= 1
    gauges = [
        p.value
        for m in metric_objects(reader3).values()
        if m.name == P + "loss" and isinstance(m.data, Gauge)
        for p in m.data.data_points
    ]
    assert gauges == [2.0]


def test_case_a3_proxy_meter_before_the_sdk():
    """A meter taken before any SDK provider is set forwards to the provider set later."""
    m0 = metrics_api.get_meter("early")
    record_training_metrics(m0, loss=1.0)
    reader = InMemoryMetricReader()
    metrics_api.set_meter_provider(MeterProvider(metric_readers=[reader]))
    record_training_metrics(m0, loss=0.5)
    assert [p.value for _, p in collected(reader, P + "loss")] == [0.5]


# -- values at the edges (found by review) ---------------------------------------------------


def test_huge_ints_never_raise_nor_poison_the_export():
    """Gauge ints beyond int64 become floats, the counter saturates: no export fails on them."""
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, loss=10**400, step_duration_ms=10**400)
    record_training_metrics(meter, learning_rate=10**30, skipped_iters=2**63)
    values = {name: point for name, point in collected(reader)}
    assert values[P + "learning_rate"].value == 1e30
    assert isinstance(values[P + "learning_rate"].value, float)
    assert values[P + "skipped_iters"].value == 2**63 - 1
    assert isinstance(values[P + "skipped_iters"].value, int)
    assert P + "loss" not in values


def test_tensor_that_requires_grad_is_read_without_autograd_warning(recwarn):
    """A loss tensor that requires grad is detached before it is read."""
    torch = import_or_unavailable("torch")
    _, reader, meter = sdk_meter()
    record_training_metrics(meter, loss=torch.tensor(2.0, requires_grad=True) * 1.5)
    assert [p.value for _, p in collected(reader, P + "loss")] == [3.0]
    assert not [w for w in recwarn if "requires_grad" in str(w.message)]


def test_meter_that_is_not_a_meter_is_logged_once(caplog):
    """record_training_metrics(None, ...) logs once per type, never per call."""
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            record_training_metrics(None, loss=1.0)
    assert caplog.text.count("Failed to create training metric instruments") == 1


def test_no_op_meter_defers_nothing():
    """On a no-op meter (disabled SDK, non-exporting rank) no deferred thread starts."""
    stub = DeviceScalar(1.0)
    record_training_metrics(metrics_api.NoOpMeter("off"), loss=stub)
    assert instruments._deferred.pending == 0
    assert instruments.flush_deferred(5.0)
    assert stub.reads == []


@documents("limits.md", "A one-element numpy array or tensor is a number.")
def test_one_element_arrays_are_accepted_like_one_element_tensors():
    """numpy arrays and tensors of one element are numbers; counters stay whole numbers."""
    torch = import_or_unavailable("torch")
    _, reader, meter = sdk_meter()
    record_training_metrics(
        meter, loss=np.array([2.5]), grad_norm=np.array([[0.5]]), skipped_iters=np.array([2])
    )
    record_training_metrics(meter, skipped_iters=torch.tensor([3]), learning_rate=np.float32(1.0))
    values = {name: point.value for name, point in collected(reader)}
    assert values[P + "loss"] == 2.5 and values[P + "grad_norm"] == 0.5
    assert values[P + "skipped_iters"] == 5 and isinstance(values[P + "skipped_iters"], int)
    assert values[P + "learning_rate"] == 1.0


@documents("limits.md", "a fractional counter value is dropped with one warning")
def test_a_fractional_counter_value_is_dropped_with_one_warning(caplog):
    """skipped_iters=1.5 is not a whole number of iterations: dropped, one warning."""
    _, reader, meter = sdk_meter()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            record_training_metrics(meter, skipped_iters=1.5)
        record_training_metrics(meter, skipped_iters=2.0)
    assert {name: p.value for name, p in collected(reader)}[P + "skipped_iters"] == 2
    assert caplog.text.count("not a whole number") == 1
