"""Batch processors that count what a full queue drops: ``CountingBatchLogRecordProcessor``
and ``CountingBatchSpanProcessor``.

The SDK's batch processors drop the oldest record when their queue is full, with a warning
without a count (``Queue full, dropping Log.``, at most one each 20 s) and no count unless
``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` is set. These are the SDK's processors with that
hook taken over: each drop adds one to :attr:`dropped` (an integer add under a lock, on the
thread that emits: the training thread, the logging thread); the export thread says so in a
warning with the count, at its next batch and then at most once a minute, and shutdown says
the total. The SDK's own warning (``Queue full, dropping Log.``, without a count) is left out
while a counting processor's queue is full (:func:`silence_sdk_queue_warnings`); other batch
processors of the process keep theirs.
:func:`observe_drops` exports the counts as ``otel_training.log_record.dropped`` and
``otel_training.span.dropped`` (semconv/registry/telemetry.yaml).

Nothing here raises on the recording path.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Final

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_training.semconv.metrics import (
    METRICS,
    OTEL_TRAINING_LOG_RECORD_DROPPED,
    OTEL_TRAINING_SPAN_DROPPED,
)

__all__ = [
    "CountingBatchLogRecordProcessor",
    "CountingBatchSpanProcessor",
    "observe_drops",
    "silence_sdk_queue_warnings",
]

_logger = logging.getLogger(__name__)

#: Seconds between two warnings with the count of drops since the last one.
REPORT_INTERVAL_S: Final = 60.0


class _DropCount:
    """The SDK processor's metrics hook (``ProcessorMetricsT``), counting queue-full drops
    and handing everything on to the SDK's own (a no-op unless its internal metrics are on).

    Args:
        inner: The SDK's hook.
        what: What dropped, for the warnings (``log records``, ``spans``).
        where: The processor's exporter, for the warnings (``OTLP/gRPC http://...``).
        queue_size: The queue's size, in records.
        variable: The variable that sets it.
    """

    def __init__(self, inner: Any, what: str, where: str, queue_size: int, variable: str):
        self._inner = inner
        self._what = what
        self._where = where
        self._queue_size = queue_size
        self._variable = variable
        self._lock = threading.Lock()
        self.dropped = 0
        self._reported = 0
        self._reported_at = -REPORT_INTERVAL_S

    # -- the SDK's hook ----------------------------------------------------------------------

    def register_queue_size(self, get_queue_size) -> None:
        self._inner.register_queue_size(get_queue_size)

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        """On the thread that emits: counts, says nothing (the export thread will)."""
        if error_type == "queue_full":
            with self._lock:
                self.dropped += count
        self._inner.drop_items(count, error_type)

    def finish_items(self, count: int) -> None:
        """On the export thread, at each batch: reports new drops, at most once a minute
        after the first report."""
        self._inner.finish_items(count)
        if self.dropped != self._reported:
            now = time.monotonic()
            if self._reported == 0 or now - self._reported_at >= REPORT_INTERVAL_S:
                self.report(now)

    # -- reports -----------------------------------------------------------------------------

    def report(self, now: float | None = None) -> None:
        """Warns with the drops not yet reported, if any. Never raises."""
        dropped = self.dropped
        new = dropped - self._reported
        if new <= 0:
            return
        first = self._reported == 0
        self._reported = dropped
        self._reported_at = time.monotonic() if now is None else now
        metric = (
            OTEL_TRAINING_LOG_RECORD_DROPPED
            if self._what == "log records"
            else OTEL_TRAINING_SPAN_DROPPED
        )
        try:
            if first:
                _logger.warning(
                    "otel-training: the queue of the batch processor of %s is full (%d records;"
                    " %s sets it): %d %s dropped so far, counted by %s; the count is said "
                    "again at most once a minute and at shutdown.",
                    self._where,
                    self._queue_size,
                    self._variable,
                    new,
                    self._what,
                    metric,
                )
            else:
                _logger.warning(
                    "otel-training: %d more %s dropped because the queue of the batch processor"
                    " of %s was full: %d in all (%s).",
                    new,
                    self._what,
                    self._where,
                    dropped,
                    metric,
                )
        except Exception:  # pragma: no cover - logging's own handlers never raise here
            pass


#: The live counting processors (for :class:`_QueueFullFilter`).
_COUNTING: weakref.WeakSet[Any] = weakref.WeakSet()


class _CountsDrops:
    """What both counting processors add to the SDK's: the drop count (the SDK's metrics hook
    taken over), :attr:`dropped`, and the last report at shutdown."""

    _what = ""
    _variable = ""
    _drops: _DropCount

    def _full(self) -> bool:
        batch = self._batch_processor  # type: ignore[attr-defined]
        return len(batch._queue) >= batch._max_queue_size

    def _count_drops(self, where: str) -> None:
        _COUNTING.add(self)
        silence_sdk_queue_warnings()
        batch = self._batch_processor  # type: ignore[attr-defined]
        self._drops = _DropCount(
            batch._metrics, self._what, where, batch._max_queue_size, self._variable
        )
        batch._metrics = self._drops

    @property
    def dropped(self) -> int:
        """Records dropped so far because the queue was full."""
        return self._drops.dropped

    def shutdown(self) -> None:
        super().shutdown()  # type: ignore[misc]
        self._drops.report()


class CountingBatchLogRecordProcessor(_CountsDrops, BatchLogRecordProcessor):
    """The SDK's ``BatchLogRecordProcessor``, counting and reporting the records its full
    queue drops (module docstring).

    Args:
        exporter: As for the SDK's.
        where: The exporter's destination, for the warnings.
        **kwargs: The SDK processor's settings (``max_queue_size``...).
    """

    _what = "log records"
    _variable = "OTEL_BLRP_MAX_QUEUE_SIZE"

    def __init__(self, exporter: Any, *, where: str, **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        self._count_drops(where)


class CountingBatchSpanProcessor(_CountsDrops, BatchSpanProcessor):
    """The SDK's ``BatchSpanProcessor``, counting and reporting the spans its full queue
    drops (module docstring).

    Args:
        exporter: As for the SDK's.
        where: The exporter's destination, for the warnings.
        **kwargs: The SDK processor's settings (``max_queue_size``...).
    """

    _what = "spans"
    _variable = "OTEL_BSP_MAX_QUEUE_SIZE"

    def __init__(self, exporter: Any, *, where: str, **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        self._count_drops(where)


def observe_drops(
    meter: Meter,
    log_processors: Sequence[Any] = (),
    span_processors: Sequence[Any] = (),
) -> None:
    """Registers ``otel_training.log_record.dropped`` over the counting log processors and
    ``otel_training.span.dropped`` over the counting span processors among those given (the
    others are skipped), each only when there is one. The callbacks run on the metric
    reader's thread and read integers. Never raises (a failure is one warning)."""
    counted = (CountingBatchLogRecordProcessor, CountingBatchSpanProcessor)

    def observe(processors: list[Any]):
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            yield Observation(sum(p.dropped for p in processors))

        return callback

    try:
        for name, processors in (
            (OTEL_TRAINING_LOG_RECORD_DROPPED, log_processors),
            (OTEL_TRAINING_SPAN_DROPPED, span_processors),
        ):
            mine = [p for p in processors if isinstance(p, counted)]
            if mine:
                spec = METRICS[name]
                meter.create_observable_counter(
                    spec.name,
                    callbacks=[observe(mine)],
                    unit=spec.unit,
                    description=spec.description,
                )
    except Exception:
        _logger.warning("otel-training: the dropped-record counters could not be created")


class _QueueFullFilter(logging.Filter):
    """Drops the SDK's ``Queue full, dropping ...`` warning while the queue of a counting
    processor is full (that processor reports the drops with their count instead); the
    warning of any other batch processor in the process is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Queue full, dropping"):
            return True
        return not any(p._full() for p in list(_COUNTING))


_queue_full_filter = _QueueFullFilter()


def silence_sdk_queue_warnings() -> None:
    """Installs the filter of :class:`_QueueFullFilter` on the SDK's logger once."""
    logger = logging.getLogger("opentelemetry.sdk._shared_internal")
    if _queue_full_filter not in logger.filters:
        logger.addFilter(_queue_full_filter)
