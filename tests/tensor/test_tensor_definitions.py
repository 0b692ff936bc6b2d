"""Each built-in tensor metric against a direct torch computation on small models: tied weights,
frozen parameters, parameters without a gradient, empty tensors, micro-batch accumulation."""

from __future__ import annotations

import math

import pytest
from support import import_or_unavailable, l2, new_in_memory_meter

torch = import_or_unavailable("torch")

from torch import nn  # noqa: E402

from otel_training.semconv.attributes import (  # noqa: E402
    MEGATRON_TRAINING_LAYER,
    MEGATRON_TRAINING_ROUTER_EXPERT,
    MEGATRON_TRAINING_ROUTER_STATISTIC,
)
from otel_training.tensor import BUILTIN_METRICS, TensorObserver  # noqa: E402
from otel_training.testing import points  # noqa: E402

P = "megatron.training.tensor."
D, V, E, K = 8, 11, 4, 2


class Layer(nn.Module):
    def __init__(self, router: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.attn = nn.Linear(D, D)
        self.mlp = nn.Linear(D, D)
        self.router = nn.Linear(D, E, bias=False) if router else None
        self.top_k = K
        self.unused = nn.Parameter(torch.randn(3))  # never gets a gradient
        self.empty = nn.Parameter(torch.zeros(0, D))  # an empty tensor

    def forward(self, x):
        h = self.norm(x)
        if self.router is not None:
            h = h * self.router(h).softmax(-1).max(-1, keepdim=True).values
        return x + self.mlp(torch.relu(self.attn(h)))


class Tiny(nn.Module):
    """Embedding tied to the head, two layers (one frozen parameter), a final norm."""

    def __init__(self, router: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Layer(router), Layer(router)])
        self.final_norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.embed.weight
        self.layers[0].attn.bias.requires_grad_(False)

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.final_norm(x))


def _observe(schedule: str, router: bool = False, micro_batches: int = 1, **options):
    torch.manual_seed(0)
    model = Tiny(router)
    sdk = new_in_memory_meter()
    observer = TensorObserver(model, schedule, meter=sdk.meter, **options)
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = [
        module.register_forward_hook(
            lambda m, a, o, name=name: seen.setdefault(name, []).append(o.detach())
        )
        for name, module in model.named_modules()
    ]
    batches = [torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(i))
               for i in range(micro_batches)]  # fmt: skip
    observer.begin_step(1)
    for batch in batches:
        model(batch).square().mean().backward()
    observer.commit()
    for hook in hooks:
        hook.remove()
    return model, observer, _read(sdk.reader), seen


def _read(reader) -> dict[str, dict[tuple, float]]:
    found: dict[str, dict[tuple, float]] = {}
    for name, point in points(reader.get_metrics_data()):
        key = tuple(point.attributes.get(k) for k in (
            MEGATRON_TRAINING_LAYER,
            MEGATRON_TRAINING_ROUTER_STATISTIC,
            MEGATRON_TRAINING_ROUTER_EXPERT,
        ) if k in point.attributes)  # fmt: skip
        found.setdefault(name, {})[key] = point.value
    return found


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return f"decoder.layers.{parts[1]}" if parts[0] == "layers" else None


def _expected_norms(model, grads: bool) -> dict[tuple, float]:
    groups: dict[str, list] = {}
    every = []
    for name, param in model.named_parameters():  # tied weights once
        tensor = param.grad if grads else param.detach()
        if grads and (not param.requires_grad or tensor is None):
            continue
        every.append(tensor)
        if _layer(name):
            groups.setdefault(_layer(name), []).append(tensor)
    expected = {(label,): l2(tensors) for label, tensors in groups.items()}
    expected[("global",)] = l2(every)
    return expected


def test_builtin_names_are_the_names_config_parses():
    """The built-ins are made for exactly config.TENSOR_METRIC_NAMES, in its order, with no
    definition left without a name there; each metric carries its schedule name."""
    from otel_training import config
    from otel_training.tensor import definitions

    assert tuple(BUILTIN_METRICS) == config.TENSOR_METRIC_NAMES
    assert set(definitions._MAKERS) == set(config.TENSOR_METRIC_NAMES)
    for name, make in BUILTIN_METRICS.items():
        assert make().name == name


def test_grad_norm_per_layer_and_global_match_torch():
    """grad_norm: per-layer and global L2 of gradients; frozen and gradient-less params skipped."""
    model, _, values, _ = _observe("grad_norm:1")
    assert model.layers[0].unused.grad is None and model.layers[1].empty.numel() == 0
    expected = _expected_norms(model, grads=True)
    assert values[P + "grad_norm"] == pytest.approx(expected, rel=1e-6)
    total = torch.nn.utils.get_total_norm(
        [p.grad for p in model.parameters() if p.grad is not None]
    )
    assert values[P + "grad_norm"][("global",)] == pytest.approx(float(total), rel=1e-6)


def test_param_norm_counts_tied_weights_once_and_frozen_ones():
    """param_norm: per-layer and global L2 of all parameters; the tied head counts once."""
    model, _, values, _ = _observe("param_norm:1")
    expected = _expected_norms(model, grads=False)
    assert values[P + "param_norm"] == pytest.approx(expected, rel=1e-6)
    twice = math.sqrt(expected[("global",)] ** 2 + float(model.head.weight.detach().square().sum()))
    assert values[P + "param_norm"][("global",)] != pytest.approx(twice, rel=1e-6)


def test_grad_nonfinite_counts_nan_and_inf_elements(in_memory_meter):
    """grad_nonfinite: NaN and infinite gradient elements, per layer and in total."""
    torch.manual_seed(0)
    model = Tiny()
    observer = TensorObserver(model, "grad_nonfinite:1", meter=in_memory_meter.meter)
    observer.begin_step(1)
    model(torch.randint(0, V, (2, 3))).sum().backward()
    model.layers[1].mlp.weight.grad[0, :3] = math.nan
    model.layers[1].attn.bias.grad[1] = math.inf
    model.embed.weight.grad[0, 0] = -math.inf
    observer.commit()
    found = _read(in_memory_meter.reader)[P + "grad_nonfinite"]
    assert found == {("decoder.layers.0",): 0.0, ("decoder.layers.1",): 4.0, ("global",): 5.0}


def test_update_ratio_is_the_relative_size_of_one_optimizer_update(in_memory_meter):
    """update_ratio: ||W_after - W_before|| / ||W_before|| per layer, published a step later."""
    torch.manual_seed(0)
    model = Tiny()
    observer = TensorObserver(model, "update_ratio:2", meter=in_memory_meter.meter)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = after = None
    for step in (1, 2, 3):
        observer.begin_step(step)
        model(torch.randint(0, V, (2, 3))).square().mean().backward()
        observer.commit()
        if step == 2:
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        if step == 2:
            after = {n: p.detach().clone() for n, p in model.named_parameters()}
        if step < 3:
            assert P + "update_ratio" not in _read(
                in_memory_meter.reader
            )  # nothing until a later commit
    found = _read(in_memory_meter.reader)[P + "update_ratio"]
    groups: dict[str, list[str]] = {"global": list(before)}
    for name in before:
        if _layer(name):
            groups.setdefault(_layer(name), []).append(name)
    for label, names in groups.items():
        delta = l2([after[n] - before[n] for n in names])
        assert found[(label,)] == pytest.approx(delta / l2([before[n] for n in names]), rel=1e-5)


def test_activation_rms_and_max_abs_cover_sublayer_outputs_over_micro_batches():
    """activation_rms/max_abs: attention and MLP outputs (not norms), all micro-batches."""
    _, _, values, seen = _observe("activation_rms:1,activation_max_abs:1", micro_batches=3)
    every = []
    for i in (0, 1):
        acts = seen[f"layers.{i}.attn"] + seen[f"layers.{i}.mlp"]
        assert len(acts) == 6  # 2 sites x 3 micro-batches
        every += acts
        rms = l2(acts) / math.sqrt(sum(a.numel() for a in acts))
        assert values[P + "activation_rms"][(f"decoder.layers.{i}",)] == pytest.approx(
            rms, rel=1e-5
        )
        peak = max(float(a.abs().max()) for a in acts)
        assert values[P + "activation_max_abs"][(f"decoder.layers.{i}",)] == pytest.approx(peak)
    rms = l2(every) / math.sqrt(sum(a.numel() for a in every))
    assert values[P + "activation_rms"][("global",)] == pytest.approx(rms, rel=1e-5)


def test_residual_stream_statistics_are_the_layer_outputs():
    """residual_rms/max_abs: the output of each layer module."""
    _, _, values, seen = _observe("residual_rms:1,residual_max_abs:1", micro_batches=2)
    for i in (0, 1):
        outs = seen[f"layers.{i}"]
        rms = l2(outs) / math.sqrt(sum(o.numel() for o in outs))
        assert values[P + "residual_rms"][(f"decoder.layers.{i}",)] == pytest.approx(rms, rel=1e-5)
        peak = max(float(o.abs().max()) for o in outs)
        assert values[P + "residual_max_abs"][(f"decoder.layers.{i}",)] == pytest.approx(peak)


def test_logits_norm_is_the_l2_of_all_output_logits_of_the_step():
    """logits_norm: L2 over the model outputs of every micro-batch, as one global value."""
    _, _, values, seen = _observe("logits_norm:1", micro_batches=2)
    assert values[P + "logits_norm"] == pytest.approx({("global",): l2(seen[""])}, rel=1e-5)


def test_router_balance_and_entropy_match_the_router_logits():
    """router: max/mean, CV and dead fraction of top-k counts; normalised mean entropy."""
    _, observer, values, seen = _observe("router:1", router=True, micro_batches=2)
    assert {s.top_k for s in observer.sites if s.kind.value == "router"} == {K}
    for i in (0, 1):
        logits = torch.cat([t.reshape(-1, E) for t in seen[f"layers.{i}.router"]])
        counts = torch.bincount(logits.topk(K, -1).indices.flatten(), minlength=E).double()
        label = f"decoder.layers.{i}"
        balance = values[P + "router_balance"]
        assert balance[(label, "max_over_mean")] == pytest.approx(
            float(counts.max() / counts.mean())
        )
        assert balance[(label, "coefficient_of_variation")] == pytest.approx(
            float(counts.std(unbiased=False) / counts.mean())
        )
        assert balance[(label, "dead_fraction")] == pytest.approx(
            float((counts == 0).double().mean())
        )
        probs = logits.double().softmax(-1)
        entropy = -(probs * probs.log()).sum(-1).mean() / math.log(E)
        assert values[P + "router_entropy"][(label,)] == pytest.approx(float(entropy), rel=1e-5)
    assert P + "router_expert_load" not in values  # per-expert series only on opt-in


def test_router_dead_experts_are_counted(in_memory_meter):
    """A router that sends every token to the same k experts leaves E - k experts dead."""
    torch.manual_seed(0)
    model = Tiny(router=True)
    with torch.no_grad():
        for layer in model.layers:
            layer.router.weight.zero_()  # equal logits: top-1 is always expert 0
    observer = TensorObserver(
        model,
        "router:1",
        meter=in_memory_meter.meter,
        router_top_k=1,
    )
    observer.begin_step(1)
    model(torch.randint(0, V, (2, 3)))
    observer.commit()
    balance = _read(in_memory_meter.reader)[P + "router_balance"]
    assert balance[("decoder.layers.0", "dead_fraction")] == pytest.approx((E - 1) / E)
    assert balance[("decoder.layers.0", "max_over_mean")] == pytest.approx(E)


def test_router_expert_load_is_opt_in_and_capped():
    """router_expert_load: c_e / sum c per (layer, expert), at most max_expert_series pairs."""
    _, _, values, seen = _observe("router_expert_load:1", router=True, max_expert_series=E + 1)
    loads = values[P + "router_expert_load"]
    assert len(loads) == E + 1  # layer 0 whole, one expert of layer 1
    logits = seen["layers.0.router"][0].reshape(-1, E)
    counts = torch.bincount(logits.topk(K, -1).indices.flatten(), minlength=E).double()
    for expert in range(E):
        assert loads[("decoder.layers.0", expert)] == pytest.approx(
            float(counts[expert] / counts.sum())
        )
    assert set(loads) - {("decoder.layers.0", e) for e in range(E)} == {("decoder.layers.1", 0)}


def test_gradient_of_a_bf16_model_is_reduced_in_fp32(in_memory_meter):
    """Norms of bf16 tensors are accumulated in fp32 and agree with an fp64 computation."""
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(64, 64).to(torch.bfloat16)])
    observer = TensorObserver(model, "param_norm:1", meter=in_memory_meter.meter)
    observer.commit()
    found = _read(in_memory_meter.reader)[P + "param_norm"][("global",)]
    assert found == pytest.approx(l2([p.detach() for p in model.parameters()]), rel=1e-3)
