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
  set its own handler. The default disposition ends a process at once, so the program's work
  stops at once here too: the handler restores the default (a second SIGTERM ends the process
  at once), wakes the watcher and holds the main thread still, in the handler, until the
  process ends. When the signal interrupted telemetry's own code (an SDK ``record``, our
  phases, ``logging``, an import), which may hold a lock that the flush needs (the deadlock
  that a handler waiting for the final collection would meet), the main thread first runs on
  to the end of that call, and stands still on its return to the program's code, before any
  statement of the program's runs. Meanwhile the watcher ends the spans still open (marked
  truncated), stops taking new measurements (threads of the program's own may still be
  recording), flushes and shuts down every pipeline, retrying a final metric collection that
  timed out once, then terminates the process with SIGTERM (status -15), as the launcher
  asked: within 2 s of the signal with local exporters only, within the longest OTLP timeout
  + 1 s otherwise (``Settings.sigterm_bound_s``), whatever the exporters do. A main thread stuck
  in C code never runs the handler: once telemetry is flushed, the process exits with status
  143 (128 + SIGTERM).
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
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

__all__ = ["install"]

_logger = logging.getLogger("otel_training")

_installed_pid: int | None = None
_shutdown_all: Callable[[str | None, float | None], None] | None = None
_flush_all: Callable[[], None] | None = None
_sigterm_bound_s: Callable[[], float] | None = None
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
#: Set once the main thread stands still in our handler (SIGTERM, nobody else handles it).
_still = threading.Event()
#: time.monotonic() by which the process ends after a SIGTERM that nobody else handles; None
#: before one arrives. Set by whichever of the watcher and the handler sees it first.
_end_by: float | None = None
#: Seconds the watcher waits for the main thread to stand still before it flushes anyway (the
#: main thread is stuck in C code, or busy in a long call of telemetry's: configure, shutdown).
_STAND_STILL_WAIT_S = 0.3
#: Seconds of the bound kept for what follows the shutdown: the kill, the kernel's exit.
_END_MARGIN_S = 0.15
#: Seconds of the bound that the shutdown's own timeout leaves for waiting, joins and the kill.
_SHUTDOWN_MARGIN_S = 1.0
#: Seconds the watcher waits, after the shutdown, for a main thread stuck in C code to come
#: back and stand still (then the process ends by SIGTERM, else with status 143).
_EXIT_GRACE_S = 0.5
# Modules whose code may hold a lock that the final flush takes: telemetry's (the SDK's and
# ours, not our demo's or CLI's training loops), logging's (the flush may log) and the import
# machinery's (a module's import lock; the flush may import lazily). The main thread runs on to
# the end of such a call before it stands still.
_RELEASE_FIRST = ("opentelemetry", "otel_training", "logging", "importlib")
_PROGRAMS_OF_OURS = ("otel_training.demo", "otel_training.cli", "otel_training.__main__")


def install(
    shutdown_all: Callable[[str | None, float | None], None],
    flush_all: Callable[[], None],
    *,
    on_sigterm: bool,
    sigterm_bound_s: Callable[[], float] | None = None,
) -> None:
    """Arms the exit hook with ``shutdown_all(reason, timeout_s)`` (``None, None``) and, with
    ``on_sigterm``, the SIGTERM watcher: ``shutdown_all("SIGTERM", timeout_s)`` and
    termination within ``sigterm_bound_s()`` seconds of the signal (default 2 s) when nobody
    else handles SIGTERM, ``flush_all()`` when the program does. Once per process; later calls
    do nothing. Call from any thread; the SIGTERM part is armed only from the main thread. Our
    handler is set only where the disposition is the default. Never raises."""
    global _installed_pid, _shutdown_all, _flush_all, _sigterm_bound_s
    if _installed_pid == os.getpid():
        return
    _installed_pid = os.getpid()
    _shutdown_all = shutdown_all
    _flush_all = flush_all
    _sigterm_bound_s = sigterm_bound_s
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
        _shutdown_all(None, None)
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
    """Our Python-level handler. As SIGTERM's disposition: restore the default, wake the
    watcher and hold the main thread still until the process ends (first running on to the end
    of a call of telemetry's that the signal interrupted). Called by the program's handler: only
    ask for a flush, and return at once."""
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        if _installed_pid == os.getpid():
            _wake(_CHAINED)
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _installed_pid != os.getpid():  # a forked child: terminate as if nothing were installed
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _start_the_clock()
    _wake(_OURS_RAN)
    _stand_still_after(_call_to_finish(frame))


def _start_the_clock() -> float:
    """The time by which the process ends, set on first call (the signal's arrival)."""
    global _end_by
    end_by = _end_by
    if end_by is None:
        bound_s = 2.0
        if _sigterm_bound_s is not None:
            try:
                bound_s = _sigterm_bound_s()
            except Exception:  # never in practice; the default bound then
                pass
        end_by = _end_by = time.monotonic() + bound_s - _END_MARGIN_S
    return end_by


def _call_to_finish(frame: FrameType | None) -> FrameType | None:
    """The frame whose return gives control back to the program's code, where the main thread
    can stand still without holding a lock of telemetry's: the outermost frame of the calls of
    telemetry's, logging's or the import machinery's on top of the stack; the standard
    library's frames between them count with them, and so do the program's own frames that
    logging called (a handler of the program's, run under the handler's lock). ``None`` when
    the program's own code was interrupted."""
    outermost = None
    in_program = False  # walking through the program's frames (from the top down)
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if _releases_first(module):
            if in_program and not (module == "logging" or module.startswith("logging.")):
                break  # the program's code called by a wrapper of telemetry's (a decorator)
            outermost, in_program = frame, False
        elif module.partition(".")[0] not in sys.stdlib_module_names:
            in_program = True
        frame = frame.f_back
    return outermost


def _releases_first(module: str) -> bool:
    if module.startswith(_PROGRAMS_OF_OURS):
        return False
    return any(module == name or module.startswith(name + ".") for name in _RELEASE_FIRST)


def _stand_still_after(frame: FrameType | None) -> None:
    """Holds the main thread still now, or when ``frame`` returns (or raises) when it is not
    None: a trace function on that frame only (a debugger's or coverage's tracer of the main
    thread is replaced; the process is ending)."""
    if frame is None:
        _stand_still()
        return

    def on_event(traced: FrameType, event: str, arg: object):
        if traced is frame and event == "return":
            _stand_still()
        return on_event

    frame.f_trace_lines = False
    frame.f_trace = on_event
    sys.settrace(_trace_no_new_frame)


def _trace_no_new_frame(frame: FrameType, event: str, arg: object) -> None:
    return None


def _stand_still() -> None:
    """Blocks the main thread until the watcher ends the process; past the bound (the watcher
    gone), the default disposition ends it from here."""
    _still.set()
    end_by = _start_the_clock()
    while True:
        remaining = end_by + _END_MARGIN_S - time.monotonic()
        if remaining <= 0:
            os.kill(os.getpid(), signal.SIGTERM)
            remaining = 1.0
        threading.Event().wait(remaining)


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
    """Waits (briefly) for the main thread to stand still, shuts telemetry down within the
    bound, then ends the process: by SIGTERM once the main thread ran our handler (the default
    disposition is back), with status 143 when it is stuck in C code and never does."""
    global _terminating
    _terminating = True
    end_by = _start_the_clock()
    _still.wait(_STAND_STILL_WAIT_S)
    timeout_s = max(0.1, end_by + _END_MARGIN_S - _SHUTDOWN_MARGIN_S - time.monotonic())
    worker = threading.Thread(
        target=_shut_down, args=(timeout_s,), name="otel-training-sigterm-shutdown", daemon=True
    )
    worker.start()
    worker.join(max(0.0, end_by - time.monotonic()))
    # Once the main thread has run our handler (default restored), this SIGTERM terminates.
    # If it is stuck in C code the handler never runs: exit with 143. If the program set a
    # handler of its own meanwhile, the process is the program's to end.
    give_up_at = min(end_by, time.monotonic() + _EXIT_GRACE_S)
    while True:
        handler = signal.getsignal(signal.SIGTERM)
        if handler is signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)
        elif handler is not _on_sigterm:
            return
        if time.monotonic() >= give_up_at:
            break
        time.sleep(0.01)
    os._exit(128 + signal.SIGTERM)


def _shut_down(timeout_s: float) -> None:
    try:
        if _shutdown_all is not None:
            _shutdown_all("SIGTERM", timeout_s)
    except Exception:
        _logger.warning("otel-training: shutdown on SIGTERM failed", exc_info=True)


def _after_fork_in_child() -> None:
    """A forked child must not wake the parent's watcher: writes to the shared pipe (the C
    handler writes there for every signal) go to /dev/null instead. Never raises."""
    global _pipe, _stale_wakeup_fd, _terminating, _still, _end_by
    _terminating = False
    _still = threading.Event()
    _end_by = None
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
