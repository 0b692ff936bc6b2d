"""The constants of the settings: each variable's default, the bounds a value must keep, the
names a variable accepts, and the standard ``OTEL_*`` variables otel-training reads itself.

The parser (:mod:`otel_training.config.parser`) falls back to these defaults and holds values to
these bounds; the exporters and the embedded default's files take the defaults from here too.
The span groups' names and presets are in :mod:`otel_training.config.span_groups`, the tensor
metrics' names in :mod:`otel_training.config.tensor_schedule`.
"""

from __future__ import annotations

from typing import Final

DEFAULT_OUTPUT_DIR: Final = "otel-training-telemetry"
DEFAULT_METRIC_EXPORT_INTERVAL_MS: Final = 60_000.0
DEFAULT_METRIC_EXPORT_TIMEOUT_MS: Final = 30_000.0
DEFAULT_OTLP_TIMEOUT_S: Final = 10.0
#: Metric export interval of the embedded default's files when OTEL_METRIC_EXPORT_INTERVAL is
#: unset: often enough that a 30-second run holds a curve.
DEFAULT_FILE_METRIC_EXPORT_INTERVAL_MS: Final = 5_000.0
DEFAULT_BSP_SCHEDULE_DELAY_MS: Final = 5_000.0
DEFAULT_BSP_EXPORT_TIMEOUT_MS: Final = 30_000.0
DEFAULT_BSP_MAX_QUEUE_SIZE: Final = 2048
DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE: Final = 512
#: Batch span processor settings of the embedded default's traces file when OTEL_BSP_* are
#: unset: a local file takes bursts (80,000 spans from 8 threads lose none) and little is lost
#: to a SIGKILL (at most the last second).
DEFAULT_FILE_BSP_SCHEDULE_DELAY_MS: Final = 1_000.0
DEFAULT_FILE_BSP_MAX_QUEUE_SIZE: Final = 131_072
DEFAULT_FILE_BSP_MAX_EXPORT_BATCH_SIZE: Final = 4_096
#: Batch log record processor settings when OTEL_BLRP_* are unset: the SDK's defaults.
DEFAULT_BLRP_SCHEDULE_DELAY_MS: Final = 1_000.0
DEFAULT_BLRP_EXPORT_TIMEOUT_MS: Final = 30_000.0
DEFAULT_BLRP_MAX_QUEUE_SIZE: Final = 2048
DEFAULT_BLRP_MAX_EXPORT_BATCH_SIZE: Final = 512
#: The embedded default's logs file when OTEL_BLRP_MAX_QUEUE_SIZE / _MAX_EXPORT_BATCH_SIZE are
#: unset: a local file takes bursts (20,000 records logged in a tight loop lose none).
DEFAULT_FILE_BLRP_MAX_QUEUE_SIZE: Final = 65_536
DEFAULT_FILE_BLRP_MAX_EXPORT_BATCH_SIZE: Final = 4_096
#: Attributes kept of one log record when neither OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT nor
#: OTEL_ATTRIBUTE_COUNT_LIMIT is set (the SDK's default).
DEFAULT_LOG_ATTRIBUTE_COUNT: Final = 128
#: Port of the first local rank's Prometheus endpoint when OTEL_EXPORTER_PROMETHEUS_PORT is
#: unset; local rank L serves PORT + L.
DEFAULT_PROMETHEUS_PORT: Final = 9464
DEFAULT_NVTX_DOMAIN: Final = "otel_training"
#: Upper bound of shutdown, in seconds, when no signal exports by OTLP.
LOCAL_SHUTDOWN_TIMEOUT_S: Final = 15.0
#: Seconds from a SIGTERM that nobody else handles to the end of the process when no signal
#: exports by OTLP (the default disposition ends it at once; telemetry takes this long).
LOCAL_SIGTERM_BOUND_S: Final = 2.0

#: Export strategies of Megatron-LM and NeMo Lens (``MEGATRON_OTEL_EXPORT_STRATEGY``).
EXPORT_STRATEGIES: Final = ("single_rank", "all_ranks", "sampled", "first_rank_per_node")
#: Values of OTEL_PYTHON_TRAINING_EXPORT_REPLICATED (otel_training.metrics.replicated).
EXPORT_REPLICATED_POLICIES: Final = ("auto", "all", "pp_first")
#: Values of OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM.
STEP_DURATION_HISTOGRAMS: Final = ("explicit", "exponential")
#: Largest hang threshold or budget accepted (OTEL_PYTHON_TRAINING_HANG_*), in seconds: a week.
MAX_HANG_S: Final = 7 * 24 * 3600.0
#: The most iterations of one trace segment when OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS is
#: unset.
DEFAULT_TRACE_SEGMENT_ITERATIONS: Final = 1000
#: Spans one trace holds at most when OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET is unset: about
#: 2.4 MB of OTLP at 121 B a span, under Tempo's default max_bytes_per_trace (5 MB).
DEFAULT_TRACE_SPAN_BUDGET: Final = 20_000

#: Exporter names accepted in ``OTEL_{METRICS,TRACES}_EXPORTER``. ``otlp_json_file`` is the
#: embedded default (OTLP-JSON lines per rank in ``OTEL_PYTHON_TRAINING_OUTPUT_DIR``).
EXPORTER_NAMES: Final = frozenset({"otlp", "console", "none", "otlp_json_file"})
METRICS_ONLY_EXPORTER_NAMES: Final = frozenset({"prometheus"})
PROTOCOLS: Final = ("grpc", "http/protobuf")
COMPRESSIONS: Final = ("none", "gzip", "deflate")
TEMPORALITY_PREFERENCES: Final = ("cumulative", "delta", "lowmemory")
SAMPLERS: Final = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)

#: The standard variables otel-training parses itself, every one
#: :func:`~otel_training.config.load` reads (a test holds the list to it;
#: docs/configuration.md documents them). It also reads the proxy variables (https_proxy,
#: http_proxy, no_proxy in either case; grpc_proxy, no_grpc_proxy) and the CA bundle variables
#: of the exporters' libraries (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
#: GRPC_DEFAULT_SSL_ROOTS_FILE_PATH): ProxySettings, OtlpSettings.certificate.
STANDARD_VARIABLES: Final = (
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_METRICS_EXPORTER",
    "OTEL_TRACES_EXPORTER",
    "OTEL_LOGS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_LOGS_COMPRESSION",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_METRICS_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_LOGS_INSECURE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_LOGS_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_LOGS_CLIENT_CERTIFICATE",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BLRP_SCHEDULE_DELAY",
    "OTEL_BLRP_EXPORT_TIMEOUT",
    "OTEL_BLRP_MAX_QUEUE_SIZE",
    "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_PROMETHEUS_HOST",
    "OTEL_EXPORTER_PROMETHEUS_PORT",
)

#: Largest accepted rank in OTEL_PYTHON_TRAINING_EXPORT_RANKS (a range must not exhaust memory).
MAX_RANK: Final = 2**20
#: Bounds of the export intervals and timeouts, in ms: below, exports would busy-loop; above,
#: Python's thread waits overflow.
MIN_EXPORT_INTERVAL_MS: Final = 100.0
MIN_BSP_SCHEDULE_DELAY_MS: Final = 10.0
MAX_INTERVAL_MS: Final = 86_400_000.0
#: OTLP timeouts above this many seconds are taken for a milliseconds mistake.
MAX_OTLP_TIMEOUT_S: Final = 600.0
#: Largest accepted attribute value length limit (a larger one would not bound anything).
MAX_VALUE_LENGTH_LIMIT: Final = 2**24
