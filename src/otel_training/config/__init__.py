"""The only reader of ``os.environ`` in otel-training, with one policy for bad values.

Every variable is parsed here into a frozen :class:`Settings`. The policy: a missing or empty
variable means its default; a value that cannot be used (not a number, zero or negative where a
positive number is needed, an unknown name, a malformed header entry) logs ONE warning that names
the variable and the value, and the default is used instead. Nothing here raises on a bad value.

Standard variables follow the OpenTelemetry specification and the Python SDK (timeouts of
``OTEL_EXPORTER_OTLP_*TIMEOUT`` are in seconds, as the Python SDK reads them; export intervals
of the metric reader and the batch span processor are in milliseconds).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import math
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from otel_training.config import variables as ev
from otel_training.config._env import EnvReader, redact_url, show
from otel_training.config.identity import RankIdentity, read_identity
from otel_training.export.limits import DEFAULT_VALUE_LENGTH, Limits
from otel_training.health import hang as _hang
from otel_training.health import straggler as _straggler
from otel_training.semconv.spans import (
    NVTX_ONLY_CANDIDATE_GROUPS,
    SPAN_GROUP_LEVELS,
    SPAN_LEVELS,
    SPAN_PRESET_ALIASES,
)

__all__ = [
    "ExportRanks",
    "LogsSettings",
    "OtlpSettings",
    "RankIdentity",
    "Settings",
    "load",
    "load_identity",
    "load_omp_num_threads",
    "sample_score",
    "sampled_ranks",
    "span_groups_from_names",
    "tensor_metric_schedule",
]

_logger = logging.getLogger(__name__)

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

#: The span group of phases whose name is not in the registry (``phase(name)``); it is on in
#: every preset but ``none``.
CUSTOM_SPAN_GROUP: Final = "custom"
#: Every span group: Megatron-LM's and ``custom`` (``otel_training.semconv.SPAN_GROUP_LEVELS``).
SPAN_GROUPS: Final = frozenset(SPAN_GROUP_LEVELS)
#: The presets of ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``: ``none``, and for each level of
#: ``otel_training.semconv.SPAN_LEVELS`` the groups of that level and of the levels before it
#: (Megatron-LM's presets), and the aliases (``profiling`` = ``all``).
SPAN_GROUP_PRESETS: Final = {
    "none": frozenset(),
    **{
        level: frozenset(g for g, at in SPAN_GROUP_LEVELS.items() if SPAN_LEVELS.index(at) <= i)
        for i, level in enumerate(SPAN_LEVELS)
    },
}
SPAN_GROUP_PRESETS.update(
    {alias: SPAN_GROUP_PRESETS[level] for alias, level in SPAN_PRESET_ALIASES.items()}
)
#: Group names of otel-training before it took Megatron-LM's, still accepted (one warning).
RENAMED_SPAN_GROUPS: Final = {
    "run": "job",
    "startup": "job",
    "iteration": "step",
    "evaluation": "evaluate",
}
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

#: The standard variables otel-training parses itself, every one :func:`load` reads (a test holds
#: the list to it; docs/configuration.md documents them). It also reads the proxy variables
#: (https_proxy, http_proxy, no_proxy in either case; grpc_proxy, no_grpc_proxy) and the CA
#: bundle variables of the exporters' libraries (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
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


@dataclass(frozen=True)
class OtlpSettings:
    """OTLP exporter settings for one signal.

    Attributes:
        endpoint: Full URL given to the exporter, or ``None`` for the exporter's default
            (``http://localhost:4317`` for gRPC, ``http://localhost:4318/v1/{signal}`` for HTTP).
            For OTLP/HTTP the generic endpoint gets ``/v1/{signal}`` appended, per the spec.
        protocol: ``grpc`` or ``http/protobuf``.
        headers: Header names (lower-case) to values, URL-decoded.
        timeout_s: Export timeout in seconds.
        compression: ``none``, ``gzip`` or ``deflate`` (``deflate`` only over HTTP).
        insecure: ``OTEL_EXPORTER_OTLP_[SIGNAL_]INSECURE`` (gRPC: plaintext), None when unset.
        certificate: ``(variable, path)`` of the CA bundle that verifies the endpoint:
            ``OTEL_EXPORTER_OTLP_[SIGNAL_]CERTIFICATE``, else the protocol's library variable
            (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` over HTTP;
            ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` over gRPC); None: the system's.
        client_key: ``(variable, path)`` of ``OTEL_EXPORTER_OTLP_[SIGNAL_]CLIENT_KEY``.
        client_certificate: ``(variable, path)`` of
            ``OTEL_EXPORTER_OTLP_[SIGNAL_]CLIENT_CERTIFICATE``.
    """

    endpoint: str | None
    protocol: str
    headers: Mapping[str, str] = field(repr=False)
    timeout_s: float
    compression: str
    insecure: bool | None = None
    certificate: tuple[str, str] | None = None
    client_key: tuple[str, str] | None = None
    client_certificate: tuple[str, str] | None = None

    @property
    def shown_endpoint(self) -> str | None:
        """The endpoint as logs and the destination line may show it (never with userinfo:
        credentials in the URL are sent as an ``authorization`` header instead)."""
        return None if self.endpoint is None else redact_url(self.endpoint)


@dataclass(frozen=True)
class ProxySettings:
    """The proxy variables, read alike for OTLP/gRPC and OTLP/HTTP (docs/limits.md,
    "Network"): each ``(variable, value)`` as set, the lower-case name first (as curl and
    requests read them), else the upper-case one; None when neither is set.

    Attributes:
        https: ``https_proxy`` / ``HTTPS_PROXY``: the proxy of ``https://`` endpoints.
        http: ``http_proxy`` / ``HTTP_PROXY``: the proxy of ``http://`` endpoints.
        no_proxy: ``no_proxy`` / ``NO_PROXY``: hosts reached directly.
        grpc: ``grpc_proxy``: gRPC's own, the proxy of every OTLP/gRPC endpoint.
        no_grpc_proxy: ``no_grpc_proxy``: gRPC's own, instead of ``no_proxy`` over gRPC.
    """

    https: tuple[str, str] | None = None
    http: tuple[str, str] | None = None
    no_proxy: tuple[str, str] | None = None
    grpc: tuple[str, str] | None = None
    no_grpc_proxy: tuple[str, str] | None = None


@dataclass(frozen=True)
class ExportRanks:
    """Which ranks export: ``OTEL_PYTHON_TRAINING_EXPORT_RANKS``, else Megatron-LM's and NeMo
    Lens' ``MEGATRON_OTEL_EXPORT_STRATEGY`` / ``MEGATRON_OTEL_RANK_STRATEGY`` /
    ``NEMO_LENS_EXPORT_STRATEGY``.

    Attributes:
        policy: ``all``, ``last``, ``first_per_node``, ``list`` (the ranks in ``ranks``),
            ``single`` (the rank ``rank``; -1 is the last) or ``sampled`` (see
            :func:`sampled_ranks`).
        setting: The variables the policy was read from, as given (``NAME=value, ...``), for
            messages; empty for the default.
    """

    policy: str = "all"
    ranks: frozenset[int] = frozenset()
    rank: int = -1
    rate: float = 1.0
    setting: str = ""

    def exports(self, identity: RankIdentity) -> bool:
        """True when the process of ``identity`` exports telemetry under this policy."""
        if self.policy == "last":
            return identity.rank == identity.world_size - 1
        if self.policy == "first_per_node":
            return identity.local_rank == 0
        if self.policy == "list":
            return identity.rank in self.ranks
        if self.policy == "single":
            chosen = self.rank if self.rank >= 0 else identity.world_size - 1
            return identity.rank == chosen
        if self.policy == "sampled":
            return identity.rank in sampled_ranks(self.rate, identity.world_size)
        return True

    def exports_nowhere(self, world_size: int) -> bool:
        """True when no rank of a job of ``world_size`` ranks exports under this policy (a
        list or a single rank beyond the world). Every rank computes the same answer."""
        if self.policy == "list":
            return not any(0 <= r < world_size for r in self.ranks)
        if self.policy == "single":
            return self.rank >= world_size
        return False

    def __str__(self) -> str:
        if self.policy == "list":
            return ",".join(str(r) for r in sorted(self.ranks))
        if self.policy == "single":
            return f"single rank {self.rank if self.rank >= 0 else 'last'}"
        if self.policy == "sampled":
            return f"sampled at {self.rate:g}"
        return self.policy


def sample_score(rank: int) -> float:
    """NeMo Lens' score of ``rank`` for sampling, in [0, 1): ``md5(str(rank))`` mod 10,000 over
    10,000 (``nemo/lens/strategies.py``)."""
    digest = hashlib.md5(str(rank).encode(), usedforsecurity=False).hexdigest()
    return (int(digest, 16) % 10000) / 10000.0


@functools.lru_cache(maxsize=64)
def sampled_ranks(rate: float, world_size: int) -> frozenset[int]:
    """The ranks that export under ``sampled`` at ``rate`` in a job of ``world_size`` ranks:
    those whose :func:`sample_score` is below ``rate`` (the ranks NeMo Lens chooses), and when
    that is none of them, the one rank with the lowest score (the lowest rank on a tie), so
    that a job always exports from at least one rank. Deterministic: the same ranks on every
    rank and in every attempt of the same world size, with no communication."""
    world = max(1, world_size)
    chosen = frozenset(r for r in range(world) if sample_score(r) < rate)
    if chosen:
        return chosen
    return frozenset({min(range(world), key=lambda r: (sample_score(r), r))})


def _default_otlp() -> OtlpSettings:
    return OtlpSettings(None, "grpc", {}, DEFAULT_OTLP_TIMEOUT_S, "none")


@dataclass(frozen=True)
class LogsSettings:
    """The logs signal's settings (``OTEL_LOGS_EXPORTER``, ``OTEL_EXPORTER_OTLP_LOGS_*``,
    ``OTEL_BLRP_*``, ``OTEL_PYTHON_TRAINING_LOGGING``); see ``docs/logs.md``.

    Attributes:
        exporters: Exporter names: ``otlp``, ``console``, ``none`` or the embedded default
            ``otlp_json_file`` (``logs-rank{R}.jsonl`` in the run's directory).
        otlp: OTLP settings of the logs signal.
        schedule_delay_ms: Batch log record processor delay between exports, in ms.
        export_timeout_ms: Its export timeout, in ms (the SDK does not use it yet).
        max_queue_size: Records it holds, more are dropped; ``None`` when
            ``OTEL_BLRP_MAX_QUEUE_SIZE`` is unset (2,048 over OTLP, 65,536 for the file).
        max_export_batch_size: Records per export (at most the queue size); ``None`` when
            unset (512 over OTLP, 4,096 for the file).
        attribute_count: Attributes kept per record (``OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT``,
            else ``OTEL_ATTRIBUTE_COUNT_LIMIT``, else 128).
        bridge_root_logger: ``OTEL_PYTHON_TRAINING_LOGGING``: ``configure()`` adds the
            logging bridge to the root logger.
    """

    exporters: tuple[str, ...] = ("otlp_json_file",)
    otlp: OtlpSettings = field(default_factory=_default_otlp)
    schedule_delay_ms: float = DEFAULT_BLRP_SCHEDULE_DELAY_MS
    export_timeout_ms: float = DEFAULT_BLRP_EXPORT_TIMEOUT_MS
    max_queue_size: int | None = None
    max_export_batch_size: int | None = None
    attribute_count: int = DEFAULT_LOG_ATTRIBUTE_COUNT
    bridge_root_logger: bool = False


@dataclass(frozen=True)
class Settings:
    """Everything otel-training takes from the environment, parsed and validated."""

    sdk_disabled: bool = False
    metrics_exporters: tuple[str, ...] = ("otlp_json_file",)
    traces_exporters: tuple[str, ...] = ("otlp_json_file",)
    metrics_otlp: OtlpSettings = field(
        default_factory=lambda: OtlpSettings(None, "grpc", {}, DEFAULT_OTLP_TIMEOUT_S, "none")
    )
    traces_otlp: OtlpSettings = field(
        default_factory=lambda: OtlpSettings(None, "grpc", {}, DEFAULT_OTLP_TIMEOUT_S, "none")
    )
    proxies: ProxySettings = field(default_factory=ProxySettings)
    metric_export_interval_ms: float = DEFAULT_METRIC_EXPORT_INTERVAL_MS
    metric_export_timeout_ms: float = DEFAULT_METRIC_EXPORT_TIMEOUT_MS
    #: The interval of the embedded default's metrics file: OTEL_METRIC_EXPORT_INTERVAL when
    #: set, else DEFAULT_FILE_METRIC_EXPORT_INTERVAL_MS.
    file_metric_export_interval_ms: float = DEFAULT_FILE_METRIC_EXPORT_INTERVAL_MS
    temporality_preference: str = "cumulative"
    #: OTEL_BSP_* as given; None when unset (each exporter then gets its own default).
    bsp_schedule_delay_ms: float | None = None
    bsp_export_timeout_ms: float = DEFAULT_BSP_EXPORT_TIMEOUT_MS
    bsp_max_queue_size: int | None = None
    bsp_max_export_batch_size: int | None = None
    span_limits: Limits = field(default_factory=Limits)
    log_limits: Limits = field(default_factory=Limits)
    logs: LogsSettings = field(default_factory=LogsSettings)
    sampler: str = "parentbased_always_on"
    sampler_arg: float = 1.0
    prometheus_host: str = "localhost"
    prometheus_port: int = DEFAULT_PROMETHEUS_PORT
    output_dir: str = DEFAULT_OUTPUT_DIR
    export_ranks: ExportRanks = field(default_factory=ExportRanks)
    #: OTEL_PYTHON_TRAINING_EXPORT_REPLICATED: auto, all or pp_first
    #: (otel_training.metrics.replicated).
    export_replicated: str = "auto"
    #: OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL in ms; None when off.
    heartbeat_interval_ms: float | None = None
    step_duration_buckets_ms: tuple[float, ...] | None = None
    #: OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM: explicit or exponential.
    step_duration_histogram: str = "explicit"
    shutdown_on_sigterm: bool = True
    #: OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS: every rank writes its telemetry line, not rank 0
    #: alone.
    print_all_ranks: bool = False
    service_name: str | None = None
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    span_groups: frozenset[str] = SPAN_GROUP_PRESETS["default"]
    #: Groups recorded as NVTX ranges only (no OpenTelemetry span, no JSON line).
    nvtx_only_groups: frozenset[str] = frozenset()
    #: The most iterations per trace segment (otel_training.trace.shape derives the number).
    trace_segment_iterations: int = DEFAULT_TRACE_SEGMENT_ITERATIONS
    #: Spans one trace holds at most (otel_training.trace.shape).
    trace_span_budget: int = DEFAULT_TRACE_SPAN_BUDGET
    nvtx: bool = True
    nvtx_domain: str = DEFAULT_NVTX_DOMAIN
    jsonlog_dir: str | None = None
    identity: RankIdentity = field(default_factory=RankIdentity)
    tensor_metrics: tuple[tuple[str, int], ...] | None = None
    #: The hang thresholds of docs/health.md (OTEL_PYTHON_TRAINING_HANG_*), in seconds.
    hang: _hang.HangPolicy = field(default_factory=_hang.HangPolicy)
    #: Optimizer steps per straggler window (OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS).
    straggler_window_steps: int = _straggler.DEFAULT_WINDOW_STEPS

    @property
    def shutdown_timeout_s(self) -> float:
        """Upper bound for shutdown in seconds: the longest OTLP timeout of the signals that
        export by OTLP (metrics, traces and logs shut down side by side), else 15 s for local
        exporters (a full queue of the traces file, 131,072 spans, takes a few seconds to
        encode)."""
        timeouts = []
        if "otlp" in self.metrics_exporters:
            timeouts.append(self.metrics_otlp.timeout_s)
        if "otlp" in self.traces_exporters:
            timeouts.append(self.traces_otlp.timeout_s)
        if "otlp" in self.logs.exporters:
            timeouts.append(self.logs.otlp.timeout_s)
        return max(timeouts) if timeouts else LOCAL_SHUTDOWN_TIMEOUT_S

    @property
    def sigterm_bound_s(self) -> float:
        """Seconds from a SIGTERM that nobody else handles to the end of the process: the
        longest OTLP timeout of the signals that export by OTLP + 1 s, else 2 s
        (:data:`LOCAL_SIGTERM_BOUND_S`)."""
        exporters = (self.metrics_exporters, self.traces_exporters, self.logs.exporters)
        if any("otlp" in names for names in exporters):
            return self.shutdown_timeout_s + 1.0
        return LOCAL_SIGTERM_BOUND_S

    def prometheus_port_of_rank(self) -> int:
        """The port this process serves Prometheus metrics on: the base port plus the local
        rank, so that every rank of a node has its own (ranks 0..7 on 9464..9471)."""
        return self.prometheus_port + self.identity.local_rank


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """Parses the environment into :class:`Settings`.

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.

    Returns:
        The settings. Never raises: each unusable value logs one warning naming the variable
        and falls back to its default.
    """
    return _Parser(os.environ if environ is None else environ).settings()


def load_identity(environ: Mapping[str, str] | None = None) -> RankIdentity:
    """Parses only the rank identity (see :class:`RankIdentity`). Never raises."""
    return read_identity(EnvReader(os.environ if environ is None else environ))


def load_omp_num_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """``OMP_NUM_THREADS``: the threads OpenMP (and so torch) takes per process, the first
    number of a list (``4,2``: nested levels) when it is a whole number >= 1; ``None`` when
    unset, or unusable (one warning). Never raises."""
    env = EnvReader(os.environ if environ is None else environ)
    raw = env.raw("OMP_NUM_THREADS")
    if raw is None:
        return None
    first = raw.split(",", 1)[0].strip()
    if first.isdigit() and int(first) >= 1:
        return int(first)
    env.reject("OMP_NUM_THREADS", raw, None, "is not a whole number of at least 1")
    return None


def _resolve_span_groups(
    names: Iterable[str],
) -> tuple[frozenset[str], list[str], list[str], bool]:
    """(groups, unknown names, renamed names used, whether any name was usable)."""
    groups: set[str] = set()
    unknown, renamed = [], []
    usable = False
    for raw in names:
        name = raw.strip().lower()
        if name in RENAMED_SPAN_GROUPS:
            renamed.append(name)
            name = RENAMED_SPAN_GROUPS[name]
        if name in SPAN_GROUP_PRESETS:
            groups |= SPAN_GROUP_PRESETS[name]
            usable = True
        elif name in SPAN_GROUPS:
            groups.add(name)
            usable = True
        elif name:
            unknown.append(raw.strip())
    return frozenset(groups), unknown, renamed, usable


def cuda_visible_devices() -> tuple[str, ...] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-`` UUIDs or MIG names), from the
    process's real environment, which the CUDA runtime reads; ``None`` when unset (every device
    is visible). Never raises."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


def span_groups_from_names(names: str | Iterable[str]) -> frozenset[str]:
    """The span groups that presets and group ``names`` enable together (as
    ``OTEL_PYTHON_TRAINING_SPAN_GROUPS`` reads them, for explicit configuration in code).

    Raises:
        ValueError: when a name is neither a preset (:data:`SPAN_GROUP_PRESETS`) nor a span
        group (:data:`SPAN_GROUPS`) nor a renamed one (:data:`RENAMED_SPAN_GROUPS`).
    """
    if isinstance(names, str):
        names = names.split(",")
    groups, unknown, _, _ = _resolve_span_groups(names)
    if unknown:
        known = sorted(SPAN_GROUP_PRESETS) + sorted(SPAN_GROUPS)
        raise ValueError(f"unknown span group {unknown[0]!r}; known: {', '.join(known)}")
    return groups


#: Built-in tensor metrics that ``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` may schedule, the one list
#: of them: :data:`otel_training.tensor.BUILTIN_METRICS` gives each its definition, in this order
#: (kept here so that parsing the environment does not import torch).
TENSOR_METRIC_NAMES: Final = (
    "grad_norm",
    "param_norm",
    "grad_nonfinite",
    "update_ratio",
    "activation_rms",
    "activation_max_abs",
    "residual_rms",
    "residual_max_abs",
    "logits_norm",
    "router",
    "router_expert_load",
)


class ScheduleEntry(NamedTuple):
    """One entry of a tensor-metric schedule, as :func:`split_tensor_metric_schedule` reads it.

    Attributes:
        text: The entry as written (blanks around it taken off): ``grad_norm:10``.
        name: What stands before the colon, blanks taken off, its case kept.
        interval: The whole number of optimizer steps >= 1 after the colon; ``None`` when the
            entry is not ``NAME:INTERVAL`` with one.
    """

    text: str
    name: str
    interval: int | None


def split_tensor_metric_schedule(text: str) -> tuple[ScheduleEntry, ...] | None:
    """The one reading of a tensor-metric schedule, ``"grad_norm:10,router:50"``: in code
    (:func:`otel_training.tensor.parse_schedule`, strict) and in
    ``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` (:func:`tensor_metric_schedule`, lenient).

    Returns:
        ``None`` for ``none`` or ``off`` (any case): no tensor metric at all; else each
        non-empty comma-separated entry in order (:class:`ScheduleEntry`). Never raises: what a
        malformed entry does is the caller's policy (in code it raises, from the environment it
        warns and is skipped).
    """
    if text.strip().lower() in ("none", "off"):
        return None
    entries = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, sep, interval = (s.strip() for s in entry.partition(":"))
        try:
            steps = int(interval) if sep and interval.isdecimal() else 0
        except ValueError:  # more digits than int() converts
            steps = 0
        entries.append(ScheduleEntry(entry, name, steps if steps >= 1 else None))
    return tuple(entries)


def tensor_metric_schedule(
    environ: Mapping[str, str] | None = None,
) -> tuple[tuple[str, int], ...] | None:
    """Parses only ``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` into ``(name, interval)`` pairs.

    Returns:
        ``None`` when the variable is unset or empty, or names no usable entry (the caller's
        default applies); ``()`` for ``none``; else the usable entries in their order. Never
        raises: each bad entry (not ``NAME:INTERVAL``, an unknown name, an interval that is not
        a whole number >= 1, a repeated name) logs one warning naming it and is skipped.
    """
    return _Parser(os.environ if environ is None else environ).tensor_metrics()


_HEADER_KEY = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_GRPC_METADATA_KEY = re.compile(r"^[0-9a-z_.\-]+$")
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

_RANK_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class _Parser(EnvReader):
    """Every variable of :class:`Settings`, read with the policy of :class:`EnvReader`."""

    # -- composite values ------------------------------------------------------------------

    def _exporters(self, name: str, has_endpoint: bool, extra: frozenset[str]) -> tuple[str, ...]:
        raw = self.raw(name)
        fallback = ("otlp",) if has_endpoint else ("otlp_json_file",)
        if raw is None:
            return fallback
        names = [part.strip().lower() for part in raw.split(",") if part.strip()]
        known = EXPORTER_NAMES | extra
        unknown = [n for n in names if n not in known]
        kept = tuple(dict.fromkeys(n for n in names if n in known))
        if not kept:  # one warning, as for any unusable value
            self.reject(
                name,
                raw,
                ",".join(fallback),
                f"names no known exporter (known: {', '.join(sorted(known))})",
            )
            return fallback
        if unknown:
            self.warn(
                "%s names unknown exporter(s) %s; known: %s.",
                name,
                ", ".join(unknown),
                ", ".join(sorted(known)),
            )
        if "none" in kept:
            return ("none",)
        return kept

    def _headers(self, name: str, raw: str, protocol: str) -> dict[str, str]:
        """``k=v`` entries, URL-decoded. A malformed entry is named by its position only:
        what it holds may be a secret (``x-api-key:SECRET``)."""
        headers: dict[str, str] = {}
        position = 0
        for entry in raw.split(","):
            if not entry.strip():
                continue
            position += 1
            key, sep, value = entry.partition("=")
            key = urllib.parse.unquote(key).strip().lower()
            pattern = _GRPC_METADATA_KEY if protocol == "grpc" else _HEADER_KEY
            if not sep or not pattern.match(key):
                self.warn(
                    "%s: ignoring entry %d, which is not key=value with a valid %s key (its "
                    "content is not shown: it may hold a secret); the other entries are kept.",
                    name,
                    position,
                    "gRPC metadata" if protocol == "grpc" else "HTTP header",
                )
                continue
            headers[key] = urllib.parse.unquote(value).strip()
        return headers

    def _otlp(self, signal: str) -> OtlpSettings:
        upper = signal.upper()
        protocol_name, protocol_raw = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"
        )
        protocol = "grpc"
        if protocol_raw is not None:
            lowered = protocol_raw.lower()
            if lowered in PROTOCOLS:
                protocol = lowered
            elif lowered == "http/json":
                self.reject(
                    protocol_name,
                    protocol_raw,
                    "http/protobuf",
                    "is not available in the Python SDK",
                )
                protocol = "http/protobuf"
            else:
                self.reject(protocol_name, protocol_raw, protocol, "is not grpc or http/protobuf")

        headers: dict[str, str] = {}
        for name in ("OTEL_EXPORTER_OTLP_HEADERS", f"OTEL_EXPORTER_OTLP_{upper}_HEADERS"):
            raw = self.raw(name)
            if raw is not None:
                headers.update(self._headers(name, raw, protocol))

        endpoint = self.raw(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
        endpoint_name = f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"
        generic = endpoint is None
        if generic:
            endpoint = self.raw("OTEL_EXPORTER_OTLP_ENDPOINT")
            endpoint_name = "OTEL_EXPORTER_OTLP_ENDPOINT"
        if endpoint is not None:
            endpoint = self._endpoint(endpoint_name, endpoint, protocol, generic, signal, headers)

        timeout_name, _ = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"
        )
        timeout_s = self.positive(
            timeout_name,
            DEFAULT_OTLP_TIMEOUT_S,
            maximum=MAX_OTLP_TIMEOUT_S,
            why_maximum=" seconds (the Python SDK reads this timeout in seconds, not ms)",
        )

        compression_name, _ = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"
        )
        compression = self.choice(compression_name, COMPRESSIONS, "none")
        if compression == "deflate" and protocol == "grpc":
            self.reject(compression_name, "deflate", "gzip", "is not supported over gRPC")
            compression = "gzip"
        insecure_name, insecure_raw = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"
        )
        insecure = None if insecure_raw is None else self.boolean(insecure_name, False)
        library = (
            ("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",)
            if protocol == "grpc"
            else ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
        )
        return OtlpSettings(
            endpoint,
            protocol,
            headers,
            timeout_s,
            compression,
            insecure=insecure,
            certificate=self._sourced(
                f"OTEL_EXPORTER_OTLP_{upper}_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                *library,
            ),
            client_key=self._sourced(
                f"OTEL_EXPORTER_OTLP_{upper}_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"
            ),
            client_certificate=self._sourced(
                f"OTEL_EXPORTER_OTLP_{upper}_CLIENT_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            ),
        )

    def _sourced(self, *names: str) -> tuple[str, str] | None:
        """``(variable, value)`` of the first of ``names`` that is set, else None."""
        name, raw = self.first(*names)
        return None if raw is None else (name, raw)

    def _proxies(self) -> ProxySettings:
        """The proxy variables (:class:`ProxySettings`)."""
        return ProxySettings(
            https=self._sourced("https_proxy", "HTTPS_PROXY"),
            http=self._sourced("http_proxy", "HTTP_PROXY"),
            no_proxy=self._sourced("no_proxy", "NO_PROXY"),
            grpc=self._sourced("grpc_proxy"),
            no_grpc_proxy=self._sourced("no_grpc_proxy"),
        )

    def _endpoint(
        self,
        name: str,
        endpoint: str,
        protocol: str,
        generic: bool,
        signal: str,
        headers: dict[str, str],
    ) -> str | None:
        """A usable endpoint URL, or None after one warning. Userinfo in the URL
        (``http://user:secret@host``) becomes an ``authorization: Basic`` header (unless one
        is given) and leaves the URL, so that no log line or destination shows it."""
        shown = redact_url(endpoint)
        try:
            parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
            hostname = parsed.hostname
            parsed.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            parsed, hostname = None, None
        if parsed is None or parsed.scheme not in ("http", "https") or not hostname:
            self.warn("%s=%r is not an http(s) URL; ignoring it.", name, shown)
            return None
        if parsed.username is not None or parsed.password is not None:
            if "authorization" not in headers:
                user = urllib.parse.unquote(parsed.username or "")
                password = urllib.parse.unquote(parsed.password or "")
                token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
                headers["authorization"] = f"Basic {token}"
            self.warn(
                "%s has credentials in its URL: they are sent as an authorization header and "
                "never shown; the endpoint is %s.",
                name,
                shown,
            )
            endpoint = shown
        if protocol == "http/protobuf" and generic:
            return endpoint.rstrip("/") + f"/v1/{signal}"
        if (
            protocol == "grpc"
            and "://" not in endpoint
            and self.first(
                f"OTEL_EXPORTER_OTLP_{signal.upper()}_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"
            )[1]
            is None
        ):
            self.warn(
                "%s=%r has no scheme: gRPC will use TLS. Write http://%s for a plaintext "
                "collector, or set OTEL_EXPORTER_OTLP_INSECURE.",
                name,
                shown,
                shown,
            )
        return endpoint

    def _value_length(self, specific: str) -> int | None:
        """The attribute value length limit of a signal: its own variable, else the generic
        ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else the project's default."""
        name, raw = self.first(specific, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
        if raw is None:
            return DEFAULT_VALUE_LENGTH
        try:
            value = int(raw)
        except ValueError:
            self.reject(name, raw, DEFAULT_VALUE_LENGTH, "is not a whole number")
            return DEFAULT_VALUE_LENGTH
        if value < 0 or value > MAX_VALUE_LENGTH_LIMIT:
            self.reject(
                name, raw, DEFAULT_VALUE_LENGTH, f"is not between 0 and {MAX_VALUE_LENGTH_LIMIT}"
            )
            return DEFAULT_VALUE_LENGTH
        return value

    def _export_ranks(self) -> ExportRanks:
        name = ev.OTEL_PYTHON_TRAINING_EXPORT_RANKS
        raw = self.raw(name)
        if raw is None:
            return self._export_strategy()
        setting = f"{name}={raw}"
        lowered = raw.lower()
        if lowered in ("all", "last", "first_per_node"):
            return ExportRanks(lowered, setting=setting)
        if lowered.startswith("sampled:"):
            rate = self._rate(name, raw, lowered.partition(":")[2])
            if rate is None:
                return ExportRanks()
            return ExportRanks("sampled", rate=rate, setting=setting)
        ranks: set[int] = set()
        for part in raw.split(","):
            match = _RANK_RANGE.match(part.strip())
            if not match:
                self.reject(
                    name,
                    raw,
                    "all",
                    "is not all, last, first_per_node, sampled:RATE or a list like 0,4-7",
                )
                return ExportRanks()
            low = int(match.group(1))
            high = int(match.group(2) or low)
            if high > MAX_RANK:
                self.reject(name, raw, "all", f"names a rank above {MAX_RANK}")
                return ExportRanks()
            if high < low:
                self.reject(name, raw, "all", f"has the empty range {part.strip()!r}")
                return ExportRanks()
            ranks.update(range(low, high + 1))
        return ExportRanks("list", frozenset(ranks), setting=setting)

    def _rate(self, name: str, raw: str, text: str) -> float | None:
        try:
            rate = float(text)
        except ValueError:
            rate = math.nan
        if not 0.0 <= rate <= 1.0:
            self.reject(name, raw, "all", "has a sample rate outside [0, 1]")
            return None
        return rate

    def _export_strategy(self) -> ExportRanks:
        """Megatron-LM's ``MEGATRON_OTEL_EXPORT_STRATEGY`` (the name its code reads; its guide
        calls it ``MEGATRON_OTEL_RANK_STRATEGY``, read next), else NeMo Lens'
        ``NEMO_LENS_EXPORT_STRATEGY``: ``single_rank``, ``all_ranks``, ``sampled``,
        ``first_rank_per_node``, with ``..._EXPORT_RANK`` (-1: the last rank) and
        ``..._EXPORT_SAMPLE_RATE``, each falling back to NeMo Lens' ``NEMO_LENS_*``; ``all``
        when none is set (otel-training's default: every rank exports)."""
        name, raw = self.first(
            ev.MEGATRON_OTEL_EXPORT_STRATEGY,
            ev.MEGATRON_OTEL_RANK_STRATEGY,
            ev.NEMO_LENS_EXPORT_STRATEGY,
        )
        if raw is None:
            return ExportRanks()
        strategy = raw.lower()
        if strategy not in EXPORT_STRATEGIES:
            self.reject(name, raw, "all", f"is not one of {', '.join(EXPORT_STRATEGIES)}")
            return ExportRanks()
        setting = f"{name}={raw}"
        if strategy == "all_ranks":
            return ExportRanks(setting=setting)
        if strategy == "first_rank_per_node":
            return ExportRanks("first_per_node", setting=setting)
        if strategy == "single_rank":
            rank_name, rank_raw = self.first(ev.MEGATRON_OTEL_EXPORT_RANK, ev.NEMO_LENS_EXPORT_RANK)
            rank = -1
            if rank_raw is not None:
                setting += f", {rank_name}={rank_raw}"
                try:
                    rank = int(rank_raw)
                except ValueError:
                    self.reject(rank_name, rank_raw, -1, "is not a whole number")
                if rank < -1:
                    self.reject(rank_name, rank_raw, -1, "is below -1")
                    rank = -1
            return ExportRanks("single", rank=rank, setting=setting)
        rate_name, rate_raw = self.first(
            ev.MEGATRON_OTEL_EXPORT_SAMPLE_RATE, ev.NEMO_LENS_EXPORT_SAMPLE_RATE
        )
        rate = 1.0 if rate_raw is None else self._rate(rate_name, rate_raw, rate_raw)
        if rate_raw is not None:
            setting += f", {rate_name}={rate_raw}"
        return ExportRanks("sampled", rate=1.0 if rate is None else rate, setting=setting)

    def _heartbeat_interval(self, interval_ms: float) -> float | None:
        """``OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL`` in ms, or None (off): unset, or not
        shorter than the metric export interval (one warning: it would change nothing)."""
        name = ev.OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL
        if self.raw(name) is None:
            return None
        heartbeat_ms = self.positive(
            name, interval_ms, minimum=MIN_EXPORT_INTERVAL_MS, maximum=MAX_INTERVAL_MS
        )
        if heartbeat_ms >= interval_ms:
            self.reject(
                name,
                self.raw(name) or "",
                None,
                f"is not shorter than the metric export interval ({show(interval_ms)} ms)",
            )
            return None
        return heartbeat_ms

    def _step_duration_histogram(self, metrics_exporters: tuple[str, ...]) -> str:
        """``OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM``; ``explicit`` with one warning when
        the Prometheus exporter, which has no exponential histograms, is configured."""
        name = ev.OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM
        kind = self.choice(name, STEP_DURATION_HISTOGRAMS, "explicit")
        if kind == "exponential" and "prometheus" in metrics_exporters:
            self.reject(
                name,
                self.raw(name) or kind,
                "explicit",
                "cannot be served by the Prometheus exporter (OTEL_METRICS_EXPORTER=prometheus "
                "has no exponential histograms)",
            )
            return "explicit"
        return kind

    def _buckets(self) -> tuple[float, ...] | None:
        name = ev.OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS
        raw = self.raw(name)
        if raw is None:
            return None
        try:
            bounds = tuple(float(part) for part in raw.split(",") if part.strip())
        except ValueError:
            self.reject(name, raw, "the built-in buckets", "is not a list of numbers")
            return None
        ok = bounds and all(math.isfinite(b) and b >= 0 for b in bounds)
        if not ok or any(b >= c for b, c in zip(bounds, bounds[1:])):
            self.reject(
                name,
                raw,
                "the built-in buckets",
                "must be a strictly increasing list of finite non-negative numbers",
            )
            return None
        return bounds

    def _span_groups(self) -> frozenset[str]:
        """``OTEL_PYTHON_TRAINING_SPAN_GROUPS``, else Megatron-LM's ``MEGATRON_OTEL_SPAN_GROUPS``,
        else NeMo Lens' ``NEMO_LENS_SPAN_GROUPS``; presets and groups combined."""
        name, raw = self.first(
            ev.OTEL_PYTHON_TRAINING_SPAN_GROUPS,
            ev.MEGATRON_OTEL_SPAN_GROUPS,
            ev.NEMO_LENS_SPAN_GROUPS,
        )
        default = SPAN_GROUP_PRESETS["default"]
        if raw is None:
            return default
        groups, unknown, renamed, usable = _resolve_span_groups(raw.split(","))
        known = sorted(SPAN_GROUP_PRESETS) + sorted(SPAN_GROUPS)
        if not usable:
            self.reject(name, raw, "default", f"names no preset or span group of {known}")
            return default
        if unknown:
            self.warn(
                "%s names unknown span group(s) %s, ignored; known: %s.",
                name,
                ", ".join(unknown),
                ", ".join(known),
            )
        for old in renamed:
            self.warn(
                "%s: the span group %r is now called %r (Megatron-LM's name).",
                name,
                old,
                RENAMED_SPAN_GROUPS[old],
            )
        return groups

    def _nvtx_only_groups(self) -> frozenset[str]:
        """``OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS``: ``none`` (default), ``fine`` (the
        fine-grained groups, ``NVTX_ONLY_CANDIDATE_GROUPS``) or group names."""
        name = ev.OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS
        raw = self.raw(name)
        if raw is None or raw.lower() == "none":
            return frozenset()
        chosen: set[str] = set()
        for part in (p.strip().lower() for p in raw.split(",")):
            part = RENAMED_SPAN_GROUPS.get(part, part)  # as in the span groups' own variable
            if part == "fine":
                chosen |= NVTX_ONLY_CANDIDATE_GROUPS
            elif part in SPAN_GROUPS:
                chosen.add(part)
            elif part:
                self.warn("%s: ignoring %r, which is neither fine nor a span group.", name, part)
        return frozenset(chosen)

    def _resource_attributes(self) -> dict[str, str]:
        """``OTEL_RESOURCE_ATTRIBUTES`` as the specification says: ``k=v`` pairs separated by
        commas, keys and values percent-decoded; one warning per malformed entry, named by its
        position. The only parse of it: the resource is built without the SDK's own."""
        name = "OTEL_RESOURCE_ATTRIBUTES"
        raw = self.raw(name)
        found: dict[str, str] = {}
        position = 0
        for entry in (raw or "").split(","):
            if not entry.strip():
                continue
            position += 1
            key, sep, value = entry.partition("=")
            try:
                key = urllib.parse.unquote(key, errors="strict").strip()
                value = urllib.parse.unquote(value, errors="strict").strip()
            except UnicodeDecodeError:
                key = ""
            if not sep or not key:
                self.warn(
                    "%s: ignoring entry %d, which is not key=value with percent-encoded UTF-8.",
                    name,
                    position,
                )
                continue
            found[key] = value
        return found

    def tensor_metrics(self) -> tuple[tuple[str, int], ...] | None:
        name = ev.OTEL_PYTHON_TRAINING_TENSOR_METRICS
        raw = self.raw(name)
        if raw is None:
            return None
        entries = split_tensor_metric_schedule(raw)
        if entries is None:
            return ()
        schedule: dict[str, int] = {}
        for entry in entries:
            metric = entry.name.lower()
            why = None
            if entry.interval is None:
                why = "is not NAME:INTERVAL with a whole number of steps >= 1"
            elif metric not in TENSOR_METRIC_NAMES:
                why = f"names no tensor metric (known: {', '.join(TENSOR_METRIC_NAMES)})"
            elif metric in schedule:
                why = "repeats a tensor metric already scheduled"
            if why is not None:
                self.warn("%s: ignoring the entry %r, which %s.", name, entry.text, why)
                continue
            schedule[metric] = entry.interval
        if not schedule:
            self.reject(name, raw, "the observer's default", "schedules no tensor metric")
            return None
        return tuple(schedule.items())

    def _logs(self) -> LogsSettings:
        """The logs signal: its exporters (``otlp`` when a logs endpoint is set, as for the
        other signals), OTLP settings, batch processor and attribute count."""
        otlp = self._otlp("logs")
        exporters = self._exporters("OTEL_LOGS_EXPORTER", otlp.endpoint is not None, frozenset())
        queue = batch = None
        if self.raw("OTEL_BLRP_MAX_QUEUE_SIZE") is not None:
            queue = self.positive_int("OTEL_BLRP_MAX_QUEUE_SIZE", DEFAULT_BLRP_MAX_QUEUE_SIZE)
        if self.raw("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE") is not None:
            batch = self.positive_int(
                "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BLRP_MAX_EXPORT_BATCH_SIZE
            )
        if queue is not None and batch is not None and batch > queue:
            self.warn(
                "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE (%d) is larger than OTEL_BLRP_MAX_QUEUE_SIZE "
                "(%d); using %d.",
                batch,
                queue,
                queue,
            )
            batch = queue
        count_name, count_raw = self.first(
            "OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT"
        )
        count = DEFAULT_LOG_ATTRIBUTE_COUNT
        if count_raw is not None:
            if count_raw.isdigit() and int(count_raw) <= MAX_VALUE_LENGTH_LIMIT:
                count = int(count_raw)
            else:
                self.reject(
                    count_name,
                    count_raw,
                    DEFAULT_LOG_ATTRIBUTE_COUNT,
                    f"is not a whole number between 0 and {MAX_VALUE_LENGTH_LIMIT}",
                )
        return LogsSettings(
            exporters=exporters,
            otlp=otlp,
            schedule_delay_ms=self.positive(
                "OTEL_BLRP_SCHEDULE_DELAY",
                DEFAULT_BLRP_SCHEDULE_DELAY_MS,
                minimum=MIN_BSP_SCHEDULE_DELAY_MS,
                maximum=MAX_INTERVAL_MS,
            ),
            export_timeout_ms=self.positive(
                "OTEL_BLRP_EXPORT_TIMEOUT", DEFAULT_BLRP_EXPORT_TIMEOUT_MS, maximum=MAX_INTERVAL_MS
            ),
            max_queue_size=queue,
            max_export_batch_size=batch,
            attribute_count=count,
            bridge_root_logger=self.boolean(ev.OTEL_PYTHON_TRAINING_LOGGING, False),
        )

    def _optional_positive(
        self, name: str, default: float, *, minimum: float | None = None
    ) -> float | None:
        """:meth:`positive`, or ``None`` when the variable is unset (the caller chooses)."""
        if self.raw(name) is None:
            return None
        return self.positive(name, default, minimum=minimum, maximum=MAX_INTERVAL_MS)

    def settings(self) -> Settings:
        sdk_disabled = self.boolean("OTEL_SDK_DISABLED", False)
        metrics_otlp = self._otlp("metrics")
        traces_otlp = self._otlp("traces")
        metrics_exporters = self._exporters(
            "OTEL_METRICS_EXPORTER", metrics_otlp.endpoint is not None, METRICS_ONLY_EXPORTER_NAMES
        )
        traces_exporters = self._exporters(
            "OTEL_TRACES_EXPORTER", traces_otlp.endpoint is not None, frozenset()
        )
        interval_given = self.raw("OTEL_METRIC_EXPORT_INTERVAL") is not None
        interval_ms = self.positive(
            "OTEL_METRIC_EXPORT_INTERVAL",
            DEFAULT_METRIC_EXPORT_INTERVAL_MS,
            minimum=MIN_EXPORT_INTERVAL_MS,
            maximum=MAX_INTERVAL_MS,
        )
        timeout_ms = self.positive(
            "OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_METRIC_EXPORT_TIMEOUT_MS, maximum=MAX_INTERVAL_MS
        )
        if timeout_ms > interval_ms:
            if self.raw("OTEL_METRIC_EXPORT_TIMEOUT") is not None:
                self.warn(
                    "OTEL_METRIC_EXPORT_TIMEOUT (%s ms) is longer than "
                    "OTEL_METRIC_EXPORT_INTERVAL (%s ms); clamping the timeout to the interval.",
                    show(timeout_ms),
                    show(interval_ms),
                )
            timeout_ms = interval_ms
        sampler = self.choice("OTEL_TRACES_SAMPLER", SAMPLERS, "parentbased_always_on")
        sampler_arg = 1.0
        if sampler.endswith("traceidratio"):
            raw = self.raw("OTEL_TRACES_SAMPLER_ARG")
            if raw is not None:
                try:
                    sampler_arg = float(raw)
                except ValueError:
                    sampler_arg = math.nan
                if not 0.0 <= sampler_arg <= 1.0:
                    self.reject("OTEL_TRACES_SAMPLER_ARG", raw, 1.0, "is not a ratio in [0, 1]")
                    sampler_arg = 1.0
        port = self.positive_int("OTEL_EXPORTER_PROMETHEUS_PORT", DEFAULT_PROMETHEUS_PORT)
        if port > 65535:
            self.reject(
                "OTEL_EXPORTER_PROMETHEUS_PORT",
                str(port),
                DEFAULT_PROMETHEUS_PORT,
                "is not a TCP port",
            )
            port = DEFAULT_PROMETHEUS_PORT
        queue_size = (
            self.positive_int("OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_BSP_MAX_QUEUE_SIZE)
            if self.raw("OTEL_BSP_MAX_QUEUE_SIZE") is not None
            else None
        )
        batch_size = (
            self.positive_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE)
            if self.raw("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") is not None
            else None
        )
        return Settings(
            sdk_disabled=sdk_disabled,
            metrics_exporters=metrics_exporters,
            traces_exporters=traces_exporters,
            metrics_otlp=metrics_otlp,
            traces_otlp=traces_otlp,
            proxies=self._proxies(),
            metric_export_interval_ms=interval_ms,
            metric_export_timeout_ms=timeout_ms,
            file_metric_export_interval_ms=(
                interval_ms if interval_given else DEFAULT_FILE_METRIC_EXPORT_INTERVAL_MS
            ),
            temporality_preference=self.choice(
                "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                TEMPORALITY_PREFERENCES,
                "cumulative",
            ),
            bsp_schedule_delay_ms=self._optional_positive(
                "OTEL_BSP_SCHEDULE_DELAY",
                DEFAULT_BSP_SCHEDULE_DELAY_MS,
                minimum=MIN_BSP_SCHEDULE_DELAY_MS,
            ),
            bsp_export_timeout_ms=self.positive(
                "OTEL_BSP_EXPORT_TIMEOUT", DEFAULT_BSP_EXPORT_TIMEOUT_MS, maximum=MAX_INTERVAL_MS
            ),
            bsp_max_queue_size=queue_size,
            bsp_max_export_batch_size=batch_size,
            span_limits=Limits(
                value_length=self._value_length("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT")
            ),
            log_limits=Limits(
                value_length=self._value_length("OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT")
            ),
            logs=self._logs(),
            service_name=self.raw("OTEL_SERVICE_NAME"),
            resource_attributes=self._resource_attributes(),
            sampler=sampler,
            sampler_arg=sampler_arg,
            prometheus_host=self.raw("OTEL_EXPORTER_PROMETHEUS_HOST") or "localhost",
            prometheus_port=port,
            output_dir=self.raw(ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR) or DEFAULT_OUTPUT_DIR,
            export_ranks=self._export_ranks(),
            export_replicated=self.choice(
                ev.OTEL_PYTHON_TRAINING_EXPORT_REPLICATED, EXPORT_REPLICATED_POLICIES, "auto"
            ),
            heartbeat_interval_ms=self._heartbeat_interval(interval_ms),
            step_duration_buckets_ms=self._buckets(),
            step_duration_histogram=self._step_duration_histogram(metrics_exporters),
            shutdown_on_sigterm=self.boolean(ev.OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM, True),
            print_all_ranks=self.boolean(ev.OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS, False),
            span_groups=self._span_groups(),
            nvtx_only_groups=self._nvtx_only_groups(),
            trace_segment_iterations=self.positive_int(
                ev.OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS, DEFAULT_TRACE_SEGMENT_ITERATIONS
            ),
            trace_span_budget=self.positive_int(
                ev.OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET, DEFAULT_TRACE_SPAN_BUDGET
            ),
            # NVTX_DISABLE is the nvtx package's switch: any non-empty value disables it.
            nvtx=self.boolean(ev.OTEL_PYTHON_TRAINING_NVTX, True)
            and self.raw("NVTX_DISABLE") is None,
            nvtx_domain=self.raw(ev.OTEL_PYTHON_TRAINING_NVTX_DOMAIN) or DEFAULT_NVTX_DOMAIN,
            jsonlog_dir=self.raw(ev.OTEL_PYTHON_TRAINING_JSONLOG_DIR),
            identity=read_identity(self),
            tensor_metrics=self.tensor_metrics(),
            hang=_hang.HangPolicy(
                floor_s=self.positive(
                    ev.OTEL_PYTHON_TRAINING_HANG_FLOOR_S,
                    _hang.DEFAULT_FLOOR_S,
                    maximum=MAX_HANG_S,
                ),
                phase_budget_s=self.positive(
                    ev.OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S,
                    _hang.DEFAULT_PHASE_BUDGET_S,
                    maximum=MAX_HANG_S,
                ),
                startup_s=self.positive(
                    ev.OTEL_PYTHON_TRAINING_HANG_STARTUP_S,
                    _hang.DEFAULT_STARTUP_S,
                    maximum=MAX_HANG_S,
                ),
            ),
            straggler_window_steps=self.positive_int(
                ev.OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS, _straggler.DEFAULT_WINDOW_STEPS
            ),
        )
