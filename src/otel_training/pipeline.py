"""Building one pipeline from settings: the resource, the readers and exporters of each signal,
the span processors, the logger provider, and where they write.

:func:`build` is what ``otel_training.configure()`` runs; it does not touch any global. Every
exporter is wrapped in an :mod:`otel_training.exporters` guard; the embedded default's files are
opened in this run's directory (:mod:`otel_training.files`); OTLP exporters get every setting
explicitly, so that the SDK never re-reads the environment behind ``config.py``'s back.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from opentelemetry import _logs as logs_api
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits, LogRecordProcessor
from opentelemetry.sdk._logs.export import (
    ConsoleLogRecordExporter,
    LogRecordExporter,
)
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import _Gauge as SdkGauge
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import (
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
)
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import sampling as sampling_sdk
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.version import __version__ as _SDK_VERSION
from opentelemetry.semconv.attributes.service_attributes import SERVICE_INSTANCE_ID, SERVICE_NAME

from otel_training import config, device_metrics, files, heartbeat, limits, network, replicated
from otel_training import environment_variables as ev
from otel_training import views as _views
from otel_training._log_once import LogOnce
from otel_training.exporters import (
    DEFAULT_MAX_REQUEST_BYTES,
    PeriodicMetricReader,
    SafeLogRecordExporter,
    SafeMetricExporter,
    SafeSpanExporter,
    safe_prometheus_reader,
)
from otel_training.health.metrics import observe_ledger
from otel_training.ids import ProcessLocalIdGenerator
from otel_training.open_spans import OpenSpans
from otel_training.processors import CheckpointMetricsSpanProcessor, span_mirrors
from otel_training.processors.batch import (
    CountingBatchLogRecordProcessor,
    CountingBatchSpanProcessor,
    observe_drops,
)
from otel_training.processors.exception_logs import ExceptionLogSpanProcessor
from otel_training.processors.jsonlog import JsonLogSpanProcessor
from otel_training.processors.nvtx import NvtxSpanProcessor
from otel_training.resource import identity_attributes
from otel_training.semconv.attributes import DL_RANK, DL_RUN_ID

__all__ = ["INSTRUMENTATION_NAME", "Pipeline", "build", "silence_sdk_header_warnings"]

_logger = logging.getLogger("otel_training")

INSTRUMENTATION_NAME = "otel_training"


@dataclass
class Pipeline:
    """What :func:`build` made: the providers, where they export, and what to close.

    Attributes:
        meter_provider: The SDK ``MeterProvider``, or a no-op one.
        tracer_provider: The SDK ``TracerProvider``, or a no-op one.
        destination: One line saying where telemetry goes (never a secret).
        output_dir: Absolute path of this run's directory of the embedded default, or None.
        nvtx: The NVTX processor when a tool is attached (NVTX-only phases use its domain).
        open_spans: The spans its phases hold open, ended as truncated at shutdown.
        files: Streams opened for the exporters, to close after shutdown.
        logger_provider: The SDK ``LoggerProvider``, or a no-op one when no log exporter
            and no extra log processor is configured.
        span_lines: The processor writing the span JSON lines, or None (the hang watchdog
            writes its ``stacks`` records there too).
    """

    meter_provider: metrics_api.MeterProvider
    tracer_provider: trace_api.TracerProvider
    destination: str
    output_dir: str | None = None
    nvtx: NvtxSpanProcessor | None = None
    open_spans: OpenSpans | None = None
    files: list[TextIO] = field(default_factory=list)
    logger_provider: logs_api.LoggerProvider = field(default_factory=logs_api.NoOpLoggerProvider)
    span_lines: JsonLogSpanProcessor | None = None


def _with_default(base: str) -> list[str]:
    """``base``, then the default output directory if that is another."""
    return [base] if base == config.DEFAULT_OUTPUT_DIR else [base, config.DEFAULT_OUTPUT_DIR]


class _Outputs:
    """The embedded default's files of one pipeline: each in this run's directory
    (:mod:`otel_training.files`), opened without following symlinks, with a fallback, written
    through :class:`otel_training.files.AppendStream` (which survives the directory being
    removed, filled or made read-only mid-run)."""

    def __init__(
        self, settings: config.Settings, identity: Mapping[str, Any] | None = None
    ) -> None:
        self._settings = settings
        self._identity = dict(identity or {})
        self._run_dirs: dict[str, str | OSError] = {}
        self.files: list[TextIO] = []
        self.run_dir: str | None = None

    def _run_dir(self, base: str) -> str:
        found = self._run_dirs.get(base)
        if found is None:
            try:
                found = files.run_directory(base, self._settings.identity.run_id or "run")
            except OSError as error:
                found = error
            self._run_dirs[base] = found
        if isinstance(found, OSError):
            raise found
        return found

    def _setting(self, base: str | None, fallback: bool) -> str:
        """The variable that chose the directory, as a message shows it."""
        output_dir = self._settings.output_dir
        if base is not None:
            return f"{ev.OTEL_PYTHON_TRAINING_JSONLOG_DIR}={base}"
        if fallback:
            return (
                f"the default {config.DEFAULT_OUTPUT_DIR}, as "
                f"{ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR}={output_dir} could not be used"
            )
        if output_dir == config.DEFAULT_OUTPUT_DIR:
            return f"{ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR}, unset: the default {output_dir}"
        return f"{ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR}={output_dir}"

    def open(self, signal_name: str, base: str | None = None) -> tuple[TextIO | None, str | None]:
        """This rank's file of ``signal_name`` (``{signal}-rank{R}.jsonl``) in the run's
        directory inside ``base`` (a directory the user named: no fallback), else inside the
        output directory, falling back to the default one, then to no file; each failure
        logs one warning naming the path tried and the variable that set it. Never raises."""
        bases = [base] if base is not None else _with_default(self._settings.output_dir)
        file_name = f"{signal_name}-rank{self._settings.identity.rank}.jsonl"
        for i, candidate in enumerate(bases):
            path = os.path.join(candidate, file_name)
            setting = self._setting(base, fallback=i > 0)
            try:
                directory = self._run_dir(candidate)
                path = os.path.join(directory, file_name)
                stream = files.AppendStream(
                    path,
                    what="span JSON lines" if signal_name == "spans" else signal_name,
                    setting=setting,
                    identity=self._identity,
                )
            except OSError as error:
                why = "a symlink is there" if error.errno == errno.ELOOP else error
                _logger.warning(
                    "otel-training cannot write %s to %s (%s; the directory is set by %s); %s.",
                    signal_name,
                    path,
                    why,
                    setting,
                    "trying the default directory"
                    if i + 1 < len(bases)
                    else f"{signal_name} are not written to a file",
                )
                continue
            self.files.append(stream)  # type: ignore[arg-type]
            if base is None and self.run_dir is None:
                self.run_dir = directory
            return stream, path  # type: ignore[return-value]
        return None, None


def build(
    settings: config.Settings,
    *,
    service_name: str | None,
    resource_attributes: Mapping[str, object],
    user_views: list[View],
    step_duration_buckets_ms: Sequence[float] | None,
    extra_readers: list[MetricReader],
    extra_processors: list[SpanProcessor],
    extra_log_processors: Sequence[LogRecordProcessor] = (),
) -> Pipeline:
    identity = settings.identity
    policy = settings.export_ranks
    if settings.sdk_disabled or not policy.exports(identity):
        if settings.sdk_disabled:
            why = "disabled by OTEL_SDK_DISABLED"
        elif policy.exports_nowhere(identity.world_size):
            why = f"none from any rank ({policy.setting} selects no rank of {identity.world_size})"
            _say_no_rank_exports(policy, identity.world_size)
        else:
            why = f"none from rank {identity.rank} ({policy.setting}: {policy})"
        return Pipeline(
            metrics_api.NoOpMeterProvider(), trace_api.NoOpTracerProvider(), f"telemetry: {why}"
        )

    resource = _resource(settings, service_name, resource_attributes)
    # Values every data- and tensor-parallel peer holds alike: one rank per stage may send them.
    replication = replicated.decide(
        settings.export_replicated, identity.world_size, resource.attributes
    )
    notes = [replication.note] if replication.note else []
    outputs = _Outputs(
        settings,
        {
            key: resource.attributes[key]
            for key in (DL_RUN_ID, SERVICE_INSTANCE_ID, DL_RANK, "process.creation.time")
            if key in resource.attributes
        },
    )
    warn = _once_per_build()
    readers: list[MetricReader] = list(extra_readers)
    metric_targets: list[str] = []
    for name in settings.metrics_exporters:
        reader, target = _metric_reader(name, settings, outputs, warn)
        if reader is not None:
            readers.append(reader)
            metric_targets.append(target)
    provider_arguments: dict[str, Any] = {
        "metric_readers": readers,
        "resource": resource,
        "views": _views.default_views(
            step_duration_buckets_ms or settings.step_duration_buckets_ms,
            user_views,
            exponential_step_duration=settings.step_duration_histogram == "exponential",
            silent=replication.silent_metrics,
        ),
        "shutdown_on_exit": False,
    }
    # Before the span processors: checkpoint spans record their durations on its meter.
    beat = _heartbeat_provider(settings, resource, warn)
    if beat is None:
        meter_provider = MeterProvider(**provider_arguments)
    else:
        meter_provider = heartbeat.MeterProviderWithHeartbeat(beat, **provider_arguments)
        interval_s = (settings.heartbeat_interval_ms or 0) / 1000
        notes.append(f"hang signals over OTLP every {interval_s:g} s")
    # hw.gpu.* of this process's GPUs where NVML is; read on the reader's thread, never here.
    device_metrics.observe_devices(meter_provider.get_meter(INSTRUMENTATION_NAME), identity)
    # Where this rank's time goes and how far it got (docs/health.md); read there too.
    observe_ledger(meter_provider.get_meter(INSTRUMENTATION_NAME))
    # NVTX ranges and span JSON lines come before the batches.
    mirrors, mirror_targets = span_mirrors(settings, outputs.open)
    checkpoint_metrics = CheckpointMetricsSpanProcessor(
        meter_provider.get_meter(INSTRUMENTATION_NAME)
    )
    processors: list[SpanProcessor] = [*mirrors, checkpoint_metrics, *extra_processors]
    trace_targets: list[str] = []
    for name in settings.traces_exporters:
        exporter, target, local = _span_exporter(name, settings, outputs, warn)
        if exporter is not None:
            processors.append(_batch_processor(exporter, settings, local, target))
            trace_targets.append(target)

    log_processors: list[LogRecordProcessor] = list(extra_log_processors)
    log_targets: list[str] = []
    for name in settings.logs.exporters:
        log_exporter, target = _log_exporter(name, settings, outputs, warn)
        if log_exporter is not None:
            local = name in ("otlp_json_file", "console")
            log_processors.append(_log_batch_processor(log_exporter, settings, local, target))
            log_targets.append(target)

    tracer_provider = TracerProvider(
        resource=resource,
        sampler=_sampler(settings),
        id_generator=ProcessLocalIdGenerator(),
        # Values are cut at export, where the cut can say so (otel_training.limits); the
        # other limits are the SDK's, from the environment.
        span_limits=SpanLimits(
            max_attribute_length=SpanLimits.UNSET, max_span_attribute_length=SpanLimits.UNSET
        ),
        shutdown_on_exit=False,
    )
    logger_provider: logs_api.LoggerProvider = logs_api.NoOpLoggerProvider()
    if log_processors:
        logger_provider = _logger_provider(settings, resource, meter_provider, log_processors)
        # Exceptions recorded on spans also as ERROR log records (docs/logs.md).
        processors.append(
            ExceptionLogSpanProcessor(logger_provider.get_logger(INSTRUMENTATION_NAME))
        )
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    # What a full batch queue drops, counted (docs/logs.md); read on the reader's thread.
    observe_drops(meter_provider.get_meter(INSTRUMENTATION_NAME), log_processors, processors)
    return Pipeline(
        meter_provider,
        tracer_provider,
        "; ".join([_describe(metric_targets, trace_targets + mirror_targets, log_targets), *notes]),
        output_dir=outputs.run_dir,
        nvtx=next((p for p in mirrors if isinstance(p, NvtxSpanProcessor)), None),
        open_spans=OpenSpans(),
        files=outputs.files,
        logger_provider=logger_provider,
        span_lines=next((p for p in mirrors if isinstance(p, JsonLogSpanProcessor)), None),
    )


_said_no_rank = LogOnce(_logger)


def _say_no_rank_exports(policy: config.ExportRanks, world_size: int) -> None:
    """The one warning, on every rank, of a policy under which no rank of the job exports."""
    _said_no_rank(
        (policy.setting, world_size),
        "otel-training: no rank of this job exports telemetry: %s selects no rank of the %d "
        "(ranks 0 to %d); telemetry is off on every rank. Name a rank below %d, or unset it "
        "to export from every rank.",
        policy.setting,
        world_size,
        world_size - 1,
        world_size,
    )


def _once_per_build() -> network.Warn:
    """A warning function that says each text once (the three signals share variables)."""
    return LogOnce(_logger).say


def _unknown_service() -> str:
    executable = os.path.basename(sys.executable or "") or "python"
    return f"unknown_service:{executable}"


def _resource(
    settings: config.Settings, service_name: str | None, extra: Mapping[str, object]
) -> Resource:
    """The resource, built here alone (not by ``Resource.create()``, which would parse
    ``OTEL_RESOURCE_ATTRIBUTES`` from ``os.environ`` a second time).

    Precedence, lowest first: the SDK's attributes, the detected rank identity,
    ``service_name``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``, then the
    attributes passed in code. A ``service.instance.id`` given for a whole job or pod gets
    ``-rank{R}`` appended when the job has several ranks, so ranks stay distinct series.
    Every value follows the string rule of :mod:`otel_training.limits`.
    """
    attributes: dict[str, Any] = {
        TELEMETRY_SDK_LANGUAGE: "python",
        TELEMETRY_SDK_NAME: "opentelemetry",
        TELEMETRY_SDK_VERSION: _SDK_VERSION,
        SERVICE_NAME: _unknown_service(),
    }
    identity = settings.identity
    attributes.update(identity_attributes(identity))
    detected_instance = attributes[SERVICE_INSTANCE_ID]
    if service_name:
        attributes[SERVICE_NAME] = service_name
    attributes.update(settings.resource_attributes)
    if settings.service_name:
        attributes[SERVICE_NAME] = settings.service_name
    attributes.update(extra)
    instance = attributes.get(SERVICE_INSTANCE_ID)
    suffix = f"-rank{identity.rank}"
    if (
        identity.world_size > 1
        and instance != detected_instance
        and not str(instance).endswith(suffix)
    ):
        attributes[SERVICE_INSTANCE_ID] = f"{instance}{suffix}"
    limit = settings.span_limits.value_length
    return Resource(
        {
            limits.safe_text(key, limits.MAX_NAME_LENGTH): limits.bounded_value(value, limit)
            for key, value in attributes.items()
            if value is not None
        }
    )


def _temporality(preference: str) -> dict[type, AggregationTemporality]:
    cumulative = AggregationTemporality.CUMULATIVE
    delta = AggregationTemporality.DELTA
    table = {
        Counter: cumulative,
        UpDownCounter: cumulative,
        Histogram: cumulative,
        ObservableCounter: cumulative,
        ObservableUpDownCounter: cumulative,
        ObservableGauge: cumulative,
        SdkGauge: cumulative,
    }
    if preference == "delta":
        table.update({Counter: delta, Histogram: delta, ObservableCounter: delta})
    elif preference == "lowmemory":
        table.update({Counter: delta, Histogram: delta})
    return table


def _otlp_target(
    otlp: config.OtlpSettings, signal_name: str, proxy: tuple[str, str] | None = None
) -> str:
    protocol = "OTLP/gRPC" if otlp.protocol == "grpc" else "OTLP/HTTP"
    target = f"{protocol} {otlp.shown_endpoint or _default_endpoint(otlp, signal_name)}"
    return target if proxy is None else f"{target} via proxy {proxy[1]} ({proxy[0]})"


def _otlp_exporter(
    exporter_class: type, otlp: config.OtlpSettings, signal_name: str, settings, warn, **extra
) -> tuple[Any, str]:
    """An OTLP exporter of ``signal_name`` with every setting given explicitly (endpoint,
    headers, timeout, compression, and the proxy and TLS of :mod:`otel_training.network`),
    and its destination."""
    kwargs = _otlp_kwargs(otlp, signal_name)
    endpoint = kwargs["endpoint"]
    if otlp.protocol == "grpc":
        grpc = network.grpc_connection(endpoint, otlp, settings.proxies, warn)
        exporter = exporter_class(**kwargs, **grpc.kwargs(), **extra)
        proxy = grpc.proxy
    else:
        http = network.http_connection(endpoint, otlp, settings.proxies, warn)
        exporter = exporter_class(**kwargs, session=http.session, **extra)
        http.pin()
        _pin_http_headers(exporter, otlp)
        proxy = http.proxy
    return exporter, _otlp_target(otlp, signal_name, proxy)


def _otlp_kwargs(otlp: config.OtlpSettings, signal_name: str) -> dict:
    """Constructor arguments shared by the OTLP exporters of both protocols and signals."""
    if otlp.protocol == "grpc":
        from grpc import Compression

        compression = Compression.Gzip if otlp.compression == "gzip" else Compression.NoCompression
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression

        compression = Compression(otlp.compression)
    # Explicit values throughout: given None, the SDK's exporters would read the raw
    # environment again and undo what config.py rejected.
    return {
        "endpoint": otlp.endpoint or _default_endpoint(otlp, signal_name),
        "headers": dict(otlp.headers) or (_NO_HEADERS if otlp.protocol == "grpc" else None),
        "timeout": otlp.timeout_s,
        "compression": compression,
    }


class _NoHeaders(tuple):
    """An empty header sequence that is truthy, so the gRPC exporter does not fall back to
    reading OTEL_EXPORTER_OTLP_HEADERS itself."""

    def __bool__(self) -> bool:
        return True


_NO_HEADERS = _NoHeaders()


def _pin_http_headers(exporter: Any, otlp: config.OtlpSettings) -> None:
    """The OTLP/HTTP exporter always merges ``OTEL_EXPORTER_OTLP_*HEADERS`` from
    ``os.environ`` into its headers; keep only its own protocol headers and ours, so that
    ``configure(environ=...)`` governs them and an entry config.py refused stays refused."""
    client = getattr(exporter, "_client", None)
    headers = getattr(client, "_headers", None)
    if not isinstance(headers, dict):
        return
    kept = {
        key: value
        for key, value in headers.items()
        if key.lower() in ("user-agent", "content-type", "content-encoding")
    }
    kept.update(otlp.headers)
    client._headers = kept


class _SdkHeaderWarningFilter(logging.Filter):
    """Drops the SDK's own warning about a malformed header entry: it shows the entry, which
    may hold a secret, and repeats the warning config.py gave already."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Header format invalid")


_header_filter = _SdkHeaderWarningFilter()


def silence_sdk_header_warnings() -> None:
    """Installs the filter of :class:`_SdkHeaderWarningFilter` once."""
    logger = logging.getLogger("opentelemetry.util.re")
    if _header_filter not in logger.filters:
        logger.addFilter(_header_filter)


def _default_endpoint(otlp: config.OtlpSettings, signal_name: str) -> str:
    if otlp.protocol == "grpc":
        return "http://localhost:4317"
    return f"http://localhost:4318/v1/{signal_name}"


def _otlp_metric_exporter(
    settings: config.Settings, warn: network.Warn
) -> tuple[MetricExporter, str]:
    """The OTLP metric exporter of ``settings`` (gRPC or HTTP), every setting explicit (the
    proxy and TLS of :mod:`otel_training.network` included), and its destination."""
    if settings.metrics_otlp.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return _otlp_exporter(
        OTLPMetricExporter,
        settings.metrics_otlp,
        "metrics",
        settings,
        warn,
        preferred_temporality=_temporality(settings.temporality_preference),
    )


def _heartbeats(settings: config.Settings) -> bool:
    """Whether the hang signals go over OTLP on their own interval (:mod:`heartbeat`)."""
    return settings.heartbeat_interval_ms is not None and "otlp" in settings.metrics_exporters


def _heartbeat_provider(
    settings: config.Settings, resource: Resource, warn: network.Warn
) -> MeterProvider | None:
    """The heartbeat's own ``MeterProvider`` (its own OTLP exporter, the same Resource) with
    the ledger's hang signals, or ``None`` when the heartbeat is off."""
    if not _heartbeats(settings):
        return None
    provider = heartbeat.heartbeat_provider(
        resource,
        SafeMetricExporter(_otlp_metric_exporter(settings, warn)[0], limits=settings.span_limits),
        interval_ms=settings.heartbeat_interval_ms or settings.metric_export_interval_ms,
        timeout_ms=settings.metric_export_timeout_ms,
    )
    observe_ledger(provider.get_meter(INSTRUMENTATION_NAME), names=heartbeat.HEARTBEAT_METRICS)
    return provider


def _metric_reader(
    name: str, settings: config.Settings, outputs: _Outputs, warn: network.Warn
) -> tuple[MetricReader | None, str]:
    temporality = _temporality(settings.temporality_preference)
    exporter: MetricExporter
    interval_ms = settings.metric_export_interval_ms
    max_request_bytes = DEFAULT_MAX_REQUEST_BYTES
    if name == "none":
        return None, "nowhere"
    if name == "prometheus":
        return _prometheus_reader(settings)
    if name == "otlp":
        exporter, target = _otlp_metric_exporter(settings, warn)
    elif name == "console":
        exporter = ConsoleMetricExporter(preferred_temporality=temporality)
        target = "the console"
    else:  # otlp_json_file
        from opentelemetry.exporter.otlp.json.file import FileMetricExporter

        stream, path = outputs.open("metrics")
        if stream is None:
            return None, "nowhere"
        exporter = FileMetricExporter(stream=stream, preferred_temporality=temporality)
        target = f"OTLP-JSON file {path}"
        interval_ms = settings.file_metric_export_interval_ms
        max_request_bytes = files.LINE_BUDGET_BYTES  # one line per request: under 1 MiB
    safe: MetricExporter = SafeMetricExporter(
        exporter, limits=settings.span_limits, max_request_bytes=max_request_bytes
    )
    if name == "otlp" and _heartbeats(settings):
        # The heartbeat's provider is the one writer of the hang signals over OTLP.
        safe = heartbeat.WithoutMetricsExporter(safe, heartbeat.HEARTBEAT_METRICS)
    reader = PeriodicMetricReader(
        safe,
        export_interval_millis=interval_ms,
        export_timeout_millis=min(settings.metric_export_timeout_ms, interval_ms),
    )
    return reader, target


def _prometheus_reader(settings: config.Settings) -> tuple[MetricReader | None, str]:
    try:
        import opentelemetry.exporter.prometheus  # noqa: F401 - the reader's dependency
        from prometheus_client import start_http_server
    except ImportError:
        _logger.warning(
            "OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus: "
            "pip install 'otel-training[prometheus]'. Metrics are not exported there."
        )
        return None, "nowhere"
    host = settings.prometheus_host
    port = settings.prometheus_port_of_rank()
    try:
        start_http_server(port=port, addr=host)
    except OSError as error:
        _logger.warning(
            "otel-training cannot serve Prometheus metrics on %s:%d (OTEL_EXPORTER_PROMETHEUS_PORT"
            "=%d + LOCAL_RANK=%d): %s. Metrics of this rank are not exported there.",
            host,
            port,
            settings.prometheus_port,
            settings.identity.local_rank,
            error,
        )
        return None, "nowhere"
    reader = safe_prometheus_reader(settings.span_limits)
    return reader, f"Prometheus http://{host}:{port}/metrics"


def _span_exporter(
    name: str, settings: config.Settings, outputs: _Outputs, warn: network.Warn
) -> tuple[SpanExporter | None, str, bool]:
    """(exporter wrapped in SafeSpanExporter or None, target, whether it is a local file)."""
    otlp = settings.traces_otlp
    if name == "none":
        return None, "nowhere", False
    if name == "otlp":
        if otlp.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter, target = _otlp_exporter(OTLPSpanExporter, otlp, "traces", settings, warn)
        safe = SafeSpanExporter(exporter, limits=settings.span_limits, timeout_s=otlp.timeout_s)
        return safe, target, False
    if name == "console":
        console = SafeSpanExporter(ConsoleSpanExporter(), limits=settings.span_limits)
        return console, "the console", True
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter

    stream, path = outputs.open("traces")
    if stream is None:
        return None, "nowhere", True
    safe = SafeSpanExporter(
        _counted(FileSpanExporter(stream=stream), stream),
        limits=settings.span_limits,
        max_request_bytes=files.LINE_BUDGET_BYTES,  # one line per request: under 1 MiB
    )
    return safe, f"OTLP-JSON file {path}", True


class _Counted:
    """A file exporter (one line per export) whose stream, an
    :class:`otel_training.files.AppendStream`, is told how many records each export holds, so
    that a line that cannot be written is counted in spans or log records too."""

    def __init__(self, exporter: Any, stream: Any) -> None:
        self._exporter = exporter
        self._records = stream.records

    def export(self, batch: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        self._records(len(batch))
        return self._exporter.export(batch, *args, **kwargs)

    def force_flush(self, *args: Any, **kwargs: Any) -> bool:
        return self._exporter.force_flush(*args, **kwargs)

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self._exporter.shutdown(*args, **kwargs)


def _counted(exporter: Any, stream: Any) -> Any:
    """``exporter`` wrapped in :class:`_Counted` when ``stream`` can count records."""
    return _Counted(exporter, stream) if hasattr(stream, "records") else exporter


def _batch_processor(
    exporter: SpanExporter, settings: config.Settings, local: bool, target: str
) -> CountingBatchSpanProcessor:
    """A ``BatchSpanProcessor`` with ``OTEL_BSP_*`` where given, else the SDK's defaults over
    OTLP and, for a local file, a queue that takes bursts and a delay of one second; the
    spans its full queue drops are counted and reported (processors/batch.py)."""
    queue = settings.bsp_max_queue_size or (
        config.DEFAULT_FILE_BSP_MAX_QUEUE_SIZE if local else config.DEFAULT_BSP_MAX_QUEUE_SIZE
    )
    batch = settings.bsp_max_export_batch_size or (
        config.DEFAULT_FILE_BSP_MAX_EXPORT_BATCH_SIZE
        if local
        else config.DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE
    )
    delay = settings.bsp_schedule_delay_ms or (
        config.DEFAULT_FILE_BSP_SCHEDULE_DELAY_MS if local else config.DEFAULT_BSP_SCHEDULE_DELAY_MS
    )
    return CountingBatchSpanProcessor(
        exporter,
        where=target,
        max_queue_size=queue,
        schedule_delay_millis=delay,
        max_export_batch_size=min(batch, queue),
        export_timeout_millis=settings.bsp_export_timeout_ms,
    )


def _log_exporter(
    name: str, settings: config.Settings, outputs: _Outputs, warn: network.Warn
) -> tuple[LogRecordExporter | None, str]:
    """(exporter of ``OTEL_LOGS_EXPORTER`` entry ``name`` wrapped in SafeLogRecordExporter, or
    None; target)."""
    otlp = settings.logs.otlp
    limits = settings.log_limits
    if name == "none":
        return None, "nowhere"
    if name == "otlp":
        if otlp.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        else:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        exporter, target = _otlp_exporter(OTLPLogExporter, otlp, "logs", settings, warn)
        safe = SafeLogRecordExporter(exporter, limits=limits, timeout_s=otlp.timeout_s)
        return safe, target
    if name == "console":
        return SafeLogRecordExporter(ConsoleLogRecordExporter(), limits=limits), "the console"
    from opentelemetry.exporter.otlp.json.file._log_exporter import FileLogExporter

    stream, path = outputs.open("logs")
    if stream is None:
        return None, "nowhere"
    safe = SafeLogRecordExporter(
        _counted(FileLogExporter(stream=stream), stream),
        limits=limits,
        max_request_bytes=files.LINE_BUDGET_BYTES,  # one line per request: under 1 MiB
    )
    return safe, f"OTLP-JSON file {path}"


def _log_batch_processor(
    exporter: LogRecordExporter, settings: config.Settings, local: bool, target: str
) -> CountingBatchLogRecordProcessor:
    """A ``BatchLogRecordProcessor`` with ``OTEL_BLRP_*`` where given, else the SDK's
    defaults over OTLP and, for a local file, a queue that takes bursts; the records its
    full queue drops are counted and reported (processors/batch.py)."""
    logs = settings.logs
    queue = logs.max_queue_size or (
        config.DEFAULT_FILE_BLRP_MAX_QUEUE_SIZE if local else config.DEFAULT_BLRP_MAX_QUEUE_SIZE
    )
    batch = logs.max_export_batch_size or (
        config.DEFAULT_FILE_BLRP_MAX_EXPORT_BATCH_SIZE
        if local
        else config.DEFAULT_BLRP_MAX_EXPORT_BATCH_SIZE
    )
    return CountingBatchLogRecordProcessor(
        exporter,
        where=target,
        schedule_delay_millis=logs.schedule_delay_ms,
        max_export_batch_size=min(batch, queue),
        export_timeout_millis=logs.export_timeout_ms,
        max_queue_size=queue,
    )


def _logger_provider(
    settings: config.Settings,
    resource: Resource,
    meter_provider: metrics_api.MeterProvider,
    processors: Sequence[LogRecordProcessor],
) -> LoggerProvider:
    """The pipeline's ``LoggerProvider``: the same resource as the other signals, the
    attribute count of ``OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT``, no value-length cut of its
    own (values are cut at export, where the cut can say so: otel_training.limits), every
    limit given explicitly so that the SDK does not read the environment (it raises on a bad
    value there)."""
    count = settings.logs.attribute_count
    provider = LoggerProvider(
        resource=resource,
        shutdown_on_exit=False,
        meter_provider=meter_provider,
        log_record_limits=LogRecordLimits(
            max_attributes=count,
            max_attribute_length=LogRecordLimits.UNSET,
            max_log_record_attributes=count,
            max_log_record_attribute_length=LogRecordLimits.UNSET,
        ),
    )
    for processor in processors:
        provider.add_log_record_processor(processor)
    return provider


def _sampler(settings: config.Settings) -> sampling_sdk.Sampler:
    ratio = sampling_sdk.TraceIdRatioBased(settings.sampler_arg)
    return {
        "always_on": sampling_sdk.ALWAYS_ON,
        "always_off": sampling_sdk.ALWAYS_OFF,
        "traceidratio": ratio,
        "parentbased_always_on": sampling_sdk.ParentBased(sampling_sdk.ALWAYS_ON),
        "parentbased_always_off": sampling_sdk.ParentBased(sampling_sdk.ALWAYS_OFF),
        "parentbased_traceidratio": sampling_sdk.ParentBased(ratio),
    }[settings.sampler]


def _describe(
    metric_targets: list[str], trace_targets: list[str], log_targets: Sequence[str] = ()
) -> str:
    metrics_part = ", ".join(metric_targets) or "nowhere"
    traces_part = ", ".join(trace_targets) or "nowhere"
    logs_part = ", ".join(log_targets) or "nowhere"
    return f"telemetry: metrics to {metrics_part}; traces to {traces_part}; logs to {logs_part}"
