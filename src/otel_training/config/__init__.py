"""The settings: the only reader of ``os.environ`` in otel-training, with one policy for bad
values; the variables' declarations, their one parser, the rank's identity. This package is the
config layer (``tests/test_import_layers.py``): it may import the leaves
(:mod:`otel_training._log_once`, :mod:`otel_training.clock`, :mod:`otel_training.export.limits`,
:mod:`otel_training.semconv`), the health definitions (``otel_training.health.*``) and its own
modules, nothing else. Its modules import each other directly, never through this package.

Every variable is parsed here into a frozen :class:`Settings`. The policy: a missing or empty
variable means its default; a value that cannot be used (not a number, zero or negative where a
positive number is needed, an unknown name, a malformed header entry) logs ONE warning that names
the variable and the value, and the default is used instead. Nothing here raises on a bad value.

Standard variables follow the OpenTelemetry specification and the Python SDK (timeouts of
``OTEL_EXPORTER_OTLP_*TIMEOUT`` are in seconds, as the Python SDK reads them; export intervals
of the metric reader and the batch span processor are in milliseconds).

- :mod:`~otel_training.config.parser`: :func:`load`, :func:`load_identity`,
  :func:`load_omp_num_threads`, :func:`cuda_visible_devices` and the parser of every variable;
- :mod:`~otel_training.config.otlp`: the exporter variables, each signal's OTLP settings, the
  proxies;
- :mod:`~otel_training.config.settings`: the frozen settings (:class:`Settings`,
  :class:`OtlpSettings`, :class:`ProxySettings`, :class:`LogsSettings`) and which ranks export
  (:class:`ExportRanks`, :func:`sampled_ranks`);
- :mod:`~otel_training.config.defaults`: the defaults, the bounds, the accepted names and
  :data:`STANDARD_VARIABLES`;
- :mod:`~otel_training.config.span_groups`: the span groups, their presets and
  :func:`span_groups_from_names`;
- :mod:`~otel_training.config.tensor_schedule`: :data:`TENSOR_METRIC_NAMES` and the reading of
  a tensor-metric schedule;
- :mod:`~otel_training.config.identity`: the rank's identity (rank, world, job, run, attempt);
- :mod:`~otel_training.config.variables`: the ``OTEL_PYTHON_TRAINING_*`` variables, each with
  its meaning and default;
- :mod:`~otel_training.config._env`: the primitives every reader builds on (:class:`EnvReader`).

Every name below is importable from ``otel_training.config`` as before the package was split.
"""

from __future__ import annotations

from otel_training.config.defaults import (  # noqa: F401 - re-exported
    COMPRESSIONS,
    DEFAULT_BLRP_EXPORT_TIMEOUT_MS,
    DEFAULT_BLRP_MAX_EXPORT_BATCH_SIZE,
    DEFAULT_BLRP_MAX_QUEUE_SIZE,
    DEFAULT_BLRP_SCHEDULE_DELAY_MS,
    DEFAULT_BSP_EXPORT_TIMEOUT_MS,
    DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE,
    DEFAULT_BSP_MAX_QUEUE_SIZE,
    DEFAULT_BSP_SCHEDULE_DELAY_MS,
    DEFAULT_FILE_BLRP_MAX_EXPORT_BATCH_SIZE,
    DEFAULT_FILE_BLRP_MAX_QUEUE_SIZE,
    DEFAULT_FILE_BSP_MAX_EXPORT_BATCH_SIZE,
    DEFAULT_FILE_BSP_MAX_QUEUE_SIZE,
    DEFAULT_FILE_BSP_SCHEDULE_DELAY_MS,
    DEFAULT_FILE_METRIC_EXPORT_INTERVAL_MS,
    DEFAULT_LOG_ATTRIBUTE_COUNT,
    DEFAULT_METRIC_EXPORT_INTERVAL_MS,
    DEFAULT_METRIC_EXPORT_TIMEOUT_MS,
    DEFAULT_NVTX_DOMAIN,
    DEFAULT_OTLP_TIMEOUT_S,
    DEFAULT_OUTPUT_DIR,
    DEFAULT_PROMETHEUS_PORT,
    DEFAULT_TRACE_SEGMENT_ITERATIONS,
    DEFAULT_TRACE_SPAN_BUDGET,
    EXPORT_REPLICATED_POLICIES,
    EXPORT_STRATEGIES,
    EXPORTER_NAMES,
    LOCAL_SHUTDOWN_TIMEOUT_S,
    LOCAL_SIGTERM_BOUND_S,
    MAX_HANG_S,
    MAX_INTERVAL_MS,
    MAX_OTLP_TIMEOUT_S,
    MAX_RANK,
    MAX_VALUE_LENGTH_LIMIT,
    METRICS_ONLY_EXPORTER_NAMES,
    MIN_BSP_SCHEDULE_DELAY_MS,
    MIN_EXPORT_INTERVAL_MS,
    PROTOCOLS,
    SAMPLERS,
    STANDARD_VARIABLES,
    STEP_DURATION_HISTOGRAMS,
    TEMPORALITY_PREFERENCES,
)
from otel_training.config.identity import RankIdentity
from otel_training.config.parser import (  # noqa: F401 - re-exported
    cuda_visible_devices,
    environ_with,
    load,
    load_identity,
    load_omp_num_threads,
)
from otel_training.config.settings import (  # noqa: F401 - re-exported
    ExportRanks,
    LogsSettings,
    OtlpSettings,
    ProxySettings,
    Settings,
    sample_score,
    sampled_ranks,
)
from otel_training.config.span_groups import (  # noqa: F401 - re-exported
    CUSTOM_SPAN_GROUP,
    RENAMED_SPAN_GROUPS,
    SPAN_GROUP_PRESETS,
    SPAN_GROUPS,
    span_groups_from_names,
)
from otel_training.config.tensor_schedule import (  # noqa: F401 - re-exported
    TENSOR_METRIC_NAMES,
    ScheduleEntry,
    split_tensor_metric_schedule,
    tensor_metric_schedule,
)

__all__ = [
    "ExportRanks",
    "LogsSettings",
    "OtlpSettings",
    "RankIdentity",
    "Settings",
    "environ_with",
    "load",
    "load_identity",
    "load_omp_num_threads",
    "sample_score",
    "sampled_ranks",
    "span_groups_from_names",
    "tensor_metric_schedule",
]
