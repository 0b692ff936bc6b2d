"""``CheckpointMetricsSpanProcessor``: the duration of every checkpoint span, also as a metric.

Prometheus stores no spans, so Grafana cannot chart how long checkpoints take from traces. This
processor records the duration of each span named ``megatron.checkpoint.save`` or
``megatron.checkpoint.load`` when it ends, on the histogram ``megatron.checkpoint.duration``
(seconds; attribute ``megatron.checkpoint.operation`` = ``save`` | ``load``; buckets from
:data:`otel_training.metrics.views.CHECKPOINT_DURATION_BUCKETS_S`). The duration is the span's own:
``(end_time - start_time) / 1e9``, so the metric and the trace always agree.

It works whatever the traces exporter, ``none`` included: span processors see every recorded
span, exported or not. It sees only recorded spans, though: with the checkpoint span group off
(``OTEL_PYTHON_TRAINING_SPAN_GROUPS``) or a sampler that drops the span, nothing is recorded.

Cost per span end: one dict lookup by span name; only checkpoint spans go further.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.metrics import Meter
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from otel_training._log_once import LogOnce
from otel_training.semconv.attributes import (
    MEGATRON_CHECKPOINT_OPERATION,
    OTEL_TRAINING_SPAN_TRUNCATED,
)
from otel_training.semconv.metrics import create_megatron_checkpoint_duration
from otel_training.semconv.spans import MEGATRON_CHECKPOINT_LOAD, MEGATRON_CHECKPOINT_SAVE

__all__ = ["CheckpointMetricsSpanProcessor"]

_logger = logging.getLogger(__name__)

#: The point attributes of each checkpoint span name (shared, never mutated).
_OPERATIONS: Mapping[str, Mapping[str, str]] = {
    MEGATRON_CHECKPOINT_SAVE: {MEGATRON_CHECKPOINT_OPERATION: "save"},
    MEGATRON_CHECKPOINT_LOAD: {MEGATRON_CHECKPOINT_OPERATION: "load"},
}


class CheckpointMetricsSpanProcessor(SpanProcessor):
    """Records the duration of each ended checkpoint span on ``megatron.checkpoint.duration``.

    Args:
        meter: The meter of the pipeline's ``MeterProvider``; the histogram is created on it
            here.

    Raises:
        Whatever ``meter.create_histogram`` raises (an SDK meter raises nothing).

    ``on_end`` runs on the thread that ends the span (the training thread, or the thread that
    ends a span whose device values arrive late). It records one point, in seconds, for a span
    named ``megatron.checkpoint.save`` or ``megatron.checkpoint.load`` that ended normally;
    it records nothing for a span whose status is ERROR (a failed operation: the span says so),
    for one still open at shutdown and ended then (``otel_training.span.truncated``, whose end
    is the shutdown's, not the operation's), and for one without valid start and end times. It
    never raises: a failure is logged once and the span skipped.
    """

    def __init__(self, meter: Meter) -> None:
        self._histogram = create_megatron_checkpoint_duration(meter)
        self._failed = LogOnce(_logger, exc_info=True)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Does nothing."""

    def on_end(self, span: ReadableSpan) -> None:
        """Records the duration of a checkpoint span (see the class). Never raises."""
        try:
            attributes = _OPERATIONS.get(span.name)
            if attributes is None:
                return
            start_ns, end_ns = span.start_time, span.end_time
            if not isinstance(start_ns, int) or not isinstance(end_ns, int) or end_ns < start_ns:
                return
            if span.status.status_code is StatusCode.ERROR:
                return
            if (span.attributes or {}).get(OTEL_TRAINING_SPAN_TRUNCATED):
                return
            self._histogram.record((end_ns - start_ns) / 1e9, attributes)
        except Exception:
            self._failed(
                "record",
                "otel-training could not record a checkpoint duration; further failures "
                "are not logged.",
            )

    def shutdown(self) -> None:
        """Does nothing: the points are the MeterProvider's to export."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing to flush; returns True."""
        return True
