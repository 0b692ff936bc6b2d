"""One trace across ranks, without communication: trace segments derived from the run id.

Every rank of a run computes the same ids from the run id (``dl.run.id``), so Jaeger shows all
ranks of a run side by side, and no trace grows without bound:

- **The run trace.** Each rank's ``megatron.train`` span (and what nests under it outside
  iterations: startup, model building, checkpoint loads) has the trace id
  ``H(run, "run")`` and, as parent, the span id ``H(run, "run")`` that no rank exports.
- **Segment traces.** Iterations ``s*N + 1 .. (s+1)*N`` (N:
  ``OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS``, default 1000) form segment ``s``. A phase
  with an iteration number (an iteration, an evaluation, a checkpoint save) that would be a
  child of the run span, or of no span, starts instead under this rank's
  ``megatron.train.segment`` span of its segment, whose trace id is ``H(run, s)`` and whose
  parent is the span id ``H(run, s)``, shared by every rank (and exported by none). A segment
  span links to the rank's previous segment span and to its run span; it ends when the next
  segment starts, when the run ends, or at shutdown.

``H`` is SHA-256 of ``otel-training/{run id}/{part}``: 16 bytes of trace id, 8 of span id.
A process that runs more than once under one run id (a second ``fit`` in a notebook, a second
``training_run()``) gives its k-th run (k >= 2) the parts ``run{k}/run`` and
``run{k}/segment/{s}``: each run has traces of its own, and ranks that run in step agree. Each
run starts with no segment open and links to nothing of the run before it.
Sampling is decided per trace id, so every rank decides alike (``traceidratio`` samplers keep
or drop a whole segment on every rank). Span ids of the spans themselves still come from each
process's own generator, so ranks that seed ``random`` alike never collide.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import sampling as sampling_sdk
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

from otel_training import clock
from otel_training.semconv.attributes import OTEL_TRAINING_TRACE_SEGMENT
from otel_training.semconv.spans import MEGATRON_TRAIN_SEGMENT

__all__ = ["TraceSegments", "derived_ids"]


# How many runs this process has begun (a forked child starts afresh).
_runs = 0


def run_begins() -> None:
    """Counts a run of this process (:func:`otel_training.training_run` calls this whether its
    span is recorded or not, so that every configuration numbers runs alike)."""
    global _runs
    _runs += 1


def _reset_runs() -> None:
    """Forgets the runs begun in this process (a forked child; tests)."""
    global _runs
    _runs = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_runs)


def derived_ids(run_id: str, part: str) -> tuple[int, int]:
    """(trace id, span id) of ``part`` of the run ``run_id``: the same on every rank."""
    digest = hashlib.sha256(f"otel-training/{run_id}/{part}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


class TraceSegments:
    """The run's and the segments' shared parents, and this rank's open segment span.

    Args:
        tracer: The pipeline's tracer.
        run_id: The run id (``dl.run.id``), shared by all ranks.
        iterations_per_segment: N, iterations per segment (>= 1).
        sampler: The pipeline's sampler; its decision on each derived trace id is the
            ``sampled`` flag of the shared parent (the same on every rank).
        segment_spans: Whether this rank records its ``megatron.train.segment`` spans (span
            group ``job``); without them, phases start directly under the segment's shared
            parent, in the segment's trace still.
        open_spans: The pipeline's open spans (:class:`otel_training.open_spans.OpenSpans`
            ``.spans``), where segment spans are registered while open.

    Thread-safe: phases on several threads may start segments; one lock guards the switch.
    Never raises from :meth:`context_for` or :meth:`close`.
    """

    def __init__(
        self,
        tracer: trace_api.Tracer,
        run_id: str,
        iterations_per_segment: int,
        sampler: sampling_sdk.Sampler,
        *,
        segment_spans: bool = True,
        open_spans: dict | None = None,
    ) -> None:
        self._tracer = tracer
        self._segment_spans = segment_spans
        self._open_spans = {} if open_spans is None else open_spans
        self._run_id = run_id
        self._n = max(1, int(iterations_per_segment))
        self._sampler = sampler
        self._lock = threading.Lock()
        self._segment: int | None = None
        self._span: trace_api.Span | None = None
        self._context: context_api.Context | None = None
        self._previous: SpanContext | None = None
        self.run_span: trace_api.Span | None = None
        self._run = _runs  # the run of this process the state below belongs to
        self._scope = "" if _runs <= 1 else f"run{_runs}/"  # the prefix of the k-th run's parts
        self._run_context = self._remote(f"{self._scope}run")

    def segment_of(self, iteration: int) -> int:
        """The segment of ``iteration`` (iterations count from 1)."""
        return max(0, int(iteration) - 1) // self._n

    def _remote(self, part: str) -> context_api.Context:
        trace_id, span_id = derived_ids(self._run_id, part)
        sampled = self._sampler.should_sample(None, trace_id, part).decision.is_sampled()
        flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
        parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
        return trace_api.set_span_in_context(NonRecordingSpan(parent))

    def run_context(self) -> context_api.Context:
        """The context a rank's run span starts in: the run trace's shared parent (of this
        process's k-th run, every rank's k-th run alike)."""
        if self._run != _runs:
            with self._lock:
                self._follow_run()
        return self._run_context

    def _follow_run(self) -> None:
        """A new run began: end what the run before it left open and forget its segments."""
        if self._run == _runs:
            return
        self._end_open()
        self._previous = None
        self.run_span = None
        self._run = runs = _runs
        self._scope = "" if runs <= 1 else f"run{runs}/"
        self._run_context = self._remote(f"{self._scope}run")

    def end_run(self, end_ns: int | None = None) -> None:
        """The run ended (at ``end_ns``, ns on the process clock; default now): ends its open
        segment span then; the next segment links to nothing of it."""
        with self._lock:
            self._end_open(end_ns)
            self._previous = None
            self.run_span = None

    def is_run_level(self, parent: trace_api.Span) -> bool:
        """True when a phase under ``parent`` belongs to the run itself (its parent is this
        rank's run span, or there is no span)."""
        if parent is self.run_span or parent is trace_api.INVALID_SPAN:  # the common cases
            return True
        return not parent.get_span_context().is_valid

    def context_for(self, iteration: int, now_ns: int | None = None) -> context_api.Context | None:
        """The context holding this rank's segment span of ``iteration`` (started at
        ``now_ns``, ns on the process clock, default now, if it is a new segment, ending the
        previous one then: the start of the phase that opens it); ``None`` when it cannot
        start."""
        segment = self.segment_of(iteration)
        context = self._context
        if segment == self._segment and context is not None and self._run == _runs:
            return context
        with self._lock:
            self._follow_run()
            if segment != self._segment or self._context is None:
                self._open(segment, now_ns)
            return self._context

    def _open(self, segment: int, now_ns: int | None = None) -> None:
        now = clock.now_ns() if now_ns is None else now_ns
        self._end_open(now)
        part = f"{self._scope}segment/{segment}"
        if not self._segment_spans:
            self._segment, self._context = segment, self._remote(part)
            return
        links = []
        if self._previous is not None:
            links.append(Link(self._previous))
        if self.run_span is not None:
            links.append(Link(self.run_span.get_span_context()))
        try:
            span = self._tracer.start_span(
                MEGATRON_TRAIN_SEGMENT,
                context=self._remote(part),
                links=links,
                attributes={OTEL_TRAINING_TRACE_SEGMENT: segment},
                start_time=now,
            )
        except Exception:
            self._segment, self._span, self._context = segment, None, None
            return
        self._segment, self._span = segment, span
        self._open_spans[span] = True
        self._context = trace_api.set_span_in_context(span)

    def _end_open(self, now: int | None = None) -> None:
        span = self._span
        if span is None:
            self._context = self._segment = None
            return
        self._previous = span.get_span_context()
        self._open_spans.pop(span, None)
        try:
            if getattr(span, "end_time", None) is None:
                span.end(end_time=clock.now_ns() if now is None else now)
        except Exception:
            pass
        self._span = self._context = None
        self._segment = None

    def close(self, *_: Any) -> None:
        """Ends the open segment span (at the end of the run, and before shutdown)."""
        with self._lock:
            self._end_open()
