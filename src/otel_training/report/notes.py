"""What was missing or odd in a run's files, as plain sentences for a person: the notes of the
report, the trace and ``otel-training health``, each worded once."""

from __future__ import annotations

import time

from otel_training.report.run import FileStats, Run
from otel_training.report.wording import plural as _plural
from otel_training.report.wording import rank_list as _rank_list
from otel_training.report.wording import ranks_phrase
from otel_training.semconv.attributes import DL_WORLD_SIZE

__all__ = ["IN_PROGRESS_S", "file_notes", "followed", "other_jobs_note", "run_notes"]

IN_PROGRESS_S = 60.0
"""Files modified less than this many seconds ago, with spans still open, mean a run that is
probably still in progress, unless a later attempt of its job has started since
(:func:`followed`): then it ended without shutting down."""


def other_jobs_note(jobs: list[str]) -> str:
    """The note on runs of other jobs in a job's files, left out (named by their jobs)."""
    return (
        f"The files also hold runs of {_plural(len(jobs), 'other job')} "
        f"({', '.join(jobs[:5])}{'...' if len(jobs) > 5 else ''}), left out."
    )


_IN_PROGRESS_MARK = "the run is probably still in progress"
_ENDED_NOTE = (
    "A later attempt of this job has started since: this attempt ended without shutting down "
    "(killed, or its processes died), and its spans that never ended stop where it did."
)


def followed(run: Run) -> None:
    """Rewords ``run``'s notes for an attempt that a later attempt of its job followed (the
    job's reading knows, :func:`otel_training.report.load_job`): spans still open then mean
    it ended without shutting down, never that it is still in progress."""
    run.notes[:] = [_ENDED_NOTE if _IN_PROGRESS_MARK in note else note for note in run.notes]


def _clock(ns: int | None) -> str:
    if ns is None:
        return "?"
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns // 1_000_000 % 1000:03d}"


def _gap_notes(run: Run) -> list[str]:
    """One note per gap the writers recorded (``gaps-rank*.jsonl``)."""
    notes = []
    for gap in run.gaps:
        if gap.gone_lines and not gap.lost_lines:
            notes.append(
                f"{gap.file} (rank {gap.rank}): its run directory was removed at "
                f"{_clock(gap.to_ns)} UTC and recreated; the {_plural(gap.gone_lines, 'line')} "
                "it held before went with it, so this shows what was written after."
            )
            continue
        records = f", {gap.lost_records:,} records" if gap.lost_records else ""
        gone = (
            f"; the {_plural(gap.gone_lines, 'line')} written before went with the removed "
            "directory"
            if gap.gone_lines
            else ""
        )
        notes.append(
            f"{gap.file} (rank {gap.rank}): {_plural(gap.lost_lines, 'line')}{records} could "
            f"not be written between {_clock(gap.from_ns)} and {_clock(gap.to_ns)} UTC "
            f"({gap.reason}){gone}: a gap in what this shows."
        )
    return notes


def file_notes(files: list[FileStats], *, torn: bool = False) -> list[str]:
    """A note per file that could not be read, per file with lines that could not be, and
    with ``torn`` per file whose last line is cut (normal for a killed run)."""
    notes = []
    for file in files:
        name = file.path.name
        if file.error:
            notes.append(f"{name} could not be read ({file.error}).")
        if torn and file.torn_last_line:
            notes.append(
                f"{name}: the last line is cut (a killed run, a full disk, or a run still "
                "writing it) and was skipped."
            )
        if file.bad_lines:
            notes.append(f"{name}: {_plural(file.bad_lines, 'line')} not readable, skipped.")
    return notes


def run_notes(run: Run, now_s: float, *, shown_alone: bool) -> list[str]:
    """Plain sentences on what was missing or odd in ``run``'s files; ``shown_alone``: the
    run is shown without the other runs of its files (which are then named)."""
    notes: list[str] = []
    if not run.files:
        notes.append(f"{run.directory} holds no *-rank*.jsonl file.")
        return notes
    by_signal: dict[str, set[int]] = {}
    for file in run.files:
        by_signal.setdefault(file.signal, set()).add(file.rank)
    notes.extend(file_notes(run.files, torn=True))
    ranks = sorted(run.ranks)
    for signal, what in (("metrics", "curves are"), ("spans", "timeline is")):
        have = by_signal.get(signal, set())
        if signal == "spans":
            have = have | by_signal.get("traces", set())
        missing = [r for r in ranks if r not in have]
        if not have:
            notes.append(
                f"No {signal} file ({signal}-rank*.jsonl"
                + (" or traces-rank*.jsonl" if signal == "spans" else "")
                + f"): the {what} empty."
            )
        elif missing:
            notes.append(f"No {signal} file for {ranks_phrase(missing)}.")
    world_size = run.resource.get(DL_WORLD_SIZE)
    if isinstance(world_size, int) and world_size > len(ranks) and ranks:
        notes.append(
            f"World size {world_size}, files of {_plural(len(ranks), 'rank')} only "
            f"({_rank_list(ranks)}): the other ranks wrote elsewhere or did not export "
            "(OTEL_PYTHON_TRAINING_EXPORT_RANKS)."
        )
    if shown_alone and run.other_run_ids:
        notes.append(
            f"These files also hold {_plural(len(run.other_run_ids), 'other run')} "
            f"({', '.join(run.other_run_ids[:5])}{'...' if len(run.other_run_ids) > 5 else ''}), "
            f"appended to the same files; only run {run.run_id} (the latest) is shown."
        )
    if shown_alone and run.same_id_runs:
        notes.append(
            f"These files also hold {_plural(run.same_id_runs, 'earlier run')} under the same "
            f"run id {run.run_id} (other processes of the same ranks, told apart by "
            "service.instance.id); only the latest is shown here, `otel-training report` shows "
            "each."
        )
    notes.extend(_gap_notes(run))
    notes.extend(offset.note for offset in run.clock_offsets)
    open_spans = [s for s in run.spans if s.open]
    if open_spans:
        names = sorted({s.name for s in open_spans})
        notes.append(
            f"{_plural(len(open_spans), 'span')} never ended ({', '.join(names[:4])}"
            f"{'...' if len(names) > 4 else ''}; "
            f"{ranks_phrase({s.rank for s in open_spans})}): shown open until the last "
            "time seen on their rank."
        )
    ended_at_exit = [s for s in run.spans if s.truncated and not s.open]
    if ended_at_exit:
        notes.append(
            f"{_plural(len(ended_at_exit), 'span')} "
            f"{'was' if len(ended_at_exit) == 1 else 'were'} still open at exit or SIGTERM and "
            f"{'was' if len(ended_at_exit) == 1 else 'were'} ended then (truncated)."
        )
    newest = max((f.mtime_s for f in run.files), default=0.0)
    if open_spans and now_s - newest < IN_PROGRESS_S:
        notes.append(
            f"The files were written {max(now_s - newest, 0.0):.0f} s ago and spans are "
            f"still open: {_IN_PROGRESS_MARK}; this shows what is on disk now."
        )
    if run.is_empty:
        notes.append("No metric point and no span could be read: the run is empty.")
    return notes
