"""Process life: telemetry is shut down at interpreter exit and flushed on SIGTERM, as a guest.

The program decides the fate of its process; telemetry never ends, delays or changes it
(``docs/limits.md``, "A guest in the process").

**Exit.** Importing this module registers one ``atexit`` hook; once ``configure()`` has called
:func:`install`, the hook shuts every live pipeline down (side by side, each bounded by its
export timeout). ``atexit`` runs hooks last-registered first, so every hook that the program or
a framework registers after ``import otel_training`` (before or after ``configure()``) runs
before it: what such a hook records or ends is exported.

**SIGTERM** (``OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM`` true, ``configure()`` on the main
thread). A watcher thread blocks on a pipe that is also the interpreter's wakeup fd
(``signal.set_wakeup_fd``) unless the program uses one itself (asyncio): the interpreter's
C-level handler writes the signal number there for every signal that has a Python handler,
whoever's, even while the main thread is stuck in C code (a hung collective) and never
returns to run Python handlers. What the watcher does depends on who handles SIGTERM:

- *Nobody but us*: the disposition was the default at ``configure()``, and :func:`install`
  set its own handler. That handler only restores the default and wakes the watcher: it waits
  for nothing, so it cannot deadlock on a lock that the interrupted main thread holds (an SDK
  aggregation lock, a logging lock). The watcher ends the spans still open (marked truncated),
  flushes and shuts down every pipeline within the export timeout, then terminates the
  process with SIGTERM again, as the launcher asked. A main thread stuck in C code never runs
  the handler: once telemetry is flushed, the process exits with status 143 (128 + SIGTERM).
  A second SIGTERM terminates at once.
- *The program*: a handler set before or after ``configure()``, or one that calls ours in a
  chain (Lightning's composed handler does). The watcher flushes every pipeline and stops
  none: spans stay open for the program's graceful path to end, and the process goes on.
  Whatever the program's handler does (finish the step and save a checkpoint, ``sys.exit``,
  ``os._exit``, nothing) decides how and when the process ends; the exit hook then shuts
  telemetry down as at any exit. Each later SIGTERM flushes again. With a wakeup fd of the
  program's own (asyncio), a SIGTERM that the program handles without calling ours is flushed
  at exit only.
- *Ignored* (``SIG_IGN``): nothing happens.

The disposition when the SIGTERM arrives decides, whatever it was at ``configure()``: a
handler that the program sets later (Lightning's at ``fit()``, Megatron-LM's exit-signal
handler at start-up) decides every SIGTERM that arrives while it is set; once the program gives
ours back (Lightning's teardown does), ours decides again.

A forked child (a DataLoader worker) keeps nothing of this: our handler inherited as its
disposition terminates it at once; called in a chain of the program's handler it does
nothing; the child's signals never reach the parent's watcher.
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
_flush_all: Callable[[], None] | None = None
_pipe: tuple[int, int] | None = None
# A forked child's inherited wakeup fd: the parent's pipe, now /dev/null (ours, not asyncio's).
_stale_wakeup_fd = -1
# Set by the watcher once it has decided to shut down and terminate (no later flush).
_terminating = False
#: Bytes our handler writes to the watcher's pipe, beside the signal numbers (1 to 64) that the
#: interpreter writes there as the wakeup fd: our handler ran as SIGTERM's disposition (nobody
#: else handles it), or was called in a chain by the program's handler (the program decides).
_OURS_RAN = 0xF0
_CHAINED = 0xF1
#: Seconds the watcher waits, after flushing, for the main thread to die by its SIGTERM before
#: it ends the process itself.
_EXIT_GRACE_S = 1.0


def install(
    shutdown_all: Callable[[str | None], None],
    flush_all: Callable[[], None],
    *,
    on_sigterm: bool,
) -> None:
    """Arms the exit hook with ``shutdown_all(reason)`` (``reason=None``) and, with
    ``on_sigterm``, the SIGTERM watcher: ``shutdown_all("SIGTERM")`` and termination when
    nobody else handles SIGTERM, ``flush_all()`` when the program does. Once per process;
    later calls do nothing. Call from any thread; the SIGTERM part is armed only from the main
    thread. Our handler is set only where the disposition is the default. Never raises."""
    global _installed_pid, _shutdown_all, _flush_all
    if _installed_pid == os.getpid():
        return
    _installed_pid = os.getpid()
    _shutdown_all = shutdown_all
    _flush_all = flush_all
    if not on_sigterm or threading.current_thread() is not threading.main_thread():
        return
    try:
        _start_watcher()
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (OSError, ValueError, RuntimeError):
        _logger.warning("otel-training: could not watch for SIGTERM", exc_info=True)


def _at_exit() -> None:
    if _installed_pid != os.getpid() or _shutdown_all is None:
        return
    try:
        _shutdown_all(None)
    except Exception:
        _logger.warning("otel-training: shutdown at exit failed", exc_info=True)


def _start_watcher() -> None:
    global _pipe
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    _pipe = (read_fd, write_fd)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous not in (-1, _stale_wakeup_fd):  # the program's own (asyncio): give it back
            signal.set_wakeup_fd(previous)
    except (ValueError, OSError):
        pass
    watcher = threading.Thread(
        target=_watch, args=(read_fd,), name="otel-training-sigterm", daemon=True
    )
    watcher.start()


def _on_sigterm(signum, frame) -> None:
    """Our Python-level handler: when SIGTERM's disposition, restore the default and wake the
    watcher; when called by the program's handler, only ask for a flush. Returns at once."""
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        if _installed_pid == os.getpid():
            _wake(_CHAINED)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _installed_pid != os.getpid():  # a forked child: terminate as if nothing were installed
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _wake(_OURS_RAN)


def _wake(byte: int) -> None:
    pipe = _pipe
    if pipe is None:
        return
    try:
        os.write(pipe[1], bytes([byte]))
    except OSError:
        pass


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 256)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        handler = signal.getsignal(signal.SIGTERM)
        if _OURS_RAN in data or (signal.SIGTERM in data and handler is _on_sigterm):
            # Nobody else handles SIGTERM: our handler ran, or will, or the main thread is
            # stuck in C code and never will.
            _terminate_after_flush()
            return
        if _CHAINED in data or (signal.SIGTERM in data and handler is not signal.SIG_DFL):
            # The program handles (or ignores) it. SIG_DFL here means that our handler has
            # just run: its byte follows.
            _flush()


def _flush() -> None:
    if _terminating or _flush_all is None:
        return
    try:
        _flush_all()
    except Exception:
        _logger.warning("otel-training: flush on SIGTERM failed", exc_info=True)


def _terminate_after_flush() -> None:
    global _terminating
    _terminating = True
    try:
        if _shutdown_all is not None:
            _shutdown_all("SIGTERM")
    except Exception:
        _logger.warning("otel-training: shutdown on SIGTERM failed", exc_info=True)
    # Once the main thread has run our handler (default restored), this SIGTERM terminates.
    # If it is stuck in C code the handler never runs: exit with 143. If the program set a
    # handler of its own meanwhile, the process is the program's to end.
    deadline = time.monotonic() + _EXIT_GRACE_S
    while True:
        handler = signal.getsignal(signal.SIGTERM)
        if handler is signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)
        elif handler is not _on_sigterm:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    os._exit(128 + signal.SIGTERM)


def _after_fork_in_child() -> None:
    """A forked child must not wake the parent's watcher: writes to the shared pipe (the C
    handler writes there for every signal) go to /dev/null instead. Never raises."""
    global _pipe, _stale_wakeup_fd, _terminating
    _terminating = False
    if _pipe is None:
        return
    read_fd, write_fd = _pipe
    _pipe = None
    _stale_wakeup_fd = write_fd
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, write_fd)
        os.close(null)
        os.close(read_fd)
    except OSError:
        pass


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
