"""Goodput and badput of a job over all of its attempts (``docs/health.md``, "Goodput").

The one place goodput is defined; ``otel-training health`` and the report call
:func:`account`. Per attempt i (:class:`~otel_training.health.evidence.Attempt`), from a
reference rank (the lowest rank that exported the ledger until within one export interval of
the attempt's end):

- ``S_i``: the first ``process.creation.time`` of its processes; ``E_i``: their last evidence
  of life (cut at ``S_{i+1}`` when attempts overlap). Wall time ``W = E_n - S_1``.
- ``downtime``: ``S_{i+1} - E_i``, the gaps with no process of the job alive.
- The reference rank's ledger splits ``[its creation, E_i]`` into the phases of
  ``dl.training.phase`` (cumulative at each export; between exports the phase spans place
  ``checkpoint_save``, ``checkpoint_load``, ``evaluate`` and ``warmup`` in time and the step
  phases fill the rest; after the last export the spans do, and the step phases fill the rest
  in the attempt's proportions). Time before the reference rank was created is ``startup``.
- Rollbacks: ``r_i``, the step up to which attempt i's progress is kept, is the lowest step
  that any later attempt restored (``dl.training.checkpoint.iteration{operation=load}`` of
  attempt j; without a load, its first iteration - 1): ``r_i = min over j > i``, the attempts
  that tell none left out (:func:`restore_points`). A later rollback to an older checkpoint
  (after a loss spike, a corrupt newest checkpoint) discards the steps after it of every
  earlier attempt, each counted once, as Google's ml-goodput-measurement splits on
  regressions of the step number.
- ``b_i``: when step ``r_i`` completed. The step phases (``warmup``, ``data_loading``,
  ``forward_backward``, ``optimizer``, ``communication``, ``other``) after ``b_i`` are
  ``lost_progress``: the steps after ``r_i``, and the cut tail (the step in flight when the
  attempt ended). The last attempt loses nothing.
- ``hang``: when at ``E_i`` the reference rank's progress age (``E_i`` minus its last completed
  step) exceeded H for its phase (:mod:`otel_training.health.hang`), everything from that last
  step to ``E_i`` (instead of ``lost_progress`` or any other bucket).
- ``warmup_excess``: the first step of the process minus the attempt's median step
  (:func:`otel_training.health.hang.median_step_s`), when that step is kept; the rest of it is
  productive.
- Of the kept steps: ``data_wait`` = ``data_loading``; productive = ``forward_backward +
  optimizer + communication`` (+ the warm-up step less its excess); ``other`` = ``other``.
- ``startup``, ``checkpoint_load``, ``checkpoint_save``, ``evaluate``: their phases.
- ``other`` is then ``W`` minus productive minus the other buckets, so that the buckets and
  productive time add up to ``W`` exactly, none of them negative.
- An attempt whose ranks exported no ledger (killed before its first metric export) is placed
  by the phase spans of its lowest rank that wrote them (:func:`reference_process`): startup
  until its first iteration (less its loads), its loads, saves, evaluations and warm-up step
  where their spans are, the rest ``other``; without phase spans either, all ``other``.
- Each attempt counts, however short: twenty attempts of a crash loop are twenty attempts,
  their time in ``startup``, ``checkpoint_load``, ``lost_progress`` (what they ran after a
  step a later attempt restored) and ``downtime``.

``goodput = productive / W``. Also per attempt, Meta's time-to-start (its first step's end
minus ``S_i``) and time-to-recover (the first step's end of attempt i+1 minus ``E_i``); a
first step's end is the end of its first iteration or warm-up span that completed (not
raised, not truncated), else when its first step completed as ``b_i`` is dated
(:func:`completion_s`). An attempt that completed no step has no time to start, and the
attempt before it no time to recover.

How an attempt ended (:data:`ENDINGS`), the first that applies:

- ``running`` (its last evidence is within two export intervals of now and not every process
  shut down; the last attempt only: once a later attempt has started, an attempt is never
  running);
- ``hung`` (hung at its end, :mod:`otel_training.health.hang`);
- ``sigterm`` (spans truncated on that signal);
- ``failed`` (a phase raised and no step completed after it: on the reference rank, or on
  any rank of an attempt that completed no step, such as a crash at startup or in its first
  iteration);
- ``killed`` (spans left open: no shutdown ran);
- ``failed`` also when a shutdown ran inside a phase (spans truncated at exit without a
  signal: an exception left it);
- ``completed`` (the last attempt, when every process shut down cleanly after at least one
  step completed);
- ``exited`` (the others: an attempt before the last that shut down cleanly, a last one that
  completed no step).

Nothing here raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from otel_training.health import hang as _hang
from otel_training.health.evidence import Attempt, Process
from otel_training.health.timeline import (
    CHECKPOINT_LOAD,
    COMM,
    DATA,
    EVALUATE,
    FB,
    LOOP,
    OPT,
    SAVE,
    STARTUP,
    WARMUP,
    Timeline,
    attempt_longest_phase_s,
    completion_s,
    first_iteration,
    first_step_end_s,
    last_progress,
    loaded_iteration,
    longest_phase_s,
    median_step_s,
    open_at_end,
    phase_at_end,
    progress_events,
    raised,
    reference_process,
)

__all__ = [
    "BUCKETS",
    "AttemptAccount",
    "JobAccount",
    "account",
    "Timeline",
    "completion_s",
    "is_live",
    "last_progress",
    "attempt_longest_phase_s",
    "longest_phase_s",
    "median_step_s",
    "open_at_end",
    "phase_at_end",
    "progress_events",
    "reference_process",
    "restore_points",
]

#: The badput buckets, in the order of the JSON and the report.
BUCKETS: Final = (
    "startup",
    "checkpoint_load",
    "warmup_excess",
    "checkpoint_save",
    "evaluate",
    "data_wait",
    "lost_progress",
    "hang",
    "downtime",
    "other",
)
#: How an attempt ended (:attr:`AttemptAccount.ended`).
ENDINGS: Final = ("running", "hung", "completed", "exited", "killed", "failed", "sigterm")


@dataclass
class AttemptAccount:
    """One attempt's share of the job's wall time (the module docstring).

    Attributes:
        attempt: ``dl.run.attempt``, else its position.
        numbered: ``attempt`` is ``dl.run.attempt``.
        run_id: Its ``dl.run.id``.
        start_s: ``S_i``, Unix seconds.
        end_s: ``E_i`` (cut at the next attempt's start), Unix seconds.
        reference_rank: The rank its account is taken from, or ``None`` (no ledger).
        ranks: Its ranks.
        resumed_from: The iteration its checkpoint load restored, or ``None``.
        last_iteration: The last step it completed, or ``None``.
        ended: How it ended, one of :data:`ENDINGS`.
        productive_s: Productive seconds.
        buckets: Seconds per bucket of :data:`BUCKETS` (its ``downtime`` is the gap after it).
        lost_iterations: ``(first, last)`` completed steps lost, or ``None``.
        median_step_s: Its median step, seconds, or ``None``.
        hang_threshold_s: H at its end, seconds.
        first_step_end_s: When its first step completed, Unix seconds, or ``None``.
        time_to_start_s: ``first_step_end_s - start_s``, or ``None``.
        time_to_recover_s: The next attempt's first step end minus ``end_s``, or ``None``.
        cohort: Its cohort within its attempt number (an elastic membership change, 0 first).
        world_size: The ``dl.world_size`` of its processes, or ``None``.
    """

    attempt: int
    numbered: bool
    run_id: str | None
    start_s: float
    end_s: float
    reference_rank: int | None
    ranks: list[int]
    resumed_from: int | None = None
    last_iteration: int | None = None
    ended: str = "exited"
    productive_s: float = 0.0
    buckets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    lost_iterations: tuple[int, int] | None = None
    median_step_s: float | None = None
    hang_threshold_s: float | None = None
    first_step_end_s: float | None = None
    time_to_start_s: float | None = None
    time_to_recover_s: float | None = None
    cohort: int = 0
    world_size: int | None = None

    @property
    def label(self) -> str:
        """How a person reads it: ``3``, or ``3.1`` for the second cohort of attempt 3."""
        return f"{self.attempt}.{self.cohort}" if self.cohort else str(self.attempt)

    @property
    def wall_s(self) -> float:
        """Its seconds: ``end_s - start_s`` plus the downtime after it."""
        return self.end_s - self.start_s + self.buckets["downtime"]


@dataclass
class JobAccount:
    """The job's goodput (the module docstring).

    Attributes:
        start_s: ``S_1``, Unix seconds.
        end_s: ``E_n``, Unix seconds.
        wall_s: ``W``, seconds.
        productive_s: Productive seconds.
        goodput: ``productive_s / wall_s`` (0 for an empty job).
        buckets: Seconds per bucket of :data:`BUCKETS`.
        attempts: Per attempt.
        notes: What limited the account, for a person.
    """

    start_s: float
    end_s: float
    wall_s: float
    productive_s: float
    goodput: float
    buckets: dict[str, float]
    attempts: list[AttemptAccount]
    notes: list[str] = field(default_factory=list)


# -- the account ------------------------------------------------------------------------------


def account(
    attempts: Sequence[Attempt],
    policy: _hang.HangPolicy | None = None,
    *,
    now_s: float | None = None,
    live_s: float | None = None,
    hung_at: Callable[[Attempt, float], bool] | None = None,
) -> JobAccount:
    """Goodput and badput of the job whose attempts are ``attempts`` (ordered).

    Args:
        attempts: The job's attempts, ordered (:func:`otel_training.health.evidence.attempts`).
        policy: The hang thresholds (default: the defaults).
        now_s: Now, Unix seconds: an attempt whose last evidence is within ``live_s`` of it is
            ``running`` (``None``: none is).
        live_s: How recent the last evidence of a running attempt is, seconds (default: two
            export intervals plus a second).
        hung_at: Whether an attempt's ranks were hung at a moment (Unix seconds): the job's
            hang verdict over all of its ranks, waiting peers excused
            (:func:`otel_training.report.health_incidents.judge_attempt`), so that the ``hang``
            bucket and the verdict agree. ``None``: the reference rank's progress age against its H
            alone.
    """
    policy = policy or _hang.HangPolicy()
    notes: list[str] = []
    if not attempts:
        return JobAccount(0.0, 0.0, 0.0, 0.0, 0.0, dict.fromkeys(BUCKETS, 0.0), [], notes)
    starts = [a.start_s for a in attempts]
    ends = [a.end_s for a in attempts]
    points = restore_points(attempts)
    accounts: list[AttemptAccount] = []
    for i, attempt in enumerate(attempts):
        end = min(ends[i], starts[i + 1]) if i + 1 < len(attempts) else ends[i]
        end = max(end, starts[i])
        last = i + 1 == len(attempts)
        accounts.append(
            _attempt(
                attempt, starts[i], end, last, points[i], policy, now_s, live_s, notes, hung_at
            )
        )
    for i, item in enumerate(accounts):
        if i + 1 < len(accounts):
            item.buckets["downtime"] = max(0.0, starts[i + 1] - ends[i])
            next_first = accounts[i + 1].first_step_end_s
            if next_first is not None:
                item.time_to_recover_s = next_first - ends[i]
    start, end = starts[0], max(a.end_s for a in accounts)
    wall = end - start
    buckets = {b: sum(a.buckets[b] for a in accounts) for b in BUCKETS}
    productive = sum(a.productive_s for a in accounts)
    return JobAccount(
        start, end, wall, productive, productive / wall if wall > 0 else 0.0, buckets,
        accounts, notes,
    )  # fmt: skip


def _attempt(
    attempt: Attempt,
    start: float,
    end: float,
    last: bool,
    restored: int | None,
    policy: _hang.HangPolicy,
    now_s: float | None,
    live_s: float | None,
    notes: list[str],
    hung_at: Callable[[Attempt, float], bool] | None = None,
) -> AttemptAccount:
    ranks = sorted({p.rank for p in attempt.processes})
    run_ids = attempt.run_ids
    item = AttemptAccount(
        attempt.number, attempt.numbered, run_ids[0] if run_ids else None, start, end, None, ranks
    )
    item.cohort = attempt.cohort
    sizes = {p.resource.get("dl.world_size") for p in attempt.processes}
    item.world_size = next((n for n in sizes if isinstance(n, int)), None)
    reference = reference_process(attempt, attempt.end_s)
    if reference is None:
        reference = reference_process(attempt, attempt.end_s, by_spans=True)
        if reference is None:
            item.buckets["other"] = end - start
            notes.append(
                f"Attempt {attempt.label}: no rank exported the health ledger "
                "(dl.training.phase.time) and none wrote a phase span; its time is counted as "
                "other."
            )
            live = last and is_live(attempt, now_s, live_s)
            item.ended = _ending(attempt, None, False, last, live)
            return item
        notes.append(
            f"Attempt {attempt.label}: no rank exported the health ledger "
            "(dl.training.phase.time; it ended before its first metric export, or an older "
            f"version wrote it); rank {reference.rank}'s phase spans place its time: startup "
            "until its first iteration, its checkpoint loads and saves, evaluations and "
            "warm-up step; the rest is counted as other."
        )
    item.reference_rank = reference.rank
    timeline = Timeline(reference)
    item.resumed_from = loaded_iteration(reference)
    last_iteration, last_progress_s = last_progress(reference)
    item.last_iteration = last_iteration
    median = median_step_s(reference, timeline)
    item.median_step_s = median
    item.first_step_end_s = first_step_end_s(reference)
    if item.first_step_end_s is not None:
        item.time_to_start_s = item.first_step_end_s - start
    own_end = min(timeline.end, end)
    gap = max(end - own_end, 0.0)
    # the hang at the end: no progress for longer than H in the phase open then
    phase = phase_at_end(reference, timeline, own_end)
    threshold = policy.threshold_s(phase, median, attempt_longest_phase_s(attempt, phase, own_end))
    item.hang_threshold_s = threshold
    progress_at = last_progress_s if last_progress_s is not None else timeline.created
    # judged at its end, or while it runs at now as far as its files show (judged_at)
    live = last and is_live(attempt, now_s, live_s)
    judged = judged_at(attempt, now_s, live) if live else end
    hung = judged - progress_at > threshold
    if hung and hung_at is not None:  # the job's verdict: a rank waiting for a peer is excused
        hung = hung_at(attempt, judged)
    end_vec = timeline.at(own_end)
    if hung:
        cut_at = min(max(progress_at, timeline.created), own_end)
        cut_vec = timeline.at(cut_at)
        item.buckets["hang"] = sum(end_vec) - sum(cut_vec) + gap
        gap = 0.0
    else:
        cut_at, cut_vec = own_end, end_vec
    # the steps after the lowest step a later attempt restored are lost (restore_points)
    boundary = None
    first = _first_step(reference, attempt)
    if not last:
        if restored is None:
            notes.append(
                f"Attempt {attempt.label}: what the later attempts resumed from is not in the "
                "files (no checkpoint load, no iteration); no progress is counted as lost."
            )
        elif (item.resumed_from is not None and restored <= item.resumed_from) or (
            first is not None and restored < first
        ):
            boundary = timeline.created  # the next attempt kept no step of this one
        else:
            boundary = completion_s(reference, restored)
            if boundary is None and (last_iteration is None or restored < last_iteration):
                boundary = timeline.created
                notes.append(
                    f"Attempt {attempt.label}: when step {restored} completed is not in the "
                    "files; all of its steps are counted as lost."
                )
        if restored is not None and last_iteration is not None and last_iteration > restored:
            lost_from = max(restored + 1, first if first is not None else restored + 1)
            item.lost_iterations = (lost_from, last_iteration)
    keep_vec = cut_vec if boundary is None else timeline.at(min(boundary, cut_at))
    lost = sum(max(cut_vec[p] - keep_vec[p], 0.0) for p in LOOP)
    if boundary is not None:  # the reference rank ended first: the others' time is lost too
        lost += gap
    buckets = item.buckets
    buckets["startup"] = cut_vec[STARTUP] + max((reference.start_s or start) - start, 0.0)
    buckets["checkpoint_load"] = cut_vec[CHECKPOINT_LOAD]
    buckets["checkpoint_save"] = cut_vec[SAVE]
    buckets["evaluate"] = cut_vec[EVALUATE]
    buckets["lost_progress"] = lost
    warm = keep_vec[WARMUP]
    excess = max(warm - median, 0.0) if warm > 0 and median is not None else 0.0
    buckets["warmup_excess"] = excess
    buckets["data_wait"] = keep_vec[DATA]
    item.productive_s = (warm - excess) + keep_vec[FB] + keep_vec[OPT] + keep_vec[COMM]
    # the job was blocked as long as its slowest rank was in a pause, not the reference's
    keep_until = cut_at if boundary is None else min(boundary, cut_at)
    for phase, (kept, in_lost) in blocked_by_peers(attempt, reference, keep_until, cut_at).items():
        kept = min(kept, item.productive_s)
        in_lost = min(in_lost, buckets["lost_progress"])
        item.productive_s -= kept
        buckets["lost_progress"] -= in_lost
        buckets[_BUCKET_OF[phase]] += kept + in_lost
    known = item.productive_s + sum(v for k, v in buckets.items() if k not in ("other", "downtime"))
    buckets["other"] = max((end - start) - known, 0.0)  # the ledger's other, and the rest
    if known > (end - start) + 1e-6:  # rounding of the samples: take it from productive
        item.productive_s = max(item.productive_s - (known - (end - start)), 0.0)
    item.ended = _ending(attempt, reference, hung, last, live)
    return item


#: The bucket of each pause whose blocked time is the job's (:func:`blocked_by_peers`).
_BUCKET_OF = {SAVE: "checkpoint_save", EVALUATE: "evaluate", CHECKPOINT_LOAD: "checkpoint_load"}


def blocked_by_peers(
    attempt: Attempt, reference: Process, keep_until_s: float, cut_at_s: float
) -> dict[int, tuple[float, float]]:
    """The time the job was blocked by pauses beyond the reference rank's own, seconds, per
    pause phase (checkpoint save and load, evaluation): for each of the reference rank's
    pauses (its span, with its iteration), how much longer the longest span of the same phase
    and iteration on any rank of ``attempt`` lasted. The reference rank waited that long in
    the collective after it (communication, or inside forward/backward under DDP): the job
    could not train because of that pause, which is its badput. Durations, not end times, so
    that clocks of different hosts need not agree. Split as ``(kept, lost)``: of pauses that
    ended by ``keep_until_s`` (the wait is in kept step time) and of those after it, up to
    ``cut_at_s`` (in lost progress)."""
    longest: dict[tuple[int, int], float] = {}
    for process in attempt.processes:
        for span in process.spans:
            if span.phase in _BUCKET_OF and span.end_s is not None and span.iteration is not None:
                key = (span.phase, span.iteration)
                longest[key] = max(longest.get(key, 0.0), span.end_s - span.start_s)
    found: dict[int, tuple[float, float]] = {}
    for span in reference.spans:
        if span.phase not in _BUCKET_OF or span.end_s is None or span.iteration is None:
            continue
        if span.end_s > cut_at_s:
            continue
        extra = longest[(span.phase, span.iteration)] - (span.end_s - span.start_s)
        if extra <= 0:
            continue
        kept, lost = found.get(span.phase, (0.0, 0.0))
        if span.end_s <= keep_until_s:
            kept += extra
        else:
            lost += extra
        found[span.phase] = (kept, lost)
    return found


def restore_points(attempts: Sequence[Attempt]) -> list[int | None]:
    """Per attempt i, ``r_i`` (the module docstring's rollbacks): the step up to which its
    progress is kept, the lowest step that any later attempt restored (:func:`_restored`: its
    checkpoint load, else its first iteration - 1), ``min`` over j > i, the attempts that tell
    none left out. ``None`` for the last attempt, and where no later attempt tells."""
    found: list[int | None] = [None] * len(attempts)
    lowest: int | None = None
    for i in range(len(attempts) - 1, -1, -1):
        found[i] = lowest
        restored = _restored(attempts[i])
        if restored is not None and (lowest is None or restored < lowest):
            lowest = restored
    return found


def _restored(attempt: Attempt) -> int | None:
    """The iteration an attempt restored: its load, else its first step - 1."""
    loads = [x for x in (loaded_iteration(p) for p in attempt.processes) if x is not None]
    if loads:
        return min(loads)
    firsts = [x for x in (first_iteration(p) for p in attempt.processes) if x is not None]
    return min(firsts) - 1 if firsts else None


def is_live(attempt: Attempt, now_s: float | None, live_s: float | None = None) -> bool:
    """Whether ``attempt`` still runs at ``now_s``: its last evidence is within ``live_s``
    (default: two export intervals plus a second) and not every process shut down (a
    shutdown ends all of a process's spans, and notes itself in its progress record)."""
    if now_s is None:
        return False
    window = live_s
    if window is None:
        window = _hang.silence_s(max(p.export_interval_s for p in attempt.processes))
    closed = all(
        (p.spans and not p.open_spans) or (p.record is not None and p.record.shutdown_s is not None)
        for p in attempt.processes
    )
    return now_s - attempt.end_s <= window and not closed


def judged_at(attempt: Attempt, now_s: float | None, live: bool) -> float:
    """The moment ``attempt``'s hang is judged: its end (:attr:`Attempt.end_s`) when it ended;
    while it runs (``live``), ``now_s``, but never later than its latest evidence of life (an
    export, a line, a progress record's transition or its watchdog's note, any rank): the files
    never make a stall longer than they show it. A job whose every rank died in a long step
    reads as it stood when last seen, not hung for the seconds before it stops counting as
    running; a hung job's ranks (their exports, their watchdogs) keep the moment at now."""
    if not live or now_s is None:
        return attempt.end_s
    seen = attempt.end_s
    for process in attempt.processes:
        if process.record is not None:
            seen = max(seen, process.record.last_evidence_s)
    return min(now_s, seen)


def _first_step(process: Process, attempt: Attempt) -> int | None:
    """The first step ``process`` (the reference rank of ``attempt``) completed, for the steps
    a later attempt lost: the lowest its files show (:func:`first_iteration`), or lower, a step
    that a rank of the attempt saved after the load (the ranks step together; under DDP rank 0
    alone saves): with the per-step spans off, exports may begin long after the first step
    and show only later ones."""
    first = first_iteration(process)
    if first is None:
        return None
    loaded = loaded_iteration(process)
    saved = [
        i
        for rank in attempt.processes
        for i in [s.saved_iteration for s in rank.samples]
        + [s.iteration for s in rank.spans if s.phase == SAVE and not s.failed]
        if i is not None and (loaded is None or i > loaded)
    ]
    return min([first, *saved])


def _ending(attempt: Attempt, reference: Process | None, hung: bool, last: bool, live: bool) -> str:
    """How ``attempt`` ended (:data:`ENDINGS`, the module docstring)."""
    processes = attempt.processes
    if live:
        return "hung" if hung else "running"
    if hung:
        return "hung"
    ordered = ([reference] if reference is not None else []) + list(processes)
    for process in ordered:
        if process.signal:
            return process.signal.lower()
    stepped = any(first_iteration(p) is not None for p in processes)
    if (reference is not None and raised(reference)) or (
        not stepped and any(raised(p) for p in processes)
    ):
        return "failed"
    if any(p.open_spans for p in processes) or any(
        p.record is not None and p.record.shutdown_s is None for p in processes
    ):  # spans left open, or a progress record that no shutdown closed: it died unseen
        return "killed"
    if any(s.truncated for p in processes for s in p.spans):
        return "failed"  # its shutdown ran inside a phase: an exception left it
    return "completed" if last and stepped else "exited"
