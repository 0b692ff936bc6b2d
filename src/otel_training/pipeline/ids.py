"""Trace and span ids that stay distinct across ranks and forked children."""

from __future__ import annotations

import os
import random
import weakref

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace.id_generator import IdGenerator

__all__ = ["ProcessLocalIdGenerator"]


class ProcessLocalIdGenerator(IdGenerator):
    """Trace and span ids from a private ``random.Random`` seeded from ``os.urandom``.

    The SDK's default generator draws from the global ``random`` module, which training
    scripts seed identically on every rank, so ranks would share span ids. Reseeded in a
    forked child so that parent and child never collide.
    """

    def __init__(self) -> None:
        self._random = random.Random(os.urandom(16))
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)

            def reseed() -> None:
                live = ref()
                if live is not None:
                    live._random.seed(os.urandom(16))

            os.register_at_fork(after_in_child=reseed)

    def generate_span_id(self) -> int:
        span_id = self._random.getrandbits(64)
        while span_id == trace_api.INVALID_SPAN_ID:
            span_id = self._random.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self._random.getrandbits(128)
        while trace_id == trace_api.INVALID_TRACE_ID:
            trace_id = self._random.getrandbits(128)
        return trace_id
