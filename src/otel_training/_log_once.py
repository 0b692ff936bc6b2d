"""Log lines said once per cause, or at most once per interval: telemetry logs a failure and
drops it, and never floods the log with the same failure on every step or every export.

Every once-only or rate-limited line of the package goes through :class:`LogOnce` (the logger,
the level and the text stay each caller's). A cause is any hashable value naming one failure:
``"tokens"``, ``("hook", TypeError)``. Case A1 of the design's bad days (a failing observable
callback) sets the rate of the export thread's failures: each distinct failure at most once per
minute (``interval_s=MINUTE_S``), not once per collection.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Hashable

__all__ = ["LogOnce", "MINUTE_S", "reset"]

#: The interval of a failure that recurs on a thread that runs again and again (the export
#: thread's callbacks, the tensor observer's hooks): at most one line a minute (case A1).
MINUTE_S = 60.0

#: Every helper made in this process, cleared by :func:`reset` and given new locks after fork.
_ALL: weakref.WeakSet[LogOnce] = weakref.WeakSet()
_now = time.monotonic


class LogOnce:
    """Logs a line for each cause once per process, or at most once per ``interval_s`` seconds.

    Call it as ``once(cause, message, *args)``: ``message % args`` is logged on ``logger`` at
    ``level`` the first time ``cause`` is given (with ``interval_s``: again once the last line
    for it is ``interval_s`` seconds old), and nothing is logged otherwise. Any thread may call
    it: a cause already said is answered without a lock (the training thread never waits on
    it); a lock is held only while a cause is written, never while logging. A forked child gets
    a new lock and keeps what its parent said (they share their output). At most
    ``max_causes`` causes are remembered, the oldest forgotten first, so a stream of distinct
    causes cannot grow memory without bound. :func:`otel_training.testing.reset`
    forgets every cause of every helper. Never raises.

    Args:
        logger: The logger, or its name.
        level: The level of every line (``logging.WARNING``, ``logging.INFO``).
        interval_s: Seconds before a cause may be said again; ``None``: once per process.
        exc_info: Whether a line carries the exception being handled, unless a call says.
        max_causes: How many causes are remembered at the most.
    """

    __slots__ = (
        "_exc_info",
        "_interval_s",
        "_level",
        "_lock",
        "_logger",
        "_max_causes",
        "_said",
        "__weakref__",
    )

    def __init__(
        self,
        logger: logging.Logger | str,
        *,
        level: int = logging.WARNING,
        interval_s: float | None = None,
        exc_info: bool = False,
        max_causes: int = 1024,
    ) -> None:
        self._logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self._level = level
        self._interval_s = interval_s
        self._exc_info = exc_info
        self._max_causes = max(1, max_causes)
        self._said: dict[Hashable, float] = {}
        self._lock = threading.Lock()
        _ALL.add(self)

    def __call__(
        self, cause: Hashable, message: str, *args: object, exc_info: bool | None = None
    ) -> bool:
        """Logs ``message % args`` when a line for ``cause`` is due. Returns whether it
        logged. Never raises."""
        if not self.due(cause):
            return False
        self._logger.log(
            self._level, message, *args, exc_info=self._exc_info if exc_info is None else exc_info
        )
        return True

    def say(self, message: str, *args: object) -> bool:
        """Logs ``message % args`` when that text is due: the text is its own cause (one line
        per distinct text, for warnings whose values tell them apart). Never raises."""
        try:
            text = message % args if args else message
        except (TypeError, ValueError):
            text = f"{message} {args!r}"
        return self(text, "%s", text)

    def due(self, cause: Hashable) -> bool:
        """Whether a line for ``cause`` is due now; when it is, it counts as said (for a caller
        that writes its line itself). Never raises."""
        try:
            hash(cause)
        except TypeError:
            cause = repr(cause)
        now = _now()
        # A cause already said is the common case (a failure on every step): answered without
        # the lock, by one read of the dict (atomic under the GIL).
        if self._quiet(self._said.get(cause), now):
            return False
        with self._lock:
            last = self._said.get(cause)
            if self._quiet(last, now):
                return False
            if last is None and len(self._said) >= self._max_causes:
                del self._said[next(iter(self._said))]
            self._said[cause] = now
        return True

    def _quiet(self, last: float | None, now: float) -> bool:
        """A cause last said at ``last`` (``None``: never) is not due at ``now``."""
        return last is not None and (self._interval_s is None or now - last < self._interval_s)

    def clear(self) -> None:
        """Forgets every cause: each is said again."""
        with self._lock:
            self._said.clear()


def reset() -> None:
    """Forgets every cause of every helper of the process (:func:`otel_training.testing.reset`)."""
    for helper in list(_ALL):
        helper.clear()


def _after_fork_in_child() -> None:
    # A lock held by another thread at the fork stays held forever in the child: replace it.
    for helper in list(_ALL):
        helper._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
