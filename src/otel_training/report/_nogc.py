"""Cyclic garbage collection paused while a run is read or drawn.

Reading a long run creates millions of small objects (points, spans) and frees almost none;
every collection of the oldest generation walks them all again, which costs more than the
reading itself. The pause is local and the previous state comes back afterwards.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["no_gc"]


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pauses cyclic garbage collection inside the ``with`` block (reference counting still
    frees everything it can). Not thread-specific: the pause is process-wide."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
