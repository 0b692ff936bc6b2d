"""The metrics factories of a pipeline: one reader per ``OTEL_METRICS_EXPORTER`` entry (OTLP,
the embedded default's OTLP JSON file, Prometheus, the console), each exporter wrapped in the
guard of :mod:`otel_training.export.exporters`, the temporality of
``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``, and the heartbeat's own provider.
"""

from __future__ import annotations

import logging

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import _Gauge as SdkGauge
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
)
from opentelemetry.sdk.resources import Resource

from otel_training import config
from otel_training.export import files
from otel_training.export.exporters import (
    DEFAULT_MAX_REQUEST_BYTES,
    PeriodicMetricReader,
    SafeMetricExporter,
    safe_prometheus_reader,
)
from otel_training.health.metrics import observe_ledger
from otel_training.metrics import heartbeat
from otel_training.pipeline import network
from otel_training.pipeline.otlp import otlp_exporter
from otel_training.pipeline.outputs import Outputs
from otel_training.pipeline.scope import INSTRUMENTATION_NAME

__all__ = ["heartbeat_provider", "metric_reader"]

_logger = logging.getLogger("otel_training")


def _temporality(preference: str) -> dict[type, AggregationTemporality]:
    cumulative = AggregationTemporality.CUMULATIVE
    delta = AggregationTemporality.DELTA
    table = {
        Counter: cumulative,
        UpDownCounter: cumulative,
        Histogram: cumulative,
        ObservableCounter: cumulative,
        ObservableUpDownCounter: cumulative,
        ObservableGauge: cumulative,
        SdkGauge: cumulative,
    }
    if preference == "delta":
        table.update({Counter: delta, Histogram: delta, ObservableCounter: delta})
    elif preference == "lowmemory":
        table.update({Counter: delta, Histogram: delta})
    return table


def _otlp_metric_exporter(
    settings: config.Settings, warn: network.Warn
) -> tuple[MetricExporter, str]:
    """The OTLP metric exporter of ``settings`` (gRPC or HTTP), every setting explicit (the
    proxy and TLS of :mod:`otel_training.pipeline.network` included), and its destination."""
    if settings.metrics_otlp.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return otlp_exporter(
        OTLPMetricExporter,
        settings.metrics_otlp,
        "metrics",
        settings,
        warn,
        preferred_temporality=_temporality(settings.temporality_preference),
    )


def _heartbeats(settings: config.Settings) -> bool:
    """Whether the hang signals go over OTLP on their own interval (:mod:`heartbeat`)."""
    return settings.heartbeat_interval_ms is not None and "otlp" in settings.metrics_exporters


def heartbeat_provider(
    settings: config.Settings, resource: Resource, warn: network.Warn
) -> MeterProvider | None:
    """The heartbeat's own ``MeterProvider`` (its own OTLP exporter, the same Resource) with
    the ledger's hang signals, or ``None`` when the heartbeat is off."""
    if not _heartbeats(settings):
        return None
    provider = heartbeat.heartbeat_provider(
        resource,
        SafeMetricExporter(_otlp_metric_exporter(settings, warn)[0], limits=settings.span_limits),
        interval_ms=settings.heartbeat_interval_ms or settings.metric_export_interval_ms,
        timeout_ms=settings.metric_export_timeout_ms,
    )
    observe_ledger(provider.get_meter(INSTRUMENTATION_NAME), names=heartbeat.HEARTBEAT_METRICS)
    return provider


def metric_reader(
    name: str, settings: config.Settings, outputs: Outputs, warn: network.Warn
) -> tuple[MetricReader | None, str]:
    temporality = _temporality(settings.temporality_preference)
    exporter: MetricExporter
    interval_ms = settings.metric_export_interval_ms
    max_request_bytes = DEFAULT_MAX_REQUEST_BYTES
    if name == "none":
        return None, "nowhere"
    if name == "prometheus":
        return _prometheus_reader(settings)
    if name == "otlp":
        exporter, target = _otlp_metric_exporter(settings, warn)
    elif name == "console":
        exporter = ConsoleMetricExporter(preferred_temporality=temporality)
        target = "the console"
    else:  # otlp_json_file
        from opentelemetry.exporter.otlp.json.file import FileMetricExporter

        stream, path = outputs.open("metrics")
        if stream is None:
            return None, "nowhere"
        exporter = FileMetricExporter(stream=stream, preferred_temporality=temporality)
        target = f"OTLP-JSON file {path}"
        interval_ms = settings.file_metric_export_interval_ms
        max_request_bytes = files.LINE_BUDGET_BYTES  # one line per request: under 1 MiB
    safe: MetricExporter = SafeMetricExporter(
        exporter, limits=settings.span_limits, max_request_bytes=max_request_bytes
    )
    if name == "otlp" and _heartbeats(settings):
        # The heartbeat's provider is the one writer of the hang signals over OTLP.
        safe = heartbeat.WithoutMetricsExporter(safe, heartbeat.HEARTBEAT_METRICS)
    reader = PeriodicMetricReader(
        safe,
        export_interval_millis=interval_ms,
        export_timeout_millis=min(settings.metric_export_timeout_ms, interval_ms),
    )
    return reader, target


def _prometheus_reader(settings: config.Settings) -> tuple[MetricReader | None, str]:
    try:
        import opentelemetry.exporter.prometheus  # noqa: F401 - the reader's dependency
        from prometheus_client import start_http_server
    except ImportError:
        _logger.warning(
            "OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus (pip "
            "install opentelemetry-exporter-prometheus: otel-training's extra prometheus). "
            "Metrics are not exported there."
        )
        return None, "nowhere"
    host = settings.prometheus_host
    port = settings.prometheus_port_of_rank()
    try:
        start_http_server(port=port, addr=host)
    except OSError as error:
        _logger.warning(
            "otel-training cannot serve Prometheus metrics on %s:%d (OTEL_EXPORTER_PROMETHEUS_PORT"
            "=%d + LOCAL_RANK=%d): %s. Metrics of this rank are not exported there.",
            host,
            port,
            settings.prometheus_port,
            settings.identity.local_rank,
            error,
        )
        return None, "nowhere"
    reader = safe_prometheus_reader(settings.span_limits)
    return reader, f"Prometheus http://{host}:{port}/metrics"
