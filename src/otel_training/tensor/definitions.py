"""Built-in tensor metrics, each with its formula and source.

Schedule names (``OTEL_PYTHON_TRAINING_TENSOR_METRICS``, ``TensorObserver(schedule=...)``) and
the metric families (observable gauges) they publish:

=====================  ===================================================================
``grad_norm``          ``megatron.training.tensor.grad_norm`` per layer and ``global``
``param_norm``         ``megatron.training.tensor.param_norm``
``grad_nonfinite``     ``megatron.training.tensor.grad_nonfinite``
``update_ratio``       ``megatron.training.tensor.update_ratio``
``activation_rms``     ``megatron.training.tensor.activation_rms``
``activation_max_abs`` ``megatron.training.tensor.activation_max_abs``
``residual_rms``       ``megatron.training.tensor.residual_rms``
``residual_max_abs``   ``megatron.training.tensor.residual_max_abs``
``logits_norm``        ``megatron.training.tensor.logits_norm`` (``global`` only)
``router``             ``megatron.training.tensor.router_balance`` and ``.router_entropy``
``router_expert_load`` ``megatron.training.tensor.router_expert_load`` (opt-in, capped)
=====================  ===================================================================

Layer values combine the rows of the layer's sites on the host, after the device reduction:
sums of squares add, maxima take the maximum. ``global`` covers every site of the metric.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import torch

from otel_training._log_once import MINUTE_S, LogOnce
from otel_training.config import TENSOR_METRIC_NAMES
from otel_training.semconv.attributes import (
    MEGATRON_TRAINING_LAYER,
    MEGATRON_TRAINING_ROUTER_EXPERT,
    MEGATRON_TRAINING_ROUTER_STATISTIC,
)
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_TENSOR_ACTIVATION_MAX_ABS,
    MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS,
    MEGATRON_TRAINING_TENSOR_GRAD_NONFINITE,
    MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    MEGATRON_TRAINING_TENSOR_LOGITS_NORM,
    MEGATRON_TRAINING_TENSOR_PARAM_NORM,
    MEGATRON_TRAINING_TENSOR_RESIDUAL_MAX_ABS,
    MEGATRON_TRAINING_TENSOR_RESIDUAL_RMS,
    MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
    MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY,
    MEGATRON_TRAINING_TENSOR_ROUTER_EXPERT_LOAD,
    MEGATRON_TRAINING_TENSOR_UPDATE_RATIO,
)
from otel_training.tensor.metric import (
    GLOBAL,
    Axes,
    FamilyValues,
    LabelPlan,
    Rows,
    ShardedReductionMetric,
    Site,
    SiteKind,
    TensorMetric,
    layer_attributes,
    layer_sort_key,
    to_device,
)
from otel_training.tensor.norms import batched_norms

__all__ = [
    "BUILTIN_METRICS",
    "DEFAULT_SCHEDULE",
    "ROUTER_STATISTICS",
    "L2NormMetric",
    "MaxAbsMetric",
    "NonFiniteCountMetric",
    "RmsMetric",
    "RouterMetric",
    "UpdateRatioMetric",
    "build_metric",
]

_warn = LogOnce(logging.getLogger(__name__), interval_s=MINUTE_S)

#: The schedule an observer uses when none is given in code or in the environment.
DEFAULT_SCHEDULE: tuple[tuple[str, int], ...] = (
    ("grad_norm", 10),
    ("param_norm", 10),
    ("activation_rms", 10),
    ("router", 10),
)

#: Values of ``megatron.training.router.statistic`` (the enum members in semconv/registry).
ROUTER_STATISTICS: tuple[str, ...] = ("max_over_mean", "coefficient_of_variation", "dead_fraction")


_vector_norm = torch.linalg.vector_norm
_FLOAT32 = torch.float32


def _l2(tensor: torch.Tensor) -> torch.Tensor:
    """``vector_norm`` accumulated in fp32 (``dtype=`` only when needed: it costs a little)."""
    if tensor.dtype is _FLOAT32:
        return _vector_norm(tensor)
    return _vector_norm(tensor, dtype=_FLOAT32)


def _kept(values: torch.Tensor, keep: torch.Tensor | None, width: int) -> torch.Tensor:
    """``values[n * width]`` with the rows that ``keep[n]`` rejects set to 0 (for sums)."""
    if keep is None:
        return values
    return (values.reshape(-1, width) * keep.reshape(-1, 1)).reshape(-1)


def _per_layer(family: str, plan: LabelPlan, values: np.ndarray) -> FamilyValues:
    """One value per layer label, then the global value, as :class:`FamilyValues`."""
    return FamilyValues(family, plan.attributes, values)


class _OneFamilyMetric(ShardedReductionMetric):
    """A built-in metric that publishes one family: made from its schedule name, the kinds of
    sites it reads and the name of that family."""

    def __init__(self, name: str, kinds: frozenset[SiteKind], family: str) -> None:
        super().__init__()
        self.name, self.kinds, self.families = name, kinds, (family,)


class L2NormMetric(_OneFamilyMetric):
    """L2 norm per layer and in total: ``sqrt(sum_t sum_i t_i^2)`` over the layer's tensors.

    Device: one norm per tensor, ``torch._foreach_norm`` per device and dtype for parameters and
    gradients (:func:`~otel_training.tensor.norms.batched_norms`), one
    ``torch.linalg.vector_norm`` per forward observation. Across ranks the squares are summed
    over each tensor's shard axes. Host: squares summed per layer, then the square root.

    Source: the layer-wise and global L2 tensor metrics of Megatron-LM
    (``megatron/training/tensor_metrics/definitions.py``, PR #6649); ``grad_norm`` is the
    per-layer split of ``torch.nn.utils.clip_grad_norm_``'s total norm.
    """

    op = "sum"

    batched_ord = 2.0

    def prepare(
        self, sites: Sequence[Site], tensors: Sequence[torch.Tensor | None]
    ) -> torch.Tensor:
        return batched_norms(tensors, self.batched_ord)

    def prepare_forward(self, site: Site, tensor: torch.Tensor) -> torch.Tensor:
        return _l2(tensor)

    def device_partials(self, rows: Rows, axes: Axes) -> torch.Tensor:
        return rows.values.square()

    def finish(self, host: np.ndarray, rows: Rows, plan: LabelPlan, reduced: bool):
        squares = host.astype(np.float64)
        if not reduced:
            squares *= squares
        return [_per_layer(self.families[0], plan, np.sqrt(plan.sums(squares)))]

    def global_partials(self, values, rows, keep, reduced):
        squares = values if reduced else values.square()
        return _kept(squares, keep, 1).sum().reshape(1)

    def global_value(self, host: np.ndarray) -> float:
        return math.sqrt(host[0])


class NonFiniteCountMetric(_OneFamilyMetric):
    """Number of NaN and infinite elements per layer and in total: ``sum_t #{i : t_i not
    finite}``. Device: one ``count_nonzero(~isfinite(t))`` per tensor. Source: the non-finite
    gradient check of mixed-precision training (``torch.amp.GradScaler``), split by layer."""

    op = "sum"

    def prepare(
        self, sites: Sequence[Site], tensors: Sequence[torch.Tensor | None]
    ) -> torch.Tensor:
        device = next((t.device for t in tensors if t is not None), torch.device("cpu"))
        zero = torch.zeros((), dtype=torch.int64, device=device)
        counts = [
            zero if t is None else torch.count_nonzero(~torch.isfinite(t)).to(device)
            for t in tensors
        ]
        if not counts:
            return torch.zeros(0, dtype=torch.float32)
        return torch.stack(counts).float()

    def finish(self, host: np.ndarray, rows: Rows, plan: LabelPlan, reduced: bool):
        return [_per_layer(self.families[0], plan, plan.sums(host.astype(np.float64)))]

    def global_partials(self, values, rows, keep, reduced):
        return _kept(values, keep, 1).sum().reshape(1)

    def global_value(self, host: np.ndarray) -> float:
        return float(host[0])


class UpdateRatioMetric(_OneFamilyMetric):
    """Update-to-weight ratio per layer and in total: ``||W_after - W_before||_2 /
    ||W_before||_2`` over one optimizer step.

    At the commit point of a due step the parameters are copied (one multi-tensor copy, held
    for one step); at the next commit point (after the optimizer update) the copy is
    subtracted in place and both norms are taken with ``torch._foreach_norm``, so the value of
    step ``s`` is published at step ``s + 1``. Source: the update/weight ratio heuristic of
    Karpathy's "A Recipe for Training Neural Networks" (2019) and CS231n, per layer.
    """

    op = "sum"

    def __init__(self, name: str, kinds: frozenset[SiteKind], family: str) -> None:
        super().__init__(name, kinds, family)
        self._snapshot: list[torch.Tensor] | None = None
        self._due = False

    def wants_commit(self, due: bool) -> bool:
        self._due = due
        return due or self._snapshot is not None

    def prepare(
        self, sites: Sequence[Site], tensors: Sequence[torch.Tensor | None]
    ) -> torch.Tensor:
        present = [t for t in tensors if t is not None]
        out = torch.zeros(0, dtype=torch.float32)
        if self._snapshot is not None and len(self._snapshot) == len(present):
            before = self._snapshot
            weights = batched_norms(before, 2.0)
            torch._foreach_sub_(before, present)  # W_before - W_after: same norm as the update
            updates = batched_norms(before, 2.0)
            out = torch.stack([updates, weights], dim=1)
        self._snapshot = None
        if self._due and present:
            self._snapshot = list(torch._foreach_add(present, 0.0))
        return out

    def device_partials(self, rows: Rows, axes: Axes) -> torch.Tensor:
        return rows.values.square()

    def finish(self, host: np.ndarray, rows: Rows, plan: LabelPlan, reduced: bool):
        pairs = host.astype(np.float64).reshape(-1, 2)
        if not reduced:
            pairs = pairs * pairs
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.sqrt(plan.sums(pairs[:, 0]) / plan.sums(pairs[:, 1]))
        return [_per_layer(self.families[0], plan, ratios)]

    def global_partials(self, values, rows, keep, reduced):
        squares = values if reduced else values.square()
        return _kept(squares, keep, 2).reshape(-1, 2).sum(0)

    def global_value(self, host: np.ndarray) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.sqrt(host[0] / host[1]))


class RmsMetric(_OneFamilyMetric):
    """Root mean square per layer and in total: ``sqrt(sum_t sum_i t_i^2 / sum_t numel(t))``
    over every observation of the layer's sites in the step (all micro-batches).

    Device: one ``torch.linalg.vector_norm`` per observation, in the forward hook. Element
    counts stay on the host unless a reduction over ranks needs them. Source: the activation
    RMS statistics of Megatron-LM's tensor metrics and of Wortsman et al., "Small-scale
    proxies for large-scale Transformer training instabilities" (2023).
    """

    op = "sum"

    def prepare_forward(self, site: Site, tensor: torch.Tensor) -> torch.Tensor:
        return _l2(tensor)

    def device_partials(self, rows: Rows, axes: Axes) -> torch.Tensor:
        counts = to_device(torch.tensor(rows.counts, dtype=torch.float32), rows.values.device)
        return torch.stack([rows.values.square(), counts], dim=1).reshape(-1)

    def finish(self, host: np.ndarray, rows: Rows, plan: LabelPlan, reduced: bool):
        if reduced:
            pairs = host.astype(np.float64).reshape(-1, 2)
            squares, counts = pairs[:, 0], pairs[:, 1]
        else:
            squares = host.astype(np.float64) ** 2
            counts = np.asarray(rows.counts, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            rms = np.sqrt(plan.sums(squares) / plan.sums(counts))
        return [_per_layer(self.families[0], plan, rms)]

    def global_partials(self, values, rows, keep, reduced):
        if reduced:
            return _kept(values, keep, 2).reshape(-1, 2).sum(0)
        if keep is None:
            squares = values.square().sum()
            return torch.stack([squares, torch.full_like(squares, float(sum(rows.counts)))])
        counts = to_device(torch.tensor(rows.counts, dtype=torch.float32), values.device)
        pairs = torch.stack([values.square(), counts], dim=1)
        return _kept(pairs.reshape(-1), keep, 2).reshape(-1, 2).sum(0)

    def global_value(self, host: np.ndarray) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.sqrt(host[0] / host[1]))


class MaxAbsMetric(_OneFamilyMetric):
    """Largest absolute value per layer and in total: ``max_t max_i |t_i|`` over every
    observation of the layer's sites in the step. Device: ``vector_norm(t, inf)`` per
    observation (0 for an empty tensor); maxima over ranks. Source: the max-activation
    statistics used to spot outlier features (Dettmers et al., "LLM.int8()", 2022)."""

    op = "max"

    def prepare_forward(self, site: Site, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.numel() == 0:
            return torch.zeros((), dtype=torch.float32, device=tensor.device)
        return torch.linalg.vector_norm(tensor, math.inf, dtype=torch.float32)

    def finish(self, host: np.ndarray, rows: Rows, plan: LabelPlan, reduced: bool):
        return [_per_layer(self.families[0], plan, plan.maxima(host.astype(np.float64)))]

    def global_partials(self, values, rows, keep, reduced):
        if keep is not None:
            values = torch.where(keep, values, -math.inf)
        floor = torch.full((1,), -math.inf, dtype=values.dtype, device=values.device)
        return torch.cat([values.reshape(-1), floor]).max().reshape(1)

    def global_value(self, host: np.ndarray) -> float:
        return float(host[0])


_LAYER_ATTRIBUTES: dict[tuple[str, str, str | int], Mapping[str, str | int]] = {}


def _layer_attributes(label: str, key: str, value: str | int) -> Mapping[str, str | int]:
    """``{megatron.training.layer: label, key: value}``, made once per combination."""
    found = _LAYER_ATTRIBUTES.get((label, key, value))
    if found is None:
        found = MappingProxyType({MEGATRON_TRAINING_LAYER: label, key: value})
        _LAYER_ATTRIBUTES[(label, key, value)] = found
    return found


class RouterMetric(ShardedReductionMetric):
    """Load balance and decisiveness of mixture-of-experts routers, per layer.

    Each router observation (``logits[T, E]``, T tokens, E experts, top-k routing) becomes one
    device row of E + 1 values: ``c_e``, the tokens whose top-k experts include e
    (``scatter``-added, so no host sync), and ``sum_t H(p_t)`` with ``p_t = softmax(logits_t)``
    and ``H(p) = -sum_e p_e ln p_e``. Rows are summed over micro-batches and over the ranks of
    the activation placements (data parallel). On the host, per layer:

    - ``max_over_mean = max_e c_e / mean_e c_e`` (1 when uniform; Fedus et al., "Switch
      Transformers", 2021, use the same ratio as their capacity factor);
    - ``coefficient_of_variation = std_e c_e / mean_e c_e`` (population standard deviation;
      the importance loss of Shazeer et al., "Outrageously Large Neural Networks", 2017, is its
      square);
    - ``dead_fraction = #{e : c_e = 0} / E``;
    - ``router_entropy = (sum_t H(p_t) / T) / ln E`` (normalised decision entropy, as in
      Megatron-LM's router metrics, PR #6649);
    - with ``per_expert``: ``router_expert_load = c_e / sum_e c_e`` for each (layer, expert),
      at most ``max_expert_series`` pairs in all (first layers first), with one warning when
      the cap cuts.
    """

    op = "sum"

    def __init__(
        self,
        name: str = "router",
        *,
        per_expert: bool = False,
        summary: bool = True,
        max_expert_series: int = 256,
    ) -> None:
        super().__init__()
        self.name = name
        self.kinds = frozenset({SiteKind.ROUTER})
        families = []
        if summary:
            families += [
                MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
                MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY,
            ]
        if per_expert:
            families.append(MEGATRON_TRAINING_TENSOR_ROUTER_EXPERT_LOAD)
        self.families = tuple(families)
        self.per_expert, self.summary = per_expert, summary
        self.max_expert_series = max_expert_series

    def prepare_forward(self, site: Site, tensor: torch.Tensor) -> torch.Tensor:
        experts = tensor.shape[-1]
        logits = tensor.reshape(-1, experts).float()
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum()
        top = logits.topk(min(site.top_k, experts), dim=-1).indices.reshape(-1)
        counts = torch.zeros(experts, dtype=torch.float32, device=tensor.device)
        counts.scatter_add_(
            0, top, torch.ones(top.shape, dtype=torch.float32, device=tensor.device)
        )
        return torch.cat([counts, entropy.reshape(1)])

    def finish(self, host: np.ndarray, rows: Rows, plan: LabelPlan, reduced: bool):
        values = host.astype(np.float64)
        offsets = np.concatenate(([0], np.cumsum(rows.widths)))
        per_layer: dict[str, tuple[np.ndarray, float, float]] = {}
        for i, site in enumerate(rows.sites):
            row = values[offsets[i] : offsets[i + 1]]
            label = site.layer or GLOBAL
            # Each token was counted once for each of its top-k experts (reduced over ranks
            # along with the counts, unlike the local element counts).
            tokens = row[:-1].sum() / min(site.top_k, len(row) - 1)
            counts, entropy, total = per_layer.get(label, (0.0, 0.0, 0.0))
            per_layer[label] = (counts + row[:-1], entropy + row[-1], total + tokens)
        balance_attrs, balance, entropy_attrs, entropies = [], [], [], []
        expert_attrs, loads = [], []
        budget = self.max_expert_series
        for label in sorted(per_layer, key=layer_sort_key):
            counts, entropy_sum, tokens = per_layer[label]
            experts = len(counts)
            mean = counts.mean() if experts else 0.0
            if mean > 0:
                stats = (counts.max() / mean, counts.std() / mean, float((counts == 0).mean()))
                for statistic, value in zip(ROUTER_STATISTICS, stats):
                    balance_attrs.append(
                        _layer_attributes(label, MEGATRON_TRAINING_ROUTER_STATISTIC, statistic)
                    )
                    balance.append(value)
            if experts > 1 and tokens > 0:
                entropy_attrs.append(layer_attributes(label))
                entropies.append(entropy_sum / tokens / math.log(experts))
            if self.per_expert and mean > 0:
                kept = min(experts, budget)
                if kept < experts:
                    _warn(
                        ("experts", id(self)),
                        "router_expert_load: keeping %d (layer, expert) series "
                        "(max_expert_series); the experts of later layers are dropped.",
                        self.max_expert_series,
                    )
                budget -= kept
                share = counts / counts.sum()
                for expert in range(kept):
                    expert_attrs.append(
                        _layer_attributes(label, MEGATRON_TRAINING_ROUTER_EXPERT, expert)
                    )
                    loads.append(share[expert])
        out = []
        if self.summary:
            out.append(
                FamilyValues(
                    MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE, tuple(balance_attrs), np.array(balance)
                )
            )
            out.append(
                FamilyValues(
                    MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY,
                    tuple(entropy_attrs),
                    np.array(entropies),
                )
            )
        if self.per_expert:
            out.append(
                FamilyValues(
                    MEGATRON_TRAINING_TENSOR_ROUTER_EXPERT_LOAD,
                    tuple(expert_attrs),
                    np.array(loads),
                )
            )
        return out


_COMMIT = {
    "grad": frozenset({SiteKind.GRAD}),
    "param": frozenset({SiteKind.PARAMETER}),
}
_ACTIVATION = frozenset({SiteKind.ACTIVATION})
_RESIDUAL = frozenset({SiteKind.RESIDUAL})
_LOGITS = frozenset({SiteKind.LOGITS})

#: How each built-in metric is made from its schedule name and keyword options
#: (``max_expert_series``).
_MAKERS: Mapping[str, Callable[..., TensorMetric]] = {
    "grad_norm": lambda name, **_: L2NormMetric(
        name, _COMMIT["grad"], MEGATRON_TRAINING_TENSOR_GRAD_NORM
    ),
    "param_norm": lambda name, **_: L2NormMetric(
        name, _COMMIT["param"], MEGATRON_TRAINING_TENSOR_PARAM_NORM
    ),
    "grad_nonfinite": lambda name, **_: NonFiniteCountMetric(
        name, _COMMIT["grad"], MEGATRON_TRAINING_TENSOR_GRAD_NONFINITE
    ),
    "update_ratio": lambda name, **_: UpdateRatioMetric(
        name, _COMMIT["param"], MEGATRON_TRAINING_TENSOR_UPDATE_RATIO
    ),
    "activation_rms": lambda name, **_: RmsMetric(
        name, _ACTIVATION, MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS
    ),
    "activation_max_abs": lambda name, **_: MaxAbsMetric(
        name, _ACTIVATION, MEGATRON_TRAINING_TENSOR_ACTIVATION_MAX_ABS
    ),
    "residual_rms": lambda name, **_: RmsMetric(
        name, _RESIDUAL, MEGATRON_TRAINING_TENSOR_RESIDUAL_RMS
    ),
    "residual_max_abs": lambda name, **_: MaxAbsMetric(
        name, _RESIDUAL, MEGATRON_TRAINING_TENSOR_RESIDUAL_MAX_ABS
    ),
    "logits_norm": lambda name, **_: L2NormMetric(
        name, _LOGITS, MEGATRON_TRAINING_TENSOR_LOGITS_NORM
    ),
    "router": lambda name, **kw: RouterMetric(name, **kw),
    "router_expert_load": lambda name, **kw: RouterMetric(
        name, per_expert=True, summary=False, **kw
    ),
}

#: Schedule name -> factory of the built-in metric (keyword options: ``max_expert_series``):
#: one for each name of :data:`otel_training.config.TENSOR_METRIC_NAMES`, the one list of them
#: (there, the environment's parser knows them without importing torch), in its order.
BUILTIN_METRICS: Mapping[str, Callable[..., TensorMetric]] = MappingProxyType(
    {name: functools.partial(_MAKERS[name], name) for name in TENSOR_METRIC_NAMES}
)


def build_metric(name: str, *, max_expert_series: int = 256) -> TensorMetric:
    """A new instance of the built-in metric ``name`` (a schedule name).

    Raises:
        ValueError: when ``name`` is not a built-in metric.
    """
    factory = BUILTIN_METRICS.get(name)
    if factory is None:
        raise ValueError(f"unknown tensor metric {name!r}; built-in: {', '.join(BUILTIN_METRICS)}")
    if name.startswith("router"):
        return factory(max_expert_series=max_expert_series)
    return factory()
