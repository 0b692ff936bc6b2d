"""The heartbeat: the hang signals on their own short export interval over OTLP.

A rank that hangs is seen by the age of its last progress (``dl.training.progress.timestamp``,
``.progress.age``) and the phase it is stuck in (``dl.training.phase.elapsed``): the registry
marks them ``heartbeat`` (:data:`HEARTBEAT_METRICS`). Exported with everything else every
``OTEL_METRIC_EXPORT_INTERVAL`` (60 s by default), a hang is seen a minute late at best. With
``OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL`` set, a second small ``MeterProvider`` with the same
Resource carries only those instruments and exports them over OTLP on that interval
(:func:`heartbeat_provider`); the main OTLP reader leaves them out
(:class:`WithoutMetricsExporter`), so each series has one writer and every other metric keeps
its interval. The main provider is a :class:`MeterProviderWithHeartbeat`, so that flushing
and shutting it down reach the heartbeat too.

Threads: the heartbeat's reader thread collects and exports; its callbacks read the health
ledger (a few microseconds, no lock). Nothing here runs on the training thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable
from typing import Final

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource

from otel_training.export.exporters import PeriodicMetricReader
from otel_training.semconv.metrics import METRICS

__all__ = [
    "HEARTBEAT_METRICS",
    "MeterProviderWithHeartbeat",
    "WithoutMetricsExporter",
    "heartbeat_provider",
]

_logger = logging.getLogger("otel_training")

#: The metrics of the registry marked ``heartbeat``, sorted.
HEARTBEAT_METRICS: Final[tuple[str, ...]] = tuple(
    sorted(name for name, spec in METRICS.items() if spec.heartbeat)
)


class WithoutMetricsExporter(MetricExporter):
    """Hands ``exporter`` every metric but those named in ``names`` (a batch left empty is not
    sent). Temporality and aggregation preferences are ``exporter``'s. Runs on the reader's
    thread; never raises beyond what ``exporter`` raises."""

    def __init__(self, exporter: MetricExporter, names: Iterable[str]) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self.exporter = exporter
        self.names = frozenset(names)

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs
    ) -> MetricExportResult:
        kept = _without(metrics_data, self.names)
        if kept is None:
            return MetricExportResult.SUCCESS
        return self.exporter.export(kept, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


def _without(data: MetricsData, names: frozenset[str]) -> MetricsData | None:
    """``data`` without the metrics in ``names``; ``None`` when nothing is left."""
    resources = []
    for resource_metrics in data.resource_metrics:
        scopes = []
        for scope_metrics in resource_metrics.scope_metrics:
            metrics = [m for m in scope_metrics.metrics if m.name not in names]
            if metrics:
                scopes.append(dataclasses.replace(scope_metrics, metrics=metrics))
        if scopes:
            resources.append(dataclasses.replace(resource_metrics, scope_metrics=scopes))
    if not resources:
        return None
    return dataclasses.replace(data, resource_metrics=resources)


def heartbeat_provider(
    resource: Resource, exporter: MetricExporter, *, interval_ms: float, timeout_ms: float
) -> MeterProvider:
    """A ``MeterProvider`` with ``resource`` that exports to ``exporter`` every ``interval_ms``
    (export timeout ``timeout_ms``, cut to the interval); its instruments are created by the
    caller (:func:`otel_training.health.metrics.observe_ledger` with
    :data:`HEARTBEAT_METRICS`). Raises nothing beyond what the SDK raises for bad values."""
    reader = PeriodicMetricReader(
        exporter,
        export_interval_millis=interval_ms,
        export_timeout_millis=min(timeout_ms, interval_ms),
    )
    return MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)


class MeterProviderWithHeartbeat(MeterProvider):
    """The SDK's ``MeterProvider`` whose ``force_flush`` and ``shutdown`` also reach
    ``heartbeat`` (:func:`heartbeat_provider`), within the same bound: the heartbeat's final
    export runs beside the main one. Other arguments are ``MeterProvider``'s."""

    def __init__(self, heartbeat: MeterProvider, **kwargs) -> None:
        super().__init__(**kwargs)
        self.heartbeat = heartbeat

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        try:
            beat = self.heartbeat.force_flush(timeout_millis)
        except Exception:  # the SDK raises when a reader fails; the main flush still runs
            _logger.warning("otel-training: flushing the heartbeat failed", exc_info=True)
            beat = False
        remaining_ms = max(0.0, deadline - time.monotonic()) * 1000
        return super().force_flush(remaining_ms) and beat

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        deadline = time.monotonic() + timeout_millis / 1000
        beat = threading.Thread(
            target=self.heartbeat.shutdown,
            kwargs={"timeout_millis": timeout_millis},
            name="otel-training-heartbeat-shutdown",
            daemon=True,
        )
        beat.start()
        try:
            super().shutdown(timeout_millis=timeout_millis)
        finally:
            beat.join(max(0.0, deadline - time.monotonic()))
