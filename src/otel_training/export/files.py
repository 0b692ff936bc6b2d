"""The embedded default's files: one directory per run, opened safely, never glued to a torn
line, and written on whatever happens to the directory.

Layout, in the output directory (``OTEL_PYTHON_TRAINING_OUTPUT_DIR``, default
``./otel-training-telemetry``)::

    otel-training-telemetry/
        latest -> 20261201-091143-a3f9c1-a1     (a relative symlink to the newest run)
        20261201-091143-a3f9c1-a0/              (the run id, ``dl.run.id``: one per attempt)
            metrics-rank0.jsonl  traces-rank0.jsonl  spans-rank0.jsonl  logs-rank0.jsonl
            metrics-rank1.jsonl  ...
            gaps-rank0.jsonl                    (only after a write failed: what was lost)
        20261201-091143-a3f9c1-a1/              (the next attempt of the same job)

Every rank of a run computes the same directory from the run id (no communication), so a run's
files are together and two attempts never share a file.

Files are opened for appending without following a symlink planted at their path
(``O_NOFOLLOW``: such a file is refused with an ``OSError``), and when an earlier process left
the file with a torn last line (killed, or the disk was full), a newline is written first, so
that nothing new is glued to or lost behind it. Text is written as UTF-8 with backslash escapes
for anything that cannot be encoded: writing never raises on a value.

**When the directory's world changes mid-run** (:class:`AppendStream`): a run directory removed
(a cleanup script, ``rm -rf``) is recreated at the next write, with one warning that names the
path and the variable that set it and how many lines went with the removed directory; a write
that fails (disk full ``ENOSPC``, quota ``EDQUOT``, file size limit ``EFBIG``, file system
remounted read-only ``EROFS``, the directory replaced by a file) drops the lines of that write,
warns once, and is retried at the next export; when writing works again, one warning says how
many lines (and spans or log records) were lost and when, and a line in ``gaps-rank{R}.jsonl``
records it for ``otel-training report``. Writing never moves elsewhere mid-run: a run's files
stay in one directory.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = [
    "GAPS",
    "LATEST",
    "MAX_LINE_BYTES",
    "AppendStream",
    "open_append",
    "run_directory",
    "run_directory_name",
]

_logger = logging.getLogger("otel_training")

#: Signal name of the files that record lost lines: ``gaps-rank{R}.jsonl``.
GAPS = "gaps"

#: Name of the symlink to the newest run's directory.
LATEST = "latest"
#: Longest line of any file here, in bytes: the default maximum of the collector's filelog and
#: otlp_json_file receivers, which cut longer lines.
MAX_LINE_BYTES = 1024 * 1024
#: What an OTLP-JSON line is kept under, by the worst-case estimate of
#: :mod:`otel_training.export.limits` (its records, and its resources and scopes once each).
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
    fd = _open_fd(path)
    try:
        raw = io.FileIO(fd, "a")  # closes fd when closed
    except BaseException:
        os.close(fd)
        raise
    return io.TextIOWrapper(
        io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", newline="\n"
    )


def _open_fd(path: str) -> int:
    """An append-only descriptor of ``path`` (created 0644, never through a symlink), after a
    newline when the file ends inside a line."""
    # Close-on-exec without asking: os.open makes every descriptor non-inheritable (PEP 446).
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _reason(error: OSError) -> str:
    code = errno.errorcode.get(error.errno)
    text = error.strerror or str(error)
    return f"{code}: {text}" if code else text


_RANK_OF_FILE = re.compile(r"^(?P<signal>[a-z]+)-rank(?P<rank>\d+)\.jsonl$")
#: Outages of one file announced by a warning each; later ones are only counted (and said at
#: close), so that a flapping disk does not flood the log.
MAX_OUTAGE_WARNINGS = 5

# What happened to a directory is said once, by the first of its files to meet it: the
# directory's failing files, and the inode of each recreation already announced.
_events_lock = threading.Lock()
_failing: dict[str, int] = {}
_recreations: set[tuple[str, int]] = set()


def _first_to_fail(directory: str) -> bool:
    with _events_lock:
        count = _failing.get(directory, 0)
        _failing[directory] = count + 1
        return count == 0


def _recovered(directory: str) -> None:
    with _events_lock:
        count = _failing.get(directory, 0) - 1
        if count > 0:
            _failing[directory] = count
        else:
            _failing.pop(directory, None)


def _first_to_recreate(directory: str) -> bool:
    try:
        key = (directory, os.stat(directory).st_ino)
    except OSError:
        return True
    with _events_lock:
        if key in _recreations:
            return False
        _recreations.add(key)
        return True


class AppendStream:
    """A text stream that appends to one file of a run directory and keeps doing so when the
    directory is removed, fills up or turns read-only (see the module docstring).

    What is written is kept in memory until :meth:`flush`, which writes it with one
    ``os.write``: the exporters and the span JSON lines writer call ``write`` then ``flush``
    once per export, so one export is one write, written whole or counted as lost whole.

    Args:
        path: The file (in its run directory, inside the output directory).
        what: What the file holds, for messages (``metrics``, ``spans``...).
        setting: The variable that chose the directory, as messages show it (for example
            ``OTEL_PYTHON_TRAINING_OUTPUT_DIR=/data/telemetry``).
        identity: Resource attributes written on each gap record (``dl.run.id``,
            ``service.instance.id``, ``dl.rank``), so the report can tell whose lines were lost.

    Raises:
        OSError: from the constructor only, when the file cannot be opened.

    Thread-safe; runs on the exporters' and the writer's threads, never on the training
    thread. Never raises after construction.
    """

    def __init__(
        self,
        path: str,
        *,
        what: str,
        setting: str,
        identity: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = path
        self._directory = os.path.dirname(os.path.abspath(path))
        self._what = what
        self._setting = setting
        self._identity = dict(identity or {})
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._pending_records = 0
        self._fd: int | None = _open_fd(path)
        self._torn = False
        self._closed = False
        #: Lines written since the file was (re)created.
        self.lines_written = 0
        #: Lines that could not be written, in total.
        self.lost_lines = 0
        #: Records (spans, log records) in those lines, where the writer said how many.
        self.lost_records = 0
        #: Lines that were in the file when its directory was removed, in total.
        self.gone_lines = 0
        self._outage: dict[str, Any] | None = None
        self._outages = 0
        self._gone = 0  # lines of a removed file not yet said
        self._was_removed = False

    # -- the stream interface of the exporters -------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        """Queues ``text`` for the next :meth:`flush`; returns its length."""
        with self._lock:
            if not self._closed:
                self._pending.append(text)
        return len(text)

    def records(self, count: int) -> None:
        """Says that what is written until the next :meth:`flush` holds ``count`` records
        (spans, log records), so that a loss can be counted in them."""
        with self._lock:
            self._pending_records += count

    def flush(self) -> None:
        """Writes what was queued: into the file, recreated first if its directory was
        removed; on a failure the lines are dropped and counted (see the class docstring)."""
        with self._lock:
            if not self._pending:
                self._pending_records = 0
                return
            text = "".join(self._pending)
            records = self._pending_records
            self._pending.clear()
            self._pending_records = 0
            self._commit(text, records)

    def close(self) -> None:
        """Flushes, closes the file, and says what was lost if writing had not recovered.
        Idempotent."""
        self.flush()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._outage is not None:
                self._end_outage(recovered=False)
            if self._outages > MAX_OUTAGE_WARNINGS:
                _logger.warning(
                    "otel-training: %d lines of %s could not be written to %s in %d outages "
                    "in all (%s).",
                    self.lost_lines,
                    self._what,
                    self.name,
                    self._outages,
                    self._setting,
                )
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None

    def fileno(self) -> int:
        if self._fd is None:
            raise OSError(errno.EBADF, "the file is not open")
        return self._fd

    # -- writing -------------------------------------------------------------------------

    def _commit(self, text: str, records: int) -> None:
        """Writes ``text`` (whole lines) with one ``os.write`` where possible. When a write
        fails part-way (a full disk), the lines that reached the file whole count as written,
        the rest as lost (with all ``records``), and the next write starts on a new line."""
        lines = text.count("\n") or 1
        data = text.encode("utf-8", "backslashreplace")
        lead = b""  # the newline that ends a torn last line, once the file is known
        written = 0
        try:
            fd = self._usable_fd()
            lead = b"\n" if self._torn else b""
            payload = lead + data
            view = memoryview(payload)
            while written < len(payload):
                written += os.write(fd, view[written:])
        except OSError as error:
            done = max(0, written - len(lead))
            whole = data.count(b"\n", 0, done)
            if done:
                self._torn = not data[:done].endswith(b"\n")
                self.lines_written += whole
            elif written:  # only the newline that ends an earlier torn line got out
                self._torn = False
            self._lose(lines - whole, records if whole < lines else 0, error)
            return
        self._torn = False
        self.lines_written += lines
        if self._outage is not None:
            self._end_outage(recovered=True)

    def _usable_fd(self) -> int:
        """The descriptor to write to: the open one while its file is still linked, else the
        file opened anew (its directory recreated).

        Raises:
            OSError: when the file cannot be (re)opened.
        """
        fd = self._fd
        if fd is not None:
            try:
                if os.fstat(fd).st_nlink > 0:
                    return fd
            except OSError:
                pass
            try:
                os.close(fd)
            except OSError:
                pass
            self._fd = None
            # The file (its directory) was removed while open: what it held is gone with it.
            self._gone, self.lines_written = self._gone + self.lines_written, 0
            self._was_removed = True
        os.makedirs(self._directory, exist_ok=True)
        _point_latest(os.path.dirname(self._directory), os.path.basename(self._directory))
        self._fd = _open_fd(self.name)
        self._torn = False
        if self._was_removed:
            self._recreated()
        return self._fd

    def _recreated(self) -> None:
        """The file is open again after it was removed: one warning for the directory (by
        the first of its files to be recreated), one gap record per file."""
        gone, self._gone = self._gone, 0
        self._was_removed = False
        self.gone_lines += gone
        if self._outage is not None:
            self._outage["gone_lines"] += gone
            return
        if _first_to_recreate(self._directory):
            _logger.warning(
                "otel-training: the run directory %s was removed while it was written (set "
                "by %s); recreated it, and writing resumes there. What its files held is gone "
                "with it (%d lines of %s); gaps-rank*.jsonl there counts each file's, and "
                "otel-training report shows them.",
                self._directory,
                self._setting,
                gone,
                os.path.basename(self.name),
            )
        self._gap(
            {
                "from_unix_ns": None,
                "to_unix_ns": time.time_ns(),
                "lost_lines": 0,
                "lost_records": 0,
                "gone_lines": gone,
                "reason": "the file was removed (its directory deleted?) and recreated",
            }
        )

    def _lose(self, lines: int, records: int, error: OSError) -> None:
        self.lost_lines += lines
        self.lost_records += records
        if self._outage is None:
            self._outages += 1
            self._outage = {
                "from_unix_ns": time.time_ns(),
                "lost_lines": 0,
                "lost_records": 0,
                "gone_lines": 0,
                "reason": _reason(error),
            }
            first = _first_to_fail(self._directory)
            if first and self._outages <= MAX_OUTAGE_WARNINGS:
                removed = (
                    f"; it was removed, with the {self._gone} lines it held, and cannot be "
                    "recreated"
                    if self._was_removed
                    else ""
                )
                _logger.warning(
                    "otel-training cannot write %s to %s (%s%s; the directory is set by %s); "
                    "what cannot be written is dropped and counted, and writing is retried at "
                    "each export.",
                    self._what,
                    self.name,
                    _reason(error),
                    removed,
                    self._setting,
                )
        self._outage["lost_lines"] += lines
        self._outage["lost_records"] += records

    def _end_outage(self, *, recovered: bool) -> None:
        outage, self._outage = self._outage, None
        if outage is None:
            return
        _recovered(self._directory)
        outage["to_unix_ns"] = time.time_ns()
        outage["gone_lines"] += self._gone
        self.gone_lines += self._gone
        self._gone = 0
        if self._outages <= MAX_OUTAGE_WARNINGS:
            noun = {"traces": "spans", "logs": "log records"}.get(self._what, "records")
            records = f" ({outage['lost_records']} {noun})" if outage["lost_records"] else ""
            _logger.warning(
                "otel-training %s %s: %d lines%s could not be written in %.1f s (%s) and are "
                "lost (%s).",
                "writes again to" if recovered else "stopped writing, with writes failing, to",
                self.name,
                outage["lost_lines"],
                records,
                (outage["to_unix_ns"] - outage["from_unix_ns"]) / 1e9,
                outage["reason"],
                self._setting,
            )
        self._gap(outage)

    def _gap(self, gap: Mapping[str, Any]) -> None:
        """Appends one record of ``gap`` to this rank's ``gaps-rank{R}.jsonl``: best effort
        (when that cannot be written either, the warning is all that says it)."""
        match = _RANK_OF_FILE.match(os.path.basename(self.name))
        rank = match["rank"] if match else "0"
        record = {
            "record": "gap",
            "file": os.path.basename(self.name),
            "signal": match["signal"] if match else self._what,
            **gap,
            "resource": self._identity,
        }
        line = (json.dumps(record, default=str) + "\n").encode()  # ASCII: json's default
        path = os.path.join(self._directory, f"{GAPS}-rank{rank}.jsonl")
        try:
            fd = _open_fd(path)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError:
            pass
