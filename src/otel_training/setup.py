"""``configure()``: MeterProvider and TracerProvider from the standard ``OTEL_*`` variables.

Exporters per signal (``OTEL_METRICS_EXPORTER``, ``OTEL_TRACES_EXPORTER``): ``otlp`` (gRPC or
http/protobuf per ``OTEL_EXPORTER_OTLP_PROTOCOL``), ``console``, ``none``, ``prometheus``
(metrics only, a pull endpoint on ``OTEL_EXPORTER_PROMETHEUS_HOST`` and port
``OTEL_EXPORTER_PROMETHEUS_PORT`` + ``LOCAL_RANK``) and the embedded default ``otlp_json_file``:
OTLP-JSON lines, one file per rank and signal, in one directory per run inside
``OTEL_PYTHON_TRAINING_OUTPUT_DIR`` (:mod:`otel_training.files`). With no exporter named and no
endpoint set, the embedded default is used; one log line at configure says where telemetry goes.

One pipeline at a time: a second ``configure()`` flushes and stops the pipeline it replaces,
and everything obtained before (the OpenTelemetry globals, ``get_meter()``, ``get_tracer()``)
records into the new one (:mod:`otel_training.proxy`).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

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
    MetricReader,
    PeriodicExportingMetricReader,
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
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.version import __version__ as _SDK_VERSION
from opentelemetry.semconv.attributes.service_attributes import SERVICE_INSTANCE_ID, SERVICE_NAME

from otel_training import config, files, instruments, lifecycle, limits, proxy
from otel_training import views as _views
from otel_training.exporters import SafeMetricExporter, SafeSpanExporter
from otel_training.processors import span_mirrors
from otel_training.processors.truncation import TruncatingSpanProcessor
from otel_training.resource import identity_attributes

_logger = logging.getLogger("otel_training")

INSTRUMENTATION_NAME = "otel_training"

_lock = threading.RLock()
_current: Telemetry | None = None
# Every configured pipeline not yet shut down, so that exit and SIGTERM reach all.
_live: list[Telemetry] = []
# Shutdowns of pipelines that a later configure() replaced, still running.
_retiring: list[threading.Thread] = []
_globals_installed = False
_TRACER_PROXY = proxy.ProxyTracerProvider()
_METER_PROXY = proxy.ProxyMeterProvider()
#: Added to every bound of a shutdown, in seconds: threads to join, files to close.
_SHUTDOWN_SLACK_S = 0.5


@dataclass
class Telemetry:
    """A configured telemetry pipeline: providers, a meter, a tracer, and where they export.

    Attributes:
        meter_provider: The SDK ``MeterProvider`` (or a no-op one when disabled).
        tracer_provider: The SDK ``TracerProvider`` (or a no-op one when disabled).
        meter: ``meter_provider.get_meter("otel_training")``.
        tracer: ``tracer_provider.get_tracer("otel_training")``.
        destination: One human-readable line saying where telemetry goes (never a secret).
        settings: The parsed environment.
        output_dir: Absolute path of this run's directory of the embedded default's files,
            or ``None`` when no file is written there.
    """

    meter_provider: metrics_api.MeterProvider
    tracer_provider: trace_api.TracerProvider
    meter: metrics_api.Meter
    tracer: trace_api.Tracer
    destination: str
    settings: config.Settings
    output_dir: str | None = None
    _truncation: TruncatingSpanProcessor | None = field(default=None, repr=False)
    _files: list[TextIO] = field(default_factory=list, repr=False)
    _shutdown_started: bool = field(default=False, repr=False)
    _shutdown_finished: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def recording(self) -> bool:
        """False for the no-op pipeline of a disabled SDK or a rank that does not export."""
        return not isinstance(self.meter_provider, metrics_api.NoOpMeterProvider)

    def force_flush(self, timeout_millis: float | None = None) -> bool:
        """Records deferred values, then exports what the providers hold. Bounded by
        ``timeout_millis`` (default: the export timeout). Runs on the calling thread; never
        raises; returns False when something did not finish in time."""
        return self._bounded("force_flush", timeout_millis, self._flush)

    def shutdown(self, timeout_millis: float | None = None, *, reason: str | None = None) -> bool:
        """Ends the spans still open (marked truncated; with ``reason``, such as
        ``"SIGTERM"``, also status ERROR), then flushes and stops exporting, in order: deferred
        values, metric readers and span processors side by side. Bounded by
        ``timeout_millis`` (default: the export timeout) + 0.5 s even when the endpoint is
        dead: what has not finished by then is abandoned on daemon threads. Idempotent: a
        second caller waits for the first one's shutdown, as long. Never raises; returns
        False on timeout."""
        with _lock:
            first = not self._shutdown_started
            self._shutdown_started = True
            if self in _live:
                _live.remove(self)
        if not first:
            return self._shutdown_finished.wait(self._bound_s(timeout_millis) + _SHUTDOWN_SLACK_S)
        try:
            return self._bounded(
                "shutdown", timeout_millis, lambda timeout_s: self._shutdown(timeout_s, reason)
            )
        finally:
            self._shutdown_finished.set()

    def _flush(self, timeout_s: float) -> None:
        _run_flush_hooks(timeout_s)
        _call(self.meter_provider, "force_flush", timeout_millis=timeout_s * 1000)
        _call(self.tracer_provider, "force_flush", timeout_millis=int(timeout_s * 1000))

    def _shutdown(self, timeout_s: float, reason: str | None) -> None:
        _run_flush_hooks(timeout_s)
        if self._truncation is not None:
            self._truncation.truncate(reason)
        # Side by side, so that two dead endpoints cost one timeout, not two.
        tracer_thread = threading.Thread(
            target=_call, args=(self.tracer_provider, "shutdown"), daemon=True
        )
        tracer_thread.start()
        _call(self.meter_provider, "shutdown", timeout_millis=timeout_s * 1000)
        tracer_thread.join(timeout_s)
        if not tracer_thread.is_alive():
            for stream in self._files:
                try:
                    stream.close()
                except (OSError, ValueError):
                    pass

    def _bound_s(self, timeout_millis: float | None) -> float:
        return self.settings.shutdown_timeout_s if timeout_millis is None else timeout_millis / 1000

    def _bounded(self, what: str, timeout_millis: float | None, work) -> bool:
        if not self.recording:
            return True
        timeout_s = self._bound_s(timeout_millis)
        worker = threading.Thread(
            target=work, args=(timeout_s,), name=f"otel-training-{what}", daemon=True
        )
        worker.start()
        worker.join(timeout_s + _SHUTDOWN_SLACK_S)
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

    A pipeline configured before is replaced: it is flushed and stopped on a background
    thread (bounded by its export timeout; its spans still open are ended as truncated), and
    what recorded into it through the globals, :func:`get_meter` or :func:`get_tracer`
    records into the new one.

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
        set_global: Install the OpenTelemetry globals (proxies that follow the configured
            pipeline; installed once per process).
        environ: Variables to read instead of ``os.environ`` (the resource, headers and
            limits come from it alone).

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
    _silence_sdk_header_warnings()
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
        previous = _current
        _current = telemetry
        if set_global:
            _install_globals()
        instruments.record_in_this_process()
        if telemetry.recording:
            _live.append(telemetry)
            lifecycle.install(_shutdown_all, on_sigterm=telemetry.settings.shutdown_on_sigterm)
        if previous is not None and previous is not telemetry and previous in _live:
            _retire(previous)
    proxy.follow_all()
    _announce(telemetry.destination)
    return telemetry


def get_meter(name: str = INSTRUMENTATION_NAME, version: str | None = None) -> metrics_api.Meter:
    """A meter that records into the configured pipeline, now and after a later
    ``configure()``; configures from the environment on first use. Thread-safe; never raises
    on bad environment values."""
    _telemetry()
    return _METER_PROXY.get_meter(name, version)


def get_tracer(name: str = INSTRUMENTATION_NAME, version: str | None = None) -> trace_api.Tracer:
    """A tracer that starts spans in the configured pipeline, now and after a later
    ``configure()``; configures from the environment on first use."""
    _telemetry()
    return _TRACER_PROXY.get_tracer(name, version)


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
    telemetry = _current
    if telemetry is not None:
        return telemetry
    with _lock:
        if _current is None:
            configure()
        assert _current is not None
        return _current


proxy.bind(lambda: _telemetry().tracer_provider, lambda: _telemetry().meter_provider)


def _install_globals() -> None:
    """Installs the proxies as the OpenTelemetry globals, once per process (the API lets a
    process set them once). A provider someone else installed first is kept, with a warning."""
    global _globals_installed
    if _globals_installed:
        return
    _globals_installed = True
    trace_api.set_tracer_provider(_TRACER_PROXY)
    metrics_api.set_meter_provider(_METER_PROXY)
    if trace_api.get_tracer_provider() is not _TRACER_PROXY:
        _logger.warning(
            "otel-training: another TracerProvider was installed as the OpenTelemetry global "
            "before configure(); spans of opentelemetry.trace.get_tracer() go there."
        )


def _retire(previous: Telemetry) -> None:
    """Flushes and stops ``previous`` on a background thread (joined at exit)."""
    _logger.info(
        "otel-training: configure() was called again; the previous pipeline is flushed and "
        "stopped, and everything records into the new one."
    )
    thread = threading.Thread(target=previous.shutdown, name="otel-training-retire", daemon=True)
    _retiring.append(thread)
    thread.start()


def _shutdown_all(reason: str | None = None) -> None:
    """Shuts down every live pipeline side by side, and waits for replaced ones still
    stopping; bounded by the longest export timeout + 1 s (the exit and SIGTERM path)."""
    with _lock:
        live = list(reversed(_live))
        retiring = list(_retiring)
    threads = [
        threading.Thread(
            target=t.shutdown, kwargs={"reason": reason}, name="otel-training-exit", daemon=True
        )
        for t in live
    ]
    for thread in threads:
        thread.start()
    bound = max([t.settings.shutdown_timeout_s for t in live] or [config.LOCAL_SHUTDOWN_TIMEOUT_S])
    deadline = time.monotonic() + bound + 2 * _SHUTDOWN_SLACK_S
    for thread in threads + retiring:
        thread.join(max(0.0, deadline - time.monotonic()))


# -- building ----------------------------------------------------------------------------


def _with_default(base: str) -> list[str]:
    """``base``, then the default output directory if that is another."""
    return [base] if base == config.DEFAULT_OUTPUT_DIR else [base, config.DEFAULT_OUTPUT_DIR]


class _Outputs:
    """The embedded default's files of one pipeline: each in this run's directory
    (:mod:`otel_training.files`), opened without following symlinks, with a fallback."""

    def __init__(self, settings: config.Settings) -> None:
        self._settings = settings
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

    def open(self, signal_name: str, base: str | None = None) -> tuple[TextIO | None, str | None]:
        """This rank's file of ``signal_name`` (``{signal}-rank{R}.jsonl``) in the run's
        directory inside ``base`` (a directory the user named: no fallback), else inside the
        output directory, falling back to the default one, then to no file; each failure
        logs one warning. Never raises."""
        bases = [base] if base is not None else _with_default(self._settings.output_dir)
        file_name = f"{signal_name}-rank{self._settings.identity.rank}.jsonl"
        for i, candidate in enumerate(bases):
            path = os.path.join(candidate, file_name)
            try:
                directory = self._run_dir(candidate)
                path = os.path.join(directory, file_name)
                stream = files.open_append(path)
            except OSError as error:
                why = "a symlink is there" if error.errno == errno.ELOOP else error
                _logger.warning(
                    "otel-training cannot write %s to %s (%s); %s.",
                    signal_name,
                    path,
                    why,
                    "trying the default directory"
                    if i + 1 < len(bases)
                    else f"{signal_name} are not written to a file",
                )
                continue
            self.files.append(stream)
            if base is None and self.run_dir is None:
                self.run_dir = directory
            return stream, path
        return None, None


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
    outputs = _Outputs(settings)
    readers: list[MetricReader] = list(extra_readers)
    metric_targets: list[str] = []
    for name in settings.metrics_exporters:
        reader, target = _metric_reader(name, settings, outputs)
        if reader is not None:
            readers.append(reader)
            metric_targets.append(target)
    truncation = TruncatingSpanProcessor()
    # Open spans are tracked first; NVTX ranges and span JSON lines come before the batches.
    mirrors, mirror_targets = span_mirrors(settings, outputs.open)
    processors: list[SpanProcessor] = [truncation, *mirrors, *extra_processors]
    trace_targets: list[str] = []
    for name in settings.traces_exporters:
        exporter, target, local = _span_exporter(name, settings, outputs)
        if exporter is not None:
            processors.append(_batch_processor(exporter, settings, local))
            trace_targets.append(target)

    meter_provider = MeterProvider(
        metric_readers=readers,
        resource=resource,
        views=_views.default_views(
            step_duration_buckets_ms or settings.step_duration_buckets_ms, user_views
        ),
        shutdown_on_exit=False,
    )
    tracer_provider = TracerProvider(
        resource=resource,
        sampler=_sampler(settings),
        id_generator=_ProcessLocalIdGenerator(),
        # Values are cut at export, where the cut can say so (otel_training.limits); the
        # other limits are the SDK's, from the environment.
        span_limits=SpanLimits(
            max_attribute_length=SpanLimits.UNSET, max_span_attribute_length=SpanLimits.UNSET
        ),
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
        output_dir=outputs.run_dir,
        _truncation=truncation,
        _files=outputs.files,
    )


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


def _otlp_target(otlp: config.OtlpSettings, signal_name: str) -> str:
    protocol = "OTLP/gRPC" if otlp.protocol == "grpc" else "OTLP/HTTP"
    return f"{protocol} {otlp.shown_endpoint or _default_endpoint(otlp, signal_name)}"


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


def _silence_sdk_header_warnings() -> None:
    logger = logging.getLogger("opentelemetry.util.re")
    if _header_filter not in logger.filters:
        logger.addFilter(_header_filter)


def _default_endpoint(otlp: config.OtlpSettings, signal_name: str) -> str:
    if otlp.protocol == "grpc":
        return "http://localhost:4317"
    return f"http://localhost:4318/v1/{signal_name}"


def _metric_reader(
    name: str, settings: config.Settings, outputs: _Outputs
) -> tuple[MetricReader | None, str]:
    temporality = _temporality(settings.temporality_preference)
    otlp = settings.metrics_otlp
    exporter: MetricExporter
    interval_ms = settings.metric_export_interval_ms
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
        if otlp.protocol != "grpc":
            _pin_http_headers(exporter, otlp)
        target = _otlp_target(otlp, "metrics")
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
    reader = PeriodicExportingMetricReader(
        SafeMetricExporter(exporter, limits=settings.span_limits),
        export_interval_millis=interval_ms,
        export_timeout_millis=min(settings.metric_export_timeout_ms, interval_ms),
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
    return PrometheusMetricReader(), f"Prometheus http://{host}:{port}/metrics"


def _span_exporter(
    name: str, settings: config.Settings, outputs: _Outputs
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
        exporter: SpanExporter = OTLPSpanExporter(**_otlp_kwargs(otlp, "traces"))
        if otlp.protocol != "grpc":
            _pin_http_headers(exporter, otlp)
        safe = SafeSpanExporter(exporter, limits=settings.span_limits, timeout_s=otlp.timeout_s)
        return safe, _otlp_target(otlp, "traces"), False
    if name == "console":
        console = SafeSpanExporter(ConsoleSpanExporter(), limits=settings.span_limits)
        return console, "the console", True
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter

    stream, path = outputs.open("traces")
    if stream is None:
        return None, "nowhere", True
    safe = SafeSpanExporter(FileSpanExporter(stream=stream), limits=settings.span_limits)
    return safe, f"OTLP-JSON file {path}", True


def _batch_processor(exporter: SpanExporter, settings: config.Settings, local: bool):
    """A ``BatchSpanProcessor`` with ``OTEL_BSP_*`` where given, else the SDK's defaults over
    OTLP and, for a local file, a queue that takes bursts and a delay of one second."""
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
    return BatchSpanProcessor(
        exporter,
        max_queue_size=queue,
        schedule_delay_millis=delay,
        max_export_batch_size=min(batch, queue),
        export_timeout_millis=settings.bsp_export_timeout_ms,
    )


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
