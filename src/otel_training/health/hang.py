"""Hangs: the threshold H, stalled ranks, a hung job and its culprits (``docs/health.md``).

The one place these are defined. Each rank's watchdog (:mod:`otel_training.health.watchdog`)
applies :meth:`HangPolicy.threshold_s` to its own ledger and :func:`stalled` to it and the
peers whose progress records it reads; ``otel-training health`` and the
report apply it and :func:`judge` to the embedded default's files; the Prometheus rules of
``collector-config/rules/training.yaml`` are the same definitions in PromQL. Everything here is
pure arithmetic on numbers given by the caller: no clock, no I/O, nothing raises.

**Threshold.** H depends on the phase a rank is in (the ledger's innermost phase):

- a step phase (``data_loading``, ``forward_backward``, ``optimizer``, ``communication``,
  ``other``): ``max(5 x median step, floor)``, floor 60 s
  (``OTEL_PYTHON_TRAINING_HANG_FLOOR_S``); 5 is NVRx's safety factor;
- ``checkpoint_save``, ``checkpoint_load``, ``evaluate``: ``max(2 x the longest one seen on
  this rank, 600 s, the step threshold)`` (``OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S``), so
  a long save is no hang (FlagScale PR #1267);
- ``startup``, ``warmup``: ``max(1800 s, the step threshold)``
  (``OTEL_PYTHON_TRAINING_HANG_STARTUP_S``; NVRx's initial timeout).

The median step is :func:`median_step_s` of the rank's own samples.

**A waiting peer is not stalled.** While one rank saves a checkpoint (or loads one, evaluates,
starts, warms up), the others wait in the next collective, in a step phase, without progress.
Each rank's *pause age* is the time since its last pause (:data:`PAUSE_PHASES`) ended; a rank
in a pause is *paused* when its own progress age is within H for that pause, and its pause
ends, for its peers, at its latest evidence of life (0 while it is alive). The *attempt's
pause age* (:func:`pause_age_s`) is the least pause age over its ranks, leaving out a rank in
a pause past its H: a rank paused within its budget excuses the peers that wait for it, one
past it does not. A rank's *hang age* (:func:`hang_age_s`) is, in a pause, how long that
pause has been open (each pause has its own budget: a checkpoint load after a long start-up
is judged on the load alone), and in a step phase the lesser of its progress age and the
attempt's pause age: its steps' time counts from the end of the job's last pause. This is
what the Prometheus rules do (``run:dl_training_pause_end:timestamp``,
``rank:dl_training_hang_age:seconds``).

**Stalled, hung, culprits.** A rank is *stalled* when its hang age exceeds H for its phase
(:func:`stalled`); *silent* when its exports stopped (:func:`silence_s`) while another rank of
the attempt still exports (a GIL held by a C call, SIGSTOP, death). The job is *hung* when
every exporting rank is stalled (every rank, when none exports). Its culprits are the ranks of
the first of these rules that names any (:data:`CULPRIT_RULES`):

1. ``silent``: the silent ranks;
2. ``pause_over_budget``: the ranks in a pause past its H (a save that never finishes), while
   some rank is not in a pause (it waits for them);
3. ``outside_communication``: while at least half of the ranks are in ``communication``, the
   ranks that are not (they never reached the collective the others wait in);
4. ``lowest_progress``: the ranks with the lowest progress iteration, when the ranks differ;
5. ``behind_in_step``: when every rank has the same progress iteration, the ranks in a step
   phase earliest in :data:`STEP_ORDER` (``other`` between steps, then ``data_loading``,
   ``forward_backward``, ``communication``, ``optimizer``), when the ranks' step phases
   differ. Under DistributedDataParallel or FSDP the collectives run inside
   ``forward_backward``: the ranks wait there for the rank still loading its data (or
   between steps), which never reached the collective.
6. ``outside_collective`` (:data:`STACK_CULPRIT_RULES`; ``otel-training health`` and the
   report only: a Python stack is no metric the rules can read): when the watchdogs' stacks
   of this stall show some ranks' training threads at a collective (:func:`at_collective`: a
   ``torch.distributed`` call, or autograd's backward pass, inside which DDP's and FSDP's
   collectives run) and others' not, the others. Under DistributedDataParallel without
   :func:`otel_training.integrations.ddp.register_comm_hook`, a rank that blocks in its
   forward pass has the same phase and iteration as its peers waiting in the backward pass's
   all-reduce: only the stacks tell it.

Rules 2-6 name the ranks that are not where the others wait; a job whose ranks all wait at
the same place (same iteration, same phase, every stack at a collective or none known: a
collective that never completes everywhere) has no culprit (``rule`` ``None``): nothing
tells them apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "CULPRIT_RULES",
    "DEFAULT_FLOOR_S",
    "DEFAULT_PHASE_BUDGET_S",
    "DEFAULT_STARTUP_S",
    "INITIAL_PHASES",
    "LONG_PHASES",
    "PAUSE_PHASES",
    "STACK_CULPRIT_RULES",
    "STEP_ORDER",
    "STEP_PHASES",
    "HangPolicy",
    "HangVerdict",
    "RankState",
    "at_collective",
    "hang_age_s",
    "judge",
    "median_step_s",
    "pause_age_s",
    "silence_s",
    "stalled",
    "unchanged_for_s",
]

#: Floor of H in a step phase, seconds (``OTEL_PYTHON_TRAINING_HANG_FLOOR_S``).
DEFAULT_FLOOR_S: Final = 60.0
#: Least H of a checkpoint save or load or an evaluation, seconds
#: (``OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S``).
DEFAULT_PHASE_BUDGET_S: Final = 600.0
#: H of startup and warm-up, seconds (``OTEL_PYTHON_TRAINING_HANG_STARTUP_S``).
DEFAULT_STARTUP_S: Final = 1800.0
#: H in a step phase is this many median steps (NVRx's safety factor), at least the floor.
STEP_FACTOR: Final = 5.0
#: H in a long phase is this many times the longest one of that phase seen on the rank.
PHASE_FACTOR: Final = 2.0
#: The phases of a training step, and ``other`` (between steps).
STEP_PHASES: Final = frozenset(
    {"data_loading", "forward_backward", "optimizer", "communication", "other"}
)
#: Phases that may legitimately last long without progress: their own budget.
LONG_PHASES: Final = frozenset({"checkpoint_save", "checkpoint_load", "evaluate"})
#: Before the first step of a process completes.
INITIAL_PHASES: Final = frozenset({"startup", "warmup"})
#: The pauses: the phases that are no training (a peer waits while a rank is in one).
PAUSE_PHASES: Final = INITIAL_PHASES | LONG_PHASES
#: The phases summed per step for the median step (a step's own time; ``other`` and the long
#: phases are not part of a step).
STEP_TIME_PHASES: Final = ("data_loading", "forward_backward", "optimizer", "communication")
#: A rank is silent after this many export intervals without an export (plus one second).
SILENT_INTERVALS: Final = 2.0
#: Rule 2 applies while at least this share of the ranks is in ``communication``.
COMMUNICATION_MAJORITY: Final = 0.5
#: The culprit rules, in order of precedence.
CULPRIT_RULES: Final = (
    "silent",
    "pause_over_budget",
    "outside_communication",
    "lowest_progress",
    "behind_in_step",
)
#: The culprit rules after :data:`CULPRIT_RULES` that read the watchdogs' Python stacks
#: (``otel-training health`` and the report; not the Prometheus rules).
STACK_CULPRIT_RULES: Final = ("outside_collective",)
#: A frame of a formatted stack in one of these files stands at a collective
#: (:func:`at_collective`): torch.distributed's calls.
COLLECTIVE_FILES: Final = ("/torch/distributed/",)
#: ... or in one of these functions of autograd's files: the backward pass, inside which
#: DistributedDataParallel's and FSDP's collectives run (their hooks fire from the engine).
BACKWARD_FUNCTIONS: Final = ("backward", "_engine_run_backward", "run_backward")
#: Where a rank is within one step (same progress iteration), earliest first: ``other``
#: (between steps, after the last completed one), then the phases of a step in the order
#: they run. A rank earlier in this order has not reached the collective its peers wait in.
STEP_ORDER: Final = ("other", "data_loading", "forward_backward", "communication", "optimizer")


@dataclass(frozen=True)
class HangPolicy:
    """The numbers of H (see the module docstring), all in seconds.

    Attributes:
        floor_s: Least H in a step phase.
        phase_budget_s: Least H in ``checkpoint_save``, ``checkpoint_load``, ``evaluate``.
        startup_s: H in ``startup`` and ``warmup``.
        step_factor: H in a step phase is this many median steps.
        phase_factor: H in a long phase is this many times the longest one seen.
    """

    floor_s: float = DEFAULT_FLOOR_S
    phase_budget_s: float = DEFAULT_PHASE_BUDGET_S
    startup_s: float = DEFAULT_STARTUP_S
    step_factor: float = STEP_FACTOR
    phase_factor: float = PHASE_FACTOR

    def step_threshold_s(self, median_step_s: float | None) -> float:
        """H in a step phase: ``max(step_factor x median_step_s, floor_s)``; the floor while
        the median step is not known (``None``)."""
        if median_step_s is None or not median_step_s > 0:
            return self.floor_s
        return max(self.step_factor * median_step_s, self.floor_s)

    def threshold_s(
        self,
        phase: str | None,
        median_step_s: float | None = None,
        longest_s: float | None = None,
    ) -> float:
        """H for a rank whose innermost phase is ``phase``.

        Args:
            phase: A value of ``dl.training.phase`` (``None`` or another value: a step phase).
            median_step_s: The rank's median step time, seconds (:func:`median_step_s`).
            longest_s: The longest completed occurrence of ``phase`` seen on the rank,
                seconds (used for the long phases).
        """
        step = self.step_threshold_s(median_step_s)
        if phase in LONG_PHASES:
            longest = self.phase_factor * longest_s if longest_s and longest_s > 0 else 0.0
            return max(longest, self.phase_budget_s, step)
        if phase in INITIAL_PHASES:
            return max(self.startup_s, step)
        return step


def median_step_s(samples: Iterable[tuple[float, float]]) -> float | None:
    """The median step time, seconds, of one rank from samples ``(iteration, step time)``
    taken over time: ``iteration`` its progress (last completed optimizer step), ``step time``
    its cumulative ``data_loading + forward_backward + optimizer + communication`` phase time
    (:data:`STEP_TIME_PHASES`). Each pair of consecutive samples whose iteration advanced
    gives one mean step (step time gained / iterations gained); the median of those. ``None``
    with fewer than one such pair. Samples taken while the warm-up step ran (its time is the
    ``warmup`` phase, not a step phase) give short means: leave out samples before the first
    completed step."""
    means = []
    previous: tuple[float, float] | None = None
    for iteration, total in samples:
        if previous is not None and iteration > previous[0] and total >= previous[1]:
            means.append((total - previous[1]) / (iteration - previous[0]))
        previous = (iteration, total)
    return statistics.median(means) if means else None


def silence_s(export_interval_s: float) -> float:
    """Seconds without an export after which a rank is silent: two export intervals plus one
    second (an export that is late by less than an interval is not silence)."""
    return SILENT_INTERVALS * max(export_interval_s, 0.0) + 1.0


@dataclass(frozen=True)
class RankState:
    """One rank as a judge of a hang sees it, at one moment.

    Attributes:
        rank: ``dl.rank``.
        phase: Its innermost phase at its last export (``dl.training.phase.elapsed > 0``).
        progress_age_s: Seconds from its last completed step (or load, or process start) to
            the moment judged.
        threshold_s: H for ``phase`` on this rank (:meth:`HangPolicy.threshold_s`).
        iteration: Its progress iteration, or ``None`` before any.
        silent: Its exports stopped while another rank's go on (see :func:`silence_s`).
        pause_age_s: Seconds from the end of its last pause (:data:`PAUSE_PHASES`) to the
            moment judged; in a pause, from its latest evidence of life (an export, a record's
            transition or heartbeat: about 0 while it is alive); ``None`` when not known.
        open_s: Seconds its innermost phase has been open at the moment judged; in a pause
            its age compared with H (:func:`hang_age_s`). ``None`` when not known: its
            progress age stands in.
        at_collective: Its training thread's stack in this stall (the watchdog's ``stacks``
            record) is at a collective (:func:`at_collective`); ``None`` when no stack of
            this stall is known.
    """

    rank: int
    phase: str
    progress_age_s: float
    threshold_s: float
    iteration: int | None = None
    silent: bool = False
    pause_age_s: float | None = None
    at_collective: bool | None = None
    open_s: float | None = None

    @property
    def own_age_s(self) -> float:
        """Its age without its peers' pauses: in a pause, how long the pause has been open
        (:attr:`open_s`, else its progress age); in a step phase, its progress age. Never
        raises."""
        if self.phase in PAUSE_PHASES and self.open_s is not None:
            return self.open_s
        return self.progress_age_s

    @property
    def stalled(self) -> bool:
        """Its :attr:`own_age_s` exceeds H for its phase, the pauses of its peers aside (what
        :func:`stalled` says of a rank alone). Never raises."""
        return self.own_age_s > self.threshold_s

    @property
    def paused(self) -> bool:
        """It is in a pause (:data:`PAUSE_PHASES`) within that pause's H: it excuses the
        peers that wait for it. Never raises."""
        return self.phase in PAUSE_PHASES and not self.stalled


def at_collective(stack: str) -> bool:
    """Whether a stack formatted by :func:`traceback.format_stack` (outermost frame first)
    stands at a collective: one of its frames is in a file under :data:`COLLECTIVE_FILES`,
    or in a function of :data:`BACKWARD_FUNCTIONS` in a file under ``/torch/autograd/``.
    Paths are compared with ``/`` separators. Any thread; never raises."""
    for line in str(stack).splitlines():
        line = line.strip()
        if not line.startswith('File "'):
            continue
        path, _, rest = line[6:].partition('"')
        path = path.replace("\\", "/")
        if any(part in path for part in COLLECTIVE_FILES):
            return True
        function = rest.rpartition(" in ")[2].strip()
        if "/torch/autograd/" in path and function in BACKWARD_FUNCTIONS:
            return True
    return False


def pause_age_s(states: Iterable[RankState]) -> float | None:
    """The attempt's pause age, seconds: the least :attr:`RankState.pause_age_s` over the
    ranks of one attempt, leaving out a rank in a pause past its H (it excuses no one);
    ``None`` when no rank's is known. Any thread; never raises."""
    ages = [
        s.pause_age_s
        for s in states
        if s.pause_age_s is not None and (s.phase not in PAUSE_PHASES or s.paused)
    ]
    return max(min(ages), 0.0) if ages else None


def hang_age_s(state: RankState, attempt_pause_age_s: float | None) -> float:
    """The age compared with H, seconds: in a pause, how long it has been open
    (:attr:`RankState.own_age_s`); in a step phase, the lesser of its progress age and
    ``attempt_pause_age_s`` (:func:`pause_age_s` of its attempt; ``None``: its progress age).
    Any thread; never raises."""
    if state.phase in PAUSE_PHASES or attempt_pause_age_s is None:
        return state.own_age_s
    return min(state.progress_age_s, attempt_pause_age_s)


def stalled(state: RankState, states: Sequence[RankState] = ()) -> bool:
    """``state``'s rank is stalled: its hang age, with the pauses of ``states`` (the ranks of
    its attempt; ``state`` among them or not), exceeds H for its phase. Any thread; never
    raises."""
    return hang_age_s(state, pause_age_s([state, *states])) > state.threshold_s


def unchanged_for_s(state: RankState, states: Sequence[RankState] = ()) -> float:
    """Seconds for which ``state``'s rank, not stalled now with the pauses of ``states``,
    stays so without new evidence: until its hang age reaches H (the attempt's pause age grows
    no faster than time), or until a paused rank's pause passes its H (it then stops excusing),
    whichever comes first. 0 when it is stalled now. A caller that reads its peers' evidence
    less often (the watchdog) may wait this long; evidence that arrives meanwhile (a rank
    entering a pause, a step completing) only lowers the ages. Any thread; never raises."""
    everyone = [state, *states]
    left = state.threshold_s - hang_age_s(state, pause_age_s(everyone))
    if left < 0:
        return 0.0
    if state.phase not in PAUSE_PHASES:
        for other in everyone:
            if other.paused:
                left = min(left, other.threshold_s - other.own_age_s)
    return max(left, 0.0)


@dataclass(frozen=True)
class HangVerdict:
    """What :func:`judge` found.

    Attributes:
        stalled_ranks: Ranks whose progress age exceeds H for their phase, ascending.
        silent_ranks: Ranks whose exports stopped while others' go on, ascending.
        hung: Every exporting rank (every rank, when none exports) is stalled.
        culprits: The ranks named by the first rule of :data:`CULPRIT_RULES` and then
            :data:`STACK_CULPRIT_RULES` that names any (empty when the job is not hung).
        rule: That rule, or ``None``.
        since_s: Seconds since the last progress of any rank (the smallest progress age).
        phases: Each rank's innermost phase.
    """

    stalled_ranks: tuple[int, ...]
    silent_ranks: tuple[int, ...]
    hung: bool
    culprits: tuple[int, ...]
    rule: str | None
    since_s: float
    phases: Mapping[int, str] = field(default_factory=dict)


def judge(states: Sequence[RankState]) -> HangVerdict:
    """Stalled ranks, whether the job is hung, and its culprits (the module docstring's
    rules, a waiting peer's excuse included), from the ranks of one attempt. Any thread;
    never raises."""
    ranks = sorted(states, key=lambda s: s.rank)
    pause = pause_age_s(ranks)
    over = [s for s in ranks if hang_age_s(s, pause) > s.threshold_s]
    stalled_ranks = tuple(s.rank for s in over)
    silent = tuple(s.rank for s in ranks if s.silent)
    exporting = [s for s in ranks if not s.silent] or ranks
    over_ids = {id(s) for s in over}
    hung = bool(exporting) and all(id(s) in over_ids for s in exporting)
    since = min((s.progress_age_s for s in ranks), default=0.0)
    phases = {s.rank: s.phase for s in ranks}
    culprits: tuple[int, ...] = ()
    rule = None
    if hung:
        rule, culprits = _culprits(ranks)
    return HangVerdict(stalled_ranks, silent, hung, culprits, rule, max(since, 0.0), phases)


def _culprits(ranks: Sequence[RankState]) -> tuple[str | None, tuple[int, ...]]:
    silent = [s.rank for s in ranks if s.silent]
    if silent and len(silent) < len(ranks):
        return "silent", tuple(silent)
    over = [s.rank for s in ranks if s.phase in PAUSE_PHASES and s.stalled]
    if over and any(s.phase not in PAUSE_PHASES for s in ranks):
        return "pause_over_budget", tuple(over)
    in_communication = sum(1 for s in ranks if s.phase == "communication")
    if in_communication and in_communication >= COMMUNICATION_MAJORITY * len(ranks):
        outside = [s.rank for s in ranks if s.phase != "communication"]
        if outside:
            return "outside_communication", tuple(outside)
    known = [s for s in ranks if s.iteration is not None]
    iterations = {s.iteration for s in known}
    if len(iterations) > 1 or (known and len(known) < len(ranks)):
        lowest = min(iterations) if iterations else None
        # a rank with no progress at all is behind every rank with some
        behind = [s.rank for s in ranks if s.iteration is None] or [
            s.rank for s in known if s.iteration == lowest
        ]
        return "lowest_progress", tuple(behind)
    positions = {s.rank: STEP_ORDER.index(s.phase) for s in ranks if s.phase in STEP_ORDER}
    if len(set(positions.values())) > 1:
        first = min(positions.values())
        return "behind_in_step", tuple(r for r, at in positions.items() if at == first)
    known = [s for s in ranks if s.at_collective is not None]
    if any(s.at_collective for s in known):
        outside = tuple(s.rank for s in known if not s.at_collective)
        if outside:
            return "outside_collective", outside
    return None, ()
