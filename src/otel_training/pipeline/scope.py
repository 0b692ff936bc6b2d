"""The instrumentation scope of what otel-training records: the one name of its meters, tracers
and loggers (``otel_training``), which every signal's data carries as its scope."""

from __future__ import annotations

__all__ = ["INSTRUMENTATION_NAME"]

INSTRUMENTATION_NAME = "otel_training"
