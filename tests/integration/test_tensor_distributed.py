"""Tensor metrics across processes on gloo: replicated, sharded (manually and as DTensor,
including an empty shard) and owned parameters, data-parallel activations and router logits;
Megatron-LM's distributed-optimizer ranges (FlatShard), two pipeline stages, expert
parallelism, and a 2 x 2 mesh of data- and tensor-parallel groups (tensor_ranks.py).

Each rank builds the same model, holds its part of every sharded tensor, trains one step on
its own batch and commits; its gauges must equal a direct torch computation on the whole
tensors (which every rank can rebuild from the seed), identically on every rank, and the
executor must pack all collectives of the step into one ``all_reduce`` per (axis, op) and round.

Run as a script, this file is one rank: ``python test_tensor_distributed.py RANK WORLD PORT OUT``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

SCHEDULE = (
    "grad_norm:1,param_norm:1,grad_nonfinite:1,activation_rms:1,activation_max_abs:1,"
    "residual_rms:1,router:1"
)
D_MODEL, EXPERTS, TOP_K, BATCH = 6, 4, 2, 5


# -- one rank -------------------------------------------------------------------------------


def _worker(rank: int, world: int, port: int, out: str) -> None:  # pragma: no cover - child
    import torch
    import torch.distributed as dist
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard as DShard
    from torch.distributed.tensor import distribute_tensor

    from otel_training.tensor import Owned, Shard, TensorObserver
    from otel_training.testing import points

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)  # the same full tensors on every rank

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(D_MODEL, D_MODEL)
            self.router = nn.Linear(D_MODEL, EXPERTS, bias=False)
            self.top_k = TOP_K

        def forward(self, x):
            gate = self.router(x).softmax(-1).max(-1, keepdim=True).values
            return x + gate * torch.tanh(self.proj(x))

    model = nn.Module()
    model.layers = nn.ModuleList([Layer(), Layer()])
    full = {
        "dtensor": torch.randn(5, 3),  # layer 0, DTensor Shard(0): rows 0-2 and 3-4
        "uneven": torch.randn(1, 4),  # layer 1, DTensor Shard(0): rank 1 holds an empty shard
        "manual": torch.randn(4, 4),  # layer 1, plain tensor holding this rank's rows
        "owned": torch.randn(3),  # layer 1, only rank 0's copy counts
    }
    grads = {name: torch.randn_like(t) for name, t in full.items()}
    model.layers[0].dtensor = nn.Parameter(distribute_tensor(full["dtensor"], mesh, [DShard(0)]))
    model.layers[1].uneven = nn.Parameter(distribute_tensor(full["uneven"], mesh, [DShard(0)]))
    rows = slice(2 * rank, 2 * rank + 2)
    model.layers[1].manual = nn.Parameter(full["manual"][rows].clone())
    model.layers[1].owned = nn.Parameter(full["owned"] + 100.0 * rank)  # rank 1: a stale copy

    def placements_of(name, param):
        if name.endswith("manual"):
            return {"dp": Shard(0)}
        if name.endswith("owned"):
            return {"dp": Owned(0)}
        return {}

    provider = MeterProvider(metric_readers=[reader := InMemoryMetricReader()])
    observer = TensorObserver(
        model,
        SCHEDULE,
        meter=provider.get_meter("rank"),
        activation_placements={"dp": Shard(0)},
        placements_of=placements_of,
    )

    # Each rank trains on its own batch; replicated gradients are averaged as DDP would.
    inputs = [torch.randn(BATCH, D_MODEL, generator=torch.Generator().manual_seed(10 + r))
              for r in range(world)]  # fmt: skip
    observer.begin_step(1)
    x = inputs[rank]
    for layer in model.layers:
        x = layer(x)
    x.square().mean().backward()
    for name, param in model.named_parameters():
        if name.endswith(("proj.weight", "proj.bias", "router.weight")):
            dist.all_reduce(param.grad)
            param.grad /= world
    model.layers[0].dtensor.grad = distribute_tensor(grads["dtensor"], mesh, [DShard(0)])
    model.layers[1].uneven.grad = distribute_tensor(grads["uneven"], mesh, [DShard(0)])
    model.layers[1].manual.grad = grads["manual"][rows].clone()
    model.layers[1].owned.grad = grads["owned"] + 100.0 * rank
    if rank == 1:  # a stale, even non-finite, copy on a rank that does not own the tensor
        model.layers[1].owned.grad[0] = math.nan

    calls = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append((str(op), tensor.numel()))
        return real_all_reduce(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = counting_all_reduce
    observer.commit()
    dist.all_reduce = real_all_reduce
    observed = {}
    for name, point in points(reader.get_metrics_data()):
        if name.startswith("megatron.training.tensor."):
            observed[name + "|" + "|".join(str(v) for v in point.attributes.values())] = point.value

    # -- the direct computation, on the whole tensors ----------------------------------------
    expected = {}
    proj_params = {
        n: p.detach() for n, p in model.named_parameters() if "proj" in n or "router" in n
    }
    proj_grads = {n: p.grad for n, p in model.named_parameters() if "proj" in n or "router" in n}
    layer_params = {0: [full["dtensor"]], 1: [full["uneven"], full["manual"], full["owned"]]}
    layer_grads = {0: [grads["dtensor"]], 1: [grads["uneven"], grads["manual"], grads["owned"]]}
    for name in proj_params:
        layer = int(name.split(".")[1])
        layer_params[layer].append(proj_params[name])
        layer_grads[layer].append(proj_grads[name])

    def l2(tensors):
        return math.sqrt(sum(float(t.double().square().sum()) for t in tensors))

    for family, per_layer in (("param_norm", layer_params), ("grad_norm", layer_grads)):
        for layer, tensors in per_layer.items():
            expected[f"megatron.training.tensor.{family}|decoder.layers.{layer}"] = l2(tensors)
        everything = [t for tensors in per_layer.values() for t in tensors]
        expected[f"megatron.training.tensor.{family}|global"] = l2(everything)
    for layer in (0, 1):
        expected[f"megatron.training.tensor.grad_nonfinite|decoder.layers.{layer}"] = 0.0
    expected["megatron.training.tensor.grad_nonfinite|global"] = 0.0  # rank 1's NaN is not owned

    captured: dict[str, list] = {}
    hooks = [
        module.register_forward_hook(
            lambda m, a, o, name=name: captured.setdefault(name, []).append(o.detach())
        )
        for name, module in model.named_modules()
        if name.count(".") in (1, 2) and name.startswith("layers.")
    ]
    with torch.no_grad():
        x = torch.cat(inputs)  # the whole data-parallel batch
        for layer in model.layers:
            x = layer(x)
    for hook in hooks:
        hook.remove()
    for layer in (0, 1):
        acts = captured[f"layers.{layer}.proj"] + captured[f"layers.{layer}.router"]
        count = sum(a.numel() for a in acts)
        rms = math.sqrt(sum(float(a.double().square().sum()) for a in acts) / count)
        expected[f"megatron.training.tensor.activation_rms|decoder.layers.{layer}"] = rms
        expected[f"megatron.training.tensor.activation_max_abs|decoder.layers.{layer}"] = max(
            float(a.abs().max()) for a in acts
        )
        residual = captured[f"layers.{layer}"][0]
        expected[f"megatron.training.tensor.residual_rms|decoder.layers.{layer}"] = float(
            residual.double().square().mean().sqrt()
        )
        logits = captured[f"layers.{layer}.router"][0]
        top = logits.topk(TOP_K, dim=-1).indices.flatten()
        counts = torch.bincount(top, minlength=EXPERTS).double()
        prefix = f"megatron.training.tensor.router_balance|decoder.layers.{layer}"
        expected[prefix + "|max_over_mean"] = float(counts.max() / counts.mean())
        expected[prefix + "|coefficient_of_variation"] = float(
            counts.std(unbiased=False) / counts.mean()
        )
        expected[prefix + "|dead_fraction"] = float((counts == 0).double().mean())
        probs = logits.double().softmax(-1)
        entropy = float(-(probs * probs.log()).sum(-1).mean() / math.log(EXPERTS))
        expected[f"megatron.training.tensor.router_entropy|decoder.layers.{layer}"] = entropy
    all_acts = [a for layer in (0, 1) for name in ("proj", "router")
                for a in captured[f"layers.{layer}.{name}"]]  # fmt: skip
    expected["megatron.training.tensor.activation_max_abs|global"] = max(
        float(a.abs().max()) for a in all_acts
    )

    stats = observer.executor.stats
    Path(out).write_text(
        json.dumps(
            {
                "observed": observed,
                "expected": expected,
                "all_reduce": calls,
                "host_copies": stats.host_copies,
                "due_steps": stats.due_steps,
                "failures": stats.failures,
                "local_uneven_numel": model.layers[1].uneven.to_local().numel(),
            }
        )
    )
    dist.destroy_process_group()


# -- the test --------------------------------------------------------------------------------


def _require_gloo() -> None:
    from support import gloo_or_unavailable  # not at the top: this file also runs as a rank

    gloo_or_unavailable()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from rank_jobs import gloo_ranks  # not at the top: this file also runs as a rank

    _require_gloo()
    return gloo_ranks([__file__], 2, tmp_path_factory.mktemp("ranks"), timeout_s=180)


def test_every_rank_reports_the_whole_tensor_values(two_ranks):
    """Gauges on each rank equal torch on the whole tensors (sharded, DTensor, owned, DP data)."""
    _assert_whole_tensor_values(two_ranks)


def test_an_empty_dtensor_shard_contributes_nothing(two_ranks):
    """Rank 1 holds an empty shard of the [1, 4] DTensor and still agrees on the layer norm."""
    assert [r["local_uneven_numel"] for r in two_ranks] == [4, 0]
    key = "megatron.training.tensor.param_norm|decoder.layers.1"
    assert two_ranks[0]["observed"][key] == two_ranks[1]["observed"][key]


def test_both_ranks_publish_the_same_values(two_ranks):
    """After the reduction, both ranks hold identical values for every series."""
    assert two_ranks[0]["observed"] == two_ranks[1]["observed"]


def test_collectives_of_all_metrics_are_packed_per_op(two_ranks):
    """Seven metrics due together make one all_reduce for sums and one for maxima."""
    for result in two_ranks:
        ops = sorted(op for op, _ in result["all_reduce"])
        assert len(ops) == 2, result["all_reduce"]
        assert any("MAX" in op.upper() for op in ops) and any("SUM" in op.upper() for op in ops)


def test_one_host_copy_per_due_step_on_each_rank(two_ranks):
    """The step's values reach the host in one copy."""
    assert [(r["host_copies"], r["due_steps"]) for r in two_ranks] == [(1, 1), (1, 1)]


# -- flat shards, pipeline stages, expert and tensor parallelism (tensor_ranks.py) -----------


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """flat, pipeline and ep on two ranks, tp_dp on four: {scenario: [result of each rank]}."""
    import tensor_ranks

    _require_gloo()
    found: dict[str, list[dict]] = {}
    for names, world in (("flat,pipeline,ep", 2), ("tp_dp", 4)):
        ranks = tensor_ranks.launch(names, world, tmp_path_factory.mktemp("ranks"))
        for name in names.split(","):
            found[name] = [rank[name] for rank in ranks]
    return found


def _assert_whole_tensor_values(results: list[dict]) -> None:
    for rank, result in enumerate(results):
        observed, expected = result["observed"], result["expected"]
        missing = sorted(set(expected) - set(observed))
        assert not missing, f"rank {rank} lacks {missing}"
        for key, value in expected.items():
            assert observed[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (rank, key)
        assert result["failures"] == 0


def _calls(result: dict) -> list[tuple[str, str]]:
    return [(axis, op) for axis, op, _ in result["calls"]]


def test_flat_shards_equal_the_unsharded_norms(scenarios):
    """Distributed-optimizer ranges that cut parameters anywhere: both ranks report the norms
    of the whole averaged gradients and parameters, and read nothing outside their range."""
    results = scenarios["flat"]
    assert results[0]["cut_parameters"]  # a range boundary falls inside a parameter
    _assert_whole_tensor_values(results)  # grad_nonfinite is 0: the NaN garbage is not read
    assert [_calls(r) for r in results] == [[("dp", "SUM")]] * 2


def test_pipeline_stages_report_their_layers_and_the_whole_models_global(scenarios):
    """Each stage reports its own layers; global covers both stages (the tied embedding
    once), reduced over pp in one SUM and one MAX for all six metrics."""
    results = scenarios["pipeline"]
    _assert_whole_tensor_values(results)
    layers = [
        {key.split("|")[1] for key in r["observed"] if key.startswith("grad_norm|")}
        for r in results
    ]
    assert layers == [
        {"decoder.layers.0", "decoder.layers.1", "global"},
        {"decoder.layers.2", "decoder.layers.3", "global"},
    ]
    globals_ = [{k: v for k, v in r["observed"].items() if k.endswith("|global")} for r in results]
    assert globals_[0] == pytest.approx(globals_[1])
    assert [sorted(_calls(r)) for r in results] == [[("pp", "MAX"), ("pp", "SUM")]] * 2


def test_expert_parallel_layers_cover_every_ranks_experts(scenarios):
    """Experts held by different ranks under the same names sum over ep; a parameter owned by
    rank 0 counts once (rank 1's stale, even NaN, copy does not)."""
    results = scenarios["ep"]
    _assert_whole_tensor_values(results)
    assert [_calls(r) for r in results] == [[("ep", "SUM")]] * 2


def test_tensor_and_data_parallel_shards_reduce_in_two_stages(scenarios):
    """On a 2 x 2 mesh, tensors split along tp, along dp and tp, and dp-sharded activations
    give the whole-tensor values on all four ranks: round one packs every metric into one
    collective per (axis, op), round two finishes the dp-and-tp tensors over tp."""
    results = scenarios["tp_dp"]
    _assert_whole_tensor_values(results)
    for result in results:
        assert _calls(result) == [("dp", "SUM"), ("tp", "SUM"), ("dp", "MAX"), ("tp", "SUM")]


if __name__ == "__main__":  # one rank, started by the fixture above
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
