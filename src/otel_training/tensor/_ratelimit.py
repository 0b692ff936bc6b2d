"""Warnings logged at most once per interval per cause: hot paths log and drop, never raise, and
never flood the log with the same failure on every step or every export."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable

__all__ = ["RateLimitedLogger"]


class RateLimitedLogger:
    """Logs a warning for a cause at most once per ``interval_s`` seconds.

    Thread-safe; never raises. The number of causes remembered is capped (``max_causes``), so a
    stream of distinct causes cannot grow memory without bound.
    """

    def __init__(
        self, logger: logging.Logger, interval_s: float = 60.0, max_causes: int = 1024
    ) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._max_causes = max_causes
        self._last: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def warning(self, cause: Hashable, message: str, *args: object, exc_info: bool = False) -> bool:
        """Logs ``message % args`` unless ``cause`` was logged less than ``interval_s`` ago.
        Returns whether it logged."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(cause)
            if last is not None and now - last < self._interval_s:
                return False
            if last is None and len(self._last) >= self._max_causes:
                self._last.pop(next(iter(self._last)))
            self._last[cause] = now
        self._logger.warning(message, *args, exc_info=exc_info)
        return True

    def clear(self) -> None:
        """Forgets every cause (for tests)."""
        with self._lock:
            self._last.clear()
