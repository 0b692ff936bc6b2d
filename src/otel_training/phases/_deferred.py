"""Spans whose attributes wait for device values, ended on one background thread.

A phase that carries a CUDA tensor as an attribute (``it.set_attribute("loss", loss)``) must not
read it on the training thread. When such a phase ends, the training thread only queues the span,
its end time (read then, on the process clock) and the pending reads; the thread
``otel-training-span-end`` waits for each device copy, sets the attributes and ends the span with
that recorded end time, in order. Its status (an exception that left the phase) is already set.
The queue is drained before the providers at ``force_flush``/``shutdown``
(:func:`otel_training.configuration.add_flush_hook`).
"""

from __future__ import annotations

import collections
import os
import threading
import time

from opentelemetry import trace as trace_api

from otel_training import configuration
from otel_training.phases._warnings import warn_once
from otel_training.trace.span_values import attribute_value, host_value

__all__ = ["DEFERRED_ENDS", "DeferredEnds"]


class DeferredEnds:
    """The queue of spans waiting for device values and the thread that ends them."""

    def __init__(self) -> None:
        self._hooked = False
        self._reset()

    def _reset(self) -> None:
        """Fresh lock, queue and no thread: at construction and in a forked child (where a
        lock held by a thread of the parent would stay held forever)."""
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: collections.deque = collections.deque()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._busy = 0

    def submit(self, span: trace_api.Span, end_ns: int, pending: list) -> None:
        """Queues ``span`` to end at ``end_ns`` (ns, Unix) once ``pending`` (key, read) are
        read. Runs on the training thread: an append under a lock held only for appends."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="otel-training-span-end", daemon=True
                )
                self._thread.start()
            if not self._hooked:
                self._hooked = True
                configuration.add_flush_hook(self.flush)
            self._queue.append((span, end_ns, pending))
            self._busy += 1
            self._ready.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Waits until every queued span has ended; False when ``timeout_s`` ran out."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._ready.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._ready.wait()
                span, end_ns, pending = self._queue.popleft()
            try:
                for key, read in pending:
                    try:
                        value = attribute_value(host_value(read.result()))
                    except Exception:
                        value = "<unreadable device value>"
                    span.set_attribute(key, value)
                if getattr(span, "end_time", None) is None:  # not ended by a truncation
                    span.end(end_time=end_ns)
            except Exception:
                warn_once("deferred", "could not end a deferred span")
            with self._lock:
                self._busy -= 1
                self._ready.notify_all()


#: The process's queue of deferred ends.
DEFERRED_ENDS = DeferredEnds()


def _after_fork_in_child() -> None:
    DEFERRED_ENDS._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
