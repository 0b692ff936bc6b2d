"""What the demo's tensor gauges should be: the tensors of each commit point, kept by patching
TensorObserver (CommitSnapshots), and the values torch gives on them (expected_values). Shared
by tests/tensor/test_tensor_demo.py and, in a child process,
tests/integration/test_tensor_demo_otlp.py."""

from __future__ import annotations

import math

import torch
from support import l2

from otel_training.tensor import TensorObserver

P = "megatron.training.tensor."


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
