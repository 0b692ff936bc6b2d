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

import logging
import math
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from otel_training import environment_variables as ev
from otel_training.semconv.spans import SPAN_GROUP_LEVELS, SPAN_LEVELS

_logger = logging.getLogger(__name__)

DEFAULT_OUTPUT_DIR: Final = "otel-training-telemetry"
DEFAULT_METRIC_EXPORT_INTERVAL_MS: Final = 60_000.0
DEFAULT_METRIC_EXPORT_TIMEOUT_MS: Final = 30_000.0
DEFAULT_OTLP_TIMEOUT_S: Final = 10.0
DEFAULT_BSP_SCHEDULE_DELAY_MS: Final = 5_000.0
DEFAULT_BSP_EXPORT_TIMEOUT_MS: Final = 30_000.0
DEFAULT_BSP_MAX_QUEUE_SIZE: Final = 2048
DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE: Final = 512
DEFAULT_NVTX_DOMAIN: Final = "otel_training"

#: The span group of phases that name no group of the registry (``phase(name)``); it is on in
#: every preset but ``none``.
CUSTOM_SPAN_GROUP: Final = "custom"
#: Every span group: those of the registry (``otel_training.semconv.SPAN_GROUP_LEVELS``) and
#: ``custom``.
SPAN_GROUPS: Final = frozenset(SPAN_GROUP_LEVELS) | {CUSTOM_SPAN_GROUP}
#: The presets of ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``: ``none`` and, for each level of
#: ``otel_training.semconv.SPAN_LEVELS``, the groups of that level and of the levels before it.
SPAN_GROUP_PRESETS: Final = {
    "none": frozenset(),
    **{
        level: frozenset(
            [CUSTOM_SPAN_GROUP]
            + [g for g, at in SPAN_GROUP_LEVELS.items() if SPAN_LEVELS.index(at) <= i]
        )
        for i, level in enumerate(SPAN_LEVELS)
    },
}

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

#: The standard variables otel-training parses itself (the SDK's exporters may read others,
#: such as the certificate paths, directly).
STANDARD_VARIABLES: Final = (
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_METRICS_EXPORTER",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_METRIC_EXPORT_TIMEOUT",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
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
    """

    endpoint: str | None
    protocol: str
    headers: Mapping[str, str]
    timeout_s: float
    compression: str


@dataclass(frozen=True)
class RankIdentity:
    """Where this process sits in the training job, from launcher variables.

    Sources, first match wins: torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_RUN_ID``), SLURM (``SLURM_PROCID``,
    ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``, ``SLURM_JOB_ID``), Kubernetes
    (``JOB_COMPLETION_INDEX`` or ``PET_NODE_RANK`` for the node rank, ``HOSTNAME`` for the pod).
    A single process without a launcher is rank 0 of 1.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    launcher: str = "none"
    job_id: str | None = None
    run_id: str | None = None
    k8s_pod_name: str | None = None
    k8s_namespace: str | None = None


@dataclass(frozen=True)
class ExportRanks:
    """The export-rank policy of ``OTEL_PYTHON_TRAINING_EXPORT_RANKS``."""

    policy: str = "all"
    ranks: frozenset[int] = frozenset()

    def exports(self, identity: RankIdentity) -> bool:
        """True when the process of ``identity`` exports telemetry under this policy."""
        if self.policy == "last":
            return identity.rank == identity.world_size - 1
        if self.policy == "first_per_node":
            return identity.local_rank == 0
        if self.policy == "list":
            return identity.rank in self.ranks
        return True

    def __str__(self) -> str:
        if self.policy == "list":
            return ",".join(str(r) for r in sorted(self.ranks))
        return self.policy


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
    metric_export_interval_ms: float = DEFAULT_METRIC_EXPORT_INTERVAL_MS
    metric_export_timeout_ms: float = DEFAULT_METRIC_EXPORT_TIMEOUT_MS
    temporality_preference: str = "cumulative"
    bsp_schedule_delay_ms: float = DEFAULT_BSP_SCHEDULE_DELAY_MS
    bsp_export_timeout_ms: float = DEFAULT_BSP_EXPORT_TIMEOUT_MS
    bsp_max_queue_size: int = DEFAULT_BSP_MAX_QUEUE_SIZE
    bsp_max_export_batch_size: int = DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE
    sampler: str = "parentbased_always_on"
    sampler_arg: float = 1.0
    prometheus_host: str = "localhost"
    prometheus_port: int = 9464
    output_dir: str = DEFAULT_OUTPUT_DIR
    export_ranks: ExportRanks = field(default_factory=ExportRanks)
    step_duration_buckets_ms: tuple[float, ...] | None = None
    shutdown_on_sigterm: bool = True
    service_name: str | None = None
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    span_groups: frozenset[str] = SPAN_GROUP_PRESETS["default"]
    nvtx: bool = True
    nvtx_domain: str = DEFAULT_NVTX_DOMAIN
    jsonlog_dir: str | None = None
    identity: RankIdentity = field(default_factory=RankIdentity)
    tensor_metrics: tuple[tuple[str, int], ...] | None = None

    @property
    def shutdown_timeout_s(self) -> float:
        """Upper bound for shutdown in seconds: the OTLP timeout of the signals that export by
        OTLP (metrics and traces shut down side by side), else 5 s for local exporters."""
        timeouts = [5.0]
        if "otlp" in self.metrics_exporters:
            timeouts.append(self.metrics_otlp.timeout_s)
        if "otlp" in self.traces_exporters:
            timeouts.append(self.traces_otlp.timeout_s)
        return max(timeouts)


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
    return _Parser(os.environ if environ is None else environ).identity()


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
        group (:data:`SPAN_GROUPS`).
    """
    if isinstance(names, str):
        names = names.split(",")
    groups: set[str] = set()
    for raw in names:
        name = raw.strip().lower()
        if name in SPAN_GROUP_PRESETS:
            groups |= SPAN_GROUP_PRESETS[name]
        elif name in SPAN_GROUPS:
            groups.add(name)
        elif name:
            known = sorted(SPAN_GROUP_PRESETS) + sorted(SPAN_GROUPS)
            raise ValueError(f"unknown span group {raw!r}; known: {', '.join(known)}")
    return frozenset(groups)


#: Built-in tensor metrics that ``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` may schedule (their
#: definitions are in :mod:`otel_training.tensor.definitions`; kept here so that parsing the
#: environment does not import torch).
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


def _show(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


_RANK_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class _Parser:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self._env = environ
        self._warned: set[str] = set()

    def _warn(self, message: str, *args: object) -> None:
        """Logs a warning once per parse (generic variables are read for both signals)."""
        text = message % args
        if text not in self._warned:
            self._warned.add(text)
            _logger.warning("%s", text)

    # -- primitives, one policy ---------------------------------------------------------

    def _raw(self, name: str) -> str | None:
        value = self._env.get(name)
        if value is None or not value.strip():
            return None
        return value.strip()

    def _reject(self, name: str, raw: str, default: object, why: str) -> None:
        if default is None:
            self._warn("%s=%r %s; ignoring it.", name, raw, why)
        else:
            self._warn("%s=%r %s; using %s instead.", name, raw, why, _show(default))

    def _bool(self, name: str, default: bool) -> bool:
        raw = self._raw(name)
        if raw is None:
            return default
        lowered = raw.lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
        self._reject(name, raw, default, "is not 'true' or 'false'")
        return default

    def _positive(
        self,
        name: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        why_maximum: str = "",
    ) -> float:
        """A finite number > 0; below ``minimum`` it is raised to it, above ``maximum`` (or
        not a positive number) the default is used; each with one warning."""
        raw = self._raw(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            self._reject(name, raw, default, "is not a number")
            return default
        if not math.isfinite(value) or value <= 0:
            self._reject(name, raw, default, "must be a finite number greater than zero")
            return default
        if maximum is not None and value > maximum:
            self._reject(name, raw, default, f"is above {_show(maximum)}{why_maximum}")
            return default
        if minimum is not None and value < minimum:
            self._warn("%s=%r is below %s; using %s.", name, raw, _show(minimum), _show(minimum))
            return minimum
        return value

    def _positive_int(self, name: str, default: int) -> int:
        value = self._positive(name, float(default))
        if value != int(value):
            self._reject(name, str(value), default, "must be a whole number")
            return default
        return int(value)

    def _choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        raw = self._raw(name)
        if raw is None:
            return default
        if raw.lower() in choices:
            return raw.lower()
        self._reject(name, raw, default, f"is not one of {', '.join(choices)}")
        return default

    def _first(self, *names: str) -> tuple[str, str | None]:
        for name in names:
            raw = self._raw(name)
            if raw is not None:
                return name, raw
        return names[-1], None

    # -- composite values ------------------------------------------------------------------

    def _exporters(self, name: str, has_endpoint: bool, extra: frozenset[str]) -> tuple[str, ...]:
        raw = self._raw(name)
        fallback = ("otlp",) if has_endpoint else ("otlp_json_file",)
        if raw is None:
            return fallback
        names = [part.strip().lower() for part in raw.split(",") if part.strip()]
        known = EXPORTER_NAMES | extra
        unknown = [n for n in names if n not in known]
        if unknown:
            self._warn(
                "%s names unknown exporter(s) %s; known: %s.",
                name,
                ", ".join(unknown),
                ", ".join(sorted(known)),
            )
        kept = tuple(dict.fromkeys(n for n in names if n in known))
        if not kept:
            self._reject(name, raw, fallback, "names no known exporter")
            return fallback
        if "none" in kept:
            return ("none",)
        return kept

    def _headers(self, name: str, raw: str, protocol: str) -> dict[str, str]:
        headers: dict[str, str] = {}
        for entry in raw.split(","):
            if not entry.strip():
                continue
            key, sep, value = entry.partition("=")
            key = urllib.parse.unquote(key).strip().lower()
            pattern = _GRPC_METADATA_KEY if protocol == "grpc" else _HEADER_KEY
            if not sep or not pattern.match(key):
                self._warn(
                    "%s: ignoring the malformed entry %r (expected key=value with a valid %s "
                    "key); the other entries are kept.",
                    name,
                    entry.strip(),
                    "gRPC metadata" if protocol == "grpc" else "HTTP header",
                )
                continue
            headers[key] = urllib.parse.unquote(value).strip()
        return headers

    def _otlp(self, signal: str) -> OtlpSettings:
        upper = signal.upper()
        protocol_name, protocol_raw = self._first(
            f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"
        )
        protocol = "grpc"
        if protocol_raw is not None:
            lowered = protocol_raw.lower()
            if lowered in PROTOCOLS:
                protocol = lowered
            elif lowered == "http/json":
                self._reject(
                    protocol_name,
                    protocol_raw,
                    "http/protobuf",
                    "is not available in the Python SDK",
                )
                protocol = "http/protobuf"
            else:
                self._reject(protocol_name, protocol_raw, protocol, "is not grpc or http/protobuf")

        endpoint = self._raw(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
        endpoint_name = f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"
        generic = endpoint is None
        if generic:
            endpoint = self._raw("OTEL_EXPORTER_OTLP_ENDPOINT")
            endpoint_name = "OTEL_EXPORTER_OTLP_ENDPOINT"
        if endpoint is not None:
            parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                self._reject(endpoint_name, endpoint, None, "is not an http(s) URL")
                endpoint = None
            elif protocol == "http/protobuf" and generic:
                endpoint = endpoint.rstrip("/") + f"/v1/{signal}"
            elif (
                protocol == "grpc"
                and "://" not in endpoint
                and self._raw("OTEL_EXPORTER_OTLP_INSECURE") is None
            ):
                self._warn(
                    "%s=%r has no scheme: gRPC will use TLS. Write http://%s for a plaintext "
                    "collector, or set OTEL_EXPORTER_OTLP_INSECURE.",
                    endpoint_name,
                    endpoint,
                    endpoint,
                )

        headers: dict[str, str] = {}
        for name in ("OTEL_EXPORTER_OTLP_HEADERS", f"OTEL_EXPORTER_OTLP_{upper}_HEADERS"):
            raw = self._raw(name)
            if raw is not None:
                headers.update(self._headers(name, raw, protocol))

        timeout_name, _ = self._first(
            f"OTEL_EXPORTER_OTLP_{upper}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"
        )
        timeout_s = self._positive(
            timeout_name,
            DEFAULT_OTLP_TIMEOUT_S,
            maximum=MAX_OTLP_TIMEOUT_S,
            why_maximum=" seconds (the Python SDK reads this timeout in seconds, not ms)",
        )

        compression_name, _ = self._first(
            f"OTEL_EXPORTER_OTLP_{upper}_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"
        )
        compression = self._choice(compression_name, COMPRESSIONS, "none")
        if compression == "deflate" and protocol == "grpc":
            self._reject(compression_name, "deflate", "gzip", "is not supported over gRPC")
            compression = "gzip"
        return OtlpSettings(endpoint, protocol, headers, timeout_s, compression)

    def _export_ranks(self) -> ExportRanks:
        name = ev.OTEL_PYTHON_TRAINING_EXPORT_RANKS
        raw = self._raw(name)
        if raw is None:
            return ExportRanks()
        lowered = raw.lower()
        if lowered in ("all", "last", "first_per_node"):
            return ExportRanks(lowered)
        ranks: set[int] = set()
        for part in raw.split(","):
            match = _RANK_RANGE.match(part.strip())
            if not match:
                self._reject(
                    name, raw, "all", "is not all, last, first_per_node or a list like 0,4-7"
                )
                return ExportRanks()
            low = int(match.group(1))
            high = int(match.group(2) or low)
            if high > MAX_RANK:
                self._reject(name, raw, "all", f"names a rank above {MAX_RANK}")
                return ExportRanks()
            if high < low:
                self._reject(name, raw, "all", f"has the empty range {part.strip()!r}")
                return ExportRanks()
            ranks.update(range(low, high + 1))
        return ExportRanks("list", frozenset(ranks))

    def _buckets(self) -> tuple[float, ...] | None:
        name = ev.OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS
        raw = self._raw(name)
        if raw is None:
            return None
        try:
            bounds = tuple(float(part) for part in raw.split(",") if part.strip())
        except ValueError:
            self._reject(name, raw, "the built-in buckets", "is not a list of numbers")
            return None
        ok = bounds and all(math.isfinite(b) and b >= 0 for b in bounds)
        if not ok or any(b >= c for b, c in zip(bounds, bounds[1:])):
            self._reject(
                name,
                raw,
                "the built-in buckets",
                "must be a strictly increasing list of finite non-negative numbers",
            )
            return None
        return bounds

    def _span_groups(self) -> frozenset[str]:
        name = ev.OTEL_PYTHON_TRAINING_SPAN_GROUPS
        raw = self._raw(name)
        default = SPAN_GROUP_PRESETS["default"]
        if raw is None:
            return default
        groups: set[str] = set()
        usable = False
        unknown = []
        for part in (p.strip().lower() for p in raw.split(",")):
            if part in SPAN_GROUP_PRESETS:
                groups |= SPAN_GROUP_PRESETS[part]
                usable = True
            elif part in SPAN_GROUPS:
                groups.add(part)
                usable = True
            elif part:
                unknown.append(part)
        known = sorted(SPAN_GROUP_PRESETS) + sorted(SPAN_GROUPS)
        if not usable:
            self._reject(name, raw, "default", f"names no preset or span group of {known}")
            return default
        if unknown:
            _logger.warning(
                "%s names unknown span group(s) %s, ignored; known: %s.",
                name,
                ", ".join(unknown),
                ", ".join(known),
            )
        return frozenset(groups)

    def _resource_attributes(self) -> dict[str, str]:
        """``OTEL_RESOURCE_ATTRIBUTES``: ``k=v`` pairs, percent-decoded; bad entries warned."""
        name = "OTEL_RESOURCE_ATTRIBUTES"
        raw = self._raw(name)
        found: dict[str, str] = {}
        for entry in (raw or "").split(","):
            if not entry.strip():
                continue
            key, sep, value = entry.partition("=")
            key = urllib.parse.unquote(key).strip()
            if not sep or not key:
                self._warn("%s: ignoring the malformed entry %r.", name, entry.strip())
                continue
            found[key] = urllib.parse.unquote(value).strip()
        return found

    def _int(self, name: str) -> int | None:
        raw = self._raw(name)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            self._reject(name, raw, None, "is not a whole number")
            return None
        if value < 0:
            self._reject(name, raw, None, "is negative")
            return None
        return value

    def tensor_metrics(self) -> tuple[tuple[str, int], ...] | None:
        name = ev.OTEL_PYTHON_TRAINING_TENSOR_METRICS
        raw = self._raw(name)
        if raw is None:
            return None
        if raw.lower() in ("none", "off"):
            return ()
        schedule: dict[str, int] = {}
        for entry in (part.strip() for part in raw.split(",")):
            if not entry:
                continue
            metric, sep, interval = (s.strip() for s in entry.partition(":"))
            metric = metric.lower()
            why = None
            if not sep or not interval.isdigit() or int(interval) < 1:
                why = "is not NAME:INTERVAL with a whole number of steps >= 1"
            elif metric not in TENSOR_METRIC_NAMES:
                why = f"names no tensor metric (known: {', '.join(TENSOR_METRIC_NAMES)})"
            elif metric in schedule:
                why = "repeats a tensor metric already scheduled"
            if why is not None:
                _logger.warning("%s: ignoring the entry %r, which %s.", name, entry, why)
                continue
            schedule[metric] = int(interval)
        if not schedule:
            self._reject(name, raw, "the observer's default", "schedules no tensor metric")
            return None
        return tuple(schedule.items())

    def identity(self) -> RankIdentity:
        env_run_id = self._raw(ev.OTEL_PYTHON_TRAINING_RUN_ID)
        k8s = self._raw("KUBERNETES_SERVICE_HOST") is not None
        k8s_fields = {
            "k8s_pod_name": self._raw("HOSTNAME") if k8s else None,
            "k8s_namespace": self._raw("POD_NAMESPACE") if k8s else None,
        }
        slurm_job = self._raw("SLURM_JOB_ID")
        slurm_run = None
        if slurm_job is not None:
            step = self._raw("SLURM_STEP_ID")
            slurm_run = f"slurm-{slurm_job}" + (f".{step}" if step is not None else "")
        node_from_k8s = self._int("JOB_COMPLETION_INDEX") if k8s else None
        if node_from_k8s is None and k8s:
            node_from_k8s = self._int("PET_NODE_RANK")

        rank = self._int("RANK")
        world_size = self._int("WORLD_SIZE")
        if rank is not None and world_size:
            elastic_run = self._raw("TORCHELASTIC_RUN_ID")
            if elastic_run is not None and elastic_run.lower() == "none":
                elastic_run = None
            local_rank = self._int("LOCAL_RANK")
            node_rank = self._int("GROUP_RANK")
            if node_rank is None:
                node_rank = self._int("NODE_RANK")
            if node_rank is None:
                node_rank = node_from_k8s
            if node_rank is None and slurm_job is not None:
                node_rank = self._int("SLURM_NODEID")
            launcher = "torchrun" if self._raw("TORCHELASTIC_RUN_ID") else "env"
            if k8s and launcher == "env":
                launcher = "kubernetes"
            return RankIdentity(
                rank=rank,
                local_rank=local_rank if local_rank is not None else 0,
                world_size=world_size,
                local_world_size=self._int("LOCAL_WORLD_SIZE") or 1,
                node_rank=node_rank or 0,
                launcher=launcher,
                job_id=slurm_job or elastic_run,
                run_id=env_run_id or elastic_run or slurm_run,
                **k8s_fields,
            )

        slurm_rank = self._int("SLURM_PROCID")
        slurm_world = self._int("SLURM_NTASKS")
        if slurm_job is not None and slurm_rank is not None and slurm_world:
            per_node = self._raw("SLURM_NTASKS_PER_NODE")
            local_world = None
            if per_node is not None and per_node.isdigit():
                local_world = int(per_node)
            return RankIdentity(
                rank=slurm_rank,
                local_rank=self._int("SLURM_LOCALID") or 0,
                world_size=slurm_world,
                local_world_size=local_world or 1,
                node_rank=self._int("SLURM_NODEID") or 0,
                launcher="slurm",
                job_id=slurm_job,
                run_id=env_run_id or slurm_run,
                **k8s_fields,
            )
        return RankIdentity(
            node_rank=node_from_k8s or 0,
            launcher="kubernetes" if k8s else "none",
            job_id=slurm_job,
            run_id=env_run_id or slurm_run,
            **k8s_fields,
        )

    def settings(self) -> Settings:
        sdk_disabled = self._bool("OTEL_SDK_DISABLED", False)
        metrics_otlp = self._otlp("metrics")
        traces_otlp = self._otlp("traces")
        metrics_exporters = self._exporters(
            "OTEL_METRICS_EXPORTER", metrics_otlp.endpoint is not None, METRICS_ONLY_EXPORTER_NAMES
        )
        traces_exporters = self._exporters(
            "OTEL_TRACES_EXPORTER", traces_otlp.endpoint is not None, frozenset()
        )
        interval_ms = self._positive(
            "OTEL_METRIC_EXPORT_INTERVAL",
            DEFAULT_METRIC_EXPORT_INTERVAL_MS,
            minimum=MIN_EXPORT_INTERVAL_MS,
            maximum=MAX_INTERVAL_MS,
        )
        timeout_ms = self._positive(
            "OTEL_METRIC_EXPORT_TIMEOUT", DEFAULT_METRIC_EXPORT_TIMEOUT_MS, maximum=MAX_INTERVAL_MS
        )
        if timeout_ms > interval_ms:
            if self._raw("OTEL_METRIC_EXPORT_TIMEOUT") is not None:
                self._warn(
                    "OTEL_METRIC_EXPORT_TIMEOUT (%s ms) is longer than "
                    "OTEL_METRIC_EXPORT_INTERVAL (%s ms); clamping the timeout to the interval.",
                    _show(timeout_ms),
                    _show(interval_ms),
                )
            timeout_ms = interval_ms
        sampler = self._choice("OTEL_TRACES_SAMPLER", SAMPLERS, "parentbased_always_on")
        sampler_arg = 1.0
        if sampler.endswith("traceidratio"):
            raw = self._raw("OTEL_TRACES_SAMPLER_ARG")
            if raw is not None:
                try:
                    sampler_arg = float(raw)
                except ValueError:
                    sampler_arg = math.nan
                if not 0.0 <= sampler_arg <= 1.0:
                    self._reject("OTEL_TRACES_SAMPLER_ARG", raw, 1.0, "is not a ratio in [0, 1]")
                    sampler_arg = 1.0
        port = self._positive_int("OTEL_EXPORTER_PROMETHEUS_PORT", 9464)
        if port > 65535:
            self._reject("OTEL_EXPORTER_PROMETHEUS_PORT", str(port), 9464, "is not a TCP port")
            port = 9464
        return Settings(
            sdk_disabled=sdk_disabled,
            metrics_exporters=metrics_exporters,
            traces_exporters=traces_exporters,
            metrics_otlp=metrics_otlp,
            traces_otlp=traces_otlp,
            metric_export_interval_ms=interval_ms,
            metric_export_timeout_ms=timeout_ms,
            temporality_preference=self._choice(
                "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                TEMPORALITY_PREFERENCES,
                "cumulative",
            ),
            bsp_schedule_delay_ms=self._positive(
                "OTEL_BSP_SCHEDULE_DELAY",
                DEFAULT_BSP_SCHEDULE_DELAY_MS,
                minimum=MIN_BSP_SCHEDULE_DELAY_MS,
                maximum=MAX_INTERVAL_MS,
            ),
            bsp_export_timeout_ms=self._positive(
                "OTEL_BSP_EXPORT_TIMEOUT", DEFAULT_BSP_EXPORT_TIMEOUT_MS, maximum=MAX_INTERVAL_MS
            ),
            service_name=self._raw("OTEL_SERVICE_NAME"),
            resource_attributes=self._resource_attributes(),
            bsp_max_queue_size=self._positive_int(
                "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_BSP_MAX_QUEUE_SIZE
            ),
            bsp_max_export_batch_size=self._positive_int(
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE
            ),
            sampler=sampler,
            sampler_arg=sampler_arg,
            prometheus_host=self._raw("OTEL_EXPORTER_PROMETHEUS_HOST") or "localhost",
            prometheus_port=port,
            output_dir=self._raw(ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR) or DEFAULT_OUTPUT_DIR,
            export_ranks=self._export_ranks(),
            step_duration_buckets_ms=self._buckets(),
            shutdown_on_sigterm=self._bool(ev.OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM, True),
            span_groups=self._span_groups(),
            # NVTX_DISABLE is the nvtx package's switch: any non-empty value disables it.
            nvtx=self._bool(ev.OTEL_PYTHON_TRAINING_NVTX, True)
            and self._raw("NVTX_DISABLE") is None,
            nvtx_domain=self._raw(ev.OTEL_PYTHON_TRAINING_NVTX_DOMAIN) or DEFAULT_NVTX_DOMAIN,
            jsonlog_dir=self._raw(ev.OTEL_PYTHON_TRAINING_JSONLOG_DIR),
            identity=self.identity(),
            tensor_metrics=self.tensor_metrics(),
        )
