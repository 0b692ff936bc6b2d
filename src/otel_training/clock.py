"""One clock per process: wall time read once, at import, and carried forward by a monotonic clock.

A wall clock that NTP steps mid-run (or a person with ``date -s``) would make a span that
straddles the step negative or hours long, and a rate over it meaningless. Everything that
otel-training times itself reads :func:`now_ns` / :func:`unix_s`: the Unix time of the anchor
(``time.time_ns()`` read once, when this module is imported, or again in a forked child) plus
the ``time.perf_counter_ns()`` elapsed since. Durations are therefore never negative and never
distorted by a step; absolute times drift from the host's stepped clock by at most the size of
the step, which ``otel-training report`` measures from the data across ranks.

:func:`process_creation_unix_s` is when the kernel started this process (``/proc/self/stat``
field 22 over the boot time), the value of the resource attribute ``process.creation.time`` and
the origin of the health ledger's ``startup`` phase: time before ``configure()`` is counted from
there. Nothing here raises.
"""

from __future__ import annotations

import os
import time

__all__ = [
    "now_ns",
    "perf_to_unix_ns",
    "process_creation_unix_s",
    "process_start_unix_s",
    "unix_s",
]

_perf_ns = time.perf_counter_ns
_anchor_unix_ns = time.time_ns()
_anchor_perf_ns = _perf_ns()


def now_ns() -> int:
    """Nanoseconds since the Unix epoch on this process's clock (anchor + monotonic elapsed)."""
    return _anchor_unix_ns + (_perf_ns() - _anchor_perf_ns)


def unix_s() -> float:
    """Seconds since the Unix epoch on this process's clock, as a float."""
    return (_anchor_unix_ns + (_perf_ns() - _anchor_perf_ns)) / 1e9


def perf_to_unix_ns(perf_ns: int) -> int:
    """The Unix time, in ns, of a ``time.perf_counter_ns()`` reading of this process."""
    return _anchor_unix_ns + (perf_ns - _anchor_perf_ns)


def process_start_unix_s(pid: int | None = None) -> float | None:
    """When the kernel started process ``pid`` (default: this one), in Unix seconds, from
    ``/proc/PID/stat`` field 22 (clock ticks since boot) and the boot time; ``None`` where
    ``/proc`` does not tell. Resolution: one clock tick (10 ms), plus the boot time's 10 ms."""
    try:
        with open(f"/proc/{'self' if pid is None else pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of proc(5), after pid and comm
        boot = _boot_unix_s()
        if boot is None:
            return None
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _boot_unix_s() -> float | None:
    """When this machine booted, in Unix seconds: now minus ``/proc/uptime`` (10 ms), else
    ``/proc/stat``'s ``btime``, which is whole seconds (cut, not rounded: a start time from it
    is up to 1 s early)."""
    try:
        with open("/proc/uptime", "rb") as uptime:
            return time.time() - float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/stat", "rb") as stat:
            return float(next(int(line.split()[1]) for line in stat if line.startswith(b"btime")))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


_creation: tuple[int, float] | None = None


def process_creation_unix_s() -> float:
    """When this process started, in Unix seconds on this process's clock: the kernel's start
    time where ``/proc`` tells (never later than now), else the anchor (when otel-training was
    first imported). Read once per process."""
    global _creation
    pid = os.getpid()
    if _creation is None or _creation[0] != pid:
        anchor = _anchor_unix_ns / 1e9
        started = process_start_unix_s()
        # Ticks and boot time are 10 ms each: a start read from /proc may lie after the anchor.
        _creation = (pid, anchor if started is None else min(started, anchor))
    return _creation[1]


def _after_fork_in_child() -> None:
    """A forked child is a process of its own: a new anchor, its own creation time."""
    global _anchor_unix_ns, _anchor_perf_ns, _creation
    _anchor_unix_ns = time.time_ns()
    _anchor_perf_ns = _perf_ns()
    _creation = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
