"""``ExceptionLogSpanProcessor``: the exceptions recorded on spans, also as ERROR log records.

When a span ends with an ``exception`` event (what every phase records when an exception leaves
it, and what ``span.record_exception()`` adds), one log record is emitted on the given logger:

- severity ``ERROR`` (number 17), timestamp the event's;
- body: the span's status description (``ValueError: loss is NaN`` for a phase), else
  ``{exception.type}: {exception.message}``;
- attributes ``exception.type``, ``exception.message`` and ``exception.stacktrace`` (the OTel
  semantic conventions), taken from the event;
- the span's trace id, span id and trace flags when the span is sampled (none otherwise, as for
  every record otel-training emits), set explicitly on the record rather than taken from the
  current context, which at the end of a span may be another span's.

One exception, one record: an exception that leaves nested phases is recorded on each of their
spans, but logged only where it left the innermost one. A span is skipped when one of its
children logged an exception of the same type and message whose stack trace the span's ends
with (the same exception, seen further up); another exception alike, raised elsewhere, has
another stack and is logged. ``configure()`` installs it when logs are exported.

``on_end`` runs on the thread that ends the span; it costs a look at the span's events and,
for an exception, an append to the logs batch queue. Nothing here raises.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any

from opentelemetry import _logs as logs_api
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)

from otel_training._log_once import LogOnce
from otel_training.logs.bridge import link_to_span

__all__ = ["ExceptionLogSpanProcessor"]

_logger = logging.getLogger(__name__)

#: Spans remembered as "a child logged this exception" (the oldest are forgotten first).
_MAX_TRACKED = 1024
_EXCEPTION_ATTRIBUTES = (EXCEPTION_TYPE, EXCEPTION_MESSAGE, EXCEPTION_STACKTRACE)


class ExceptionLogSpanProcessor(SpanProcessor):
    """Emits an ERROR log record for each exception recorded on a span (module docstring).

    Args:
        logger: The OpenTelemetry logger to emit on (the pipeline's ``otel_training`` one).
    """

    def __init__(self, logger: logs_api.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        # (trace id, span id) of a span whose child logged an exception -> its type, message
        # and stack trace.
        self._propagating: OrderedDict[tuple[int, int], tuple[Any, Any, str]] = OrderedDict()
        self._failed = LogOnce(_logger, exc_info=True)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        try:
            events = getattr(span, "_events", None)
            if events is None:
                events = span.events
            if not events:
                return
            for event in events:
                if event.name == "exception":
                    self._on_exception(span, event)
        except Exception:
            self._failed("log", "otel-training: could not log an exception recorded on a span")

    def _on_exception(self, span: ReadableSpan, event: Any) -> None:
        attributes = event.attributes or {}
        stack = attributes.get(EXCEPTION_STACKTRACE)
        stack = stack if type(stack) is str else ""
        key = (attributes.get(EXCEPTION_TYPE), attributes.get(EXCEPTION_MESSAGE))
        context = span.context
        parent = span.parent
        with self._lock:
            seen = self._propagating.pop((context.trace_id, context.span_id), None)
            if parent is not None:
                self._propagating[(context.trace_id, parent.span_id)] = (*key, stack)
                while len(self._propagating) > _MAX_TRACKED:
                    self._propagating.popitem(last=False)
        if seen is not None and seen[:2] == key and stack.endswith(_last_traceback(seen[2])):
            return  # a child span logged this exception already
        description = span.status.description
        body = description or f"{key[0]}: {key[1]}"
        record = LogRecord(
            timestamp=event.timestamp,
            observed_timestamp=time.time_ns(),
            severity_text="ERROR",
            severity_number=SeverityNumber.ERROR,
            body=body,
            attributes={k: attributes[k] for k in _EXCEPTION_ATTRIBUTES if k in attributes},
        )
        self._logger.emit(link_to_span(record, context))

    def shutdown(self) -> None:
        with self._lock:
            self._propagating.clear()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


_TRACEBACK_HEADER = "Traceback (most recent call last):\n"


def _last_traceback(stack: str) -> str:
    """The frames and message of the last traceback in a formatted stack trace (after the
    chained exceptions it may start with): what the same exception's stack trace ends with
    at every span it propagates through."""
    start = stack.rfind(_TRACEBACK_HEADER)
    return stack if start < 0 else stack[start + len(_TRACEBACK_HEADER) :]
