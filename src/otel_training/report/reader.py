"""Reads the files of a job, each once, into the runs that the report and the trace draw and
the processes that run health judges.

A run directory of the embedded default holds, per rank R, ``metrics-rank{R}.jsonl`` and
``traces-rank{R}.jsonl`` (OTLP-JSON lines), ``spans-rank{R}.jsonl`` (span, ``stacks`` and
``training_values`` records, ``docs/spans.md``), ``logs-rank{R}.jsonl`` and, after a write
failed, ``gaps-rank{R}.jsonl``. Each file is opened and decoded once
(:mod:`otel_training.report.decode` a file, :mod:`otel_training.report.otlp` a line;
:mod:`otel_training.report.notes` words what was odd); what one pass finds per process
serves every command: the report's series, spans and gaps
(:class:`~otel_training.report.run.Run`) and run health's ledger samples, phase spans and
stacks (:class:`otel_training.health.evidence.Process`, in ``Run.processes``).

**A process** is one rank of one attempt, told by its resource
(:func:`otel_training.report.attempts.identity_of`: run id, attempt counters,
``process.creation.time``, else ``service.instance.id``) and its rank (``dl.rank``, else the
line's ``rank``, else the file name's). Lines without a creation time (span lines of older
versions, hand-written files) belong to the process of the same run, rank, attempt and instance
that had started by their first record (the latest such), else to a process of their own.

**A run** is the processes of one run id; where one run id holds two processes of the same rank
(a rerun under a run id given by hand) it is split into one run per start, in the order of the
processes' starts. **The job** of a run directory is the job of the run seen last in it
(:func:`otel_training.report.attempts.job_of`); its attempts are its runs in its run directories
(:func:`otel_training.report.rundir.job_directories`).

The reader is tolerant: a missing file, a torn last line (a killed run, a full disk, a run still
writing), a line of the wrong shape, a run still in progress, lines of older runs appended to the
same files (the flat layout) each give a note, never an exception.
"""

from __future__ import annotations

import operator
import os
import time
from pathlib import Path
from typing import Any

from otel_training.health import ledger as _ledger
from otel_training.health import record as _record
from otel_training.health.evidence import (
    KEPT_PHASES,
    PhaseSpan,
    Process,
    absorb_record,
    process_of_record,
)
from otel_training.report import clocks
from otel_training.report._nogc import no_gc
from otel_training.report.attempts import identity_of, job_of
from otel_training.report.decode import PURPOSES, Key, Part, merge_rank, read_file
from otel_training.report.notes import followed, other_jobs_note, run_notes
from otel_training.report.run import TRUNCATED_ATTRIBUTE, FileStats, Job, RankTelemetry, Run, Span
from otel_training.report.rundir import RunFile, job_directories, run_files
from otel_training.semconv.attributes import MEGATRON_ITERATION
from otel_training.semconv.spans import MEGATRON_TRAIN

__all__ = [
    "PARALLEL_BYTES",
    "PURPOSES",
    "load_job",
    "load_run",
    "load_runs",
    "order_runs",
]

PARALLEL_BYTES = 64 * 2**20
"""From this many bytes of files in a run directory, its files are read in worker processes."""
#: The prefix of the status description of a span ended on a signal.
_TRUNCATED_PREFIX = "truncated: "


def _read_all(
    files: list[RunFile], workers: int, purpose: str
) -> list[tuple[FileStats, dict[Key, Part]]]:
    if workers <= 1 or len(files) <= 1:
        return [read_file(file, purpose) for file in files]
    import concurrent.futures
    import multiprocessing
    import threading

    # fork is quick and safe while this process has no other thread; spawn otherwise.
    single = threading.active_count() == 1
    method = "fork" if single and "fork" in multiprocessing.get_all_start_methods() else "spawn"

    # Largest first, so that the longest file does not start last.
    order = sorted(range(len(files)), key=lambda i: -_size_of(files[i].path))
    results: list[Any] = [None] * len(files)
    try:
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=min(workers, len(files)),
            mp_context=multiprocessing.get_context(method),
        ) as pool:
            futures = {pool.submit(read_file, files[i], purpose): i for i in order}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
    except (OSError, RuntimeError, concurrent.futures.process.BrokenProcessPool):
        # No processes here (a sandbox, a broken pool): read them in this one.
        return [read_file(file, purpose) for file in files]
    return results


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _needs_traces(rank: int, spans_stats: dict[int, FileStats], open_ranks: set[int]) -> bool:
    """The OTLP-JSON traces of ``rank`` are read when its span lines are absent or
    incomplete (unreadable, cut, or with spans that never ended)."""
    stats = spans_stats.get(rank)
    if stats is None or stats.error or stats.torn_last_line or stats.bad_lines or not stats.lines:
        return True
    return rank in open_ranks


def _not_read(file: RunFile, why: str) -> FileStats:
    """The stats of a file left unread: its size and modification time."""
    stats = FileStats(file.path, file.signal, file.rank, skipped=why)
    try:
        status = file.path.stat()
        stats.size_bytes, stats.mtime_s = status.st_size, status.st_mtime
    except OSError:
        pass
    return stats


def _load(directory: Path, files: list[RunFile], workers: int, purpose: str) -> list[Run]:
    """The runs of ``directory``'s ``files``, each file read once."""
    health_only = purpose == "health"
    wanted = [f for f in files if f.signal != "traces" and not (health_only and f.signal == "logs")]
    results = dict(zip(wanted, _read_all(wanted, workers, purpose)))
    spans_stats = {f.rank: results[f][0] for f in wanted if f.signal == "spans"}
    open_ranks = {
        span.rank
        for f in wanted
        if f.signal == "spans"
        for part in results[f][1].values()
        for span in part.spans.values()
        if span.end_ns is None
    }
    traces = [
        f for f in files if f.signal == "traces" and _needs_traces(f.rank, spans_stats, open_ranks)
    ]
    results.update(zip(traces, _read_all(traces, workers, purpose)))
    merged: dict[Key, Part] = {}
    stats = []
    for file in files:  # sorted by signal: metrics, spans before traces
        if file not in results:
            why = (
                "not needed: the span lines of this rank are complete"
                if file.signal == "traces"
                else "not needed by run health"
            )
            stats.append(_not_read(file, why))
            continue
        file_stats, parts = results.pop(file)
        stats.append(file_stats)
        for key, part in parts.items():
            known = merged.get(key)
            if known is None:
                merged[key] = part
            else:
                known.absorb(part, file.signal)
    parts = _place(list(merged.values()))
    processes = _evidence(directory, parts, stats) if purpose != "trace" else {}
    orphans = _records(directory, list(processes.values())) if purpose != "trace" else []
    runs = []
    for run_id, group in _group_processes(parts):
        run = Run(directory=directory, files=stats, run_id=run_id)
        spans: dict[tuple[str, str], Span] = {}
        for part in group:
            telemetry = part.telemetry
            merge_rank(run.ranks.setdefault(telemetry.rank, RankTelemetry(telemetry.rank)),
                        telemetry, "metrics")  # fmt: skip
            spans.update(part.spans)
            run.gaps.extend(part.gaps)
            if processes:
                run.processes.append(processes[id(part)])
        run.gaps.sort(key=lambda g: (g.to_ns or 0, g.rank, g.file))
        if not health_only:  # run health has what it reads of them in the processes
            run.spans = sorted(spans.values(), key=operator.attrgetter("start_ns", "rank"))
        run.processes.sort(key=lambda p: (p.rank, p.start_s or 0.0))
        _identify(run)
        runs.append(run)
    if not runs:
        runs.append(Run(directory=directory, files=stats))
    _record_runs(directory, runs, orphans)
    if len(runs) == 1:
        for file in stats:  # a rank with files but nothing readable still counts as a rank
            runs[0].ranks.setdefault(file.rank, RankTelemetry(file.rank))
    for run in runs:
        run.ranks = dict(sorted(run.ranks.items()))
    return runs


def _place(parts: list[Part]) -> list[Part]:
    """The processes: each part with a creation time, and each without one given to the process
    of its run, rank, attempt and instance that had started by its first record (the module
    docstring)."""
    processes = [p for p in parts if p.identity.created_s is not None]
    for loose in sorted(
        (p for p in parts if p.identity.created_s is None), key=operator.attrgetter("start_s")
    ):
        home = _home(loose, processes)
        if home is None:
            processes.append(loose)
        else:
            home.absorb(loose, "spans")
    return processes


def _home(loose: Part, processes: list[Part]) -> Part | None:
    """The process of ``loose``'s run and rank (and attempt and instance, where ``loose``
    names them) that had started by its first record, the latest such; else the first to
    start; ``None`` when there is none."""
    identity = loose.identity
    candidates = [
        p
        for p in processes
        if p.telemetry.rank == loose.telemetry.rank
        and p.identity.run_id == identity.run_id
        and (identity.order is None or p.identity.order == identity.order)
        and (identity.instance is None or p.identity.instance in (None, identity.instance))
    ]
    if not candidates:
        return None
    at = loose.start_s
    started = [p for p in candidates if p.start_s <= at]
    return max(started or candidates, key=operator.attrgetter("start_s"))


def _evidence(directory: Path, parts: list[Part], files: list[FileStats]) -> dict[int, Process]:
    """What run health reads of each process (by ``id`` of its part): its ledger samples, phase
    spans and stacks by time, and its last evidence of life: its latest record, or the
    modification time of its rank's files when that is later by at most one export interval
    plus one second (a file copied later does not move it further); the files of a rank are
    the evidence of their newest writer only."""
    processes = {}
    for part in parts:
        identity, telemetry = part.identity, part.telemetry
        process = Process(
            rank=telemetry.rank,
            run_id=identity.run_id,
            job_id=identity.job_id,
            attempt=identity.attempt,
            created_s=identity.created_s,
            resource=telemetry.resource,
            samples=sorted(part.samples, key=operator.attrgetter("time_s")),
            stacks=sorted(part.stacks, key=lambda r: r.get("time_ns") or 0),
            first_s=None if telemetry.first_ns is None else telemetry.first_ns / 1e9,
            last_s=None if telemetry.last_ns is None else telemetry.last_ns / 1e9,
            directories={directory},
        )
        for span in part.spans.values():
            truncated = span.attributes.get(TRUNCATED_ATTRIBUTE) is True
            if span.end_ns is None:
                process.open_spans += 1
            elif truncated:
                description = span.status_description
                if isinstance(description, str) and description.startswith(_TRUNCATED_PREFIX):
                    process.signal = description[len(_TRUNCATED_PREFIX) :]
            if (
                span.name == MEGATRON_TRAIN
                and span.end_ns is not None
                and span.status == "ERROR"
                and not truncated
            ):  # the run raised: when, for health.timeline.raised()
                end_s = span.end_ns / 1e9
                if process.run_raised_s is None or end_s > process.run_raised_s:
                    process.run_raised_s = end_s
            phase = _ledger.PHASE_OF_SPAN.get(span.name, _ledger.NO_PHASE)
            if phase not in KEPT_PHASES:
                continue
            iteration = span.attributes.get(MEGATRON_ITERATION)
            ended = span.end_ns is not None
            process.spans.append(
                PhaseSpan(
                    name=span.name,
                    phase=phase,
                    start_s=span.start_ns / 1e9,
                    end_s=span.end_ns / 1e9 if ended else None,
                    iteration=iteration if isinstance(iteration, int) else None,
                    failed=ended and span.status == "ERROR" and not truncated,
                    truncated=ended and truncated,
                )
            )
        process.spans.sort(key=operator.attrgetter("start_s"))
        process.alive_s = process.last_s
        processes[id(part)] = process
    mtimes: dict[int, float] = {}
    for stats in files:
        mtimes[stats.rank] = max(mtimes.get(stats.rank, 0.0), stats.mtime_s)
    for rank, mtime in mtimes.items():
        writers = [processes[id(p)] for p in parts if rank in p.file_ranks]
        if not writers:
            continue
        newest = max(writers, key=lambda p: (p.start_s or 0.0, p.last_s or 0.0))
        if newest.last_s is None:
            continue
        if 0 < mtime - newest.last_s <= newest.export_interval_s + 1.0:
            newest.alive_s = max(newest.alive_s or 0.0, mtime)
    return processes


def _records(directory: Path, processes: list[Process]) -> list[_record.ProgressRecord]:
    """Gives each process its progress record (:mod:`otel_training.health.record`), found in
    ``directory`` by its ``service.instance.id``, else by its rank and creation time (to the
    millisecond that ``process.creation.time`` keeps): one more sample of its ledger, taken
    at its last transition, and evidence of life until then. Returns the records that no
    process of the files took (a process killed before it wrote anything else)."""
    try:
        paths = sorted(directory.glob(_record.FILE_GLOB))
    except OSError:
        return []
    orphans = []
    for path in paths:
        found = _record.read(path)
        if found is None:
            continue
        instance = found.identity.get("service.instance.id")
        rank = found.identity.get("dl.rank")
        owner = next(
            (
                p
                for p in processes
                if instance and p.resource.get("service.instance.id") == instance
            ),
            None,
        ) or next(
            (
                p
                for p in processes
                if p.rank == rank
                and p.created_s is not None
                and abs(p.created_s - found.created_s) < 2e-3
            ),
            None,
        )
        if owner is not None:
            absorb_record(owner, found)
        else:
            orphans.append(found)
    return orphans


def _record_runs(directory: Path, runs: list[Run], orphans: list[_record.ProgressRecord]) -> None:
    """Each process known only by its progress record (killed before its first export or span
    line) joins the run of its run id in ``runs``, else a run of its own (an empty run of the
    directory first), with the identity its record names."""
    for found in orphans:
        identity = found.identity
        process = process_of_record(found)
        process.directories.add(directory)
        run = next((r for r in runs if r.run_id == process.run_id and r.run_id is not None), None)
        if run is None:
            run = next((r for r in runs if r.run_id is None and not r.processes), None)
            if run is None:
                run = Run(directory=directory, files=runs[0].files if runs else [])
                runs.append(run)
            run.run_id, run.job_id = process.run_id, process.job_id
            attempt = identity.get("dl.run.attempt")
            if isinstance(attempt, int):
                run.attempt, run.attempt_order = attempt, (attempt,)
        run.created_s = min(x for x in (run.created_s, process.created_s) if x is not None)
        run.ranks.setdefault(process.rank, RankTelemetry(process.rank))
        run.processes.append(process)
        run.processes.sort(key=lambda p: (p.rank, p.start_s or 0.0))


def _group_processes(parts: list[Part]) -> list[tuple[str | None, list[Part]]]:
    """The processes grouped into runs: by run id, and where one run id holds two processes of
    the same rank, split into one run per start, in the order of their starts: a process starts
    a new run when its rank is already in the current one."""
    by_run: dict[str | None, list[Part]] = {}
    for part in parts:
        by_run.setdefault(part.identity.run_id, []).append(part)
    groups: list[tuple[str | None, list[Part]]] = []
    for run_id, processes in by_run.items():
        ranks = [part.telemetry.rank for part in processes]
        if len(ranks) == len(set(ranks)):
            groups.append((run_id, processes))
            continue
        processes.sort(key=operator.attrgetter("start_s"))
        current: list[Part] = []
        seen: set[int] = set()
        for part in processes:
            if part.telemetry.rank in seen:
                groups.append((run_id, current))
                current, seen = [], set()
            current.append(part)
            seen.add(part.telemetry.rank)
        groups.append((run_id, current))
    return groups


def _identify(run: Run) -> None:
    """Fills ``run``'s job id, attempt, start and processes from its ranks' resources."""
    created = []
    for telemetry in run.ranks.values():
        if not telemetry.resource:
            continue
        identity = identity_of(telemetry.resource)
        if run.job_id is None:
            run.job_id = identity.job_id
        if run.attempt_order is None and identity.order is not None:
            run.attempt, run.attempt_order = identity.attempt, identity.order
        if identity.created_s is not None:
            created.append(identity.created_s)
        if run.run_id is None:
            run.run_id = identity.run_id
    run.created_s = min(created) if created else None


# -- runs and jobs --------------------------------------------------------------------------


def load_runs(
    directory: str | os.PathLike,
    *,
    now_s: float | None = None,
    workers: int | None = None,
    purpose: str = "report",
) -> list[Run]:
    """Every run (attempt, or process group given one run id) whose records are in the rank
    files of ``directory``, each a :class:`Run` with its identity (``job_id``, ``attempt``,
    ``created_s``), processes and notes, ordered as :func:`order_runs` orders them. At least
    one (empty when nothing was read). Each file is read once, for ``purpose``
    (:data:`PURPOSES`). Never raises on the files.

    Raises:
        ValueError: when ``purpose`` is none of :data:`PURPOSES`.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r} is none of {', '.join(PURPOSES)}")
    directory = Path(directory)
    files = run_files(directory)
    if workers is None:
        total = sum(_size_of(f.path) for f in files)
        workers = (os.cpu_count() or 1) if total > PARALLEL_BYTES else 1
    with no_gc():
        runs = _load(directory, files, workers, purpose)
    if purpose != "health":
        now = _now(now_s)
        for run in runs:
            run.clock_offsets = clocks.clock_offsets(run)
            run.notes = run_notes(run, now, shown_alone=False)
    return order_runs(runs)


def load_run(
    directory: str | os.PathLike, *, now_s: float | None = None, workers: int | None = None
) -> Run:
    """Reads every rank file of a run directory: the run seen last in it.

    Span JSON lines are preferred; a rank's OTLP-JSON traces file is read where its span lines
    are absent or incomplete, and completes them (an end that the lines lack) or stands in for
    them. Lines of several runs in the same files (older versions appended every run to one
    set of files; two processes given the same run id append to one directory) are told apart
    by their processes (the module docstring): the run seen last is kept and the others are
    named in a note (:func:`load_job` shows each of them).

    Args:
        directory: A run directory (see :func:`otel_training.report.find_run_directory`).
        now_s: The time to judge "still in progress" against, seconds since the Unix epoch
            (default: now).
        workers: Processes that read files side by side; default: the CPU count when the
            files hold more than :data:`PARALLEL_BYTES`, else 1 (this process).

    Returns:
        The run, with a note for each thing that was missing or odd. Never raises: an unreadable
        file or directory is a note (``Run.is_empty`` tells when nothing at all was read).
    """
    runs = load_runs(directory, now_s=now_s, workers=workers)
    chosen = max(runs, key=_last_seen)
    others = [r for r in runs if r is not chosen]
    chosen.other_run_ids = sorted(
        {r.run_id for r in others if r.run_id is not None and r.run_id != chosen.run_id}
    )
    chosen.same_id_runs = sum(1 for r in others if r.run_id == chosen.run_id)
    chosen.notes = run_notes(chosen, _now(now_s), shown_alone=True)
    return chosen


def load_job(
    run_directory: str | os.PathLike,
    *,
    now_s: float | None = None,
    workers: int | None = None,
    purpose: str = "report",
) -> Job:
    """Reads every attempt of the job that the run seen last in ``run_directory`` belongs to,
    each file once.

    The attempts are the runs of its job (:func:`otel_training.report.attempts.job_of`: its
    ``dl.job.id`` or Megatron-LM's name for it, else its run id less ``-a{N}``) in
    ``run_directory`` and in the sibling run directories of the same job
    (:func:`otel_training.report.rundir.job_directories`). Each attempt stays a :class:`Run`
    of its own, labelled and ordered (:func:`order_runs`), never merged with another.

    Args:
        run_directory: A run directory (see :func:`otel_training.report.find_run_directory`).
        now_s: The time to judge "still in progress" against, Unix seconds (default: now).
        workers: As for :func:`load_run`.
        purpose: What the reading is for (:data:`PURPOSES`): ``"report"`` keeps everything,
            ``"trace"`` all but run health's, ``"health"`` only run health's.

    Returns:
        The job. Never raises on the files (an unreadable directory gives an empty run with a
        note).

    Raises:
        ValueError: when ``purpose`` is none of :data:`PURPOSES`.
    """
    base = Path(run_directory).absolute()
    now = _now(now_s)
    found = {base: load_runs(base, now_s=now, workers=workers, purpose=purpose)}
    chosen = max(found[base], key=_last_seen)
    key = job_of(chosen.job_id, chosen.run_id)
    directories = job_directories(base, job=key, run_id=chosen.run_id)
    for directory in directories:
        if directory not in found:
            found[directory] = load_runs(directory, now_s=now, workers=workers, purpose=purpose)
    runs = [r for d in directories for r in found[d] if job_of(r.job_id, r.run_id) == key]
    jobs = {job_of(r.job_id, r.run_id) for d in directories for r in found[d]}
    others = sorted(other for other in jobs - {key} if other is not None)
    runs = order_runs(runs)
    for earlier in runs[:-1]:  # a later attempt started: none of these is in progress
        followed(earlier)
    job = Job(job_id=chosen.job_id, runs=runs, directories=directories, key=key)
    job.other_jobs = others
    if all(r.attempt_order is not None for r in runs):
        job.ordered_by = "attempt"
    elif all(r.created_s is not None for r in runs):
        job.ordered_by = "process.creation.time"
    else:
        job.ordered_by = "first record"
    if len(runs) > 1:
        how = {
            "attempt": "by attempt number",
            "process.creation.time": "by when their processes started "
            "(process.creation.time; no attempt counter was recorded)",
            "first record": "by their first record (no attempt counter or process start time "
            "was recorded)",
        }[job.ordered_by]
        job.notes.append(
            f"Job {job.job_id or chosen.run_id}: {len(runs)} attempts, ordered {how}, each "
            f"shown on its own: {', '.join(job.labels)}."
        )
        numbers = [r.attempt_order for r in runs if r.attempt_order is not None]
        if len(numbers) != len(set(numbers)):
            job.notes.append(
                "Several runs of this job recorded the same attempt number (a rerun under the "
                "same counters, or torchrun agents on different nodes that counted restarts "
                "differently); they are ordered by when their processes started."
            )
    if others:
        job.notes.append(other_jobs_note(others))
    return job


def _now(now_s: float | None) -> float:
    return time.time() if now_s is None else now_s


def _last_seen(run: Run) -> tuple[bool, int]:
    """The run seen last: the latest time of any rank (runs without a run id come last)."""
    return (run.run_id is not None, run.last_ns or 0)


def order_runs(runs: list[Run]) -> list[Run]:
    """``runs`` in the order they ran: by attempt when every run has one (``dl.run.attempt``,
    or Megatron-LM's counters), else by the earliest ``process.creation.time`` of their ranks,
    else by their first record; ties by their first record."""
    by_attempt = all(run.attempt_order is not None for run in runs)

    def key(run: Run) -> tuple:
        start = run.created_s if run.created_s is not None else (run.first_ns or 0) / 1e9
        if by_attempt:
            return (run.attempt_order, start, run.first_ns or 0)
        return ((), start, run.first_ns or 0)

    return sorted(runs, key=key)
