"""The spans still open when telemetry shuts down are ended, marked truncated, and exported.

At interpreter exit and on SIGTERM (:mod:`otel_training.pipeline.lifecycle`), and when
``configure()`` replaces a pipeline, a run span, an iteration in progress or a checkpoint save that
was never ended would otherwise be lost: only its ``span_start`` JSON line would remain. The phases
(:mod:`otel_training.phases`) and the trace segments register each span they start in the
pipeline's :class:`OpenSpans` and remove it when it ends (one dict store and one dict pop, on
the thread that starts or ends it: no span processor, whose dispatch the SDK pays per span).
Before the providers shut down, each open span gets the attribute
``otel_training.span.truncated = true``
(:data:`otel_training.semconv.attributes.OTEL_TRAINING_SPAN_TRUNCATED`) and is ended now (on the
process clock, :func:`otel_training.clock.now_ns`, as the phases date their spans), the newest
first (children before their parents). On SIGTERM its status also becomes ERROR with the
description ``truncated: SIGTERM``; at a normal exit the status is left as it is. Spans of other
instrumentation (a tracer of the user's own) are not registered. Nothing here raises.
"""

from __future__ import annotations

import logging

from opentelemetry.trace import Span, Status, StatusCode

from otel_training import clock
from otel_training.semconv.attributes import OTEL_TRAINING_SPAN_TRUNCATED

__all__ = ["OpenSpans"]

_logger = logging.getLogger(__name__)


class OpenSpans:
    """The open spans of one pipeline, in start order: ``spans[span] = True`` when one
    starts, ``spans.pop(span, None)`` when it ends."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: dict[Span, bool] = {}

    def __len__(self) -> int:
        return len(self.spans)

    def truncate(self, reason: str | None = None) -> int:
        """Ends every open span, marked truncated; with a ``reason`` (``"SIGTERM"``) also
        status ERROR, ``truncated: {reason}``. Returns how many were ended. Runs on the
        calling thread (the shutting-down one); spans another thread ends meanwhile are
        skipped. Never raises."""
        ended = 0
        for span in reversed(list(self.spans.copy())):
            self.spans.pop(span, None)
            try:
                if getattr(span, "end_time", None) is not None:
                    continue
                span.set_attribute(OTEL_TRAINING_SPAN_TRUNCATED, True)
                if reason is not None:
                    span.set_status(Status(StatusCode.ERROR, f"truncated: {reason}"))
                span.end(end_time=clock.now_ns())  # the process clock, as the phases
                ended += 1
            except Exception:
                _logger.debug("could not end a truncated span", exc_info=True)
        return ended
