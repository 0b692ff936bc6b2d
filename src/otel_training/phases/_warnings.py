"""The phases' once-only warnings: one line per cause and process (logger otel_training.spans)."""

from __future__ import annotations

import logging
from typing import Any

_logger = logging.getLogger("otel_training.spans")

#: The causes warned about in this process (cleared by :func:`otel_training.testing.reset`).
warned: set[str] = set()


def warn_once(cause: str, message: str, *args: Any, exc_info: bool = True) -> None:
    """Logs ``message % args`` as a warning the first time ``cause`` occurs. Never raises."""
    if cause not in warned:
        warned.add(cause)
        _logger.warning(message, *args, exc_info=exc_info)
