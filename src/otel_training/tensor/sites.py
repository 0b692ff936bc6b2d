"""Finding the sites of a model: where the tensor observer reads tensors, named canonically.

A :class:`~otel_training.tensor.metric.Site` is one named place a tensor metric reads. This
module finds them in a model as it is now, and notices when the model has changed since:

- parameters and gradients: ``model.named_parameters()`` (tied weights once), read at the commit
  point; DTensor parameters (FSDP2, tensor parallel) take their placements and process groups
  from their device mesh; a :class:`~otel_training.tensor.metric.FlatShard` placement (the
  ranges of Megatron-LM's distributed optimizer) reads only this rank's range of the tensor
  (:class:`LocalPart`);
- residual stream: the output of each layer module (a module named ``...layers.N``,
  ``...blocks.N``, ``...h.N`` or ``...layer.N``);
- activations: the outputs of the layer's direct sub-modules that are not normalisation layers
  (attention and MLP outputs);
- router logits: the output ``[..., E]`` of modules named ``router`` or ``gate``;
- output logits: the output of the model (a tensor, ``.logits``, or the first tensor of a tuple).

Canonical names drop wrapper components (``module.``, ``_orig_mod.``, ``_fsdp_wrapped_module.``,
``_checkpoint_wrapped_module.``, ``_forward_module.``); layers are labelled ``decoder.layers.N``
(``encoder.layers.N`` under an encoder), N plus the caller's offset (pipeline stages). A module or
parameter assigned, inserted, removed or wrapped after the sites were found is noticed by
:class:`StructureWatch`. Nothing here installs a hook or reduces a tensor: the per-step
lifecycle is :mod:`otel_training.tensor.observer`'s.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from otel_training._log_once import MINUTE_S, LogOnce
from otel_training.tensor.metric import (
    PIPELINE_AXIS,
    FlatShard,
    Placement,
    Replicate,
    Shard,
    Site,
    SiteKind,
    TensorMetric,
)

try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Partial as _DTensorPartial
    from torch.distributed.tensor import Shard as _DTensorShard
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None
    _DTensorPartial = _DTensorShard = None

__all__ = [
    "CommitParameter",
    "CommitSites",
    "LocalPart",
    "StructureWatch",
    "canonical_name",
    "commit_parameters",
    "commit_sites",
    "default_layer_of",
    "forward_sites",
    "model_structure",
]

_logger = logging.getLogger(__name__)
_warn = LogOnce(_logger, interval_s=MINUTE_S)

_WRAPPERS = re.compile(
    r"(?:^|\.)(?:module|_orig_mod|_fsdp_wrapped_module|_checkpoint_wrapped_module|_forward_module)"
    r"(?=\.|$)"
)
_LAYER = re.compile(r"(?:^|\.)(?:layers|blocks|h|layer)\.(\d+)(?=\.|$)")
_NORM_CLASS = re.compile(r"norm", re.IGNORECASE)
_ROUTER_NAMES = ("router", "gate")
_TOP_K_ATTRIBUTES = ("top_k", "topk", "num_experts_per_tok", "router_topk", "moe_router_topk")


def canonical_name(name: str) -> str:
    """``name`` without wrapper components: ``module.decoder.layers.0._orig_mod.mlp`` ->
    ``decoder.layers.0.mlp``."""
    return _WRAPPERS.sub("", name).lstrip(".")


def default_layer_of(name: str, offset: int = 0) -> str | None:
    """The layer label of a canonical name: the first ``layers.N``/``blocks.N``/``h.N``/
    ``layer.N`` component gives ``decoder.layers.{N + offset}``, or ``encoder.layers.{...}``
    when the name has an ``encoder`` component before it; ``None`` outside layers."""
    match = _LAYER.search(name)
    if match is None:
        return None
    prefix = name[: match.start()].split(".")
    stack = "encoder" if "encoder" in prefix else "decoder"
    return f"{stack}.layers.{int(match.group(1)) + offset}"


# -- parameters and gradients (commit-time sites) ---------------------------------------------


class LocalPart:
    """What a commit-time site reads of its tensor: this rank's range of a :class:`FlatShard`
    and/or the local piece of a DTensor. The range of a persistent tensor (the parameter, or
    Megatron-LM's ``main_grad`` view of its gradient buffer) is a view built once and reused
    while the tensor keeps its storage; a fresh ``.grad`` is sliced each time.

    Called on the training thread at the commit point; never raises: a tensor that is neither
    whole nor the shard's range gives ``None``, with a warning at most once a minute.
    """

    __slots__ = ("name", "shard", "dtensor", "_base", "_pointer", "_view")

    def __init__(self, name: str, shard: FlatShard | None, dtensor: bool) -> None:
        self.name, self.shard, self.dtensor = name, shard, dtensor
        self._base: torch.Tensor | None = None
        self._pointer = 0
        self._view: torch.Tensor | None = None

    def __call__(self, tensor: torch.Tensor | None, persistent: bool) -> torch.Tensor | None:
        if tensor is None:
            return None
        if self.dtensor and DTensor is not None and isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        shard = self.shard
        if shard is None:
            return tensor
        if persistent and tensor is self._base and tensor.data_ptr() == self._pointer:
            return self._view
        view = shard.local(tensor)
        if view is None:
            _warn(
                ("flat_shard", self.name),
                "tensor observer: %s has %d elements, neither the whole tensor nor the range "
                "[%d, %d) of its FlatShard; it counts 0 in this step.",
                self.name,
                tensor.numel(),
                shard.start,
                shard.end,
            )
            return None
        if persistent:
            self._base, self._pointer, self._view = tensor, tensor.data_ptr(), view
        return view


class CommitParameter(NamedTuple):
    """A parameter that commit-time sites may read: its canonical name, the parameter, and its
    placements per axis (replicated axes left out)."""

    name: str
    param: nn.Parameter
    placements: tuple[tuple[str, Placement], ...]


class CommitSites(NamedTuple):
    """The commit-time sites of one metric and what each reads.

    Attributes:
        kinds: What the metric reads at the commit point: ``PARAMETER`` and/or ``GRAD``, in
            that order.
        sites: The sites, kind by kind; within a kind, rows with the same reduction axes side
            by side, then by dtype.
        params: The parameter of each site.
        local: ``(row, LocalPart)`` for the rows that read a part of their tensor.
    """

    kinds: tuple[SiteKind, ...]
    sites: tuple[Site, ...]
    params: list[nn.Parameter]
    local: tuple[tuple[int, LocalPart], ...]


def commit_parameters(
    models: Sequence[nn.Module],
    placements_of: Callable[[str, nn.Parameter], Mapping[str, Placement]] | None,
    add_axis: Callable[[str, Any], None],
) -> list[CommitParameter]:
    """Every parameter of ``models`` once (tied weights once), in the models' order, with its
    placements: a DTensor's from its device mesh (``add_axis(axis, process_group)`` for each
    sharded mesh dimension), else ``placements_of(canonical_name, parameter)``'s. A parameter
    whose placements cannot be read (a pending-sum ``Partial``, more than one
    :class:`FlatShard`) is skipped with a warning, not raised."""
    found: list[CommitParameter] = []
    for name, param in _named_parameters(models):
        try:
            placements = _placements(name, param, placements_of, add_axis)
        except ValueError as error:
            _logger.warning("tensor observer: skipping %s: %s", name, error)
            continue
        found.append(CommitParameter(name, param, placements))
    return found


def commit_sites(
    metric: TensorMetric,
    params: Sequence[CommitParameter],
    layer_of: Callable[[str], str | None],
) -> CommitSites | None:
    """The sites of ``params`` that ``metric`` reads at the commit point; ``None`` for a metric
    that reads none (a forward metric). A gradient site only for a parameter that requires
    grad. Rows with the same reduction axes side by side (fewer, larger collective requests),
    then by dtype (one fused multi-tensor kernel per run of one dtype on CUDA)."""
    kinds = tuple(k for k in (SiteKind.PARAMETER, SiteKind.GRAD) if k in metric.kinds)
    if not kinds:
        return None
    ordered = sorted(
        params,
        key=lambda item: (
            tuple(a for a, p in item.placements if a != PIPELINE_AXIS),
            str(item.param.dtype),
        ),
    )
    sites, chosen, local = [], [], []
    for kind in kinds:
        for name, param, placements in ordered:
            if kind is SiteKind.GRAD and not param.requires_grad:
                continue
            site = Site(name, kind, layer_of(name), placements)
            if not metric.accepts(site):
                continue
            is_dtensor = DTensor is not None and isinstance(param, DTensor)
            if site.flat_shard is not None or is_dtensor:
                local.append((len(sites), LocalPart(name, site.flat_shard, is_dtensor)))
            sites.append(site)
            chosen.append(param)
    return CommitSites(kinds, tuple(sites), chosen, tuple(local))


def _named_parameters(models: Sequence[nn.Module]) -> Iterator[tuple[str, nn.Parameter]]:
    seen: set[int] = set()
    for model in models:
        for name, param in model.named_parameters():
            if id(param) not in seen:
                seen.add(id(param))
                yield canonical_name(name), param


def _placements(
    name: str,
    param: nn.Parameter,
    placements_of: Callable[[str, nn.Parameter], Mapping[str, Placement]] | None,
    add_axis: Callable[[str, Any], None],
) -> tuple[tuple[str, Placement], ...]:
    if DTensor is not None and isinstance(param, DTensor):
        mesh = param.device_mesh
        names = mesh.mesh_dim_names or tuple(f"mesh{i}" for i in range(mesh.ndim))
        placements: list[tuple[str, Placement]] = []
        for dim, (axis, placement) in enumerate(zip(names, param.placements)):
            if isinstance(placement, _DTensorPartial):
                raise ValueError("pending-sum (Partial) placement")
            if isinstance(placement, _DTensorShard):
                placements.append((axis, Shard(placement.dim)))
                add_axis(axis, mesh.get_group(dim))
        return tuple(placements)
    if placements_of is not None:
        mapping = placements_of(name, param) or {}
        found = tuple(sorted((a, p) for a, p in mapping.items() if not isinstance(p, Replicate)))
        if sum(isinstance(p, FlatShard) for _, p in found) > 1:
            raise ValueError("more than one FlatShard placement")
        return found
    return ()


# -- module outputs (forward sites) -----------------------------------------------------------


def forward_sites(
    models: Sequence[nn.Module],
    kinds: Collection[SiteKind],
    layer_of: Callable[[str], str | None],
    *,
    last_stage: bool,
    router_top_k: int | None,
) -> Iterator[tuple[nn.Module, tuple[tuple[str, SiteKind, int], ...]]]:
    """Each module of ``models`` whose output is a site of one of ``kinds``, with those sites
    as ``(canonical name, kind, top_k)``, module by module in the models' order (lazily: a
    caller may act on each before the next is found).

    Logits are the output of the last model only when ``last_stage`` (the output of an earlier
    pipeline stage is hidden states). ``top_k`` (experts per token) is ``router_top_k``, else the
    router's parent module's ``top_k`` (or ``num_experts_per_tok``...), else 1; 1 for every
    other kind."""
    for model in models:
        logits = SiteKind.LOGITS in kinds and last_stage and model is models[-1]
        modules = {canonical_name(n): m for n, m in model.named_modules()}
        for name, module in modules.items():
            found: list[tuple[str, SiteKind, int]] = []
            last = name.rsplit(".", 1)[-1]
            layer = layer_of(name) if name else None
            parent_name = name.rsplit(".", 1)[0] if "." in name else ""
            if logits and name == "":
                found.append(("output", SiteKind.LOGITS, 1))
            if SiteKind.RESIDUAL in kinds and _LAYER.search(name) and _is_layer(name):
                found.append((name, SiteKind.RESIDUAL, 1))
            if (
                SiteKind.ACTIVATION in kinds
                and layer is not None
                and _is_layer(parent_name)
                and not _NORM_CLASS.search(type(module).__name__)
                and not isinstance(module, (nn.Identity, nn.Dropout))
            ):
                found.append((name, SiteKind.ACTIVATION, 1))
            if SiteKind.ROUTER in kinds and last in _ROUTER_NAMES and isinstance(module, nn.Linear):
                top_k = router_top_k or _top_k_of(modules.get(parent_name))
                found.append((name, SiteKind.ROUTER, top_k))
            if found:
                yield module, tuple(found)


def _is_layer(name: str) -> bool:
    """Whether ``name`` ends with a layer component (``...layers.N``): a layer module."""
    ends = [match.end() for match in _LAYER.finditer(name)]
    return bool(ends) and ends[-1] == len(name)


def _top_k_of(module: nn.Module | None) -> int:
    for attribute in _TOP_K_ATTRIBUTES:
        value = getattr(module, attribute, None)
        if isinstance(value, int) and value >= 1:
            return value
    config_object = getattr(module, "config", None)
    for attribute in _TOP_K_ATTRIBUTES:
        value = getattr(config_object, attribute, None)
        if isinstance(value, int) and value >= 1:
            return value
    return 1


# -- the model's structure --------------------------------------------------------------------


def model_structure(models: Sequence[nn.Module]) -> tuple[tuple[str, int], ...]:
    """The structure of ``models``: every module and parameter by name and identity. Compared
    when a :class:`StructureWatch` was marked: a module built elsewhere leaves it equal."""
    return tuple(
        (name, id(item))
        for model in models
        for named in (model.named_modules(), model.named_parameters())
        for name, item in named
    )


class StructureWatch:
    """Notices when a model changes after its sites were found.

    Assigning a module or parameter anywhere (``model.layers[3] = ...``, ``add_module``,
    ``register_parameter``, a wrapper put in a layer's place) goes through PyTorch's global
    registration hooks, which mark the watch dirty; insertions and deletions that bypass them
    (``ModuleList.insert``, ``del model.layers[3]``) change the size of a ``_modules`` or
    ``_parameters`` mapping of the model, which :meth:`changed` compares. Both are cheap: one
    flag, and one ``len`` per mapping, per due step. The hooks are process-wide: any module
    built anywhere marks the watch, so a marked watch means "may have changed"
    (:func:`model_structure` tells).
    """

    def __init__(self) -> None:
        self.dirty = False
        self._mappings: list[Mapping] = []
        self._sizes: tuple[int, ...] = ()
        ref = weakref.ref(self)

        def mark(*_: Any) -> None:
            watch = ref()
            if watch is not None:
                watch.dirty = True

        registry = nn.modules.module
        self._handles = [
            registry.register_module_module_registration_hook(mark),
            registry.register_module_parameter_registration_hook(mark),
        ]
        weakref.finalize(self, _remove_all, self._handles)

    def snapshot(self, models: Sequence[nn.Module]) -> None:
        """Remembers the structure of ``models`` as it is now."""
        mappings: list[Mapping] = []
        for model in models:
            for module in model.modules():
                mappings.append(module._modules)
                mappings.append(module._parameters)
        self._mappings = mappings
        self._sizes = tuple(map(len, mappings))
        self.dirty = False

    def changed(self) -> bool:
        """Whether the structure may have changed since the last :meth:`snapshot`."""
        return self.dirty or tuple(map(len, self._mappings)) != self._sizes

    def close(self) -> None:
        """Stops watching (removes the global registration hooks)."""
        _remove_all(self._handles)


def _remove_all(handles: list) -> None:
    while handles:
        handles.pop().remove()
