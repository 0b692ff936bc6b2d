"""Multi-process tensor-metric scenarios on gloo, for tests/integration/test_tensor_distributed.py.

Each scenario runs in every rank, builds the same full tensors from a seed (so that every rank
can compute the expected values with plain torch on the whole tensors), holds only its part of
them as the parallelism in question would, commits one step, and returns what its gauges report,
what torch computes on the whole tensors, and the ``all_reduce`` calls of the commit:

- ``flat``: Megatron-LM's distributed optimizer: gradients live in one flat buffer (``main_grad``
  views), each data-parallel rank owns a contiguous range that cuts parameters anywhere
  (``FlatShard``), the rest of the buffer holds garbage (NaN) on that rank;
- ``pipeline``: two pipeline stages (``pp``), each with its own layers (the first with the
  embedding, the last with the head and a tied copy of the embedding, ``Owned(0)`` along pp),
  activations sent between stages with ``send``/``recv``;
- ``ep``: expert parallelism: each rank holds its own experts under the same names
  (``Shard(0)`` along ep), one parameter owned by rank 0 (``Owned(0)``);
- ``tp_dp`` (4 ranks): a 2 x 2 mesh of data- and tensor-parallel groups: a parameter split
  along tp, one split along both dp and tp (reduced in two stages), data-parallel activations.

Run as a script, this file is one rank: ``python tensor_ranks.py SCENARIOS RANK WORLD PORT OUT``
(SCENARIOS comma-separated); :func:`launch` starts all ranks and returns their results.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

SCHEDULE_COMMIT = "grad_norm:1,param_norm:1,grad_nonfinite:1"


def launch(scenarios: str, world: int, out: Path) -> list[dict]:
    """Runs ``scenarios`` on ``world`` gloo ranks; returns each rank's results (by scenario).

    Raises:
        AssertionError: when a rank fails, with its output.
    """
    from rank_jobs import gloo_ranks  # not at the top: this file also runs as a rank

    return gloo_ranks([__file__, scenarios], world, out, timeout_s=240)


# -- in each rank ---------------------------------------------------------------------------


def _points(reader) -> dict[str, float]:
    from otel_training.testing import points

    found = {}
    for name, point in points(reader.get_metrics_data()):
        if name.startswith("megatron.training.tensor."):
            family = name.removeprefix("megatron.training.tensor.")
            labels = "|".join(str(v) for v in point.attributes.values())
            found[f"{family}|{labels}"] = point.value
    return found


def _l2(tensors) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in tensors))


class _Calls:
    """Counts the real ``all_reduce`` calls of a commit, by axis (it forwards every call)."""

    def __init__(self, groups: dict) -> None:
        import torch.distributed as dist

        self.calls: list[tuple[str, str, int]] = []
        self._names = {id(group): axis for axis, group in groups.items()}
        self._dist, self._real = dist, dist.all_reduce

    def __enter__(self):
        def counting(tensor, op=self._dist.ReduceOp.SUM, group=None, async_op=False):
            axis = self._names.get(id(group), "world")
            self.calls.append((axis, str(op).rsplit(".", 1)[-1], tensor.numel()))
            return self._real(tensor, op=op, group=group, async_op=async_op)

        self._dist.all_reduce = counting
        return self

    def __exit__(self, *exc) -> None:
        self._dist.all_reduce = self._real


def _observer(model, schedule, **kwargs):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_training.tensor import TensorObserver

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("rank")
    return TensorObserver(model, schedule, meter=meter, **kwargs), reader


def _per_layer(family: str, layers: dict[int, list], extra: list = ()) -> dict[str, float]:
    """``family|decoder.layers.N`` for each layer, ``family|global`` over all and ``extra``."""
    expected = {f"{family}|decoder.layers.{n}": _l2(ts) for n, ts in layers.items()}
    expected[f"{family}|global"] = _l2([t for ts in layers.values() for t in ts] + list(extra))
    return expected


def scenario_flat(rank: int, world: int) -> dict:
    """Data parallelism with Megatron-LM's distributed optimizer (FlatShard ranges)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from otel_training.tensor import FlatShard

    dp = dist.new_group(list(range(world)))
    torch.manual_seed(0)
    model = nn.Module()
    model.embed = nn.Linear(3, 6)
    model.layers = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
    params = list(model.named_parameters())
    # The flat gradient buffer, parameters in order, each padded to a multiple of 4 elements,
    # the whole padded to a multiple of the data-parallel size (as Megatron-LM does).
    offsets, size = {}, 0
    for name, param in params:
        offsets[name] = size
        size += -(-param.numel() // 4) * 4
    size = -(-size // world) * world
    buffer = torch.zeros(size)
    for name, param in params:
        param.main_grad = buffer[offsets[name] : offsets[name] + param.numel()].view_as(param)
    shard = size // world
    owned = (rank * shard, (rank + 1) * shard)

    def placements_of(name, param):
        begin = offsets[name]
        start = max(owned[0], begin) - begin
        end = min(owned[1], begin + param.numel()) - begin
        return {"dp": FlatShard(start, end) if end > start else FlatShard(0, 0)}

    cuts = [
        name
        for name, param in params
        if 0
        < placements_of(name, param)["dp"].end - placements_of(name, param)["dp"].start
        < param.numel()
    ]
    # Each rank's own batch; gradients into main_grad, then averaged over the ranks (the
    # reference), then the ranges this rank does not own are overwritten with garbage, as
    # after a reduce-scatter.
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(10 + rank))
    for layer in (model.embed, *model.layers):
        x = torch.tanh(layer(x))
    x.square().mean().backward()
    for _, param in params:
        param.main_grad.copy_(param.grad)
        param.grad = None
    dist.all_reduce(buffer, group=dp)
    buffer /= world
    full_grads = {name: param.main_grad.clone() for name, param in params}
    garbage = torch.ones(size, dtype=torch.bool)
    garbage[owned[0] : owned[1]] = False
    buffer[garbage] = math.nan

    observer, reader = _observer(
        model, SCHEDULE_COMMIT, process_groups={"dp": dp}, placements_of=placements_of
    )
    with _Calls({"dp": dp}) as calls:
        observer.commit()

    def layer_of(name):
        return int(name.split(".")[1]) if name.startswith("layers.") else None

    grads = {n: [] for n in range(3)}
    weights = {n: [] for n in range(3)}
    outside_g, outside_w = [], []
    for name, param in params:
        layer = layer_of(name)
        (grads[layer] if layer is not None else outside_g).append(full_grads[name])
        (weights[layer] if layer is not None else outside_w).append(param.detach())
    expected = {
        **_per_layer("grad_norm", grads, outside_g),
        **_per_layer("param_norm", weights, outside_w),
        "grad_nonfinite|global": 0.0,
    }
    return {
        "observed": _points(reader),
        "expected": expected,
        "calls": calls.calls,
        "cut_parameters": cuts,
        "failures": observer.executor.stats.failures,
    }


def scenario_pipeline(rank: int, world: int) -> dict:
    """Two pipeline stages, activations sent between them; global values over both."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from otel_training.tensor import Owned

    assert world == 2
    pp = dist.new_group([0, 1])

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Linear(6, 6)
            self.mlp = nn.Linear(6, 6)

        def forward(self, x):
            return x + self.mlp(torch.tanh(self.attn(x)))

    class First(nn.Module):  # stage 0: embedding and layers 0, 1
        def __init__(self, embed, layers) -> None:
            super().__init__()
            self.embed, self.layers = embed, nn.ModuleList(layers)

        def forward(self, x):
            x = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return x

    class Last(nn.Module):  # stage 1: layers 2, 3 (numbered 0, 1 here), the tied head
        def __init__(self, layers, tied) -> None:
            super().__init__()
            self.layers = nn.ModuleList(layers)
            self.head = nn.Parameter(tied.detach().clone())  # a copy of the embedding

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x @ self.head  # [B, 6] @ [6, 3] -> logits [B, 3]

    torch.manual_seed(0)
    embed = nn.Linear(3, 6, bias=False)  # weight [6, 3], tied with the head
    blocks = [Block() for _ in range(4)]
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(3))

    # The reference: the whole model in one process, same weights, same input.
    captured: dict[str, torch.Tensor] = {}
    full = First(embed, blocks)
    hooks = [
        module.register_forward_hook(
            lambda m, a, o, name=name: captured.__setitem__(name, o.detach().clone())
        )
        for name, module in full.named_modules()
        if name.startswith("layers.")
    ]
    head = embed.weight.detach().clone().requires_grad_(True)
    full_logits = full(x) @ head
    full_logits.square().mean().backward()
    for hook in hooks:
        hook.remove()
    tied_grad = embed.weight.grad + head.grad  # the tied weight's gradient, both uses
    reference = {
        "grads": {n: [p.grad.clone() for p in blocks[n].parameters()] for n in range(4)},
        "weights": {n: [p.detach().clone() for p in blocks[n].parameters()] for n in range(4)},
    }
    full.zero_grad(set_to_none=True)

    # The pipeline: each stage keeps its part.
    if rank == 0:
        stage = First(embed, blocks[:2])
        offset, tied_name = 0, "embed.weight"
    else:
        stage = Last(blocks[2:], embed.weight)
        offset, tied_name = 2, "head"

    def placements_of(name, param):
        return {"pp": Owned(0)} if name == tied_name else {}

    observer, reader = _observer(
        stage,
        "grad_norm:1,param_norm:1,activation_rms:1,activation_max_abs:1,residual_rms:1,"
        "logits_norm:1",
        process_groups={"pp": pp},
        placements_of=placements_of,
        layer_offset=offset,
    )
    observer.begin_step(1)
    if rank == 0:
        hidden = stage(x)
        dist.send(hidden.detach(), dst=1, group=pp)
        grad = torch.empty_like(hidden)
        dist.recv(grad, src=1, group=pp)
        hidden.backward(grad)
    else:
        hidden = torch.empty(5, 6)
        dist.recv(hidden, src=0, group=pp)
        hidden.requires_grad_(True)
        logits = stage(hidden)
        logits.square().mean().backward()
        dist.send(hidden.grad, dst=0, group=pp)
    # Megatron-LM all-reduces the tied weight's gradient between the first and last stage.
    tied = stage.embed.weight if rank == 0 else stage.head
    dist.all_reduce(tied.grad, group=pp)
    with _Calls({"pp": pp}) as calls:
        observer.commit()

    own = range(offset, offset + 2)
    expected = {}
    for family, key, extra in (
        ("grad_norm", "grads", [tied_grad]),
        ("param_norm", "weights", [embed.weight.detach()]),
    ):
        per_layer = _per_layer(family, reference[key], extra)
        for name, value in per_layer.items():
            layer = name.rsplit(".", 1)[-1]
            if name.endswith("|global") or int(layer) in own:
                expected[name] = value
    acts = {n: [captured[f"layers.{n}.attn"], captured[f"layers.{n}.mlp"]] for n in range(4)}
    for n in own:
        count = sum(a.numel() for a in acts[n])
        expected[f"activation_rms|decoder.layers.{n}"] = math.sqrt(
            sum(float(a.double().square().sum()) for a in acts[n]) / count
        )
        expected[f"activation_max_abs|decoder.layers.{n}"] = max(
            float(a.abs().max()) for a in acts[n]
        )
        expected[f"residual_rms|decoder.layers.{n}"] = float(
            captured[f"layers.{n}"].double().square().mean().sqrt()
        )
    every = [a for n in range(4) for a in acts[n]]
    expected["activation_rms|global"] = math.sqrt(
        sum(float(a.double().square().sum()) for a in every) / sum(a.numel() for a in every)
    )
    expected["activation_max_abs|global"] = max(float(a.abs().max()) for a in every)
    residuals = [captured[f"layers.{n}"] for n in range(4)]
    expected["residual_rms|global"] = math.sqrt(
        sum(float(r.double().square().sum()) for r in residuals) / sum(r.numel() for r in residuals)
    )
    expected["logits_norm|global"] = float(full_logits.detach().double().norm())
    return {
        "observed": _points(reader),
        "expected": expected,
        "calls": calls.calls,
        "failures": observer.executor.stats.failures,
    }


def scenario_ep(rank: int, world: int) -> dict:
    """Expert parallelism: each rank its own experts under the same names (Shard(0) along ep),
    the router and the dense layer replicated, one parameter owned by rank 0."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from otel_training.tensor import Owned, Shard

    ep = dist.new_group(list(range(world)))
    local_experts = 2

    def expert(index: int) -> nn.Linear:
        torch.manual_seed(100 + index)  # expert e is the same tensor wherever it is built
        return nn.Linear(4, 4)

    torch.manual_seed(0)
    dense = nn.Linear(4, 4)
    shared = nn.Parameter(torch.randn(3))
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(5))

    def loss_of(module: nn.Linear, index: int) -> torch.Tensor:
        return (module(x) * (index + 1)).square().mean()

    every = [expert(e) for e in range(world * local_experts)]  # the reference: all experts
    for e, module in enumerate(every):
        loss_of(module, e).backward()
    dense_ref = nn.Linear(4, 4)
    dense_ref.load_state_dict(dense.state_dict())
    dense_ref(x).square().mean().backward()

    model = nn.Module()
    model.layers = nn.ModuleList([nn.Module()])
    model.layers[0].dense = dense
    model.layers[0].experts = nn.ModuleList(
        expert(rank * local_experts + i) for i in range(local_experts)
    )
    model.layers[0].shared = shared
    for i, module in enumerate(model.layers[0].experts):
        loss_of(module, rank * local_experts + i).backward()
    dense(x).square().mean().backward()
    shared.grad = torch.arange(3.0) + 100.0 * rank  # rank 1 holds a stale copy
    if rank == 1:
        shared.grad[0] = math.nan  # even non-finite: it is not this rank's to count

    def placements_of(name, param):
        if ".experts." in name:
            return {"ep": Shard(0)}
        if name.endswith("shared"):
            return {"ep": Owned(0)}
        return {}

    observer, reader = _observer(
        model, SCHEDULE_COMMIT, process_groups={"ep": ep}, placements_of=placements_of
    )
    with _Calls({"ep": ep}) as calls:
        observer.commit()
    grads = [p.grad for m in every for p in m.parameters()]
    grads += [p.grad for p in dense_ref.parameters()] + [torch.arange(3.0)]
    weights = [p.detach() for m in every for p in m.parameters()]
    weights += [p.detach() for p in dense.parameters()] + [shared.detach()]
    expected = {
        **_per_layer("grad_norm", {0: grads}),
        **_per_layer("param_norm", {0: weights}),
        "grad_nonfinite|global": 0.0,
    }
    return {
        "observed": _points(reader),
        "expected": expected,
        "calls": calls.calls,
        "failures": observer.executor.stats.failures,
    }


def scenario_tp_dp(rank: int, world: int) -> dict:
    """A 2 x 2 mesh (rank = 2 * dp_rank + tp_rank): tensors split along tp, along dp and tp
    (two stages of reduction), replicated ones, and data-parallel activations."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from otel_training.tensor import Shard

    assert world == 4
    dp_rank, tp_rank = divmod(rank, 2)
    groups = {}
    for axis, members in (
        ("dp", [[0, 2], [1, 3]]),
        ("tp", [[0, 1], [2, 3]]),
    ):
        for ranks in members:
            group = dist.new_group(ranks)  # every rank creates every group, in order
            if rank in ranks:
                groups[axis] = group

    torch.manual_seed(0)
    full = {
        "column": torch.randn(4, 6),  # split along tp on dim 1
        "fsdp": torch.randn(8),  # split along dp, then along tp
        "replicated": torch.randn(5),
    }
    grads = {name: torch.randn_like(t) for name, t in full.items()}

    def piece(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name == "column":
            return tensor[:, 3 * tp_rank : 3 * tp_rank + 3].clone()
        if name == "fsdp":
            half = tensor[4 * dp_rank : 4 * dp_rank + 4]
            return half[2 * tp_rank : 2 * tp_rank + 2].clone()
        return tensor.clone()

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x):
            return x + torch.tanh(self.proj(x))

    model = nn.Module()
    model.layers = nn.ModuleList([Layer()])
    for name, tensor in full.items():
        setattr(model.layers[0], name, nn.Parameter(piece(name, tensor)))

    def placements_of(name, param):
        if name.endswith("column"):
            return {"tp": Shard(1)}
        if name.endswith("fsdp"):
            return {"dp": Shard(0), "tp": Shard(0)}
        return {}

    observer, reader = _observer(
        model,
        SCHEDULE_COMMIT + ",activation_rms:1,activation_max_abs:1",
        process_groups=groups,
        placements_of=placements_of,
        activation_placements={"dp": Shard(0)},
    )
    inputs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(20 + d)) for d in (0, 1)]
    observer.begin_step(1)
    model.layers[0](inputs[dp_rank]).square().mean().backward()
    for name in full:  # the gradients of the whole tensors, split as the parameters are
        getattr(model.layers[0], name).grad = piece(name, grads[name])
    proj_grads = [p.grad for p in model.layers[0].proj.parameters()]
    for grad in proj_grads:  # replicated: averaged over dp as DDP would
        dist.all_reduce(grad, group=groups["dp"])
        grad /= 2
    with _Calls(groups) as calls:
        observer.commit()

    everything = [*full.values(), *(p.detach() for p in model.layers[0].proj.parameters())]
    every_grad = [*grads.values(), *proj_grads]
    with torch.no_grad():
        proj = model.layers[0].proj
        acts = [proj(torch.cat(inputs))]  # the whole data-parallel batch
    expected = {
        **_per_layer("grad_norm", {0: every_grad}),
        **_per_layer("param_norm", {0: everything}),
        "grad_nonfinite|global": 0.0,
        "activation_rms|decoder.layers.0": float(acts[0].double().square().mean().sqrt()),
        "activation_max_abs|decoder.layers.0": float(acts[0].abs().max()),
    }
    return {
        "observed": _points(reader),
        "expected": expected,
        "calls": calls.calls,
        "failures": observer.executor.stats.failures,
    }


SCENARIOS = {
    "flat": scenario_flat,
    "pipeline": scenario_pipeline,
    "ep": scenario_ep,
    "tp_dp": scenario_tp_dp,
}


def main(scenarios: str, rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    results = {name: SCENARIOS[name](rank, world) for name in scenarios.split(",")}
    dist.barrier()
    Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
