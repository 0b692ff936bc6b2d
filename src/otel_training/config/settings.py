"""The settings as frozen dataclasses: :class:`Settings` and its parts (:class:`OtlpSettings`
per signal, :class:`ProxySettings`, :class:`LogsSettings`), and :class:`ExportRanks`, the
policy of which ranks export, with NeMo Lens' sampling of ranks (:func:`sampled_ranks`).

Nothing here reads the environment: :func:`otel_training.config.load` fills these in.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from otel_training.config._env import redact_url
from otel_training.config.defaults import (
    DEFAULT_BLRP_EXPORT_TIMEOUT_MS,
    DEFAULT_BLRP_SCHEDULE_DELAY_MS,
    DEFAULT_BSP_EXPORT_TIMEOUT_MS,
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
    LOCAL_SHUTDOWN_TIMEOUT_S,
    LOCAL_SIGTERM_BOUND_S,
)
from otel_training.config.identity import RankIdentity
from otel_training.config.span_groups import SPAN_GROUP_PRESETS
from otel_training.export.limits import Limits
from otel_training.health import hang as _hang
from otel_training.health import straggler as _straggler


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
