"""The embedded default's files: one directory per run, opened safely, never glued to a torn
line.

Layout, in the output directory (``OTEL_PYTHON_TRAINING_OUTPUT_DIR``, default
``./otel-training-telemetry``)::

    otel-training-telemetry/
        latest -> 20261201-091143-a3f9c1        (a relative symlink to the newest run)
        20261201-091143-a3f9c1/                 (the run id, ``dl.run.id``)
            metrics-rank0.jsonl  traces-rank0.jsonl  spans-rank0.jsonl  logs-rank0.jsonl
            metrics-rank1.jsonl  ...

Every rank of a run computes the same directory from the run id (no communication), so a run's
files are together and two runs never share a file. A run that continues under the same run id
(a torchrun elastic restart) appends to its files.

Files are opened for appending without following a symlink planted at their path
(``O_NOFOLLOW``: such a file is refused with an ``OSError``), and when an earlier process left
the file with a torn last line (killed, or the disk was full), a newline is written first, so
that nothing new is glued to or lost behind it. Text is written as UTF-8 with backslash escapes
for anything that cannot be encoded: writing never raises on a value.
"""

from __future__ import annotations

import io
import os
import re
from typing import TextIO

__all__ = [
    "LATEST",
    "MAX_LINE_BYTES",
    "open_append",
    "run_directory",
    "run_directory_name",
]

#: Name of the symlink to the newest run's directory.
LATEST = "latest"
#: Longest line of any file here, in bytes: the default maximum of the collector's filelog and
#: otlp_json_file receivers, which cut longer lines.
MAX_LINE_BYTES = 1024 * 1024
#: What an OTLP-JSON line is kept under, by the worst-case estimate of
#: :mod:`otel_training.limits` (its records, and its resources and scopes once each).
LINE_BUDGET_BYTES = 900_000

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 128


def run_directory_name(run_id: str) -> str:
    """The directory name of the run ``run_id``: characters other than letters, digits,
    ``.``, ``_`` and ``-`` become ``_``; at most 128 characters; never empty, ``.`` or ``..``."""
    name = _UNSAFE.sub("_", run_id)[:_MAX_NAME].strip(".")
    return name or "run"


def run_directory(output_dir: str, run_id: str) -> str:
    """Creates (if needed) and returns the absolute directory of ``run_id`` in ``output_dir``,
    and points ``output_dir/latest`` at it.

    Raises:
        OSError: when the directory cannot be created. A ``latest`` link that cannot be
        updated (a file system without symlinks) is left as it is.
    """
    directory = os.path.abspath(os.path.join(output_dir, run_directory_name(run_id)))
    os.makedirs(directory, exist_ok=True)
    _point_latest(os.path.dirname(directory), os.path.basename(directory))
    return directory


def _point_latest(parent: str, name: str) -> None:
    link = os.path.join(parent, LATEST)
    try:
        if os.readlink(link) == name:
            return
    except OSError:
        pass
    staged = os.path.join(parent, f".{LATEST}.{os.getpid()}")
    try:
        if os.path.lexists(staged):
            os.unlink(staged)
        os.symlink(name, staged)
        os.replace(staged, link)  # atomic: ranks racing here all point it at the same run
    except OSError:
        try:
            os.unlink(staged)
        except OSError:
            pass


def open_append(path: str) -> TextIO:
    """Opens ``path`` for appending UTF-8 text, creating it (mode 0644) if missing.

    Never follows a symlink at ``path``; writes a newline first when the file ends inside a
    line. Encoding errors are written as backslash escapes.

    Raises:
        OSError: when the file cannot be opened, or ``path`` is a symlink (``ELOOP``).
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")
        raw = io.FileIO(fd, "a", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    return io.TextIOWrapper(
        io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", newline="\n"
    )
