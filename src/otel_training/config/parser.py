"""The one parser of the variables: :func:`load` reads the environment into :class:`Settings`
with the package's policy (a bad value: one warning naming the variable, then the default);
:func:`load_identity` and :func:`load_omp_num_threads` read one part of it alone, and
:func:`cuda_visible_devices` the devices the CUDA runtime sees.

:class:`_Parser` reads every variable of :class:`Settings`: the exporter and OTLP variables
through :class:`~otel_training.config.otlp.OtlpReader`, the rank identity through
:func:`~otel_training.config.identity.read_identity`, the tensor-metric schedule through
:func:`~otel_training.config.tensor_schedule.read_tensor_metrics`, the rest itself.
"""

from __future__ import annotations

import math
import os
import re
import urllib.parse
from collections.abc import Mapping

from otel_training.config import variables as ev
from otel_training.config._env import EnvReader, show
from otel_training.config.defaults import (
    DEFAULT_BLRP_EXPORT_TIMEOUT_MS,
    DEFAULT_BLRP_MAX_EXPORT_BATCH_SIZE,
    DEFAULT_BLRP_MAX_QUEUE_SIZE,
    DEFAULT_BLRP_SCHEDULE_DELAY_MS,
    DEFAULT_BSP_EXPORT_TIMEOUT_MS,
    DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE,
    DEFAULT_BSP_MAX_QUEUE_SIZE,
    DEFAULT_BSP_SCHEDULE_DELAY_MS,
    DEFAULT_FILE_METRIC_EXPORT_INTERVAL_MS,
    DEFAULT_LOG_ATTRIBUTE_COUNT,
    DEFAULT_METRIC_EXPORT_INTERVAL_MS,
    DEFAULT_METRIC_EXPORT_TIMEOUT_MS,
    DEFAULT_NVTX_DOMAIN,
    DEFAULT_OUTPUT_DIR,
    DEFAULT_PROMETHEUS_PORT,
    DEFAULT_TRACE_SEGMENT_ITERATIONS,
    DEFAULT_TRACE_SPAN_BUDGET,
    EXPORT_REPLICATED_POLICIES,
    EXPORT_STRATEGIES,
    MAX_HANG_S,
    MAX_INTERVAL_MS,
    MAX_RANK,
    MAX_VALUE_LENGTH_LIMIT,
    METRICS_ONLY_EXPORTER_NAMES,
    MIN_BSP_SCHEDULE_DELAY_MS,
    MIN_EXPORT_INTERVAL_MS,
    SAMPLERS,
    STEP_DURATION_HISTOGRAMS,
    TEMPORALITY_PREFERENCES,
)
from otel_training.config.identity import RankIdentity, read_identity
from otel_training.config.otlp import OtlpReader
from otel_training.config.settings import ExportRanks, LogsSettings, Settings
from otel_training.config.span_groups import (
    RENAMED_SPAN_GROUPS,
    SPAN_GROUP_PRESETS,
    SPAN_GROUPS,
    resolve_span_groups,
)
from otel_training.config.tensor_schedule import read_tensor_metrics
from otel_training.export.limits import DEFAULT_VALUE_LENGTH, Limits
from otel_training.health import hang as _hang
from otel_training.health import straggler as _straggler
from otel_training.semconv.spans import NVTX_ONLY_CANDIDATE_GROUPS


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """Parses the environment into :class:`Settings`.

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.

    Returns:
        The settings. Never raises: each unusable value logs one warning naming the variable
        and falls back to its default.
    """
    return _Parser(os.environ if environ is None else environ).settings()


def environ_with(overrides: Mapping[str, str]) -> dict[str, str]:
    """A copy of the process's environment with ``overrides`` set over it (the environment
    itself is left as it is): what a caller that knows better than the environment, such as a
    framework that set up its ranks, hands to ``configure(environ=...)``. Never raises."""
    return {**os.environ, **overrides}


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


def cuda_visible_devices() -> tuple[str, ...] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-`` UUIDs or MIG names), from the
    process's real environment, which the CUDA runtime reads; ``None`` when unset (every device
    is visible). Never raises."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


_RANK_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class _Parser(OtlpReader):
    """Every variable of :class:`Settings`, read with the policy of :class:`EnvReader`."""

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
        groups, unknown, renamed, usable = resolve_span_groups(raw.split(","))
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
            tensor_metrics=read_tensor_metrics(self),
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
