"""Exporters that guard what they hand on: ``SafeSpanExporter``, ``SafeMetricExporter`` and
``SafeLogRecordExporter``, and the Prometheus reader's equivalent (``safe_prometheus_reader``);
``PeriodicMetricReader``, whose final collection is not lost to a timeout.

``configure()`` wraps every exporter it builds (OTLP, console, the embedded OTLP-JSON files) in
one of these. Each one, on the exporting thread (the batch processor's or the metric reader's,
never the training thread):

- exports nothing from a forked child (a DataLoader worker would otherwise re-export the
  parent's values, over a gRPC channel that is not fork-safe);
- applies the string rule of :mod:`otel_training.export.limits` to everything it exports (records,
  their scopes and resources, metric names, units and descriptions), so that a lone
  surrogate, a huge value or an integer beyond int64 never costs the batch;
- keeps each request under ``max_request_bytes`` (3 MiB by default; receivers such as the
  collector refuse 4 MiB; one OTLP-JSON line is kept under 900,000 bytes) by splitting a batch
  in order, by worst-case size, the resource and scope of each request counted once;
- for spans and logs, when a receiver still refuses a large batch quickly (a lower size
  limit, HTTP 413, gRPC RESOURCE_EXHAUSTED), sends it again in halves while the export timeout
  lasts, instead of losing it whole.

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
from opentelemetry.sdk.metrics import MetricsTimeoutError
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_training._log_once import LogOnce
from otel_training.export import _outage as _export_outage
from otel_training.export import limits as _limits

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "PeriodicMetricReader",
    "SafeLogRecordExporter",
    "SafeMetricExporter",
    "SafeSpanExporter",
    "bounded_metrics",
    "safe_prometheus_reader",
    "split_metrics",
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


def _chunks(
    items: Sequence[_T],
    cost: Callable[[_T], int],
    limit: int,
    shared: Callable[[_T], tuple[Any, Any]] | None = None,
) -> list[Sequence[_T]]:
    """``items`` in order, in runs whose summed ``cost`` stays under ``limit`` (an item
    costlier than ``limit`` alone in its run). ``shared(item)`` gives the resource and scope
    that a request carries once for all the items that share them: each resource counts once
    a run, each scope once per resource (OTLP groups scopes by resource), at
    :func:`limits.scope_cost`."""
    runs: list[Sequence[_T]] = []
    start = 0
    used = 0
    seen: set[tuple[int, ...]] = set()
    for i, item in enumerate(items):
        c = cost(item)
        groups = ()
        if shared is not None:
            resource, scope = shared(item)
            groups = (((id(resource),), resource), ((id(resource), id(scope)), scope))
            c += sum(_limits.scope_cost(g) for key, g in groups if key not in seen)
        if used + c > limit and i > start:
            runs.append(items[start:i])
            start, used = i, 0
            seen.clear()
            c = cost(item) + sum(_limits.scope_cost(g) for _, g in groups)
        seen.update(key for key, _ in groups)
        used += c
    runs.append(items[start:])
    return runs


def _groups(record: Any) -> tuple[Any, Any]:
    """The resource and scope of a span or log record."""
    return (record.resource, record.instrumentation_scope)


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


def _is_otlp(exporter: Any) -> bool:
    """Whether ``exporter`` is one of the SDK's OTLP exporters (gRPC or HTTP): its failures
    are said once per outage (:mod:`otel_training.export._outage`), and the filter that
    collapses the SDK's lines is installed."""
    otlp = type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.")
    if otlp:
        _export_outage.install()
    return otlp


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
    _signal = ""
    _bound: Callable[[Any, _limits.Limits], Any]
    _cost: Callable[[Any], int]
    _groups: Callable[[Any], tuple[Any, Any]]
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
        self._otlp = _is_otlp(exporter)
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
            for run in _chunks(bounded, cost, self._max_request_bytes, self._groups):
                ok = send(run) and ok
        except Exception:
            _logger.warning("otel-training: a %s export failed", self._what, exc_info=True)
            return self._failure
        if self._otlp:
            _export_outage.exported(self._signal, ok)
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
    _signal = "traces"
    _bound = staticmethod(_limits.bounded_span)
    _cost = staticmethod(_limits.span_cost)
    _groups = staticmethod(_groups)
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
    the string rule of :mod:`otel_training.export.limits` (``bounded_log_record``); a batch is split
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
    _signal = "logs"
    _bound = staticmethod(_limits.bounded_log_record)
    _cost = staticmethod(_limits.log_record_cost)
    _groups = staticmethod(_groups)
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
    """Hands metrics to ``exporter`` bounded, encodable, in requests under the size limit.

    Resources, scopes, metric names, units and descriptions, point and exemplar attributes
    follow the string rule (:func:`limits.bounded_metrics_data`); integer points beyond int64
    are saturated at its ends, with one warning (a sum beyond int64 would fail every later
    export); a collection is split, in order, into requests under ``max_request_bytes`` of
    worst-case size (:func:`limits.metric_point_cost`). A forked child exports nothing.
    Temporality and aggregation preferences are those of ``exporter``.

    Args:
        exporter: The exporter to delegate to (OTLP, console, the OTLP-JSON file).
        limits: The string rule's limits.
        max_request_bytes: Largest worst-case request size, in bytes.

    ``export`` runs on the metric reader's thread and never raises.
    """

    def __init__(
        self,
        exporter: MetricExporter,
        *,
        limits: _limits.Limits = _limits.DEFAULT_LIMITS,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._limits = limits
        self._max_request_bytes = max_request_bytes
        self._pid = os.getpid()
        self._said = LogOnce(_logger)
        self._otlp = _is_otlp(exporter)
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
            metrics_data = bounded_metrics(metrics_data, self._limits, self._warn_saturated)
            ok = True
            for part in split_metrics(metrics_data, self._max_request_bytes):
                result = self._exporter.export(part, timeout_millis=timeout_millis, **kwargs)
                ok = result is MetricExportResult.SUCCESS and ok
            if self._otlp:
                _export_outage.exported("metrics", ok)
            return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE
        except Exception:
            _logger.warning("otel-training: a metrics export failed", exc_info=True)
            return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() != self._pid or self._exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        if os.getpid() == self._pid:
            self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)

    def _warn_saturated(self, name: str) -> None:
        self._said(
            "saturated",
            "otel-training: %s has a point beyond int64 (OTLP carries int64 only); "
            "exported saturated at its end. This warning is shown once.",
            name,
        )


def bounded_metrics(
    data: MetricsData, limits: _limits.Limits, on_saturated: Callable[[str], None]
) -> MetricsData:
    """``data`` after the string rule (:func:`limits.bounded_metrics_data`); calls
    ``on_saturated(metric name)`` for the first integer point saturated at int64."""
    saturated: list[str] = []
    data = _limits.bounded_metrics_data(data, limits, saturated)
    if saturated:
        on_saturated(saturated[0])
    return data


def split_metrics(data: MetricsData, max_request_bytes: int) -> list[MetricsData]:
    """``data`` in order, in parts whose worst-case size stays under ``max_request_bytes``
    (a point costlier than that alone in its part); each part keeps the resource, scope and
    metric (name, unit, description, kind) of its points."""
    total = 0
    for resource_metrics in data.resource_metrics:
        total += _limits.scope_cost(resource_metrics.resource)
        for scope_metrics in resource_metrics.scope_metrics:
            total += _limits.scope_cost(scope_metrics.scope)
            for metric in scope_metrics.metrics:
                total += _limits.metric_cost(metric)
                total += sum(map(_limits.metric_point_cost, metric.data.data_points))
    if total <= max_request_bytes:
        return [data]
    parts: list[MetricsData] = []
    current: list = []  # [(resource_metrics, [(scope_metrics, [(metric, [points])])])]
    used = 0

    def close() -> None:
        nonlocal current, used
        if current:
            parts.append(
                MetricsData(
                    resource_metrics=[
                        dataclasses.replace(
                            rm,
                            scope_metrics=[
                                dataclasses.replace(
                                    sm,
                                    metrics=[
                                        dataclasses.replace(
                                            m, data=dataclasses.replace(m.data, data_points=pts)
                                        )
                                        for m, pts in metrics
                                    ],
                                )
                                for sm, metrics in scopes
                            ],
                        )
                        for rm, scopes in current
                    ]
                )
            )
        current, used = [], 0

    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    cost = _limits.metric_point_cost(point)
                    opening = 0
                    if not current or current[-1][0] is not resource_metrics:
                        opening = _limits.scope_cost(resource_metrics.resource)
                        opening += _limits.scope_cost(scope_metrics.scope)
                        opening += _limits.metric_cost(metric)
                    elif current[-1][1][-1][0] is not scope_metrics:
                        opening = _limits.scope_cost(scope_metrics.scope)
                        opening += _limits.metric_cost(metric)
                    elif current[-1][1][-1][1][-1][0] is not metric:
                        opening = _limits.metric_cost(metric)
                    if current and used + opening + cost > max_request_bytes:
                        close()
                        opening = (
                            _limits.scope_cost(resource_metrics.resource)
                            + _limits.scope_cost(scope_metrics.scope)
                            + _limits.metric_cost(metric)
                        )
                    if not current or current[-1][0] is not resource_metrics:
                        current.append((resource_metrics, []))
                    scopes = current[-1][1]
                    if not scopes or scopes[-1][0] is not scope_metrics:
                        scopes.append((scope_metrics, []))
                    metrics = scopes[-1][1]
                    if not metrics or metrics[-1][0] is not metric:
                        metrics.append((metric, []))
                    metrics[-1][1].append(point)
                    used += opening + cost
    close()
    return parts


def safe_prometheus_reader(limits: _limits.Limits = _limits.DEFAULT_LIMITS) -> MetricReader:
    """A ``PrometheusMetricReader`` whose collections follow the string rule
    (:func:`limits.bounded_metrics_data`) before they are translated for a scrape: one odd
    scope name, description or label value would otherwise fail every scrape (the text
    format is written as UTF-8). Integer points beyond int64 are saturated as for OTLP.

    Raises:
        ImportError: without ``opentelemetry-exporter-prometheus``.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    class SafePrometheusMetricReader(PrometheusMetricReader):
        def _receive_metrics(self, metrics_data: MetricsData, *args: Any, **kwargs: Any) -> None:
            if metrics_data is not None:
                metrics_data = _limits.bounded_metrics_data(metrics_data, limits)
            super()._receive_metrics(metrics_data, *args, **kwargs)

    return SafePrometheusMetricReader()


class PeriodicMetricReader(PeriodicExportingMetricReader):
    """The SDK's ``PeriodicExportingMetricReader``, whose collections that time out (an
    observable callback still running at the collection's deadline) are said in one warning
    line instead of the SDK's traceback, and whose final collection is not lost to one.

    A periodic collection that times out is said once per process; what it held is exported
    with the next one (the synchronous instruments' values stay in the SDK's storage). The
    final collection, at ``shutdown(timeout_millis)``, is bounded by that timeout, not by the
    export interval: the first try has half of it, and a try that times out is tried once more
    with what is left of it; when that one times out too, or no time is left for it, a warning
    says that the values recorded since the last export were not exported. Arguments are
    ``PeriodicExportingMetricReader``'s. Collections run on the reader's thread
    (``force_flush`` on the caller's); never raises ``MetricsTimeoutError``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._final_deadline: float | None = None  # time.monotonic(), set by shutdown()
        self._said = LogOnce(_logger)
        super().__init__(*args, **kwargs)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._final_deadline = time.monotonic() + timeout_millis / 1000
        super().shutdown(timeout_millis=timeout_millis, **kwargs)

    def collect(self, timeout_millis: float = 10_000) -> None:
        deadline = self._final_deadline
        if deadline is None:
            try:
                super().collect(timeout_millis=timeout_millis)
            except MetricsTimeoutError:
                self._said(
                    "timeout",
                    "otel-training: a metric collection timed out after %.3g s (an observable "
                    "callback was slow); what it held is exported with the next one.",
                    timeout_millis / 1000,
                )
            return
        for share in (0.5, 1.0):  # the final collection: tried again once within the bound
            budget_ms = (deadline - time.monotonic()) * 1000 * share
            if budget_ms <= 0:
                break
            try:
                super().collect(timeout_millis=budget_ms)
                return
            except MetricsTimeoutError:
                continue
        _logger.warning(
            "otel-training: the final metric collection did not finish within the shutdown's "
            "timeout (an observable callback was slow); the values recorded since the last "
            "export were not exported."
        )
