"""Where a run's files are: the run directory of the embedded default exporter.

The embedded default writes one directory per run, ``OUTPUT_DIR/<run-dir>/``, holding per
rank R ``metrics-rank{R}.jsonl``, ``traces-rank{R}.jsonl`` (OTLP-JSON lines),
``spans-rank{R}.jsonl`` (span JSON lines, ``docs/spans.md``) and ``logs-rank{R}.jsonl``;
``OUTPUT_DIR/latest`` links to the newest run directory. Older versions wrote the same files
directly into ``OUTPUT_DIR`` (the flat layout), which is read the same way.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_training.files import run_directory_name
from otel_training.report.attempts import identity_of

__all__ = [
    "RANK_FILE",
    "RunFile",
    "RunNotFoundError",
    "find_run_directory",
    "job_directories",
    "peek_resource",
    "run_files",
]

RANK_FILE = re.compile(r"^(?P<signal>[a-z]+)-rank(?P<rank>\d+)\.jsonl$")
"""The name of a rank's file: ``{signal}-rank{R}.jsonl`` (signal ``metrics``, ``traces``,
``spans``, ``logs``)."""

LATEST = "latest"

GAPS = "gaps"
"""The signal of ``gaps-rank{R}.jsonl``: what a rank's writers could not write, and when
(:class:`otel_training.files.AppendStream`)."""


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


#: Longest first line :func:`peek_resource` reads, in bytes (a line is at most 1 MiB).
_PEEK_BYTES = 2 * 1024 * 1024
#: Signals whose first line names the resource, cheapest first.
_PEEK_ORDER = ("spans", "metrics", "traces", "logs")


def peek_resource(directory: str | os.PathLike) -> dict[str, Any]:
    """The resource attributes of the first readable line of the run directory ``directory``
    (a span line's ``resource``, else an OTLP-JSON line's first resource), read without
    reading the files through; empty when none could be read. Never raises."""
    files = sorted(
        run_files(directory),
        key=lambda f: (_PEEK_ORDER.index(f.signal) if f.signal in _PEEK_ORDER else 9, f.rank),
    )
    for file in files:
        try:
            with open(file.path, "rb") as handle:
                line = handle.readline(_PEEK_BYTES)
            document = json.loads(line)
        except (OSError, ValueError):
            continue
        resource = _resource_of(document)
        if resource:
            return resource
    return {}


def _resource_of(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        return {}
    if isinstance(document.get("resource"), dict):  # a span line
        return dict(document["resource"])
    for key in ("resourceMetrics", "resourceSpans", "resourceLogs"):
        entries = document.get(key)
        if isinstance(entries, list) and entries and isinstance(entries[0], dict):
            pairs = entries[0].get("resource", {}).get("attributes", ())
            found: dict[str, Any] = {}
            for pair in pairs if isinstance(pairs, list) else ():
                value = pair.get("value", {}) if isinstance(pair, dict) else {}
                for kind in ("stringValue", "intValue", "doubleValue", "boolValue"):
                    if kind in value:
                        raw = value[kind]
                        found[pair.get("key")] = int(raw) if kind == "intValue" else raw
            return found
    return {}


def job_directories(run_directory: str | os.PathLike) -> list[Path]:
    """The run directories of the job that ``run_directory`` belongs to: itself and its
    siblings in the output directory whose files name the same job (``dl.job.id``, or
    Megatron-LM's name for it, :mod:`otel_training.report.attempts`), each absolute. A
    directory of the flat layout (files of several runs directly in the output directory), or
    one whose files name no job, is alone. Never raises."""
    base = Path(run_directory).absolute()
    identity = identity_of(peek_resource(base))
    if identity.job_id is None or identity.run_id is None:
        return [base]
    if run_directory_name(identity.run_id) != base.name:
        return [base]  # not a run directory of the embedded default: the flat layout
    found = [base]
    try:
        entries = sorted(os.scandir(base.parent), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        try:
            if entry.name == LATEST or not entry.is_dir() or entry.is_symlink():
                continue
        except OSError:
            continue
        path = Path(entry.path).absolute()
        if path == base:
            continue
        if identity_of(peek_resource(path)).job_id == identity.job_id:
            found.append(path)
    return found
