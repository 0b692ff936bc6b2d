"""Observable gauges of the tensor metrics: one per metric family per meter, fanned out to sources.

The OpenTelemetry Python SDK returns the first instrument for a second
``create_observable_gauge`` with the same identity and silently ignores the new callbacks, so
each family has exactly one gauge and one callback per meter (:meth:`TensorMetricGauges.for_meter`
caches them by meter, weakly), and that callback reads every registered source.

Callbacks run on the metric reader's thread, under its lock, once per collection. Ours only
read host values that an executor has already published (:class:`PublishedValues` swaps a whole
mapping per step, so reading never waits): they never touch the device and never wait for a
reduction. A source that raises loses only its own points for that collection; the failure is
logged at most once a minute per source, family and exception type. Non-finite values are not
observed (the SDK would drop them silently; ``megatron.training.tensor.grad_nonfinite`` counts
non-finite gradients).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_training.semconv.metrics import METRICS
from otel_training.tensor._ratelimit import RateLimitedLogger

__all__ = ["TENSOR_FAMILIES", "TensorMetricGauges", "ValueSource"]

_logger = logging.getLogger(__name__)
_warn = RateLimitedLogger(_logger)

#: Every tensor-metric family of the registry (``megatron.training.tensor.*``).
TENSOR_FAMILIES: tuple[str, ...] = tuple(
    sorted(name for name in METRICS if name.startswith("megatron.training.tensor."))
)


class ValueSource(Protocol):
    """What a gauge reads: the current ``(attributes, value)`` pairs of a family. Must return
    at once, from host memory (for example :class:`~otel_training.tensor.PublishedValues`)."""

    def observe(self, family: str) -> Iterable[tuple[Mapping[str, str | int], float]]: ...


_BY_METER: weakref.WeakKeyDictionary[Meter, TensorMetricGauges] = weakref.WeakKeyDictionary()
_BY_METER_LOCK = threading.Lock()


class TensorMetricGauges:
    """The observable gauges of every tensor-metric family on one meter.

    Use :meth:`for_meter` rather than the constructor: a second set of gauges on the same meter
    would be ignored by the SDK. Creating the gauges never raises: a meter that refuses them is
    logged once and the sources are then never read.
    """

    def __init__(self, meter: Meter, families: Iterable[str] = TENSOR_FAMILIES) -> None:
        self._sources: list[weakref.ref[ValueSource] | Callable[[], ValueSource | None]] = []
        self._lock = threading.Lock()
        self.families = tuple(families)
        self.instruments = {}
        for family in self.families:
            spec = METRICS[family]
            try:
                self.instruments[family] = meter.create_observable_gauge(
                    family,
                    callbacks=[self._callback(family)],
                    unit=spec.unit,
                    description=spec.description,
                )
            except Exception:
                _logger.warning("could not create the gauge %s", family, exc_info=True)

    @classmethod
    def for_meter(cls, meter: Meter) -> TensorMetricGauges:
        """The gauges of ``meter``, created on first use (thread-safe; the cache holds the
        meter weakly)."""
        with _BY_METER_LOCK:
            gauges = _BY_METER.get(meter)
            if gauges is None:
                gauges = cls(meter)
                _BY_METER[meter] = gauges
            return gauges

    def add_source(self, source: ValueSource, *, weak: bool = True) -> Callable[[], None]:
        """Reads ``source`` at every collection from now on (held weakly unless ``weak`` is
        False). Returns a function that removes it."""
        try:
            ref = weakref.ref(source) if weak else (lambda: source)
        except TypeError:
            ref = lambda: source  # noqa: E731 - not weak-referenceable: hold it
        with self._lock:
            self._sources.append(ref)

        def remove() -> None:
            with self._lock:
                if ref in self._sources:
                    self._sources.remove(ref)

        return remove

    def _callback(self, family: str) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(options: CallbackOptions) -> list[Observation]:
            observations: list[Observation] = []
            with self._lock:
                refs = list(self._sources)
            for ref in refs:
                source = ref()
                if source is None:
                    with self._lock:
                        if ref in self._sources:
                            self._sources.remove(ref)
                    continue
                try:
                    points = [
                        Observation(value, attributes)
                        for attributes, value in source.observe(family)
                        if not (math.isnan(value) or math.isinf(value))
                    ]
                except Exception as error:
                    _warn.warning(
                        (id(source), family, type(error)),
                        "tensor-metric source %s failed for %s; its points are skipped: %r",
                        type(source).__name__,
                        family,
                        error,
                    )
                    continue
                observations.extend(points)
            return observations

        return callback
