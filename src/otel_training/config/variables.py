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
``OTEL_{METRICS,TRACES,LOGS}_EXPORTER`` names ``otlp_json_file``. Files are
``metrics-rank{RANK}.jsonl``, ``traces-rank{RANK}.jsonl`` and ``logs-rank{RANK}.jsonl``, in
the format the collector's ``otlpjsonfile`` receiver reads back. Default:
``otel-training-telemetry`` in the working directory.
"""

OTEL_PYTHON_TRAINING_EXPORT_RANKS: Final = "OTEL_PYTHON_TRAINING_EXPORT_RANKS"
"""Which ranks export telemetry: ``all`` (default), ``last``, ``first_per_node``,
``sampled:RATE`` (the ranks NeMo Lens chooses at RATE, by an md5 score of the rank, and at least
one: the rank of lowest score when that is none; the same ranks in every attempt) or a list of
global ranks such as ``0,8,16`` or ``0-3,7``. Other ranks get no-op providers (no threads, no
sockets) and say so, naming this variable; a list that names no rank of the job logs one
warning on every rank. An invalid value logs one warning and falls back to ``all``. When unset,
Megatron-LM's ``MEGATRON_OTEL_EXPORT_STRATEGY`` (or ``MEGATRON_OTEL_RANK_STRATEGY``, or NeMo
Lens' ``NEMO_LENS_EXPORT_STRATEGY``) is read.
"""

OTEL_PYTHON_TRAINING_EXPORT_REPLICATED: Final = "OTEL_PYTHON_TRAINING_EXPORT_REPLICATED"
"""Which ranks export the replicated values: the metrics that are the same on every data- and
tensor-parallel peer of a pipeline stage (``replicated`` in ``semconv/registry``: loss,
learning rate, gradient norm, skipped iterations, norms of replicated parameters). ``all``:
every rank; ``pp_first``: one rank per pipeline stage, the one with tensor- and data-parallel
rank 0 (the others drop them with a view, ``DropAggregation``, and say so once at
``configure()``); ``auto`` (default): ``pp_first`` when the world has more than 64 ranks,
else ``all``. Every rank keeps its own step time, health (``dl.training.*``) and device
series. ``pp_first`` needs ``dl.pipeline_parallel.rank``, ``dl.tensor_parallel.rank`` and
``dl.data_parallel.rank`` on the Resource (``configure(resource_attributes=...)`` or
``OTEL_RESOURCE_ATTRIBUTES``); without them every rank exports, and ``configure()`` says so
once. See ``docs/scale.md``.
"""

OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL: Final = "OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL"
"""Milliseconds between exports of the hang signals (``heartbeat`` in ``semconv/registry``:
``dl.training.progress.timestamp``, ``dl.training.progress.age``,
``dl.training.phase.elapsed``) over OTLP, shorter than ``OTEL_METRIC_EXPORT_INTERVAL``: a
second small MeterProvider with the same Resource exports only them on this interval, and the
OTLP reader of the others leaves them out, so every other metric keeps its interval. Unset
(default): off, they go with the others. A value not shorter than the export interval logs one
warning and is ignored. The embedded default's file (every 5 s) and a Prometheus pull endpoint
(read at its scrape interval) are not affected. See ``docs/scale.md`` for what it costs.
"""

OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM: Final = "OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM"
"""How ``megatron.training.step_duration_ms`` is aggregated: ``explicit`` (default; the buckets
of ``OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS``, 40 Prometheus series per rank) or
``exponential`` (a base-2 exponential histogram, at most 160 buckets at scale 8 or coarser:
one native-histogram series per rank in Prometheus 3, which must ingest native histograms;
see ``docs/scale.md``). The direct-scrape Prometheus exporter cannot expose exponential
histograms: with ``OTEL_METRICS_EXPORTER=prometheus`` the value logs one warning and
``explicit`` is used.
"""

OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS: Final = (
    "OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS"
)
"""Explicit histogram boundaries, in milliseconds, for ``megatron.training.step_duration_ms``:
a comma-separated, strictly increasing list of non-negative numbers. Default:
:data:`otel_training.metrics.views.STEP_DURATION_BUCKETS_MS` (1 ms to 30 min).
"""

OTEL_PYTHON_TRAINING_RUN_ID: Final = "OTEL_PYTHON_TRAINING_RUN_ID"
"""Identifier of this training run, shared by all its ranks (resource attribute ``dl.run.id``,
and the name of the run's directory). Default: the launcher's run id (``TORCHELASTIC_RUN_ID``,
SLURM job and step), else a random id per process. Either way ``-a{attempt}`` is appended when
the attempt is known (:data:`OTEL_PYTHON_TRAINING_RUN_ATTEMPT`), so every attempt of a job has a
run id and a directory of its own; ``dl.job.id`` stays the same across attempts.
"""

OTEL_PYTHON_TRAINING_RUN_ATTEMPT: Final = "OTEL_PYTHON_TRAINING_RUN_ATTEMPT"
"""Which attempt (incarnation) of the job this process belongs to, a whole number from 0
(resource attribute ``dl.run.attempt``), the same on every rank of the attempt. Default: NVRx's
``NVRX_CYCLE``, else torchrun's ``TORCHELASTIC_RESTART_COUNT`` and SLURM's
``SLURM_RESTART_COUNT`` (with both: ``SLURM_RESTART_COUNT * (TORCHELASTIC_MAX_RESTARTS + 1) +
TORCHELASTIC_RESTART_COUNT``, distinct and in order), else absent.
"""

OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM: Final = "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM"
"""Boolean, default ``true``: telemetry watches for SIGTERM. When nobody else handles it (the
disposition was the default at ``configure()``, which installs a handler), the program stops at
once, telemetry flushes and shuts down, and the process ends by SIGTERM within 2 s (the OTLP
timeout + 1 s with a network exporter), so the last interval survives a launcher's
termination. When the program handles SIGTERM itself (a handler set before or after
``configure()``), telemetry only flushes and leaves the process's fate to the program.
``false``: no handler, no watcher, the interpreter's wakeup fd untouched; telemetry is still
shut down at exit. See ``docs/limits.md``, "A guest in the process".
"""

OTEL_PYTHON_TRAINING_SPAN_GROUPS: Final = "OTEL_PYTHON_TRAINING_SPAN_GROUPS"
"""Which phase spans are recorded: comma-separated presets and span groups, combined, with
Megatron-LM's names (``otel_training.semconv.SPAN_GROUP_LEVELS``). Presets: ``default`` (job,
checkpoint, evaluate, first_iteration, inference, custom), ``per_step`` (adds model_init,
load_checkpoint, step, forward_backward, optimizer, communication, data_loading), ``all`` and
``profiling`` (every group: adds microbatch, layer, activation_offload, trace_region) and
``none``. For example ``default,optimizer``. A span of a disabled group costs one set lookup
and creates nothing. Unknown names log one warning and are ignored; when no name is usable, one
warning and the default, ``default``. Falls back to ``MEGATRON_OTEL_SPAN_GROUPS``, then
``NEMO_LENS_SPAN_GROUPS``.
"""

OTEL_PYTHON_TRAINING_NVTX: Final = "OTEL_PYTHON_TRAINING_NVTX"
"""Boolean, default ``true``: mirror every recorded span as an NVTX range (Nsight Systems) when
the ``nvtx`` module imports. ``false`` makes no NVTX call at all, and so does the ``nvtx``
package's own ``NVTX_DISABLE`` (set to any non-empty value).
"""

OTEL_PYTHON_TRAINING_NVTX_DOMAIN: Final = "OTEL_PYTHON_TRAINING_NVTX_DOMAIN"
"""The NVTX domain of the span ranges. Default: ``otel_training``."""

OTEL_PYTHON_TRAINING_JSONLOG_DIR: Final = "OTEL_PYTHON_TRAINING_JSONLOG_DIR"
"""Directory of the span JSON lines: ``{run id}/spans-rank{RANK}.jsonl`` inside it (``latest``
links to the newest run), one JSON object when each span ends and one when it starts if it is
still open when the writer runs (schema in ``docs/spans.md``). Setting it turns the JSON lines on
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

OTEL_PYTHON_TRAINING_LOGGING: Final = "OTEL_PYTHON_TRAINING_LOGGING"
"""Boolean, default ``false``: ``configure()`` adds the logging bridge
(:func:`otel_training.logging_handler`) to the root logger, so that every ``logging`` record
that reaches the root logger is also exported as an OpenTelemetry log record by
``OTEL_LOGS_EXPORTER``, with the rank's resource and, inside a sampled span, its trace and span
ids. Records still need to pass their logger's level (``logging.basicConfig(level=...)``).
``false`` removes the bridge that an earlier ``configure()`` added. See ``docs/logs.md``.
"""

OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS: Final = "OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS"
"""Boolean, default ``false``: every rank writes its telemetry line (where its telemetry goes,
``otel-training telemetry: metrics to ...``) to stderr at ``configure()``, or logs it when
logging is set up. By default only global rank 0 (``dl.rank``: ``RANK``, ``SLURM_PROCID``, ...)
writes it (and the lowest rank that exports when ``OTEL_PYTHON_TRAINING_EXPORT_RANKS`` leaves
rank 0 out), so that ``torchrun --nproc_per_node=8`` prints one line, not eight; the other
ranks' destinations differ only in their rank. Warnings are written on every rank either way.
"""

OTEL_PYTHON_TRAINING_HANG_FLOOR_S: Final = "OTEL_PYTHON_TRAINING_HANG_FLOOR_S"
"""The floor of the hang threshold, in seconds, default 60: a rank whose progress age (seconds
since its last completed optimizer step) exceeds H = max(5 x median step, this floor) in a step
phase is stalled (``docs/health.md``). Read alike by each rank's watchdog (which then writes
its threads' Python stacks once) and by ``otel-training health``; the Prometheus rules of
``collector-config/rules/training.yaml`` carry the same number.
"""

OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S: Final = "OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S"
"""The least hang threshold of a checkpoint save or load and of an evaluation, in seconds,
default 600: inside those phases a rank is stalled only after max(2 x the longest one seen,
this budget, the step threshold) (``docs/health.md``).
"""

OTEL_PYTHON_TRAINING_HANG_STARTUP_S: Final = "OTEL_PYTHON_TRAINING_HANG_STARTUP_S"
"""The hang threshold of ``startup`` and ``warmup`` (the first iteration of a process), in
seconds, default 1800 (NVRx's initial timeout): compilation and first-touch allocation may take
that long (``docs/health.md``).
"""

OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS: Final = "OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS"
"""Optimizer steps per straggler window, default 20: a rank is a straggler when its busy time
per step (data loading + forward/backward + optimizer) exceeds 1.15 x its peers' reference
for 3 consecutive windows (``docs/health.md``). Read by ``otel-training health`` and the report.
"""

__all__ = [
    "OTEL_PYTHON_TRAINING_EXPORT_RANKS",
    "OTEL_PYTHON_TRAINING_EXPORT_REPLICATED",
    "OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL",
    "OTEL_PYTHON_TRAINING_HANG_FLOOR_S",
    "OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S",
    "OTEL_PYTHON_TRAINING_HANG_STARTUP_S",
    "OTEL_PYTHON_TRAINING_JSONLOG_DIR",
    "OTEL_PYTHON_TRAINING_LOGGING",
    "OTEL_PYTHON_TRAINING_NVTX",
    "OTEL_PYTHON_TRAINING_NVTX_DOMAIN",
    "OTEL_PYTHON_TRAINING_OUTPUT_DIR",
    "OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS",
    "OTEL_PYTHON_TRAINING_RUN_ATTEMPT",
    "OTEL_PYTHON_TRAINING_RUN_ID",
    "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM",
    "OTEL_PYTHON_TRAINING_SPAN_GROUPS",
    "OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS",
    "OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM",
    "OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS",
    "OTEL_PYTHON_TRAINING_TENSOR_METRICS",
]

MEGATRON_OTEL_RUN_ID: Final = "MEGATRON_OTEL_RUN_ID"
"""Megatron-LM's name for the run id; read when ``OTEL_PYTHON_TRAINING_RUN_ID`` is unset."""

NVRX_CYCLE: Final = "NVRX_CYCLE"
"""NVIDIA Resiliency Extension's restart cycle of the job, read as the attempt number when
``OTEL_PYTHON_TRAINING_RUN_ATTEMPT`` is unset."""

TORCHELASTIC_RESTART_COUNT: Final = "TORCHELASTIC_RESTART_COUNT"
"""torchrun's count of worker-group restarts, part of the attempt number."""

SLURM_RESTART_COUNT: Final = "SLURM_RESTART_COUNT"
"""SLURM's count of requeues of the job, part of the attempt number."""

TORCHELASTIC_MAX_RESTARTS: Final = "TORCHELASTIC_MAX_RESTARTS"
"""torchrun's ``--max-restarts``: with ``SLURM_RESTART_COUNT``, the size of each requeue's
block of attempt numbers."""

NEMO_LENS_RUN_ID: Final = "NEMO_LENS_RUN_ID"
"""NeMo Lens' name for the run id; read when neither ``OTEL_PYTHON_TRAINING_RUN_ID`` nor
``MEGATRON_OTEL_RUN_ID`` is set."""

OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS: Final = "OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS"
"""Span groups whose phases are mirrored to NVTX ranges only: no OpenTelemetry span, no JSON
line (an NVTX-only phase costs about a microsecond with a tool attached, nothing without).
``none`` (default), ``fine`` (the fine-grained groups ``microbatch``, ``layer``,
``communication``, ``activation_offload``) or group names. A group still has to be enabled by
the span groups to record anything.
"""

OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS: Final = (
    "OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS"
)
"""The most iterations per trace segment, default 1000; fewer when
``OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET`` requires (``otel_training.trace.shape``). The
iterations s*N+1 .. (s+1)*N form segment s: one job trace (or one per shard of ranks) holds every
rank's segment span, checkpoint saves and evaluations, and one step trace per rank its iterations,
their ids computed from the run id and s on every rank.
"""

OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET: Final = "OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET"
"""The most spans one trace holds, default 20000 (about 2.4 MB of OTLP, under Tempo's default
``max_bytes_per_trace`` of 5 MB), whatever the world size and the span groups: it sets the
segment length, splits the run and job traces into shards of ranks where the world is large,
and starts a rank's next step trace when one is full (``otel_training.trace.shape``).
"""

MEGATRON_OTEL_SPAN_GROUPS: Final = "MEGATRON_OTEL_SPAN_GROUPS"
"""Megatron-LM's span groups; read when ``OTEL_PYTHON_TRAINING_SPAN_GROUPS`` is unset."""

NEMO_LENS_SPAN_GROUPS: Final = "NEMO_LENS_SPAN_GROUPS"
"""NeMo Lens' span groups; read when neither of the above is set."""

MEGATRON_OTEL_EXPORT_STRATEGY: Final = "MEGATRON_OTEL_EXPORT_STRATEGY"
"""Megatron-LM's export strategy (``single_rank``, ``all_ranks``, ``sampled``,
``first_rank_per_node``), the name its code reads (through NeMo Lens' ``EXPORT_STRATEGY`` key);
read when ``OTEL_PYTHON_TRAINING_EXPORT_RANKS`` is unset."""

MEGATRON_OTEL_RANK_STRATEGY: Final = "MEGATRON_OTEL_RANK_STRATEGY"
"""The same as ``MEGATRON_OTEL_EXPORT_STRATEGY``, by the name Megatron-LM's observability guide
gives it (``docs/user-guide/observability/configuration.md``); read after it."""

NEMO_LENS_EXPORT_STRATEGY: Final = "NEMO_LENS_EXPORT_STRATEGY"
"""NeMo Lens' export strategy; read when neither of the above is set."""

MEGATRON_OTEL_EXPORT_RANK: Final = "MEGATRON_OTEL_EXPORT_RANK"
"""The rank that exports under ``single_rank``; -1 (default) is the last rank."""

NEMO_LENS_EXPORT_RANK: Final = "NEMO_LENS_EXPORT_RANK"
"""NeMo Lens' name for ``MEGATRON_OTEL_EXPORT_RANK``."""

MEGATRON_OTEL_EXPORT_SAMPLE_RATE: Final = "MEGATRON_OTEL_EXPORT_SAMPLE_RATE"
"""The fraction of ranks that export under ``sampled`` (0..1, default 1), chosen per rank
deterministically."""

NEMO_LENS_EXPORT_SAMPLE_RATE: Final = "NEMO_LENS_EXPORT_SAMPLE_RATE"
"""NeMo Lens' name for ``MEGATRON_OTEL_EXPORT_SAMPLE_RATE``."""
