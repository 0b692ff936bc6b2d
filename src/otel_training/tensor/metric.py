"""The tensor-metric interface: sites, placements, collective stages and labelled results.

Three roles, after Megatron-LM's tensor-metrics design (PRs #6647-#6650): the observer exposes
tensors at *sites*; a :class:`TensorMetric` says what to compute from them, including its
distributed reduction as *stages* of :class:`CollectiveRequest`; the executor runs every due
metric of a step together, packs compatible collectives of all metrics into one call, and
copies all results to the host at once.

The life of one metric in one due step:

1. ``accepts(site)`` picks the sites it reads.
2. ``prepare(sites, tensors)`` (parameters and gradients, at the commit point, in one batch) or
   ``prepare_forward(site, tensor)`` (activations, residual stream, logits, router logits, in a
   forward hook, once per micro-batch) reduces each tensor to a few local values on its device:
   the rows of :class:`Rows`. Raw tensors are never kept.
3. ``start(rows, axes)`` returns a :class:`Stage` of collective requests, or :class:`Final`.
   ``resume(state, reduced, axes)`` is called with the requests reduced **in place**, until it
   returns :class:`Final`. Metrics never call collectives themselves.
4. :class:`Final` holds a 1-D device tensor (the values to copy to the host), ``finish``, a
   host-side function that turns those values, once copied, into labelled results
   (:class:`FamilyValues`), and optionally ``requests``: last collectives over views of those
   values, which the executor packs across every metric of the step (the pipeline-stage
   reduction of ``global`` values). ``finish`` runs on whichever thread publishes: never on
   the device.

:class:`ShardedReductionMetric` does steps 3 and 4 for every metric that reduces with one
operation (sum or max) over the axes along which its tensors are sharded.
"""

from __future__ import annotations

import abc
import enum
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import torch

from otel_training.semconv.attributes import MEGATRON_TRAINING_LAYER

__all__ = [
    "GLOBAL",
    "PIPELINE_AXIS",
    "Axes",
    "CollectiveRequest",
    "FamilyValues",
    "Final",
    "FlatShard",
    "LabelPlan",
    "Owned",
    "Placement",
    "ReduceOpName",
    "Replicate",
    "Rows",
    "Shard",
    "ShardedReductionMetric",
    "Site",
    "SiteKind",
    "Stage",
    "TensorMetric",
    "layer_attributes",
    "layer_sort_key",
    "to_device",
]

#: The label of a value that covers every tensor of a metric.
GLOBAL = "global"

#: The process-group axis of pipeline stages. Stages hold different layers, so rows are never
#: reduced over it; only each metric's ``global`` value is (every stage then reports the
#: ``global`` of the whole model, and its own layers).
PIPELINE_AXIS = "pp"

ReduceOpName = Literal["sum", "max", "min"]


class SiteKind(str, enum.Enum):
    """What a site exposes. Parameters and gradients are read at the commit point (after the
    step's last backward, before the optimizer update); the others in forward hooks."""

    PARAMETER = "parameter"
    GRAD = "grad"
    ACTIVATION = "activation"
    RESIDUAL = "residual"
    LOGITS = "logits"
    ROUTER = "router"

    @property
    def at_commit(self) -> bool:
        """True for the kinds read at the commit point (parameters and gradients)."""
        return self in (SiteKind.PARAMETER, SiteKind.GRAD)


@dataclass(frozen=True)
class Replicate:
    """The local tensor is the whole tensor, identical on every rank of the axis: reducing over
    the axis needs no communication."""


@dataclass(frozen=True)
class Shard:
    """The local tensor is one piece of the whole, split along ``dim`` over the ranks of the
    axis (tensor parallelism, FSDP, a data-parallel batch): sums and maxima reduce over the axis.
    A rank may hold an empty piece."""

    dim: int = 0


@dataclass(frozen=True)
class FlatShard:
    """This rank's part of the tensor is the range ``[start, end)`` of its row-major flattening;
    the ranges of the axis' ranks partition the tensor, and a range may begin or end anywhere
    (the shards of Megatron-LM's distributed optimizer cut a flat buffer into equal pieces
    whatever the parameter boundaries). Sums and maxima reduce over the axis, as for
    :class:`Shard`; an empty range (``start == end``) contributes nothing.

    The local tensor is either the whole tensor, of which only the range is read (Megatron-LM's
    model parameters and ``main_grad`` views: every rank holds them whole, but only its range
    of the gradient is reduced), or the range itself (``numel == end - start``).

    Raises:
        ValueError: when ``0 <= start <= end`` does not hold.
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"FlatShard needs 0 <= start <= end, got [{self.start}, {self.end})")

    def local(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The range of ``tensor``: a 1-D view, ``[end - start]``; ``None`` when ``tensor`` is
        neither the whole tensor (numel >= end) nor the range (numel == end - start)."""
        numel = tensor.numel()
        if numel == self.end - self.start:
            return tensor.reshape(-1)
        if numel >= self.end:
            return tensor.reshape(-1)[self.start : self.end]
        return None


@dataclass(frozen=True)
class Owned:
    """Only the rank ``rank`` of the axis holds the authoritative tensor (an expert that lives on
    one rank, a master copy); the others' copies, if any, are ignored."""

    rank: int


Placement = Replicate | Shard | FlatShard | Owned


@dataclass(frozen=True, eq=False)
class Site:
    """A place where a tensor is observed.

    Sites compare and hash by identity: the observer makes each one once.

    Attributes:
        name: Canonical name: the parameter name (``decoder.layers.3.mlp.fc.weight``) or the
            module name (``decoder.layers.3.mlp``), without wrapper prefixes.
        kind: What the tensor is.
        layer: The layer label, ``decoder.layers.N`` or ``encoder.layers.N``; ``None`` outside
            every layer (such tensors count toward :data:`GLOBAL` only).
        placements: ``(axis, placement)`` pairs, one per named process-group axis along which
            the tensor is split; an axis not named is :class:`Replicate`.
        top_k: For router sites, the experts chosen per token.
    """

    name: str
    kind: SiteKind
    layer: str | None = None
    placements: tuple[tuple[str, Placement], ...] = ()
    top_k: int = 1

    def placement(self, axis: str) -> Placement:
        """The placement along ``axis`` (:class:`Replicate` when not named)."""
        for name, placement in self.placements:
            if name == axis:
                return placement
        return Replicate()

    @functools.cached_property
    def reduce_axes(self) -> tuple[str, ...]:
        """The axes a sum or max over the whole tensor must reduce over, sorted (never
        :data:`PIPELINE_AXIS`: stages hold different tensors)."""
        return tuple(
            sorted(
                a
                for a, p in self.placements
                if isinstance(p, (Shard, FlatShard, Owned)) and a != PIPELINE_AXIS
            )
        )

    @functools.cached_property
    def flat_shard(self) -> FlatShard | None:
        """The :class:`FlatShard` placement of the site, if any (at most one is supported)."""
        return next((p for _, p in self.placements if isinstance(p, FlatShard)), None)


class Axes(Protocol):
    """Rank and size of this process along each named process-group axis."""

    def size(self, axis: str) -> int:
        """Number of ranks along ``axis`` (1 when the axis has no process group)."""
        ...

    def rank(self, axis: str) -> int:
        """This process's rank along ``axis`` (0 when the axis has no process group)."""
        ...


class Rows(NamedTuple):
    """The local values of one metric for one step: one row per observation.

    Attributes:
        sites: The site of each row (a forward site appears once per micro-batch).
        values: ``values[sum(widths)]`` fp32 on one device: the rows, flattened and concatenated.
        widths: Number of values in each row.
        counts: Number of tensor elements behind each row (host integers), for means.
    """

    sites: tuple[Site, ...]
    values: torch.Tensor
    widths: tuple[int, ...]
    counts: tuple[int, ...] = ()


class CollectiveRequest(NamedTuple):
    """Reduce ``tensor`` (1-D, contiguous, on the process group's device) with ``op`` over the
    process group of ``axis``, in place. The executor packs every request of the same
    (axis, op, dtype, device) in a round, across metrics, into one collective."""

    axis: str
    op: ReduceOpName
    tensor: torch.Tensor


class Stage(NamedTuple):
    """Collectives a metric needs before it can go on; ``state`` is handed back to
    :meth:`TensorMetric.resume` with them reduced."""

    requests: tuple[CollectiveRequest, ...]
    state: Any = None


class FamilyValues(NamedTuple):
    """Labelled host values of one metric family (one observable gauge).

    Attributes:
        family: The metric name, from :mod:`otel_training.semconv.metrics`.
        attributes: One attribute mapping per value (bounded: layer labels, statistics).
        values: The values, float64, aligned with ``attributes``; non-finite values are kept
            here and dropped at export (the SDK would drop them anyway).
    """

    family: str
    attributes: tuple[Mapping[str, str | int], ...]
    values: np.ndarray


class Final(NamedTuple):
    """The end of a metric's device work: ``values`` (1-D, fp32, on the device) go to the host
    in the executor's single copy, and ``finish(host_values)`` turns them, on the host, into
    :class:`FamilyValues`. ``finish`` must not keep ``host_values`` (its memory is reused).

    ``requests`` are reduced in place after every metric of the step has reached its
    :class:`Final`, packed across metrics (one collective per axis, op, dtype and device), and
    before the copy: their tensors must be views of ``values``. The pipeline-stage reduction of
    ``global`` values uses them, so that all metrics share one ``all_reduce`` over the stages.
    """

    values: torch.Tensor
    finish: Callable[[np.ndarray], Sequence[FamilyValues]]
    requests: tuple[CollectiveRequest, ...] = ()


class TensorMetric(abc.ABC):
    """What to compute from observed tensors, including the distributed reduction.

    Subclasses set ``name`` (the schedule name, as in ``OTEL_PYTHON_TRAINING_TENSOR_METRICS``),
    ``kinds`` (the site kinds they read) and ``families`` (the metric names they publish), and
    implement ``prepare`` and/or ``prepare_forward``, ``start`` and, for multi-stage
    reductions, ``resume``. Methods run on the training thread, except ``Final.finish``.
    Every rank of an axis must produce the same requests (same sizes, same order), or the
    collective hangs: observe the same sites on every rank (an empty shard is fine).
    """

    name: str = ""
    kinds: frozenset[SiteKind] = frozenset()
    families: tuple[str, ...] = ()
    #: Set when ``prepare(sites, tensors)`` is exactly
    #: ``norms.batched_norms(tensors, batched_ord)``: the observer then computes the norms of
    #: all such metrics due in a step in one call (one multi-tensor kernel per device and dtype).
    batched_ord: float | None = None
    #: Whether ``prepare_forward`` can be traced by ``torch.compile`` (torch operations on the
    #: tensor only, no host reads, no Python side effects). Under compile, a metric that is not
    #: traceable is skipped, with one warning saying that its values are unavailable.
    traceable: bool = True

    def accepts(self, site: Site) -> bool:
        """Whether the metric reads ``site`` (default: its kind is one of ``kinds``)."""
        return site.kind in self.kinds

    def wants_commit(self, due: bool) -> bool:
        """Whether to run at this commit point; ``due`` says the schedule has it due. A metric
        with state across steps (the update ratio) may also run when not due."""
        return due

    def prepare(
        self, sites: Sequence[Site], tensors: Sequence[torch.Tensor | None]
    ) -> torch.Tensor:
        """Local values of commit-time sites, in one batch: ``values[n]`` or ``values[n, w]``
        fp32 on the tensors' device, row ``i`` for ``tensors[i]`` (``None``: no tensor, e.g. a
        parameter without gradient). Returning an empty tensor skips the metric this step."""
        raise NotImplementedError(f"{type(self).__name__} reads no commit-time site")

    def prepare_forward(self, site: Site, tensor: torch.Tensor) -> torch.Tensor:
        """Local values of one forward observation (``tensor`` is detached): a 0-d or 1-D fp32
        tensor on its device. Runs in a forward hook: queue device work only, never read it."""
        raise NotImplementedError(f"{type(self).__name__} reads no forward site")

    @abc.abstractmethod
    def start(self, rows: Rows, axes: Axes) -> Stage | Final:
        """Begins the distributed reduction of this step's rows."""

    def resume(self, state: Any, reduced: Sequence[torch.Tensor], axes: Axes) -> Stage | Final:
        """Continues after the requests of the last stage were reduced (in place)."""
        raise NotImplementedError(f"{type(self).__name__} has no second stage")


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (host memory) on ``device`` without a device sync: on CUDA through pinned
    memory and a non-blocking copy (a pageable copy would synchronise the training thread)."""
    if device.type == "cpu":
        return tensor
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


# -- labels ----------------------------------------------------------------------------------

_LAYER_NUMBER = re.compile(r"^(.*?)(\d+)$")


def layer_sort_key(label: str) -> tuple[str, int, str]:
    """Sorts layer labels by prefix, then layer number (``decoder.layers.2`` before ``.10``)."""
    match = _LAYER_NUMBER.match(label)
    if match is None:
        return (label, -1, label)
    return (match.group(1), int(match.group(2)), label)


@functools.lru_cache(maxsize=4096)
def layer_attributes(label: str) -> Mapping[str, str]:
    """The point attributes ``{megatron.training.layer: label}``, shared and read-only."""
    return MappingProxyType({MEGATRON_TRAINING_LAYER: label})


class LabelPlan:
    """Which layer each row belongs to, for one tuple of sites; built once per tuple and cached.

    Attributes:
        labels: The layer labels of the sites, sorted by :func:`layer_sort_key`.
        index: ``index[i]`` is the position in ``labels`` of row ``i``'s layer, -1 outside layers.
        in_layer: ``index >= 0``.
        attributes: Point attributes of each label, then of :data:`GLOBAL`.
    """

    __slots__ = (
        "labels",
        "index",
        "in_layer",
        "attributes",
        "_sum_matrix",
        "_signatures",
        "_keep",
    )

    def __init__(self, sites: Sequence[Site]) -> None:
        self.labels = sorted({s.layer for s in sites if s.layer is not None}, key=layer_sort_key)
        position = {label: i for i, label in enumerate(self.labels)}
        self.index = np.fromiter(
            (position.get(s.layer, -1) if s.layer is not None else -1 for s in sites),
            dtype=np.intp,
            count=len(sites),
        )
        self.in_layer = self.index >= 0
        self.attributes = (
            *(layer_attributes(label) for label in self.labels),
            layer_attributes(GLOBAL),
        )
        self._sum_matrix: np.ndarray | None = None
        self._signatures: tuple[int, Any, list[tuple[str, ...]], bool] | None = None
        self._keep: tuple[Any, torch.Tensor | None] | None = None

    def sums(self, values: np.ndarray) -> np.ndarray:
        """``values[n]`` (one per row) summed per label, then in total: ``[len(labels) + 1]``."""
        if self._sum_matrix is None:
            matrix = np.zeros((len(self.labels) + 1, len(self.index)))
            rows = np.flatnonzero(self.in_layer)
            matrix[self.index[rows], rows] = 1.0
            matrix[-1, :] = 1.0
            self._sum_matrix = matrix
        return self._sum_matrix @ values

    def maxima(self, values: np.ndarray) -> np.ndarray:
        """``values[n]`` maximised per label, then in total (-inf for nothing)."""
        out = np.full(len(self.labels) + 1, -math.inf)
        np.maximum.at(out, self.index[self.in_layer], values[self.in_layer])
        if values.size:
            out[-1] = values.max()
        return out

    def signatures(self, sites: Sequence[Site], axes: Axes) -> list[tuple[str, ...]]:
        """Per row, the axes with more than one rank that its tensor is reduced over."""
        return self._facts(sites, axes)[2]

    def is_local(self, sites: Sequence[Site], axes: Axes) -> bool:
        """Whether no row needs communication and there is one pipeline stage: the rows go to
        the host as they are."""
        return self._facts(sites, axes)[3]

    def _facts(self, sites: Sequence[Site], axes: Axes) -> tuple[Any, Any, list, bool]:
        # Kept while the same axes object says the same version (none: found again each time).
        version = getattr(axes, "version", None)
        facts = self._signatures
        if facts is None or facts[0] != id(axes) or facts[1] != version or version is None:
            found = [tuple(a for a in s.reduce_axes if axes.size(a) > 1) for s in sites]
            local = not any(found) and axes.size(PIPELINE_AXIS) <= 1
            facts = self._signatures = (id(axes), version, found, local)
        return facts

    def pipeline_keep(self, sites: Sequence[Site], axes: Axes) -> torch.Tensor | None:
        """Per row, whether it counts toward the pipeline-wide ``global`` on this stage
        (``bool[n]`` on the host): not when :class:`Owned` along :data:`PIPELINE_AXIS` by
        another stage (a tied embedding held by the first and the last stage). ``None`` when
        every row counts."""
        key = (id(axes), getattr(axes, "version", None))
        if self._keep is None or self._keep[0] != key or key[1] is None:
            rank = axes.rank(PIPELINE_AXIS)
            keep = [
                not (isinstance(p := s.placement(PIPELINE_AXIS), Owned) and p.rank != rank)
                for s in sites
            ]
            self._keep = (key, None if all(keep) else torch.tensor(keep, dtype=torch.bool))
        return self._keep[1]


class ShardedReductionMetric(TensorMetric):
    """A metric whose rows reduce with one operation (``op``) over every axis along which their
    tensors are sharded, then combine per layer on the host.

    Subclasses implement ``finish(host, rows, plan, reduced)``; they may override
    ``device_partials`` (for example, square norms into sums of squares before a sum). When no
    row needs communication (a single process, or only replicated tensors), the rows go to the
    host untouched and ``finish`` gets ``reduced=False``. Otherwise rows are grouped into runs
    with the same axes; each run is reduced over its first axis in stage 0, its second in stage
    1, and so on; rows :class:`Owned` by another rank contribute the identity of ``op``.

    Under pipeline parallelism (an axis :data:`PIPELINE_AXIS` with more than one rank) a
    subclass that implements ``global_partials`` and ``global_value`` also gets its ``global``
    value reduced over the stages: ``global_partials`` condenses the step's (reduced) rows into
    a few device values, the executor reduces those of every metric in one packed collective per
    op, and ``global_value`` turns them into the value that replaces the stage's own ``global``.
    Every stage must then run the metric, with empty rows where it has none of its sites.
    """

    op: ReduceOpName = "sum"

    def __init__(self) -> None:
        self._plans: dict[tuple[Site, ...], LabelPlan] = {}
        self._last: tuple[tuple[Site, ...], LabelPlan] | None = None

    @property
    def identity(self) -> float:
        """The identity element of ``op``."""
        return {"sum": 0.0, "max": -math.inf, "min": math.inf}[self.op]

    def device_partials(self, rows: Rows, axes: Axes) -> torch.Tensor:
        """The 1-D values to reduce over ranks (default: ``rows.values``). Called only when
        some row needs communication."""
        return rows.values

    @abc.abstractmethod
    def finish(
        self, host: np.ndarray, rows: Rows, plan: LabelPlan, reduced: bool
    ) -> list[FamilyValues]:
        """Host side: ``host`` holds the (reduced when ``reduced``) rows, flattened."""

    def global_partials(
        self, values: torch.Tensor, rows: Rows, keep: torch.Tensor | None, reduced: bool
    ) -> torch.Tensor | None:
        """Device side, under pipeline parallelism: the step's rows condensed into ``[k]`` fp32
        values that reduce over the stages with ``op`` (default ``None``: no pipeline-wide
        ``global``). ``values`` are the rows (``reduced``: the reduced partials), ``keep[n]``
        (or ``None`` for all) says which rows count toward ``global`` on this stage."""
        return None

    def global_value(self, host: np.ndarray) -> float:
        """Host side: the pipeline-wide ``global`` value from the reduced ``global_partials``."""
        raise NotImplementedError(f"{type(self).__name__} has no pipeline-wide global value")

    def label_plan(self, sites: tuple[Site, ...]) -> LabelPlan:
        """The cached :class:`LabelPlan` of ``sites`` (sites hash by identity: cheap)."""
        last = self._last
        if last is not None and last[0] is sites:  # the same sites as last step
            return last[1]
        plan = self._plans.get(sites)
        if plan is None:
            if len(self._plans) > 64:
                self._plans.clear()
            plan = self._plans[sites] = LabelPlan(sites)
        self._last = (sites, plan)
        return plan

    def start(self, rows: Rows, axes: Axes) -> Stage | Final:
        plan = self.label_plan(rows.sites)
        if plan.is_local(rows.sites, axes):  # the common case: one step's few Python calls
            return Final(rows.values, functools.partial(self._finish_local, rows, plan))
        signatures = plan.signatures(rows.sites, axes)
        if not any(signatures):
            return self._final(rows.values, rows, plan, False, axes)
        partials = self.device_partials(rows, axes)
        width = partials.numel() // max(1, sum(rows.widths))
        offsets = np.concatenate(([0], np.cumsum(rows.widths))) * width
        discard = [
            i
            for i, site in enumerate(rows.sites)
            for axis, placement in site.placements
            if isinstance(placement, Owned)
            and axis != PIPELINE_AXIS
            and axes.size(axis) > 1
            and axes.rank(axis) != placement.rank
        ]
        if discard:
            index = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in discard])
            partials[to_device(torch.from_numpy(index), partials.device)] = self.identity
        runs: list[tuple[int, int, tuple[str, ...]]] = []
        for i, signature in enumerate(signatures):
            if not signature:
                continue
            if runs and runs[-1][2] == signature and runs[-1][1] == offsets[i]:
                runs[-1] = (runs[-1][0], int(offsets[i + 1]), signature)
            else:
                runs.append((int(offsets[i]), int(offsets[i + 1]), signature))
        return self._stage(partials, runs, 0, rows, plan, axes)

    def resume(self, state: Any, reduced: Sequence[torch.Tensor], axes: Axes) -> Stage | Final:
        partials, runs, stage, rows, plan = state
        return self._stage(partials, runs, stage + 1, rows, plan, axes)

    def _stage(self, partials, runs, stage, rows, plan, axes) -> Stage | Final:
        requests = tuple(
            CollectiveRequest(signature[stage], self.op, partials[begin:end])
            for begin, end, signature in runs
            if len(signature) > stage and end > begin
        )
        if not requests:
            return self._final(partials, rows, plan, True, axes)
        return Stage(requests, (partials, runs, stage, rows, plan))

    def _final(self, values, rows: Rows, plan: LabelPlan, reduced: bool, axes: Axes) -> Final:
        if axes.size(PIPELINE_AXIS) > 1:
            keep = plan.pipeline_keep(rows.sites, axes)
            partial = self.global_partials(
                values, rows, None if keep is None else to_device(keep, values.device), reduced
            )
            if partial is not None:
                k = partial.numel()
                values = torch.cat([values.reshape(-1).float(), partial.reshape(-1).float()])
                finish = functools.partial(
                    self._finish_pipeline, rows=rows, plan=plan, reduced=reduced, k=k
                )
                request = CollectiveRequest(PIPELINE_AXIS, self.op, values[values.numel() - k :])
                return Final(values, finish, (request,))
        return Final(values, functools.partial(self._finish, rows=rows, plan=plan, reduced=reduced))

    def _finish(self, host: np.ndarray, *, rows: Rows, plan: LabelPlan, reduced: bool):
        return self.finish(host, rows, plan, reduced)

    def _finish_local(self, rows: Rows, plan: LabelPlan, host: np.ndarray):
        return self.finish(host, rows, plan, False)

    def _finish_pipeline(self, host, *, rows: Rows, plan: LabelPlan, reduced: bool, k: int):
        results = self.finish(host[: host.size - k], rows, plan, reduced)
        value = self.global_value(host[host.size - k :].astype(np.float64))
        global_attributes = layer_attributes(GLOBAL)
        out = []
        for fv in results:
            values = np.array(fv.values, dtype=np.float64)
            attributes = tuple(fv.attributes)
            found = [i for i, a in enumerate(attributes) if a is global_attributes]
            if found:
                values[found] = value
            else:  # no row on this stage: the pipeline-wide global alone
                attributes = (*attributes, global_attributes)
                values = np.append(values, value)
            out.append(FamilyValues(fv.family, attributes, values))
        return out
