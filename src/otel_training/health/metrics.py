"""The health ledger as observable instruments: ``dl.training.phase.time`` and friends.

:func:`observe_ledger` creates, on a pipeline's meter, the nine instruments of
``semconv/registry/health.yaml`` (28 series per rank). Their callbacks run on the metric
reader's thread, read :data:`otel_training.health.ledger.LEDGER` (a few microseconds: no lock,
no device work, no waiting) and yield its values; a value not known yet (no step completed, no
checkpoint saved) is absent rather than zero.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_training._log_once import MINUTE_S, LogOnce
from otel_training.health import ledger as _ledger
from otel_training.semconv.attributes import DL_TRAINING_PHASE, MEGATRON_CHECKPOINT_OPERATION
from otel_training.semconv.metrics import (
    DL_TRAINING_CHECKPOINT_AGE,
    DL_TRAINING_CHECKPOINT_ITERATION,
    DL_TRAINING_PHASE_ELAPSED,
    DL_TRAINING_PHASE_TIME,
    DL_TRAINING_PROGRESS_AGE,
    DL_TRAINING_PROGRESS_ITERATION,
    DL_TRAINING_PROGRESS_LOGGED_ITERATION,
    DL_TRAINING_PROGRESS_STEPS,
    DL_TRAINING_PROGRESS_TIMESTAMP,
    METRICS,
)

__all__ = ["observe_ledger"]

_logger = logging.getLogger("otel_training.health")
# The reader's thread reads the ledger at every collection: a failure is said once a minute.
_read_failed = LogOnce(_logger, interval_s=MINUTE_S, exc_info=True)

# One attribute set per phase, made once.
_PHASE_ATTRIBUTES = tuple({DL_TRAINING_PHASE: phase} for phase in _ledger.PHASES)
_SAVE = {MEGATRON_CHECKPOINT_OPERATION: "save"}
_LOAD = {MEGATRON_CHECKPOINT_OPERATION: "load"}


def observe_ledger(
    meter: Meter,
    source: Callable[[], _ledger.Ledger] = lambda: _ledger.LEDGER,
    names: Collection[str] | None = None,
) -> None:
    """Creates the ledger's observable instruments on ``meter``. Never raises: a failure is
    logged and the instruments are absent.

    Args:
        meter: The pipeline's meter.
        source: Returns the ledger to read (default: this process's); for tests.
        names: Only these instruments (the heartbeat's, :mod:`otel_training.metrics.heartbeat`);
            ``None`` for all nine.
    """

    def guard(observe: Callable[[_ledger.LedgerReading], Iterable[Observation]]):
        def callback(options: CallbackOptions) -> list[Observation]:
            try:
                return list(observe(source().read()))
            except Exception:
                _read_failed("read", "reading the health ledger failed")
                return []

        return callback

    def phase_time(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        for attributes in _PHASE_ATTRIBUTES:
            yield Observation(reading.phase_time_s[attributes[DL_TRAINING_PHASE]], attributes)

    def phase_elapsed(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        for attributes in _PHASE_ATTRIBUTES:
            is_open = attributes[DL_TRAINING_PHASE] == reading.open_phase
            yield Observation(reading.open_s if is_open else 0.0, attributes)

    def progress_iteration(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        if reading.iteration is not None:
            yield Observation(reading.iteration)

    def progress_steps(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        yield Observation(reading.steps)

    def logged_iteration(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        if reading.logged_iteration is not None:
            yield Observation(reading.logged_iteration)

    def progress_timestamp(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        if reading.progress_unix_s is not None:
            yield Observation(reading.progress_unix_s)

    def progress_age(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        yield Observation(reading.age_s)

    def checkpoint_iteration(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        if reading.saved_iteration is not None:
            yield Observation(reading.saved_iteration, _SAVE)
        if reading.loaded_iteration is not None:
            yield Observation(reading.loaded_iteration, _LOAD)

    def checkpoint_age(reading: _ledger.LedgerReading) -> Iterable[Observation]:
        if reading.checkpoint_age_s is not None:
            yield Observation(reading.checkpoint_age_s)

    created = {
        DL_TRAINING_PHASE_TIME: (meter.create_observable_counter, phase_time),
        DL_TRAINING_PHASE_ELAPSED: (meter.create_observable_gauge, phase_elapsed),
        DL_TRAINING_PROGRESS_ITERATION: (meter.create_observable_gauge, progress_iteration),
        DL_TRAINING_PROGRESS_STEPS: (meter.create_observable_counter, progress_steps),
        DL_TRAINING_PROGRESS_LOGGED_ITERATION: (meter.create_observable_gauge, logged_iteration),
        DL_TRAINING_PROGRESS_TIMESTAMP: (meter.create_observable_gauge, progress_timestamp),
        DL_TRAINING_PROGRESS_AGE: (meter.create_observable_gauge, progress_age),
        DL_TRAINING_CHECKPOINT_ITERATION: (meter.create_observable_gauge, checkpoint_iteration),
        DL_TRAINING_CHECKPOINT_AGE: (meter.create_observable_gauge, checkpoint_age),
    }
    try:
        for name, (create, observe) in created.items():
            if names is not None and name not in names:
                continue
            spec = METRICS[name]
            create(
                spec.name, callbacks=[guard(observe)], unit=spec.unit, description=spec.description
            )
    except Exception:
        _logger.warning("the health ledger's instruments could not be created", exc_info=True)
