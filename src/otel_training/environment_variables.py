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

OTEL_PYTHON_TRAINING_SPAN_GROUPS: Final = "OTEL_PYTHON_TRAINING_SPAN_GROUPS"
"""Which phase spans are recorded: comma-separated presets and span groups, combined. Presets:
``default`` (groups ``run``, ``startup``, ``checkpoint``, ``evaluation`` and ``custom``: a few
spans per run), ``per_step`` (adds ``iteration``), ``all`` (adds ``forward_backward``,
``optimizer``, ``data_loading``) and ``none``. For example ``default,optimizer``. A span of a
disabled group costs one set lookup and creates nothing. Unknown names log one warning and are
ignored; when no name is usable, one warning and the default, ``default``.
"""

OTEL_PYTHON_TRAINING_NVTX: Final = "OTEL_PYTHON_TRAINING_NVTX"
"""Boolean, default ``true``: mirror every recorded span as an NVTX range (Nsight Systems) when
the ``nvtx`` module imports. ``false`` makes no NVTX call at all, and so does the ``nvtx``
package's own ``NVTX_DISABLE`` (set to any non-empty value).
"""

OTEL_PYTHON_TRAINING_NVTX_DOMAIN: Final = "OTEL_PYTHON_TRAINING_NVTX_DOMAIN"
"""The NVTX domain of the span ranges. Default: ``otel_training``."""

OTEL_PYTHON_TRAINING_JSONLOG_DIR: Final = "OTEL_PYTHON_TRAINING_JSONLOG_DIR"
"""Directory of the span JSON lines, ``spans-rank{RANK}.jsonl``: one JSON object when each span
starts and one when it ends (schema in ``docs/spans.md``). Setting it turns the JSON lines on
whatever the exporters; unset, they are written to ``OTEL_PYTHON_TRAINING_OUTPUT_DIR`` when the
embedded default (``otlp_json_file``) exports traces, and not at all otherwise.
"""

OTEL_PYTHON_TRAINING_TENSOR_METRICS: Final = "OTEL_PYTHON_TRAINING_TENSOR_METRICS"
"""Which tensor metrics an :class:`otel_training.tensor.TensorObserver` computes, and how often:
comma-separated ``NAME:INTERVAL`` entries (INTERVAL in optimizer steps, a whole number >= 1),
for example ``grad_norm:10,param_norm:10,activation_rms:50,router:10``; ``none`` turns them
all off. Names: ``grad_norm``, ``param_norm``, ``grad_nonfinite``, ``update_ratio``,
``activation_rms``, ``activation_max_abs``, ``residual_rms``, ``residual_max_abs``,
``logits_norm``, ``router`` and the opt-in ``router_expert_load``
(:data:`otel_training.config.TENSOR_METRIC_NAMES`). A schedule given in code wins. A bad entry
logs one warning naming it and is skipped; when no entry is usable the observer's default is
used: :data:`otel_training.tensor.DEFAULT_SCHEDULE`
(``grad_norm:10,param_norm:10,activation_rms:10,router:10``).
"""

__all__ = [
    "OTEL_PYTHON_TRAINING_EXPORT_RANKS",
    "OTEL_PYTHON_TRAINING_JSONLOG_DIR",
    "OTEL_PYTHON_TRAINING_NVTX",
    "OTEL_PYTHON_TRAINING_NVTX_DOMAIN",
    "OTEL_PYTHON_TRAINING_OUTPUT_DIR",
    "OTEL_PYTHON_TRAINING_RUN_ID",
    "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM",
    "OTEL_PYTHON_TRAINING_SPAN_GROUPS",
    "OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS",
    "OTEL_PYTHON_TRAINING_TENSOR_METRICS",
]

MEGATRON_OTEL_RUN_ID: Final = "MEGATRON_OTEL_RUN_ID"
"""Megatron-LM's name for the run id; read when ``OTEL_PYTHON_TRAINING_RUN_ID`` is unset."""

NEMO_LENS_RUN_ID: Final = "NEMO_LENS_RUN_ID"
"""NeMo Lens' name for the run id; read when neither ``OTEL_PYTHON_TRAINING_RUN_ID`` nor
``MEGATRON_OTEL_RUN_ID`` is set."""
