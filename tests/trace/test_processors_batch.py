"""The counting batch processors: what a full queue drops is counted, said with its count and
exported as otel_training.log_record.dropped and otel_training.span.dropped."""

from __future__ import annotations

import logging
import threading

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_training import configuration as setup
from otel_training import testing
from otel_training.semconv.metrics import (
    OTEL_TRAINING_LOG_RECORD_DROPPED,
    OTEL_TRAINING_SPAN_DROPPED,
)
from otel_training.trace.processors.batch import (
    CountingBatchLogRecordProcessor,
    CountingBatchSpanProcessor,
    observe_drops,
)


class Stalled(LogRecordExporter, SpanExporter):
    """An exporter that holds its first batch until released: the queue fills behind it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.exported = 0

    def export(self, batch):
        self.started.set()
        self.release.wait(30)
        self.exported += len(batch)
        return LogRecordExportResult.SUCCESS if hasattr(batch[0], "log_record") else (
            SpanExportResult.SUCCESS
        )  # fmt: skip

    def shutdown(self) -> None:
        self.release.set()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _log_flood(processor):
    provider = LoggerProvider(shutdown_on_exit=False)
    provider.add_log_record_processor(processor)
    logger = provider.get_logger("flood")
    return (lambda i: logger.emit(body=f"r{i}")), provider


def _span_flood(processor):
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("flood")

    def emit(i):
        with tracer.start_as_current_span(f"s{i}"):
            pass

    return emit, provider


KINDS = {
    "log records": (
        CountingBatchLogRecordProcessor,
        _log_flood,
        "log_processors",
        OTEL_TRAINING_LOG_RECORD_DROPPED,
        "OTEL_BLRP_MAX_QUEUE_SIZE",
    ),
    "spans": (
        CountingBatchSpanProcessor,
        _span_flood,
        "span_processors",
        OTEL_TRAINING_SPAN_DROPPED,
        "OTEL_BSP_MAX_QUEUE_SIZE",
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_what_a_full_queue_drops_is_counted_warned_and_exported(caplog, kind):
    """A stalled exporter behind a queue of 10: each of the 50 records beyond it is counted,
    one warning gives the count, the exporter and the variable (and the SDK's per-record
    warning is gone), the counter metric says 50, and the 11 others are exported."""
    processor_class, flood, keyword, metric, variable = KINDS[kind]
    stalled = Stalled()
    processor = processor_class(
        stalled,
        where="a stalled collector",
        max_queue_size=10,
        max_export_batch_size=1,
        schedule_delay_millis=10,
    )
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    observe_drops(meters.get_meter("t"), **{keyword: [processor]})
    emit, provider = flood(processor)
    emit(-1)
    assert stalled.started.wait(30)  # the worker holds one record; the queue is empty
    with caplog.at_level(logging.WARNING):
        for i in range(60):
            emit(i)
        stalled.release.set()
        provider.shutdown()
    assert processor.dropped == 50 and stalled.exported == 11
    (warning,) = [r.getMessage() for r in caplog.records if "queue" in r.getMessage()]
    assert f"50 {kind} dropped" in warning and "a stalled collector" in warning
    assert variable in warning and metric in warning
    assert not [r for r in caplog.records if r.getMessage().startswith("Queue full")]
    ((_, point),) = testing.points(reader.get_metrics_data(), metric)
    assert point.value == 50
    meters.shutdown()


def test_drops_after_the_first_report_are_said_again_with_the_new_count(caplog, monkeypatch):
    """Drops after the first warning are said again (here at once: the interval set to 0),
    with how many more and the total."""
    from otel_training.trace.processors import batch

    monkeypatch.setattr(batch, "REPORT_INTERVAL_S", 0.0)
    stalled = Stalled()
    processor = CountingBatchLogRecordProcessor(
        stalled, where="here", max_queue_size=5, max_export_batch_size=1, schedule_delay_millis=10
    )
    emit, provider = _log_flood(processor)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            stalled.release.clear()
            stalled.started.clear()
            emit(-1)
            assert stalled.started.wait(30)
            for i in range(15):
                emit(i)
            stalled.release.set()
            processor.force_flush()
        provider.shutdown()
    messages = [r.getMessage() for r in caplog.records if "queue" in r.getMessage()]
    assert len(messages) == 2 and "10 log records dropped so far" in messages[0]
    assert "10 more log records dropped" in messages[1] and "20 in all" in messages[1]


def test_configure_exports_the_drop_counters_of_its_batch_processors():
    """A configured pipeline with batch processors of both signals exports both counters
    (at 0 while nothing was dropped)."""
    reader = InMemoryMetricReader()
    telemetry = setup.configure(
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
        },
        metric_readers=[reader],
        set_global=False,
    )
    names = {name for name, _ in testing.points(reader.get_metrics_data())}
    assert {OTEL_TRAINING_LOG_RECORD_DROPPED, OTEL_TRAINING_SPAN_DROPPED} <= names
    assert telemetry.shutdown()
