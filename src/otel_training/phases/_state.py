"""The state the phases run in: the configured pipeline's tracer, meter, span groups, NVTX
domain, traces and open spans, built once per :class:`otel_training.configuration.Telemetry`.

:func:`current` is what a phase made now records into: the state of the pipeline configured
last (rebuilt when ``configure()`` replaces it), or, while a :class:`otel_training.SpanRecorder`
on providers of its own makes a phase, that recorder's state (:data:`bound_state`). A state
only changes what is exported: a phase behaves the same whatever state it runs in.

Also here, because it belongs to the process and not to a pipeline: whether the next
:func:`otel_training.training_iteration` is the first one of the process (or of the current
run), which Megatron-LM wraps in ``megatron.train.first_iteration``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import trace as trace_api

from otel_training import configuration
from otel_training.trace.segments import TraceSegments
from otel_training.trace.shape import TraceShape

__all__ = [
    "PhaseState",
    "bind",
    "bound_state",
    "configured",
    "current",
    "enabled_groups",
    "first_iteration_due",
    "reset_first_iteration",
    "state_for",
    "unbind",
]


class PhaseState:
    """What the phases of one pipeline (or of one recorder on its own providers) record into.

    Attributes:
        telemetry: The pipeline, or ``None`` for a recorder's own providers.
        tracer: Its tracer; ``meter``: its meter.
        groups: The span groups enabled (:func:`enabled_groups`); empty when the pipeline
            records nothing.
        spans: Those of them whose phases are spans.
        ranges: Those mirrored to NVTX only, while an NVTX tool is attached (without one
            they export nothing).
        range_targets: (domain, event attributes) of the NVTX range of each phase name seen
            in ``ranges``.
        routes: What :func:`otel_training.phases._phase.fine` makes for each phase name it
            has seen (decided once per name).
        segments: Where its spans start (:class:`otel_training.trace.segments.TraceSegments`), or
            ``None`` (no sampler: a no-op or own provider).
        open: The spans open in this pipeline (``OpenSpans.spans``), truncated at shutdown.
        generation: How many times this pipeline's shutdown began (0 or 1): a phase open
            across it was interrupted.
        follows_pipeline: False for a recorder's own providers (its handles keep the state).
    """

    __slots__ = (
        "telemetry",
        "tracer",
        "meter",
        "groups",
        "spans",
        "ranges",
        "range_targets",
        "routes",
        "segments",
        "open",
        "generation",
        "follows_pipeline",
        "_nvtx",
    )

    def __init__(self) -> None:
        self.telemetry: configuration.Telemetry | None = None
        self.tracer: trace_api.Tracer | None = None
        self.meter: Any = None
        self.groups: frozenset[str] = frozenset()
        self.spans: frozenset[str] = frozenset()
        self.ranges: frozenset[str] = frozenset()
        self.range_targets: dict[str, tuple[Any, Any]] = {}
        self.routes: dict[str, tuple[int, int, Any]] = {}
        self.segments: TraceSegments | None = None
        self.open: dict = {}
        self.generation = 0
        self.follows_pipeline = True
        self._nvtx: Any = None  # the NVTX processor, when a tool is attached

    def range_target(self, name: str, group: str) -> tuple[Any, Any] | None:
        """(domain, event attributes) of the NVTX range of the NVTX-only phase ``name`` of
        ``group``, registered now and kept in ``range_targets``; ``None`` when NVTX fails."""
        found = self.range_targets.get(name)
        if found is not None or self._nvtx is None:
            return found
        domain, event = self._nvtx.range_attributes(name, group)
        if domain is None:
            return None
        found = self.range_targets[name] = (domain, event)
        return found

    def _shutting_down(self) -> None:
        self.generation += 1


_current = PhaseState()
_lock = threading.Lock()

#: The state of a :class:`otel_training.SpanRecorder` built on its own providers, while it
#: makes a phase.
bound_state: contextvars.ContextVar[PhaseState | None] = contextvars.ContextVar(
    "otel_training_bound_span_state", default=None
)


#: How many recorders are making a phase with a state of their own now, on any thread: while
#: none is, :data:`bound_state` is unset everywhere (a fine-grained phase need not read it).
binding = 0


def bind(state: PhaseState) -> contextvars.Token:
    """Makes ``state`` the one phases made now on this context record into (a recorder on its
    own providers, while it makes a phase); :func:`unbind` ends it. Never raises."""
    global binding
    with _lock:
        binding += 1
    return bound_state.set(state)


def unbind(token: contextvars.Token) -> None:
    """Ends what :func:`bind` began."""
    global binding
    bound_state.reset(token)
    with _lock:
        binding -= 1


def current() -> PhaseState | None:
    """The state a phase made now records into; ``None`` when nothing is configured yet (and
    no recorder on its own providers is making the phase)."""
    state = bound_state.get()
    if state is not None:
        return state
    telemetry = configuration._current
    if telemetry is None:
        return None
    state = _current
    if state.telemetry is not telemetry:
        state = _refresh(telemetry)
    return state


def configured() -> PhaseState:
    """The configured pipeline's state; configures from the environment first if needed."""
    telemetry = configuration._current
    if telemetry is None:
        configuration.get_tracer()  # configures from the environment
        telemetry = configuration._current
    state = _current
    if state.telemetry is not telemetry:
        state = _refresh(telemetry)
    return state


def _refresh(telemetry: configuration.Telemetry) -> PhaseState:
    global _current
    with _lock:
        if _current.telemetry is telemetry:
            return _current
        state = PhaseState()
        state.telemetry = telemetry
        state.tracer = telemetry.tracer
        state.meter = telemetry.meter
        settings = telemetry.settings
        recording = not isinstance(telemetry.tracer_provider, trace_api.NoOpTracerProvider)
        state.groups = settings.span_groups if recording else frozenset()
        nvtx_only = settings.nvtx_only_groups & state.groups
        state.spans = state.groups - nvtx_only
        nvtx = telemetry.nvtx
        if nvtx is not None and nvtx.active:
            state._nvtx = nvtx
            state.ranges = nvtx_only
        if telemetry.open_spans is not None:
            state.open = telemetry.open_spans.spans
        # First: a phase that ends after this knows its pipeline went away under it.
        telemetry.before_shutdown.insert(0, state._shutting_down)
        if recording:
            sampler = getattr(telemetry.tracer_provider, "sampler", None)
            if sampler is not None:
                identity = settings.identity
                shape = TraceShape.derive(
                    state.spans,
                    identity.world_size,
                    settings.trace_span_budget,
                    settings.trace_segment_iterations,
                )
                state.segments = TraceSegments(
                    telemetry.tracer,
                    identity.run_id or "run",
                    shape,
                    identity.rank,
                    sampler,
                    segment_spans="job" in state.spans,
                    open_spans=state.open,
                    exports=_exports(settings.export_ranks, identity),
                )
                telemetry.before_shutdown.append(state.segments.close)
        _current = state
        return state


def enabled_groups() -> frozenset[str]:
    """The span groups that record spans in the configured pipeline (empty when telemetry is
    disabled or nothing is configured yet)."""
    state = current()
    return frozenset() if state is None else state.groups


def state_for(
    tracer_provider: trace_api.TracerProvider | None,
    meter_provider: Any,
    groups: frozenset[str] | None,
) -> PhaseState:
    """A state of its own for :class:`otel_training.SpanRecorder`: the given providers (the
    configured pipeline's where one is missing) and span groups (the pipeline's, else the
    environment's). No routing to the run's traces, no NVTX-only phases."""
    from otel_training import config
    from otel_training.pipeline import INSTRUMENTATION_NAME

    pipeline = None
    if tracer_provider is None or meter_provider is None:
        pipeline = configured()
    state = PhaseState()
    state.follows_pipeline = False
    if tracer_provider is None:
        state.tracer = pipeline.tracer
        recording = bool(pipeline.groups)
    else:
        state.tracer = tracer_provider.get_tracer(INSTRUMENTATION_NAME)
        recording = not isinstance(tracer_provider, trace_api.NoOpTracerProvider)
    state.meter = (
        pipeline.meter if meter_provider is None else meter_provider.get_meter(INSTRUMENTATION_NAME)
    )
    if groups is None:
        telemetry = configuration._current
        groups = (telemetry.settings if telemetry is not None else config.load()).span_groups
    state.groups = state.spans = groups if recording else frozenset()
    return state


# -- the first iteration ----------------------------------------------------------------------

_first_lock = threading.Lock()
_first_due = True


def first_iteration_due() -> bool:
    """True exactly once after process start and after each start of a run: the iteration
    made now is the first one (Megatron-LM's ``megatron.train.first_iteration``)."""
    global _first_due
    if not _first_due:
        return False
    with _first_lock:
        due, _first_due = _first_due, False
    return due


def reset_first_iteration() -> None:
    """Makes the next iteration a first iteration again: a run starts (a second fit in the same
    process compiles and captures anew), a forked child starts, or a test resets."""
    global _first_due
    _first_due = True


def _after_fork_in_child() -> None:
    global _lock, _first_lock
    _lock = threading.Lock()
    _first_lock = threading.Lock()
    reset_first_iteration()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _exports(policy: Any, identity: Any) -> Callable[[int], bool]:
    """Whether rank ``k`` of this job exports under ``policy`` (its local rank taken as
    ``k`` mod the local world size, as torchrun and SLURM place ranks): every rank computes
    the same, so the keepers of the shared traces agree without communication."""

    def exports(rank: int) -> bool:
        local = rank % max(1, identity.local_world_size)
        return policy.exports(dataclasses.replace(identity, rank=rank, local_rank=local))

    return exports
