"""The tensor-metric executor: every metric due in a step, in a few batched kernels, a few packed
collectives and one device-to-host copy.

What it improves on Megatron-LM's executor (``megatron/training/tensor_metrics/core.py``):

- Collectives are packed across **all** metrics due in the step, not within one metric: each
  round of stages makes one ``all_reduce`` per (axis, op, dtype, device).
- All of the step's results are written into one device buffer and copied to the host in one
  non-blocking copy into pinned memory, followed by a CUDA event; the values are published
  once the event has completed, which :meth:`TensorMetricExecutor.poll` checks without
  blocking. Megatron-LM copies every scalar with its own ``.item()`` (one device sync each).
- Parameters and gradients are reduced with multi-tensor kernels
  (:func:`~otel_training.tensor.norms.batched_norms`: ``torch._foreach_norm`` per device and
  dtype) instead of one kernel per tensor.

On CPU the same code runs synchronously: the copy is a host memcpy and the values are
published before :meth:`~TensorMetricExecutor.run` returns. Process groups are passed in by
the caller, by axis name; an axis without a process group has one rank and needs no
communication. Nothing here is global: each executor has its own groups, buffers and store.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from otel_training import configuration
from otel_training._log_once import MINUTE_S, LogOnce
from otel_training.tensor.metric import (
    GLOBAL,
    CollectiveRequest,
    FamilyValues,
    Final,
    Rows,
    Stage,
    TensorMetric,
)

__all__ = [
    "ExecutorStats",
    "ProcessGroupAxes",
    "PublishedValues",
    "TensorMetricExecutor",
]

_logger = logging.getLogger(__name__)
_warn = LogOnce(_logger, interval_s=MINUTE_S)
_DISTRIBUTED = torch.distributed.is_available()
_FLOAT32 = torch.float32


class ProcessGroupAxes:
    """Named process-group axes: ``{"dp": group, "tp": group}``. Implements :class:`Axes`.

    An axis that is not named, or any axis while ``torch.distributed`` is not initialised, has
    one rank: reducing over it is the identity and needs no collective.
    """

    def __init__(self, groups: Mapping[str, Any] | None = None) -> None:
        self._groups: dict[str, Any] = dict(groups or {})
        self._cache: dict[str, tuple[int, int]] = {}
        self._version = 0
        self._versions = ((0, False), (0, True))  # made once per add(): read every due step

    def add(self, axis: str, group: Any) -> None:
        """Names ``group`` as ``axis`` unless the axis already has a group."""
        if axis not in self._groups:
            self._groups[axis] = group
            self._cache.pop(axis, None)
            self._version += 1
            self._versions = ((self._version, False), (self._version, True))

    @property
    def version(self) -> tuple[int, bool]:
        """Changes when an axis is added or ``torch.distributed`` gets initialised: metrics
        cache per-axis facts by it."""
        return self._versions[_DISTRIBUTED and torch.distributed.is_initialized()]

    def group(self, axis: str) -> Any:
        """The process group of ``axis`` (``None`` when not named)."""
        return self._groups.get(axis)

    def _rank_size(self, axis: str) -> tuple[int, int]:
        cached = self._cache.get(axis)
        if cached is not None:
            return cached
        group = self._groups.get(axis)
        if group is None:  # until add() names it, the axis has one rank
            self._cache[axis] = (0, 1)
            return (0, 1)
        dist = torch.distributed
        if not (_DISTRIBUTED and dist.is_initialized()):
            return (0, 1)
        value = (dist.get_rank(group), dist.get_world_size(group))
        self._cache[axis] = value
        return value

    def size(self, axis: str) -> int:
        """Number of ranks along ``axis``."""
        return self._rank_size(axis)[1]

    def rank(self, axis: str) -> int:
        """This process's rank along ``axis``."""
        return self._rank_size(axis)[0]

    @property
    def names(self) -> tuple[str, ...]:
        """The named axes."""
        return tuple(self._groups)


class PublishedValues:
    """The last published host values of every metric family: what observable gauges read.

    Publishing updates the mapping of sources in one ``dict.update`` (atomic under the GIL: the
    keys are strings), so :meth:`observe` never waits and never sees half a publication. Each
    family keeps the values of the last step that produced it. A metric's host values are
    turned into labelled values (its ``finish``) on the first read, so that work runs on the
    reader's thread. At most ``max_series`` values per family are kept (the ``global`` value
    first, then layers in order); the rest are dropped with one warning.
    """

    def __init__(self, max_series: int = 1000) -> None:
        if max_series < 1:
            raise ValueError(f"max_series must be >= 1, got {max_series}")
        self.max_series = max_series
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()

    def publish(self, step: int, families: Iterable[FamilyValues]) -> None:
        """Makes ``families`` the current values of their families (values are copied)."""
        found: dict[str, tuple[tuple, np.ndarray]] = {}
        for fv in families:
            _merge(found, fv, self.max_series, id(self))
        self._swap(dict.fromkeys(found, _Ready(step, found)))

    def publish_step(self, source: _HostStep) -> None:
        """Makes ``source``, one due step's host values of every metric (the executor's), the
        current source of its metrics' families (a family that two metrics publish: the
        later one's)."""
        update = {}
        for metric, _ in source.items:
            for family in metric.families:
                update[family] = source
        self._swap(update)

    def _swap(self, update: Mapping[str, Any]) -> None:
        if not update:
            return
        with self._lock:  # writers in step order; readers never take it
            self._values.update(update)

    def observe(self, family: str) -> list[tuple[Mapping[str, str | int], float]]:
        """The current ``(attributes, value)`` pairs of ``family``. Never blocks; any thread."""
        source = self._values.get(family)
        if source is None:
            return []
        found = source.family(family, self.max_series)
        if found is None:
            return []
        return list(zip(found[0], found[1].tolist()))

    def step(self, family: str) -> int | None:
        """The step whose values ``family`` holds, or ``None`` before the first."""
        source = self._values.get(family)
        return None if source is None else source.step

    @property
    def families(self) -> tuple[str, ...]:
        """The families published so far."""
        return tuple(self._values)


class _Ready:
    """Labelled values published as they are (:meth:`PublishedValues.publish`)."""

    __slots__ = ("step", "found")

    def __init__(self, step: int, found: dict[str, tuple[tuple, np.ndarray]]) -> None:
        self.step, self.found = step, found

    def family(self, family: str, max_series: int) -> tuple[tuple, np.ndarray] | None:
        return self.found.get(family)


@dataclass
class ExecutorStats:
    """Counters of one executor, for tests and benchmarks.

    Attributes:
        due_steps: Steps whose metrics were submitted.
        host_copies: Device-to-host copies made (one per device per due step).
        collectives: ``all_reduce`` calls made.
        published: Due steps whose values were published.
        dropped: Due steps skipped because ``max_pending`` copies were still in flight.
        failures: Metric computations that raised and were dropped.
    """

    due_steps: int = 0
    host_copies: int = 0
    collectives: int = 0
    published: int = 0
    dropped: int = 0
    failures: int = 0


@dataclass
class _Pending:
    step: int
    host: torch.Tensor
    event: Any
    items: list[tuple[TensorMetric, Final]]
    #: The 1-D fp32 values of each item, as they were gathered (their sizes cut ``host``).
    values: list[torch.Tensor] = field(repr=False)
    device_buffer: torch.Tensor = field(repr=False)


class TensorMetricExecutor:
    """Runs the due metrics of a step and publishes their values to :attr:`published`.

    Args:
        process_groups: Axis name -> ``torch.distributed`` process group, for example
            ``{"dp": dp_group, "tp": tp_group}``. Axes not named have one rank.
        published: Where values go (a new :class:`PublishedValues` by default).
        max_pending: Copies allowed in flight; a due step beyond that is skipped (and counted
            in ``stats.dropped``) instead of queueing device work without bound.
        flush_on_shutdown: Register with :func:`otel_training.configuration.add_flush_hook` so that
            ``force_flush()``/``shutdown()`` publish completed values before the final
            collection (waiting up to the flush timeout, on the flushing thread).

    Raises:
        ValueError: when ``max_pending`` < 1.
    """

    def __init__(
        self,
        process_groups: Mapping[str, Any] | None = None,
        *,
        published: PublishedValues | None = None,
        max_pending: int = 4,
        flush_on_shutdown: bool = True,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.axes = ProcessGroupAxes(process_groups)
        self.published = published if published is not None else PublishedValues()
        self.stats = ExecutorStats()
        self._max_pending = max_pending
        self._pending: collections.deque[_Pending] = collections.deque()
        self._lock = threading.Lock()
        self._pinned: dict[int, list[torch.Tensor]] = {}
        self._ref = weakref.ref(self)
        self._remove_hook = None
        if flush_on_shutdown:
            ref = weakref.ref(self)

            def flush_hook(timeout_s: float) -> None:
                live = ref()
                if live is not None:
                    live.flush(timeout_s)

            self._remove_hook = configuration.add_flush_hook(flush_hook)
            weakref.finalize(self, self._remove_hook)

    # -- the training thread ------------------------------------------------------------

    def run(self, step: int, work: Sequence[tuple[TensorMetric, Rows]]) -> None:
        """Reduces, packs collectives, copies to host once, and publishes (CPU) or queues the
        copy (CUDA). Runs on the training thread; never reads device values and never raises:
        a metric that raises is dropped for the step with a warning (at most once a minute per
        metric and cause)."""
        try:
            self._run(step, work)
        except Exception as error:  # a collective or a copy failed: drop the step
            self.stats.failures += 1
            _warn(
                ("run", id(self), type(error)),
                "tensor metrics of step %d dropped: %r",
                step,
                error,
                exc_info=True,
            )

    def _run(self, step: int, work: Sequence[tuple[TensorMetric, Rows]]) -> None:
        if self._pending:
            self.poll()
        if len(self._pending) >= self._max_pending:
            self.stats.dropped += 1
            _warn(
                ("backlog", id(self)),
                "tensor metrics of step %d skipped: %d device-to-host copies still in flight "
                "(the device is behind); values resume when they complete.",
                step,
                len(self._pending),
            )
            return
        axes = self.axes
        finals: list[tuple[TensorMetric, Final]] = []
        active: list[tuple[TensorMetric, Stage]] = []
        for metric, rows in work:
            try:
                out = metric.start(rows, axes)
            except Exception as error:
                self._failed(metric, error)
                continue
            (finals if type(out) is Final else active).append((metric, out))
        while active:
            self._reduce([stage.requests for _, stage in active])
            current, active = active, []
            for metric, stage in current:
                try:
                    out = metric.resume(stage.state, [r.tensor for r in stage.requests], axes)
                except Exception as error:
                    self._failed(metric, error)
                    continue
                (finals if type(out) is Final else active).append((metric, out))
        if not finals:
            return
        late = [final.requests for _, final in finals if final.requests]
        if late:  # e.g. the pipeline-wide global values: one collective per op for all
            self._reduce(late)
        self.stats.due_steps += 1
        first = finals[0][1].values
        index = first.get_device()  # an int: cheaper than comparing devices
        for _, final in finals:
            if final.values.get_device() != index:  # a model over several devices
                by_device: dict[torch.device, list[tuple[TensorMetric, Final]]] = {}
                for metric, final in finals:
                    by_device.setdefault(final.values.device, []).append((metric, final))
                for device, items in by_device.items():
                    self._copy(step, device, items)
                break
        else:
            self._copy(step, first.device, finals)
        if self._pending:
            self.poll()

    def _failed(self, metric: TensorMetric, error: Exception) -> None:
        self.stats.failures += 1
        _warn(
            (id(self), metric.name, type(error)),
            "tensor metric %s failed and is dropped for this step: %r",
            metric.name,
            error,
            exc_info=True,
        )

    def _reduce(self, request_lists: Sequence[Sequence[CollectiveRequest]]) -> None:
        groups: dict[tuple, list[CollectiveRequest]] = {}
        for requests in request_lists:
            for request in requests:
                key = (request.axis, request.op, request.tensor.dtype, request.tensor.device)
                groups.setdefault(key, []).append(request)
        dist = torch.distributed
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        for (axis, op, _, _), requests in groups.items():
            if self.axes.size(axis) <= 1:
                continue
            group = self.axes.group(axis)
            tensors = [r.tensor for r in requests]
            if len(tensors) == 1 and tensors[0].is_contiguous():
                dist.all_reduce(tensors[0], op=ops[op], group=group)
            else:
                flat = torch.cat([t.reshape(-1) for t in tensors])
                dist.all_reduce(flat, op=ops[op], group=group)
                chunks = flat.split([t.numel() for t in tensors])
                torch._foreach_copy_(tensors, [c.view_as(t) for c, t in zip(chunks, tensors)])
            self.stats.collectives += 1

    def _copy(self, step: int, device: torch.device, items) -> None:
        values = []
        for _, final in items:
            value = final.values
            if value.dim() != 1:
                value = value.reshape(-1)
            if value.dtype is not _FLOAT32:
                value = value.float()
            values.append(value)
        self.stats.host_copies += 1
        if self._is_host(device):
            # Host memory already: the one copy gathers every value into a fresh buffer, and
            # the values are published now (synchronously, as there is nothing to wait for).
            host = torch.cat(values) if len(values) > 1 else values[0].clone()
            with self._lock:
                self._publish(step, host.numpy(), items, values)
            return
        buffer = values[0] if len(values) == 1 else torch.cat(values)
        host, event = self._copy_to_host(buffer)
        with self._lock:
            self._pending.append(_Pending(step, host, event, items, values, buffer))

    @staticmethod
    def _is_host(device: torch.device) -> bool:
        """Whether values on ``device`` are host memory (published synchronously)."""
        return device.type == "cpu"

    def _copy_to_host(self, buffer: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Queues the copy of ``buffer`` into a pinned host buffer; returns it and an event
        whose ``query()`` says when the copy has landed (``None``: already landed)."""
        host = self._host_buffer(buffer.numel(), buffer.device)
        host.copy_(buffer, non_blocking=True)
        if buffer.device.type != "cuda":
            return host, None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(buffer.device))
        return host, event

    def _host_buffer(self, n: int, device: torch.device) -> torch.Tensor:
        with self._lock:
            free = self._pinned.get(n)
            if free:
                return free.pop()
        pin = device.type == "cuda"
        return torch.empty(n, dtype=torch.float32, pin_memory=pin)

    # -- any thread -----------------------------------------------------------------------

    def poll(self) -> int:
        """Publishes every copy whose event has completed, in order; never blocks on the
        device (``cudaEventQuery``). Returns the number of steps published."""
        published = 0
        with self._lock:
            while self._pending and _ready(self._pending[0].event):
                self._publish_pending(self._pending.popleft())
                published += 1
        return published

    def flush(self, timeout_s: float) -> bool:
        """Publishes pending copies, waiting up to ``timeout_s`` seconds for their events. For
        flush and shutdown, off the training thread. Returns False if some are still in flight."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            self.poll()
            with self._lock:
                if not self._pending:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)

    @property
    def pending(self) -> int:
        """Copies still in flight."""
        return len(self._pending)

    def close(self) -> None:
        """Stops taking part in flush/shutdown. Pending copies are dropped."""
        if self._remove_hook is not None:
            self._remove_hook()
            self._remove_hook = None
        with self._lock:
            self._pending.clear()

    def _publish_pending(self, pending: _Pending) -> None:
        # With self._lock held. The values leave the pinned buffer, which is then reused.
        host = pending.host.numpy().copy()
        if len(self._pinned) > 16:  # step shapes changed many times: start the pool afresh
            self._pinned.clear()
        self._pinned.setdefault(pending.host.numel(), []).append(pending.host)
        self._publish(pending.step, host, pending.items, pending.values)

    def _publish(self, step: int, host: np.ndarray, items, values) -> None:
        # With self._lock held, so publication keeps step order. ``finish`` runs later, on the
        # first read (the reader's thread), not here.
        sizes = [value.numel() for value in values]
        self.published.publish_step(_HostStep(step, host, items, sizes, self._ref))
        self.stats.published += 1


class _HostStep:
    """The host values of every metric of one due step, in the one buffer they were copied
    into (``host[n]``, the metrics' values one after the other), and each metric's ``finish``.

    A metric's values are finished (turned into labelled values) once, on the first read of one
    of its families: on the reader's thread, never the training thread, and only for metrics
    whose families are read. Reading never waits: two first reads at once both compute the
    same result, and either is kept.
    """

    __slots__ = ("step", "host", "items", "sizes", "executor", "_finished")

    def __init__(
        self,
        step: int,
        host: np.ndarray,
        items: Sequence[tuple[TensorMetric, Final]],
        sizes: Sequence[int],
        executor_ref,
    ) -> None:
        self.step, self.host, self.items, self.sizes = step, host, items, sizes
        self.executor = executor_ref
        self._finished: list[dict[str, tuple[tuple, np.ndarray]] | None] = [None] * len(items)

    def family(self, family: str, max_series: int) -> tuple[tuple, np.ndarray] | None:
        """The labelled values of ``family``: those of the last metric of the step that
        publishes it (finished now if not yet)."""
        items = self.items
        for index in range(len(items) - 1, -1, -1):
            if family in items[index][0].families:
                break
        else:
            return None
        found = self._finished[index]
        if found is None:
            found = self._finished[index] = self._finish(index, max_series)
        return found.get(family)

    def _finish(self, index: int, max_series: int) -> dict[str, tuple[tuple, np.ndarray]]:
        metric, final = self.items[index]
        offset = sum(self.sizes[:index])
        found: dict[str, tuple[tuple, np.ndarray]] = {}
        try:
            for fv in final.finish(self.host[offset : offset + self.sizes[index]]):
                _merge(found, fv, max_series, id(metric))
        except Exception as error:
            executor = self.executor()
            if executor is not None:
                executor.stats.failures += 1
            _warn(
                ("finish", id(self.executor), metric.name, type(error)),
                "tensor metric %s could not finish: %r",
                metric.name,
                error,
                exc_info=True,
            )
            found = {}
        return found


def _merge(found: dict, fv: FamilyValues, max_series: int, owner: int = 0) -> None:
    attributes = tuple(fv.attributes)
    values = np.array(fv.values, dtype=np.float64).ravel()
    if len(attributes) != len(values):
        raise ValueError(f"{fv.family}: {len(attributes)} attributes but {len(values)} values")
    if fv.family in found:
        attributes = found[fv.family][0] + attributes
        values = np.concatenate([found[fv.family][1], values])
    if len(values) > max_series:
        _warn(
            ("max_series", owner, fv.family),
            "%s has %d series; keeping %d (max_series) and dropping the rest.",
            fv.family,
            len(values),
            max_series,
        )
        order = sorted(range(len(values)), key=lambda i: GLOBAL not in attributes[i].values())
        order = order[:max_series]
        attributes = tuple(attributes[i] for i in order)
        values = values[order]
    found[fv.family] = (attributes, values)


def _ready(event: Any) -> bool:
    return event is None or event.query()
