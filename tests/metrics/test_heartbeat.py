"""The heartbeat (otel_training.metrics.heartbeat): the hang signals on their own export interval,
one writer per series, flushed and shut down with the main provider."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource
from support import metrics_of

from otel_training import config
from otel_training.health.ledger import Ledger
from otel_training.health.metrics import observe_ledger
from otel_training.metrics import heartbeat
from otel_training.semconv.metrics import (
    DL_TRAINING_PHASE_ELAPSED,
    DL_TRAINING_PHASE_TIME,
    DL_TRAINING_PROGRESS_AGE,
    DL_TRAINING_PROGRESS_TIMESTAMP,
)

HANG = {DL_TRAINING_PROGRESS_TIMESTAMP, DL_TRAINING_PROGRESS_AGE, DL_TRAINING_PHASE_ELAPSED}


class RecordingMetricExporter(MetricExporter):
    """Keeps the names of the metrics of every export, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[set[str]] = []
        self.shutdowns = 0
        self.lock = threading.Lock()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs):
        names = {m.name for m in metrics_of(metrics_data)}
        with self.lock:
            self.exports.append(names)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.shutdowns += 1


def test_the_heartbeat_metrics_are_the_hang_signals():
    """HEARTBEAT_METRICS: progress timestamp and age, phase elapsed; not the cumulative ones."""
    assert set(heartbeat.HEARTBEAT_METRICS) == HANG
    assert DL_TRAINING_PHASE_TIME not in heartbeat.HEARTBEAT_METRICS


def test_observe_ledger_creates_only_the_named_instruments(in_memory_meter):
    """observe_ledger(names=...) creates those instruments and no other."""
    ledger = Ledger()
    observe_ledger(in_memory_meter.meter, source=lambda: ledger, names=heartbeat.HEARTBEAT_METRICS)
    names = {m.name for m in metrics_of(in_memory_meter.reader.get_metrics_data())}
    assert names == HANG - {DL_TRAINING_PROGRESS_TIMESTAMP}  # no step completed yet: absent


def test_without_metrics_leaves_out_the_named_and_sends_the_rest(in_memory_meter):
    """The main OTLP reader's exporter drops the heartbeat's metrics and keeps the others; a
    batch with nothing left is not sent."""
    recording = RecordingMetricExporter()
    ledger = Ledger()
    observe_ledger(in_memory_meter.meter, source=lambda: ledger)
    data = in_memory_meter.reader.get_metrics_data()
    wrapper = heartbeat.WithoutMetricsExporter(recording, heartbeat.HEARTBEAT_METRICS)
    assert wrapper.export(data) is MetricExportResult.SUCCESS
    (sent,) = recording.exports
    assert not sent & HANG
    assert DL_TRAINING_PHASE_TIME in sent
    everything = heartbeat.WithoutMetricsExporter(recording, sent | HANG)
    assert everything.export(data) is MetricExportResult.SUCCESS
    assert len(recording.exports) == 1
    wrapper.shutdown()
    assert recording.shutdowns == 1


def test_flush_and_shutdown_of_the_main_provider_reach_the_heartbeat():
    """MeterProviderWithHeartbeat.force_flush exports the heartbeat's instruments too, and
    shutdown shuts its exporter down."""
    beat_exporter = RecordingMetricExporter()
    beat = heartbeat.heartbeat_provider(
        Resource({"dl.rank": 0}), beat_exporter, interval_ms=3_600_000, timeout_ms=1_000
    )
    ledger = Ledger()
    observe_ledger(beat.get_meter("t"), source=lambda: ledger, names=heartbeat.HEARTBEAT_METRICS)
    main_reader = InMemoryMetricReader()
    main = heartbeat.MeterProviderWithHeartbeat(beat, metric_readers=[main_reader])
    assert main.force_flush(5_000)
    assert beat_exporter.exports and beat_exporter.exports[-1] == {
        DL_TRAINING_PROGRESS_AGE,
        DL_TRAINING_PHASE_ELAPSED,
    }
    main.shutdown(5_000)
    assert beat_exporter.shutdowns == 1


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL": "5000"}, 5000.0),
        ({"OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL": "10"}, config.MIN_EXPORT_INTERVAL_MS),
        ({"OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL": "60000"}, None),
        (
            {
                "OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL": "20000",
                "OTEL_METRIC_EXPORT_INTERVAL": "15000",
            },
            None,
        ),
        ({"OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL": "soon"}, None),
    ],
)
def test_config_reads_the_heartbeat_interval(environ, expected):
    """Unset: off; a value shorter than the export interval: on (floored at 100 ms); one not
    shorter, or not a number: off."""
    assert config.load(environ).heartbeat_interval_ms == expected
