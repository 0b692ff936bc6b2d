"""``Phase``: one phase of training as a span, its lifecycle, and the configured state it runs in.

A phase is a context manager, a decorator and a handle of ``SpanRecorder``
(:mod:`otel_training.spans` builds them). Its span is started on the configured pipeline's
tracer, routed to its trace segment when it carries an iteration number
(:mod:`otel_training.segments`), made current inside its ``with`` block, and ended on exit
(later, on a background thread, when an attribute waits for a device value). A phase of a
disabled span group is the shared :data:`NOOP_PHASE`; a phase of a group mirrored to NVTX only
is a cached :class:`NvtxPhase` (a push/pop range, no span). Every method runs on the calling
thread and never raises.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import Status, StatusCode

from otel_training import device_reads, instruments, setup
from otel_training.config import CUSTOM_SPAN_GROUP
from otel_training.health.ledger import LEDGER, NO_PHASE, PHASE_OF_SPAN
from otel_training.processors.nvtx import end_ranges_now
from otel_training.segments import TraceSegments
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)
from otel_training.span_values import DEFERRED, PRIMITIVES, attribute_value, host_value, text

__all__ = ["NOOP_PHASE", "LedgerPhase", "NvtxPhase", "Phase", "enabled_groups", "make"]

_logger = logging.getLogger("otel_training.spans")

# record_training_metrics keyword -> the metric name, used as the span attribute key.
_METRIC_KEYS = {
    "step_duration_ms": MEGATRON_TRAINING_STEP_DURATION_MS,
    "loss": MEGATRON_TRAINING_LOSS,
    "throughput_tflops": MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    "grad_norm": MEGATRON_TRAINING_GRAD_NORM,
    "skipped_iters": MEGATRON_TRAINING_SKIPPED_ITERS,
    "learning_rate": MEGATRON_TRAINING_LEARNING_RATE,
    "tokens_per_sec": MEGATRON_TRAINING_TOKENS_PER_SEC,
    "memory_allocated_gb": MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
}

#: The role of a phase: the run (its span starts in the run trace and closes the segments).
RUN = "run"
#: Span groups whose phases are never routed to a trace segment (a load at startup carries
#: the iteration it resumes, but belongs to the run).
_NOT_ROUTED = frozenset({"load_checkpoint"})


# -- the configured tracer, meter and groups, cached per Telemetry -----------------------


class _State:
    __slots__ = (
        "telemetry",
        "tracer",
        "meter",
        "groups",
        "nvtx_only",
        "nvtx",
        "segments",
        "open",
    )

    def __init__(self) -> None:
        self.telemetry: setup.Telemetry | None = None
        self.tracer: trace_api.Tracer | None = None
        self.meter = None
        self.groups: frozenset[str] = frozenset()
        self.nvtx_only: frozenset[str] = frozenset()
        self.nvtx: dict[str, NvtxPhase] | None = None  # None: no NVTX tool, NVTX-only is off
        self.segments: TraceSegments | None = None
        #: The pipeline's open spans (``OpenSpans.spans``): truncated at shutdown.
        self.open: dict = {}


_state = _State()
_state_lock = threading.Lock()


def _current_state() -> _State | None:
    """The state of the configured pipeline, or ``None`` when nothing is configured yet."""
    telemetry = setup._current
    if telemetry is None:
        return None
    state = _state
    if state.telemetry is not telemetry:
        state = _refresh(telemetry)
    return state


def configured_state() -> _State:
    """The state of the configured pipeline; configures from the environment first if needed."""
    state = _current_state()
    if state is None:
        setup.get_tracer()  # configures from the environment
        state = _current_state()
        assert state is not None
    return state


def _refresh(telemetry: setup.Telemetry) -> _State:
    global _state
    with _state_lock:
        if _state.telemetry is telemetry:
            return _state
        state = _State()
        state.telemetry = telemetry
        state.tracer = telemetry.tracer
        state.meter = telemetry.meter
        settings = telemetry.settings
        recording = not isinstance(telemetry.tracer_provider, trace_api.NoOpTracerProvider)
        state.groups = settings.span_groups if recording else frozenset()
        state.nvtx_only = settings.nvtx_only_groups & state.groups
        nvtx = telemetry.nvtx
        state.nvtx = {} if nvtx is not None and nvtx.active else None
        if telemetry.open_spans is not None:
            state.open = telemetry.open_spans.spans
        if recording:
            sampler = getattr(telemetry.tracer_provider, "sampler", None)
            if sampler is not None:
                state.segments = TraceSegments(
                    telemetry.tracer,
                    settings.identity.run_id or "run",
                    settings.trace_segment_iterations,
                    sampler,
                    segment_spans="job" in state.groups,
                    open_spans=state.open,
                )
                telemetry.before_shutdown.append(state.segments.close)
        _state = state
        return state


def enabled_groups() -> frozenset[str]:
    """The span groups that record spans in the configured pipeline (empty when telemetry is
    disabled or nothing is configured yet)."""
    state = _current_state()
    return frozenset() if state is None else state.groups


# -- phases ---------------------------------------------------------------------------------


class Phase:
    """One phase of training as a span: a context manager, a decorator, or a handle of
    :class:`otel_training.SpanRecorder`.

    Yielded by ``with``; its methods add attributes, events and metrics to the span. Every
    method runs on the calling thread and never raises: a value that cannot be stored is
    stored as its ``str()``.
    """

    __slots__ = (
        "_name",
        "_group",
        "_attributes",
        "_record_step_duration",
        "_state",
        "_span",
        "_token",
        "_started_ns",
        "_pending",
        "_done",
        "_iteration",
        "_role",
        "_outer",
        "_kind",
        "_progress",
        "_ledger_token",
        "_failed",
    )

    def __init__(
        self,
        name: str,
        group: str,
        attributes: dict[str, Any] | None,
        record_step_duration: bool = False,
        state: _State | None = None,
        *,
        iteration: int | None = None,
        role: str | None = None,
        outer: Phase | None = None,
        kind: int = NO_PHASE,
    ) -> None:
        self._name = name
        self._group = group
        self._attributes = attributes
        self._record_step_duration = record_step_duration
        self._state = state  # None: resolve (and configure) when started
        self._span: trace_api.Span | None = None
        self._token = None
        self._started_ns = 0
        self._pending: list | None = None
        self._done = False
        # A phase with an iteration number may start in its trace segment.
        self._iteration = iteration if group not in _NOT_ROUTED else None
        self._role = role
        self._outer = outer  # a phase started before and ended after this one
        # The health ledger's phase (otel_training.health.ledger), fed whatever the group.
        self._kind = kind
        self._progress = iteration
        self._ledger_token = -1
        self._failed = False

    # context manager ------------------------------------------------------------------------

    def __enter__(self) -> Phase:
        # The common case inline (this runs once per phase): configured, group enabled,
        # attributes that OpenTelemetry takes as they are.
        state = self._state
        if (
            state is None
            or self._span is not None
            or self._record_step_duration
            or self._outer is not None
            or self._role is not None
        ):
            return self.start(make_current=True)
        attributes = self._attributes
        if attributes:
            self._attributes = None
            for value in attributes.values():
                if type(value) not in PRIMITIVES:
                    attributes = self._clean(attributes)
                    break
        try:
            context = None
            if self._iteration is not None and state.segments is not None:
                context = self._segment_context(state.segments, None)
            span = state.tracer.start_span(self._name, context, attributes=attributes)
            self._span = span
            state.open[span] = True
            self._token = _attach(_set_span_in_context(span))
        except Exception:
            _warn_once("start", "could not start the span %s", self._name)
            self._span = trace_api.INVALID_SPAN
        if self._kind >= 0:
            self._ledger_token = LEDGER.enter(self._kind)
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc is not None:
            self._failed = True
            self.error(exc)
        span = self._span
        token = self._token
        if (
            token is None
            or self._pending is not None
            or self._record_step_duration
            or self._done
            or span is None
            or self._outer is not None
            or self._role is not None
        ):
            self.stop()
            return False
        self._done = True
        self._token = None
        if self._kind >= 0:
            LEDGER.exit(self._ledger_token, self._kind, self._progress, exc is not None)
        try:
            _detach(token)
            self._state.open.pop(span, None)
            if getattr(span, "end_time", None) is None:  # not ended by a truncating shutdown
                span.end()
        except Exception:
            _warn_once("stop", "could not end the span %s", self._name)
        return False

    def __call__(self, function: Callable) -> Callable:
        """Decorates ``function``: each call runs inside a fresh phase like this one."""
        name, group = self._name, self._group
        attributes = dict(self._attributes or {})
        record, iteration, role = self._record_step_duration, self._progress, self._role

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with make(name, group, dict(attributes), record, iteration=iteration, role=role):
                return function(*args, **kwargs)

        return wrapper

    # lifecycle --------------------------------------------------------------------------

    def start(self, *, make_current: bool = False, parent: Phase | None = None) -> Phase:
        """Starts the span (``with`` does this, making it current). Returns ``self``."""
        if self._span is not None:
            return self
        state = self._state
        if state is None:
            state = self._state = configured_state()
        outer = self._outer
        if outer is not None:
            outer.start(make_current=True, parent=parent)
            parent = None  # the outer phase is the parent now (it is current)
        self._started_ns = time.perf_counter_ns()
        if self._kind >= 0:
            self._ledger_token = LEDGER.enter(self._kind)
        if self._group not in state.groups:
            self._span = trace_api.INVALID_SPAN
            return self
        try:
            context = None
            if parent is not None and parent._span is not None:
                context = trace_api.set_span_in_context(parent._span)
            segments = state.segments
            if segments is not None:
                if self._role == RUN:
                    if segments.is_run_level(trace_api.get_current_span(context)):
                        context = segments.run_context()
                elif self._iteration is not None:
                    context = self._segment_context(segments, context)
            attributes = self._attributes
            if attributes:
                self._attributes = None
                attributes = self._clean(attributes)
            span = state.tracer.start_span(self._name, context, attributes=attributes)
            self._span = span
            state.open[span] = True
            if self._role == RUN and segments is not None:
                segments.run_span = span
            if make_current:
                self._token = context_api.attach(trace_api.set_span_in_context(span))
        except Exception:
            _warn_once("start", "could not start the span %s", self._name)
            self._span = trace_api.INVALID_SPAN
        return self

    def _segment_context(self, segments: TraceSegments, context) -> Any:
        """``context``, or this rank's segment span of the phase's iteration when the phase
        would otherwise be a child of the run span (or of no span)."""
        if segments.is_run_level(trace_api.get_current_span(context)):
            return segments.context_for(self._iteration) or context
        return context

    def stop(self, attributes: Mapping[str, Any] | None = None) -> None:
        """Ends the span (``with`` does this), after adding ``attributes``. Idempotent."""
        span = self._span
        if span is None or self._done:
            return
        if attributes:
            self.set_attributes(attributes)
        self._done = True
        token = self._token
        if token is not None:
            self._token = None
            try:
                context_api.detach(token)
            except Exception:
                pass
        if self._record_step_duration:
            duration_ms = (time.perf_counter_ns() - self._started_ns) / 1e6
            _record_step(self._state, duration_ms)
        if self._kind >= 0:
            LEDGER.exit(self._ledger_token, self._kind, self._progress, self._failed)
        if span is not trace_api.INVALID_SPAN:
            self._end(span)
        if self._outer is not None:
            self._outer.stop()

    def _end(self, span: trace_api.Span) -> None:
        state = self._state
        if state is not None:
            state.open.pop(span, None)
            if self._role == RUN and state.segments is not None:
                state.segments.close()
        pending = self._pending
        try:
            if pending:
                end_ns = time.time_ns()
                end_ranges_now(span.get_span_context().span_id)
                _deferred_ends.submit(span, end_ns, pending)
            elif getattr(span, "end_time", None) is None:
                span.end()
        except Exception:
            _warn_once("stop", "could not end the span %s", self._name)

    def error(self, exception: BaseException) -> None:
        """Records ``exception`` on the span: status ERROR, an ``exception`` event with its
        type, message and stack trace, and ``error.type``. ``SystemExit(0)`` and
        ``GeneratorExit`` are not errors."""
        self._failed = True  # whatever it was, the phase did not complete
        span = self._span
        if span is None or span is trace_api.INVALID_SPAN or self._done:
            return
        if not _is_error(exception):
            return
        try:
            kind = type(exception)
            qualified = kind.__qualname__
            if kind.__module__ not in ("builtins", None):
                qualified = f"{kind.__module__}.{qualified}"
            message = _exception_message(exception)
            # Status and type first: whatever happens to the event, the span is an error.
            span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {message}"))
            span.set_attribute(ERROR_TYPE, qualified)
            span.add_event(
                "exception",
                {
                    EXCEPTION_TYPE: qualified,
                    EXCEPTION_MESSAGE: message,
                    EXCEPTION_STACKTRACE: _stack_trace(exception),
                    EXCEPTION_ESCAPED: True,
                },
            )
        except Exception:
            _warn_once("error", "could not record an exception on %s", self._name)
        if self._outer is not None:
            self._outer.error(exception)

    # content ----------------------------------------------------------------------------

    @property
    def span(self) -> trace_api.Span:
        """The OpenTelemetry span, also after it ended (``INVALID_SPAN`` when its group is
        disabled or before it started)."""
        span = self._span
        return trace_api.INVALID_SPAN if span is None else span

    @property
    def is_recording(self) -> bool:
        """True while the span records (started, not ended, group enabled)."""
        span = self._span
        return span is not None and not self._done and span.is_recording()

    def set_attribute(self, key: str, value: Any) -> None:
        """Sets one attribute (see :mod:`otel_training.span_values` for the values taken)."""
        span = self._span
        if span is None:
            self._attributes = {**(self._attributes or {}), key: value}
            return
        if span is trace_api.INVALID_SPAN or self._done:
            return
        cleaned = attribute_value(value)
        if cleaned is DEFERRED:
            self._defer(key, value)
        else:
            span.set_attribute(key, cleaned)

    def set_attributes(self, attributes: Mapping[str, Any] | None = None, **more: Any) -> None:
        """Sets several attributes: those of ``attributes``, then the keyword ones."""
        for key, value in {**(attributes or {}), **more}.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Adds a span event named ``name`` now (device tensors are stored as strings)."""
        span = self._span
        if span is None or span is trace_api.INVALID_SPAN or self._done:
            return
        cleaned = {}
        for key, value in (attributes or {}).items():
            value = attribute_value(value)
            cleaned[key] = text("<device tensor>") if value is DEFERRED else value
        span.add_event(name, cleaned)

    def record_metrics(self, **values: Any) -> None:
        """Records Megatron-LM training metrics and sets them as span attributes.

        Takes the keywords of :func:`otel_training.record_training_metrics`
        (``loss=``, ``grad_norm=``...; ``None`` skipped) and records them on the configured
        meter; each value is also set on the span under the metric's name
        (``megatron.training.loss``...), where NaN and infinity stay visible. Never raises.
        """
        state = self._state or configured_state()
        try:
            instruments.record_training_metrics(state.meter, **values)
        except TypeError:
            _warn_once("record_metrics", "record_metrics takes %s", ", ".join(_METRIC_KEYS))
            return
        for key, value in values.items():
            if value is not None:
                self.set_attribute(_METRIC_KEYS[key], value)

    # internals --------------------------------------------------------------------------

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
            _warn_once("device", "could not read a device value for %s", key)
            return
        if self._pending is None:
            self._pending = []
        self._pending.append((key, read))


class _NoOpPhase(Phase):
    """The phase of a disabled group: every method does nothing. One shared instance."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("", CUSTOM_SPAN_GROUP, None)
        self._span = trace_api.INVALID_SPAN

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        return False

    def __call__(self, function: Callable) -> Callable:
        return function

    def start(self, *, make_current: bool = False, parent: Phase | None = None) -> Phase:
        return self

    def stop(self, attributes: Mapping[str, Any] | None = None) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def record_metrics(self, **values: Any) -> None:
        state = _current_state()
        if state is not None and values:
            instruments.record_training_metrics(state.meter, **values)


#: The shared phase of disabled groups.
NOOP_PHASE: Phase = _NoOpPhase()


class LedgerPhase(_NoOpPhase):
    """The phase of a disabled group that is a phase of the health ledger: no span, but its
    time and its completion still go to :data:`otel_training.health.ledger.LEDGER`. One small
    object per call (it carries the iteration)."""

    __slots__ = ()

    def __init__(self, kind: int, iteration: int | None = None) -> None:  # noqa: D107
        # Only what the ledger path reads: this runs once per phase of a disabled group.
        self._kind = kind
        self._progress = iteration
        self._ledger_token = -1
        self._failed = False
        self._span = trace_api.INVALID_SPAN
        self._done = False
        self._outer = None

    def __enter__(self) -> Phase:
        self._ledger_token = LEDGER.enter(self._kind)
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        LEDGER.exit(self._ledger_token, self._kind, self._progress, exc is not None)
        return False

    def __call__(self, function: Callable) -> Callable:
        kind, iteration = self._kind, self._progress

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with LedgerPhase(kind, iteration):
                return function(*args, **kwargs)

        return wrapper

    def start(self, *, make_current: bool = False, parent: Phase | None = None) -> Phase:
        if self._ledger_token < 0 and not self._done:
            self._ledger_token = LEDGER.enter(self._kind)
        return self

    def stop(self, attributes: Mapping[str, Any] | None = None) -> None:
        if not self._done:
            self._done = True
            LEDGER.exit(self._ledger_token, self._kind, self._progress, self._failed)

    def error(self, exception: BaseException) -> None:
        self._failed = True


class NvtxPhase(_NoOpPhase):
    """A phase of a group mirrored to NVTX only: a push/pop range in the pipeline's NVTX
    domain, with the span name as message and the group's colour and category; no span, no
    JSON line. One cached instance per name (``with`` blocks nest on a thread, as push/pop
    ranges do); as a decorator each call is a range."""

    __slots__ = ("_domain", "_event", "_tokens")

    def __init__(self, domain: Any, event: Any, kind: int = NO_PHASE) -> None:
        super().__init__()
        self._domain = domain
        self._event = event
        self._kind = kind
        self._tokens: list[int] = []  # the ledger's, one per open range of this name

    def __enter__(self) -> Phase:
        try:
            self._domain.push_range(self._event)
        except Exception:
            _warn_once("nvtx", "an NVTX push failed")
        if self._kind >= 0:
            self._tokens.append(LEDGER.enter(self._kind))
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if self._kind >= 0 and self._tokens:
            LEDGER.exit(self._tokens.pop(), self._kind, None, exc is not None)
        try:
            self._domain.pop_range()
        except Exception:
            _warn_once("nvtx", "an NVTX pop failed")
        return False

    def __call__(self, function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with self:
                return function(*args, **kwargs)

        return wrapper


def _nvtx_phase(state: _State, name: str, group: str, kind: int) -> Phase:
    cache = state.nvtx
    found = cache.get(name) if cache is not None else None
    if found is not None:
        return found
    telemetry = state.telemetry
    processor = telemetry.nvtx if telemetry is not None else None
    # No NVTX tool attached: an NVTX-only phase costs nothing (but the ledger's share).
    if cache is None or processor is None:
        return NOOP_PHASE if kind < 0 else LedgerPhase(kind)
    domain, event = processor.range_attributes(name, group)
    if domain is None:
        return NOOP_PHASE if kind < 0 else LedgerPhase(kind)
    found = cache[name] = NvtxPhase(domain, event, kind)
    return found


# The state of a SpanRecorder built on its own providers, while it makes a phase.
bound_state: contextvars.ContextVar[_State | None] = contextvars.ContextVar(
    "otel_training_bound_span_state", default=None
)


def state_for(
    tracer_provider: trace_api.TracerProvider | None,
    meter_provider: Any,
    groups: frozenset[str] | None,
) -> _State:
    """A state of its own for :class:`otel_training.SpanRecorder`: the given providers (the
    configured pipeline's where one is missing) and span groups (the pipeline's, else the
    environment's). No trace segments, no NVTX-only phases."""
    from otel_training import config
    from otel_training.pipeline import INSTRUMENTATION_NAME

    configured = None
    if tracer_provider is None or meter_provider is None:
        configured = configured_state()
    state = _State()
    if tracer_provider is None:
        state.tracer = configured.tracer
        recording = bool(configured.groups)
    else:
        state.tracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME)
        recording = not isinstance(tracer_provider, trace_api.NoOpTracerProvider)
    state.meter = (
        configured.meter
        if meter_provider is None
        else meter_provider.get_meter(INSTRUMENTATION_NAME)
    )
    if groups is None:
        telemetry = setup._current
        groups = (telemetry.settings if telemetry is not None else config.load()).span_groups
    state.groups = groups if recording else frozenset()
    return state


def make(
    name: str,
    group: str,
    attributes: dict[str, Any] | None,
    record_step_duration: bool = False,
    *,
    iteration: int | None = None,
    role: str | None = None,
    outer: Phase | None = None,
) -> Phase:
    """A phase; when its group is disabled (a set lookup), the shared no-op, or a
    :class:`LedgerPhase` for a phase of the health ledger; its cached NVTX range when the group
    is mirrored to NVTX only. ``iteration`` is the iteration a phase belongs to (a checkpoint
    load's: the one it restores)."""
    kind = PHASE_OF_SPAN.get(name, NO_PHASE)
    state = bound_state.get()
    if state is None:
        telemetry = setup._current
        if telemetry is None:  # not configured yet: decide when the phase starts
            return Phase(
                name,
                group,
                attributes,
                record_step_duration,
                iteration=iteration,
                role=role,
                outer=outer,
                kind=kind,
            )
        state = _state
        if state.telemetry is not telemetry:
            state = _refresh(telemetry)
    if group not in state.groups:
        if not record_step_duration and outer is None:
            return NOOP_PHASE if kind < 0 else LedgerPhase(kind, iteration)
    elif group in state.nvtx_only and not record_step_duration:
        return _nvtx_phase(state, name, group, kind)
    return Phase(
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


def _record_step(state: _State | None, duration_ms: float) -> None:
    if state is not None:
        instruments.record_training_metrics(state.meter, step_duration_ms=duration_ms)


def _exception_message(exception: BaseException) -> str:
    """``str(exception)``, or what says it could not be had: an exception whose ``__str__``
    raises (wrappers of CUDA or NCCL errors, lazy messages) is still recorded as itself."""
    try:
        message = str(exception)
        return message if type(message) is str else str.__str__(message)
    except Exception as error:
        return f"<str() of {type(exception).__name__} failed: {type(error).__name__}>"


def _stack_trace(exception: BaseException) -> str:
    """The formatted traceback with its chain (``raise ... from ...``); never raises."""
    try:
        return "".join(
            traceback.format_exception(type(exception), exception, exception.__traceback__)
        )
    except Exception:
        return f"{type(exception).__name__}: {_exception_message(exception)}"


def _is_error(exception: BaseException) -> bool:
    if isinstance(exception, GeneratorExit):
        return False
    if isinstance(exception, SystemExit):
        return exception.code not in (0, None)
    return True


_warned: set[str] = set()
_attach = context_api.attach
_detach = context_api.detach
_set_span_in_context = trace_api.set_span_in_context


def _warn_once(cause: str, message: str, *args: Any) -> None:
    if cause not in _warned:
        _warned.add(cause)
        _logger.warning(message, *args, exc_info=True)


# -- spans that wait for device values ----------------------------------------------------------


class _DeferredEnds:
    """Ends spans whose attributes wait for device values, on one daemon thread, in order.

    The training thread only queues (span, end time, pending reads); the thread waits for each
    device copy, sets the attributes and ends the span with its recorded end time. Flushed
    before the providers at ``force_flush``/``shutdown`` (``setup.add_flush_hook``).
    """

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
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="otel-training-span-end", daemon=True
                )
                self._thread.start()
            if not self._hooked:
                self._hooked = True
                setup.add_flush_hook(self.flush)
            self._queue.append((span, end_ns, pending))
            self._busy += 1
            self._ready.notify_all()

    def flush(self, timeout_s: float) -> bool:
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
                span.end(end_time=end_ns)
            except Exception:
                _warn_once("deferred", "could not end a deferred span")
            with self._lock:
                self._busy -= 1
                self._ready.notify_all()


_deferred_ends = _DeferredEnds()


def _after_fork_in_child() -> None:
    global _state_lock
    _state_lock = threading.Lock()
    _deferred_ends._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
