"""The health ledger: where this rank's time goes, and how far training has progressed.

One :class:`Ledger` per process (:data:`LEDGER`). The phase functions
(:mod:`otel_training.spans`) and the framework callbacks feed it on the training thread, whether
their span group records spans, mirrors them to NVTX only, or is off: :meth:`Ledger.enter` and
:meth:`Ledger.exit` add plain floats and cost well under a microsecond, with no lock and no SDK
call. The metric reader's thread reads it (:meth:`Ledger.read`) for the observable instruments
of :mod:`otel_training.health.metrics`. No collective, no I/O: a rank that hangs or is slow
cannot stop another from reporting.

**Phases.** At every moment one phase of :data:`PHASES` is the innermost and the time goes to
it. Before the first iteration of the process begins, outside any phase, that is ``startup``
(backdated to ``process.creation.time``: the time before ``configure()`` is startup too); after,
``other``. Which span counts as which phase: :data:`PHASE_OF_SPAN`. ``checkpoint_save``,
``checkpoint_load``, ``evaluate`` and ``warmup`` take all the time inside them, ``startup`` all
but a checkpoint load (:func:`effective`). An iteration's own time, outside the phases inside
it, is ``forward_backward``, except for the first iteration of the process, which is
``warmup`` as a whole. Definitions and the goodput built on them: ``docs/health.md``.

**Progress.** An iteration that ends without an exception is completed: its number (or the
last one + 1 when it has none) and its end time become the progress. A checkpoint save that ends
without an exception records the iteration it holds; a load, the iteration it restored (which
also becomes the progress).

**Logged iteration.** When the training metrics of a log interval are recorded
(:func:`otel_training.record_training_metrics` with a value other than the step duration), the
step they describe is noted: the last completed iteration then, an open iteration's own number
when the caller knows it (:meth:`Ledger.training_logged`). Exported beside those values, it
places each value at its step in the report.

**Threads.** The ledger follows the thread that enters its first phase (the training thread);
phases of other threads (an asynchronous checkpoint's finalisation) are ignored by it. Until the
first iteration begins, the thread that begins it takes the ledger over (a data loader's thread
that opened a phase before the training thread's first one held it): what the other thread had
open closes there, its time counted up to then.
Transitions out of order (a handle of :class:`otel_training.SpanRecorder` stopped before one
started after it) close everything opened after the phase that ends. Nothing here raises.
"""

from __future__ import annotations

import array
import collections
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from otel_training import clock
from otel_training.health import hang as _hang
from otel_training.health import record as _record
from otel_training.semconv.attributes import ATTRIBUTES, DL_TRAINING_PHASE
from otel_training.semconv.spans import (
    MEGATRON_CHECKPOINT_LOAD,
    MEGATRON_CHECKPOINT_LOAD_IO_READ,
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_CHECKPOINT_SAVE_FINALIZE,
    MEGATRON_CHECKPOINT_SAVE_IO_WRITE,
    MEGATRON_CHECKPOINT_SAVE_STATE_DICT,
    MEGATRON_EVALUATE,
    MEGATRON_EVALUATE_STEP,
    MEGATRON_GRAD_SYNC_FINISH,
    MEGATRON_LAYER_FORWARD,
    MEGATRON_LAYER_MLP,
    MEGATRON_LAYER_SELF_ATTENTION,
    MEGATRON_MICROBATCH_BACKWARD,
    MEGATRON_MICROBATCH_FORWARD,
    MEGATRON_P2P_RECV_BACKWARD,
    MEGATRON_P2P_RECV_FORWARD,
    MEGATRON_STARTUP,
    MEGATRON_STARTUP_DATALOADER,
    MEGATRON_STARTUP_MODEL_INIT,
    MEGATRON_TRAIN_FIRST_ITERATION,
    MEGATRON_TRAIN_ITERATION,
    MEGATRON_TRAIN_ITERATION_DATA_LOADING,
    MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
    MEGATRON_TRAIN_ITERATION_OPTIMIZER,
)

__all__ = [
    "ASYNC_SAVE",
    "ITERATION",
    "LEDGER",
    "NO_PHASE",
    "PHASES",
    "RUN_PHASE",
    "PHASE_OF_SPAN",
    "Ledger",
    "LedgerReading",
    "effective",
]

#: The values of ``dl.training.phase``, in the registry's order; a phase's index is its code.
PHASES: Final[tuple[str, ...]] = ATTRIBUTES[DL_TRAINING_PHASE].members
(
    STARTUP,
    CHECKPOINT_LOAD,
    WARMUP,
    DATA_LOADING,
    FORWARD_BACKWARD,
    OPTIMIZER,
    COMMUNICATION,
    CHECKPOINT_SAVE,
    EVALUATE,
    OTHER,
) = range(len(PHASES))
#: An iteration (optimizer step): ``warmup`` for the first of the process, else
#: ``forward_backward`` for its time outside the phases inside it; completes a step.
ITERATION: Final = len(PHASES)
#: An asynchronous checkpoint save (``strategy="async"``): ``checkpoint_save`` for its time;
#: when it closes, its background write has only begun (:meth:`Ledger.checkpoint_save_completed`).
ASYNC_SAVE: Final = len(PHASES) + 1
#: A span that is no phase of the ledger (a custom phase): no transition.
NO_PHASE: Final = -1
#: The run (``training_run()``): no transition either, but an error that leaves it is noted
#: (:meth:`Ledger.raised`), as one that leaves a phase of the ledger is.
RUN_PHASE: Final = -2

#: The ledger phase of each span name that is one (the rest are :data:`NO_PHASE`).
PHASE_OF_SPAN: Final[Mapping[str, int]] = {
    MEGATRON_STARTUP: STARTUP,
    MEGATRON_STARTUP_MODEL_INIT: STARTUP,
    MEGATRON_STARTUP_DATALOADER: STARTUP,
    MEGATRON_CHECKPOINT_LOAD: CHECKPOINT_LOAD,
    MEGATRON_CHECKPOINT_LOAD_IO_READ: CHECKPOINT_LOAD,
    MEGATRON_TRAIN_FIRST_ITERATION: WARMUP,
    MEGATRON_TRAIN_ITERATION: ITERATION,
    MEGATRON_TRAIN_ITERATION_DATA_LOADING: DATA_LOADING,
    MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD: FORWARD_BACKWARD,
    MEGATRON_MICROBATCH_FORWARD: FORWARD_BACKWARD,
    MEGATRON_MICROBATCH_BACKWARD: FORWARD_BACKWARD,
    MEGATRON_LAYER_FORWARD: FORWARD_BACKWARD,
    MEGATRON_LAYER_SELF_ATTENTION: FORWARD_BACKWARD,
    MEGATRON_LAYER_MLP: FORWARD_BACKWARD,
    MEGATRON_TRAIN_ITERATION_OPTIMIZER: OPTIMIZER,
    MEGATRON_GRAD_SYNC_FINISH: COMMUNICATION,
    MEGATRON_P2P_RECV_FORWARD: COMMUNICATION,
    MEGATRON_P2P_RECV_BACKWARD: COMMUNICATION,
    MEGATRON_CHECKPOINT_SAVE: CHECKPOINT_SAVE,
    MEGATRON_CHECKPOINT_SAVE_STATE_DICT: CHECKPOINT_SAVE,
    MEGATRON_CHECKPOINT_SAVE_IO_WRITE: CHECKPOINT_SAVE,
    MEGATRON_CHECKPOINT_SAVE_FINALIZE: CHECKPOINT_SAVE,
    MEGATRON_EVALUATE: EVALUATE,
    MEGATRON_EVALUATE_STEP: EVALUATE,
}

# Phases that take all the time inside them; startup lets a checkpoint load through.
_ABSORBING: Final = {
    CHECKPOINT_SAVE: frozenset(),
    CHECKPOINT_LOAD: frozenset(),
    EVALUATE: frozenset(),
    WARMUP: frozenset({CHECKPOINT_SAVE, CHECKPOINT_LOAD, EVALUATE}),
    STARTUP: frozenset({CHECKPOINT_LOAD}),
}


def effective(outer: int, inner: int) -> int:
    """The phase that time inside ``inner`` goes to when ``outer`` is the innermost phase
    open around it (both codes of :data:`PHASES`)."""
    let_through = _ABSORBING.get(outer)
    if let_through is None or inner in let_through:
        return inner
    return outer


# _EFFECTIVE[outer][inner], precomputed for the hot path.
_EFFECTIVE: Final = tuple(
    tuple(effective(outer, inner) for inner in range(len(PHASES))) for outer in range(len(PHASES))
)
_SINCE: Final = _record.SINCE
_OPEN: Final = _record.OPEN
_OPEN_START: Final = _record.OPEN_START
#: The pauses whose end the record keeps (``PAUSE_END``), each with the slot of its longest
#: completed occurrence (-1: none kept). Startup ends when warm-up begins, itself a pause.
_PAUSE_SLOT: Final = {
    CHECKPOINT_LOAD: _record.LONGEST_LOAD,
    CHECKPOINT_SAVE: _record.LONGEST_SAVE,
    EVALUATE: _record.LONGEST_EVALUATE,
    WARMUP: -1,
}
#: The phases whose tail :meth:`Ledger.collective_wait` turns into ``communication``: the
#: backward pass, where DDP's all-reduce runs.
_WAITABLE: Final = frozenset({FORWARD_BACKWARD})
#: The codes of the pauses (:data:`otel_training.health.hang.PAUSE_PHASES`).
_PAUSES: Final = frozenset(PHASES.index(p) for p in _hang.PAUSE_PHASES)
#: The codes that take the short path of :meth:`Ledger.enter` and :meth:`Ledger.exit` (a
#: transition alone, no copy into the record): the step phases and ``other``; not an iteration,
#: a save or a pause, nor a phase inside a save or a pause (its effective phase is one).
_PLAIN: Final = tuple(
    code in (DATA_LOADING, FORWARD_BACKWARD, OPTIMIZER, COMMUNICATION, OTHER)
    for code in range(ASYNC_SAVE + 1)
)
_NOTHING_PLAIN: Final = (False,) * (ASYNC_SAVE + 1)
#: _SAME[top][code]: whether opening ``code`` (plain) while ``top`` is innermost changes
#: nothing (its effective phase is ``top``, whose start it continues): a layer or a micro-batch
#: inside forward/backward, a phase inside a save. :meth:`Ledger.enter` then returns 0.
_SAME: Final = tuple(
    tuple(_PLAIN[code] and code < len(PHASES) and _EFFECTIVE[top][code] == top
          for code in range(ASYNC_SAVE + 1))
    for top in range(len(PHASES))
)  # fmt: skip
_NOTHING_SAME: Final = (_NOTHING_PLAIN,) * len(PHASES)
#: ``Ledger._save_at`` while no save is open.
_NO_SAVE: Final = -1
#: Seconds after which a transition of the short path copies the hot state into the record:
#: a phase longer than this is in the record from its start.
SYNC_S: Final = 0.05
_get_ident = threading.get_ident
_LOG = logging.getLogger(__name__)
#: Completion times kept of the last iterations, to date the step a checkpoint save holds.
_RECENT_STEPS: Final = 256


@dataclass(frozen=True)
class LedgerReading:
    """One consistent reading of the ledger, for the observable instruments.

    Attributes:
        phase_time_s: Seconds with each phase innermost since process creation, by phase
            name; never smaller than in an earlier reading.
        open_phase: The phase innermost now.
        open_s: Seconds it has been open.
        iteration: The last completed iteration (or restored by a load), or ``None``.
        progress_unix_s: Unix time it completed (or the load completed), or ``None``.
        age_s: Seconds since then; since process creation before either.
        saved_iteration: The iteration of the last good save, or ``None``.
        loaded_iteration: The iteration restored by the last good load, or ``None``.
        checkpoint_age_s: The progress a crash would lose now, in seconds, or ``None`` before
            the first iteration began.
        logged_iteration: The step that the training metrics recorded last describe
            (:meth:`Ledger.training_logged`), or ``None`` before the first.
        steps: Optimizer steps this process completed (monotonic: a load restores none).
        longest_s: The longest completed occurrence of each long phase
            (``checkpoint_save``, ``checkpoint_load``, ``evaluate``), seconds, by phase name:
            measured when it closed, exact; a phase that never completed is absent.
        pause_age_s: Seconds since this rank's last pause (``startup``, ``warmup`` or a long
            phase) ended: 0 while one is open; ``None`` while none has ended.
    """

    phase_time_s: Mapping[str, float]
    open_phase: str
    open_s: float
    iteration: int | None
    progress_unix_s: float | None
    age_s: float
    saved_iteration: int | None
    loaded_iteration: int | None
    checkpoint_age_s: float | None
    logged_iteration: int | None = None
    steps: int = 0
    longest_s: Mapping[str, float] = field(default_factory=dict)
    pause_age_s: float | None = None


class Ledger:
    """The phase and progress ledger of one process (see the module docstring).

    Args:
        created_unix_s: When the process started, in Unix seconds: the origin of the phase
            times (default: :func:`otel_training.clock.process_creation_unix_s`).
        perf: The monotonic clock, in seconds (default ``time.perf_counter``); for tests.
        unix: The wall clock, in Unix seconds (default :func:`otel_training.clock.unix_s`:
            one anchor plus the monotonic clock); for tests.
    """

    __slots__ = (
        "_thread",
        "_stack",
        "_starts",
        "_rec",
        "_hot",
        "_synced",
        "_plain",
        "_same",
        "_begun",
        "_created_perf",
        "_created_unix",
        "_read_max",
        "_recent",
        "iteration",
        "progress_unix_s",
        "saved_iteration",
        "loaded_iteration",
        "logged_iteration",
        "steps",
        "_safe_unix_s",
        "_began_unix_s",
        "_save_at",
        "_save_failed",
        "_async",
        "_pending",
        "_early",
        "_async_lock",
        "_perf",
        "_unix",
        "record_path",
    )

    def __init__(
        self,
        created_unix_s: float | None = None,
        *,
        perf: Callable[[], float] = time.perf_counter,
        unix: Callable[[], float] = clock.unix_s,
    ) -> None:
        self._perf = perf
        self._unix = unix
        created = clock.process_creation_unix_s() if created_unix_s is None else created_unix_s
        now_perf = perf()
        self._created_unix = created
        self._created_perf = now_perf - max(0.0, unix() - created)
        self._thread: int | None = None
        # The phases open, outermost first, above the base (stack[0]: startup, then other once
        # the first iteration began), and when each opened (perf seconds).
        self._stack: list[int] = [STARTUP]
        self._starts: list[float] = [self._created_perf]
        # The hot state, in the record's layout (health/record.py): a list, cheap to store
        # into; copied into the record file at the moments of :meth:`_sync`.
        hot = self._hot = [0.0] * _record.PHASE_TIMES + [math.nan] * (
            _record.SLOTS - _record.PHASE_TIMES
        )
        hot[_SINCE] = self._created_perf
        hot[_OPEN] = STARTUP  # the phase the time since SINCE goes to (an int here)
        hot[_OPEN_START] = self._created_perf
        hot[_record.UNIX_MINUS_PERF] = created - self._created_perf
        hot[_record.CREATED_UNIX] = created
        for slot in _record.LONGEST.values():
            hot[slot] = 0.0
        self._rec: memoryview | None = None  # the record file's slots, once attached
        self._synced = -math.inf  # perf seconds of the last copy into the record
        self._begun = False
        # Whether a code takes the short path of enter and exit: none before the first
        # iteration began (the base, startup, takes nothing in), then _PLAIN.
        self._plain = _NOTHING_PLAIN
        self._same = _NOTHING_SAME
        self._read_max = [0.0] * len(PHASES)
        self._recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=_RECENT_STEPS)
        self.iteration: int | None = None
        self.progress_unix_s: float | None = None
        self.saved_iteration: int | None = None
        self.loaded_iteration: int | None = None
        self.logged_iteration: int | None = None
        self.steps = 0  # steps completed by this process (a load restores none)
        self._safe_unix_s: float | None = None
        self._began_unix_s: float | None = None  # when the first iteration began
        self._save_at = _NO_SAVE  # the token of the outermost save open
        self._save_failed = False  # a save or a stage inside it raised
        self._async = False  # the outermost save open is asynchronous
        self._pending: list[tuple[int, float]] = []  # asynchronous saves: (step, completed)
        # Writes that ended while their asynchronous save was open: (step, succeeded).
        self._early: list[tuple[int | None, bool]] = []
        self._async_lock = threading.Lock()
        #: The progress record's file (:meth:`record_to`), or ``None``.
        self.record_path: str | None = None

    # -- the training thread -------------------------------------------------------------

    def enter(self, phase: int) -> int:
        """Opens ``phase`` (a code of :data:`PHASES`, :data:`ITERATION` or :data:`ASYNC_SAVE`)
        on the calling thread. Returns the token that :meth:`exit` takes (-1: not the ledger's
        thread). A phase that changes nothing (a layer inside forward/backward) is no
        transition: its token is where the next phase opened will be, so that its exit still
        closes every phase opened after it."""
        stack = self._stack
        top = stack[-1]
        if self._same[top][phase] and self._hot[_OPEN] == top:  # (not in collective_wait)
            return len(stack)
        if _get_ident() != self._thread:
            if self._thread is not None:
                if self._begun or phase != ITERATION:
                    return -1
                self._taken_over()  # the first iteration begins on another thread
            self._thread = _get_ident()
        now = self._perf()
        if not self._plain[phase]:
            return self._enter_marked(phase, now)
        stack = self._stack
        top = stack[-1]
        phase = _EFFECTIVE[top][phase]
        start = self._starts[-1] if phase == top else now
        hot = self._hot
        spent = now - hot[_SINCE]  # since the last transition (SINCE first: read() reads it last)
        hot[_SINCE] = now
        hot[hot[_OPEN]] += spent
        hot[_OPEN] = phase
        hot[_OPEN_START] = start
        stack.append(phase)
        self._starts.append(start)
        if now - self._synced > SYNC_S:
            self._sync(now)
        return len(stack) - 1

    def _enter_marked(self, phase: int, now: float) -> int:
        """:meth:`enter` of an iteration, a save, or a pause (startup, load, warm-up,
        evaluation): what it marks, then the transition, copied into the record (an iteration
        after the first: as a plain phase, the step's end was copied)."""
        stack = self._stack
        copy = True
        if phase == ITERATION or phase == WARMUP:
            if not self._begun:  # the first iteration of the process: warmup, all of it
                self._begun = True
                self._plain = _PLAIN  # the base is other now, which takes nothing in
                self._same = _SAME
                stack[0] = OTHER
                self._began_unix_s = self._unix()
                phase = WARMUP
            elif phase == ITERATION:
                phase = FORWARD_BACKWARD
                copy = now - self._synced > SYNC_S
        elif phase == CHECKPOINT_SAVE or phase == ASYNC_SAVE:
            if self._save_at == _NO_SAVE:
                self._save_at = len(stack)  # the outermost save's token
                self._async = phase == ASYNC_SAVE
            phase = CHECKPOINT_SAVE
        # The transition, as enter() inlines it on its short path (no call there), except
        # that the base (startup before the first iteration) takes nothing in.
        top = stack[-1]
        if len(stack) > 1:
            phase = _EFFECTIVE[top][phase]
            start = self._starts[-1] if phase == top else now
        else:
            start = now
        hot = self._hot
        spent = now - hot[_SINCE]
        hot[_SINCE] = now
        hot[hot[_OPEN]] += spent
        hot[_OPEN] = phase
        hot[_OPEN_START] = start
        stack.append(phase)
        self._starts.append(start)
        if copy:
            self._sync(now)
        return len(stack) - 1

    def exit(
        self, token: int, phase: int, iteration: int | None = None, failed: bool = False
    ) -> None:
        """Closes the phase that :meth:`enter` opened with ``token`` (and any opened after
        it). ``phase`` is the code given to :meth:`enter`; ``iteration`` its iteration number;
        ``failed`` whether it ended by an exception (then an iteration does not complete, a
        save or load does not count)."""
        if token < 1 or _get_ident() != self._thread:
            return
        stack = self._stack
        if token >= len(stack):  # a phase that changed nothing, or one closed already
            if self._hot[_OPEN] != stack[-1]:
                self._waited()
            return
        now = self._perf()
        hot = self._hot
        spent = now - hot[_SINCE]
        hot[_SINCE] = now
        hot[hot[_OPEN]] += spent
        plain = self._plain
        if plain[phase] and plain[stack[token]] and token > self._save_at:
            del stack[token:]
            starts = self._starts
            del starts[token:]
            if token == 1:  # other, between steps, since now
                starts[0] = now
            hot[_OPEN] = stack[-1]
            hot[_OPEN_START] = starts[-1]
            return
        self._exit_marked(token, phase, iteration, failed, now)

    def _exit_marked(
        self, token: int, phase: int, iteration: int | None, failed: bool, now: float
    ) -> None:
        """:meth:`exit` of an iteration, a save, a pause, or a phase around a save: the
        transition, what it completes, then a copy into the record."""
        stack, starts, hot = self._stack, self._starts, self._hot
        closed = stack[token]
        if closed in _PAUSE_SLOT and stack[token - 1] != closed:
            # the outermost occurrence of a pause closed: its length, exact, and its end
            slot = _PAUSE_SLOT[closed]
            if slot >= 0 and now - starts[token] > hot[slot]:
                hot[slot] = now - starts[token]
            hot[_record.PAUSE_END] = now
        del starts[token:]
        del stack[token:]
        if token == 1 and self._begun:  # startup stays open since process creation
            starts[0] = now
        hot[_OPEN] = stack[-1]
        hot[_OPEN_START] = starts[-1]
        saving = phase == CHECKPOINT_SAVE or phase == ASYNC_SAVE
        if token <= self._save_at:  # the outermost save closed, or a phase around it did
            self._save_closed(iteration, failed or not saving)
        elif saving:  # a stage of a save
            self._save_failed |= failed
        if not (failed or saving):
            if phase == ITERATION:
                self._step_completed(iteration)
            elif phase == CHECKPOINT_LOAD:
                self._checkpoint_loaded(iteration)
        self._sync(now)

    def _taken_over(self) -> None:
        """The first iteration begins on a thread other than the ledger's: whatever that
        thread has open closes now (its time counted up to now), and nothing of it is kept
        (its later exits are another thread's: ignored)."""
        del self._stack[1:]
        del self._starts[1:]
        self._waited()  # the time up to now to what was open; the base is open now
        self._save_at = _NO_SAVE
        self._save_failed = False
        self._async = False

    def _waited(self) -> None:
        """A phase that changed nothing closed after :meth:`collective_wait`: as any transition
        on the ledger's thread, it ends the wait. (Also: the time up to now goes to the phase
        open then, and the innermost phase of the stack is open from now.)"""
        now = self._perf()
        hot = self._hot
        spent = now - hot[_SINCE]
        hot[_SINCE] = now
        hot[hot[_OPEN]] += spent
        hot[_OPEN] = self._stack[-1]
        hot[_OPEN_START] = self._starts[-1]

    def _sync(self, now: float | None = None) -> None:
        """Copies the hot state into the record file, when one is attached (``now``: perf
        seconds, when the caller read them). Any thread; a copy racing a transition is behind
        by that transition."""
        self._synced = self._perf() if now is None else now
        rec = self._rec
        if rec is not None:
            try:
                rec[:] = array.array("d", self._hot)
            except (TypeError, ValueError):
                pass

    def collective_wait(self) -> None:
        """The rank has issued its last collective of a backward pass and now waits for the
        collectives to complete: until the training thread's next transition (the end of
        ``forward_backward``), its time is ``communication``, not the phase open. Called by
        the DDP communication hook (:mod:`otel_training.integrations.ddp`) on the thread that
        runs backward (the training thread on CPU, an autograd device thread on CUDA, while
        the training thread waits in ``backward()``); a few stores, never raises. Ignored
        outside a step phase, and while ``communication`` is already open."""
        stack = self._stack
        hot = self._hot
        if len(stack) < 2 or stack[-1] not in _WAITABLE or hot[_OPEN] == COMMUNICATION:
            return
        now = self._perf()
        spent = now - hot[_SINCE]
        hot[_SINCE] = now
        hot[stack[-1]] += spent
        hot[_OPEN] = COMMUNICATION  # until the next transition sets the phase open again
        hot[_OPEN_START] = now
        self._sync(now)

    def _save_closed(self, iteration: int | None, failed: bool) -> None:
        """The outermost save closed (``failed``: it raised, or a phase around it closed it):
        it is good when neither it nor any stage inside it failed; an asynchronous one becomes
        pending instead, completed at once if its write ended while it was closing."""
        with self._async_lock:  # a write that ends now waits for its save to be pending
            self._save_at = _NO_SAVE
            bad, self._save_failed = self._save_failed or failed, False
            early, self._early = self._early, []
            if bad:
                self._writes()
                return
            if not self._async:
                self._checkpoint_saved(iteration)
                return
            self.checkpoint_pending(iteration)
        for written, succeeded in early:
            self.checkpoint_save_completed(written, succeeded)

    def _writes(self) -> None:
        """This rank writes checkpoints (a save of it failed): with no good save yet, its
        progress at risk runs from when training began, as the job's does."""
        if self._safe_unix_s is None:
            began = self._began_unix_s
            self._safe_unix_s = self._created_unix if began is None else began
            self._hot[_record.SAFE_UNIX] = self._safe_unix_s

    def step_completed(self, iteration: int | None = None) -> None:
        """Records that optimizer step ``iteration`` (default: the last one + 1) completed
        now."""
        self._step_completed(iteration)
        self._sync()

    def _step_completed(self, iteration: int | None) -> None:
        if iteration is None:
            iteration = 1 if self.iteration is None else self.iteration + 1
        now = self._unix()
        self._recent.append((iteration, now))
        self.progress_unix_s = now
        self.iteration = iteration
        self.steps += 1
        rec = self._hot
        rec[_record.ITERATION] = iteration
        rec[_record.PROGRESS_UNIX] = now

    def checkpoint_saved(self, iteration: int | None = None) -> None:
        """Records a successful save of the state after ``iteration`` (default: the last
        completed one)."""
        self._checkpoint_saved(iteration)
        self._sync()

    def _checkpoint_saved(self, iteration: int | None) -> None:
        if iteration is None:
            iteration = self.iteration
        if iteration is None:
            return
        completed = self._completed_unix_s(iteration)
        self.saved_iteration = iteration
        rec = self._hot
        rec[_record.SAVED] = iteration
        if self._safe_unix_s is None or completed > self._safe_unix_s:
            self._safe_unix_s = completed
            rec[_record.SAFE_UNIX] = completed

    def _completed_unix_s(self, iteration: int) -> float:
        """When step ``iteration`` completed, Unix seconds; for a step older than those kept,
        now (an upper bound)."""
        completed = next((t for i, t in reversed(self._recent) if i == iteration), None)
        return self._unix() if completed is None else completed

    def checkpoint_pending(self, iteration: int | None = None) -> None:
        """Records an asynchronous save of the state after ``iteration`` (default: the last
        completed one) whose background write has begun: not good until
        :meth:`checkpoint_save_completed`."""
        if iteration is None:
            iteration = self.iteration
        if iteration is not None:
            self._pending.append((iteration, self._completed_unix_s(iteration)))

    def checkpoint_save_completed(
        self, iteration: int | None = None, succeeded: bool = True
    ) -> None:
        """The background write of the asynchronous save of ``iteration`` (default: the oldest
        pending) ended: when ``succeeded``, that save is good now (its age runs from when its
        step completed); else it is dropped. A write that ends before its save has closed (a
        fast disk: the writer's thread outran the training thread) completes it as it closes.
        Any thread; never raises."""
        with self._async_lock:
            pending = self._pending
            if iteration is None:
                found = pending[0] if pending else None
            else:
                found = next((p for p in pending if p[0] == iteration), None)
            if found is None:
                if self._save_at != _NO_SAVE and self._async:  # its save is still closing
                    self._early.append((iteration, succeeded))
                return
            pending.remove(found)
        if not succeeded:
            self._writes()
        else:
            held, completed = found
            self.saved_iteration = held
            rec = self._hot
            rec[_record.SAVED] = held
            if self._safe_unix_s is None or completed > self._safe_unix_s:
                self._safe_unix_s = completed
                rec[_record.SAFE_UNIX] = completed
        self._sync()

    def checkpoint_loaded(self, iteration: int | None = None) -> None:
        """Records a successful load that restored the state after ``iteration`` (the resume
        point); it becomes the progress."""
        self._checkpoint_loaded(iteration)
        self._sync()

    def _checkpoint_loaded(self, iteration: int | None) -> None:
        if iteration is None:
            return
        now = self._unix()
        self.loaded_iteration = iteration
        self._recent.append((iteration, now))
        self.progress_unix_s = now
        self.iteration = iteration
        rec = self._hot
        rec[_record.LOADED] = iteration
        rec[_record.ITERATION] = iteration
        rec[_record.PROGRESS_UNIX] = now

    def training_logged(
        self, iteration: int | None = None, steps_recorded: int | None = None
    ) -> int | None:
        """Notes that the training metrics of a log interval were recorded now: they describe
        ``iteration`` when the caller knows it (an open iteration's own number), else the last
        completed iteration, else ``steps_recorded`` (the step durations recorded so far in
        this process: the step count when no phase reports one). Returns that step (``None``:
        none known). Any thread; never raises."""
        if iteration is None:
            iteration = self.iteration if self.iteration is not None else steps_recorded
        if iteration is not None:
            self.logged_iteration = iteration
            self._hot[_record.LOGGED] = iteration
            self._sync()
        return iteration

    # -- the reader's thread ---------------------------------------------------------------

    def read(self) -> LedgerReading:
        """A reading for the observable instruments; any thread. Phase times never decrease
        from one reading to the next."""
        hot = self._hot
        totals = hot[: _record.PHASE_TIMES]  # first the totals, then the time they run from
        since = hot[_SINCE]
        open_phase = hot[_OPEN]
        opened = hot[_OPEN_START]
        now = self._perf()
        totals[open_phase] += max(0.0, now - since)
        clamped = self._read_max
        for i, value in enumerate(totals):
            if value > clamped[i]:
                clamped[i] = value
        unix_now = self._unix()
        progress = self.progress_unix_s
        safe = self._safe_unix_s
        rec = self._hot
        longest = {
            PHASES[code]: rec[slot] for code, slot in _record.LONGEST.items() if rec[slot] > 0
        }
        if open_phase in _PAUSES:
            pause_age: float | None = 0.0
        else:
            ended = rec[_record.PAUSE_END]  # NaN until a pause ended
            pause_age = max(0.0, now - ended) if ended == ended else None
        return LedgerReading(
            phase_time_s=dict(zip(PHASES, clamped)),
            open_phase=PHASES[open_phase],
            open_s=max(0.0, now - opened),
            iteration=self.iteration,
            progress_unix_s=progress,
            age_s=max(0.0, unix_now - (self._created_unix if progress is None else progress)),
            saved_iteration=self.saved_iteration,
            loaded_iteration=self.loaded_iteration,
            checkpoint_age_s=None if safe is None else max(0.0, unix_now - safe),
            logged_iteration=self.logged_iteration,
            steps=self.steps,
            longest_s=longest,
            pause_age_s=pause_age,
        )

    # -- the record -------------------------------------------------------------------------

    def record_to(self, path: str, identity: Mapping[str, object]) -> None:
        """Keeps the ledger's hot state in the record file ``path`` from now on
        (:mod:`otel_training.health.record`): it is created and filled with the state so far,
        then copied into at every step, every save, load, evaluation or warm-up that opens or
        closes, every phase that opens :data:`SYNC_S` after the last copy, and at each
        :meth:`heartbeat` (``docs/health.md``, "The progress record"). Called by
        ``configure()``.

        Raises:
            OSError: the file cannot be created (the ledger keeps its state in memory).
        """
        self._rec = _record.create(path, dict(identity))
        self.record_path = path
        self._sync()

    def heartbeat(self) -> None:
        """Notes in the record that this process is alive now (Unix seconds): the hang
        watchdog calls it on its thread about once a second, so that a peer reading the record
        sees a rank that sits in one long phase alive, and copies the hot state into the record
        (a phase open since the last copy is in the record from then on). Never raises."""
        self._hot[_record.ALIVE_UNIX] = self._unix()
        self._sync()

    def raised(self) -> None:
        """Notes in the record that a phase of the ledger, or the run, is being left by an
        error now (an exception other than ``SystemExit(0)`` and ``GeneratorExit``): the
        process failed unless a step completes after it. Called as the exception passes each
        phase (:meth:`otel_training.phases.Phase.error`); on the ledger's thread only, else
        ignored. A few stores and a copy into the record; never raises."""
        if _get_ident() != self._thread:
            return
        self._hot[_record.RAISED_UNIX] = self._unix()
        self._sync()

    def signalled(self, name: str) -> None:
        """Notes in the record that telemetry flushes and shuts down on the signal ``name``
        (``"SIGTERM"``), as truncated spans say it: with every span group off, the record
        alone tells a terminated process from one that exited. Any thread; never raises."""
        number = getattr(signal.Signals, name, None) if isinstance(name, str) else None
        if number is not None:
            self._hot[_record.SIGNAL] = float(number)
            self._sync()

    def shut_down(self) -> None:
        """Notes in the record that telemetry shut down now (a clean exit, an exception that
        ended the program, a signal's flush): the process did not die unseen."""
        self._hot[_record.SHUTDOWN_UNIX] = self._unix()
        self._sync()

    def reset(self) -> None:
        """Starts this ledger afresh, in place (a forked child does; so do tests): no phase
        open, no progress, times from process creation again."""
        self.__init__(perf=self._perf, unix=self._unix)

    @property
    def created_unix_s(self) -> float:
        """When the process started (the origin of the phase times), Unix seconds."""
        return self._created_unix


#: The ledger of this process (started afresh in a forked child, in place).
LEDGER = Ledger()


def record_in(directory: str, resource: Mapping[str, object]) -> str | None:
    """Keeps :data:`LEDGER`'s hot state in a record file of the run directory ``directory``
    (:mod:`otel_training.health.record`), named by the rank and the process tag of
    ``resource`` (the pipeline's resource attributes). Returns its path, or ``None`` when it
    cannot be created (a warning says why; health then rests on the exports). Called by
    ``configure()`` on its thread; never raises."""
    rank = resource.get("dl.rank")
    instance = str(resource.get("service.instance.id") or "")
    tag = instance.rsplit("-", 1)[-1] if instance else str(os.getpid())
    path = os.path.join(directory, _record.file_name(rank if isinstance(rank, int) else 0, tag))
    identity = {
        key: resource.get(key)
        for key in (
            "service.instance.id",
            "dl.rank",
            "dl.world_size",
            "dl.job.id",
            "dl.run.id",
            "dl.run.attempt",
        )
    }
    identity["created_s"] = LEDGER.created_unix_s
    try:
        LEDGER.record_to(path, identity)
    except (OSError, ValueError) as error:
        _LOG.warning(
            "otel-training: the progress record %s could not be created (%s); after a kill, "
            "health figures rest on the last export",
            path,
            error,
        )
        return None
    return path


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) starts now: no /proc read on every fork.
    LEDGER.__init__(clock.unix_s(), perf=LEDGER._perf, unix=LEDGER._unix)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
