"""One clock per process (otel_training.clock): wall time read once and carried by the monotonic
clock, so a stepped wall clock moves nothing; process start times from /proc, read once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from support import fork_or_unavailable, not_here

from otel_training import clock

#: /proc/stat's btime is whole seconds, and a start is counted in clock ticks.
START_RESOLUTION_S = 1.0 + 1.0 / os.sysconf("SC_CLK_TCK")


def test_now_ns_unix_s_and_perf_to_unix_ns_are_one_clock():
    """now_ns, unix_s and perf_to_unix_ns(perf_counter_ns()) tell the same time, and a
    perf_counter_ns interval maps to the same interval in Unix nanoseconds."""
    before = clock.now_ns()
    perf = time.perf_counter_ns()
    seconds = clock.unix_s()
    after = clock.now_ns()
    assert before <= clock.perf_to_unix_ns(perf) <= after
    assert before / 1e9 <= seconds <= after / 1e9
    assert clock.perf_to_unix_ns(perf + 5_000_000_000) - clock.perf_to_unix_ns(perf) == 5 * 10**9
    assert abs(clock.now_ns() - time.time_ns()) < 60 * 10**9  # anchored on the wall clock


def test_a_stepped_wall_clock_does_not_move_the_process_clock(monkeypatch):
    """The wall clock set back an hour mid-run: durations stay positive and now_ns stays on its
    own course (the anchor was read once)."""
    before = clock.now_ns()
    stepped = time.time_ns() - 3600 * 10**9
    monkeypatch.setattr(time, "time_ns", lambda: stepped)
    monkeypatch.setattr(time, "time", lambda: stepped / 1e9)
    after = clock.now_ns()
    assert 0 <= after - before < 60 * 10**9
    assert clock.unix_s() >= before / 1e9


def _child(executable: str) -> tuple[float, float, subprocess.Popen]:
    """A child process that waits on its standard input, and wall times around its start."""
    before = time.time()
    child = subprocess.Popen(
        [executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    return before, time.time(), child


def test_a_process_start_is_read_from_proc(tmp_path):
    """The start of a child started now is now, to /proc's resolution; even when its command
    name holds ") " and spaces (the name is cut at the last ")")."""
    if not os.path.exists("/proc/self/stat"):
        not_here("no /proc here (not Linux)")
    odd = tmp_path / "py) 1 2 (x"
    os.symlink(sys.executable, odd)
    for executable in (sys.executable, str(odd)):
        before, after, child = _child(executable)
        try:
            started = clock.process_start_unix_s(child.pid)
        finally:
            child.communicate(b"")
        assert started is not None
        assert before - START_RESOLUTION_S <= started <= after + START_RESOLUTION_S, executable
    # The boot time is read anew each call (now minus /proc/uptime, 10 ms resolution).
    own, by_pid = clock.process_start_unix_s(), clock.process_start_unix_s(os.getpid())
    assert abs(own - by_pid) <= 2 * START_RESOLUTION_S


def test_a_process_that_is_gone_has_no_start():
    """A pid that no process has: None, no raise."""
    assert clock.process_start_unix_s(2**22 + 12345) is None


def test_the_process_creation_time_is_read_once_and_never_after_the_anchor(monkeypatch):
    """process.creation.time: the kernel's start when /proc tells, never later than the clock's
    anchor; the anchor when /proc does not tell; read once per process."""
    monkeypatch.setattr(clock, "_creation", None)
    first = clock.process_creation_unix_s()
    assert first <= clock.unix_s()
    monkeypatch.setattr(clock, "process_start_unix_s", lambda pid=None: first - 100.0)
    assert clock.process_creation_unix_s() == first  # read once
    monkeypatch.setattr(clock, "_creation", None)
    assert clock.process_creation_unix_s() == first - 100.0
    monkeypatch.setattr(clock, "_creation", None)
    monkeypatch.setattr(clock, "process_start_unix_s", lambda pid=None: time.time() + 100.0)
    anchor = clock.process_creation_unix_s()  # /proc says later than the anchor: the anchor
    assert anchor <= clock.unix_s() and anchor == clock._anchor_unix_ns / 1e9
    monkeypatch.setattr(clock, "_creation", None)
    monkeypatch.setattr(clock, "process_start_unix_s", lambda pid=None: None)
    assert clock.process_creation_unix_s() == anchor


def test_a_forked_child_anchors_its_own_clock(monkeypatch):
    """The fork hook (run in a forked child) reads the wall clock anew and forgets the
    parent's creation time; the clock goes on from the new anchor."""
    for name in ("_anchor_unix_ns", "_anchor_perf_ns", "_creation"):
        monkeypatch.setattr(clock, name, getattr(clock, name))  # given back after the test
    clock.process_creation_unix_s()
    before = time.time_ns()
    clock._after_fork_in_child()
    after = time.time_ns()
    assert before <= clock._anchor_unix_ns <= after and clock._creation is None
    first = time.perf_counter_ns()
    now = clock.now_ns()
    last = time.perf_counter_ns()
    assert (
        first - clock._anchor_perf_ns <= now - clock._anchor_unix_ns <= last - clock._anchor_perf_ns
    )


def test_a_forked_childs_creation_time_is_its_own():
    """In a forked child, process.creation.time is the child's start (at or after the
    parent's), not the parent's."""
    fork_or_unavailable()
    parent = clock.process_creation_unix_s()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write_fd, repr(clock.process_creation_unix_s()).encode())
        os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    child = float(os.read(read_fd, 64))
    assert parent <= child <= clock.unix_s() + START_RESOLUTION_S


def _proc_text(path: str) -> str:
    with open(path) as file:
        return file.read()


def test_the_boot_time_is_now_minus_proc_uptime():
    """The boot time is now minus /proc/uptime (10 ms resolution), not /proc/stat's whole
    seconds."""
    if not os.path.exists("/proc/uptime"):
        not_here("no /proc here")
    expected = time.time() - float(_proc_text("/proc/uptime").split()[0])
    assert abs(clock._boot_unix_s() - expected) < 0.05


def test_without_proc_uptime_the_boot_time_is_proc_stat_btime(monkeypatch):
    """Where /proc/uptime cannot be read, the boot time is /proc/stat's btime (whole seconds);
    where neither tells, None."""
    if not os.path.exists("/proc/stat"):
        not_here("no /proc here")
    btime = next(
        int(line.split()[1]) for line in _proc_text("/proc/stat").splitlines()
        if line.startswith("btime")
    )  # fmt: skip

    def refuse_uptime(path, *args, **kwargs):
        if path == "/proc/uptime":
            raise PermissionError(path)
        return open(path, *args, **kwargs)

    monkeypatch.setattr(clock, "open", refuse_uptime, raising=False)
    assert clock._boot_unix_s() == float(btime)
    monkeypatch.setattr(clock, "open", lambda path, *a, **k: open(os.devnull, "rb"), raising=False)
    assert clock._boot_unix_s() is None
