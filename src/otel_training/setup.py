"""``configure()``: MeterProvider and TracerProvider from the standard ``OTEL_*`` variables.

Exporters per signal (``OTEL_METRICS_EXPORTER``, ``OTEL_TRACES_EXPORTER``): ``otlp`` (gRPC or
http/protobuf per ``OTEL_EXPORTER_OTLP_PROTOCOL``), ``console``, ``none``, ``prometheus``
(metrics only, a pull endpoint on ``OTEL_EXPORTER_PROMETHEUS_HOST:PORT``) and the embedded
default ``otlp_json_file``: OTLP-JSON lines, one file per rank and signal, in
``OTEL_PYTHON_TRAINING_OUTPUT_DIR``. With no exporter named and no endpoint set, the embedded
default is used; one log line at configure says where telemetry goes.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
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
    MetricExportResult,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import sampling as sampling_sdk
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

from otel_training import config, device_metrics, instruments
from otel_training import views as _views
from otel_training.processors import span_mirrors
from otel_training.resource import identity_attributes

_logger = logging.getLogger("otel_training")

INSTRUMENTATION_NAME = "otel_training"

_lock = threading.RLock()
_current: Telemetry | None = None
_global_owner: Telemetry | None = None
# Every configured pipeline not yet shut down, kept alive so that exit and SIGTERM reach all.
_live: list[Telemetry] = []
_exit_handlers_installed = False


@dataclass
class Telemetry:
    """A configured telemetry pipeline: providers, a meter, a tracer, and where they export.

    Attributes:
        meter_provider: The SDK ``MeterProvider`` (or a no-op one when disabled).
        tracer_provider: The SDK ``TracerProvider`` (or a no-op one when disabled).
        meter: ``meter_provider.get_meter("otel_training")``.
        tracer: ``tracer_provider.get_tracer("otel_training")``.
        destination: One human-readable line saying where telemetry goes.
        settings: The parsed environment.
    """

    meter_provider: metrics_api.MeterProvider
    tracer_provider: trace_api.TracerProvider
    meter: metrics_api.Meter
    tracer: trace_api.Tracer
    destination: str
    settings: config.Settings
    _shutdown_done: bool = field(default=False, repr=False)

    def force_flush(self, timeout_millis: float | None = None) -> bool:
        """Records deferred values, then exports what the providers hold. Bounded by
        ``timeout_millis`` (default: the export timeout). Runs on the calling thread; never
        raises; returns False when something did not finish in time."""
        return self._bounded("force_flush", timeout_millis, self._flush)

    def shutdown(self, timeout_millis: float | None = None) -> bool:
        """Flushes and stops exporting, in order: deferred values, metric readers, span
        processors. Bounded by ``timeout_millis`` (default: the export timeout) even when the
        endpoint is dead: what has not finished by then is abandoned on daemon threads.
        Idempotent; never raises; returns False on timeout."""
        with _lock:
            if self._shutdown_done:
                return True
            self._shutdown_done = True
            if self in _live:
                _live.remove(self)
        return self._bounded("shutdown", timeout_millis, self._shutdown)

    def _flush(self, timeout_s: float) -> None:
        _run_flush_hooks(timeout_s)
        _call(self.meter_provider, "force_flush", timeout_millis=timeout_s * 1000)
        _call(self.tracer_provider, "force_flush", timeout_millis=int(timeout_s * 1000))

    def _shutdown(self, timeout_s: float) -> None:
        _run_flush_hooks(timeout_s)
        # Side by side, so that two dead endpoints cost one timeout, not two.
        tracer_thread = threading.Thread(
            target=_call, args=(self.tracer_provider, "shutdown"), daemon=True
        )
        tracer_thread.start()
        _call(self.meter_provider, "shutdown", timeout_millis=timeout_s * 1000)
        tracer_thread.join(timeout_s)

    def _bounded(self, what: str, timeout_millis: float | None, work) -> bool:
        timeout_s = (
            self.settings.shutdown_timeout_s if timeout_millis is None else timeout_millis / 1000
        )
        if isinstance(self.meter_provider, metrics_api.NoOpMeterProvider):
            return True
        worker = threading.Thread(
            target=work, args=(timeout_s,), name=f"otel-training-{what}", daemon=True
        )
        worker.start()
        worker.join(timeout_s + 0.5)
        if worker.is_alive():
            _logger.warning(
                "otel-training %s did not finish within %.1f s; continuing without it.",
                what,
                timeout_s,
            )
            return False
        return True


_flush_hooks: list[Callable[[float], object]] = [instruments.flush_deferred]


def add_flush_hook(hook: Callable[[float], object]) -> Callable[[], None]:
    """Runs ``hook(timeout_s)`` before every flush and shutdown, ahead of the providers.

    For producers that hold values not yet handed to the SDK (deferred tensor reads, the tensor
    executor's in-flight device results): they publish them here so the final collection sees
    them. Hooks run in registration order on the flushing thread and should return within
    ``timeout_s``; an exception is logged, never raised. Returns a function that removes it.
    """
    _flush_hooks.append(hook)

    def remove() -> None:
        if hook in _flush_hooks:
            _flush_hooks.remove(hook)

    return remove


def _run_flush_hooks(timeout_s: float) -> None:
    for hook in list(_flush_hooks):
        try:
            hook(timeout_s)
        except Exception:
            _logger.warning("otel-training: a flush hook failed", exc_info=True)


def _call(provider, method: str, **kwargs) -> None:
    try:
        getattr(provider, method)(**kwargs)
    except Exception:
        _logger.warning("otel-training: %s failed", method, exc_info=True)


def configure(
    *,
    service_name: str | None = None,
    resource_attributes: Mapping[str, object] | None = None,
    views: Iterable[View] = (),
    step_duration_buckets_ms: Sequence[float] | None = None,
    metric_readers: Iterable[MetricReader] = (),
    span_processors: Iterable[SpanProcessor] = (),
    span_groups: Iterable[str] | None = None,
    set_global: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Telemetry:
    """Builds the MeterProvider and TracerProvider from the ``OTEL_*`` environment.

    Args:
        service_name: ``service.name`` when neither ``OTEL_SERVICE_NAME`` nor
            ``OTEL_RESOURCE_ATTRIBUTES`` sets it.
        resource_attributes: Extra resource attributes; they override detected ones.
        views: Views added before the defaults; one that selects
            ``megatron.training.step_duration_ms`` replaces the default buckets.
        step_duration_buckets_ms: Step-duration boundaries in milliseconds, overriding
            ``OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS`` and the built-in buckets.
        metric_readers: Extra readers (for example an ``InMemoryMetricReader`` in tests).
        span_processors: Extra span processors.
        span_groups: Span groups and presets that record phase spans (``per_step``,
            ``["default", "optimizer"]``...), overriding ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``.
        set_global: Install the providers as the OpenTelemetry globals.
        environ: Variables to read instead of ``os.environ``.

    Returns:
        The :class:`Telemetry` handle; also what :func:`get_meter` uses from now on.

    Raises:
        ValueError: when ``step_duration_buckets_ms`` is not strictly increasing, or
        ``span_groups`` names an unknown group. Bad environment values never raise: one
        warning each, then the default.
    """
    global _current
    settings = config.load(environ)
    if span_groups is not None:
        settings = replace(settings, span_groups=config.span_groups_from_names(span_groups))
    with _lock:
        telemetry = _build(
            settings,
            service_name=service_name,
            resource_attributes=resource_attributes or {},
            user_views=list(views),
            step_duration_buckets_ms=step_duration_buckets_ms,
            extra_readers=list(metric_readers),
            extra_processors=list(span_processors),
        )
        if set_global:
            global _global_owner
            if _global_owner is not None:
                _logger.warning(
                    "otel-training: configure() was called again; the OpenTelemetry globals "
                    "keep the first configuration (the API allows one global provider), while "
                    "otel_training.get_meter() and the returned handle use the new one. Both "
                    "are shut down at exit."
                )
            else:
                metrics_api.set_meter_provider(telemetry.meter_provider)
                trace_api.set_tracer_provider(telemetry.tracer_provider)
                _global_owner = telemetry
        _current = telemetry
        instruments.record_in_this_process()
        if not isinstance(telemetry.meter_provider, metrics_api.NoOpMeterProvider):
            _live.append(telemetry)
            _install_exit_handlers(telemetry.settings)
    _announce(telemetry.destination)
    return telemetry


def get_meter(name: str = INSTRUMENTATION_NAME, version: str | None = None) -> metrics_api.Meter:
    """A meter of the configured provider; configures from the environment on first use.
    Thread-safe; never raises on bad environment values."""
    return _telemetry().meter_provider.get_meter(name, version)


def get_tracer(name: str = INSTRUMENTATION_NAME, version: str | None = None) -> trace_api.Tracer:
    """A tracer of the configured provider; configures from the environment on first use."""
    return _telemetry().tracer_provider.get_tracer(name, version)


def shutdown(timeout_millis: float | None = None) -> bool:
    """Shuts the configured pipeline down (see :meth:`Telemetry.shutdown`); True when nothing
    was configured."""
    with _lock:
        telemetry = _current
    return True if telemetry is None else telemetry.shutdown(timeout_millis)


def force_flush(timeout_millis: float | None = None) -> bool:
    """Flushes the configured pipeline (see :meth:`Telemetry.force_flush`)."""
    with _lock:
        telemetry = _current
    return True if telemetry is None else telemetry.force_flush(timeout_millis)


def current() -> Telemetry | None:
    """The handle of the last :func:`configure`, or ``None``."""
    return _current


def _telemetry() -> Telemetry:
    with _lock:
        if _current is None:
            configure()
        assert _current is not None
        return _current


# -- building ----------------------------------------------------------------------------


def _build(
    settings: config.Settings,
    *,
    service_name: str | None,
    resource_attributes: Mapping[str, object],
    user_views: list[View],
    step_duration_buckets_ms: Sequence[float] | None,
    extra_readers: list[MetricReader],
    extra_processors: list[SpanProcessor],
) -> Telemetry:
    identity = settings.identity
    if settings.sdk_disabled or not settings.export_ranks.exports(identity):
        why = (
            "disabled by OTEL_SDK_DISABLED"
            if settings.sdk_disabled
            else f"none from rank {identity.rank} "
            f"(OTEL_PYTHON_TRAINING_EXPORT_RANKS={settings.export_ranks})"
        )
        meter_provider = metrics_api.NoOpMeterProvider()
        tracer_provider = trace_api.NoOpTracerProvider()
        return Telemetry(
            meter_provider,
            tracer_provider,
            meter_provider.get_meter(INSTRUMENTATION_NAME),
            tracer_provider.get_tracer(INSTRUMENTATION_NAME),
            f"telemetry: {why}",
            settings,
        )

    resource = _resource(settings, service_name, resource_attributes)
    readers: list[MetricReader] = list(extra_readers)
    metric_targets: list[str] = []
    for name in settings.metrics_exporters:
        reader, target = _metric_reader(name, settings)
        if reader is not None:
            readers.append(reader)
            metric_targets.append(target)
    # NVTX ranges and span JSON lines come before the batch processors.
    mirrors, mirror_targets = span_mirrors(settings)
    processors: list[SpanProcessor] = [*mirrors, *extra_processors]
    trace_targets: list[str] = []
    for name in settings.traces_exporters:
        exporter, target = _span_exporter(name, settings)
        if exporter is not None:
            processors.append(
                BatchSpanProcessor(
                    _ParentProcessSpanExporter(exporter),
                    max_queue_size=settings.bsp_max_queue_size,
                    schedule_delay_millis=settings.bsp_schedule_delay_ms,
                    max_export_batch_size=min(
                        settings.bsp_max_export_batch_size, settings.bsp_max_queue_size
                    ),
                    export_timeout_millis=settings.bsp_export_timeout_ms,
                )
            )
            trace_targets.append(target)

    meter_provider = MeterProvider(
        metric_readers=readers,
        resource=resource,
        views=_views.default_views(
            step_duration_buckets_ms or settings.step_duration_buckets_ms, user_views
        ),
        shutdown_on_exit=False,
    )
    # hw.gpu.* of this process's GPUs where NVML is; read on the reader's thread, never here.
    device_metrics.observe_devices(meter_provider.get_meter(INSTRUMENTATION_NAME), identity)
    tracer_provider = TracerProvider(
        resource=resource,
        sampler=_sampler(settings),
        id_generator=_ProcessLocalIdGenerator(),
        shutdown_on_exit=False,
    )
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    destination = _describe(metric_targets, trace_targets + mirror_targets)
    return Telemetry(
        meter_provider,
        tracer_provider,
        meter_provider.get_meter(INSTRUMENTATION_NAME),
        tracer_provider.get_tracer(INSTRUMENTATION_NAME),
        destination,
        settings,
    )


def _resource(
    settings: config.Settings, service_name: str | None, extra: Mapping[str, object]
) -> Resource:
    # Precedence, lowest first: the SDK's defaults, the detected rank identity,
    # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, then attributes passed in code.
    # Both environment variables come from `settings`, so configure(environ=...) governs them.
    resource = Resource.create().merge(Resource(identity_attributes(settings.identity)))
    if service_name:
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    from_env = dict(settings.resource_attributes)
    if settings.service_name:
        from_env[SERVICE_NAME] = settings.service_name
    resource = resource.merge(Resource(from_env))
    if extra:
        resource = resource.merge(Resource(dict(extra)))
    return resource


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


def _open_output(settings: config.Settings, signal_name: str, factory):
    """``factory(path)`` for this rank's file of ``signal_name`` in the output directory.

    An unusable directory logs one warning and falls back to the default directory, then to
    no file export at all: telemetry never stops training. Returns (exporter or None, path).
    """
    file_name = f"{signal_name}-rank{settings.identity.rank}.jsonl"
    directories = [settings.output_dir]
    if settings.output_dir != config.DEFAULT_OUTPUT_DIR:
        directories.append(config.DEFAULT_OUTPUT_DIR)
    for directory in directories:
        path = os.path.join(directory, file_name)
        try:
            os.makedirs(directory, exist_ok=True)
            return factory(path), path
        except OSError as error:
            fallback = (
                "trying the default directory"
                if directory != directories[-1]
                else f"{signal_name} are not written to a file"
            )
            _logger.warning(
                "otel-training cannot write %s (%s: %s); %s.",
                path,
                type(error).__name__,
                error,
                fallback,
            )
    return None, None


def _otlp_target(otlp: config.OtlpSettings, signal_name: str) -> str:
    protocol = "OTLP/gRPC" if otlp.protocol == "grpc" else "OTLP/HTTP"
    return f"{protocol} {otlp.endpoint or _default_endpoint(otlp, signal_name)}"


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
    reading OTEL_EXPORTER_OTLP_HEADERS itself (the HTTP exporter always merges it)."""

    def __bool__(self) -> bool:
        return True


_NO_HEADERS = _NoHeaders()


def _default_endpoint(otlp: config.OtlpSettings, signal_name: str) -> str:
    if otlp.protocol == "grpc":
        return "http://localhost:4317"
    return f"http://localhost:4318/v1/{signal_name}"


def _metric_reader(name: str, settings: config.Settings) -> tuple[MetricReader | None, str]:
    temporality = _temporality(settings.temporality_preference)
    otlp = settings.metrics_otlp
    exporter: MetricExporter
    if name == "none":
        return None, "nowhere"
    if name == "prometheus":
        return _prometheus_reader(settings)
    if name == "otlp":
        if otlp.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        exporter = OTLPMetricExporter(
            preferred_temporality=temporality, **_otlp_kwargs(otlp, "metrics")
        )
        target = _otlp_target(otlp, "metrics")
    elif name == "console":
        exporter = ConsoleMetricExporter(preferred_temporality=temporality)
        target = "the console"
    else:  # otlp_json_file
        from opentelemetry.exporter.otlp.json.file import FileMetricExporter

        exporter, path = _open_output(
            settings,
            "metrics",
            lambda p: FileMetricExporter(p, preferred_temporality=temporality),
        )
        if exporter is None:
            return None, "nowhere"
        target = f"OTLP-JSON file {path}"
    reader = PeriodicExportingMetricReader(
        _ParentProcessMetricExporter(exporter),
        export_interval_millis=settings.metric_export_interval_ms,
        export_timeout_millis=settings.metric_export_timeout_ms,
    )
    return reader, target


def _prometheus_reader(settings: config.Settings) -> tuple[MetricReader | None, str]:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        _logger.warning(
            "OTEL_METRICS_EXPORTER=prometheus needs opentelemetry-exporter-prometheus: "
            "pip install 'otel-training[prometheus]'. Metrics are not exported there."
        )
        return None, "nowhere"
    try:
        start_http_server(port=settings.prometheus_port, addr=settings.prometheus_host)
    except OSError as error:
        _logger.warning(
            "cannot serve Prometheus metrics on %s:%d: %s",
            settings.prometheus_host,
            settings.prometheus_port,
            error,
        )
        return None, "nowhere"
    target = f"Prometheus http://{settings.prometheus_host}:{settings.prometheus_port}/metrics"
    return PrometheusMetricReader(), target


def _span_exporter(name: str, settings: config.Settings) -> tuple[SpanExporter | None, str]:
    otlp = settings.traces_otlp
    if name == "none":
        return None, "nowhere"
    if name == "otlp":
        if otlp.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter: SpanExporter = OTLPSpanExporter(**_otlp_kwargs(otlp, "traces"))
        return exporter, _otlp_target(otlp, "traces")
    if name == "console":
        return ConsoleSpanExporter(), "the console"
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter

    exporter, path = _open_output(settings, "traces", FileSpanExporter)
    return exporter, (f"OTLP-JSON file {path}" if exporter is not None else "nowhere")


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


def _describe(metric_targets: list[str], trace_targets: list[str]) -> str:
    metrics_part = ", ".join(metric_targets) or "nowhere"
    traces_part = ", ".join(trace_targets) or "nowhere"
    return f"telemetry: metrics to {metrics_part}; traces to {traces_part}"


def _announce(destination: str) -> None:
    """The one log line at configure; written to stderr when logging is not set up."""
    if _logger.hasHandlers():
        _logger.info("otel-training %s", destination)
    else:
        print(f"otel-training {destination}", file=sys.stderr)


# -- process life: exit, SIGTERM, fork ---------------------------------------------------


def _shutdown_all() -> None:
    """Shuts down every live pipeline, the newest first (the atexit and SIGTERM path)."""
    with _lock:
        live = list(reversed(_live))
    for telemetry in live:
        telemetry.shutdown()


def _install_exit_handlers(settings: config.Settings) -> None:
    """Once per process: shutdown at interpreter exit and, unless the program has its own
    SIGTERM handler (or the variable says no), a flush before SIGTERM terminates."""
    global _exit_handlers_installed
    if _exit_handlers_installed:
        return
    _exit_handlers_installed = True
    atexit.register(_shutdown_all)
    if not settings.shutdown_on_sigterm:
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum, frame) -> None:
        _shutdown_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


class _ParentProcessMetricExporter(MetricExporter):
    """Delegates to ``exporter`` in the process that built it and drops exports in forked
    children: the SDK restarts reader threads after fork, and a DataLoader worker would
    otherwise re-export the parent's values (and use a gRPC channel that is not fork-safe)."""

    def __init__(self, exporter: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._pid = os.getpid()

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        return self._exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() != self._pid or self._exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        if os.getpid() == self._pid:
            self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


class _ParentProcessSpanExporter(SpanExporter):
    """The span counterpart of :class:`_ParentProcessMetricExporter`."""

    def __init__(self, exporter: SpanExporter) -> None:
        self._exporter = exporter
        self._pid = os.getpid()

    def export(self, spans) -> SpanExportResult:
        if os.getpid() != self._pid:
            return SpanExportResult.SUCCESS
        return self._exporter.export(spans)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return os.getpid() != self._pid or self._exporter.force_flush(timeout_millis)

    def shutdown(self) -> None:
        if os.getpid() == self._pid:
            self._exporter.shutdown()


class _ProcessLocalIdGenerator(IdGenerator):
    """Trace and span ids from a private ``random.Random`` seeded from ``os.urandom``.

    The SDK's default generator draws from the global ``random`` module, which training
    scripts seed identically on every rank, so ranks would share span ids. Reseeded in a
    forked child so that parent and child never collide.
    """

    def __init__(self) -> None:
        self._random = random.Random(os.urandom(16))
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)

            def reseed() -> None:
                live = ref()
                if live is not None:
                    live._random.seed(os.urandom(16))

            os.register_at_fork(after_in_child=reseed)

    def generate_span_id(self) -> int:
        span_id = self._random.getrandbits(64)
        while span_id == trace_api.INVALID_SPAN_ID:
            span_id = self._random.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self._random.getrandbits(128)
        while trace_id == trace_api.INVALID_TRACE_ID:
            trace_id = self._random.getrandbits(128)
        return trace_id
