"""SpanRecorder on providers of its own, and phases started through their phase functions."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_training
from otel_training import configuration as setup
from otel_training import spans, testing
from otel_training.phases import LedgerPhase


def _own_providers():
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return exporter, tracer_provider, reader, MeterProvider(metric_readers=[reader])


def test_start_phase_uses_the_phase_functions_names_and_parents():
    """start_phase(training_iteration, ...) makes the same span as the phase function, nested."""
    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    recorder = otel_training.SpanRecorder()
    run = recorder.start_phase(otel_training.training_run)
    step = recorder.start_phase(otel_training.training_iteration, iteration=3, parent=run)
    update = recorder.start_phase(otel_training.optimizer_step, iteration=3, parent=step)
    for handle in (update, step, run):
        recorder.stop(handle)
    with otel_training.training_iteration(iteration=3):
        pass
    finished = pipeline.spans.get_finished_spans()
    by_name = {span.name: span for span in finished[:3]}
    assert finished[-1].name == finished[1].name  # the phase function's own span name
    assert dict(finished[1].attributes) == dict(finished[-1].attributes)
    assert len(by_name) == 3
    assert finished[0].parent.span_id == finished[1].context.span_id
    assert finished[1].parent.span_id == finished[2].context.span_id


def test_a_recorder_on_its_own_providers_sends_spans_there_with_the_given_groups():
    """tracer_provider= and span_groups= route spans away from the configured pipeline."""
    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "default"})
    exporter, tracer_provider, _, meter_provider = _own_providers()
    recorder = otel_training.SpanRecorder(
        tracer_provider=tracer_provider, meter_provider=meter_provider, span_groups="all"
    )
    handle = recorder.start_phase(otel_training.optimizer_step, iteration=1)
    assert handle is not spans.NOOP_PHASE
    recorder.stop(handle)
    assert len(exporter.get_finished_spans()) == 1
    assert pipeline.spans.get_finished_spans() == ()
    # The binding does not leak: the phase functions still follow the configured pipeline.
    assert isinstance(otel_training.optimizer_step(iteration=1), LedgerPhase)  # no span


def test_a_recorder_on_its_own_meter_records_step_durations_there():
    """meter_provider= receives the step duration of a phase started by the recorder."""
    testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "none"})
    _, tracer_provider, reader, meter_provider = _own_providers()
    recorder = otel_training.SpanRecorder(
        tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    handle = recorder.start_phase(
        otel_training.training_iteration, iteration=1, record_step_duration=True
    )
    recorder.stop(handle)
    points = testing.points(reader.get_metrics_data(), "megatron.training.step_duration_ms")
    assert [p.count for _, p in points] == [1]


def test_a_recorder_takes_the_configured_groups_when_none_are_given():
    """Without span_groups=, a recorder on its own tracer records the configured groups only."""
    testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "default"})
    exporter, tracer_provider, _, _ = _own_providers()
    recorder = otel_training.SpanRecorder(tracer_provider=tracer_provider)
    assert isinstance(recorder.start_phase(otel_training.optimizer_step), LedgerPhase)
    recorder.stop(recorder.start_phase(otel_training.training_run))
    assert len(exporter.get_finished_spans()) == 1  # the run's group is in "default"


def test_an_unknown_group_is_refused_at_construction():
    """span_groups= naming no group raises ValueError when the recorder is built."""
    with pytest.raises(ValueError, match="unknown span group"):
        otel_training.SpanRecorder(span_groups="no_such_group")


def test_start_phase_never_raises_on_a_bad_call():
    """A phase function that raises gives the no-op handle and a warning, not an exception."""
    setup.configure(environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"})

    def broken(**_):
        raise RuntimeError("boom")

    assert otel_training.SpanRecorder().start_phase(broken) is spans.NOOP_PHASE


def test_a_recorder_on_both_providers_configures_nothing(monkeypatch):
    """With tracer_provider= and meter_provider=, no pipeline is configured; the groups come
    from OTEL_PYTHON_TRAINING_SPAN_GROUPS."""
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    exporter, tracer_provider, _, meter_provider = _own_providers()
    recorder = otel_training.SpanRecorder(
        tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    recorder.stop(recorder.start_phase(otel_training.optimizer_step, iteration=2))
    assert setup.current() is None
    assert len(exporter.get_finished_spans()) == 1


@pytest.mark.parametrize("groups", ["all", "none"])
def test_a_recorders_metrics_go_to_its_own_meter_whatever_the_groups(groups):
    """record_metrics and step durations of a recorder's handles reach the recorder's meter,
    whether the group records spans or not (never the configured pipeline's)."""
    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    _, tracer_provider, reader, meter_provider = _own_providers()
    recorder = otel_training.SpanRecorder(
        tracer_provider=tracer_provider, meter_provider=meter_provider, span_groups=groups
    )
    # a phase that is no ledger phase (the shared no-op when off), and one that is
    for function, argument in ((otel_training.activation_offload, "offload"),
                               (otel_training.microbatch, "forward")):  # fmt: skip
        handle = recorder.start_phase(function, argument)
        handle.record_metrics(loss=1.5, los=2.0)
        recorder.stop(handle)
    step = recorder.start_phase(otel_training.training_iteration, record_step_duration=True)
    recorder.stop(step)
    own = dict((name, point) for name, point in testing.points(reader.get_metrics_data()))
    assert own["megatron.training.loss"].value == 1.5
    assert own["megatron.training.step_duration_ms"].count == 1
    assert pipeline.points("megatron.training.loss") == []


def test_a_first_iteration_started_by_handle_nests_without_becoming_current():
    """A recorder's first iteration is wrapped in first_iteration as a with-block is, but
    neither span becomes current (handles may stop on another thread or out of order)."""
    from opentelemetry import trace as trace_api

    from otel_training.semconv import spans as names

    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    recorder = otel_training.SpanRecorder()
    run = recorder.start_phase(otel_training.training_run)
    step = recorder.start_phase(otel_training.training_iteration, iteration=1, parent=run)
    assert trace_api.get_current_span() is trace_api.INVALID_SPAN
    recorder.stop(step)
    recorder.stop(run)
    spans = {span.name: span for span in pipeline.spans.get_finished_spans()}
    first = spans[names.MEGATRON_TRAIN_FIRST_ITERATION]
    assert spans[names.MEGATRON_TRAIN_ITERATION].parent.span_id == first.context.span_id
    assert first.parent.span_id == spans[names.MEGATRON_TRAIN_SEGMENT].context.span_id
