"""Megatron-LM's training metrics as OpenTelemetry instruments: a drop-in for its module.

This module exposes the module-level names of Megatron-LM's
``megatron/core/telemetry/training_metrics.py`` (the ``MEGATRON_TRAINING_*`` constants,
``metrics``, ``_TRAINING_INSTRUMENTS``, ``_get_training_instruments`` and
``record_training_metrics``) with the same behaviour: one synchronous Histogram, six Gauges and
one Counter per meter, created on first use and cached in a ``weakref.WeakKeyDictionary`` keyed
by the meter; ``None`` is skipped, ``0.0`` is recorded, the counter is added only when > 0; a
meter whose instrument creation fails is logged and not cached; no point attributes.

What it adds, without changing what Megatron-LM's own tests see:

- Values may be anything ``float()`` takes, numpy scalars, or 0-d torch tensors.
- A tensor on an asynchronous device (CUDA) is never read on the calling thread: a
  non-blocking copy into pinned host memory and a CUDA event are queued, and a background
  thread (``otel-training-deferred``) waits for the event and records the value. Values of
  later calls queue behind it, so the order of points is kept. ``force_flush`` drains the queue.
- NaN and infinity are not passed to the SDK (which would drop them silently): they are counted
  per metric by the counter ``megatron.training.nonfinite_values`` (attribute
  ``megatron.training.metric``), created on the first non-finite value, and one warning per
  metric says so.
- Values that cannot be numbers, and negative step durations, are dropped with one warning per
  metric and cause. Nothing here raises.
- A call with a value of a log interval (any but the step duration) notes in the health ledger
  the step those values describe (``dl.training.progress.logged_iteration``, exported beside
  them), so that a report places each value at its step
  (:meth:`otel_training.health.ledger.Ledger.training_logged`).
- Where the embedded default writes span JSON lines, each call with a value of a log interval
  also queues one ``training_values`` line there (its step, time and values: every logged
  value, not only the last one of each export; ``docs/spans.md``). The training thread only
  appends to the writer's bounded queue; a call with device values queues it behind them.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from otel_training._log_once import LogOnce
from otel_training.health.ledger import LEDGER
from otel_training.metrics.device_reads import PendingDeviceRead, device_type, start_device_read
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_METRIC,
    MEGATRON_TRAINING_NONFINITE_VALUES,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
    METRICS,
)

try:
    from opentelemetry import metrics
    from opentelemetry.metrics import NoOpMeter as _NoOpMeter
except ImportError:  # pragma: no cover - opentelemetry-api is a dependency
    metrics = None

    class _NoOpMeter:  # type: ignore[no-redef]
        pass


__all__ = [
    "MEGATRON_TRAINING_GRAD_NORM",
    "MEGATRON_TRAINING_LEARNING_RATE",
    "MEGATRON_TRAINING_LOSS",
    "MEGATRON_TRAINING_MEMORY_ALLOCATED_GB",
    "MEGATRON_TRAINING_SKIPPED_ITERS",
    "MEGATRON_TRAINING_STEP_DURATION_MS",
    "MEGATRON_TRAINING_THROUGHPUT_TFLOPS",
    "MEGATRON_TRAINING_TOKENS_PER_SEC",
    "TRAINING_VALUES",
    "flush_deferred",
    "record_training_metrics",
    "write_values_to",
]

_logger = logging.getLogger(__name__)
_TRAINING_INSTRUMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Meters that stand for another one: otel_training's proxy (it follows the configured
# pipeline) and the OpenTelemetry API's own, once the global provider is set.
_PROXY_METERS: frozenset[type] = frozenset()
try:
    from opentelemetry.metrics._internal import _ProxyMeter as _ApiProxyMeter

    from otel_training._providers import ProxyMeter

    _PROXY_METERS = frozenset({ProxyMeter, _ApiProxyMeter})
except ImportError:  # pragma: no cover - opentelemetry-api is a dependency
    pass

# Our additions live apart from _TRAINING_INSTRUMENTS, whose contents Megatron-LM's tests see.
_NONFINITE_COUNTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FAILED_METERS: weakref.WeakSet = weakref.WeakSet()
_said = LogOnce(_logger)
#: Calls given a step duration in this process: the step count when no phase reports one.
_steps_recorded = 0

#: The ``record`` of a span JSON line that holds one call's values of a log interval.
TRAINING_VALUES = "training_values"
# Where each call's values go as a ``training_values`` record (configure() sets it where the
# embedded default writes span JSON lines), or None: then no record is made at all.
_values_sink: Callable[[dict[str, Any]], None] | None = None

# argument name -> (metric name, factory); the counter is the only "add" instrument.
_SPECS = {
    "step_duration_ms": (MEGATRON_TRAINING_STEP_DURATION_MS, "create_histogram"),
    "loss": (MEGATRON_TRAINING_LOSS, "create_gauge"),
    "throughput_tflops": (MEGATRON_TRAINING_THROUGHPUT_TFLOPS, "create_gauge"),
    "grad_norm": (MEGATRON_TRAINING_GRAD_NORM, "create_gauge"),
    "skipped_iters": (MEGATRON_TRAINING_SKIPPED_ITERS, "create_counter"),
    "learning_rate": (MEGATRON_TRAINING_LEARNING_RATE, "create_gauge"),
    "tokens_per_sec": (MEGATRON_TRAINING_TOKENS_PER_SEC, "create_gauge"),
    "memory_allocated_gb": (MEGATRON_TRAINING_MEMORY_ALLOCATED_GB, "create_gauge"),
}


def _get_training_instruments(meter) -> dict:
    """Returns the eight instruments of ``meter``, creating and caching them on first use.

    Raises:
        Exception: whatever the meter's factories raise; the meter is then not cached.
    """
    instruments = _TRAINING_INSTRUMENTS.get(meter)
    if instruments is None:
        instruments = {}
        for key, (name, factory) in _SPECS.items():
            spec = METRICS[name]
            kwargs = {"name": name, "description": spec.description}
            if spec.unit:
                kwargs["unit"] = spec.unit
            instruments[key] = getattr(meter, factory)(**kwargs)
        _TRAINING_INSTRUMENTS[meter] = instruments
    return instruments


def record_training_metrics(
    meter,
    step_duration_ms: float | None = None,
    loss: float | None = None,
    throughput_tflops: float | None = None,
    grad_norm: float | None = None,
    skipped_iters: int | None = None,
    learning_rate: float | None = None,
    tokens_per_sec: float | None = None,
    memory_allocated_gb: float | None = None,
) -> None:
    """Records Megatron-LM's training metrics on ``meter``'s cached instruments.

    Call it once per optimizer step with ``step_duration_ms`` (one histogram point per step),
    and once per log interval with the gauges and ``skipped_iters``. Each value may be a number,
    a string ``float()`` accepts, a numpy scalar or a 0-d torch tensor; ``None`` is skipped.

    Args:
        meter: An OpenTelemetry ``Meter`` (SDK, proxy or no-op).
        step_duration_ms: Duration of one optimizer step, milliseconds (>= 0).
        loss: Training loss, mean over the micro-batches of the interval's optimizer steps.
        throughput_tflops: Model TFLOP/s per GPU (1e12 FLOP/s).
        grad_norm: Global L2 norm of the gradients, before clipping.
        skipped_iters: Optimizer steps skipped since the last call; added only when > 0.
        learning_rate: The scheduler's current learning rate.
        tokens_per_sec: Tokens per second; the caller says whether global or per GPU.
        memory_allocated_gb: Allocated device memory in GiB (2^30 bytes) despite the name.

    Never raises: bad values are dropped with one warning per metric and cause; NaN and
    infinity are counted by ``megatron.training.nonfinite_values``. Runs on the calling thread
    without reading device tensors (see the module docstring) and without I/O. On a no-op
    meter (a disabled SDK, a rank that does not export) nothing is recorded but the same
    warnings are given, and device values are not read at all.
    """
    global _steps_recorded
    if metrics is None or _forked_child:
        return
    if type(meter) in _PROXY_METERS:  # record on the real meter it stands for now
        meter = meter._real_meter or meter

    try:
        instruments = _get_training_instruments(meter)
    except Exception:
        try:
            first_failure = meter not in _FAILED_METERS
            _FAILED_METERS.add(meter)
        except TypeError:  # not weak-referenceable (None, a str...): once per type
            first_failure = _said.due(("meter", type(meter).__name__))
        if first_failure:
            _logger.warning("Failed to create training metric instruments", exc_info=True)
        return

    # Fast path, inlined because it runs for every value: a finite float (a non-negative one
    # for the histogram, a non-negative int for the counter) while nothing is queued.
    # `v - v == 0.0` is False exactly for NaN and +-inf. Everything else goes through _emit.
    fast = not _deferred.pending
    # The numbers of the values that take the slow path, for this call's record (if any).
    values: dict[str, Any] | None = {} if _values_sink is not None else None
    v = step_duration_ms
    if v is not None:
        if fast and type(v) is float and v >= 0.0 and v - v == 0.0:
            instruments["step_duration_ms"].record(v)
        else:
            _emit(meter, "step_duration_ms", instruments["step_duration_ms"].record, v)
    v = loss
    if v is not None:
        if fast and type(v) is float and v - v == 0.0:
            instruments["loss"].set(v)
        else:
            _emit(meter, "loss", instruments["loss"].set, v, values)
    v = throughput_tflops
    if v is not None:
        if fast and type(v) is float and v - v == 0.0:
            instruments["throughput_tflops"].set(v)
        else:
            _emit(meter, "throughput_tflops", instruments["throughput_tflops"].set, v, values)
    v = grad_norm
    if v is not None:
        if fast and type(v) is float and v - v == 0.0:
            instruments["grad_norm"].set(v)
        else:
            _emit(meter, "grad_norm", instruments["grad_norm"].set, v, values)
    v = skipped_iters
    if v is not None and not (type(v) is int and v == 0):  # > 0 is rare: kept within int64
        _emit(meter, "skipped_iters", instruments["skipped_iters"].add, v)
    v = learning_rate
    if v is not None:
        if fast and type(v) is float and v - v == 0.0:
            instruments["learning_rate"].set(v)
        else:
            _emit(meter, "learning_rate", instruments["learning_rate"].set, v, values)
    v = tokens_per_sec
    if v is not None:
        if fast and type(v) is float and v - v == 0.0:
            instruments["tokens_per_sec"].set(v)
        else:
            _emit(meter, "tokens_per_sec", instruments["tokens_per_sec"].set, v, values)
    v = memory_allocated_gb
    if v is not None:
        if fast and type(v) is float and v - v == 0.0:
            instruments["memory_allocated_gb"].set(v)
        else:
            _emit(meter, "memory_allocated_gb", instruments["memory_allocated_gb"].set, v, values)
    if step_duration_ms is not None:
        _steps_recorded += 1
    if (
        loss is not None
        or learning_rate is not None
        or grad_norm is not None
        or tokens_per_sec is not None
        or throughput_tflops is not None
        or memory_allocated_gb is not None
        or skipped_iters is not None
    ):
        step = LEDGER.training_logged(steps_recorded=_steps_recorded or None)
        sink = _values_sink
        if sink is not None and values is not None:
            _keep_values(sink, step, values, loss, learning_rate, grad_norm, tokens_per_sec,
                         throughput_tflops, memory_allocated_gb)  # fmt: skip


def _keep_values(
    sink: Callable[[dict[str, Any]], None],
    step: int | None,
    values: dict[str, Any],
    *gauges: Any,
) -> None:
    """Hands one call's record of values to ``sink``: now, or behind the call's values in the
    deferred queue when some are still being read. ``gauges``: the six gauge arguments in the
    order of :data:`_LOGGED`. Never raises."""
    try:
        for key, value in zip(_LOGGED, gauges):
            if type(value) is float:  # the fast path's values (NaN too: it stays visible)
                values[_SPECS[key][0]] = value
        record = {"record": TRAINING_VALUES, "time_ns": time.time_ns(), "step": step,
                  "values": values}  # fmt: skip
        if _deferred.pending:
            _deferred.submit(None, _VALUES, sink, record)
        elif values:
            sink(record)
    except Exception:
        _warn_once("values", "record", "a record of training values was lost", exc=True)


#: The gauge arguments whose every value a ``training_values`` record keeps.
_LOGGED = (
    "loss", "learning_rate", "grad_norm", "tokens_per_sec", "throughput_tflops",
    "memory_allocated_gb",
)  # fmt: skip
#: The key of a deferred item that is a call's record of values, handed to its sink.
_VALUES = "values"


def write_values_to(sink: Callable[[dict[str, Any]], None] | None) -> None:
    """Hands each later call's values of a log interval to ``sink`` as one
    ``training_values`` record (``{"record", "time_ns", "step", "values"}``, ``values`` by
    metric name; ``None`` stops). Called by ``configure()`` with the span JSON lines' writer
    (``docs/spans.md``). ``sink`` runs on the calling thread, or on the deferred reader's
    thread for a call with device values, and must only queue (no I/O) and never raise."""
    global _values_sink
    _values_sink = sink


def _emit(meter, key: str, write, value, values: dict[str, Any] | None = None) -> None:
    """Validates one value off the fast path and writes it, now or through the deferred
    queue; its number goes into ``values`` (a call's record) once known. Never raises."""
    try:
        _emit_slow(meter, key, write, value, values)
    except Exception:  # never raise on the hot path
        _warn_once(key, "error", "dropping a value of %s: it could not be recorded", key, exc=True)


def _write(meter, key: str, write, value) -> None:
    """Writes a finite number, applying the per-metric rules of Megatron-LM."""
    if key == "skipped_iters":
        if value > 0:
            _add_counted(meter, key, write, value)
        elif value < 0:
            _warn_once(key, "negative", "dropping negative skipped_iters=%r", value)
        return
    if key == "grad_norm":
        value = float(value)
    elif key == "step_duration_ms" and value < 0:
        _warn_once(key, "negative", "dropping negative step_duration_ms=%r", value)
        return
    write(value)


def _emit_slow(meter, key: str, write, value, values: dict[str, Any] | None = None) -> None:
    recording = not isinstance(meter, _NoOpMeter)  # a no-op meter: checked, never read
    if device_type(value) not in (None, "cpu"):
        if recording:
            _deferred.submit(meter, key, write, start_device_read(value), values)
        return
    number = _to_number(key, value)
    if number is None:
        return
    if values is not None:
        values[_SPECS[key][0]] = number
    if _deferred.pending and recording:
        _deferred.submit(meter, key, write, number)
        return
    _finish(meter, key, write, number)


def _finish(meter, key: str, write, number) -> None:
    if isinstance(number, float) and not math.isfinite(number):
        _count_nonfinite(meter, key, number)
        return
    _write(meter, key, write, number)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# The running total of each meter's skipped_iters counter, so that it never leaves int64 (an
# OTLP sum beyond it fails every later export of the whole batch). Apart from
# _TRAINING_INSTRUMENTS, whose contents Megatron-LM's tests see.
_COUNTER_TOTALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_totals_lock = threading.Lock()


def _add_counted(meter, key: str, write, value) -> None:
    """Adds ``value`` (a number > 0) to the counter as a whole number, saturating its total
    at int64's maximum with one warning; a value that is not whole is dropped with one
    warning (a counter of iterations counts whole ones)."""
    if isinstance(value, float):
        if not value.is_integer():
            _warn_once(key, "fraction", "dropping %s=%r: not a whole number", key, value)
            return
        value = int(value)
    with _totals_lock:
        total = _COUNTER_TOTALS.get(meter, 0)
        room = _INT64_MAX - total
        if value > room:
            _warn_once(
                key,
                "saturated",
                "%s reached the int64 maximum (OTLP carries int64 only); it stays there "
                "(this warning is shown once)",
                _SPECS[key][0],
            )
            value = room
        _COUNTER_TOTALS[meter] = total + value
    if value > 0:
        write(value)


def _to_number(key: str, value) -> float | int | None:
    """``value`` as an int or float, or ``None`` after one warning. Reads CPU tensors only.

    Ints outside int64 become floats (OTLP carries int64 only: one such int would fail every
    later export of the whole batch); tensors are detached first (no autograd warning).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = int(value)
        if _INT64_MIN <= value <= _INT64_MAX or key == "skipped_iters":
            return value
    detach = getattr(value, "detach", None)
    if callable(detach):
        value = detach()
    try:
        if getattr(value, "ndim", 0) and getattr(value, "size", None) == 1:
            value = value.reshape(())  # a one-element array, like a one-element tensor
        if key == "skipped_iters" and callable(getattr(value, "item", None)):
            item = value.item()
            if isinstance(item, int) and not isinstance(item, bool):
                return item
        return float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:
        _warn_once(
            key,
            f"type:{type(value).__name__}",
            "dropping %s=%r: not a number (%s)",
            key,
            _short_repr(value),
            error,
        )
        return None


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _count_nonfinite(meter, key: str, value: float) -> None:
    name = _SPECS[key][0]
    _warn_once(
        key,
        "nonfinite",
        "%s received a non-finite value (%r); the SDK would drop it silently, so it is not "
        "recorded and is counted by %s{%s=%s} instead (this warning is shown once).",
        name,
        value,
        MEGATRON_TRAINING_NONFINITE_VALUES,
        MEGATRON_TRAINING_METRIC,
        name,
    )
    try:
        counter = _NONFINITE_COUNTERS.get(meter)
        if counter is None:
            spec = METRICS[MEGATRON_TRAINING_NONFINITE_VALUES]
            counter = meter.create_counter(
                name=MEGATRON_TRAINING_NONFINITE_VALUES,
                unit=spec.unit,
                description=spec.description,
            )
            _NONFINITE_COUNTERS[meter] = counter
        counter.add(1, {MEGATRON_TRAINING_METRIC: name})
    except Exception:
        _warn_once(key, "nonfinite-counter", "could not count a non-finite %s", name, exc=True)


def _warn_once(key: str, cause: str, message: str, *args, exc: bool = False) -> None:
    _said((key, cause), message, *args, exc_info=exc)


class _DeferredRecorder:
    """FIFO of values whose read must not happen on the training thread.

    One daemon thread, started on first use (and again in a forked child), waits for each
    device copy and records the value. ``pending`` is read on the hot path without a lock: a
    stale read only routes one value through the queue, which is still correct.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: collections.deque = collections.deque()
        self._thread: threading.Thread | None = None
        self.pending = 0

    def submit(
        self, meter, key: str, write, value: Any, values: dict[str, Any] | None = None
    ) -> None:
        """Queues ``value`` of ``key`` to be written by ``write`` on the meter (its number
        also into ``values``, a call's record); key :data:`_VALUES`: ``write(value)``, a
        call's record handed to its sink after the values queued before it."""
        with self._lock:
            self._queue.append((meter, key, write, value, values))
            self.pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="otel-training-deferred", daemon=True
                )
                self._thread.start()
            self._ready.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    self._ready.wait()
                meter, key, write, value, values = self._queue[0]
            try:
                if key is _VALUES:
                    if value["values"]:
                        write(value)
                else:
                    if isinstance(value, PendingDeviceRead):
                        value = value.result()
                    number = _to_number(key, value)
                    if number is not None:
                        if values is not None:
                            values[_SPECS[key][0]] = number
                        _finish(meter, key, write, number)
            except Exception:
                _warn_once(key, "deferred", "a deferred value of %s was lost", key, exc=True)
            with self._lock:
                self._queue.popleft()
                self.pending -= 1
                self._ready.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Waits until every queued value is recorded; False when ``timeout_s`` ran out."""
        with self._lock:
            return self._ready.wait_for(lambda: not self._queue, timeout=timeout_s)

    def _after_fork_in_child(self) -> None:
        # The thread did not survive the fork; a child records its own values only.
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue = collections.deque()
        self._thread = None
        self.pending = 0


_deferred = _DeferredRecorder()

# In a forked child (a DataLoader worker) the parent's instruments are not recorded on: their
# exporters drop a child's exports anyway, and the SDK's aggregation locks may have been held
# by another thread at fork time. configure() in the child lifts this.
_forked_child = False


def _after_fork_in_child() -> None:
    global _forked_child
    _forked_child = True
    _deferred._after_fork_in_child()


def record_in_this_process() -> None:
    """Lets a forked child record again (called by ``configure()`` in that child)."""
    global _forked_child
    _forked_child = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def flush_deferred(timeout_s: float | None = None) -> bool:
    """Waits until values queued by :func:`record_training_metrics` are recorded.

    Args:
        timeout_s: Upper bound in seconds; ``None`` waits as long as it takes.

    Returns:
        True when the queue is empty, False when the timeout ran out first. Never raises.
    """
    return _deferred.flush(timeout_s)
