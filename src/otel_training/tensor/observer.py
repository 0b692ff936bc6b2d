"""The tensor observer: exposes a model's tensors to the due tensor metrics of each step.

Usage from a plain loop (see ``docs/tensor-metrics.md`` for Megatron-LM)::

    observer = TensorObserver(model, "grad_norm:10,param_norm:10,activation_rms:50")
    for step in range(1, steps + 1):
        observer.begin_step(step)            # forward hooks observe only when a metric is due
        for micro_batch in micro_batches:
            loss = model(micro_batch).loss
            loss.backward()
        observer.commit()                    # gradients and parameters; just before step()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()

Sites are found once, at construction:

- parameters and gradients: ``model.named_parameters()`` (tied weights once), read at
  :meth:`~TensorObserver.commit`; DTensor parameters (FSDP2, tensor parallel) take their
  placements and process groups from their device mesh;
- residual stream: the output of each layer module (a module named ``...layers.N``,
  ``...blocks.N``, ``...h.N`` or ``...layer.N``);
- activations: the outputs of the layer's direct sub-modules that are not normalisation layers
  (attention and MLP outputs);
- router logits: the output ``[..., E]`` of modules named ``router`` or ``gate``;
- output logits: the output of the model (a tensor, ``.logits``, or the first tensor of a tuple).

Forward hooks are installed only for the kinds some scheduled metric reads; each starts with one
``ContextVar`` read and returns at once when no metric is due in the current step. Canonical names
drop wrapper prefixes (``module.``, ``_orig_mod.``, ``_fsdp_wrapped_module.``,
``_checkpoint_wrapped_module.``); layers are labelled ``decoder.layers.N`` (``encoder.layers.N``
under an encoder), N plus the caller's ``layer_offset`` (pipeline stages).
"""

from __future__ import annotations

import contextvars
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from opentelemetry.metrics import Meter
from torch import nn

from otel_training import config
from otel_training.tensor._ratelimit import RateLimitedLogger
from otel_training.tensor.definitions import DEFAULT_SCHEDULE, build_metric
from otel_training.tensor.executor import TensorMetricExecutor, batched_norms
from otel_training.tensor.gauges import TensorMetricGauges
from otel_training.tensor.metric import (
    Placement,
    Replicate,
    Rows,
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
    "Schedule",
    "TensorObserver",
    "canonical_name",
    "default_layer_of",
    "parse_schedule",
]

_logger = logging.getLogger(__name__)
_warn = RateLimitedLogger(_logger)

Schedule = str | Mapping[str | TensorMetric, int] | Iterable[tuple[str | TensorMetric, int]]

_EMPTY: Mapping[int, _StepScope] = MappingProxyType({})
_SCOPES: contextvars.ContextVar[Mapping[int, _StepScope]] = contextvars.ContextVar(
    "otel_training_tensor_scopes", default=_EMPTY
)

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


def parse_schedule(text: str) -> tuple[tuple[str, int], ...]:
    """Parses ``"grad_norm:10,router:50"`` strictly; ``"none"`` (or ``"off"``, or nothing)
    schedules nothing.

    Raises:
        ValueError: on an entry that is not ``NAME:INTERVAL`` with a whole INTERVAL >= 1.
    """
    if text.strip().lower() in ("none", "off"):
        return ()
    pairs = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, sep, interval = (s.strip() for s in entry.partition(":"))
        if not sep or not interval.isdigit() or int(interval) < 1:
            raise ValueError(f"tensor-metric schedule entry {entry!r} is not NAME:INTERVAL (>= 1)")
        pairs.append((name, int(interval)))
    return tuple(pairs)


class _Slot:
    __slots__ = ("index", "metric", "interval", "commit_kinds", "sites", "params", "is_dtensor")

    def __init__(self, index: int, metric: TensorMetric, interval: int) -> None:
        self.index, self.metric, self.interval = index, metric, interval
        self.commit_kinds: tuple[SiteKind, ...] = ()
        self.sites: tuple[Site, ...] = ()
        self.params: list[nn.Parameter] = []
        self.is_dtensor = False


class _StepScope:
    """The forward observations of one step; what hooks see through the ContextVar."""

    __slots__ = ("step", "due", "forward_due", "tables", "entries", "_work")

    def __init__(self, step: int, due: frozenset[int], forward_due: bool, tables) -> None:
        self.step, self.due, self.forward_due = step, due, forward_due
        self.tables = tables  # (sites, site_slots, slots): shared with the observer
        self.entries: dict[int, tuple[list[Site], list[torch.Tensor], list[int]]] = {}
        self._work: dict[int, list] = {}

    def _work_for(self, index: int) -> list:
        _, site_slots, slots = self.tables
        work = []
        for slot_index in site_slots[index]:
            if slot_index in self.due:
                entry = self.entries.get(slot_index)
                if entry is None:
                    entry = self.entries[slot_index] = ([], [], [])
                work.append((slots[slot_index].metric, *entry))
        self._work[index] = work
        return work

    def observe(self, indices: Sequence[int], output: Any) -> None:
        tensor = output if type(output) is torch.Tensor else _first_tensor(output)
        if tensor is None or not tensor.is_floating_point() or torch.compiler.is_compiling():
            return
        if DTensor is not None and isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        tensor = tensor.detach()
        numel = tensor.numel()
        sites = self.tables[0]
        for index in indices:
            work = self._work.get(index)
            if work is None:
                work = self._work_for(index)
            site = sites[index]
            for metric, entry_sites, entry_values, entry_counts in work:
                try:
                    value = metric.prepare_forward(site, tensor)
                except Exception as error:
                    _warn.warning(
                        ("prepare", id(self.tables), metric.name, type(error)),
                        "tensor metric %s could not observe %s: %r",
                        metric.name,
                        site.name,
                        error,
                    )
                    continue
                entry_sites.append(site)
                entry_values.append(value)
                entry_counts.append(numel)


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        candidate = output
    elif isinstance(output, (tuple, list)):
        candidate = next((o for o in output if isinstance(o, torch.Tensor)), None)
    elif isinstance(output, Mapping):
        candidate = output.get("logits")
    else:
        candidate = getattr(output, "logits", None)
    return candidate if isinstance(candidate, torch.Tensor) else None


def _make_hook(observer_id: int, indices: tuple[int, ...]) -> Callable[..., None]:
    get = _SCOPES.get

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        scope = get().get(observer_id)
        if scope is None or not scope.forward_due:
            return None
        try:
            scope.observe(indices, output)
        except Exception as error:  # a hook never breaks the forward pass
            _warn.warning(("hook", type(error)), "tensor observer hook failed: %r", error)
        return None

    return hook


class TensorObserver:
    """Hooks a ``torch.nn.Module`` and runs its scheduled tensor metrics.

    Args:
        model: The model (or the model chunks of a pipeline stage).
        schedule: ``"NAME:INTERVAL,..."``, a mapping or pairs of (name or
            :class:`~otel_training.tensor.metric.TensorMetric`, interval in optimizer steps).
            ``None``: ``OTEL_PYTHON_TRAINING_TENSOR_METRICS``, else :data:`DEFAULT_SCHEDULE`.
            A metric is due at step s when ``s % interval == 0``.
        meter: Where the observable gauges go; default ``otel_training.get_meter()``.
        process_groups: Axis name -> process group, for reductions over ranks.
        executor: An executor to share (default: a new one with ``process_groups``).
        activation_placements: Placements of forward tensors (activations, residual stream,
            logits, router logits) per axis, e.g. ``{"dp": Shard(0)}`` to combine the
            statistics of all data-parallel ranks; default: this rank's tensors only.
        placements_of: ``(canonical_name, parameter) -> {axis: placement}`` for parameters that
            are sharded without being DTensors (Megatron-LM tensor parallelism).
        layer_of: ``canonical_name -> layer label or None``; default :func:`default_layer_of`.
        layer_offset: Added to layer numbers (the first layer of this pipeline stage).
        router_top_k: Experts per token for router sites; default: the router's parent
            module's ``top_k`` (or ``num_experts_per_tok``...), else 1.
        max_series: Series kept per metric family.
        max_expert_series: (layer, expert) series kept by ``router_expert_load``.

    Raises:
        ValueError: on a malformed schedule, an unknown metric name, or a metric that reads
            both commit-time and forward sites. Nothing raises after construction: hot paths
            log (at most once a minute per cause) and drop.
    """

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        schedule: Schedule | None = None,
        *,
        meter: Meter | None = None,
        process_groups: Mapping[str, Any] | None = None,
        executor: TensorMetricExecutor | None = None,
        activation_placements: Mapping[str, Placement] | None = None,
        placements_of: Callable[[str, nn.Parameter], Mapping[str, Placement]] | None = None,
        layer_of: Callable[[str], str | None] | None = None,
        layer_offset: int = 0,
        router_top_k: int | None = None,
        max_series: int = 1000,
        max_expert_series: int = 256,
    ) -> None:
        self._models = [model] if isinstance(model, nn.Module) else list(model)
        self.executor = executor or TensorMetricExecutor(process_groups)
        if executor is not None and process_groups:
            for axis, group in process_groups.items():
                self.executor.axes.add(axis, group)
        self.executor.published.max_series = max_series
        self._layer_of = layer_of or (lambda name: default_layer_of(name, layer_offset))
        self._placements_of = placements_of
        self._activation_placements = tuple(sorted((activation_placements or {}).items()))
        self._router_top_k = router_top_k
        self._slots = [
            _Slot(i, metric, interval)
            for i, (metric, interval) in enumerate(self._resolve(schedule, max_expert_series))
        ]
        self._step = 0
        self._scope: _StepScope | None = None
        self._token: contextvars.Token | None = None
        self._sites: list[Site] = []
        self._site_slots: list[tuple[int, ...]] = []
        self._site_index: dict[tuple[str, SiteKind], int] = {}
        self._handles: list[Any] = []
        self._find_commit_sites()
        self._install_hooks()
        if meter is None:
            from otel_training.setup import get_meter

            meter = get_meter()
        self._gauges = TensorMetricGauges.for_meter(meter)
        self._remove_source = self._gauges.add_source(self.executor.published)

    # -- schedule -------------------------------------------------------------------------

    @staticmethod
    def _resolve(schedule: Schedule | None, max_expert_series: int):
        if schedule is None:
            schedule = config.tensor_metric_schedule()
            if schedule is None:
                schedule = DEFAULT_SCHEDULE
        if isinstance(schedule, str):
            schedule = parse_schedule(schedule)
        items = schedule.items() if isinstance(schedule, Mapping) else schedule
        resolved: list[tuple[TensorMetric, int]] = []
        names = set()
        for key, interval in items:
            if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
                raise ValueError(f"interval of {key!r} must be a whole number >= 1: {interval!r}")
            metric = (
                key
                if isinstance(key, TensorMetric)
                else build_metric(str(key), max_expert_series=max_expert_series)
            )
            if metric.name in names:
                raise ValueError(f"tensor metric {metric.name!r} is scheduled twice")
            names.add(metric.name)
            at_commit = {k.at_commit for k in metric.kinds}
            if len(at_commit) > 1:
                raise ValueError(
                    f"tensor metric {metric.name!r} reads both commit-time and forward sites"
                )
            resolved.append((metric, interval))
        return resolved

    @property
    def schedule(self) -> tuple[tuple[str, int], ...]:
        """The metrics and their intervals, in order."""
        return tuple((slot.metric.name, slot.interval) for slot in self._slots)

    @property
    def metrics(self) -> tuple[TensorMetric, ...]:
        """The scheduled metric instances."""
        return tuple(slot.metric for slot in self._slots)

    # -- sites ----------------------------------------------------------------------------

    def _named_parameters(self):
        seen: set[int] = set()
        for model in self._models:
            for name, param in model.named_parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield canonical_name(name), param

    def _param_placements(self, name: str, param: nn.Parameter):
        if DTensor is not None and isinstance(param, DTensor):
            mesh = param.device_mesh
            names = mesh.mesh_dim_names or tuple(f"mesh{i}" for i in range(mesh.ndim))
            placements: list[tuple[str, Placement]] = []
            for dim, (axis, placement) in enumerate(zip(names, param.placements)):
                if isinstance(placement, _DTensorPartial):
                    raise ValueError("pending-sum (Partial) placement")
                if isinstance(placement, _DTensorShard):
                    placements.append((axis, Shard(placement.dim)))
                    self.executor.axes.add(axis, mesh.get_group(dim))
            return tuple(placements)
        if self._placements_of is not None:
            mapping = self._placements_of(name, param) or {}
            return tuple(sorted((a, p) for a, p in mapping.items() if not isinstance(p, Replicate)))
        return ()

    def _find_commit_sites(self) -> None:
        params: list[tuple[str, nn.Parameter, tuple]] = []
        for name, param in self._named_parameters():
            try:
                placements = self._param_placements(name, param)
            except ValueError as error:
                _logger.warning("tensor observer: skipping %s: %s", name, error)
                continue
            params.append((name, param, placements))
        # Rows with the same reduction axes side by side: fewer, larger collective requests.
        params.sort(key=lambda item: tuple(a for a, p in item[2]))
        for slot in self._slots:
            kinds = tuple(k for k in (SiteKind.PARAMETER, SiteKind.GRAD) if k in slot.metric.kinds)
            if not kinds:
                continue
            sites, chosen = [], []
            for kind in kinds:
                for name, param, placements in params:
                    if kind is SiteKind.GRAD and not param.requires_grad:
                        continue
                    site = Site(name, kind, self._layer_of(name), placements)
                    if slot.metric.accepts(site):
                        sites.append(site)
                        chosen.append(param)
            slot.commit_kinds, slot.sites, slot.params = kinds, tuple(sites), chosen
            slot.is_dtensor = DTensor is not None and any(isinstance(p, DTensor) for p in chosen)

    def _forward_site(self, name: str, kind: SiteKind, top_k: int = 1) -> int:
        key = (name, kind)
        index = self._site_index.get(key)
        if index is not None:
            return index
        site = Site(name, kind, self._layer_of(name), self._activation_placements, top_k)
        index = len(self._sites)
        self._sites.append(site)
        self._site_slots.append(
            tuple(s.index for s in self._slots if not s.commit_kinds and s.metric.accepts(site))
        )
        self._site_index[key] = index
        return index

    def _install_hooks(self) -> None:
        wanted = {k for slot in self._slots for k in slot.metric.kinds if not k.at_commit}
        if not wanted:
            return
        for model in self._models:
            modules = {canonical_name(n): m for n, m in model.named_modules()}
            for name, module in modules.items():
                found: list[int] = []
                last = name.rsplit(".", 1)[-1]
                layer = self._layer_of(name) if name else None
                parent_name = name.rsplit(".", 1)[0] if "." in name else ""
                if SiteKind.LOGITS in wanted and name == "":
                    found.append(self._forward_site("output", SiteKind.LOGITS))
                if SiteKind.RESIDUAL in wanted and _LAYER.search(name) and _is_layer(name):
                    found.append(self._forward_site(name, SiteKind.RESIDUAL))
                if (
                    SiteKind.ACTIVATION in wanted
                    and layer is not None
                    and _is_layer(parent_name)
                    and not _NORM_CLASS.search(type(module).__name__)
                    and not isinstance(module, (nn.Identity, nn.Dropout))
                ):
                    found.append(self._forward_site(name, SiteKind.ACTIVATION))
                if (
                    SiteKind.ROUTER in wanted
                    and last in _ROUTER_NAMES
                    and isinstance(module, nn.Linear)
                ):
                    top_k = self._router_top_k or _top_k_of(modules.get(parent_name))
                    found.append(self._forward_site(name, SiteKind.ROUTER, top_k))
                if found:
                    handle = module.register_forward_hook(_make_hook(id(self), tuple(found)))
                    self._handles.append(handle)

    @property
    def sites(self) -> tuple[Site, ...]:
        """Every site found: the forward sites, then each commit-time metric's sites."""
        commit = tuple(site for slot in self._slots for site in slot.sites)
        return (*self._sites, *commit)

    # -- the training loop ------------------------------------------------------------------

    def begin_step(self, step: int | None = None) -> bool:
        """Starts optimizer step ``step`` (default: the previous one + 1), before its first
        forward pass. Forward hooks observe until :meth:`commit` only if a metric reading them
        is due. Also publishes device results that have completed (without waiting).
        Returns whether any metric is due. Never raises."""
        try:
            if self.executor.pending:
                self.executor.poll()
            if self._scope is not None:
                self._end_scope()
            self._step = self._step + 1 if step is None else int(step)
            due = frozenset(s.index for s in self._slots if self._step % s.interval == 0)
            forward_due = any(not self._slots[i].commit_kinds for i in due)
            tables = (self._sites, self._site_slots, self._slots)
            self._scope = _StepScope(self._step, due, forward_due, tables)
            if forward_due:
                scopes = dict(_SCOPES.get())  # never mutated once set: a copy per step
                scopes[id(self)] = self._scope
                self._token = _SCOPES.set(scopes)
            return bool(due)
        except Exception as error:
            _warn.warning(("begin_step", id(self), type(error)), "tensor observer: %r", error)
            return False

    def observe(
        self, name: str, kind: SiteKind | str, tensor: torch.Tensor, top_k: int = 1
    ) -> None:
        """Feeds ``tensor`` to the due metrics as if a hook had seen it at site ``name``: for
        tensors no module outputs (Megatron-LM's tensor-observation callbacks, router logits
        computed inside a module). Between :meth:`begin_step` and :meth:`commit`; never raises."""
        scope = self._scope
        if scope is None or not scope.forward_due:
            return
        try:
            index = self._forward_site(canonical_name(name), SiteKind(kind), top_k)
            scope.observe((index,), tensor)
        except Exception as error:
            _warn.warning(("observe", id(self), type(error)), "tensor observer: %r", error)

    def commit(self) -> None:
        """The commit point: after the step's last backward, before gradient clipping and
        ``optimizer.step()``. Reads gradients and parameters of the due metrics (multi-tensor
        kernels), hands them and the step's forward observations to the executor, and ends the
        step's observation scope. Queues device work only (no host read on CUDA); never raises.
        Without a :meth:`begin_step` since the last commit, the step advances by one."""
        try:
            if self._scope is None:
                self.begin_step()
            scope = self._scope
            self._end_scope()
            if scope is not None:
                self._commit(scope)
        except Exception as error:
            _warn.warning(
                ("commit", id(self), type(error)), "tensor observer: %r", error, exc_info=True
            )

    def _commit(self, scope: _StepScope) -> None:
        rows_by_slot: dict[int, Rows] = {}
        # Metrics whose commit-time prepare is batched_norms(tensors, ord) share one call per ord:
        # one multi-tensor kernel per (device, dtype) over all their tensors, whatever the metric.
        batched: dict[float, list[tuple[_Slot, list]]] = {}
        with torch.no_grad():
            for slot in self._slots:
                if not slot.metric.wants_commit(slot.index in scope.due):
                    continue
                if not slot.commit_kinds:
                    rows = self._forward_rows(slot, scope)
                elif not slot.sites:
                    continue
                elif slot.metric.batched_ord is not None:
                    batched.setdefault(slot.metric.batched_ord, []).append(
                        (slot, self._commit_tensors(slot))
                    )
                    continue
                else:
                    rows = self._rows(
                        slot, slot.metric.prepare(slot.sites, self._commit_tensors(slot))
                    )
                if rows is not None:
                    rows_by_slot[slot.index] = rows
            for ord, items in batched.items():
                if len(items) == 1:
                    slot, tensors = items[0]
                    rows_by_slot[slot.index] = self._rows(slot, batched_norms(tensors, ord))
                    continue
                norms = batched_norms([t for _, tensors in items for t in tensors], ord)
                begin = 0
                for slot, tensors in items:
                    end = begin + len(tensors)
                    rows_by_slot[slot.index] = self._rows(slot, norms[begin:end])
                    begin = end
        if rows_by_slot:
            work = [(self._slots[i].metric, rows_by_slot[i]) for i in sorted(rows_by_slot)]
            self.executor.run(scope.step, work)

    @staticmethod
    def _commit_tensors(slot: _Slot) -> list[torch.Tensor | None]:
        tensors: list[torch.Tensor | None]
        if slot.commit_kinds == (SiteKind.PARAMETER,):
            tensors = slot.params  # type: ignore[assignment]
        elif slot.commit_kinds == (SiteKind.GRAD,):
            tensors = [p.grad for p in slot.params]
        else:
            tensors = [
                p if site.kind is SiteKind.PARAMETER else p.grad
                for site, p in zip(slot.sites, slot.params)
            ]
        if any(t is None for t in tensors):  # Megatron-LM keeps gradients in .main_grad
            tensors = [
                getattr(p, "main_grad", None) if t is None and site.kind is SiteKind.GRAD else t
                for t, site, p in zip(tensors, slot.sites, slot.params)
            ]
        if slot.is_dtensor:
            tensors = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return tensors

    @staticmethod
    def _rows(slot: _Slot, values: torch.Tensor) -> Rows | None:
        n = len(slot.sites)
        if values.numel() == 0 or n == 0:
            return None
        width = values.numel() // n
        return Rows(slot.sites, values if values.dim() == 1 else values.reshape(-1), (width,) * n)

    @staticmethod
    def _forward_rows(slot: _Slot, scope: _StepScope) -> Rows | None:
        entry = scope.entries.get(slot.index)
        if not entry:
            return None
        sites, values, counts = entry
        if all(v.dim() == 0 for v in values):
            stacked = torch.stack(values)
            widths = (1,) * len(values)
        else:
            stacked = torch.cat([v.reshape(-1) for v in values])
            widths = tuple(v.numel() for v in values)
        return Rows(tuple(sites), stacked, widths, tuple(counts))

    def _end_scope(self) -> None:
        token = self._token
        self._scope, self._token = None, None
        if token is not None:
            try:
                _SCOPES.reset(token)
            except ValueError:  # set in another context: drop only this observer's scope
                scopes = dict(_SCOPES.get())
                scopes.pop(id(self), None)
                _SCOPES.set(scopes)

    @property
    def step(self) -> int:
        """The current (or last) optimizer step."""
        return self._step

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Publishes every in-flight result, waiting up to ``timeout_s`` seconds (not for the
        training thread on a GPU: use it at the end of training or in tests)."""
        return self.executor.flush(timeout_s)

    def close(self) -> None:
        """Removes the hooks, stops feeding the gauges and releases the executor."""
        self._end_scope()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._remove_source()
        self.executor.close()


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
