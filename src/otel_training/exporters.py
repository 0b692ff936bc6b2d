"""Exporters that guard what they hand on: ``SafeSpanExporter``, ``SafeMetricExporter`` and
``SafeLogRecordExporter``.

``configure()`` wraps every exporter it builds (OTLP, console, the embedded OTLP-JSON files) in
one of these. Each one, on the exporting thread (the batch processor's or the metric reader's,
never the training thread):

- exports nothing from a forked child (a DataLoader worker would otherwise re-export the
  parent's values, over a gRPC channel that is not fork-safe);
- applies the string rule of :mod:`otel_training.limits` to everything it exports, so that a
  lone surrogate, a huge value or an integer beyond int64 never costs the batch;
- keeps each request under ``max_request_bytes`` (3 MiB by default; receivers such as the
  collector refuse 4 MiB) by splitting a batch in order, and when a receiver still refuses a
  large batch quickly (a lower size limit, HTTP 413, gRPC RESOURCE_EXHAUSTED), sends it again
  in halves while the export timeout lasts, instead of losing it whole.

None of them raises from ``export``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_training import limits as _limits

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "SafeLogRecordExporter",
    "SafeMetricExporter",
    "SafeSpanExporter",
]

_logger = logging.getLogger(__name__)

#: Largest worst-case size of one export request, in bytes (receivers refuse 4 MiB).
DEFAULT_MAX_REQUEST_BYTES: Final = 3 * 1024 * 1024
#: A failed request that took longer than this was not refused for its size (a dead or slow
#: endpoint takes its timeout); it is not split.
_FAST_FAILURE_S: Final = 1.0
#: A batch is split at most this many times over (into 2**depth requests) after refusals.
_MAX_SPLIT_DEPTH: Final = 4
#: A refused request smaller than this is not split: no receiver limit is that low.
_MIN_SPLIT_BYTES: Final = 128 * 1024

_T = TypeVar("_T")


def _chunks(items: Sequence[_T], cost: Callable[[_T], int], limit: int) -> list[Sequence[_T]]:
    """``items`` in order, in runs whose summed ``cost`` stays under ``limit`` (an item
    costlier than ``limit`` alone in its run)."""
    total = 0
    costs = []
    for item in items:
        c = cost(item)
        costs.append(c)
        total += c
    if total <= limit:
        return [items]
    runs: list[Sequence[_T]] = []
    start = 0
    used = 0
    for i, c in enumerate(costs):
        if used + c > limit and i > start:
            runs.append(items[start:i])
            start, used = i, 0
        used += c
    runs.append(items[start:])
    return runs


class _Splitter:
    """Sends runs of a batch through ``send``, splitting a run the receiver refused quickly."""

    def __init__(self, send, cost, success, timeout_s: float) -> None:
        self._send = send
        self._cost = cost
        self._success = success
        self._deadline = time.monotonic() + timeout_s

    def __call__(self, items: Sequence, depth: int = 0) -> bool:
        started = time.monotonic()
        try:
            ok = self._send(items) is self._success
        except Exception:
            _logger.warning("otel-training: an export failed", exc_info=True)
            return False
        if ok or len(items) < 2 or depth >= _MAX_SPLIT_DEPTH:
            return ok
        now = time.monotonic()
        if now - started > _FAST_FAILURE_S or now >= self._deadline:
            return False
        if sum(self._cost(item) for item in items) < _MIN_SPLIT_BYTES:
            return False
        middle = len(items) // 2
        first = self(items[:middle], depth + 1)
        second = self(items[middle:], depth + 1)
        return first and second


def _relax_grpc_retries(exporter: Any) -> None:
    """Makes a gRPC exporter give up at once on RESOURCE_EXHAUSTED without retry information:
    the collector answers an oversized request so, and the SDK would retry it unchanged until
    the timeout. We split the batch instead (the OTLP specification retries this code only
    when the server sends RetryInfo)."""
    codes = getattr(exporter, "_retryable_error_codes", None)
    if isinstance(codes, frozenset):
        try:
            from grpc import StatusCode

            exporter._retryable_error_codes = codes - {StatusCode.RESOURCE_EXHAUSTED}
        except Exception:  # pragma: no cover - grpc is a dependency of that exporter
            pass


class _BatchBounded:
    """What the span and log exporters share: the wrapped exporter, the fork guard, and a
    batch sent bounded (``_bound``), in order, in requests under ``max_request_bytes`` of
    worst-case ``_cost``, each request sent again in halves when refused quickly while
    ``timeout_s`` lasts."""

    _what = ""
    _bound: Callable[[Any, _limits.Limits], Any]
    _cost: Callable[[Any], int]
    _success: Any
    _failure: Any

    def __init__(
        self,
        exporter: Any,
        *,
        limits: _limits.Limits = _limits.DEFAULT_LIMITS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        timeout_s: float = 10.0,
    ) -> None:
        self._exporter = exporter
        self._limits = limits
        self._max_request_bytes = max_request_bytes
        self._timeout_s = timeout_s
        self._pid = os.getpid()
        _relax_grpc_retries(exporter)

    @property
    def exporter(self) -> Any:
        """The wrapped exporter."""
        return self._exporter

    def _send(self, batch: Sequence[Any]) -> Any:
        if os.getpid() != self._pid:
            return self._success
        try:
            limits, cost = self._limits, self._cost
            send = _Splitter(self._exporter.export, cost, self._success, self._timeout_s)
            ok = True
            bounded = [self._bound(record, limits) for record in batch]
            for run in _chunks(bounded, cost, self._max_request_bytes):
                ok = send(run) and ok
        except Exception:
            _logger.warning("otel-training: a %s export failed", self._what, exc_info=True)
            return self._failure
        return self._success if ok else self._failure

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return os.getpid() != self._pid or self._exporter.force_flush(timeout_millis)


class SafeSpanExporter(_BatchBounded, SpanExporter):
    """Hands spans to ``exporter`` bounded, encodable, in requests under the size limit.

    Args:
        exporter: The exporter to delegate to.
        limits: The string rule's limits for spans.
        max_request_bytes: Largest worst-case request size (:func:`limits.span_cost`).
        timeout_s: Export timeout in seconds: how long refused batches may be retried split.

    ``export`` runs on the batch processor's thread and never raises.
    """

    _what = "span"
    _bound = staticmethod(_limits.bounded_span)
    _cost = staticmethod(_limits.span_cost)
    _success = SpanExportResult.SUCCESS
    _failure = SpanExportResult.FAILURE

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._send(spans)

    def shutdown(self) -> None:
        if os.getpid() == self._pid:
            self._exporter.shutdown()


class SafeLogRecordExporter(_BatchBounded, LogRecordExporter):
    """Hands log records to ``exporter`` bounded, encodable, in requests under the size limit.

    Bodies, attribute keys and values, severity texts, event names and scope names follow
    the string rule of :mod:`otel_training.limits` (``bounded_log_record``); a batch is split
    in order into requests under ``max_request_bytes`` of worst-case size
    (``limits.log_record_cost``), and a request the receiver refuses quickly
    is sent again in halves while ``timeout_s`` lasts. A forked child exports nothing.

    Args:
        exporter: The exporter to delegate to (OTLP, console, the OTLP-JSON file).
        limits: The string rule's limits for logs (``OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT``).
        max_request_bytes: Largest worst-case request size, in bytes.
        timeout_s: Export timeout in seconds: how long refused batches may be retried split.

    ``export`` runs on the batch processor's thread and never raises.
    """

    _what = "log"
    _bound = staticmethod(_limits.bounded_log_record)
    _cost = staticmethod(_limits.log_record_cost)
    _success = LogRecordExportResult.SUCCESS
    _failure = LogRecordExportResult.FAILURE

    def __init__(self, exporter: LogRecordExporter, **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        try:
            self._shutdown_takes_timeout = (
                "timeout_millis" in inspect.signature(exporter.shutdown).parameters
            )
        except (TypeError, ValueError):
            self._shutdown_takes_timeout = False

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        return self._send(batch)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        """Shuts the wrapped exporter down (with ``timeout_millis`` where it takes one, as the
        OTLP/gRPC one does). Does nothing in a forked child."""
        if os.getpid() != self._pid:
            return
        if self._shutdown_takes_timeout:
            self._exporter.shutdown(timeout_millis=timeout_millis)
        else:
            self._exporter.shutdown()


class SafeMetricExporter(MetricExporter):
    """Hands metrics to ``exporter`` with every attribute, scope, description and unit
    bounded and encodable, and integer points within int64 (saturated, with one warning).

    Temporality and aggregation preferences are those of ``exporter``.
    """

    def __init__(
        self,
        exporter: MetricExporter,
        *,
        limits: _limits.Limits = _limits.DEFAULT_LIMITS,
    ) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._limits = limits
        self._pid = os.getpid()
        self._warned = False
        _relax_grpc_retries(exporter)

    @property
    def exporter(self) -> MetricExporter:
        """The wrapped exporter."""
        return self._exporter

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs
    ) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        try:
            metrics_data = self._bounded(metrics_data)
            return self._exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception:
            _logger.warning("otel-training: a metrics export failed", exc_info=True)
            return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() != self._pid or self._exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        if os.getpid() == self._pid:
            self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)

    # -- bounds -----------------------------------------------------------------------------

    def _bounded(self, data: MetricsData) -> MetricsData:
        if not self._needs_work(data):
            return data
        limit = self._limits.value_length
        resources = []
        for resource_metrics in data.resource_metrics:
            scopes = []
            for scope_metrics in resource_metrics.scope_metrics:
                metrics = [
                    dataclasses.replace(
                        metric,
                        description=_limits.safe_text(metric.description or "", limit),
                        unit=_limits.safe_text(metric.unit or "", _limits.MAX_NAME_LENGTH),
                        data=dataclasses.replace(
                            metric.data,
                            data_points=[
                                self._point(p, metric.name) for p in metric.data.data_points
                            ],
                        ),
                    )
                    for metric in scope_metrics.metrics
                ]
                scopes.append(dataclasses.replace(scope_metrics, metrics=metrics))
            resources.append(dataclasses.replace(resource_metrics, scope_metrics=scopes))
        return MetricsData(resource_metrics=resources)

    def _point(self, point: Any, name: str) -> Any:
        changes: dict[str, Any] = {}
        attributes = _limits.bounded_attributes(point.attributes, self._limits.value_length)
        if attributes is not point.attributes:
            changes["attributes"] = attributes
        value = getattr(point, "value", None)
        if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
            changes["value"] = _INT64_MAX if value > 0 else _INT64_MIN
            if not self._warned:
                self._warned = True
                _logger.warning(
                    "otel-training: %s has a point beyond int64 (OTLP carries int64 only); "
                    "exported saturated at %d. This warning is shown once.",
                    name,
                    changes["value"],
                )
        return dataclasses.replace(point, **changes) if changes else point

    def _needs_work(self, data: MetricsData) -> bool:
        limit = self._limits.value_length
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for text in (metric.description, metric.unit):
                        if text and not _limits._is_clean(text, limit):
                            return True
                    for point in metric.data.data_points:
                        if _limits._needs_work(point.attributes, limit):
                            return True
                        value = getattr(point, "value", None)
                        if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
                            return True
        return False


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
