"""Observable gauges of the tensor metrics: one per family per recording meter, read from sources.

The OpenTelemetry Python SDK returns the first instrument for a second
``create_observable_gauge`` with the same identity and silently ignores the new callbacks. So
each family has exactly one gauge and one callback per meter that records (an SDK meter of a
pipeline, or any other meter given), and that callback reads every source registered for that
meter, whoever registered it and through which meter object:

- a meter that records itself (an SDK ``Meter``, a test double): one
  :class:`TensorMetricGauges` per meter object owns the gauges (:meth:`TensorMetricGauges.for_meter`
  caches it by meter, weakly); a set built later on the same meter with the constructor creates
  no gauge of its own (the SDK would ignore its callbacks) and is read by the first set's;
- a :class:`otel_training._providers.ProxyMeter` (what ``otel_training.get_meter()`` and the
  OpenTelemetry global hand out, a new object per call): one set of sources per instrumentation
  scope for the whole process, read by the gauges of the SDK meter the proxy records into now
  and moved to the next pipeline's at each ``configure()``. Two proxies of one scope, or a proxy
  and the pipeline's own meter of that scope, therefore share one callback: a second observer,
  a notebook cell run again or a second fit records exactly as the first did.

Callbacks run on the metric reader's thread, under its lock, once per collection. Ours only
read host values that an executor has already published (:class:`PublishedValues` swaps a whole
mapping per step, so reading never waits): they never touch the device and never wait for a
reduction. A source that raises loses only its own points for that collection; the failure is
logged at most once a minute per source, family and exception type. Non-finite values are not
observed (the SDK would drop them silently; ``megatron.training.tensor.grad_nonfinite`` counts
non-finite gradients).

A source can be *retired* (:meth:`TensorMetricGauges.retire_source`, what a closed observer
does): its last values stay observable, so that the final collection of a finished run still
has them, until a new source is added to the same gauges, which drops every retired one.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_training import _providers
from otel_training._log_once import MINUTE_S, LogOnce
from otel_training.semconv.metrics import METRICS

__all__ = ["TENSOR_FAMILIES", "TensorMetricGauges", "ValueSource"]

_logger = logging.getLogger(__name__)
_warn = LogOnce(_logger, interval_s=MINUTE_S)

#: Every tensor-metric family of the registry (``megatron.training.tensor.*``).
TENSOR_FAMILIES: tuple[str, ...] = tuple(
    sorted(name for name in METRICS if name.startswith("megatron.training.tensor."))
)


class ValueSource(Protocol):
    """What a gauge reads: the current ``(attributes, value)`` pairs of a family. Must return
    at once, from host memory (for example :class:`~otel_training.tensor.PublishedValues`)."""

    def observe(self, family: str) -> Iterable[tuple[Mapping[str, str | int], float]]: ...


# Lock order: a ProxyMeter's lock (held while it calls its rebind listeners), then this one;
# never the other way round (no proxy is touched while this is held).
_LOCK = threading.RLock()
_BY_METER: weakref.WeakKeyDictionary[Any, TensorMetricGauges] = weakref.WeakKeyDictionary()
_BY_SCOPE: dict[tuple, TensorMetricGauges] = {}


class TensorMetricGauges:
    """The observable gauges of every tensor-metric family on one meter.

    :meth:`for_meter` returns the set of a meter; the constructor makes another set of sources
    on it. The first set on a meter creates the gauges; a later one (a constructor after
    :meth:`for_meter`, after an observer, or after a proxy scope moved onto the meter at a
    ``configure()``) creates none, since the SDK would ignore a second gauge's callbacks: its
    sources are read by the first set's gauges, which create the families it adds. On a
    :class:`~otel_training._providers.ProxyMeter` the set is read with its scope's sources. Creating
    the gauges never raises: a meter that refuses them is logged once and the sources are then
    never read.

    Args:
        meter: The meter to create the gauges on.
        families: The families to create gauges for (those the meter's first set lacks).
    """

    def __init__(self, meter: Meter, families: Iterable[str] = TENSOR_FAMILIES) -> None:
        self._sources: list[weakref.ref[ValueSource] | Callable[[], ValueSource | None]] = []
        self._retired: list[ValueSource] = []
        self._followers: list[TensorMetricGauges] = []  # sets whose sources these gauges read
        self._lock = threading.Lock()
        self._instruments: dict[str, Any] = {}
        self._target: TensorMetricGauges | None = None  # the set whose gauges read these sources
        try:  # weakly: the meter is the key of this set in _BY_METER
            self._meter_ref: Callable[[], Meter | None] = weakref.ref(meter)
        except TypeError:
            self._meter_ref = lambda: meter
        self.families = tuple(families)
        if type(meter) is _providers.ProxyMeter:
            first: TensorMetricGauges | None = _FollowingGauges.of(meter)
        else:
            with _LOCK:
                try:
                    first = _BY_METER.get(meter)
                    if first is None:
                        _BY_METER[meter] = self
                except TypeError:  # neither hashable nor weakly referenceable: not cached
                    first = None
        if first is None:
            self._cover(self.families)
            return
        self._target = first
        first._cover(self.families)
        with first._lock:
            first._followers.append(self)

    @property
    def instruments(self) -> dict[str, Any]:
        """The gauges that read these sources, by family (the first set's, on a shared meter)."""
        target = self._target
        return self._instruments if target is None else target.instruments

    def _cover(self, families: Iterable[str]) -> None:
        """Creates the gauges of ``families`` that the set whose gauges read these sources does
        not have yet (on the meter it was built on)."""
        if self._target is not None:
            self._target._cover(families)
            return
        meter = self._meter_ref()
        if meter is None:
            return
        with _LOCK:
            for family in families:
                if family in self._instruments:
                    continue
                spec = METRICS[family]
                try:
                    self._instruments[family] = meter.create_observable_gauge(
                        family,
                        callbacks=[self._callback(family)],
                        unit=spec.unit,
                        description=spec.description,
                    )
                except Exception:
                    _logger.warning("could not create the gauge %s", family, exc_info=True)

    @classmethod
    def for_meter(cls, meter: Meter) -> TensorMetricGauges:
        """The gauges that record into ``meter``, created on first use (thread-safe; the cache
        holds a meter weakly). For a :class:`~otel_training._providers.ProxyMeter`: the sources of
        its instrumentation scope, read by the gauges of the pipeline it records into now and
        after each ``configure()``."""
        if type(meter) is _providers.ProxyMeter:
            return _FollowingGauges.of(meter)
        with _LOCK:
            gauges = _BY_METER.get(meter)
            return cls(meter) if gauges is None else gauges  # a new set registers itself

    def add_source(self, source: ValueSource, *, weak: bool = True) -> Callable[[], None]:
        """Reads ``source`` at every collection from now on (held weakly unless ``weak`` is
        False); the retired sources are dropped. Returns a function that removes it."""
        try:
            ref = weakref.ref(source) if weak else (lambda: source)
        except TypeError:
            ref = lambda: source  # noqa: E731 - not weak-referenceable: hold it
        self._drop_retired()
        with self._lock:
            self._sources.append(ref)

        def remove() -> None:
            with self._lock:
                self._sources[:] = [r for r in self._sources if r is not ref]

        return remove

    def retire_source(self, source: ValueSource) -> None:
        """Stops following ``source`` as a live source but keeps its current values observable
        until the next :meth:`add_source` on these gauges (a finished run's last values reach
        the final collection; a new run's replace them). Never raises."""
        with self._lock:
            self._sources[:] = [r for r in self._sources if r() is not source]
            if not any(kept is source for kept in self._retired):
                self._retired.append(source)

    def _recording(self) -> TensorMetricGauges | None:
        """The gauges whose callbacks read these sources now (themselves, for the first set on
        a meter that records)."""
        target = self._target
        return self if target is None else target._recording()

    def _read_with(self) -> list[TensorMetricGauges]:
        """These gauges and every set whose sources their callbacks read."""
        with self._lock:
            followers = list(self._followers)
        found = [self]
        for follower in followers:
            found.extend(follower._read_with())
        return found

    def _drop_retired(self) -> None:
        """Drops the retired sources of every set read by the same callbacks as this one."""
        target = self._recording()
        for gauges in (self if target is None else target)._read_with():
            with gauges._lock:
                gauges._retired.clear()

    def _live(self) -> list[ValueSource]:
        """The sources to read now: the live ones (dead weak references are dropped), the
        retired ones, and those of the proxy scopes recording here."""
        with self._lock:
            found: list[ValueSource] = []
            alive = []
            for ref in self._sources:
                source = ref()
                if source is not None:
                    alive.append(ref)
                    found.append(source)
            self._sources[:] = alive
            found.extend(self._retired)
            followers = list(self._followers)
        for follower in followers:
            found.extend(follower._live())
        return found

    def _callback(self, family: str) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(options: CallbackOptions) -> list[Observation]:
            observations: list[Observation] = []
            for source in self._live():
                try:
                    points = [
                        Observation(value, attributes)
                        for attributes, value in source.observe(family)
                        if not (math.isnan(value) or math.isinf(value))
                    ]
                except Exception as error:
                    _warn(
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


class _FollowingGauges(TensorMetricGauges):
    """The sources of one proxy instrumentation scope: no instruments of their own, read by
    the gauges of the SDK meter that the scope records into now (moved at each rebind)."""

    def __init__(self, meter: _providers.ProxyMeter) -> None:
        self._sources = []
        self._retired = []
        self._followers = []
        self._lock = threading.Lock()
        self._instruments = {}  # none of its own: the meter's it records into now
        self.families = TENSOR_FAMILIES
        self._meter = meter  # held: it keeps following the pipelines for the process
        self._target = None

    def _recording(self) -> TensorMetricGauges | None:
        target = self._target
        return None if target is None else target._recording()

    def _cover(self, families: Iterable[str]) -> None:
        target = self._target
        if target is not None:
            target._cover(families)

    @classmethod
    def of(cls, meter: _providers.ProxyMeter) -> TensorMetricGauges:
        attributes = getattr(meter, "_attributes", None)
        if isinstance(attributes, Mapping):
            attributes = tuple(sorted((str(k), str(v)) for k, v in attributes.items()))
        key = (meter.name, meter.version, meter.schema_url, attributes)
        with _LOCK:
            gauges = _BY_SCOPE.get(key)
            if gauges is not None:
                return gauges
            gauges = _BY_SCOPE[key] = cls(meter)
        meter.on_rebind(gauges._follow)  # outside _LOCK: the proxy's lock comes first
        return gauges

    def _follow(self, real: Meter) -> None:
        """The scope records into ``real`` from now on (a rebind of the proxy)."""
        target = TensorMetricGauges.for_meter(real)
        previous, self._target = self._target, target
        if previous is target:
            return
        target._cover(self.families)
        if previous is not None:
            with previous._lock:
                previous._followers[:] = [f for f in previous._followers if f is not self]
            for gauges in self._read_with():  # a finished run's values stay with its pipeline
                with gauges._lock:
                    gauges._retired.clear()
        with target._lock:
            target._followers.append(self)
