"""Where a run's files are: the run directory of the embedded default exporter.

The embedded default writes one directory per run, ``OUTPUT_DIR/<run-dir>/``, holding per
rank R ``metrics-rank{R}.jsonl``, ``traces-rank{R}.jsonl`` (OTLP-JSON lines),
``spans-rank{R}.jsonl`` (span JSON lines, ``docs/spans.md``) and ``logs-rank{R}.jsonl``;
``OUTPUT_DIR/latest`` links to the newest run directory. Older versions wrote the same files
directly into ``OUTPUT_DIR`` (the flat layout), which is read the same way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_training.export.files import run_directory_name
from otel_training.health import record as _record
from otel_training.report import otlp
from otel_training.report.attempts import identity_of, job_key

__all__ = [
    "RANK_FILE",
    "RunFile",
    "RunNotFoundError",
    "find_run_directory",
    "job_directories",
    "newest_resource",
    "run_files",
]

RANK_FILE = re.compile(r"^(?P<signal>[a-z]+)-rank(?P<rank>\d+)\.jsonl$")
"""The name of a rank's file: ``{signal}-rank{R}.jsonl`` (signal ``metrics``, ``traces``,
``spans``, ``logs``)."""

LATEST = "latest"

GAPS = "gaps"
"""The signal of ``gaps-rank{R}.jsonl``: what a rank's writers could not write, and when
(:class:`otel_training.export.files.AppendStream`)."""


class RunNotFoundError(Exception):
    """No run directory (a directory holding ``*-rank*.jsonl`` files) was found."""


@dataclass(frozen=True)
class RunFile:
    """One rank's file of one signal.

    Attributes:
        path: The file.
        signal: ``metrics``, ``traces``, ``spans``, ``logs`` (or another word before ``-rank``).
        rank: The rank in the file name.
    """

    path: Path
    signal: str
    rank: int


def run_files(directory: str | os.PathLike) -> list[RunFile]:
    """The rank files directly in ``directory``, sorted by signal then rank.

    Never raises: an unreadable directory has no files.
    """
    found = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        match = RANK_FILE.match(entry.name)
        if match is None:
            continue
        try:
            if not entry.is_file():
                continue
        except OSError:
            continue
        found.append(RunFile(Path(entry.path), match["signal"], int(match["rank"])))
    found.sort(key=lambda f: (f.signal, f.rank))
    return found


def _newest_run_subdirectory(directory: Path) -> Path | None:
    best: tuple[float, str] | None = None
    chosen = None
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    for entry in entries:
        try:
            if not entry.is_dir() or entry.name == LATEST:
                continue
        except OSError:
            continue
        files = run_files(entry.path)
        if not files:
            continue
        newest = max(_mtime(f.path) for f in files)
        key = (newest, entry.name)
        if best is None or key > best:
            best, chosen = key, Path(entry.path)
    return chosen


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def default_output_directory(environ: Mapping[str, str] | None = None) -> Path:
    """``OTEL_PYTHON_TRAINING_OUTPUT_DIR`` as the embedded default reads it (default
    ``otel-training-telemetry`` in the working directory). Never raises."""
    from otel_training import config

    return Path(config.load(environ).output_dir)


def find_run_directory(
    directory: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None
) -> Path:
    """Resolves ``directory`` to the run directory to read.

    In order: ``directory`` itself when it holds ``*-rank*.jsonl`` files (a run directory, or
    the flat layout of older versions); else ``directory/latest`` when that holds them; else
    the subdirectory whose files were modified last. ``directory`` defaults to the output
    directory of the environment (:func:`default_output_directory`).

    Returns:
        The run directory, absolute.

    Raises:
        RunNotFoundError: when none of these holds rank files; the message says what was
            looked at.
    """
    base = Path(directory) if directory is not None else default_output_directory(environ)
    if not base.exists():
        raise RunNotFoundError(f"{base} does not exist")
    if not base.is_dir():
        raise RunNotFoundError(f"{base} is not a directory")
    if run_files(base):
        return base.absolute()
    latest = base / LATEST
    if latest.is_dir() and run_files(latest):
        return latest.resolve()
    newest = _newest_run_subdirectory(base)
    if newest is not None:
        return newest.absolute()
    raise RunNotFoundError(
        f"no run in {base}: neither it, {LATEST}/ nor a subdirectory holds *-rank*.jsonl files"
    )


#: Bytes read from the end of a span file to find its last line (a line is at most 1 MiB).
_TAIL_BYTES = 2 * 1024 * 1024


def _last_line(path: Path) -> bytes | None:
    """The last complete line of a file (a torn tail skipped), from its last
    :data:`_TAIL_BYTES`."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            start = max(0, size - _TAIL_BYTES)
            handle.seek(start)
            tail = handle.read()
    except OSError:
        return None
    lines = tail.split(b"\n")
    if start > 0:
        lines = lines[1:]
    for line in reversed(lines if tail.endswith(b"\n") else lines[:-1]):
        if line.strip():
            return line
    return None


def _first_line(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.readline(_TAIL_BYTES)
    except OSError:
        return None


def newest_resource(directory: str | os.PathLike) -> dict[str, Any]:
    """The resource attributes of the newest process whose lines are in the run directory
    ``directory``: that of the last line of its newest span file, else of the first line of a
    metrics file (read without reading the files through), else the identity in its newest
    progress record; empty when none could be read. Never raises."""
    files = run_files(directory)
    spans = sorted((f for f in files if f.signal == "spans"), key=lambda f: -_mtime(f.path))
    candidates = [(f, _last_line) for f in spans] + [
        (f, _first_line) for f in files if f.signal == "metrics"
    ]
    for file, read in candidates:
        line = read(file.path)
        if not line:
            continue
        try:
            resource = otlp.resource_of(otlp.loads(line))
        except otlp.Torn:
            continue
        if job_key(resource) is not None:
            return resource
    # no line: a process killed before it wrote any leaves its progress record
    try:
        records = sorted(Path(directory).glob(_record.FILE_GLOB), key=_mtime, reverse=True)
    except OSError:
        records = []
    for path in records:
        found = _record.read(path)
        if found is not None and job_key(found.identity) is not None:
            return {k: v for k, v in found.identity.items() if k != "created_s"}
    return {}


def job_directories(
    run_directory: str | os.PathLike, job: str | None = None, run_id: str | None = None
) -> list[Path]:
    """The run directories of a job: ``run_directory`` and its siblings in the output
    directory whose newest process (:func:`newest_resource`) belongs to the same job
    (:func:`otel_training.report.attempts.job_key`: ``dl.job.id`` or Megatron-LM's name for
    it, else the run id less ``-a{N}``), each absolute, in name order.

    ``job`` and ``run_id`` are those of the run shown, when it was read already; else those of
    the newest process in ``run_directory``. A directory of the flat layout (files of several
    runs directly in the output directory: its name is not that of the run), or one whose
    files name no job, is alone. Never raises."""
    base = Path(run_directory).absolute()
    if job is None and run_id is None:
        resource = newest_resource(base)
        identity = identity_of(resource)
        job, run_id = job_key(resource), identity.run_id
    if job is None or run_id is None or run_directory_name(run_id) != base.name:
        return [base]
    found = [base]
    try:
        entries = list(os.scandir(base.parent))
    except OSError:
        return found
    for entry in entries:
        try:
            if entry.name == LATEST or not entry.is_dir() or entry.is_symlink():
                continue
        except OSError:
            continue
        path = Path(entry.path).absolute()
        if path != base and job_key(newest_resource(path)) == job:
            found.append(path)
    return sorted(found, key=lambda p: p.name)
