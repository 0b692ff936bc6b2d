"""Traces a trace store accepts, at any world size, without communication: the phases' spans
routed to run, job and step traces (shape, formulas and ids: :mod:`otel_training.trace.shape`).

Where a span starts:

- **the run span** (``megatron.train``) of each rank: in the run trace, under its shard's shared
  span id, which every rank computes and the shard's keeper (its first rank that exports) takes
  as its own run span's: the trace's root. Its children outside iterations (startup, model and
  data-loader building, checkpoint loads) nest under it; so does a phase with no parent.
- **a job-level phase with an iteration number** (a checkpoint save, an evaluation) whose
  parent would be the run span or nothing: under this rank's ``megatron.train.segment`` span of
  the iteration's segment, in the segment's job trace (its shard), whose root is the keeper's
  segment span (with the shard's shared span id). The segment span starts with the first phase
  of its segment, links to the rank's previous segment span, to its run span and, in shard
  q > 0, to shard 0's root; it ends when the next segment starts, when the run ends, or at
  shutdown.
- **any other phase with an iteration number** (an iteration, the first-iteration wrapper, a
  forward-backward called outside an iteration) whose parent would be the run span or nothing:
  in this rank's step trace of the segment, rooted by a ``megatron.train.segment`` span of the
  rank's own (the trace's derived span id) that links to the rank's segment span and ends with
  the segment.
- **everything else** nests under its parent, in its parent's trace.

Every span started in one of these traces is counted against this rank's room there (one
atomic ``next()`` of a counter: no lock on the training thread): its share of a shared trace,
or the budget for its own step trace. An iteration that would not fit its step trace whole
starts the rank's next step trace; a span with no room in its parent's trace starts in this
rank's current step trace (of the open segment, or segment 0, when the parent is in the run
trace) under its root, linked to its real parent. So no trace exceeds the budget (but for a
budget of 1: a step trace then holds its root and one span), every trace has one root, and no
span names a parent in another trace.

Sampling is decided once per family (the run, a segment): every trace of a family has the
family's low 64 trace-id bits and its shared parents carry the family's ``sampled`` flag, so
``traceidratio``, its parent-based form and the always samplers keep or drop a segment's job
and step traces together, on every rank. With the group ``job`` off there are no run or
segment spans and no routing: a phase with no parent roots a trace of its own (SDK ids).

A process that runs more than once under one run id (a second ``fit`` in a notebook, a second
``training_run()``) gives its k-th run (k >= 2) the families ``run{k}/run`` and
``run{k}/segment/{s}``: each run has traces of its own, and ranks that run in step agree. Each
run starts with no segment open and links to nothing of the run before it. Span ids of the
spans themselves still come from each process's own generator, so ranks that seed ``random``
alike never collide. A process starts each derived root once, over all its pipelines: a
segment opened again, or a second ``configure()`` within a run, starts the segment span under
the root already started and its steps in a step trace of a new part.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk import trace as trace_sdk
from opentelemetry.sdk.trace import sampling as sampling_sdk
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

from otel_training import clock
from otel_training.semconv.attributes import OTEL_TRAINING_TRACE_SEGMENT
from otel_training.semconv.spans import MEGATRON_TRAIN_SEGMENT
from otel_training.trace.shape import TraceShape, derived_ids, member_ids

__all__ = ["TraceSegments", "derived_ids"]


# How many runs this process has begun (a forked child starts afresh).
_runs = 0


def run_begins() -> None:
    """Counts a run of this process (:func:`otel_training.training_run` calls this whether its
    span is recorded or not, so that every configuration numbers runs alike)."""
    global _runs
    _runs += 1


def _reset_runs() -> None:
    """Forgets the runs begun in this process and the roots it started (a forked child;
    tests)."""
    global _runs
    _runs = 0
    with _rooted_lock:
        _rooted.clear()


# The derived traces whose root this process started (trace ids, the newest
# :data:`_KEPT_ROOTS`), over all its pipelines: a second root with the same ids (a segment
# opened again, a second configure() within a run) would be a duplicate span in its trace.
_rooted: dict[int, None] = {}
_rooted_lock = threading.Lock()
_KEPT_ROOTS = 4096


def _claim_root(trace_id: int) -> bool:
    """Whether this process may start the root of ``trace_id`` (it has not yet); claims it."""
    with _rooted_lock:
        if trace_id in _rooted:
            return False
        _rooted[trace_id] = None
        while len(_rooted) > _KEPT_ROOTS:
            del _rooted[next(iter(_rooted))]
        return True


def _root_started(trace_id: int) -> bool:
    return trace_id in _rooted


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_runs)

#: The derived traces a rank keeps counting (the newest; a span started in an older one
#: joins it uncounted).
_KEPT_TRACES = 256
#: The segments whose counts a rank keeps: a phase of one of them after a later one opened
#: (an asynchronous save that ends late) goes on counting; of an older one, counts anew.
_KEPT_SEGMENTS = 64

_ROOT = context_api.Context()
#: The context :meth:`TraceSegments.run_start` gives the keeper of a run trace shard: start the
#: run span with :meth:`TraceSegments.start_kept`.
KEPT = context_api.Context()
_set_span_in_context = trace_api.set_span_in_context
_get_current_span = trace_api.get_current_span


class _Trace:
    """One derived trace as this rank fills it: ``take()`` counts a span (atomic under the
    GIL), which fits while the count is at most ``allowance``."""

    __slots__ = ("trace_id", "allowance", "family", "context", "used", "count", "root")

    def __init__(self, trace_id: int, allowance: int, family: _Family) -> None:
        self.trace_id = trace_id
        self.allowance = allowance
        self.family = family
        self.context: context_api.Context | None = None  # where a routed span starts in it
        self.used = 0  # the last count taken (read without a lock: an estimate)
        self.count = itertools.count(1)
        # The root span of a rank's own trace, which this rank exports: its spans' parent.
        self.root: trace_api.Span | None = None

    def take(self) -> int:
        used = self.used = next(self.count)
        return used


class _Family:
    """The traces of the run or of one segment: its shard of the shared trace and this rank's
    own traces (step traces), numbered from 0."""

    __slots__ = ("name", "index", "flags", "shard", "parent", "anchor", "part", "parts")

    def __init__(self, name: str, index: int, flags: TraceFlags) -> None:
        self.name = name
        self.index = index  # the segment (-1: the run)
        self.flags = flags
        self.shard: _Trace | None = None
        self.parent: SpanContext | None = None  # the shard's shared parent
        # This rank's span in the shard (segment or run span), else the shared parent: what
        # its own traces link to and name as their parent.
        self.anchor: SpanContext | None = None
        self.part: _Trace | None = None
        self.parts = 0


def _current_in(trace: _Trace, families: set) -> bool:
    """Whether ``trace`` is the shared or the current own trace of one of ``families``."""
    family = trace.family
    return family in families and (trace is family.shard or trace is family.part)


class TraceSegments:
    """Routes and counts one pipeline's phase spans (see the module docstring).

    Args:
        tracer: The pipeline's tracer.
        run_id: The run id (``dl.run.id``), shared by all ranks.
        shape: The trace shape (:meth:`otel_training.trace.shape.TraceShape.derive`).
        rank: This process's rank (``dl.rank``).
        sampler: The pipeline's sampler; its decision on each family is the ``sampled`` flag
            of the family's shared parents (the same on every rank).
        segment_spans: Whether this rank records its ``megatron.train.segment`` spans (span
            group ``job``).
        open_spans: The pipeline's open spans (:class:`otel_training.trace.open_spans.OpenSpans`
            ``.spans``), where segment spans are registered while open.

    Thread-safe: phases on several threads may start spans; a lock guards opening a segment or
    a trace, never the counting. No method raises.
    """

    def __init__(
        self,
        tracer: trace_api.Tracer,
        run_id: str,
        shape: TraceShape,
        rank: int,
        sampler: sampling_sdk.Sampler,
        *,
        segment_spans: bool = True,
        open_spans: dict | None = None,
        exports: Callable[[int], bool] | None = None,
    ) -> None:
        self._tracer = tracer
        self._segment_spans = segment_spans
        self._open_spans = {} if open_spans is None else open_spans
        self._run_id = run_id
        self.shape = shape
        self._rank = max(0, int(rank))
        self._n = shape.segment_iterations
        self._step_spans = max(1, shape.step_spans)
        self._sampler = sampler
        self._lock = threading.Lock()
        self._traces: dict[int, _Trace] = {}
        self._run_family: _Family | None = None
        self._families: dict[int, _Family] = {}  # the segments opened last, by number
        self._segment: _Family | None = None  # the open segment
        self._span: trace_api.Span | None = None  # its segment span
        self._previous: SpanContext | None = None
        self.run_span: trace_api.Span | None = None
        self._roots: dict[trace_api.Span, None] = {}  # open root spans of own traces
        self._run_context: context_api.Context | None = None  # the run span's, once started
        # Whether this rank keeps its shard of the run and job traces: it starts its run and
        # segment spans with the shard's shared ids, the root the other ranks' spans name.
        self._keeps_run = _keeper(shape.run, shape.world_size, self._rank, exports)
        self._keeps_job = _keeper(shape.job, shape.world_size, self._rank, exports)
        self._run = _runs  # the run of this process the state below belongs to
        self._scope = "" if _runs <= 1 else f"run{_runs}/"  # the prefix of the k-th run's parts
        self._run_family = self._family(f"{self._scope}run", -1, shape.run.shard_of(self._rank))

    # the families and their traces ------------------------------------------------------------

    def segment_of(self, iteration: int) -> int:
        """The segment of ``iteration`` (iterations count from 1)."""
        return max(0, int(iteration) - 1) // self._n

    def _family(self, name: str, index: int, shard: int) -> _Family:
        shards = self.shape.run if index < 0 else self.shape.job
        trace_id, span_id = member_ids(self._run_id, name, f"shard/{shard}")
        # As for a root span: an empty context (None would make a parent-based sampler follow
        # whatever span is current, the run span, say).
        decision = self._sampler.should_sample(_ROOT, trace_id, name).decision
        flags = TraceFlags(TraceFlags.SAMPLED if decision.is_sampled() else TraceFlags.DEFAULT)
        family = _Family(name, index, flags)
        family.parent = family.anchor = SpanContext(trace_id, span_id, True, flags)
        family.shard = self._register(trace_id, shards.allowance(self.shape.budget), family)
        family.shard.context = _set_span_in_context(NonRecordingSpan(family.parent))
        return family

    def _register(self, trace_id: int, allowance: int, family: _Family) -> _Trace:
        """A trace to count (under the lock, or before the object is shared). Beyond
        :data:`_KEPT_TRACES`, the oldest is forgotten, never one that new spans go to (the
        run's and the open segment's shared and current traces)."""
        traces = self._traces
        trace = traces[trace_id] = _Trace(trace_id, allowance, family)
        while len(traces) > _KEPT_TRACES:
            kept = {self._run_family, self._segment, family}
            oldest = next((k for k, t in traces.items() if not _current_in(t, kept)), None)
            if oldest is None:
                break
            del traces[oldest]
        return trace

    def _new_part(self, family: _Family, now_ns: int | None = None) -> _Trace:
        """This rank's next own trace of ``family`` (under the lock); its routed spans name the
        family's anchor (the segment span) as their parent, or a span id of its own."""
        while True:  # a part whose root this process started already is taken
            member = f"rank/{self._rank}/part/{family.parts}"
            family.parts += 1
            trace_id, span_id = member_ids(self._run_id, family.name, member)
            if not _root_started(trace_id):
                break
        part = self._register(trace_id, self.shape.budget, family)
        root = None
        if self._segment_spans and family.index >= 0:
            # Its root: a megatron.train.segment span of this rank with the part's own span
            # id, linked to the rank's segment span (the step trace's way to the job trace).
            root = self._start_root(
                MEGATRON_TRAIN_SEGMENT,
                SpanContext(trace_id, span_id, False, family.flags),
                [Link(family.anchor)],
                {OTEL_TRAINING_TRACE_SEGMENT: family.index},
                clock.now_ns() if now_ns is None else now_ns,
            )
        if root is not None:
            part.take()
            part.root = root
            part.context = _set_span_in_context(root)
        else:  # no span of its own to start (another tracer): the anchor, as a parent id
            anchor = family.anchor
            if anchor is not family.parent:
                span_id = anchor.span_id
            parent = SpanContext(trace_id, span_id, True, family.flags)
            part.context = _set_span_in_context(NonRecordingSpan(parent))
        family.part = part
        return part

    def _start_root(
        self,
        name: str,
        context: SpanContext,
        links: list[Link],
        attributes: dict[str, Any],
        start_ns: int,
        own: bool = True,
    ) -> trace_api.Span | None:
        """A root span with the derived ids of ``context`` (a shard's shared parent, a part's
        own span id), which no tracer call can give: made as the SDK's tracer makes a span,
        recorded when the family is sampled; the root of a rank's own trace (``own``) is
        registered as open and ends with its segment. None when the tracer is not the SDK's or
        is disabled, or when this process started that trace's root already (in this or an
        earlier pipeline): the caller then starts a span under the root instead."""
        tracer = self._tracer
        if not isinstance(tracer, trace_sdk.Tracer):
            return None
        enabled = getattr(tracer, "_is_enabled", None)
        try:
            if enabled is not None and not enabled():
                return None
        except Exception:
            return None
        if not _claim_root(context.trace_id):
            return None
        try:
            if not context.trace_flags.sampled:
                span = NonRecordingSpan(context)
            else:
                span = trace_sdk._Span(
                    name=name,
                    context=context,
                    parent=None,
                    sampler=tracer.sampler,
                    resource=tracer.resource,
                    attributes=attributes,
                    span_processor=tracer.span_processor,
                    links=links,
                    instrumentation_info=tracer.instrumentation_info,
                    limits=tracer._span_limits,
                    instrumentation_scope=tracer._instrumentation_scope,
                )
                span.start(start_time=start_ns)
        except Exception:
            return None
        if own:
            self._roots[span] = None
            self._open_spans[span] = True
        return span

    def _links(self, trace: _Trace, taken: int) -> list[Link] | None:
        """The link of the first span of a rank's own trace that has no root span of its own
        (another tracer's): to its span in the shared one."""
        if taken != 1 or trace is trace.family.shard or trace.root is not None:
            return None
        return [Link(trace.family.anchor)]

    def _overflow(
        self, family: _Family, parent: SpanContext, now_ns: int | None = None
    ) -> tuple[context_api.Context, list[Link] | None]:
        """A span for which its trace has no room: in this rank's current own trace of
        ``family`` (the next one when that is full), under that trace's root span, linked to
        its real ``parent``. The run's family has no own traces: its overflow goes to the open
        segment's (segment 0's when none is open yet)."""
        if family.index < 0 and self._segment_spans:
            segment = self._segment
            if segment is None or self._run != _runs:
                with self._lock:
                    self._follow_run()
                    segment = self._segment
                    if segment is None:
                        segment = self._open(0, now_ns)
            if segment is not None:
                family = segment
        part = family.part
        taken = 0 if part is None else part.take()
        if not 0 < taken <= part.allowance:
            with self._lock:
                while True:
                    part = family.part
                    new = part is None or part.used >= part.allowance
                    if new:
                        part = self._new_part(family, now_ns)
                    taken = part.take()
                    if taken <= part.allowance or new:  # at a budget of 1, after its root
                        break
        if part.root is not None:
            return part.context, [Link(parent)]
        context = _set_span_in_context(
            NonRecordingSpan(SpanContext(part.trace_id, parent.span_id, True, family.flags))
        )
        return context, self._links(part, taken)

    def _place(
        self,
        trace: _Trace,
        context: context_api.Context | None,
        parent: SpanContext,
        now_ns: int | None = None,
    ) -> tuple[context_api.Context | None, list[Link] | None]:
        taken = trace.take()
        if taken <= trace.allowance:
            return context, self._links(trace, taken)
        return self._overflow(trace.family, parent, now_ns)

    # the run ----------------------------------------------------------------------------------

    def run_start(
        self, now_ns: int | None = None
    ) -> tuple[context_api.Context | None, list[Link] | None]:
        """Where a rank's run span starts (counted): its run trace shard, under the shared
        parent (of this process's k-th run, every rank's k-th run alike), linked to shard 0
        when it is in another shard. For the shard's keeper the context is :data:`KEPT`:
        start the span with :meth:`start_kept`, the shard's root."""
        if self._run != _runs:
            with self._lock:
                self._follow_run()
        family = self._run_family
        context, links = self._place(family.shard, family.shard.context, family.parent, now_ns)
        if context is family.shard.context:
            if self.shape.run.shard_of(self._rank):
                links = [Link(self._shard0(family))]
            if self._keeps_run:
                context = KEPT
        return context, links

    def start_kept(
        self,
        name: str,
        links: list[Link] | None,
        attributes: dict[str, Any] | None,
        start_ns: int | None,
    ) -> trace_api.Span:
        """The keeper's run span: the root of its run trace shard, with the shard's shared
        ids (the parent every other rank's run span names). Falls back to a span under the
        shared parent when it cannot be made so."""
        family = self._run_family
        span = self._start_root(
            name,
            SpanContext(family.parent.trace_id, family.parent.span_id, False, family.flags),
            links or [],
            dict(attributes or {}),
            clock.now_ns() if start_ns is None else start_ns,
            own=False,
        )
        if span is None:
            span = self._tracer.start_span(
                name, family.shard.context, links=links, attributes=attributes, start_time=start_ns
            )
        return span

    def _shard0(self, family: _Family) -> SpanContext:
        trace_id, span_id = member_ids(self._run_id, family.name, "shard/0")
        return SpanContext(trace_id, span_id, True, family.flags)

    def run_started(self, span: trace_api.Span) -> None:
        """The rank's run span started: the run's own traces link to it."""
        self.run_span = span
        family = self._run_family
        try:
            context = span.get_span_context()
        except Exception:
            return
        if context.is_valid and context.trace_id == family.parent.trace_id:
            family.anchor = context
            self._run_context = _set_span_in_context(span)

    def _follow_run(self) -> None:
        """A new run began: end what the run before it left open and forget its segments."""
        if self._run == _runs:
            return
        self._end_open()
        self._previous = None
        self.run_span = self._run_context = None
        self._families.clear()
        self._run = runs = _runs
        self._scope = "" if runs <= 1 else f"run{runs}/"
        self._run_family = self._family(
            f"{self._scope}run", -1, self.shape.run.shard_of(self._rank)
        )

    def end_run(self, end_ns: int | None = None) -> None:
        """The run ended (at ``end_ns``, ns on the process clock; default now): ends its open
        segment span then; the next segment links to nothing of it."""
        with self._lock:
            self._end_open(end_ns)
            self._previous = None
            self.run_span = self._run_context = None

    def is_run_level(self, parent: trace_api.Span) -> bool:
        """True when a phase under ``parent`` belongs to the run itself (its parent is this
        rank's run span, or there is no span)."""
        if parent is self.run_span or parent is trace_api.INVALID_SPAN:  # the common cases
            return True
        return not parent.get_span_context().is_valid

    # where a phase starts ---------------------------------------------------------------------

    def routed(
        self, iteration: int, job_level: bool, now_ns: int | None = None
    ) -> tuple[context_api.Context | None, list[Link] | None]:
        """(context, links) of a run-level phase of ``iteration``: under this rank's segment
        span in the job trace (``job_level``), else in its step trace (the next one when the
        iteration would not fit whole). Opens the segment (its span starting at ``now_ns``, ns
        on the process clock, default now) if it is new; ``(None, None)`` when it cannot, or
        when there are no segment spans (the group ``job`` off: no routing)."""
        if not self._segment_spans:
            return None, None
        segment = self.segment_of(iteration)
        family = self._segment
        if family is None or family.index != segment or self._run != _runs:
            with self._lock:
                self._follow_run()
                family = self._segment
                if family is None or family.index != segment:
                    family = self._open(segment, now_ns)
            if family is None:
                return None, None
        if job_level:
            return self._place(family.shard, family.shard.context, family.anchor, now_ns)
        part = family.part
        if not self._room_for_iteration(part):
            with self._lock:
                part = family.part
                if not self._room_for_iteration(part):
                    part = self._new_part(family, now_ns)
        return self._place(part, part.context, family.anchor, now_ns)

    def _room_for_iteration(self, part: _Trace | None) -> bool:
        """Whether the step trace ``part`` takes one more whole iteration (an empty one always
        does): an iteration is not split across step traces when it fits in one."""
        return part is not None and (
            not part.used or part.used + self._step_spans <= part.allowance
        )

    def nested(
        self,
        parent_span: trace_api.Span,
        context: context_api.Context | None,
        now_ns: int | None = None,
    ) -> tuple[context_api.Context | None, list[Link] | None]:
        """(context, links) of a phase that nests under ``parent_span``, the current span of
        ``context``: its parent's trace while this rank has room there, else its own trace; a
        phase with no parent nests under this rank's run span, or without one is the root of
        a trace of its own (the SDK's ids, not counted). A root span this opens starts at
        ``now_ns`` (the phase's start; default now)."""
        parent = parent_span.get_span_context()
        if not parent.is_valid:
            if self._run != _runs:
                with self._lock:
                    self._follow_run()
            run = self._run_context
            if run is None:
                return context, None
            family = self._run_family
            return self._place(family.shard, run, family.anchor, now_ns)
        trace = self._traces.get(parent.trace_id)
        if trace is None:
            return context, None  # another tracer's trace, or one too old to count
        used = trace.used = next(trace.count)  # take(), inline: once per span
        if used <= trace.allowance:
            return context, None
        return self._overflow(trace.family, parent, now_ns)

    # the segments -------------------------------------------------------------------------------

    def _open(self, segment: int, now_ns: int | None = None) -> _Family | None:
        now = clock.now_ns() if now_ns is None else now_ns
        self._end_open(now)
        shard = self.shape.job.shard_of(self._rank)
        family = self._families.get(segment)  # a segment opened again: its counts go on
        if family is None:
            family = self._family(f"{self._scope}segment/{segment}", segment, shard)
            self._families[segment] = family
            while len(self._families) > _KEPT_SEGMENTS:
                del self._families[next(iter(self._families))]
        if not self._segment_spans:
            self._segment = family
            return family
        links = []
        if self._previous is not None:
            links.append(Link(self._previous))
        if self.run_span is not None:
            links.append(Link(self.run_span.get_span_context()))
        if shard:
            links.append(Link(self._shard0(family)))
        family.shard.take()
        attributes = {OTEL_TRAINING_TRACE_SEGMENT: segment}
        span = None
        if self._keeps_job:  # the job trace shard's root, with its shared ids
            parent = family.parent
            root = SpanContext(parent.trace_id, parent.span_id, False, family.flags)
            span = self._start_root(MEGATRON_TRAIN_SEGMENT, root, links, attributes, now, False)
        try:
            if span is None:
                span = self._tracer.start_span(
                    MEGATRON_TRAIN_SEGMENT,
                    context=family.shard.context,
                    links=links,
                    attributes=attributes,
                    start_time=now,
                )
        except Exception:
            self._segment = self._span = None
            return None
        self._span = span
        self._open_spans[span] = True
        family.anchor = span.get_span_context()
        family.shard.context = _set_span_in_context(span)
        self._segment = family
        return family

    def _end_open(self, now: int | None = None) -> None:
        """Ends the open segment span and the root spans of this rank's own traces (at
        ``now``, default now)."""
        span = self._span
        self._segment = self._span = None
        if now is None and (span is not None or self._roots):
            now = clock.now_ns()
        if span is not None:
            self._previous = span.get_span_context()
            _end(span, now, self._open_spans)
        roots, self._roots = self._roots, {}
        for root in roots:
            _end(root, now, self._open_spans)

    def close(self, *_: Any) -> None:
        """Ends the open segment span (at the end of the run, and before shutdown)."""
        with self._lock:
            self._end_open()


def _end(span: trace_api.Span, now: int, open_spans: dict) -> None:
    open_spans.pop(span, None)
    try:
        if getattr(span, "end_time", None) is None:
            span.end(end_time=now)
    except Exception:
        pass


def _keeper(shards: Any, world_size: int, rank: int, exports: Callable[[int], bool] | None) -> bool:
    """Whether ``rank`` keeps its shard of ``shards``: it is the shard's first rank that
    exports (every rank computes the same from the export policy, without communication)."""
    first = shards.shard_of(rank) * shards.ranks
    if exports is None:
        return rank == first
    for candidate in range(first, min(world_size, first + shards.ranks)):
        try:
            if exports(candidate):
                return rank == candidate
        except Exception:
            return rank == first
    return rank == first
