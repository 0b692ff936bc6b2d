"""``otel-training health``: goodput, a hang and its culprits, stragglers, for one job.

:func:`assess_job` reads every attempt of the job that a directory shows
(:func:`otel_training.report.reader.load_job`, only what run health needs) and applies the
definitions of :mod:`otel_training.health` (goodput, hang, straggler; ``docs/health.md``);
:func:`assess_read` does the same with a job the report has read already, so that
``otel-training report`` reads each file once. The result, :class:`JobHealth`, is the JSON of
``otel-training health --json`` (:meth:`JobHealth.to_json`), the terminal summary
(:func:`format_text`) and the report's "Run health" section. Works on a job that is still
running or hung: ``now`` is the moment judged. Nothing here raises on a file.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from otel_training import config
from otel_training.health import goodput as _goodput
from otel_training.health import hang as _hang
from otel_training.health import incidents as _incidents
from otel_training.health import ledger as _ledger
from otel_training.health import straggler as _straggler
from otel_training.health.evidence import Attempt, Job, PhaseSpan, Process, attempts
from otel_training.health.ledger import PHASES
from otel_training.report import run as _run
from otel_training.report import verdict as _verdict
from otel_training.report.job_health import AttemptHealth, JobHealth
from otel_training.report.notes import file_notes, other_jobs_note
from otel_training.report.reader import load_job
from otel_training.report.rundir import find_run_directory
from otel_training.report.wording import duration, ranks_phrase

__all__ = ["JobHealth", "assess_job", "format_text"]


def assess_job(
    directory: str | os.PathLike | None = None,
    *,
    now_s: float | None = None,
    settings: config.Settings | None = None,
    environ: Mapping[str, str] | None = None,
) -> JobHealth:
    """The health of the job that ``directory`` shows (a run directory of it, or the output
    directory; default: the environment's).

    Args:
        directory: Where to look (see :func:`otel_training.report.find_run_directory`; every
            run directory of the job is read: :func:`otel_training.report.job_directories`).
        now_s: The moment judged, Unix seconds (default: now): a job whose last evidence is
            within two export intervals of it is running, and its hang is judged at it.
        settings: The thresholds (default: :func:`otel_training.config.load` of ``environ``:
            ``OTEL_PYTHON_TRAINING_HANG_*`` and ``OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS``).
        environ: The variables to read instead of ``os.environ``.

    Raises:
        otel_training.report.RunNotFoundError: when ``directory`` holds no run.
    """
    settings = settings or config.load(environ)
    run_directory = find_run_directory(directory, environ)
    job = load_job(run_directory, now_s=now_s, purpose="health")
    return assess_read(job, now_s=now_s, settings=settings)


def assess_read(
    job: _run.Job | _run.Run,
    *,
    now_s: float | None = None,
    settings: config.Settings | None = None,
) -> JobHealth:
    """:func:`assess_job` of a job (or one run) already read by
    :func:`otel_training.report.load_job`: its processes, as read with it (the report's
    "Run health" section). Never raises on what the files held."""
    settings = settings or config.load()
    now = time.time() if now_s is None else now_s
    return assess(
        evidence(_run.Job.of(job)),
        now_s=now,
        policy=settings.hang,
        window_steps=settings.straggler_window_steps,
    )


def evidence(job: _run.Job) -> Job:
    """What run health judges of ``job``: the processes of its runs, read with them, and
    notes on the files (those that could not be read, lines that could not, runs of other
    jobs left out)."""
    processes = [process for run in job.runs for process in run.processes]
    files = {stats.path: stats for run in job.runs for stats in run.files}
    notes = file_notes(list(files.values()))
    if job.other_jobs:
        notes.append(other_jobs_note(job.other_jobs))
    if not processes:
        notes.append("No process of this job was found in the files.")
    read = sum(f.size_bytes for f in files.values() if not f.skipped and not f.error)
    directories = sorted({run.directory for run in job.runs} | set(job.directories),
                         key=lambda p: p.name)  # fmt: skip
    return Job(job.key, directories, processes, notes, read)


def assess(
    job: Job,
    *,
    now_s: float,
    policy: _hang.HangPolicy | None = None,
    window_steps: int = _straggler.DEFAULT_WINDOW_STEPS,
) -> JobHealth:
    """:func:`assess_job` of a job already read."""
    policy = policy or _hang.HangPolicy()
    ordered = attempts(job.processes)
    account = _goodput.account(
        ordered, policy, now_s=now_s, hung_at=lambda a, t: judge_attempt(a, t, policy).hung
    )
    items = []
    for i, (attempt, attempt_account) in enumerate(zip(ordered, account.attempts)):
        item = AttemptHealth(attempt_account, attempt)
        live = attempt is ordered[-1] and _goodput.is_live(attempt, now_s)
        item.hang = judge_attempt(attempt, _goodput.judged_at(attempt, now_s, live), policy)
        if item.hang.hung:
            item.stacks = _stacks(attempt)
        item.stragglers = _straggler.assess(_counters(attempt), window_steps)
        following = ordered[i + 1] if i + 1 < len(ordered) else None
        item.estimated = estimates(attempt, attempt_account, following)
        items.append(item)
    found = []
    for i, item in enumerate(items):
        live = item.attempt is ordered[-1] and _goodput.is_live(item.attempt, now_s)
        later = [
            _incidents.Restart(x.account.attempt, x.account.cohort, x.account.first_step_end_s)
            for x in items[i + 1 :]
        ]
        at = _goodput.judged_at(item.attempt, now_s, live)
        found += hang_incidents(item, at, policy, later, live)
        found += straggler_incidents(item)
    found.sort(key=lambda x: (x.began_s, x.kind, x.culprits))
    notes = list(job.notes) + list(account.notes)
    for item in items:
        report = item.stragglers
        if report is not None and report.windows and not report.attributed:
            notes.append(
                f"Attempt {item.account.label}: no rank recorded the communication phase "
                "(grad_sync('finish'), p2p receives, barriers; under DistributedDataParallel "
                "otel_training.integrations.ddp.register_comm_hook), so waiting cannot be told "
                "from working: a straggler's peers wait as long as it works, and straggler "
                "causes are unattributed."
            )
    return JobHealth(
        job.job_id, job.directories, now_s, account, items, policy, window_steps, notes,
        job.processes, found,
    )  # fmt: skip


def estimates(
    attempt: Attempt, account: _goodput.AttemptAccount, following: Attempt | None = None
) -> list[str]:
    """What ``attempt``'s figures rest on that the files cannot tell exactly, one sentence
    each (``docs/health.md``, "Precision"): the end of an attempt that died unseen, placed at
    the last export or span line of a process without a progress record; ranks of its world
    that left no files; an end after the next attempt's start (``following``), which the
    hosts' clocks disagreeing (or attempts that overlapped) make."""
    found = []
    if following is not None and attempt.end_s > following.start_s + 1.0:
        found.append(
            f"its last record is {_duration(attempt.end_s - following.start_s)} after the next "
            "attempt's first process started: the hosts' clocks disagree or the attempts "
            "overlapped, so its end is cut there and the downtime after it is taken as 0"
        )
    blind = [p for p in attempt.processes if p.record is None]
    if blind and account.ended == "killed":
        interval = max(p.export_interval_s for p in blind)
        found.append(
            f"{ranks_phrase(sorted({p.rank for p in blind}))} kept no progress record "
            f"(ledger-rank*.bin): the end is placed at the last export or span line, up to "
            f"{_duration(interval)} early, so lost progress and downtime are estimates"
        )
    sizes = [p.resource.get("dl.world_size") for p in attempt.processes]
    world = max((n for n in sizes if isinstance(n, int)), default=0)
    present = {p.rank for p in attempt.processes}
    missing = sorted(set(range(world)) - present)
    if missing:
        found.append(
            f"{ranks_phrase(missing)} of its {world} left no files: its figures are those of "
            f"the other ranks"
        )
    return found


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
        written = _stack_time(record)
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


# -- incidents --------------------------------------------------------------------------------


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
    stacks = sorted(t for p in processes for r in p.stacks if (t := _stack_time(r)) is not None)
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


def _stack_time(record: Mapping[str, Any]) -> float | None:
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
        stacks=[r for r in process.stacks if (_stack_time(r) or 0.0) <= at_s],
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


def _stacks(attempt: Attempt) -> dict[int, list[dict[str, Any]]]:
    """The latest ``stacks`` record of each rank of ``attempt``."""
    found = {}
    for process in attempt.processes:
        if process.stacks:
            record = dict(process.stacks[-1])
            record.pop("resource", None)
            found[process.rank] = [record]
    return found


def _counters(attempt: Attempt) -> list[_straggler.RankCounters]:
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


# -- the terminal summary ---------------------------------------------------------------------


_duration = duration


def _table(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)]
        lines.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


def _records(records: Sequence[tuple[str, Sequence[tuple[str, str]]]], width: int) -> list[str]:
    """Each record as its title, then its ``key: value`` pairs wrapped to ``width`` columns:
    what a table too wide for the terminal becomes (one record per attempt, a few lines)."""
    lines = []
    for title, pairs in records:
        lines += _wrapped("  " + title, width)
        line = ""
        for pair in (f"{k}: {v}" for k, v in pairs):
            if line and len(line) + 2 + len(pair) > width:
                lines += _wrapped(line, width, "      ")
                line = ""
            line = f"{line}  {pair}" if line else "    " + pair
        lines += _wrapped(line, width, "      ")
    return lines


def _fitted(
    rows: Sequence[Sequence[str]], right: Sequence[bool], width: int | None, *, by_column: bool
) -> list[str]:
    """``rows`` (a header row first) as a table when it fits in ``width`` columns (``None``:
    any width), else as records: one per row, or one per column (``by_column``: the columns
    are the attempts), titled by the first column's header and the row's first cell, or by
    the column's header."""
    table = _table(rows, right)
    if width is None or max(map(len, table)) <= width:
        return table
    header, body = rows[0], rows[1:]
    if by_column:
        records = [(header[j], [(row[0], row[j]) for row in body]) for j in range(1, len(header))]
    else:
        records = [(f"{header[0]} {row[0]}", list(zip(header[1:], row[1:]))) for row in body]
    return _records(records, width)


def _wrapped(line: str, width: int | None, indent: str | None = None) -> list[str]:
    """``line`` cut into lines of at most ``width`` columns at spaces (a word longer than a
    line, a path or a run id, is cut too); the lines after the first are indented like it
    plus two spaces, or by ``indent``."""
    if width is None or len(line) <= width:
        return [line]
    import textwrap

    lead = line[: len(line) - len(line.lstrip(" "))]
    rest = lead + "  " if indent is None else indent
    if len(rest) >= width // 2:  # a deep stack line: cut it, keep its place
        rest = lead[: width // 4] + "  "
    return textwrap.wrap(
        line.strip(),
        width,
        initial_indent=lead[: width // 2],
        subsequent_indent=rest,
        break_on_hyphens=False,
    ) or [line[:width]]


def format_text(health: JobHealth, width: int | None = None) -> str:
    """The terminal summary of ``otel-training health`` (plain text).

    Args:
        health: The job's health.
        width: The most columns (characters) of a line, or ``None`` for lines of any length.
            A table wider than that becomes records (``key: value``, a few lines per attempt),
            and a longer line continues on the next, indented by two more spaces.
    """
    a = health.account
    lines = _verdict.judge(health).lines() + [
        f"job {health.job or '(unnamed)'}: {len(health.attempts)} attempt"
        f"{'s' if len(health.attempts) != 1 else ''}, " + _verdict.goodput_text(a),
        "",
    ]
    header = ["", "total", *[f"attempt {x.account.label}" for x in health.attempts]]
    rows = [header, ["productive", _duration(a.productive_s),
                     *[_duration(x.account.productive_s) for x in health.attempts]]]  # fmt: skip
    for name in _goodput.BUCKETS:
        rows.append(
            [name, _duration(a.buckets[name]),
             *[_duration(x.account.buckets[name]) for x in health.attempts]]
        )  # fmt: skip
    lines += _fitted(rows, [False] + [True] * (len(header) - 1), width, by_column=True)
    lines.append("")
    rows = [["attempt", "run", "ranks", "resumed from", "last step", "lost steps", "ended",
             "time to start", "time to recover"]]  # fmt: skip
    for x in health.attempts:
        acc = x.account
        lost = acc.lost_iterations
        rows.append(
            [
                acc.label + ("" if acc.numbered else " (by start time)"),
                acc.run_id or "–",
                str(len(acc.ranks)),
                "–" if acc.resumed_from is None else str(acc.resumed_from),
                "–" if acc.last_iteration is None else str(acc.last_iteration),
                "–" if lost is None else f"{lost[0]}–{lost[1]}",
                acc.ended,
                _duration(acc.time_to_start_s),
                _duration(acc.time_to_recover_s),
            ]
        )
    lines += _fitted(
        rows, [False, False, True, True, True, True, False, True, True], width, by_column=False
    )
    for x in health.attempts:
        for why in x.estimated:
            lines.append(f"  estimated, attempt {x.account.label}: {why}")
    hang = health.hang
    lines.append("")
    if hang is None:
        lines.append("hang: none")
    else:
        v = hang.hang
        assert v is not None
        lines.append(_verdict.hang_text(hang))
        for rank, phase in sorted(v.phases.items()):
            lines.append(
                f"  rank {rank}: in {phase}" + ("  <- culprit" if rank in v.culprits else "")
            )
        for rank, records in sorted(hang.stacks.items()):
            if v.culprits and rank not in v.culprits:
                continue
            for record in records:
                for thread in record.get("threads", ())[:1]:
                    lines.append(f"  rank {rank}, thread {thread.get('name')}:")
                    lines += [
                        "    " + s for s in str(thread.get("stack", "")).rstrip().splitlines()
                    ]
    flagged = [(x.account.label, s) for x in health.attempts if x.stragglers
               for s in x.stragglers.stragglers]  # fmt: skip
    if flagged:
        lines.append("stragglers:")
        for attempt, s in flagged:
            lines.append("  " + _verdict.straggler_text(attempt, s))
    else:
        lines.append("stragglers: none")
    lines += incident_lines(health)
    for note in health.notes:
        lines.append(f"note: {note}")
    return "\n".join(part for line in lines for part in _wrapped(line, width))


#: What an incident without a recovery says (:data:`otel_training.health.incidents.UNRECOVERED`).
UNRECOVERED_TEXT = {
    "running": "still hung now",
    "not_restarted": "the job was not restarted after it",
    "no_step_after": "no later attempt completed a step",
    "still_flagged": "still flagged in the last window of its attempt",
}


def incident_text(incident: _incidents.Incident, job_start_s: float) -> str:
    """One incident in a sentence: what, where, and its moments as durations from when it
    began (which is given from the job's start)."""
    x = incident
    if x.kind == "hang":
        what = f"hang in attempt {x.label}"
        if x.culprits:
            who = (
                f"culprit{'s' if len(x.culprits) != 1 else ''} {ranks_phrase(x.culprits)}"
                f" ({(x.rule or '').replace('_', ' ')})"
            )
        else:
            who = "no culprit named"
    else:
        what = f"straggler in attempt {x.label}"
        score = "" if x.score is None else f", score {x.score:.2f}"
        who = f"{ranks_phrase(x.culprits)} (cause {x.cause}{score})"
    parts = [
        f"{what}: began {_duration(x.began_s - job_start_s)} into the job",
        f"detected after {_duration(x.time_to_detect_s)}",
    ]
    if x.time_to_localise_s is not None:
        parts.append(f"localised after {_duration(x.time_to_localise_s)}: {who}")
    else:
        parts.append(who)
    if x.time_to_recover_s is not None:
        where = ""
        if x.recovered_in is not None and x.recovered_in != (x.attempt, x.cohort):
            attempt, cohort = x.recovered_in
            label = f"{attempt}.{cohort}" if cohort else str(attempt)
            where = (
                f" (in attempt {label}, after {x.restarts} restart{'s' if x.restarts != 1 else ''})"
            )
        verb = "stopped being flagged" if x.kind == "straggler" else "recovered"
        parts.append(f"{verb} after {_duration(x.time_to_recover_s)}{where}")
    else:
        why = UNRECOVERED_TEXT.get(x.unrecovered or "", "not recovered")
        if x.unrecovered == "no_step_after":
            why += f" ({x.restarts} restart{'s' if x.restarts != 1 else ''})"
        parts.append(f"not recovered: {why}")
    text = "; ".join(parts)
    if x.estimated:
        text += " (estimated: " + "; ".join(x.estimated) + ")"
    return text


def incident_lines(health: JobHealth) -> list[str]:
    """The terminal summary's incidents: one line each, or ``incidents: none``."""
    if not health.incidents:
        return ["incidents: none"]
    start = health.account.start_s
    return ["incidents:"] + ["  " + incident_text(x, start) for x in health.incidents]
