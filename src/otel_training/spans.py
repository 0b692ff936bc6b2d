"""Spans for the phases of training: context managers that also work as decorators.

Usage::

    import otel_training as ot

    with ot.training_run():
        with ot.startup():
            model, optimizer = build()
        for step in range(1, steps + 1):
            with ot.training_iteration(iteration=step, record_step_duration=True) as it:
                with ot.forward_backward(iteration=step):
                    loss = train_step(batch)
                with ot.optimizer_step(iteration=step):
                    optimizer.step()
                it.record_metrics(loss=loss.detach())    # a span attribute and a metric
            if step % 1000 == 0:
                with ot.checkpoint_save(path, iteration=step) as save:
                    torch.save(state, path)
                    save.set_attribute(MEGATRON_CHECKPOINT_SIZE, os.path.getsize(path))

Every phase is an OpenTelemetry span of the tracer that :func:`otel_training.configure` built
(``setup.get_tracer()``; the first phase configures from the environment if nothing was), named
after Megatron-LM (``megatron.train``, ``megatron.train.iteration``, ``megatron.checkpoint.save``
...: :mod:`otel_training.semconv.spans`), and made the current span inside its ``with`` block,
so nested phases are its children. ``configure()`` mirrors spans as NVTX ranges and JSON lines.

Span groups control the overhead (``OTEL_PYTHON_TRAINING_SPAN_GROUPS``): the default records
the run, startup, checkpoints and evaluations; ``per_step`` adds iterations; ``all`` adds
forward/backward, optimizer steps and data loading. A phase of a disabled group costs one set
lookup and returns a shared no-op object; nothing is created.

An exception that leaves a phase is recorded on its span (status ERROR, an ``exception`` event
with type, message and stack trace, and ``error.type``) and re-raised. ``SystemExit(0)`` and
``GeneratorExit`` are not errors.

Attribute values may be numbers, strings, booleans, sequences of those, numpy scalars or
one-element tensors: numpy scalars and CPU tensors become Python numbers. A tensor on an
asynchronous device (CUDA) is not read on the training thread: its value is copied to pinned
host memory with a CUDA event (no device synchronisation), and the span is ended with its own
end time by a background thread once the value is on the host (its NVTX range still closes when
the phase exits). Other values are stored as their ``str()``.

As a decorator (``@checkpoint_save(strategy="async")``), the group is checked at each call.
One exception: a decorator applied while telemetry is configured and the group is disabled
leaves the function undecorated.
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
from collections.abc import Callable, Iterable, Mapping
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

from otel_training import config, instruments, setup
from otel_training.config import CUSTOM_SPAN_GROUP, SPAN_GROUPS, span_groups_from_names
from otel_training.processors.nvtx import end_ranges_now
from otel_training.semconv.attributes import (
    MEGATRON_CHECKPOINT_PATH,
    MEGATRON_CHECKPOINT_STRATEGY,
    MEGATRON_CHECKPOINT_TYPE,
    MEGATRON_ITERATION,
)
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
from otel_training.semconv.spans import (
    MEGATRON_CHECKPOINT_LOAD,
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_EVALUATE,
    MEGATRON_STARTUP,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_DATA_LOADING,
    MEGATRON_TRAIN_FORWARD_BACKWARD,
    MEGATRON_TRAIN_ITERATION,
    MEGATRON_TRAIN_OPTIMIZER_STEP,
    SPANS,
)

__all__ = [
    "NOOP_PHASE",
    "Phase",
    "SpanRecorder",
    "checkpoint_load",
    "checkpoint_save",
    "data_loading",
    "enabled_groups",
    "evaluation",
    "forward_backward",
    "optimizer_step",
    "phase",
    "startup",
    "training_iteration",
    "training_run",
]

_logger = logging.getLogger(__name__)

#: Longest string stored for a value that is not a number, string or boolean.
MAX_VALUE_LENGTH = 1024

_PRIMITIVES = (str, bool, int, float)

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


# -- the configured tracer, meter and groups, cached per Telemetry -----------------------


class _State:
    __slots__ = ("telemetry", "tracer", "meter", "groups")

    def __init__(self) -> None:
        self.telemetry: setup.Telemetry | None = None
        self.tracer: trace_api.Tracer | None = None
        self.meter = None
        self.groups: frozenset[str] = frozenset()


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


def _configured_state() -> _State:
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
        recording = not isinstance(telemetry.tracer_provider, trace_api.NoOpTracerProvider)
        state.groups = telemetry.settings.span_groups if recording else frozenset()
        _state = state
        return state


def enabled_groups() -> frozenset[str]:
    """The span groups that record spans in the configured pipeline (empty when telemetry is
    disabled or nothing is configured yet)."""
    state = _current_state()
    return frozenset() if state is None else state.groups


# -- attribute values ------------------------------------------------------------------------


def _attribute_value(value: Any) -> Any:
    """A value OpenTelemetry accepts, or ``_DEFERRED`` for a device tensor. Never raises."""
    kind = type(value)
    if kind in _PRIMITIVES:
        return value
    try:
        if isinstance(value, (list, tuple)):
            items = [_attribute_value(v) for v in value]
            if all(type(v) in _PRIMITIVES for v in items) and len({type(v) for v in items}) <= 1:
                return tuple(items)
            return _text(value)
        device = instruments._device_type(value)
        if device not in (None, "cpu"):
            return _DEFERRED
        number = _host_number(value)
        if number is not None:
            return number
    except Exception:
        pass
    return _text(value)


def _host_number(value: Any) -> bool | int | float | None:
    """The Python number in a host-side numpy scalar or one-element tensor, else ``None``."""
    if isinstance(value, (bool, int, float)):
        return value
    item = getattr(value, "item", None)
    if not callable(item):
        return None
    numel = getattr(value, "numel", None)
    size = numel() if callable(numel) else getattr(value, "size", 1)
    if size != 1:
        return None
    number = item()
    return number if isinstance(number, (bool, int, float)) else None


def _text(value: Any) -> str:
    try:
        text = str(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= MAX_VALUE_LENGTH else text[: MAX_VALUE_LENGTH - 3] + "..."


_DEFERRED = object()


# -- phases ---------------------------------------------------------------------------------


class Phase:
    """One phase of training as a span: a context manager, a decorator, or a handle of
    :class:`SpanRecorder`.

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
    )

    def __init__(
        self,
        name: str,
        group: str,
        attributes: dict[str, Any] | None,
        record_step_duration: bool = False,
        state: _State | None = None,
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

    # context manager ------------------------------------------------------------------------

    def __enter__(self) -> Phase:
        # The common case inline (this runs once per phase): configured, group enabled,
        # attributes that OpenTelemetry takes as they are.
        state = self._state
        if state is None or self._span is not None or self._record_step_duration:
            return self.start(make_current=True)
        attributes = self._attributes
        if attributes:
            self._attributes = None
            for value in attributes.values():
                if type(value) not in _PRIMITIVES:
                    attributes = self._clean(attributes)
                    break
        try:
            span = state.tracer.start_span(self._name, None, attributes=attributes)
            self._span = span
            self._token = _attach(_set_span_in_context(span))
        except Exception:
            _warn_once("start", "could not start the span %s", self._name)
            self._span = trace_api.INVALID_SPAN
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc is not None:
            self.error(exc)
        span = self._span
        token = self._token
        if (
            token is None
            or self._pending is not None
            or self._record_step_duration
            or self._done
            or span is None
        ):
            self.stop()
            return False
        self._done = True
        self._token = None
        try:
            _detach(token)
            if getattr(span, "end_time", None) is None:  # not ended by a truncating shutdown
                span.end()
        except Exception:
            _warn_once("stop", "could not end the span %s", self._name)
        return False

    def __call__(self, function: Callable) -> Callable:
        """Decorates ``function``: each call runs inside a fresh phase like this one."""
        name, group = self._name, self._group
        attributes = dict(self._attributes or {})
        record = self._record_step_duration

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            with _make(name, group, dict(attributes), record):
                return function(*args, **kwargs)

        return wrapper

    # lifecycle --------------------------------------------------------------------------

    def start(self, *, make_current: bool = False, parent: Phase | None = None) -> Phase:
        """Starts the span (``with`` does this, making it current). Returns ``self``."""
        if self._span is not None:
            return self
        state = self._state
        if state is None:
            state = self._state = _configured_state()
        self._started_ns = time.perf_counter_ns()
        if self._group not in state.groups:
            self._span = trace_api.INVALID_SPAN
            return self
        try:
            context = None
            if parent is not None and parent._span is not None:
                context = trace_api.set_span_in_context(parent._span)
            attributes = self._attributes
            if attributes:
                self._attributes = None
                attributes = self._clean(attributes)
            span = state.tracer.start_span(self._name, context, attributes=attributes)
            self._span = span
            if make_current:
                self._token = context_api.attach(trace_api.set_span_in_context(span))
        except Exception:
            _warn_once("start", "could not start the span %s", self._name)
            self._span = trace_api.INVALID_SPAN
        return self

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
        if span is trace_api.INVALID_SPAN:
            return
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
        """Sets one attribute (see the module docstring for the values accepted)."""
        span = self._span
        if span is None:
            self._attributes = {**(self._attributes or {}), key: value}
            return
        if span is trace_api.INVALID_SPAN or self._done:
            return
        cleaned = _attribute_value(value)
        if cleaned is _DEFERRED:
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
            value = _attribute_value(value)
            cleaned[key] = _text("<device tensor>") if value is _DEFERRED else value
        span.add_event(name, cleaned)

    def record_metrics(self, **values: Any) -> None:
        """Records Megatron-LM training metrics and sets them as span attributes.

        Takes the keywords of :func:`otel_training.record_training_metrics`
        (``loss=``, ``grad_norm=``...; ``None`` skipped) and records them on the configured
        meter; each value is also set on the span under the metric's name
        (``megatron.training.loss``...), where NaN and infinity stay visible. Never raises.
        """
        state = self._state or _configured_state()
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
            value = _attribute_value(value)
            if value is _DEFERRED:
                self._defer(key, attributes[key])
            else:
                cleaned[key] = value
        return cleaned

    def _defer(self, key: str, value: Any) -> None:
        try:
            read = instruments._start_device_read(value)
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


# The state of a SpanRecorder built on its own providers, while it makes a phase.
_bound_state: contextvars.ContextVar[_State | None] = contextvars.ContextVar(
    "otel_training_bound_span_state", default=None
)


def _make(
    name: str, group: str, attributes: dict[str, Any] | None, record_step_duration: bool = False
) -> Phase:
    """A phase, or the shared no-op when its group is disabled (a set lookup)."""
    state = _bound_state.get()
    if state is None:
        telemetry = setup._current
        if telemetry is None:  # not configured yet: decide when the phase starts
            return Phase(name, group, attributes, record_step_duration)
        state = _state
        if state.telemetry is not telemetry:
            state = _refresh(telemetry)
    if group not in state.groups and not record_step_duration:
        return NOOP_PHASE
    return Phase(name, group, attributes, record_step_duration, state)


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


# -- the public phases ----------------------------------------------------------------------


def training_run(**attributes: Any) -> Phase:
    """The whole training run of this rank: span ``megatron.train`` (group ``run``).

    An exception that leaves the run is recorded on the span (status ERROR, an ``exception``
    event with the stack trace, ``error.type``) before it propagates.
    """
    return _make(MEGATRON_TRAIN, "run", attributes or None)


def startup(**attributes: Any) -> Phase:
    """Setting up before the first iteration: span ``megatron.startup`` (group ``startup``)."""
    return _make(MEGATRON_STARTUP, "startup", attributes or None)


def training_iteration(
    iteration: int | None = None, *, record_step_duration: bool = False, **attributes: Any
) -> Phase:
    """One training iteration (optimizer step): span ``megatron.train.iteration`` (group
    ``iteration``, on in the ``per_step`` and ``all`` presets).

    Args:
        iteration: The iteration number (attribute ``megatron.iteration``).
        record_step_duration: Also record the phase's wall time, in milliseconds, as one point
            of ``megatron.training.step_duration_ms`` on the configured meter (one point per
            optimizer step), whether or not the iteration span is recorded.
        **attributes: More span attributes.
    """
    if iteration is not None:
        attributes[MEGATRON_ITERATION] = iteration
    return _make(MEGATRON_TRAIN_ITERATION, "iteration", attributes, record_step_duration)


def forward_backward(iteration: int | None = None, **attributes: Any) -> Phase:
    """The forward and backward passes: span ``megatron.train.forward_backward`` (group
    ``forward_backward``, on in the ``all`` preset)."""
    if iteration is not None:
        attributes[MEGATRON_ITERATION] = iteration
    return _make(MEGATRON_TRAIN_FORWARD_BACKWARD, "forward_backward", attributes or None)


def optimizer_step(iteration: int | None = None, **attributes: Any) -> Phase:
    """The optimizer update: span ``megatron.train.optimizer_step`` (group ``optimizer``, on
    in the ``all`` preset)."""
    if iteration is not None:
        attributes[MEGATRON_ITERATION] = iteration
    return _make(MEGATRON_TRAIN_OPTIMIZER_STEP, "optimizer", attributes or None)


def data_loading(iteration: int | None = None, **attributes: Any) -> Phase:
    """Fetching the next batch: span ``megatron.train.data_loading`` (group ``data_loading``,
    on in the ``all`` preset)."""
    if iteration is not None:
        attributes[MEGATRON_ITERATION] = iteration
    return _make(MEGATRON_TRAIN_DATA_LOADING, "data_loading", attributes or None)


def checkpoint_save(
    path: str | os.PathLike[str] | None = None,
    *,
    checkpoint_type: str = "global",
    strategy: str = "sync",
    iteration: int | None = None,
    **attributes: Any,
) -> Phase:
    """Saving a checkpoint: span ``megatron.checkpoint.save`` (group ``checkpoint``).

    Args:
        path: The checkpoint's file or directory (``megatron.checkpoint.path``).
        checkpoint_type: ``global`` (shared storage) or ``local`` (``megatron.checkpoint.type``).
        strategy: ``sync`` or ``async`` (``megatron.checkpoint.strategy``); for ``async`` wrap
            only the time the training loop is blocked.
        iteration: The iteration saved (``megatron.iteration``).
        **attributes: More span attributes. Set the bytes written with
            ``phase.set_attribute(MEGATRON_CHECKPOINT_SIZE, n)`` once known.
    """
    return _make(
        MEGATRON_CHECKPOINT_SAVE,
        "checkpoint",
        _checkpoint_attributes(path, checkpoint_type, strategy, iteration, attributes),
    )


def checkpoint_load(
    path: str | os.PathLike[str] | None = None,
    *,
    checkpoint_type: str = "global",
    strategy: str = "sync",
    iteration: int | None = None,
    **attributes: Any,
) -> Phase:
    """Loading a checkpoint: span ``megatron.checkpoint.load`` (group ``checkpoint``).
    Arguments as :func:`checkpoint_save` (``megatron.checkpoint.size``: bytes read)."""
    return _make(
        MEGATRON_CHECKPOINT_LOAD,
        "checkpoint",
        _checkpoint_attributes(path, checkpoint_type, strategy, iteration, attributes),
    )


def _checkpoint_attributes(path, checkpoint_type, strategy, iteration, attributes) -> dict:
    attributes[MEGATRON_CHECKPOINT_TYPE] = checkpoint_type
    attributes[MEGATRON_CHECKPOINT_STRATEGY] = strategy
    if path is not None:
        attributes[MEGATRON_CHECKPOINT_PATH] = os.fspath(path)
    if iteration is not None:
        attributes[MEGATRON_ITERATION] = iteration
    return attributes


def evaluation(iteration: int | None = None, **attributes: Any) -> Phase:
    """Evaluating on held-out data: span ``megatron.evaluate`` (group ``evaluation``)."""
    if iteration is not None:
        attributes[MEGATRON_ITERATION] = iteration
    return _make(MEGATRON_EVALUATE, "evaluation", attributes or None)


def phase(name: str, /, *, group: str | None = None, **attributes: Any) -> Phase:
    """Any phase, as a span named ``name``.

    Args:
        name: The span name (lower-case and dotted, such as ``myproject.preprocess``).
        group: The span group that turns it on or off; default: the group of ``name`` in the
            registry, else ``custom`` (on in every preset but ``none``). An unknown group is
            logged once and treated as ``custom``.
        **attributes: Span attributes (``**{"my.key": 1}`` for dotted keys).
    """
    if group is None:
        spec = SPANS.get(name)
        group = spec.group if spec is not None else CUSTOM_SPAN_GROUP
    elif group not in SPAN_GROUPS:
        _warn_once(f"group:{group}", "unknown span group %r, using 'custom'", group)
        group = CUSTOM_SPAN_GROUP
    return _make(name, group, attributes or None)


# -- callback frameworks ----------------------------------------------------------------


class SpanRecorder:
    """Start, stop, event and error by handle, for callback frameworks (Lightning, the
    Hugging Face Trainer) where a ``with`` block does not fit.

    Spans started here are not made current: give ``parent=`` to nest them. Every method
    never raises; a disabled group gives the shared no-op handle.

    Args:
        tracer_provider: Where the spans go; default: the tracer of the configured pipeline
            (:func:`otel_training.configure`, from the environment on first use).
        meter_provider: Where ``record_metrics`` and ``record_step_duration`` of the phases
            record; default: the configured pipeline's meter.
        span_groups: Presets and group names that record spans (as
            ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``); default: the configured pipeline's groups,
            else that variable's. With none of the three, the recorder follows the configured
            pipeline, even one configured later; with a provider missing, the missing one is
            taken from the pipeline configured now (configuring it from the environment if
            needed); with both providers, nothing is configured.

    Raises:
        ValueError: when ``span_groups`` names an unknown preset or group.

    Example::

        recorder = SpanRecorder()
        run = recorder.start_phase(training_run)
        step = recorder.start_phase(training_iteration, iteration=1, parent=run)
        recorder.event(step, "loss_spike", {"loss": 9.1})
        recorder.stop(step)
        recorder.error(run, exc)   # if the run fails
        recorder.stop(run)
    """

    def __init__(
        self,
        *,
        tracer_provider: trace_api.TracerProvider | None = None,
        meter_provider: Any = None,
        span_groups: str | Iterable[str] | None = None,
    ) -> None:
        self._state: _State | None = None
        if tracer_provider is None and meter_provider is None and span_groups is None:
            return
        groups = None if span_groups is None else span_groups_from_names(span_groups)
        configured = None
        if tracer_provider is None or meter_provider is None:
            configured = _configured_state()
        state = _State()
        if tracer_provider is None:
            state.tracer = configured.tracer
            recording = bool(configured.groups)
        else:
            state.tracer = tracer_provider.get_tracer(setup.INSTRUMENTATION_NAME)
            recording = not isinstance(tracer_provider, trace_api.NoOpTracerProvider)
        state.meter = (
            configured.meter
            if meter_provider is None
            else meter_provider.get_meter(setup.INSTRUMENTATION_NAME)
        )
        if groups is None:
            telemetry = setup._current
            settings = telemetry.settings if telemetry is not None else config.load()
            groups = settings.span_groups
        state.groups = groups if recording else frozenset()
        self._state = state

    def start(
        self,
        name: str,
        *,
        group: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        parent: Phase | None = None,
    ) -> Phase:
        """Starts a span named ``name`` and returns its handle (see :func:`phase` for
        ``group``)."""
        return self.start_phase(phase, name, group=group, parent=parent, **dict(attributes or {}))

    def start_phase(
        self,
        phase_function: Callable[..., Phase],
        /,
        *args: Any,
        parent: Phase | None = None,
        **kwargs: Any,
    ) -> Phase:
        """Starts the phase that ``phase_function(*args, **kwargs)`` describes
        (:func:`training_iteration`, :func:`optimizer_step`, :func:`checkpoint_save`...), with
        this recorder's providers and groups, and returns its handle. The span names and groups
        stay those of the phase functions."""
        state = self._state
        token = None if state is None else _bound_state.set(state)
        try:
            handle = phase_function(*args, **kwargs)
        except Exception:
            _warn_once("start_phase", "could not make the phase %r", phase_function)
            return NOOP_PHASE
        finally:
            if token is not None:
                _bound_state.reset(token)
        return handle.start(parent=parent)

    def stop(self, handle: Phase, attributes: Mapping[str, Any] | None = None) -> None:
        """Ends the span of ``handle``, after adding ``attributes``."""
        handle.stop(attributes)

    def event(self, handle: Phase, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Adds an event to the span of ``handle``."""
        handle.add_event(name, attributes)

    def error(self, handle: Phase, exception: BaseException) -> None:
        """Records ``exception`` on the span of ``handle`` (status ERROR, exception event)."""
        handle.error(exception)


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
                        value = _attribute_value(_host_value(read.result()))
                    except Exception:
                        value = "<unreadable device value>"
                    span.set_attribute(key, value)
                span.end(end_time=end_ns)
            except Exception:
                _warn_once("deferred", "could not end a deferred span")
            with self._lock:
                self._busy -= 1
                self._ready.notify_all()


def _host_value(value: Any) -> Any:
    """The Python number of a host value (a pinned 0-d tensor, or a tensor-like test double)."""
    if type(value) in _PRIMITIVES:
        return value
    number = _host_number(value) if instruments._device_type(value) in (None, "cpu") else None
    return float(value) if number is None else number


_deferred_ends = _DeferredEnds()


def _after_fork_in_child() -> None:
    global _state_lock
    _state_lock = threading.Lock()
    _deferred_ends._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
