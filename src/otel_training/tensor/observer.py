"""The tensor observer: the per-step lifecycle that feeds a model's tensors to the due metrics.

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

Sites (parameters and gradients, the residual stream, activations, router logits, output
logits) are found at construction by :mod:`otel_training.tensor.sites`, and again before the next
due step when the model has changed since (a layer replaced, added, removed or wrapped: the
hooks are installed again). Each step runs between :meth:`~TensorObserver.begin_step` and
:meth:`~TensorObserver.commit`:

- forward hooks are installed only for the kinds some scheduled metric reads; each starts with
  one attribute read and returns at once when no metric is due in the current step (also under
  ``torch.compile``, ``fullgraph=True`` included: no graph break; see
  :mod:`otel_training.tensor._forward`); recomputed forwards of activation checkpointing are not
  observed twice;
- at the commit point gradients and parameters are read (multi-tensor kernels) and handed, with
  the step's forward observations, to the executor (:mod:`otel_training.tensor.executor`).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from opentelemetry.metrics import Meter, NoOpMeter
from torch import nn

from otel_training import config
from otel_training._log_once import MINUTE_S, LogOnce
from otel_training.tensor._forward import Gate, first_tensor, make_hook
from otel_training.tensor.definitions import DEFAULT_SCHEDULE, build_metric
from otel_training.tensor.executor import TensorMetricExecutor
from otel_training.tensor.gauges import TensorMetricGauges
from otel_training.tensor.metric import PIPELINE_AXIS, Placement, Rows, Site, SiteKind, TensorMetric
from otel_training.tensor.norms import norm_list
from otel_training.tensor.sites import (
    DTensor,  # None where torch is built without distributed
    LocalPart,
    StructureWatch,
    canonical_name,
    commit_parameters,
    commit_sites,
    default_layer_of,
    forward_sites,
    model_structure,
)

__all__ = [
    "Schedule",
    "TensorObserver",
    "canonical_name",
    "default_layer_of",
    "parse_schedule",
]

_logger = logging.getLogger(__name__)
_warn = LogOnce(_logger, interval_s=MINUTE_S)

Schedule = str | Mapping[str | TensorMetric, int] | Iterable[tuple[str | TensorMetric, int]]

_GRAD = operator.attrgetter("grad")
_NO_WORK: dict[int, tuple] = {}  # the work of a step with no forward metric due (never filled)
_graph_task_id = torch._C._current_graph_task_id  # in_backward(), inlined on the hot path
_IS_NONE = functools.partial(operator.is_, None)


def parse_schedule(text: str) -> tuple[tuple[str, int], ...]:
    """Parses ``"grad_norm:10,router:50"`` strictly; ``"none"`` (or ``"off"``, or nothing)
    schedules nothing. The entries are read as the environment's
    (:func:`otel_training.config.split_tensor_metric_schedule`); names are checked when the
    metrics are built.

    Raises:
        ValueError: on an entry that is not ``NAME:INTERVAL`` with a whole INTERVAL >= 1.
    """
    pairs = []
    for entry in config.split_tensor_metric_schedule(text) or ():
        if entry.interval is None:
            raise ValueError(
                f"tensor-metric schedule entry {entry.text!r} is not NAME:INTERVAL (>= 1)"
            )
        pairs.append((entry.name, entry.interval))
    return tuple(pairs)


class _Slot:
    __slots__ = (
        "index",
        "metric",
        "interval",
        "commit_kinds",
        "sites",
        "params",
        "static",
        "local",
        "forward_sites",
        "widths",
        "complete",
    )

    def __init__(self, index: int, metric: TensorMetric, interval: int) -> None:
        self.index, self.metric, self.interval = index, metric, interval
        self.commit_kinds: tuple[SiteKind, ...] = ()
        self.sites: tuple[Site, ...] = ()
        self.params: list[nn.Parameter] = []
        #: The tensors of a parameter-only slot whose sites read whole tensors: the same list
        #: every step (no per-step work).
        self.static: list[torch.Tensor] | None = None
        #: ``(row, LocalPart)`` for the rows that read a part of their tensor.
        self.local: tuple[tuple[int, LocalPart], ...] = ()
        #: Forward sites the metric reads (0 for commit-time metrics).
        self.forward_sites = 0
        #: ``(1,) * len(sites)``: the widths of one value per row.
        self.widths: tuple[int, ...] = ()
        #: Whether the tensors of the last commit held no ``None`` for certain.
        self.complete = False


class _StepScope:
    """The forward observations of one step: what hooks (eagerly) and the compiled graph's
    ``record_observation`` (under torch.compile) add to, between ``begin_step`` and ``commit``."""

    __slots__ = ("step", "due", "began", "forward", "entries", "work", "sites", "extend", "warn")

    def __init__(
        self,
        step: int,
        due: frozenset[int],
        began: bool,
        forward: tuple[int, ...],
        work: dict[int, tuple],
        sites: list[Site],
        extend: Callable[[dict, tuple[int, ...], int], tuple],
        warn: Callable[[Site, TensorMetric, Exception], None],
    ) -> None:
        self.step, self.due, self.began, self.forward = step, due, began, forward
        self.entries: dict[int, tuple[list[Site], list[torch.Tensor], list[int]]] = {
            slot: ([], [], []) for slot in forward
        }
        self.work, self.sites, self.extend, self.warn = work, sites, extend, warn

    def observe(self, indices: Sequence[int], output: Any) -> None:
        """Reduces ``output`` with every due metric of the sites ``indices`` (eager path)."""
        if type(output) is torch.Tensor:
            tensor = output
        else:
            tensor = first_tensor(output)
            if tensor is None:
                return
            if DTensor is not None and isinstance(tensor, DTensor):
                tensor = tensor.to_local()
        if not tensor.is_floating_point() or _graph_task_id() != -1:  # -1: not in backward
            return  # in backward: activation checkpointing recomputes an observed forward
        tensor = tensor.detach()
        numel = tensor.numel()
        work, entries = self.work, self.entries
        for index in indices:
            items = work.get(index)
            if items is None:  # a site added after the step began (observe())
                items = self.extend(work, self.forward, index)
            for slot, metric, site in items:
                try:
                    value = metric.prepare_forward(site, tensor)
                except Exception as error:
                    self.warn(site, metric, error)
                    continue
                sites, values, counts = entries[slot]
                sites.append(site)
                values.append(value)
                counts.append(numel)

    def record(self, slot: int, index: int, value: torch.Tensor, numel: int) -> None:
        """Adds one value reduced inside a compiled graph (``record_observation``)."""
        entry = self.entries.get(slot)
        if entry is not None and 0 <= index < len(self.sites):
            entry[0].append(self.sites[index])
            entry[1].append(value)
            entry[2].append(numel)


class TensorObserver:
    """Hooks a ``torch.nn.Module`` and runs its scheduled tensor metrics.

    Args:
        model: The model (or the model chunks of a pipeline stage).
        schedule: ``"NAME:INTERVAL,..."``, a mapping or pairs of (name or
            :class:`~otel_training.tensor.metric.TensorMetric`, interval in optimizer steps).
            ``None``: ``OTEL_PYTHON_TRAINING_TENSOR_METRICS``, else :data:`DEFAULT_SCHEDULE`.
            A metric is due at step s when ``s % interval == 0``.
        meter: Where the observable gauges go; default ``otel_training.get_meter()``. With a
            no-op meter (``OTEL_SDK_DISABLED=true``) the observer is inert: no hook is
            installed and ``begin_step``/``commit`` return at once.
        process_groups: Axis name -> process group, for reductions over ranks. The axis
            :data:`~otel_training.tensor.PIPELINE_AXIS` (``"pp"``) names the pipeline stages:
            each stage reports its own layers and the ``global`` value of the whole model.
        executor: An executor to share (default: a new one with ``process_groups``).
        activation_placements: Placements of forward tensors (activations, residual stream,
            logits, router logits) per axis, e.g. ``{"dp": Shard(0)}`` to combine the
            statistics of all data-parallel ranks; default: this rank's tensors only.
        placements_of: ``(canonical_name, parameter) -> {axis: placement}`` for parameters that
            are sharded without being DTensors (Megatron-LM tensor parallelism, the
            :class:`~otel_training.tensor.FlatShard` ranges of its distributed optimizer).
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
        self._gate = Gate()
        self._sites: list[Site] = []  # forward sites, in the order found
        self._site_slots: list[tuple[int, ...]] = []
        self._site_index: dict[tuple[str, SiteKind], int] = {}
        self._work: dict[tuple[int, ...], dict[int, tuple]] = {}
        self._intervals = tuple((slot.index, slot.interval) for slot in self._slots)
        self._due_sets: dict[tuple[int, ...], tuple[frozenset[int], tuple[int, ...]]] = {}
        self._handles: list[Any] = []
        self._structure: tuple = ()  # the model's structure when the sites were found
        self._device = torch.device("cpu")
        if meter is None:
            from otel_training.configuration import get_meter

            meter = get_meter()
        self._inert = isinstance(meter, NoOpMeter)
        self._watch: StructureWatch | None = None
        if self._inert:
            self._remove_source: Callable[[], None] = _nothing
            return
        self._watch = StructureWatch()
        self._find_sites()
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

    # -- the sites (otel_training.tensor.sites), wired to the slots and the hooks ----------

    def _find_sites(self) -> None:
        """Finds every site of the model as it is now, and (re)installs the forward hooks."""
        self._watch.snapshot(self._models)
        self._structure = model_structure(self._models)
        self._find_commit_sites()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._install_hooks()
        for slot in self._slots:
            if not slot.commit_kinds:
                slot.forward_sites = sum(slot.index in s for s in self._site_slots)

    def _find_commit_sites(self) -> None:
        """Gives each commit-time slot its sites, parameters and local parts."""
        params = commit_parameters(self._models, self._placements_of, self.executor.axes.add)
        if params:
            self._device = params[0].param.device
        for slot in self._slots:
            found = commit_sites(slot.metric, params, self._layer_of)
            if found is None:
                continue
            slot.commit_kinds, slot.sites, slot.params, slot.local = found
            slot.widths = (1,) * len(found.sites)
            if found.kinds == (SiteKind.PARAMETER,) and not found.local:
                slot.static = list(found.params)
            else:
                slot.static = None

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
        """One forward hook per module whose output is a site some scheduled metric reads."""
        wanted = {k for slot in self._slots for k in slot.metric.kinds if not k.at_commit}
        if not wanted:
            return
        on_error = self._hook_failed
        axes = self.executor.axes
        # The output of an earlier pipeline stage is hidden states, not logits.
        last_stage = axes.rank(PIPELINE_AXIS) == axes.size(PIPELINE_AXIS) - 1
        found = forward_sites(
            self._models,
            wanted,
            self._layer_of,
            last_stage=last_stage,
            router_top_k=self._router_top_k,
        )
        for module, sites in found:
            indices = tuple(self._forward_site(name, kind, top_k) for name, kind, top_k in sites)
            hook = make_hook(self._gate, indices, on_error)
            self._handles.append(module.register_forward_hook(hook))

    @staticmethod
    def _hook_failed(error: Exception) -> None:
        _warn(("hook", type(error)), "tensor observer hook failed: %r", error)

    def _refresh_if_changed(self) -> None:
        """Finds the sites again when the model changed (checked before due steps)."""
        watch = self._watch
        if watch is None or not watch.changed():
            return
        if model_structure(self._models) == self._structure:  # another model was built
            watch.snapshot(self._models)
            return
        before = self._commit_tensor_ids()
        self._find_sites()
        after = self._commit_tensor_ids()
        self._work.clear()
        _logger.info(
            "tensor observer: the model changed after the observer was built "
            "(%d tensor sites added, %d removed); following it.",
            len(after - before),
            len(before - after),
        )

    def _commit_tensor_ids(self) -> set[tuple[str, SiteKind, int]]:
        return {
            (site.name, site.kind, id(param))
            for slot in self._slots
            for site, param in zip(slot.sites, slot.params)
        }

    def refresh(self) -> None:
        """Finds the sites of the model again now (the observer also does this by itself
        before a due step when it notices a change: a module or parameter assigned, inserted
        or removed). For changes made behind PyTorch's back, such as writing to a module's
        ``_modules`` mapping directly. Never raises."""
        if self._watch is None:
            return
        try:
            self._watch.dirty = True
            self._refresh_if_changed()
        except Exception as error:
            _warn(("refresh", id(self), type(error)), "tensor observer: %r", error)

    @property
    def sites(self) -> tuple[Site, ...]:
        """Every site found: the forward sites, then each commit-time metric's sites."""
        commit = tuple(site for slot in self._slots for site in slot.sites)
        return (*self._sites, *commit)

    def _work_for(self, forward: tuple[int, ...]) -> dict[int, tuple]:
        """Forward site index -> ``((slot, metric, site), ...)`` of the due forward slots
        ``forward``; one dict per set of due slots, reused (the compiled graph guards on it)."""
        work = self._work.get(forward)
        if work is None:
            if len(self._work) > 64:
                self._work.clear()
            work = self._work[forward] = {}
            for index in range(len(self._sites)):
                self._site_work(work, forward, index)
        return work

    def _site_work(self, work: dict, forward: tuple[int, ...], index: int) -> tuple:
        site = self._sites[index]
        items = tuple(
            (slot, self._slots[slot].metric, site)
            for slot in self._site_slots[index]
            if slot in forward
        )
        work[index] = items
        return items

    # -- the training loop ------------------------------------------------------------------

    def begin_step(self, step: int | None = None) -> bool:
        """Starts optimizer step ``step`` (default: the previous one + 1), before its first
        forward pass. Forward hooks observe until :meth:`commit` only if a metric reading them
        is due. Also publishes device results that have completed (without waiting).
        Returns whether any metric is due. Never raises."""
        if self._inert:
            self._step = self._step + 1 if step is None else int(step)
            return False
        return self._begin(step, began=True)

    def _begin(self, step: int | None, began: bool) -> bool:
        try:
            if self.executor.pending:
                self.executor.poll()
            if self._scope is not None:
                self._end_scope()
            self._step = self._step + 1 if step is None else int(step)
            due, forward = self._due(self._step)
            if due:
                self._refresh_if_changed()
            work = self._work_for(forward) if forward else _NO_WORK
            scope = _StepScope(
                self._step,
                due,
                began,
                forward,
                work,
                self._sites,
                self._site_work,
                self._forward_failed,
            )
            self._scope = scope
            if forward:
                gate = self._gate
                gate.work, gate.scope, gate.forward_due = work, scope, True
            return bool(due)
        except Exception as error:
            _warn(("begin_step", id(self), type(error)), "tensor observer: %r", error)
            return False

    def _due(self, step: int) -> tuple[frozenset[int], tuple[int, ...]]:
        """The slots due at ``step``, and those of them that read forward sites (cached per
        set of due slots)."""
        key = tuple(i for i, interval in self._intervals if step % interval == 0)
        found = self._due_sets.get(key)
        if found is None:
            forward = tuple(i for i in key if not self._slots[i].commit_kinds)
            found = self._due_sets[key] = (frozenset(key), forward)
        return found

    def _forward_failed(self, site: Site, metric: TensorMetric, error: Exception) -> None:
        _warn(
            ("prepare", id(self), metric.name, type(error)),
            "tensor metric %s could not observe %s: %r",
            metric.name,
            site.name,
            error,
        )

    def observe(
        self, name: str, kind: SiteKind | str, tensor: torch.Tensor, top_k: int = 1
    ) -> None:
        """Feeds ``tensor`` to the due metrics as if a hook had seen it at site ``name``: for
        tensors no module outputs (Megatron-LM's tensor-observation callbacks, router logits
        computed inside a module). Between :meth:`begin_step` and :meth:`commit`; never raises."""
        scope = self._scope
        if scope is None or not self._gate.forward_due:
            return
        try:
            index = self._forward_site(canonical_name(name), SiteKind(kind), top_k)
            scope.observe((index,), tensor)
        except Exception as error:
            _warn(("observe", id(self), type(error)), "tensor observer: %r", error)

    def commit(self) -> None:
        """The commit point: after the step's last backward, before gradient clipping and
        ``optimizer.step()``. Reads gradients and parameters of the due metrics (multi-tensor
        kernels), hands them and the step's forward observations to the executor, and ends the
        step's observation scope. Queues device work only (no host read on CUDA); never raises.
        Without a :meth:`begin_step` since the last commit, the step advances by one."""
        if self._inert:
            return
        try:
            if self._scope is None:
                self._begin(None, began=False)
            scope = self._scope
            self._end_scope()
            if scope is not None:
                self._commit(scope)
                if scope.forward or self._gate.untraceable:
                    self._check_forward(scope)
        except Exception as error:
            _warn(("commit", id(self), type(error)), "tensor observer: %r", error, exc_info=True)

    def _commit(self, scope: _StepScope) -> None:
        rows_by_slot: dict[int, Rows] = {}
        # Every stage must run every due metric under pipeline parallelism (collectives).
        pipeline = self.executor.axes.size(PIPELINE_AXIS) > 1
        # Metrics whose commit-time prepare is batched_norms(tensors, ord) share one call per ord:
        # one multi-tensor kernel per (device, dtype) over all their tensors, whatever the metric.
        batched: dict[float, list[tuple[_Slot, list]]] = {}
        # One gather for the step: the 0-d values of every such row and of scalar forward
        # observations go into one torch.stack; each metric's rows are a view of it.
        scalars: list[torch.Tensor] = []
        spans: list[tuple[_Slot, int, int, tuple[Site, ...], tuple[int, ...]]] = []
        due = scope.due
        grad_enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # parameter norms are no part of autograd
        try:
            for slot in self._slots:
                metric = slot.metric
                if not metric.wants_commit(slot.index in due):
                    continue
                rows = None
                if not slot.commit_kinds:
                    entry = scope.entries.get(slot.index)
                    if entry and entry[0]:
                        sites, values, counts = entry
                        if all(v.dim() == 0 for v in values):
                            begin = len(scalars)
                            scalars += values
                            spans.append((slot, begin, len(scalars), tuple(sites), tuple(counts)))
                            continue
                        rows = Rows(
                            tuple(sites),
                            torch.cat([v.reshape(-1) for v in values]),
                            tuple(v.numel() for v in values),
                            tuple(counts),
                        )
                elif not slot.sites:
                    pass
                elif metric.batched_ord is not None:
                    batched.setdefault(metric.batched_ord, []).append(
                        (slot, self._commit_tensors(slot))
                    )
                    continue
                else:
                    values = metric.prepare(slot.sites, self._commit_tensors(slot))
                    rows = self._rows(slot, values) if values.numel() else None
                if rows is None and pipeline:
                    rows = self._empty_rows()
                if rows is not None:
                    rows_by_slot[slot.index] = rows
            for ord, items in batched.items():
                tensors = items[0][1] if len(items) == 1 else sum((t for _, t in items), [])
                complete = all(slot.complete for slot, _ in items)  # no None among them
                norms = norm_list(tensors, ord, has_none=False if complete else None)
                if len(norms) != len(tensors):  # no tensor at all (no gradient yet): zeros
                    zeros = torch.zeros(len(tensors), dtype=torch.float32, device=self._device)
                    norms = list(zeros.unbind())
                begin = len(scalars)
                scalars += norms
                for slot, slot_tensors in items:
                    end = begin + len(slot_tensors)
                    spans.append((slot, begin, end, slot.sites, ()))
                    begin = end
            if scalars:
                try:
                    stacked = torch.stack(scalars)
                except RuntimeError:  # a model over several devices
                    stacked = torch.stack([v.to(self._device, non_blocking=True) for v in scalars])
                for slot, begin, end, sites, counts in spans:
                    widths = slot.widths if not counts else (1,) * len(sites)
                    rows_by_slot[slot.index] = Rows(sites, stacked[begin:end], widths, counts)
        finally:
            torch._C._set_grad_enabled(grad_enabled)
        if rows_by_slot:
            work = [(self._slots[i].metric, rows_by_slot[i]) for i in sorted(rows_by_slot)]
            self.executor.run(scope.step, work)

    def _empty_rows(self) -> Rows:
        return Rows((), torch.zeros(0, dtype=torch.float32, device=self._device), (), ())

    @staticmethod
    def _commit_tensors(slot: _Slot) -> list[torch.Tensor | None]:
        """The tensors the slot's sites read now; sets ``slot.complete`` when none is ``None``
        for certain (a parameter without gradient is ``None``)."""
        if slot.static is not None:
            slot.complete = True
            return slot.static
        kinds = slot.commit_kinds
        tensors: list[torch.Tensor | None]
        persistent: list[bool] | bool
        if kinds == (SiteKind.GRAD,):
            tensors, persistent = list(map(_GRAD, slot.params)), False
        elif kinds == (SiteKind.PARAMETER,):
            tensors, persistent = list(slot.params), True
        else:
            tensors = [
                p if site.kind is SiteKind.PARAMETER else p.grad
                for site, p in zip(slot.sites, slot.params)
            ]
            persistent = [site.kind is SiteKind.PARAMETER for site in slot.sites]
        complete = not any(map(_IS_NONE, tensors))
        if not complete:  # Megatron-LM keeps gradients in .main_grad
            if not isinstance(persistent, list):
                persistent = [persistent] * len(tensors)
            for i, (t, site, p) in enumerate(zip(tensors, slot.sites, slot.params)):
                if t is None and site.kind is SiteKind.GRAD:
                    tensors[i] = getattr(p, "main_grad", None)
                    persistent[i] = True  # a view of the persistent gradient buffer
        for i, local in slot.local:
            keep = persistent if isinstance(persistent, bool) else persistent[i]
            tensors[i] = local(tensors[i], keep)
        slot.complete = complete and not slot.local  # an adapter may give None
        return tensors

    @staticmethod
    def _rows(slot: _Slot, values: torch.Tensor) -> Rows:
        n = len(slot.sites)
        if values.dim() != 1:
            values = values.reshape(-1)
        width = values.numel() // n
        widths = slot.widths if width == 1 else (width,) * n
        return Rows(slot.sites, values, widths)

    def _check_forward(self, scope: _StepScope) -> None:
        """Says when a due forward metric saw nothing: never silently absent values."""
        gate = self._gate
        untraceable, gate.untraceable = gate.untraceable, False
        for index in scope.due:
            slot = self._slots[index]
            if slot.commit_kinds:
                continue
            if untraceable and not slot.metric.traceable:
                _warn(
                    ("untraceable", id(self), slot.metric.name),
                    "tensor metric %s is not traceable (TensorMetric.traceable is False): its "
                    "values are unavailable while the model runs under torch.compile.",
                    slot.metric.name,
                )
            entry = scope.entries.get(index)
            if scope.began and slot.forward_sites and not (entry and entry[0]):
                _warn(
                    ("unobserved", id(self), slot.metric.name),
                    "tensor metric %s was due at step %d but saw no tensor: run the step's "
                    "forward passes between begin_step() and commit(); a model compiled (and "
                    "run) before the observer was built does not call its hooks.",
                    slot.metric.name,
                    scope.step,
                )

    def _end_scope(self) -> None:
        gate = self._gate
        gate.forward_due, gate.scope = False, None
        self._scope = None

    @property
    def step(self) -> int:
        """The current (or last) optimizer step."""
        return self._step

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Publishes every in-flight result, waiting up to ``timeout_s`` seconds (not for the
        training thread on a GPU: use it at the end of training or in tests)."""
        return self.executor.flush(timeout_s)

    def close(self) -> None:
        """Removes every hook (the model's forward hooks, the process-wide module registration
        hooks) and releases the executor (its flush hook); results already complete are
        published first, without waiting. The values published so far stay observable until
        another observer starts on the same meter, which drops them: a finished run's last
        values reach the final collection, and a second observer in the process (a second
        model, a second fit, a notebook cell run again) records exactly as the first did.
        Idempotent; never raises."""
        self._end_scope()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._watch is not None:
            self._watch.close()
        try:
            self.executor.poll()
        except Exception as error:
            _warn(("close", id(self), type(error)), "tensor observer: %r", error)
        remove, self._remove_source = self._remove_source, _nothing
        if remove is not _nothing:
            remove()
            self._gauges.retire_source(self.executor.published)
        self.executor.close()


def _nothing() -> None:
    return None
