"""Providers that follow the configured pipeline: what the OpenTelemetry globals,
``otel_training.get_meter()`` and ``otel_training.get_tracer()`` hand out.

The OpenTelemetry API lets a process set its global providers once. ``configure()`` installs
these proxies there instead of one pipeline's providers, so that when ``configure()`` runs again
(a notebook cell re-run, a framework and a user both configuring) and the old pipeline is
flushed and stopped, every tracer, meter and instrument obtained before, through the globals or
through ``otel_training``, records into the new pipeline: nothing keeps exporting frozen values
under the run's identity, and nothing is lost to a stopped pipeline.

- :class:`ProxyTracerProvider` hands out :class:`ProxyTracer`\\ s, which start each span on the
  current pipeline's tracer. Other attributes (``add_span_processor``, ``force_flush``,
  ``resource``...) are those of the current SDK ``TracerProvider``.
- :class:`ProxyLoggerProvider` hands out :class:`ProxyLogger`\\ s, which emit each log
  record on the current pipeline's logger of the same name (``otel_training.get_logger()`` and
  the OpenTelemetry logs global).
- :class:`ProxyMeterProvider` hands out :class:`ProxyMeter`\\ s, whose instruments are the
  API's proxy instruments, rebound to the current pipeline's meter at every ``configure()``.
  ``record_training_metrics`` looks through a proxy meter to its current real meter, so the
  hot path stays as cheap as on an SDK meter.

A proxy created before anything is configured configures from the environment on first use.
Thread-safe; nothing here raises on the recording paths.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import _logs as logs_api
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.metrics._internal import instrument as api_instrument

__all__ = [
    "ProxyLogger",
    "ProxyLoggerProvider",
    "ProxyMeter",
    "ProxyMeterProvider",
    "ProxyTracer",
    "ProxyTracerProvider",
]

# The current pipeline's providers, given by configuration.py (which imports this module).
_current_tracer_provider: Callable[[], trace_api.TracerProvider]
_current_meter_provider: Callable[[], metrics_api.MeterProvider]
_current_logger_provider: Callable[[], logs_api.LoggerProvider] = logs_api.NoOpLoggerProvider


def bind(
    tracer_provider: Callable[[], trace_api.TracerProvider],
    meter_provider: Callable[[], metrics_api.MeterProvider],
    logger_provider: Callable[[], logs_api.LoggerProvider] | None = None,
) -> None:
    """Tells the proxies where the current pipeline's providers are (called by configuration.py)."""
    global _current_tracer_provider, _current_meter_provider, _current_logger_provider
    _current_tracer_provider = tracer_provider
    _current_meter_provider = meter_provider
    if logger_provider is not None:
        _current_logger_provider = logger_provider


class ProxyTracer(trace_api.Tracer):
    """A tracer that starts spans on the current pipeline's tracer of the same name."""

    def __init__(self, key: tuple[str, str | None, str | None, Any]) -> None:
        self._key = key
        self._provider: trace_api.TracerProvider | None = None
        self._tracer: trace_api.Tracer | None = None

    def _real(self) -> trace_api.Tracer:
        provider = _current_tracer_provider()
        tracer = self._tracer
        if self._provider is not provider or tracer is None:
            name, version, schema_url, attributes = self._key
            tracer = provider.get_tracer(name, version, schema_url, attributes)
            self._provider, self._tracer = provider, tracer
        return tracer

    def start_span(self, *args: Any, **kwargs: Any) -> trace_api.Span:
        return self._real().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        return self._real().start_as_current_span(*args, **kwargs)


class ProxyTracerProvider(trace_api.TracerProvider):
    """The global tracer provider of a configured process (see the module docstring)."""

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace_api.Tracer:
        return ProxyTracer(
            (instrumenting_module_name, instrumenting_library_version, schema_url, attributes)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(_current_tracer_provider(), name)


class ProxyLogger(logs_api.Logger):
    """A logger that emits on the current pipeline's logger of the same name."""

    def __init__(self, key: tuple[str, str | None, str | None, Any]) -> None:
        name, version, schema_url, attributes = key
        super().__init__(name, version, schema_url, attributes)
        self._key = key
        self._provider: logs_api.LoggerProvider | None = None
        self._logger: logs_api.Logger | None = None

    def _real(self) -> logs_api.Logger:
        provider = _current_logger_provider()
        logger = self._logger
        if self._provider is not provider or logger is None:
            name, version, schema_url, attributes = self._key
            logger = provider.get_logger(name, version, schema_url, attributes)
            self._provider, self._logger = provider, logger
        return logger

    def emit(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._real().emit(*args, **kwargs)

    def enabled(self, *args: Any, **kwargs: Any) -> bool:  # type: ignore[override]
        return self._real().enabled(*args, **kwargs)


class ProxyLoggerProvider(logs_api.LoggerProvider):
    """The global logger provider of a configured process (see the module docstring)."""

    def get_logger(
        self,
        name: str,
        version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> logs_api.Logger:
        return ProxyLogger((name, version, schema_url, attributes))

    def __getattr__(self, name: str) -> Any:
        return getattr(_current_logger_provider(), name)


class ProxyMeter(metrics_api.Meter):
    """A meter whose instruments follow the current pipeline (the API's proxy instruments,
    rebound at each ``configure()``)."""

    def __init__(
        self, name: str, version: str | None = None, schema_url: str | None = None, attributes=None
    ) -> None:
        super().__init__(name, version=version, schema_url=schema_url)
        self._attributes = attributes
        self._lock = threading.Lock()
        self._instruments: list[api_instrument._ProxyInstrument] = []
        self._provider: metrics_api.MeterProvider | None = None
        self._real_meter: metrics_api.Meter | None = None
        self.follow()

    def follow(self) -> metrics_api.Meter:
        """Rebinds to the current pipeline if it changed; returns the real meter."""
        provider = _current_meter_provider()
        with self._lock:
            if provider is not self._provider or self._real_meter is None:
                real = provider.get_meter(
                    self._name, self._version, self._schema_url, self._attributes
                )
                self._provider, self._real_meter = provider, real
                for instrument in self._instruments:
                    instrument.on_meter_set(real)
            return self._real_meter

    def _add(self, proxy: api_instrument._ProxyInstrument):
        real = self.follow()
        with self._lock:
            self._instruments.append(proxy)
        proxy.on_meter_set(real)
        return proxy

    def on_rebind(self, listener: Callable[[metrics_api.Meter], object]) -> None:
        """Calls ``listener(real_meter)`` now and each time this meter rebinds to another
        pipeline's meter (in ``configure()``, on its thread, this meter's lock held: the
        listener must not create instruments on this proxy). The listener is held strongly;
        an exception it raises is logged. Never raises."""
        self._add(_RebindListener(listener))

    def create_counter(self, name: str, unit: str = "", description: str = ""):
        return self._add(api_instrument._ProxyCounter(name, unit, description))

    def create_up_down_counter(self, name: str, unit: str = "", description: str = ""):
        return self._add(api_instrument._ProxyUpDownCounter(name, unit, description))

    def create_histogram(
        self,
        name: str,
        unit: str = "",
        description: str = "",
        *,
        explicit_bucket_boundaries_advisory: Sequence[float] | None = None,
    ):
        return self._add(
            api_instrument._ProxyHistogram(
                name,
                unit,
                description,
                explicit_bucket_boundaries_advisory=explicit_bucket_boundaries_advisory,
            )
        )

    def create_gauge(self, name: str, unit: str = "", description: str = ""):
        return self._add(api_instrument._ProxyGauge(name, unit, description))

    def create_observable_counter(self, name, callbacks=None, unit="", description=""):
        return self._add(api_instrument._ProxyObservableCounter(name, callbacks, unit, description))

    def create_observable_up_down_counter(self, name, callbacks=None, unit="", description=""):
        return self._add(
            api_instrument._ProxyObservableUpDownCounter(name, callbacks, unit, description)
        )

    def create_observable_gauge(self, name, callbacks=None, unit="", description=""):
        return self._add(api_instrument._ProxyObservableGauge(name, callbacks, unit, description))


class _RebindListener:
    """What :meth:`ProxyMeter.on_rebind` keeps among the proxy's instruments."""

    __slots__ = ("listener",)

    def __init__(self, listener: Callable[[metrics_api.Meter], object]) -> None:
        self.listener = listener

    def on_meter_set(self, meter: metrics_api.Meter) -> None:
        try:
            self.listener(meter)
        except Exception:
            logging.getLogger(__name__).warning(
                "otel-training: a meter rebind listener failed", exc_info=True
            )


_meters: weakref.WeakSet[ProxyMeter] = weakref.WeakSet()
_meters_lock = threading.Lock()


class ProxyMeterProvider(metrics_api.MeterProvider):
    """The global meter provider of a configured process (see the module docstring)."""

    def get_meter(
        self,
        name: str,
        version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> metrics_api.Meter:
        meter = ProxyMeter(name, version, schema_url, attributes)
        with _meters_lock:
            _meters.add(meter)
        return meter

    def __getattr__(self, name: str) -> Any:
        return getattr(_current_meter_provider(), name)


def follow_all() -> None:
    """Rebinds every live proxy meter to the current pipeline (``configure()`` calls this)."""
    with _meters_lock:
        meters = list(_meters)
    for meter in meters:
        meter.follow()


def real_meter(meter: Any) -> Any:
    """The meter a proxy meter records into now (the proxy itself before that is known);
    any other meter as it is."""
    if type(meter) is ProxyMeter:
        return meter._real_meter or meter
    return meter
