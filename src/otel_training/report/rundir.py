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

__all__ = ["RANK_FILE", "RunFile", "RunNotFoundError", "find_run_directory", "run_files"]

RANK_FILE = re.compile(r"^(?P<signal>[a-z]+)-rank(?P<rank>\d+)\.jsonl$")
"""The name of a rank's file: ``{signal}-rank{R}.jsonl`` (signal ``metrics``, ``traces``,
``spans``, ``logs``)."""

LATEST = "latest"


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
