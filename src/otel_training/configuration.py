"""``configure()``: MeterProvider, TracerProvider and LoggerProvider from the standard
``OTEL_*`` variables.

Exporters per signal (``OTEL_METRICS_EXPORTER``, ``OTEL_TRACES_EXPORTER``,
``OTEL_LOGS_EXPORTER``): ``otlp`` (gRPC or
http/protobuf per ``OTEL_EXPORTER_OTLP_PROTOCOL``), ``console``, ``none``, ``prometheus``
(metrics only, a pull endpoint on ``OTEL_EXPORTER_PROMETHEUS_HOST`` and port
``OTEL_EXPORTER_PROMETHEUS_PORT`` + ``LOCAL_RANK``) and the embedded default ``otlp_json_file``:
OTLP-JSON lines, one file per rank and signal, in one directory per run inside
``OTEL_PYTHON_TRAINING_OUTPUT_DIR`` (:mod:`otel_training.export.files`). With no exporter named and
no endpoint set, the embedded default is used; one log line at configure says where telemetry goes.

One pipeline at a time: a second ``configure()`` flushes and stops the pipeline it replaces,
and everything obtained before (the OpenTelemetry globals, ``get_meter()``, ``get_tracer()``,
``get_logger()``, ``logging_handler()``) records into the new one (:mod:`otel_training._providers`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from opentelemetry import _logs as logs_api
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry._logs import _internal as _logs_internal
from opentelemetry.metrics import _internal as _metrics_internal
from opentelemetry.sdk._logs import LogRecordProcessor
from opentelemetry.sdk.metrics.export import (
    MetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.trace import SpanProcessor

from otel_training import _providers, config, pipeline
from otel_training.health import ledger, watchdog
from otel_training.logs import bridge as log_bridge
from otel_training.metrics import instruments
from otel_training.pipeline import INSTRUMENTATION_NAME, lifecycle
from otel_training.trace.open_spans import OpenSpans
from otel_training.trace.processors.jsonlog import JsonLogSpanProcessor
from otel_training.trace.processors.nvtx import NvtxSpanProcessor

_logger = logging.getLogger("otel_training")


_lock = threading.RLock()
_current: Telemetry | None = None
# Every configured pipeline not yet shut down, so that exit and SIGTERM reach all.
_live: list[Telemetry] = []
# Shutdowns of pipelines that a later configure() replaced, still running.
_retiring: list[threading.Thread] = []
_globals_installed = False
_TRACER_PROXY = _providers.ProxyTracerProvider()
_METER_PROXY = _providers.ProxyMeterProvider()
_LOGGER_PROXY = _providers.ProxyLoggerProvider()
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
        logger_provider: The SDK ``LoggerProvider`` (or a no-op one when no logs are
            exported).
    """

    meter_provider: metrics_api.MeterProvider
    tracer_provider: trace_api.TracerProvider
    meter: metrics_api.Meter
    tracer: trace_api.Tracer
    destination: str
    settings: config.Settings
    output_dir: str | None = None
    nvtx: NvtxSpanProcessor | None = field(default=None, repr=False)
    #: Called, without arguments, when shutdown starts, before open spans are truncated (on a
    #: signal, after): the phases end their open trace segment here. Exceptions are logged.
    before_shutdown: list[Callable[[], object]] = field(default_factory=list, repr=False)
    logger_provider: logs_api.LoggerProvider = field(default_factory=logs_api.NoOpLoggerProvider)
    open_spans: OpenSpans | None = field(default=None, repr=False)
    #: The span JSON lines' processor, or None (the hang watchdog writes its stacks there).
    span_lines: JsonLogSpanProcessor | None = field(default=None, repr=False)
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
        values, then metric readers, span processors and log processors side by side. Bounded by
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
        # Logs last: the spans just flushed may have emitted exception records.
        _call(self.logger_provider, "force_flush", timeout_millis=int(timeout_s * 1000))

    def _shutdown(self, timeout_s: float, reason: str | None) -> None:
        deadline = time.monotonic() + timeout_s
        _run_flush_hooks(timeout_s)
        # At a normal shutdown the phases first end what they hold open (a trace segment),
        # then whatever is still open is truncated; on a signal everything open is truncated.
        if reason is not None and self.open_spans is not None:
            self.open_spans.truncate(reason)
        if reason is not None:  # the progress record says it too (spans or not)
            ledger.LEDGER.signalled(reason)
        for hook in list(self.before_shutdown):
            try:
                hook()
            except Exception:
                _logger.warning("otel-training: a shutdown hook failed", exc_info=True)
        if reason is None and self.open_spans is not None:
            self.open_spans.truncate(reason)
        if reason is not None:
            # The process ends at the signal: the final collection holds what was recorded
            # before it, not what threads of the program's record while telemetry flushes.
            _stop_measurements(self.meter_provider)
        # Side by side, so that three dead endpoints cost one timeout, not three.
        threads = [
            threading.Thread(target=_call, args=(provider, "shutdown"), daemon=True)
            for provider in (self.tracer_provider, self.logger_provider)
        ]
        for thread in threads:
            thread.start()
        _call(self.meter_provider, "shutdown", timeout_millis=timeout_s * 1000)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in threads):
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


def _values_sink(
    span_lines: JsonLogSpanProcessor | None, tracer_provider: trace_api.TracerProvider
) -> Callable[[dict[str, Any]], None] | None:
    """Where ``record_training_metrics`` queues each call's ``training_values`` record: the
    span JSON lines' writer (no wake-up: it writes them with its next round), or None where
    the embedded default writes no span lines (OTLP only)."""
    if span_lines is None:
        return None
    resource = getattr(tracer_provider, "resource", None)

    def sink(record: dict[str, Any]) -> None:
        span_lines.write_record(record, resource, wake=False)

    return sink


def _stop_measurements(provider: metrics_api.MeterProvider) -> None:
    """Drops every synchronous measurement that reaches ``provider`` from now on (observable
    instruments are still read at the final collection). Through the SDK's measurement consumer,
    which every synchronous instrument of ``provider`` calls; a provider without one (not the
    SDK's) records on. Never raises."""
    consumer = getattr(provider, "_measurement_consumer", None)
    if consumer is not None and hasattr(consumer, "consume_measurement"):
        consumer.consume_measurement = _drop_measurement


def _drop_measurement(measurement: object) -> None:
    return None


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
    function = getattr(provider, method, None)
    if function is None:  # a no-op provider of the API may have no force_flush or shutdown
        return
    try:
        function(**kwargs)
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
    log_processors: Iterable[LogRecordProcessor] = (),
) -> Telemetry:
    """Builds the MeterProvider, TracerProvider and LoggerProvider from the ``OTEL_*``
    environment.

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
        log_processors: Extra log record processors (for example a
            ``SimpleLogRecordProcessor(InMemoryLogRecordExporter())`` in tests); with one, a
            LoggerProvider is built even when ``OTEL_LOGS_EXPORTER=none``.
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
    pipeline.silence_sdk_header_warnings()
    with _lock:
        built = pipeline.build(
            settings,
            service_name=service_name,
            resource_attributes=resource_attributes or {},
            user_views=list(views),
            step_duration_buckets_ms=step_duration_buckets_ms,
            extra_readers=list(metric_readers),
            extra_processors=list(span_processors),
            extra_log_processors=list(log_processors),
        )
        telemetry = Telemetry(
            built.meter_provider,
            built.tracer_provider,
            built.meter_provider.get_meter(INSTRUMENTATION_NAME),
            built.tracer_provider.get_tracer(INSTRUMENTATION_NAME),
            built.destination,
            settings,
            output_dir=built.output_dir,
            nvtx=built.nvtx,
            logger_provider=built.logger_provider,
            open_spans=built.open_spans,
            span_lines=built.span_lines,
            _files=built.files,
        )
        previous = _current
        _current = telemetry
        if set_global:
            _install_globals()
        instruments.record_in_this_process()
        # Every logged value, one training_values line per call, beside the span lines.
        instruments.write_values_to(_values_sink(built.span_lines, built.tracer_provider))
        if telemetry.recording:
            _live.append(telemetry)
            lifecycle.install(
                _shutdown_all,
                _flush_all,
                on_sigterm=telemetry.settings.shutdown_on_sigterm,
                sigterm_bound_s=_sigterm_bound_s,
            )
            # The ledger's progress record outlives a kill (docs/health.md).
            if built.output_dir is not None:
                resource = getattr(built.tracer_provider, "resource", None)
                if resource is not None and ledger.record_in(built.output_dir, resource.attributes):
                    telemetry.before_shutdown.append(ledger.LEDGER.shut_down)
            # This rank's hang watchdog follows the pipeline (docs/health.md).
            if watchdog.start(telemetry) is not None:
                telemetry.before_shutdown.append(lambda: watchdog.stop(telemetry))
        if previous is not None and previous is not telemetry and previous in _live:
            _retire(previous)
        log_bridge.bridge_root_logger(settings.logs.bridge_root_logger)
    _providers.follow_all()
    if _prints_its_line(telemetry.settings):
        _announce(telemetry.destination)  # one line per job, not one per rank
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


def get_logger(name: str = INSTRUMENTATION_NAME, version: str | None = None) -> logs_api.Logger:
    """An OpenTelemetry logger that emits into the configured pipeline, now and after a later
    ``configure()``; configures from the environment on first use. Its records carry the
    rank's resource; a record emitted without explicit ids takes them from the current span
    (the SDK's rule). Thread-safe; never raises on bad environment values."""
    _telemetry()
    return _LOGGER_PROXY.get_logger(name, version)


def logging_handler(level: int = logging.NOTSET) -> logging.Handler:
    """A ``logging`` handler that exports the records it handles as OpenTelemetry log records
    of the configured pipeline (now and after a later ``configure()``), with the rank's
    resource and, inside a sampled span, its trace and span ids
    (:class:`otel_training.logs.bridge.LoggingHandler`, ``docs/logs.md``)::

        logging.getLogger("train").addHandler(otel_training.logging_handler())

    Configures from the environment when nothing is configured yet. The handler never raises
    into the code that logs."""
    _telemetry()
    return log_bridge.LoggingHandler(level)


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


_providers.bind(
    lambda: _telemetry().tracer_provider,
    lambda: _telemetry().meter_provider,
    lambda: _telemetry().logger_provider,
)


def _bridged_provider() -> logs_api.LoggerProvider | None:
    """The logger provider the logging bridge emits on: the configured pipeline's, unless it
    is shutting down (then records go nowhere, without the SDK's warning per record)."""
    telemetry = _current
    if telemetry is None or telemetry._shutdown_started:
        return None
    return telemetry.logger_provider


log_bridge.bind(_bridged_provider)


def _install_globals() -> None:
    """Installs the proxies as the OpenTelemetry globals, once per process (the API lets a
    process set each once). A provider the program installed first is kept, with one warning
    per signal: the program's global wins."""
    global _globals_installed
    if _globals_installed:
        return
    _globals_installed = True
    for name, api, internal, proxy_provider in (
        ("tracer", trace_api, trace_api, _TRACER_PROXY),
        ("meter", metrics_api, _metrics_internal, _METER_PROXY),
        ("logger", logs_api, _logs_internal, _LOGGER_PROXY),
    ):
        kind = f"{name.capitalize()}Provider"
        # The API's private setter without its own "Overriding ... is not allowed" line, so
        # that a program sees one warning per signal; the public setter where it is missing.
        quiet_set = getattr(internal, f"_set_{name}_provider", None)
        try:
            if quiet_set is not None:
                quiet_set(proxy_provider, log=False)
            else:  # pragma: no cover - every supported API has the private setter
                getattr(api, f"set_{name}_provider")(proxy_provider)
            kept = getattr(api, f"get_{name}_provider")() is not proxy_provider
        except Exception:
            _logger.warning("otel-training: could not install the global %s", kind, exc_info=True)
            continue
        if kept:
            _logger.warning(
                "otel-training: the program installed its own %s as the OpenTelemetry global "
                "before configure(); it is kept, and %s records there; otel_training's own "
                "get_tracer(), get_meter() and get_logger() record into otel-training's pipeline.",
                kind,
                f"{api.__name__}.get_{name}()",
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


def _shutdown_all(reason: str | None = None, timeout_s: float | None = None) -> None:
    """Shuts down every live pipeline side by side, and waits for replaced ones still
    stopping; bounded by ``timeout_s`` (default: the longest export timeout) + 1 s (the exit
    and SIGTERM path)."""
    with _lock:
        live = list(reversed(_live))
        retiring = list(_retiring)
    timeout_millis = None if timeout_s is None else timeout_s * 1000
    _side_by_side(
        live,
        lambda t: t.shutdown(timeout_millis, reason=reason),
        "exit",
        retiring,
        bound_s=timeout_s,
    )


def _sigterm_bound_s() -> float:
    """Seconds from a SIGTERM that nobody else handles to the end of the process: the longest
    bound of the live pipelines (:attr:`config.Settings.sigterm_bound_s`). Takes no lock: the
    SIGTERM handler calls it on the main thread, which may hold ``_lock``."""
    return max([t.settings.sigterm_bound_s for t in list(_live)] or [config.LOCAL_SIGTERM_BOUND_S])


def _flush_all() -> None:
    """Flushes every live pipeline side by side and stops none (a SIGTERM that the program
    handles itself: its graceful path goes on recording); bounded by the longest export
    timeout + 1 s. Runs on the calling thread (the SIGTERM watcher); never raises."""
    with _lock:
        live = [t for t in _live if not t._shutdown_started]
    _side_by_side(live, lambda t: t.force_flush(), "flush", [])


def _side_by_side(
    live: list[Telemetry],
    work: Callable[[Telemetry], object],
    what: str,
    also_join: list[threading.Thread],
    bound_s: float | None = None,
) -> None:
    threads = [
        threading.Thread(target=work, args=(t,), name=f"otel-training-{what}", daemon=True)
        for t in live
    ]
    for thread in threads:
        thread.start()
    bound = bound_s
    if bound is None:
        bound = max(
            [t.settings.shutdown_timeout_s for t in live] or [config.LOCAL_SHUTDOWN_TIMEOUT_S]
        )
    deadline = time.monotonic() + bound + 2 * _SHUTDOWN_SLACK_S
    for thread in threads + also_join:
        thread.join(max(0.0, deadline - time.monotonic()))


def _prints_its_line(settings: config.Settings) -> bool:
    """Whether this rank writes its telemetry line: rank 0, and the lowest rank that exports
    when rank 0 does not (``OTEL_PYTHON_TRAINING_EXPORT_RANKS=last``); every rank with
    ``OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS``. Every rank computes the same answer."""
    identity, ranks = settings.identity, settings.export_ranks
    if settings.print_all_ranks or identity.rank == 0:
        return True
    if ranks.policy in ("all", "first_per_node") or not ranks.exports(identity):
        return False  # rank 0 exports, or this rank does not
    world = max(1, identity.world_size)
    if ranks.policy == "list":
        chosen = [r for r in ranks.ranks if 0 <= r < world]
    elif ranks.policy == "sampled":
        chosen = list(config.sampled_ranks(ranks.rate, world))
    else:  # last, single: one rank exports, this one
        return True
    return identity.rank == min(chosen, default=identity.rank)


def _announce(destination: str) -> None:
    """The one log line at configure (on rank 0 alone unless
    ``OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS``); written to stderr when logging is not set up (the
    logging bridge does not count: it drops otel-training's own records)."""
    if log_bridge.has_handlers_besides_bridge(_logger):
        _logger.info("otel-training %s", destination)
    else:
        # One write of the whole line: under `python -u` (torchrun's workers) print() writes
        # the text and the newline apart, and the lines of several ranks then interleave.
        try:
            sys.stderr.write(f"otel-training {destination}\n")
        except (OSError, ValueError, AttributeError):  # stderr closed or absent (pythonw)
            pass
