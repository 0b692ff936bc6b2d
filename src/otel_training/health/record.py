"""The progress record: the ledger's state at its last transition, in a memory-mapped file that
outlives the process (``docs/health.md``, "The progress record").

An export every few seconds cannot say when a process that was killed (SIGKILL, the OOM killer,
a node lost) last progressed: everything after the last export would be a guess. So the ledger
(:mod:`otel_training.health.ledger`) keeps its hot state, the phase times, the innermost phase,
the time of its last transition and its progress, in slots of a small shared mapping of a file
in the run directory, ``ledger-rank{R}-{tag}.bin``. A store into a shared mapping is a store into
the page cache: it is in the file as soon as it is made, whatever happens to the process after,
and costs what a store into a list costs (no system call, no lock). ``otel-training health``
reads the file after the process died (or while it runs) as one more sample of the ledger, taken
at its last transition: lost progress and downtime are then exact to the phase, with the default
span groups, as they are with per-step spans.

**Layout** (4,096 bytes, little-endian): ``MAGIC`` (8 bytes); at offset 64, :data:`SLOTS`
float64 slots (below; an iteration is a float64, exact to 2**53; NaN is "none"); at offset 512,
the process's identity as UTF-8 JSON (``service.instance.id``, ``dl.rank``, ``dl.run.id``,
``dl.run.attempt``, ``process.creation.time`` as Unix seconds), NUL-padded. Times on the
training thread are ``time.perf_counter()`` seconds; ``UNIX_MINUS_PERF`` turns them into Unix
seconds (the clock of :mod:`otel_training.clock`).

A read while the process runs may see one transition half written (a phase time updated, its
end time not yet): the sample is then behind by at most that transition. Nothing here raises on
the training thread; :func:`read` returns ``None`` for a file that is no record.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import signal
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "FILE_GLOB",
    "MAGIC",
    "SIZE",
    "SLOTS",
    "LONGEST",
    "ProgressRecord",
    "create",
    "file_name",
    "private",
    "read",
]

#: The first 8 bytes of a record file (the last byte is the layout's version).
MAGIC: Final = b"otlrec\x00\x01"
#: Bytes of a record file.
SIZE: Final = 4096
_SLOTS_AT: Final = 64
_IDENTITY_AT: Final = 512

# The slots (float64 each). 0..9: seconds with each phase innermost (the ledger's PHASES
# order) up to SINCE.
PHASE_TIMES: Final = 10
SINCE: Final = 10  #: perf seconds of the last transition
OPEN: Final = 11  #: the code of the phase innermost since then
OPEN_START: Final = 12  #: perf seconds it opened
ITERATION: Final = 13  #: the last completed step (or restored by a load)
PROGRESS_UNIX: Final = 14  #: Unix seconds it completed
SAVED: Final = 15  #: the step the last good save holds
LOADED: Final = 16  #: the step the last load restored
SAFE_UNIX: Final = 17  #: Unix seconds the step of the last good checkpoint completed
UNIX_MINUS_PERF: Final = 18  #: Unix seconds minus perf seconds (the clock's anchor)
CREATED_UNIX: Final = 19  #: process creation, Unix seconds
SHUTDOWN_UNIX: Final = 20  #: when telemetry shut down (a clean exit or a signal's flush)
LOGGED: Final = 21  #: the step the training metrics recorded last describe
LONGEST_SAVE: Final = 22  #: seconds of the longest completed checkpoint save (0: none yet)
LONGEST_LOAD: Final = 23  #: seconds of the longest completed checkpoint load (0: none yet)
LONGEST_EVALUATE: Final = 24  #: seconds of the longest completed evaluation (0: none yet)
PAUSE_END: Final = 25  #: perf seconds the last pause (save, load, evaluation, warm-up) ended
ALIVE_UNIX: Final = 26  #: Unix seconds the process's hang watchdog last ran (its heartbeat)
RAISED_UNIX: Final = 27  #: Unix seconds a phase of the ledger, or the run, last raised an error
SIGNAL: Final = 28  #: the number of the signal telemetry flushed on (SIGTERM), NaN: none
#: Slots in all (those past 21 read 0 in a record of an older version: none).
SLOTS: Final = 29

#: The slot of the longest completed occurrence of each long phase, by the ledger's phase code
#: (``checkpoint_load`` 1, ``checkpoint_save`` 7, ``evaluate`` 8).
LONGEST: Final = {1: LONGEST_LOAD, 7: LONGEST_SAVE, 8: LONGEST_EVALUATE}
#: The record files of a run directory.
FILE_GLOB: Final = "ledger-rank*.bin"
_NONE: Final = math.nan


def file_name(rank: int, tag: str) -> str:
    """The record's file name for ``rank`` and this process's tag
    (:func:`otel_training.config.identity.process_tag`)."""
    return f"ledger-rank{rank}-{tag}.bin"


def private() -> memoryview:
    """Slots in this process's memory alone: what the ledger writes to until (and unless) a
    record file is attached. float64[:data:`SLOTS`], all NaN but the phase times (0)."""
    slots = memoryview(bytearray(SLOTS * 8)).cast("d")
    for i in range(PHASE_TIMES, SLOTS):
        slots[i] = _NONE
    return slots


def create(path: str | os.PathLike, identity: dict[str, Any]) -> memoryview:
    """Creates the record file at ``path`` and maps it shared: float64[:data:`SLOTS`] slots
    that the caller fills. The file's blocks are written (not a sparse file) before it is
    mapped, so that a store never meets a full disk (which would be SIGBUS).

    Raises:
        OSError: the file cannot be created or written (its directory is gone, full, read-only).
    """
    header = bytearray(SIZE)
    header[: len(MAGIC)] = MAGIC
    text = json.dumps(identity, separators=(",", ":"), default=str).encode("utf-8", "replace")
    text = text[: SIZE - _IDENTITY_AT - 1]
    header[_IDENTITY_AT : _IDENTITY_AT + len(text)] = text
    for i in range(SLOTS):
        struct.pack_into("<d", header, _SLOTS_AT + 8 * i, 0.0 if i < PHASE_TIMES else _NONE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        written = 0
        while written < SIZE:
            written += os.write(fd, header[written:])
        mapping = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return memoryview(mapping)[_SLOTS_AT : _SLOTS_AT + 8 * SLOTS].cast("d")


@dataclass(frozen=True)
class ProgressRecord:
    """One record file, read.

    Attributes:
        path: The file.
        identity: Its process's identity (the module docstring).
        time_s: Its last transition, Unix seconds.
        phase_s: Seconds per phase (the ledger's order) up to ``time_s``.
        open_phase: The code of the phase innermost at ``time_s``.
        open_s: Seconds it had been open then.
        iteration: The last completed step (or restored by a load), or ``None``.
        progress_s: When it completed, Unix seconds, or ``None``.
        saved_iteration: The step of the last good save, or ``None``.
        loaded_iteration: The step the last load restored, or ``None``.
        safe_s: When the step of the last good checkpoint completed, Unix seconds, or ``None``.
        created_s: Process creation, Unix seconds.
        shutdown_s: When telemetry shut down, Unix seconds, or ``None`` (it never did: killed).
        logged_iteration: The step the training metrics recorded last describe, or ``None``.
        longest_s: The longest completed occurrence of each long phase, seconds, by the
            ledger's phase code (only those that completed; empty in an older version).
        pause_end_s: When its last pause (checkpoint save or load, evaluation, warm-up)
            ended, Unix seconds, or ``None`` (none ended; an older version).
        alive_s: When its hang watchdog last ran, Unix seconds, or ``None`` (no watchdog,
            an older version): evidence of life while no transition happens.
        raised_s: When a phase of the ledger or the run last raised an error (an exception
            other than ``SystemExit(0)`` and ``GeneratorExit``, ``KeyboardInterrupt`` included),
            Unix seconds, or ``None`` (none did; an older version): what health's ``failed``
            reads when no step completed after it, with or without spans.
        signal: The name of the signal telemetry flushed and shut down on (``SIGTERM``), or
            ``None`` (a clean exit, a kill, an older version): what truncated spans say,
            known with every span group off too.
    """

    path: Path
    identity: dict[str, Any]
    time_s: float
    phase_s: tuple[float, ...]
    open_phase: int
    open_s: float
    iteration: int | None
    progress_s: float | None
    saved_iteration: int | None
    loaded_iteration: int | None
    safe_s: float | None
    created_s: float
    shutdown_s: float | None
    logged_iteration: int | None
    longest_s: dict[int, float] = field(default_factory=dict)
    pause_end_s: float | None = None
    alive_s: float | None = None
    raised_s: float | None = None
    signal: str | None = None

    @property
    def last_evidence_s(self) -> float:
        """Its latest evidence of life in the file, Unix seconds: the last transition, or the
        watchdog's heartbeat when later."""
        return self.time_s if self.alive_s is None else max(self.time_s, self.alive_s)


def _positive(x: float) -> float | None:
    return x if math.isfinite(x) and x > 0 else None


def _signal_name(x: float) -> str | None:
    """The name of signal number ``x`` (``SIGTERM``), ``None`` for none (NaN, 0) or a number
    that is no signal here."""
    if not (math.isfinite(x) and x > 0 and x == int(x)):
        return None
    try:
        return signal.Signals(int(x)).name
    except ValueError:
        return None


def _value(x: float) -> float | None:
    return None if math.isnan(x) else x


def _step(x: float) -> int | None:
    return None if math.isnan(x) or math.isinf(x) else int(x)


def read(path: str | os.PathLike) -> ProgressRecord | None:
    """The record in ``path``, or ``None`` when it is no record (another file, cut short, or
    before its process's first transition). Never raises."""
    try:
        with open(path, "rb") as file:
            data = file.read(SIZE)
    except OSError:
        return None
    if len(data) < SIZE or not data.startswith(MAGIC):
        return None
    slots = struct.unpack_from(f"<{SLOTS}d", data, _SLOTS_AT)
    try:
        text = data[_IDENTITY_AT:].split(b"\0", 1)[0].decode("utf-8", "replace")
        identity = json.loads(text) if text else {}
    except ValueError:
        identity = {}
    if not isinstance(identity, dict):
        identity = {}
    offset, since, created = slots[UNIX_MINUS_PERF], slots[SINCE], slots[CREATED_UNIX]
    if not all(math.isfinite(x) for x in (offset, since, created)):
        return None
    open_code = _step(slots[OPEN])
    open_start = slots[OPEN_START]
    shutdown = _value(slots[SHUTDOWN_UNIX])
    longest = {code: slots[i] for code, i in LONGEST.items() if _positive(slots[i]) is not None}
    pause_end = _positive(slots[PAUSE_END])
    return ProgressRecord(
        path=Path(path),
        identity=identity,
        time_s=since + offset,
        phase_s=tuple(max(0.0, x) for x in slots[:PHASE_TIMES]),
        open_phase=open_code if open_code is not None and 0 <= open_code < PHASE_TIMES else 9,
        open_s=max(0.0, since - open_start) if math.isfinite(open_start) else 0.0,
        iteration=_step(slots[ITERATION]),
        progress_s=_value(slots[PROGRESS_UNIX]),
        saved_iteration=_step(slots[SAVED]),
        loaded_iteration=_step(slots[LOADED]),
        safe_s=_value(slots[SAFE_UNIX]),
        created_s=created,
        shutdown_s=shutdown,
        logged_iteration=_step(slots[LOGGED]),
        longest_s=longest,
        pause_end_s=None if pause_end is None else pause_end + offset,
        alive_s=_positive(slots[ALIVE_UNIX]),
        raised_s=_positive(slots[RAISED_UNIX]),  # 0.0 in a record of a version without it
        signal=_signal_name(slots[SIGNAL]),
    )
