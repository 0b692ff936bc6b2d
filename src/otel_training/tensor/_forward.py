"""Forward observation: what the observer's forward hooks read, eagerly and under torch.compile.

Each observer has one :class:`Gate`, a plain object that its hooks close over. When no forward
metric is due, a hook costs one attribute read (``gate.forward_due``) and returns; under
``torch.compile`` (``fullgraph=True`` included) that read becomes a guard, so the step compiles
to a graph without any observation and no graph break. When a forward metric is due:

- eagerly, the hook hands the output to the step's scope (``gate.scope.observe``), which
  reduces it at once with each due metric's ``prepare_forward`` (queued device work only);
- under ``torch.compile``, the hook is traced: each due metric's ``prepare_forward`` becomes
  part of the graph, and its result leaves the graph through the custom operator
  ``otel_training::record_observation``, whose Python body runs when the graph runs and hands
  the value to the scope. The operator mutates a one-element "sink" tensor so that no graph
  pass can drop it as dead code. A due step compiles to a second graph (a guard on
  ``forward_due`` and on the due work), shared by every later due step with the same metrics,
  whatever the number of micro-batches.

Recomputed forwards (activation checkpointing, reentrant or not) run inside the autograd
engine's backward pass; they are not observed a second time (:func:`in_backward`).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Gate", "first_tensor", "in_backward", "make_hook", "observe_traced"]


class Gate:
    """The state an observer's hooks read.

    Attributes:
        forward_due: Whether a forward metric is due in the current step (between
            ``begin_step`` and ``commit``).
        scope: The current step's observations (``record``/``observe``), or ``None``.
        work: Forward site index -> ``((slot, metric, site), ...)``, the due metrics that read
            the site in the current step; one dict object per set of due metrics.
        sink: A one-element tensor that ``record_observation`` mutates under compile.
        token: The key of this gate in the registry the custom operator looks it up in.
        untraceable: Set (by traced code, replayed at run time) when a due metric that is not
            traceable was skipped under compile.
    """

    __slots__ = (
        "forward_due",
        "scope",
        "work",
        "sink",
        "token",
        "untraceable",
        "__weakref__",
    )

    def __init__(self) -> None:
        self.forward_due = False
        self.scope: Any = None
        self.work: Mapping[int, tuple] = {}
        self.sink = torch.zeros(1)
        self.untraceable = False
        self.token = _register(self)


_GATES: weakref.WeakValueDictionary[int, Gate] = weakref.WeakValueDictionary()
_next_token = [0]


def _register(gate: Gate) -> int:
    _next_token[0] += 1
    _GATES[_next_token[0]] = gate
    return _next_token[0]


def in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this thread: a forward pass
    now is a recomputation (activation checkpointing) of one that was observed already.
    The same test as PyTorch's FSDP2 and ``torch.utils.module_tracker``."""
    return torch._C._current_graph_task_id() != -1


def first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor a module's output stands for: itself, the first tensor of a tuple or list,
    ``["logits"]`` of a mapping or ``.logits`` of an object; ``None`` otherwise."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
        return None
    candidate = output.get("logits") if isinstance(output, Mapping) else None
    if candidate is None and not isinstance(output, Mapping):
        candidate = getattr(output, "logits", None)
    return candidate if isinstance(candidate, torch.Tensor) else None


def make_hook(gate: Gate, indices: tuple[int, ...], on_error):
    """A forward hook that feeds the module's output to the sites ``indices``.

    ``on_error(error)`` is called (eagerly) when observing raises; the forward pass goes on.
    """

    is_compiling = torch.compiler.is_compiling

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        if not gate.forward_due:
            return None
        if is_compiling():
            observe_traced(gate, indices, output)
            return None
        scope = gate.scope
        if scope is not None:
            try:
                scope.observe(indices, output)
            except Exception as error:  # a hook never breaks the forward pass
                on_error(error)
        return None

    return hook


def observe_traced(gate: Gate, indices: tuple[int, ...], output: Any) -> None:
    """The traced (torch.compile) path of a hook: due metrics reduce the output in the graph;
    :func:`record_observation` hands each result to the scope when the graph runs."""
    tensor = first_tensor(output)
    if tensor is None or not tensor.is_floating_point():
        return
    tensor = tensor.detach()
    numel = tensor.numel()
    for index in indices:
        for slot, metric, site in gate.work.get(index, ()):
            if not metric.traceable:
                gate.untraceable = True
                continue
            value = metric.prepare_forward(site, tensor)
            torch.ops.otel_training.record_observation(
                gate.sink, value, gate.token, slot, index, numel
            )


def _record_observation(
    sink: torch.Tensor, value: torch.Tensor, token: int, slot: int, site: int, numel: int
) -> None:
    """Hands ``value`` (one due metric's reduction of the output of forward site ``site``) to
    the current step of the gate ``token``. Runs eagerly, when a compiled graph runs. The value
    is cloned: the compiler may reuse the memory of a graph's intermediate values."""
    gate = _GATES.get(token)
    if gate is None or gate.scope is None or in_backward():
        return
    gate.scope.record(slot, site, value.detach().clone(), numel)


def _register_operator():
    options: dict[str, Any] = {"mutates_args": ("sink",)}
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)  # Python runs inside: no CUDA graph
    if tag is not None and "tags" in inspect.signature(torch.library.custom_op).parameters:
        options["tags"] = (tag,)
    return torch.library.custom_op("otel_training::record_observation", **options)(
        _record_observation
    )


record_observation = _register_operator()
