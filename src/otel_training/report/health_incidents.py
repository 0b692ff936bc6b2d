"""The incidents of a job's health: a hang with when it began, its culprits and where they are
stuck, and stragglers with their cause, one :class:`otel_training.health.incidents.Incident`
each, as ``otel-training health``, the report and the rules show them (``docs/health.md``,
"Incidents"). Called by :func:`otel_training.report.health.assess`; nothing here raises on a
file.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from otel_training.health import goodput as _goodput
from otel_training.health import hang as _hang
from otel_training.health import incidents as _incidents
from otel_training.health import ledger as _ledger
from otel_training.health import straggler as _straggler
from otel_training.health.evidence import Attempt, PhaseSpan, Process
from otel_training.health.ledger import PHASES
from otel_training.report.job_health import AttemptHealth


def judge_attempt(attempt: Attempt, at_s: float, policy: _hang.HangPolicy) -> _hang.HangVerdict:
    """The hang verdict of ``attempt``'s ranks at ``at_s`` (:func:`otel_training.health.hang.
    judge`): each rank's progress age from the last progress its files show before ``at_s``,
    its phase from its last export (or a phase span started after it), silent when its last
    export is older than :func:`otel_training.health.hang.silence_s` while another rank's is
    not; its pause age from :func:`pause_end_s`, or, in a pause, from its last export (the
    definitions apply the pauses of the attempt: a rank that waits for a paused peer is not
    stalled). Never raises."""
    processes = [p for p in attempt.processes if p.samples]
    last_export = {
        id(p): max((s.time_s for s in p.samples if s.time_s <= at_s), default=None)
        for p in processes
    }
    quiet = {
        id(p): last_export[id(p)] is None
        or at_s - last_export[id(p)] > _hang.silence_s(p.export_interval_s)  # type: ignore[operator]
        for p in processes
    }
    anyone_exports = not all(quiet.values())
    longest: dict[str, float | None] = {}  # the attempt's, per phase: once, not once a rank
    states = []
    for process in processes:
        iteration, progress = _goodput.last_progress(process, at_s)
        if progress is None:
            progress = process.start_s or process.samples[0].time_s
        timeline = _goodput.Timeline(process)
        phase, opened = _goodput.open_at_end(process, timeline, min(at_s, timeline.end))
        if phase not in longest:
            longest[phase] = _goodput.attempt_longest_phase_s(attempt, phase, at_s)
        if phase in _hang.PAUSE_PHASES:
            seen = last_export[id(process)]
            pause_age = None if seen is None else max(at_s - seen, 0.0)
        else:
            ended = pause_end_s(process, at_s)
            pause_age = None if ended is None else max(at_s - ended, 0.0)
        states.append(
            _hang.RankState(
                rank=process.rank,
                phase=phase,
                progress_age_s=max(at_s - progress, 0.0),
                threshold_s=policy.threshold_s(
                    phase,
                    _goodput.median_step_s(process, timeline),
                    longest[phase],
                ),
                iteration=iteration,
                silent=quiet[id(process)] and anyone_exports,
                pause_age_s=pause_age,
                at_collective=_at_collective(process, progress, at_s),
                open_s=None if opened is None else max(at_s - opened, 0.0),
            )
        )
    return _hang.judge(states)


def _at_collective(process: Process, since_s: float, at_s: float) -> bool | None:
    """Whether the training thread of ``process``'s latest ``stacks`` record written in
    [``since_s``, ``at_s``] (this stall) stands at a collective
    (:func:`otel_training.health.hang.at_collective`); ``None`` without one."""
    for record in reversed(process.stacks):
        written = stack_time(record)
        if written is None or not since_s <= written <= at_s:
            continue
        threads = record.get("threads")
        training = [
            t for t in threads if isinstance(t, Mapping) and t.get("training") is True
        ] if isinstance(threads, list) else []  # fmt: skip
        if training and isinstance(training[0].get("stack"), str):
            return _hang.at_collective(training[0]["stack"])
        return None
    return None


_PAUSE_CODES = frozenset(PHASES.index(p) for p in _hang.PAUSE_PHASES)


def hang_incidents(
    item: AttemptHealth,
    judged_s: float,
    policy: _hang.HangPolicy,
    later: Sequence[_incidents.Restart] = (),
    live: bool = False,
) -> list[_incidents.Incident]:
    """The hangs of one attempt (:mod:`otel_training.health.incidents`): each stretch without
    progress of any of its ranks, longer than the hang floor and ended by progress, whose
    verdict judged at the last export inside it is hung; and the hang at ``judged_s`` (its end,
    or now while it runs) when ``item.hang`` is hung, recovered by the first of ``later`` (the
    attempts after it) that completed a step. Each verdict is :func:`judge_attempt` of the
    files as they stood at that moment (:func:`as_of`). Never raises on what the files held."""
    attempt = item.attempt
    processes = [p for p in attempt.processes if p.samples]
    if not processes:
        return []
    cache: dict[float, _hang.HangVerdict] = {}
    if item.hang is not None:
        cache[judged_s] = item.hang

    def verdict_at(t: float) -> _hang.HangVerdict:
        verdict = cache.get(t)
        if verdict is None:
            view = Attempt(attempt.number, attempt.numbered,
                           [as_of(p, t) for p in attempt.processes], attempt.cohort)  # fmt: skip
            verdict = cache[t] = judge_attempt(view, t, policy)
        return verdict

    # the moments any rank progressed, and its start (before any step its age runs from it)
    events = sorted(
        [(p.start_s, None, False) for p in processes if p.start_s is not None]
        + [(t, i, True) for p in processes for t, i in _goodput.progress_events(p)],
        key=lambda e: e[0],
    )
    events = [e for e in events if e[0] <= judged_s]
    if not events:
        return []
    exports = sorted(s.time_s for p in processes for s in p.samples)
    stacks = sorted(t for p in processes for r in p.stacks if (t := stack_time(r)) is not None)
    quiet = _Quiet(processes, policy)
    step_threshold = policy.step_threshold_s(item.account.median_step_s)
    found = []
    iteration = None
    for (a, i_a, _), (b, i_b, progress) in zip(events, events[1:]):
        if i_a is not None and (iteration is None or i_a > iteration):
            iteration = i_a
        if not progress or b - a <= policy.floor_s:
            continue
        inside = exports[bisect.bisect_right(exports, a) : bisect.bisect_left(exports, b)]
        if not inside or inside[-1] - a <= policy.floor_s or not quiet.could_hang(a, inside[-1]):
            continue
        last_seen = inside[-1]
        # judged at the last export inside it; before that, where a rank's silence ended (a
        # stopped rank that went on can end the verdict before progress comes)
        moments = [*quiet.silence_ends(a, last_seen), last_seen]
        estimated = []
        recovered = b
        if not _spans_date(processes, b) and i_b is not None and iteration is not None:
            steps, median = i_b - iteration, item.account.median_step_s
            if steps > 1 and median:
                recovered = max(b - (steps - 1) * median, last_seen)
                estimated.append(
                    f"the first step after it is placed {steps - 1} median steps before the "
                    "step the next export dated (no per-step spans)"
                )
        for moment in moments:
            incident = _incidents.hang_incident(
                verdict_at, _began(processes, a, moment), moment,
                attempt=attempt.number, cohort=attempt.cohort,
                watchdog_s=_first_between(stacks, a, b), recovered_s=recovered,
                recovered_in=(attempt.number, attempt.cohort), estimated=estimated,
                threshold_s=step_threshold,
            )  # fmt: skip
            if incident is not None:
                found.append(incident)
                break
    a = events[-1][0]
    if item.hang is not None and item.hang.hung and judged_s > a:
        if live:
            recovered, into, restarts, why = None, None, 0, "running"
        else:
            recovered, into, restarts, why = _incidents.recovery(later)
        incident = _incidents.hang_incident(
            verdict_at, _began(processes, a, judged_s), judged_s,
            attempt=attempt.number, cohort=attempt.cohort,
            watchdog_s=_first_between(stacks, a, judged_s), recovered_s=recovered,
            recovered_in=into, restarts=restarts, unrecovered=why, threshold_s=step_threshold,
        )  # fmt: skip
        if incident is not None:
            found.append(incident)
    return found


class _Quiet:
    """Where an attempt's verdict cannot be hung, from its ranks' pause spans and exports: a
    necessary condition only (:meth:`could_hang`), so that a long job's many evaluations and
    saves cost no verdict each."""

    def __init__(self, processes: Sequence[Process], policy: _hang.HangPolicy) -> None:
        self.policy = policy
        #: ``(start, end)`` of every pause span, by start (an unfinished one ends never).
        self.pauses = sorted(
            (s.start_s, s.end_s if s.end_s is not None else math.inf)
            for p in processes
            for s in p.spans
            if s.phase in _PAUSE_CODES
        )
        #: When a rank was silent (no export for longer than its silence, from then until its
        #: next export), by start.
        silences = []
        for process in processes:
            times = [s.time_s for s in process.samples]
            quiet = _hang.silence_s(process.export_interval_s)
            silences += [(x + quiet, y) for x, y in zip(times, times[1:]) if y - x > quiet]
            silences.append((times[-1] + quiet, math.inf))
        self.silences = sorted(silences)

    def silence_ends(self, low_s: float, high_s: float) -> list[float]:
        """Just before each silence that overlaps ``(low_s, high_s)`` ended (the rank's next
        export not yet written), in that stretch, ascending."""
        return sorted(
            end - _BEFORE_S
            for start, end in self.silences
            if start < high_s and low_s < end - _BEFORE_S < high_s
        )

    def could_hang(self, low_s: float, high_s: float) -> bool:
        """Whether the verdict could be hung somewhere in ``(low_s, high_s]``, a stretch
        without progress: not when no rank was silent in it, every pause in it lasted less than
        the least H of a pause, and no part of it outside the pauses is longer than the floor
        (a rank paused within its H excuses every peer, and a waiting peer's hang age counts
        from the end of the last pause)."""
        policy = self.policy
        if any(start < high_s and end > low_s for start, end in self.silences):
            return True
        least = min(policy.phase_budget_s, policy.startup_s)
        covered_to = low_s
        for start, end in self.pauses:
            if end <= low_s or start >= high_s:
                continue
            if end - start >= least or start - covered_to > policy.floor_s:
                return True
            covered_to = max(covered_to, end)
        return high_s - covered_to > policy.floor_s


#: How long before a moment "just before" it is, seconds.
_BEFORE_S = 1e-6


def stack_time(record: Mapping[str, Any]) -> float | None:
    """When a ``stacks`` record was written, Unix seconds, or ``None``."""
    value = record.get("time_ns")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value / 1e9 if ok else None


def _began(processes: Sequence[Process], last_progress_s: float, at_s: float) -> float:
    """When the job's time without progress began: ``last_progress_s`` (any rank's last
    progress), or the end of a pause span (a checkpoint save or load, an evaluation, a warm-up
    step) of any rank after it and by ``at_s``, whichever is later."""
    ends = [
        s.end_s
        for p in processes
        for s in p.spans
        if s.phase in _PAUSE_CODES and s.end_s is not None and last_progress_s < s.end_s <= at_s
    ]
    return max([last_progress_s, *ends])


def _spans_date(processes: Sequence[Process], t: float) -> bool:
    """A completed iteration or warm-up span of ``processes`` ended at ``t`` (the files date
    that step exactly)."""
    codes = (_ledger.WARMUP, _ledger.ITERATION)
    return any(s.end_s == t and s.phase in codes for p in processes for s in p.spans)


def _first_between(times: Sequence[float], low: float, high: float) -> float | None:
    """The first of ``times`` (ascending) in ``(low, high]``, or ``None``."""
    i = bisect.bisect_right(times, low)
    return times[i] if i < len(times) and times[i] <= high else None


def as_of(process: Process, at_s: float) -> Process:
    """``process`` as its files stood at ``at_s`` (Unix seconds): its samples, stacks records
    and evidence of life up to then, its spans that had started (those that ended later as
    still open). ``process`` itself when nothing of it is later. Never raises."""
    if (process.alive_s or process.last_s or 0.0) <= at_s:
        return process
    spans = []
    for span in process.spans:
        if span.start_s > at_s:
            continue
        if span.end_s is not None and span.end_s > at_s:
            span = PhaseSpan(span.name, span.phase, span.start_s, None, span.iteration)
        spans.append(span)
    return dataclasses.replace(
        process,
        samples=[s for s in process.samples if s.time_s <= at_s],
        spans=spans,
        stacks=[r for r in process.stacks if (stack_time(r) or 0.0) <= at_s],
        last_s=None if process.last_s is None else min(process.last_s, at_s),
        alive_s=None if process.alive_s is None else min(process.alive_s, at_s),
    )


def straggler_incidents(item: AttemptHealth) -> list[_incidents.Incident]:
    """The straggler incidents of one attempt (:func:`otel_training.health.incidents.
    straggler_incidents`), its windows dated by each rank's own steps
    (:func:`otel_training.health.goodput.completion_s`)."""
    report = item.stragglers
    if report is None or not report.stragglers:
        return []
    by_rank = {p.rank: p for p in item.attempt.processes}

    def time_of(rank: int, iteration: float) -> float | None:
        process = by_rank.get(rank)
        return None if process is None else _goodput.completion_s(process, int(round(iteration)))

    return _incidents.straggler_incidents(
        report, time_of, attempt=item.attempt.number, cohort=item.attempt.cohort
    )


def pause_end_s(process: Process, at_s: float) -> float | None:
    """When ``process``'s last pause (:data:`otel_training.health.hang.PAUSE_PHASES`) that
    ended by ``at_s`` ended, Unix seconds, or ``None``: the latest of its pause spans' ends, its
    progress record's (exact), and the end its exports show as the rules see it (the time of
    its last export with a pause open plus the pause time it gained after: its training clock
    stands still in a pause). Never raises."""
    ends = [
        s.end_s
        for s in process.spans
        if s.phase in _PAUSE_CODES and s.end_s is not None and s.end_s <= at_s
    ]
    record = process.record
    if record is not None and record.pause_end_s is not None and record.pause_end_s <= at_s:
        ends.append(record.pause_end_s)
    samples = [s for s in process.samples if s.phase_s is not None and s.time_s <= at_s]
    if samples:
        last = samples[-1]
        for sample in reversed(samples):
            if sample.open_phase in _hang.PAUSE_PHASES:
                gained = sum(last.phase_s[i] - sample.phase_s[i] for i in _PAUSE_CODES)  # type: ignore[index]
                ends.append(sample.time_s + max(gained, 0.0))
                break
    return max(ends, default=None)


def stacks_by_rank(attempt: Attempt) -> dict[int, list[dict[str, Any]]]:
    """The latest ``stacks`` record of each rank of ``attempt``."""
    found = {}
    for process in attempt.processes:
        if process.stacks:
            record = dict(process.stacks[-1])
            record.pop("resource", None)
            found[process.rank] = [record]
    return found


def rank_counters(attempt: Attempt) -> list[_straggler.RankCounters]:
    """Each rank's busy and communication counters after its first completed step."""
    result = []
    index = {name: i for i, name in enumerate(PHASES)}
    for process in attempt.processes:
        rows = [
            s
            for s in process.ledger
            if s.iteration is not None and s.phase_s[index["warmup"]] > 0  # type: ignore[index]
            and s.open_phase != "warmup"
        ]  # fmt: skip
        if len(rows) < 2:
            continue
        clocks = [s.sm_clock_hz for s in process.samples if s.sm_clock_hz]
        temperatures = [s.temperature_c for s in process.samples if s.temperature_c is not None]
        result.append(
            _straggler.RankCounters(
                rank=process.rank,
                iterations=[float(s.iteration) for s in rows],  # type: ignore[arg-type]
                phase_s={
                    phase: [s.phase_s[index[phase]] for s in rows]  # type: ignore[index]
                    for phase in _straggler.PHASES
                },
                peer_group=process.pipeline_rank,
                sm_clock_hz=sum(clocks) / len(clocks) if clocks else None,
                temperature_c=sum(temperatures) / len(temperatures) if temperatures else None,
            )
        )
    return result
