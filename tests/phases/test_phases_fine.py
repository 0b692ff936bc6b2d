"""``fine()``, the short way to a fine-grained phase, makes the phase ``make()`` makes: the same
class with the same lifecycle fields, in every configuration of the groups, and ``make()``
itself while nothing is configured, while a recorder binds its own state, and after the
pipeline is replaced (a decision is per name and pipeline)."""

from __future__ import annotations

import pytest

import otel_training as ot
from otel_training import testing
from otel_training.phases import NOOP_PHASE, SpanPhase, _phase, _state
from otel_training.semconv import spans as names

#: The fine-grained phases and their groups, as otel_training.spans makes them.
FINE = [
    (names.MEGATRON_LAYER_FORWARD, "layer"),
    (names.MEGATRON_MICROBATCH_FORWARD, "microbatch"),
    (names.MEGATRON_P2P_RECV_FORWARD, "communication"),
    (names.MEGATRON_GRAD_SYNC_START, "communication"),
    (names.MEGATRON_ACTIVATION_OFFLOAD, "activation_offload"),
]
FIELDS = ("_kind", "_progress", "_record_step_duration", "_watch", "_extra", "_exports", "_outer")


def fields(phase) -> tuple:
    return (type(phase), *(getattr(phase, name) for name in FIELDS), phase._stage, phase._failed)


@pytest.mark.parametrize("groups", ["default", "all", "per_step", "none", "layer,communication"])
def test_fine_makes_what_make_makes(groups):
    testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": groups})
    for name, group in FINE:
        for _ in range(2):  # decided, then from the decision
            made, short = _phase.make(name, group, None), _phase.fine(name, group, None)
            if made is NOOP_PHASE or isinstance(made, SpanPhase):
                assert type(short) is type(made)
                assert (short is NOOP_PHASE) == (made is NOOP_PHASE)
            else:
                assert fields(short) == fields(made), (groups, name)
                assert short._state is made._state
    assert set(_state.current().routes) == {name for name, _ in FINE}


def test_a_new_pipeline_decides_again():
    """Layers spans in the first pipeline, off in the second: the decision follows."""
    testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    assert isinstance(ot.layer("forward", layer_number=2), SpanPhase)
    testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step"})
    layer = ot.layer("forward", layer_number=2)
    assert type(layer) is _phase.LedgerPhase and layer._state is _state.current()


def test_a_layer_number_is_an_attribute_of_its_span_only():
    """The attribute ``fine()`` adds reaches the span, not the caller's keyword dict."""
    telemetry = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    extra = {"custom": 1}
    with ot.layer("mlp", layer_number=3, **extra):
        pass
    (span,) = [s for s in telemetry.spans.get_finished_spans() if s.name.startswith("megatron.l")]
    assert dict(span.attributes) == {"custom": 1, "megatron.layer_number": 3}
    assert extra == {"custom": 1}


def test_while_a_recorder_binds_its_state_fine_is_make():
    """A recorder on providers of its own: its layer records into them, not the pipeline's."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    telemetry = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step"})
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = ot.SpanRecorder(tracer_provider=provider, span_groups="layer")
    handle = recorder.start_phase(ot.layer, "forward", layer_number=1)
    assert isinstance(handle, SpanPhase) and _state.binding == 0
    recorder.stop(handle)
    assert [s.name for s in exporter.get_finished_spans()] == [names.MEGATRON_LAYER_FORWARD]
    assert not telemetry.spans.get_finished_spans()
    assert isinstance(ot.layer("forward"), _phase.LedgerPhase)  # the pipeline's decision
