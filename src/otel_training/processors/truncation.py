"""``TruncatingSpanProcessor``: the spans still open when telemetry shuts down are ended,
marked truncated, and exported.

At interpreter exit and on SIGTERM (:mod:`otel_training.lifecycle`), and when ``configure()``
replaces a pipeline, a run span, an iteration in progress or a checkpoint save that was never
ended would otherwise be lost: only its ``span_start`` JSON line would remain. Before the
providers shut down, each open span gets the attribute ``otel_training.span.truncated = true``
(:data:`otel_training.semconv.attributes.OTEL_TRAINING_SPAN_TRUNCATED`) and is ended now, the
newest first (children before their parents). On SIGTERM its status also becomes ERROR with the
description ``truncated: SIGTERM``; at a normal exit the status is left as it is.

``on_start``/``on_end`` cost one dict store and one dict pop, on the thread that starts or ends
the span. Nothing here raises.
"""

from __future__ import annotations

import logging

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import Status, StatusCode

from otel_training.semconv.attributes import OTEL_TRAINING_SPAN_TRUNCATED

__all__ = ["TruncatingSpanProcessor"]

_logger = logging.getLogger(__name__)


class TruncatingSpanProcessor(SpanProcessor):
    """Keeps the spans that started and have not ended; :meth:`truncate` ends them."""

    def __init__(self) -> None:
        self._open: dict[int, Span] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._open[span.context.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        self._open.pop(span.context.span_id, None)

    @property
    def open_spans(self) -> int:
        """How many spans are open now."""
        return len(self._open)

    def truncate(self, reason: str | None = None) -> int:
        """Ends every open span, marked truncated; with a ``reason`` (``"SIGTERM"``) also
        status ERROR, ``truncated: {reason}``. Returns how many were ended. Runs on the
        calling thread (the shutting-down one); spans another thread ends meanwhile are
        skipped. Never raises."""
        ended = 0
        for span in reversed(list(self._open.copy().values())):
            try:
                if span.end_time is not None:
                    continue
                span.set_attribute(OTEL_TRAINING_SPAN_TRUNCATED, True)
                if reason is not None:
                    span.set_status(Status(StatusCode.ERROR, f"truncated: {reason}"))
                span.end()
                ended += 1
            except Exception:
                _logger.debug("could not end a truncated span", exc_info=True)
        return ended

    def shutdown(self) -> None:
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
