"""The demo with --moe exports per-layer gradient and parameter norms, activation RMS and router
balance as gauges, equal to torch computed on the model's tensors at the last commit point."""

from __future__ import annotations

import math

import pytest
from support import import_or_unavailable, l2

torch = import_or_unavailable("torch")

from otel_training import testing  # noqa: E402
from otel_training.demo import DemoConfig, train  # noqa: E402
from otel_training.demo.data import load_stdlib_corpus  # noqa: E402
from otel_training.tensor import TensorObserver  # noqa: E402

P = "megatron.training.tensor."
MOE = {
    "steps": 6, "batch_size": 4, "seq_len": 16, "layers": 2, "d_model": 16, "heads": 2,
    "moe": True, "experts": 4, "top_k": 2, "grad_accum": 2, "warmup": 1, "device": "cpu",
    "quiet": True, "tensor_metrics": "grad_norm:3,param_norm:3,activation_rms:3,router:3",
}  # fmt: skip


class CommitSnapshots:
    """Patches TensorObserver to keep, per due step, the tensors the metrics read: parameters
    and gradients at the commit point, and every router and sublayer output of the step."""

    def __init__(self, monkeypatch) -> None:
        self.params: dict[int, dict[str, torch.Tensor]] = {}
        self.grads: dict[int, dict[str, torch.Tensor]] = {}
        self.outputs: dict[int, dict[str, list[torch.Tensor]]] = {}
        self._hooked: set[int] = set()
        original_begin, original_commit = TensorObserver.begin_step, TensorObserver.commit
        snapshots = self

        def begin_step(observer, step=None):
            for model in observer._models:
                if id(model) not in snapshots._hooked:
                    snapshots._hooked.add(id(model))
                    for name, module in model.named_modules():
                        module.register_forward_hook(
                            lambda m, a, o, name=name, obs=observer: (
                                snapshots.outputs.setdefault(obs.step, {})
                                .setdefault(name, [])
                                .append(o.detach().clone())
                            )
                        )
            return original_begin(observer, step)

        def commit(observer):
            model = observer._models[0]
            self.params[observer.step] = {
                n: p.detach().clone() for n, p in model.named_parameters()
            }
            self.grads[observer.step] = {
                n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
            }
            return original_commit(observer)

        monkeypatch.setattr(TensorObserver, "begin_step", begin_step)
        monkeypatch.setattr(TensorObserver, "commit", commit)


def _gauges(telemetry) -> dict[str, dict[tuple, float]]:
    found: dict[str, dict[tuple, float]] = {}
    for name, point in telemetry.points():
        if name.startswith(P):
            found.setdefault(name, {})[tuple(point.attributes.values())] = point.value
    return found


def expected_values(snapshots: CommitSnapshots, step: int, experts: int, top_k: int) -> dict:
    """The gauge values that torch gives on the tensors of ``step``, keyed like _gauges."""
    expected: dict[str, dict[tuple, float]] = {}
    for family, tensors in (
        ("param_norm", snapshots.params[step]),
        ("grad_norm", snapshots.grads[step]),
    ):
        layers: dict[str, list] = {}
        for name, tensor in tensors.items():
            parts = name.split(".")
            if parts[0] == "blocks":
                layers.setdefault(f"decoder.layers.{parts[1]}", []).append(tensor)
        values = {(label,): l2(group) for label, group in layers.items()}
        values[("global",)] = l2(tensors.values())
        expected[P + family] = values
    outputs = snapshots.outputs[step]
    rms, every = {}, []
    balance, entropy = {}, {}
    for layer in sorted({n.split(".")[1] for n in outputs if n.startswith("blocks.")}):
        acts = outputs[f"blocks.{layer}.attn"] + outputs[f"blocks.{layer}.mlp"]
        every += acts
        label = f"decoder.layers.{layer}"
        rms[(label,)] = l2(acts) / math.sqrt(sum(a.numel() for a in acts))
        logits = torch.cat([t.reshape(-1, experts) for t in outputs[f"blocks.{layer}.mlp.router"]])
        counts = torch.bincount(
            logits.topk(top_k, -1).indices.flatten(), minlength=experts
        ).double()
        balance[(label, "max_over_mean")] = float(counts.max() / counts.mean())
        balance[(label, "coefficient_of_variation")] = float(
            counts.std(unbiased=False) / counts.mean()
        )
        balance[(label, "dead_fraction")] = float((counts == 0).double().mean())
        probs = logits.double().softmax(-1)
        entropy[(label,)] = float(-(probs * probs.log()).sum(-1).mean() / math.log(experts))
    rms[("global",)] = l2(every) / math.sqrt(sum(a.numel() for a in every))
    expected[P + "activation_rms"] = rms
    expected[P + "router_balance"] = balance
    expected[P + "router_entropy"] = entropy
    return expected


def test_moe_demo_gauges_equal_torch_on_the_last_committed_step(monkeypatch):
    """Per-layer grad/param norms, activation RMS and router balance of step 6, as exported."""
    snapshots = CommitSnapshots(monkeypatch)
    telemetry = testing.configure_in_memory()
    config = DemoConfig(**MOE)
    result = train(config, telemetry.meter, corpus=load_stdlib_corpus(max_bytes=200_000))
    assert result.steps == 6 and result.tensor_observer is not None
    assert result.tensor_observer.executor.stats.due_steps == 2  # steps 3 and 6
    found = _gauges(telemetry)
    expected = expected_values(snapshots, 6, config.experts, config.top_k)
    assert set(found) == set(expected)
    for family, values in expected.items():
        assert found[family] == pytest.approx(values, rel=1e-5), family
    assert len(found[P + "grad_norm"]) == 3  # decoder.layers.0, decoder.layers.1, global


def test_demo_tensor_metrics_flag_turns_them_off():
    """--tensor-metrics none: no tensor gauge, no hook."""
    telemetry = testing.configure_in_memory()
    config = DemoConfig(**{**MOE, "steps": 3, "tensor_metrics": "none"})
    result = train(config, telemetry.meter, corpus=load_stdlib_corpus(max_bytes=200_000))
    assert not _gauges(telemetry)
    assert not any(m._forward_hooks for m in result.model.modules())


def test_demo_rejects_an_unknown_tensor_metric():
    """DemoConfig validates --tensor-metrics like every other flag."""
    with pytest.raises(ValueError, match="unknown tensor metric"):
        DemoConfig(tensor_metrics="grad_norm:1,weights:2")
    with pytest.raises(ValueError):
        DemoConfig(tensor_metrics="grad_norm")
