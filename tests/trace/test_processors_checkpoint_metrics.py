"""Checkpoint span durations as the histogram megatron.checkpoint.duration
(otel_training.trace.processors.checkpoint_metrics), with real SDK providers and readers."""

from __future__ import annotations

import logging

import pytest
from doc_rules import documents
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import Status, StatusCode

import otel_training
from otel_training import configuration as setup
from otel_training import testing
from otel_training.metrics import views
from otel_training.semconv.attributes import (
    MEGATRON_CHECKPOINT_OPERATION,
    OTEL_TRAINING_SPAN_TRUNCATED,
)
from otel_training.semconv.metrics import MEGATRON_CHECKPOINT_DURATION
from otel_training.semconv.spans import MEGATRON_CHECKPOINT_LOAD, MEGATRON_CHECKPOINT_SAVE
from otel_training.trace.open_spans import OpenSpans
from otel_training.trace.processors.checkpoint_metrics import CheckpointMetricsSpanProcessor

NAME = MEGATRON_CHECKPOINT_DURATION


def _by_operation(points) -> dict[str, object]:
    found = {}
    for _, point in points:
        operation = point.attributes[MEGATRON_CHECKPOINT_OPERATION]
        assert operation not in found, "one stream per operation"
        found[operation] = point
    return found


def _seconds(span) -> float:
    return (span.end_time - span.start_time) / 1e9


class _Parts:
    """A TracerProvider with the checkpoint processor, recording on a MeterProvider with an
    in-memory reader, and the open spans a shutdown would truncate."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader], views=views.default_views())
        self.processor = CheckpointMetricsSpanProcessor(self.meters.get_meter("test"))
        self.open = OpenSpans()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(self.processor)
        self.tracer = self.tracers.get_tracer("test")

    def points(self):
        return testing.points(self.reader.get_metrics_data(), NAME)


@documents("README.md", "duration of each checkpoint save/load span that ended normally")
def test_save_and_load_phases_record_their_span_durations():
    """A save and a load phase each record one point: their operation, the span's own duration."""
    memory = testing.configure_in_memory(
        {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "default,load_checkpoint"}  # loads: per_step
    )
    with otel_training.checkpoint_save("/ckpt/iter_10", iteration=10):
        pass
    with otel_training.checkpoint_load("/ckpt/iter_10"):
        pass
    spans = {s.name: s for s in memory.spans.get_finished_spans()}
    points = _by_operation(memory.points(NAME))
    assert set(points) == {"save", "load"}
    for operation, span_name in (
        ("save", MEGATRON_CHECKPOINT_SAVE),
        ("load", MEGATRON_CHECKPOINT_LOAD),
    ):
        point = points[operation]
        assert point.count == 1
        assert point.sum == pytest.approx(_seconds(spans[span_name]), rel=1e-12, abs=1e-15)
        assert dict(point.attributes) == {MEGATRON_CHECKPOINT_OPERATION: operation}


def test_buckets_are_the_checkpoint_buckets_and_the_value_lands_in_its_bucket():
    """A 90.5 s save (span times given) lands in the (60 s, 120 s] bucket of the default bounds."""
    parts = _Parts()
    start_ns = 1_700_000_000_000_000_000
    span = parts.tracer.start_span(MEGATRON_CHECKPOINT_SAVE, start_time=start_ns)
    span.end(end_time=start_ns + 90_500_000_000)
    ((_, point),) = parts.points()
    assert tuple(point.explicit_bounds) == views.CHECKPOINT_DURATION_BUCKETS_S
    assert point.sum == 90.5 and point.min == 90.5 and point.max == 90.5
    index = list(point.explicit_bounds).index(120)
    assert [i for i, n in enumerate(point.bucket_counts) if n] == [index]


@documents("README.md", "recorded from the spans whatever the traces exporter")
def test_recorded_when_trace_export_is_none():
    """With OTEL_TRACES_EXPORTER=none and the default span groups, a save still records."""
    reader = InMemoryMetricReader()
    telemetry = setup.configure(
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
        },
        metric_readers=[reader],
    )
    try:
        with otel_training.checkpoint_save("/ckpt/iter_1"):
            pass
        points = testing.points(reader.get_metrics_data(), NAME)
        assert [p.attributes[MEGATRON_CHECKPOINT_OPERATION] for _, p in points] == ["save"]
        assert points[0][1].count == 1
    finally:
        telemetry.shutdown()


def test_other_spans_record_nothing():
    """Run, iteration, evaluation, sub-phase and custom spans record no checkpoint point."""
    memory = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    with otel_training.training_run():
        with otel_training.training_iteration(iteration=1):
            with otel_training.forward_backward(iteration=1):
                pass
        with otel_training.evaluation(iteration=1):
            pass
        with otel_training.phase("megatron.checkpoint.save.io_write"):
            pass
        with otel_training.phase("myproject.checkpoint.save"):
            pass
    # The 6 phases, the first iteration's wrapper, the segment span in the job trace and the
    # step trace's root segment span.
    assert len(memory.spans.get_finished_spans()) == 9
    assert memory.points(NAME) == []


@documents("README.md", "duration of each checkpoint save/load span that ended normally")
def test_failed_and_truncated_checkpoints_record_nothing():
    """A save that raised or was ended truncated at shutdown records nothing; a good load does."""
    parts = _Parts()
    with pytest.raises(OSError):
        with parts.tracer.start_as_current_span(MEGATRON_CHECKPOINT_SAVE):
            raise OSError("disk full")
    parts.open.spans[parts.tracer.start_span(MEGATRON_CHECKPOINT_SAVE)] = True  # left open
    assert parts.open.truncate("SIGTERM") == 1
    parts.tracer.start_span(MEGATRON_CHECKPOINT_LOAD).end()
    points = _by_operation(parts.points())
    assert set(points) == {"load"} and points["load"].count == 1


def test_a_truncated_span_with_ok_status_records_nothing():
    """The truncated attribute alone (status left OK, as at a normal exit) keeps a span out."""
    parts = _Parts()
    span = parts.tracer.start_span(MEGATRON_CHECKPOINT_SAVE)
    span.set_attribute(OTEL_TRAINING_SPAN_TRUNCATED, True)
    span.end()
    assert parts.points() == []


@pytest.mark.parametrize(
    "span",
    [
        ReadableSpan(name=MEGATRON_CHECKPOINT_SAVE),  # never started nor ended
        ReadableSpan(name=MEGATRON_CHECKPOINT_SAVE, start_time=200, end_time=100),  # negative
        ReadableSpan(name=MEGATRON_CHECKPOINT_LOAD, start_time=1.5, end_time=2.5),  # not ns ints
        ReadableSpan(name=None, start_time=1, end_time=2),
        ReadableSpan(name=["unhashable"], start_time=1, end_time=2),
        ReadableSpan(
            name=MEGATRON_CHECKPOINT_SAVE,
            start_time=1,
            end_time=2,
            status=Status(StatusCode.ERROR, "failed"),
        ),
        object(),  # not a span at all
    ],
    ids=["no-times", "negative", "float-times", "no-name", "unhashable", "error", "not-a-span"],
)
def test_odd_spans_never_raise_and_record_nothing(span, caplog):
    """on_end of an odd span returns quietly (at most one warning) and records nothing."""
    parts = _Parts()
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        parts.processor.on_end(span)
        parts.processor.on_end(span)
    assert parts.points() == []
    assert len(caplog.records) <= 1


def test_start_flush_and_shutdown_are_harmless():
    """on_start records nothing, force_flush answers True, shutdown leaves the meter usable."""
    parts = _Parts()
    span = parts.tracer.start_span(MEGATRON_CHECKPOINT_SAVE)
    parts.processor.on_start(span)
    assert parts.processor.force_flush() is True
    parts.processor.shutdown()
    assert parts.points() == []
    span.end()
    assert [p.count for _, p in parts.points()] == [1]
