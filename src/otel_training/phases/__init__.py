"""The phases of training behind :mod:`otel_training.spans`: one lifecycle whatever the group.

- :mod:`~otel_training.phases._phase`: :class:`Phase` and its lifecycle (start, error, stop,
  record_metrics, decorator), what each kind exports (:class:`SpanPhase`, :class:`NvtxPhase`,
  :class:`LedgerPhase`, :data:`NOOP_PHASE`), and :func:`make`, which picks one (:func:`fine`
  for a fine-grained phase, decided once per name);
- :mod:`~otel_training.phases._state`: the configured pipeline's tracer, meter, groups, NVTX
  domain, traces and open spans, per pipeline (or per recorder on its own providers);
- :mod:`~otel_training.phases._exceptions`: an exception as the phases record it on a span;
- :mod:`~otel_training.phases._deferred`: spans whose attributes wait for device values, ended
  on a background thread.

This package is in the API layer (``tests/test_import_layers.py``): it may import the SDK
layer (``pipeline``, ``metrics``, ``trace``, ``logs``, ``export``), the settings, the health
definitions and the leaves; never the instrumentation (``tensor``, ``integrations``), the report
or the tools.
"""

from otel_training.phases._phase import (
    NOOP_PHASE,
    RUN,
    LedgerPhase,
    NvtxPhase,
    Phase,
    SpanPhase,
    fine,
    make,
)
from otel_training.phases._state import (
    bind,
    bound_state,
    enabled_groups,
    first_iteration_due,
    reset_first_iteration,
    state_for,
    unbind,
)
from otel_training.phases._warnings import warn_once

__all__ = [
    "NOOP_PHASE",
    "RUN",
    "LedgerPhase",
    "NvtxPhase",
    "Phase",
    "SpanPhase",
    "bind",
    "bound_state",
    "enabled_groups",
    "fine",
    "first_iteration_due",
    "make",
    "reset_first_iteration",
    "state_for",
    "unbind",
    "warn_once",
]
