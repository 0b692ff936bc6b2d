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

import os
import time
from collections.abc import Mapping

from otel_training import config
from otel_training.health import goodput as _goodput
from otel_training.health import hang as _hang
from otel_training.health import incidents as _incidents
from otel_training.health import straggler as _straggler
from otel_training.health.evidence import Attempt, Job, attempts
from otel_training.report import run as _run
from otel_training.report.health_incidents import (
    hang_incidents,
    judge_attempt,
    rank_counters,
    stacks_by_rank,
    straggler_incidents,
)
from otel_training.report.health_text import format_text
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
            item.stacks = stacks_by_rank(attempt)
        item.stragglers = _straggler.assess(rank_counters(attempt), window_steps)
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
            f"its last record is {duration(attempt.end_s - following.start_s)} after the next "
            "attempt's first process started: the hosts' clocks disagree or the attempts "
            "overlapped, so its end is cut there and the downtime after it is taken as 0"
        )
    blind = [p for p in attempt.processes if p.record is None]
    if blind and account.ended == "killed":
        interval = max(p.export_interval_s for p in blind)
        found.append(
            f"{ranks_phrase(sorted({p.rank for p in blind}))} kept no progress record "
            f"(ledger-rank*.bin): the end is placed at the last export or span line, up to "
            f"{duration(interval)} early, so lost progress and downtime are estimates"
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
