"""One line per outage of an OTLP endpoint instead of the SDK's stream of retry and error lines.

With the collector down, the OTLP exporters log a ``Transient error ... retrying`` warning
for every retry and a ``Failed to export`` error for every batch given up: 16 lines in a
minute of a demo, interleaved with its progress. The exporters of
:mod:`otel_training.export.exporters` that wrap an OTLP exporter install :class:`_OutageFilter` on
the SDK's loggers and report each export's result here: the first of those lines in an outage
becomes one warning of ours (:class:`otel_training._log_once.LogOnce`), the others are dropped, and
the outage ends when every signal whose export failed has exported again; the next failure is said
again.
"""

from __future__ import annotations

import logging
import re
import threading

from otel_training._log_once import LogOnce

__all__ = ["exported", "install"]

#: The loggers of the OTLP exporters' retries and failures, gRPC and HTTP.
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
)
#: How the lines of a failing export begin (the SDK's own wording).
_FAILURE_LINES = ("Transient error", "Failed to export", "Shutdown in progress, aborting retry")
_RETRYING = re.compile(r", retrying in [0-9.]+ ?s")
#: Characters of the SDK's line kept in ours.
_DETAIL_CHARACTERS = 300

_said = LogOnce(logging.getLogger("otel_training.export.exporters"), level=logging.WARNING)
_failing: set[str] = set()
_lock = threading.Lock()


class _OutageFilter(logging.Filter):
    """Drops the OTLP exporters' retry and failure lines; the first of an outage is said as
    one line of otel-training's. Runs on the exporting thread; never raises."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_FAILURE_LINES):
            return True
        if _said.due("outage"):
            try:
                detail = _RETRYING.sub("", record.getMessage())
            except Exception:
                detail = str(record.msg)
            if len(detail) > _DETAIL_CHARACTERS:
                detail = detail[:_DETAIL_CHARACTERS] + "..."
            logging.getLogger("otel_training.export.exporters").warning(
                "otel-training: OTLP export failed (%s); telemetry is dropped while the endpoint "
                "does not take it. Said once until an export succeeds again.",
                detail,
            )
        return False


_filter = _OutageFilter()


def install() -> None:
    """Installs the filter on the OTLP exporters' loggers, once. Never raises."""
    for name in _SDK_LOGGERS:
        logger = logging.getLogger(name)
        if _filter not in logger.filters:
            logger.addFilter(_filter)


def exported(signal: str, ok: bool) -> None:
    """Reports the result of one OTLP export of ``signal`` (``metrics``, ``traces``, ``logs``):
    once every failing signal has exported again, the next failure is said again. Called on
    the exporting thread; never raises."""
    if ok and not _failing:  # the common case: answered without the lock
        return
    with _lock:
        if not ok:
            _failing.add(signal)
        elif signal in _failing:
            _failing.discard(signal)
            if not _failing:
                _said.clear()
