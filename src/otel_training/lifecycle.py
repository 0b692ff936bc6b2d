"""Process life: telemetry is shut down at interpreter exit and on SIGTERM, never deadlocking.

``configure()`` calls :func:`install` once per process. At normal exit an ``atexit`` hook shuts
every live pipeline down (side by side, each bounded by its export timeout). On SIGTERM, when
the program has no SIGTERM handler of its own and ``OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM``
is true:

1. The Python-level handler only restores the default disposition and wakes a watcher thread
   through a pipe: it waits for nothing, so it cannot deadlock on a lock that the interrupted
   main thread holds (an SDK aggregation lock, a logging lock).
2. The watcher thread, started at :func:`install` and blocked on that pipe, ends the spans
   still open (marked truncated: :data:`TRUNCATED`), flushes and shuts down every pipeline
   within the export timeout, then terminates the process with SIGTERM again, so that the
   launcher sees the exit it asked for. Training goes on meanwhile.
3. The pipe is also the interpreter's wakeup fd (``signal.set_wakeup_fd``) unless the program
   uses one itself (asyncio): the watcher then wakes even while the main thread is stuck in C
   code (a hung collective) and never returns to run Python handlers. Such a process is
   terminated with exit status 143 (128 + SIGTERM) once telemetry is flushed.

A second SIGTERM terminates at once. A forked child (a DataLoader worker) keeps nothing of
this: SIGTERM terminates it at once, and its signals never reach the parent's watcher.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

__all__ = ["install"]

_logger = logging.getLogger("otel_training")

_installed_pid: int | None = None
_shutdown_all: Callable[[str | None], None] | None = None
_pipe: tuple[int, int] | None = None
_started_shutdown = threading.Event()
#: Seconds the watcher waits, after flushing, for the main thread to die by its SIGTERM before
#: it ends the process itself.
_EXIT_GRACE_S = 1.0


def install(shutdown_all: Callable[[str | None], None], *, on_sigterm: bool) -> None:
    """Registers ``shutdown_all(reason)`` at exit (``reason=None``) and, with ``on_sigterm``,
    on SIGTERM (``reason="SIGTERM"``). Once per process; later calls do nothing. Call from
    any thread; the SIGTERM part only from the main thread, with no SIGTERM handler set."""
    global _installed_pid, _shutdown_all
    if _installed_pid == os.getpid():
        return
    _installed_pid = os.getpid()
    _shutdown_all = shutdown_all
    atexit.register(_at_exit)
    if not on_sigterm or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    _start_watcher()
    signal.signal(signal.SIGTERM, _on_sigterm)


def _at_exit() -> None:
    if _installed_pid == os.getpid() and _shutdown_all is not None:
        _shutdown_all(None)


def _start_watcher() -> None:
    global _pipe
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    _pipe = (read_fd, write_fd)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous != -1:  # the program's own (asyncio): give it back, rely on the handler
            signal.set_wakeup_fd(previous)
    except (ValueError, OSError):
        pass
    watcher = threading.Thread(
        target=_watch, args=(read_fd,), name="otel-training-sigterm", daemon=True
    )
    watcher.start()


def _on_sigterm(signum, frame) -> None:
    """The Python-level handler: restore the default, wake the watcher, return at once."""
    if _installed_pid != os.getpid():  # a forked child: terminate as if nothing were installed
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _pipe is not None:
        try:
            os.write(_pipe[1], bytes([signal.SIGTERM]))
        except OSError:
            pass


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data and not _started_shutdown.is_set():
            _started_shutdown.set()
            _terminate_after_flush()
            return


def _terminate_after_flush() -> None:
    try:
        if _shutdown_all is not None:
            _shutdown_all("SIGTERM")
    except Exception:
        _logger.warning("otel-training: shutdown on SIGTERM failed", exc_info=True)
    try:
        # Once the main thread has run the handler (default restored), this SIGTERM
        # terminates. If it is stuck in C code the handler never runs: exit with 143.
        deadline = time.monotonic() + _EXIT_GRACE_S
        while time.monotonic() < deadline:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
    finally:
        os._exit(128 + signal.SIGTERM)


def _after_fork_in_child() -> None:
    """A forked child must not wake the parent's watcher: writes to the shared pipe (the C
    handler writes there for every signal) go to /dev/null instead."""
    global _pipe
    if _pipe is None:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, _pipe[1])
        os.close(null)
    except OSError:
        pass
    _pipe = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
