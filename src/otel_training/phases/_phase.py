"""``Phase``: one phase of training, with one lifecycle whatever its span group exports.

A phase is a context manager, a decorator and a handle of :class:`otel_training.SpanRecorder`
(:mod:`otel_training.spans` makes them through :func:`make`). Its lifecycle is written once,
in :class:`Phase`: ``start`` (``with`` makes it current), ``error``, ``stop``, and
``record_metrics``. Each start and stop:

- feeds the health ledger (:data:`otel_training.health.ledger.LEDGER`) when the phase is one of
  its phases, with whether the phase completed;
- records one point of ``megatron.training.step_duration_ms`` for an iteration made with
  ``record_step_duration=True`` that completed;
- opens and closes what the span group exports, through the hooks of the subclass:
  :class:`SpanPhase` a span (made current inside ``with``, routed to its trace),
  :class:`NvtxPhase` an NVTX range (a group mirrored to NVTX only), :class:`LedgerPhase`
  nothing (a disabled group). :data:`NOOP_PHASE`, the shared phase of a disabled group that has
  nothing to count, is a phase whose lifecycle has nothing left to do.

So a disabled group changes what is exported, never how a call behaves: what a call returns,
raises (nothing), warns and gives the health ledger is the same in every configuration.

**Completed or not.** A phase completed when it stopped without an exception having left it
(``with``, a decorated call) or been given to :meth:`Phase.error`, and without its pipeline
having shut down while it was open (its span then ended as truncated, at exit or on SIGTERM).
Any exception counts, ``SystemExit(0)`` and ``GeneratorExit`` included; only whether the span
is an error depends on the exception (:mod:`otel_training.phases._exceptions`). A phase that did
not complete records no step duration (a collective that timed out after 30 minutes is not a
30-minute step) and completes no step or checkpoint in the ledger.

**Time.** Spans start and end at readings of the process clock (:func:`otel_training.clock.now_ns`:
one wall-time anchor plus a monotonic clock), and the step duration is the difference of the
same two readings: a wall-clock step (NTP) distorts neither, and neither is ever negative.

Every method runs on the calling thread and never raises.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from otel_training import clock, configuration
from otel_training.health.ledger import (
    ASYNC_SAVE,
    CHECKPOINT_LOAD,
    CHECKPOINT_SAVE,
    ITERATION,
    LEDGER,
    NO_PHASE,
    PHASE_OF_SPAN,
    RUN_PHASE,
)
from otel_training.metrics import device_reads, instruments
from otel_training.phases import _state
from otel_training.phases._deferred import DEFERRED_ENDS
from otel_training.phases._exceptions import is_error, record_exception
from otel_training.phases._state import PhaseState, bound_state, configured, reset_first_iteration
from otel_training.phases._warnings import warn_once
from otel_training.semconv.attributes import MEGATRON_ITERATION
from otel_training.trace.processors.nvtx import end_ranges_now
from otel_training.trace.segments import KEPT, TraceSegments, run_begins
from otel_training.trace.shape import JOB_LEVEL_GROUPS
from otel_training.trace.span_values import DEFERRED, PRIMITIVES, attribute_value, text

__all__ = ["NOOP_PHASE", "RUN", "LedgerPhase", "NvtxPhase", "Phase", "SpanPhase", "fine", "make"]

# record_metrics keyword -> the metric name, used as the span attribute key (the instruments'
# own table: one definition).
METRIC_KEYS: Mapping[str, str] = {key: spec[0] for key, spec in instruments._SPECS.items()}

#: The role of a phase: the run (its span starts in the run trace and closes the segments).
RUN = "run"
#: Span groups whose phases are never routed to a segment's traces (a load at startup carries
#: the iteration it resumes, but belongs to the run).
_NOT_ROUTED = frozenset({"load_checkpoint"})

# The stages of a phase. _INERT: the shared no-op, which has nothing to start or stop.
_MADE, _OPEN, _ENDED, _INERT = 0, 1, 2, 3
# The ledger's phases whose completion is progress: a step, a checkpoint saved or loaded.
_COMPLETES = frozenset({ITERATION, CHECKPOINT_SAVE, ASYNC_SAVE, CHECKPOINT_LOAD})

_now_ns = clock.now_ns
_attach = context_api.attach
_detach = context_api.detach
_get_current = context_api.get_current
_get_current_span = trace_api.get_current_span
_set_span_in_context = trace_api.set_span_in_context
_INVALID_SPAN = trace_api.INVALID_SPAN


class Phase:
    """One phase of training: a context manager, a decorator, or a handle of
    :class:`otel_training.SpanRecorder`.

    Yielded by ``with``; its methods add attributes, events and metrics to what the phase
    exports (a span in an enabled group; nothing in a disabled one). The lifecycle and its
    effects other than export are the same for every phase (see the module docstring). Every
    method runs on the calling thread and never raises: a value that cannot be stored is
    stored as its ``str()``.
    """

    __slots__ = (
        "_kind",
        "_progress",
        "_record_step_duration",
        "_watch",
        "_extra",
        "_exports",
        "_state",
        "_outer",
        "_stage",
        "_failed",
        "_target",
        "_ledger_token",
        "_started_ns",
        "_generation",
    )

    #: Whether the class exports something: then its hooks ``_open`` and ``_close`` run.
    _EXPORTS = False
    #: Whether the class's phases always have a start and an end time (a span's).
    _TIMED = False

    def __init__(
        self,
        kind: int = NO_PHASE,
        iteration: int | None = None,
        record_step_duration: bool = False,
        state: PhaseState | None = None,
        outer: Phase | None = None,
        target: Any = None,
    ) -> None:
        self._kind = kind  # the ledger's phase (otel_training.health.ledger), or NO_PHASE
        self._progress = iteration  # the iteration the ledger records when it completes
        self._record_step_duration = record_step_duration
        # Whether its completion matters beyond the ledger's phase time (a span, a step
        # duration, a step or checkpoint of the ledger): a shutdown meanwhile interrupts it.
        watch = self._watch = self._TIMED or record_step_duration or kind in _COMPLETES
        exports = self._exports = self._EXPORTS
        # Whether there is more to do than the ledger's transition (the disabled groups' common
        # case, kept to a few attribute reads).
        self._extra = watch or exports or outer is not None
        self._state = state  # None: the configured pipeline's, resolved when it starts
        self._outer = outer  # a phase started before and stopped after this one
        self._stage = _MADE
        self._failed = False
        self._target = target  # where an exporting class exports (NvtxPhase: domain, event)

    # the lifecycle: one start path, one stop path ------------------------------------------

    def _start(self, make_current: bool = True, parent: Phase | None = None) -> Phase:
        if self._stage:  # started, ended, or the inert no-op
            return self
        self._stage = _OPEN
        if self._extra:
            outer = self._outer
            if outer is not None:
                outer._start(make_current, parent)
                # The outer phase is the parent now: current inside ``with``, else given.
                parent = None if make_current else outer
            if self._watch:
                state = self._state
                if state is None:
                    state = self._state = configured()
                self._generation = state.generation
                if self._TIMED or self._record_step_duration:
                    self._started_ns = _now_ns()
            if self._exports:
                self._open(make_current, parent)
        if self._kind >= 0:
            self._ledger_token = LEDGER.enter(self._kind)
        return self

    #: ``with`` starts the phase and makes it current.
    __enter__ = _start

    def start(self, *, make_current: bool = False, parent: Phase | None = None) -> Phase:
        """Starts the phase (``with`` does this, making its span current); ``parent``: the
        phase whose span is the parent of this one's. Idempotent. Returns ``self``."""
        return self._start(make_current, parent)

    def __exit__(self, exc_type=None, exc=None, traceback=None) -> bool:
        if exc is not None:
            self.error(exc)
        if self._stage != _OPEN:
            if self._stage == _ENDED and self._exports:
                self._release()  # a with block ends around a phase stopped inside it
            return False
        self._stage = _ENDED
        failed = self._failed
        if self._extra:
            if self._watch:
                end_ns = _now_ns() if self._TIMED or self._record_step_duration else 0
                if self._state.generation != self._generation:
                    failed = True  # its pipeline shut down while it was open
                if self._exports and self._close(end_ns):
                    failed = True  # its span was ended as truncated by that shutdown
                if not failed and self._record_step_duration:
                    instruments.record_training_metrics(
                        self._state.meter, step_duration_ms=(end_ns - self._started_ns) / 1e6
                    )
            elif self._exports:
                self._close(0)
        if self._kind >= 0:
            LEDGER.exit(self._ledger_token, self._kind, self._progress, failed)
        if self._extra:
            outer = self._outer
            if outer is not None:
                outer.__exit__()
        return False

    def stop(self, attributes: Mapping[str, Any] | None = None) -> None:
        """Stops the phase (``with`` does this), after adding ``attributes``. Idempotent; a
        phase never started is not stopped."""
        if attributes and self._stage == _OPEN:
            self.set_attributes(attributes)
        self.__exit__()

    def error(self, exception: BaseException) -> None:
        """Records that ``exception`` ended the phase: it does not complete (no step
        duration, no completed step or checkpoint in the health ledger), and its span gets
        status ERROR, an ``exception`` event with type, message and stack trace, and
        ``error.type`` (``SystemExit(0)`` and ``GeneratorExit`` leave the status alone). Call
        before :meth:`stop`; after it, ignored."""
        if self._stage > _OPEN:
            return
        self._failed = True
        if is_error(exception):
            if self._exports:
                self._record_error(exception)
            if self._kind >= 0 or self._kind == RUN_PHASE:  # the record's "raised"
                LEDGER.raised()
        outer = self._outer
        if outer is not None:
            outer.error(exception)

    def __call__(self, function: Callable) -> Callable:
        """Decorates ``function``: each call runs inside a fresh phase like this one."""
        fresh = self._fresh()
        if fresh is None:
            return function

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with fresh():
                return function(*args, **kwargs)

        return wrapper

    # content ----------------------------------------------------------------------------

    @property
    def span(self) -> trace_api.Span:
        """The OpenTelemetry span, also after it ended (``INVALID_SPAN`` when its group
        exports no span, or before it started)."""
        return _INVALID_SPAN

    @property
    def is_recording(self) -> bool:
        """True while the phase's span records (started, not ended, group enabled)."""
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        """Sets one attribute (see :mod:`otel_training.trace.span_values` for the values taken).
        ``megatron.iteration`` (an int) is also the iteration the health ledger records when
        the phase completes, whatever its group: a checkpoint load's resume point, known only
        once the checkpoint is read."""
        if key == MEGATRON_ITERATION and type(value) is int:
            self._progress = value

    def set_attributes(self, attributes: Mapping[str, Any] | None = None, **more: Any) -> None:
        """Sets several attributes: those of ``attributes``, then the keyword ones."""
        try:
            merged = {**(attributes or {}), **more}
        except Exception:
            warn_once("set_attributes", "set_attributes takes a mapping", exc_info=False)
            return
        for key, value in merged.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Adds a span event named ``name`` now (device tensors are stored as strings)."""
        try:
            items = list((attributes or {}).items())
        except Exception:
            warn_once("add_event", "add_event takes a mapping of attributes", exc_info=False)
            return
        if self._exports and self._stage == _OPEN:
            self._add_event(name, items)

    def record_metrics(self, **values: Any) -> None:
        """Records Megatron-LM training metrics and sets them as span attributes.

        Takes the keywords of :func:`otel_training.record_training_metrics`
        (``loss=``, ``grad_norm=``...; ``None`` skipped) and records them on the meter of the
        pipeline (or recorder) the phase records into; each value is also set on the span
        under the metric's name (``megatron.training.loss``...), where NaN and infinity stay
        visible. An unknown keyword is dropped with one warning; the others are recorded.
        Never raises.
        """
        if not values.keys() <= METRIC_KEYS.keys():
            warn_once(
                "record_metrics",
                "record_metrics takes %s; ignoring %s",
                ", ".join(METRIC_KEYS),
                ", ".join(sorted(map(str, values.keys() - METRIC_KEYS.keys()))),
                exc_info=False,
            )
            values = {key: value for key, value in values.items() if key in METRIC_KEYS}
        state = self._state or configured()
        instruments.record_training_metrics(state.meter, **values)
        if self._kind == ITERATION and self._stage == _OPEN and self._progress is not None:
            LEDGER.training_logged(self._progress)  # the values of this very step
        for key, value in values.items():
            if value is not None:
                self.set_attribute(METRIC_KEYS[key], value)

    # what a subclass exports ------------------------------------------------------------------

    def _open(self, make_current: bool, parent: Phase | None) -> None:
        """Opens what the phase exports (a class that defines it exports); never raises."""

    def _close(self, end_ns: int) -> bool:
        """Closes what the phase exports at ``end_ns``; True when a shutdown had closed it
        already (the phase was interrupted). Never raises."""
        return False

    def _release(self) -> None:
        """Gives back what the phase holds for its ``with`` block (its span as the current
        one) once nothing opened after it holds more; never raises."""

    def _record_error(self, exception: BaseException) -> None:
        """Records an error on what the phase exports; never raises."""

    def _add_event(self, name: str, items: list[tuple[Any, Any]]) -> None:
        """Adds an event to what the phase exports, while open; never raises."""

    def _fresh(self) -> Callable[[], Phase] | None:
        """What makes a fresh phase like this one, for each call of a decorated function
        (``None``: nothing to do, the function is left as it is)."""
        if self._stage == _INERT:
            return None
        state = self._state
        if state is not None and state.follows_pipeline:
            state = None  # the pipeline configured when the function is called
        return functools.partial(
            type(self), self._kind, self._progress, self._record_step_duration, state
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} stage={self._stage}>"


class LedgerPhase(Phase):
    """The phase of a group that exports nothing (disabled), when there is still something
    to count: a phase of the health ledger, a step duration, or metrics for a recorder's own
    meter. The lifecycle of :class:`Phase`; one small object per call."""

    __slots__ = ()

    def __enter__(self) -> Phase:
        # Phase._start for a phase with nothing more to do than the ledger's transition (a
        # micro-batch, a layer: no step duration, no outer phase, nothing it watches).
        if self._extra:
            return self._start()
        if self._stage:
            return self
        self._stage = _OPEN
        if self._kind >= 0:
            self._ledger_token = LEDGER.enter(self._kind)
        return self

    def __exit__(self, exc_type=None, exc=None, traceback=None) -> bool:
        # Phase.__exit__ for what __enter__ above opened.
        if exc is not None or self._stage != _OPEN or self._extra:
            return Phase.__exit__(self, exc_type, exc, traceback)
        self._stage = _ENDED
        if self._kind >= 0:
            LEDGER.exit(self._ledger_token, self._kind, self._progress, self._failed)
        return False


class _NoOpPhase(Phase):
    """The phase of a disabled group that has nothing to count: its lifecycle has nothing to
    do (inert). One shared instance, :data:`NOOP_PHASE`."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self._stage = _INERT


#: The shared phase of disabled groups that are no phase of the health ledger.
NOOP_PHASE: Phase = _NoOpPhase()


class SpanPhase(Phase):
    """A phase of an enabled group: an OpenTelemetry span of the pipeline's tracer, started
    in its trace (:mod:`otel_training.trace.segments`), made current inside ``with``, ended when
    the phase stops (later, on a background thread, when an attribute waits for a device
    value)."""

    __slots__ = (
        "_name",
        "_group",
        "_attributes",
        "_iteration",
        "_role",
        "_span",
        "_token",
        "_context",
        "_pending",
    )

    _EXPORTS = True
    _TIMED = True

    def __init__(
        self,
        name: str,
        group: str,
        attributes: dict[str, Any] | None,
        record_step_duration: bool = False,
        state: PhaseState | None = None,
        *,
        iteration: int | None = None,
        role: str | None = None,
        outer: Phase | None = None,
        kind: int = NO_PHASE,
    ) -> None:
        Phase.__init__(self, kind, iteration, record_step_duration, state, outer)
        self._name = name
        self._group = group
        self._attributes = attributes
        # A phase with an iteration number may start in its segment's traces.
        self._iteration = iteration if group not in _NOT_ROUTED else None
        self._role = role
        self._span: trace_api.Span | None = None
        self._token = None
        self._pending: list | None = None

    @property
    def span(self) -> trace_api.Span:  # noqa: D102 - documented on Phase
        span = self._span
        return _INVALID_SPAN if span is None else span

    @property
    def is_recording(self) -> bool:  # noqa: D102 - documented on Phase
        span = self._span
        return span is not None and self._stage == _OPEN and span.is_recording()

    def set_attribute(self, key: str, value: Any) -> None:  # noqa: D102 - documented on Phase
        if key == MEGATRON_ITERATION and type(value) is int:
            self._progress = value
        span = self._span
        if span is None:
            if self._stage == _MADE:  # set when it starts
                self._attributes = {**(self._attributes or {}), key: value}
            return
        if span is _INVALID_SPAN or self._stage != _OPEN:
            return
        cleaned = attribute_value(value)
        if cleaned is DEFERRED:
            self._defer(key, value)
        else:
            span.set_attribute(key, cleaned)

    def _open(self, make_current: bool, parent: Phase | None) -> None:
        state = self._state
        group = self._group
        if group not in state.spans:
            self._span = _INVALID_SPAN  # made before configure(), for a group without spans
            return
        try:
            attributes = self._attributes
            if attributes:
                self._attributes = None
                for value in attributes.values():
                    if type(value) not in PRIMITIVES:
                        attributes = self._clean(attributes)
                        break
            context = links = None
            if parent is not None:
                context = _set_span_in_context(parent.span)
            segments = state.segments
            role = self._role
            if segments is not None:
                context, links = self._place(segments, context)
            if context is KEPT:  # the run span of its shard's keeper: the run trace's root
                span = segments.start_kept(self._name, links, attributes, self._started_ns)
            else:
                span = state.tracer.start_span(
                    self._name,
                    context,
                    links=links,
                    attributes=attributes,
                    start_time=self._started_ns,
                )
            self._span = span
            state.open[span] = True
            if role == RUN and segments is not None:
                segments.run_started(span)
            if make_current:
                context = self._context = _set_span_in_context(span)
                self._token = _attach(context)
        except Exception:
            warn_once("start", "could not start the span %s", self._name)
            self._span = _INVALID_SPAN

    def _place(self, segments: TraceSegments, context) -> tuple[Any, Any]:
        """(context, links) the span starts with (:mod:`otel_training.trace.segments`): the run
        trace for the run; for a phase with an iteration that would be a child of the run span
        (or of no span), this rank's segment span in the job trace (a job-level group) or its
        step trace; else under its parent, in its parent's trace while there is room."""
        parent = _get_current_span(context)
        role, iteration = self._role, self._iteration
        if (role is not None or iteration is not None) and segments.is_run_level(parent):
            if role == RUN:
                return segments.run_start(self._started_ns)
            job_level = self._group in JOB_LEVEL_GROUPS
            placed = segments.routed(iteration, job_level, self._started_ns)
            if placed[0] is not None:
                return placed
        return segments.nested(parent, context, self._started_ns)

    def _close(self, end_ns: int) -> bool:
        if self._token is not None:
            self._release()
        span = self._span
        if span is _INVALID_SPAN or span is None:
            return False
        state = self._state
        state.open.pop(span, None)
        if self._role == RUN and state.segments is not None:
            state.segments.end_run(end_ns)
        try:
            if getattr(span, "end_time", None) is not None:
                return True  # ended as truncated at shutdown
            pending = self._pending
            if pending:
                end_ranges_now(span.get_span_context().span_id)
                DEFERRED_ENDS.submit(span, end_ns, pending)
            else:
                span.end(end_time=end_ns)
        except Exception:
            warn_once("stop", "could not end the span %s", self._name)
        return False

    def _release(self) -> None:
        # Contexts are restored last in, first out: stopped inside its with block while a
        # phase opened after it is still current, it stays current until that one has ended.
        token = self._token
        if token is not None and _get_current() is self._context:
            self._token = None
            try:
                _detach(token)
            except Exception:
                pass

    def _record_error(self, exception: BaseException) -> None:
        span = self._span
        if span is None or span is _INVALID_SPAN or getattr(span, "end_time", None) is not None:
            return
        try:
            record_exception(span, exception)
        except Exception:
            warn_once("error", "could not record an exception on %s", self._name)

    def _add_event(self, name: str, items: list[tuple[Any, Any]]) -> None:
        span = self._span
        if span is None or span is _INVALID_SPAN:
            return
        cleaned = {}
        for key, value in items:
            value = attribute_value(value)
            cleaned[key] = text("<device tensor>") if value is DEFERRED else value
        try:
            span.add_event(name, cleaned, timestamp=_now_ns())
        except Exception:
            warn_once("event", "could not add an event to %s", self._name)

    def _fresh(self) -> Callable[[], Phase]:
        name, group, attributes = self._name, self._group, dict(self._attributes or {})
        record, iteration, role = self._record_step_duration, self._progress, self._role
        # The group is checked again at each call: the pipeline may have changed.
        return lambda: make(name, group, dict(attributes), record, iteration=iteration, role=role)

    def _clean(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        cleaned = {}
        for key, value in attributes.items():
            if value is None:
                continue
            value = attribute_value(value)
            if value is DEFERRED:
                self._defer(key, attributes[key])
            else:
                cleaned[key] = value
        return cleaned

    def _defer(self, key: str, value: Any) -> None:
        try:
            read = device_reads.start_device_read(value)
        except Exception:
            warn_once("device", "could not read a device value for %s", key)
            return
        if self._pending is None:
            self._pending = []
        self._pending.append((key, read))

    def __repr__(self) -> str:
        return f"<SpanPhase {self._name!r} group={self._group!r} stage={self._stage}>"


# NVTX has no status: an NVTX range's phase records errors in the lifecycle only.
_PUSHED = object()


class NvtxPhase(Phase):
    """A phase of a group mirrored to NVTX only: an NVTX range in the pipeline's domain, with
    the span name as message and the group's colour and category; no span, no JSON line. Inside
    ``with`` a push/pop range (nested on its thread); as a handle started by ``start()``, a
    start/end range (handles may stop out of order or on another thread)."""

    __slots__ = ("_range",)

    _EXPORTS = True

    def __enter__(self) -> Phase:
        # The lifecycle of Phase._start for a phase that watches nothing and has no outer
        # phase (a layer, a micro-batch): a push and the ledger's transition.
        if self._watch or self._outer is not None:
            return self._start()
        if self._stage:
            return self
        self._stage = _OPEN
        domain, event = self._target
        try:
            domain.push_range(event)
            self._range = _PUSHED
        except Exception:
            self._range = None
            warn_once("nvtx", "an NVTX range could not be opened")
        kind = self._kind
        if kind >= 0:
            self._ledger_token = LEDGER.enter(kind)
        return self

    def __exit__(self, exc_type=None, exc=None, traceback=None) -> bool:
        # Phase.__exit__ for what __enter__ above opened.
        if exc is not None or self._stage != _OPEN or self._watch or self._outer is not None:
            return Phase.__exit__(self, exc_type, exc, traceback)
        self._stage = _ENDED
        opened = self._range
        if opened is not None:
            try:
                if opened is _PUSHED:
                    self._target[0].pop_range()
                else:  # a handle's start/end range
                    self._target[0].end_range(opened)
            except Exception:
                warn_once("nvtx", "an NVTX range could not be closed")
        kind = self._kind
        if kind >= 0:
            LEDGER.exit(self._ledger_token, kind, self._progress, self._failed)
        return False

    def _open(self, make_current: bool, parent: Phase | None) -> None:
        domain, event = self._target
        self._range = None  # what it opened: _PUSHED, a range id, or nothing
        try:
            if make_current:
                domain.push_range(event)
                self._range = _PUSHED
            else:
                self._range = domain.start_range(event)
        except Exception:
            warn_once("nvtx", "an NVTX range could not be opened")

    def _close(self, end_ns: int) -> bool:
        opened = self._range
        if opened is None:
            return False
        try:
            if opened is _PUSHED:
                self._target[0].pop_range()
            else:
                self._target[0].end_range(opened)
        except Exception:
            warn_once("nvtx", "an NVTX range could not be closed")
        return False

    def _fresh(self) -> Callable[[], Phase]:
        state = self._state
        if state is not None and state.follows_pipeline:
            state = None
        return functools.partial(
            NvtxPhase,
            self._kind,
            self._progress,
            self._record_step_duration,
            state,
            None,
            self._target,
        )


def make(
    name: str,
    group: str,
    attributes: dict[str, Any] | None,
    record_step_duration: bool = False,
    *,
    iteration: int | None = None,
    role: str | None = None,
    outer: Phase | None = None,
    ledger: bool = True,
    asynchronous: bool = False,
) -> Phase:
    """The phase ``name`` of span group ``group``, for the state it records into now.

    A :class:`SpanPhase` when the group records spans (or when nothing is configured yet: it
    decides when it starts); an :class:`NvtxPhase` when it is mirrored to NVTX only and a tool
    is attached; else a :class:`LedgerPhase` when there is something to count, or the shared
    :data:`NOOP_PHASE` (a set lookup; nothing is created). ``iteration``: the iteration the
    phase belongs to (a checkpoint load's: the one it restores); ``ledger=False``: not a phase
    of the health ledger (the first-iteration wrapper, whose iteration is)."""
    kind = PHASE_OF_SPAN.get(name, NO_PHASE) if ledger else NO_PHASE
    if asynchronous and kind == CHECKPOINT_SAVE:
        kind = ASYNC_SAVE
    if role is not None:  # the run, whatever its group: every configuration numbers runs alike
        kind = RUN_PHASE  # an error that leaves it is noted in the ledger, spans or not
        run_begins()  # its trace segments are its own
        reset_first_iteration()  # its first iteration is a first iteration again
    state = bound_state.get()
    if state is None:
        telemetry = configuration._current
        if telemetry is None:  # not configured yet: decide when the phase starts
            return SpanPhase(
                name,
                group,
                attributes,
                record_step_duration,
                iteration=iteration,
                role=role,
                outer=outer,
                kind=kind,
            )
        state = _state._current
        if state.telemetry is not telemetry:
            state = _state._refresh(telemetry)
    if group in state.spans:
        return SpanPhase(
            name,
            group,
            attributes,
            record_step_duration,
            state,
            iteration=iteration,
            role=role,
            outer=outer,
            kind=kind,
        )
    if group in state.ranges:
        target = state.range_targets.get(name) or state.range_target(name, group)
        if target is not None:
            return NvtxPhase(kind, iteration, record_step_duration, state, outer, target)
    if kind == NO_PHASE and outer is None and not record_step_duration and state.follows_pipeline:
        return NOOP_PHASE
    return LedgerPhase(kind, iteration, record_step_duration, state, outer)


# -- fine-grained phases: one decision per phase name and pipeline ------------------------------

_new = object.__new__
# What fine() makes for a phase name, in a PhaseState's ``routes``: a span (through make), an
# NVTX range, the ledger alone, or nothing (the shared no-op).
_SPAN, _RANGE, _LEDGER, _NOTHING = 0, 1, 2, 3


def _route(state: PhaseState, name: str, group: str) -> tuple[int, int, Any]:
    """(what, ledger phase, NVTX target) of the fine-grained phase ``name`` of ``group`` in
    ``state``, as :func:`make` decides it for a phase without iteration, role, outer phase or
    step duration."""
    kind = PHASE_OF_SPAN.get(name, NO_PHASE)
    if group in state.spans or kind in _COMPLETES or not state.follows_pipeline:
        return (_SPAN, kind, None)
    if group in state.ranges:
        target = state.range_targets.get(name) or state.range_target(name, group)
        if target is not None:
            return (_RANGE, kind, target)
    return (_NOTHING if kind < 0 else _LEDGER, kind, None)


def fine(
    name: str, group: str, attributes: dict[str, Any] | None, key: str | None = None,
    value: Any = None,
) -> Phase:  # fmt: skip
    """:func:`make` for a fine-grained phase (a layer, a micro-batch, a transfer: no iteration,
    role, outer phase or step duration), with ``key: value`` added to ``attributes`` when
    ``value`` is not ``None``. The same phase as :func:`make` gives; for a group that exports
    no span, decided once per name and pipeline and made without building its attributes (a
    few stores)."""
    state = _state._current
    telemetry = configuration._current
    if telemetry is None or state.telemetry is not telemetry or _state.binding:
        return _made(name, group, attributes, key, value)
    route = state.routes.get(name)
    if route is None:
        route = state.routes[name] = _route(state, name, group)
    what = route[0]
    if what == _RANGE:
        phase = _new(NvtxPhase)
        phase._extra = phase._exports = True
        phase._target = route[2]
    elif what == _LEDGER:
        phase = _new(LedgerPhase)
        phase._extra = phase._exports = False
    elif what == _NOTHING:
        return NOOP_PHASE
    else:
        return _made(name, group, attributes, key, value)
    # Phase.__init__'s stores for a phase that watches nothing (see _route)
    phase._kind = route[1]
    phase._progress = None
    phase._record_step_duration = phase._watch = phase._failed = False
    phase._state = state
    phase._outer = None
    phase._stage = _MADE
    return phase


def _made(
    name: str, group: str, attributes: dict[str, Any] | None, key: str | None, value: Any
) -> Phase:
    """:func:`make`'s phase for what :func:`fine` does not make itself (a span, or a state it
    cannot decide for), ``key: value`` added to the attributes."""
    if value is not None:
        attributes = {**(attributes or {}), key: value}
    return make(name, group, attributes or None)
