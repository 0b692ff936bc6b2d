"""The ``OTEL_PYTHON_TRAINING_*`` environment variables, each with its meaning and default.

Only :mod:`otel_training.config` reads the environment; this module only names the variables.
The standard ``OTEL_*`` variables keep the meaning the OpenTelemetry specification and the
Python SDK give them; the ones otel-training reads itself are listed in
:data:`otel_training.config.STANDARD_VARIABLES`.
"""

from __future__ import annotations

from typing import Final

OTEL_PYTHON_TRAINING_OUTPUT_DIR: Final = "OTEL_PYTHON_TRAINING_OUTPUT_DIR"
"""Directory of the embedded default exporter (OTLP-JSON lines, one file per rank and signal).

Used when no exporter is configured and no OTLP endpoint is set, or when an
``OTEL_{METRICS,TRACES}_EXPORTER`` names ``otlp_json_file``. Files are
``metrics-rank{RANK}.jsonl`` and ``traces-rank{RANK}.jsonl``, in the format the collector's
``otlpjsonfile`` receiver reads back. Default: ``otel-training-telemetry`` in the working
directory.
"""

OTEL_PYTHON_TRAINING_EXPORT_RANKS: Final = "OTEL_PYTHON_TRAINING_EXPORT_RANKS"
"""Which ranks export telemetry: ``all`` (default), ``last``, ``first_per_node`` or a list of
global ranks such as ``0,8,16`` or ``0-3,7``. Other ranks get no-op providers (no threads, no
sockets). An invalid value logs one warning and falls back to ``all``.
"""

OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS: Final = (
    "OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS"
)
"""Explicit histogram boundaries, in milliseconds, for ``megatron.training.step_duration_ms``:
a comma-separated, strictly increasing list of non-negative numbers. Default:
:data:`otel_training.views.STEP_DURATION_BUCKETS_MS` (1 ms to 30 min).
"""

OTEL_PYTHON_TRAINING_RUN_ID: Final = "OTEL_PYTHON_TRAINING_RUN_ID"
"""Identifier of this training run, shared by all its ranks (resource attribute ``dl.run.id``).
Default: the launcher's run id (``TORCHELASTIC_RUN_ID``, SLURM job and step), else a random
id per process.
"""

OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM: Final = "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM"
"""Boolean, default ``true``: when the process has the default SIGTERM disposition,
``configure()`` installs a handler that flushes and shuts telemetry down (bounded by the export
timeout) and then terminates the process with SIGTERM as before, so the last interval survives
a launcher's termination.
"""

__all__ = [
    "OTEL_PYTHON_TRAINING_EXPORT_RANKS",
    "OTEL_PYTHON_TRAINING_OUTPUT_DIR",
    "OTEL_PYTHON_TRAINING_RUN_ID",
    "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM",
    "OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS",
]
