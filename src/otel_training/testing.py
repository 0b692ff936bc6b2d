"""Helpers for tests of code that uses otel-training, shipped with the package.

``configure_in_memory()`` gives a pipeline whose metrics and spans stay in memory;
``reset()`` undoes everything otel-training and the OpenTelemetry API keep globally, so each
test starts clean. These touch private state of the OpenTelemetry API (its set-once globals):
use them in tests only. ``histogram_quantile`` is the report's
(:func:`otel_training.report.histogram_quantile`, Prometheus' semantics to the edge cases).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry._logs import _internal as logs_internal
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from otel_training import _log_once, configuration, spans
from otel_training.health import ledger as health_ledger
from otel_training.health import watchdog as health_watchdog
from otel_training.logs import bridge as log_bridge
from otel_training.metrics import instruments
from otel_training.report.quantiles import histogram_quantile
from otel_training.trace import segments as _segments

__all__ = [
    "InMemoryTelemetry",
    "RecordingMetricExporter",
    "hex_ids_to_base64",
    "parse_otlp_json",
    "configure_in_memory",
    "histogram_quantile",
    "points",
    "reset",
]


@dataclass
class InMemoryTelemetry:
    """A :class:`otel_training.configuration.Telemetry` with an in-memory reader, span exporter and
    log record exporter (``logs.get_finished_logs()``)."""

    telemetry: configuration.Telemetry
    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    logs: InMemoryLogRecordExporter | None = None

    @property
    def meter(self):
        return self.telemetry.meter

    def points(self, name: str | None = None) -> list[tuple[str, object]]:
        """Collects now; (metric name, data point) pairs, optionally of one metric."""
        instruments.flush_deferred(10.0)
        return points(self.reader.get_metrics_data(), name)


class RecordingMetricExporter(MetricExporter):
    """A metric exporter for a periodic reader in tests: keeps, for every export, the points of
    each metric (``exports[i][metric name] -> [points]``). Accepts every export."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[dict[str, list]] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        found: dict[str, list] = {}
        for name, point in points(metrics_data):
            found.setdefault(name, []).append(point)
        self.exports.append(found)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def configure_in_memory(
    environ: Mapping[str, str] | None = None,
    *,
    views: Iterable = (),
    step_duration_buckets_ms: Sequence[float] | None = None,
    set_global: bool = False,
) -> InMemoryTelemetry:
    """``configure()`` with exporters ``none`` plus an in-memory reader, span exporter and
    log record exporter (records are exported synchronously, as they are emitted).

    Args:
        environ: Extra variables on top of ``OTEL_METRICS_EXPORTER=none``,
            ``OTEL_TRACES_EXPORTER=none`` and ``OTEL_LOGS_EXPORTER=none`` (the process
            environment is not read).
    """
    env = {
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
    }
    env.update(environ or {})
    reader = InMemoryMetricReader()
    exporter = InMemorySpanExporter()
    logs = InMemoryLogRecordExporter()
    telemetry = configuration.configure(
        environ=env,
        views=views,
        step_duration_buckets_ms=step_duration_buckets_ms,
        metric_readers=[reader],
        span_processors=[SimpleSpanProcessor(exporter)],
        log_processors=[SimpleLogRecordProcessor(logs)],
        set_global=set_global,
    )
    return InMemoryTelemetry(telemetry, reader, exporter, logs)


def points(data: MetricsData | None, name: str | None = None) -> list[tuple[str, object]]:
    """Flattens ``MetricsData`` into (metric name, data point) pairs."""
    found = []
    if data is None:
        return found
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if name is None or metric.name == name:
                    found.extend((metric.name, p) for p in metric.data.data_points)
    return found


def reset() -> None:
    """Shuts the configured pipeline down and resets otel-training's and the OpenTelemetry
    API's globals (providers, set-once guards, proxies, caches, warned-once causes, the root
    logger's bridge)."""
    for telemetry in list(configuration._live):
        telemetry.shutdown(timeout_millis=2_000)
    for thread in list(configuration._retiring):
        thread.join(5.0)
    configuration._retiring.clear()
    configuration._live.clear()
    health_watchdog.stop()
    configuration._current = None
    configuration._globals_installed = False
    instruments.record_in_this_process()
    instruments.write_values_to(None)
    instruments._TRAINING_INSTRUMENTS.clear()
    instruments._NONFINITE_COUNTERS.clear()
    instruments._COUNTER_TOTALS.clear()
    instruments._FAILED_METERS.clear()
    instruments._steps_recorded = 0
    spans._reset_first_iteration()
    health_ledger.LEDGER.reset()
    _log_once.reset()
    _segments._reset_runs()
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()
    trace_api._TRACER_PROVIDER_SET_ONCE = Once()
    trace_api._TRACER_PROVIDER = None
    trace_api._PROXY_TRACER_PROVIDER = trace_api.ProxyTracerProvider()
    logs_internal._LOGGER_PROVIDER_SET_ONCE = Once()
    logs_internal._LOGGER_PROVIDER = None
    logs_internal._PROXY_LOGGER_PROVIDER = logs_internal.ProxyLoggerProvider()
    log_bridge.bridge_root_logger(False)
    assert isinstance(metrics_api.get_meter_provider(), metrics_internal._ProxyMeterProvider)


_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_Message = TypeVar("_Message")


def hex_ids_to_base64(node: Any) -> Any:
    """A decoded OTLP/JSON document with its trace and span ids turned from hex (as OTLP/JSON
    writes them) into base64 (as protobuf's JSON parser reads ``bytes`` fields)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if (
                key in _ID_KEYS
                and isinstance(value, str)
                and len(value) in (16, 32)
                and set(value) <= _HEX_DIGITS
            ):
                value = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            else:
                value = hex_ids_to_base64(value)
            out[key] = value
        return out
    if isinstance(node, list):
        return [hex_ids_to_base64(v) for v in node]
    return node


def parse_otlp_json(text: str, message: _Message) -> _Message:
    """Parses one OTLP/JSON document (a line of the embedded default's files) into
    ``message``, an empty ``Export*ServiceRequest`` of opentelemetry-proto, and returns it.

    Raises:
        google.protobuf.json_format.ParseError: when the text is not that message in OTLP/JSON.
    """
    from google.protobuf import json_format

    return json_format.ParseDict(hex_ids_to_base64(json.loads(text)), message)
