"""The demo with --moe exports per-layer gradient and parameter norms, activation RMS and router
balance as gauges, equal to torch computed on the model's tensors at the last commit point."""

from __future__ import annotations

import pytest
from support import import_or_unavailable

torch = import_or_unavailable("torch")

from tensor_demo_values import CommitSnapshots, P, expected_values  # noqa: E402

from otel_training import testing  # noqa: E402
from otel_training.demo import DemoConfig, train  # noqa: E402
from otel_training.demo.data import load_stdlib_corpus  # noqa: E402

MOE = {
    "steps": 6, "batch_size": 4, "seq_len": 16, "layers": 2, "d_model": 16, "heads": 2,
    "moe": True, "experts": 4, "top_k": 2, "grad_accum": 2, "warmup": 1, "device": "cpu",
    "quiet": True, "tensor_metrics": "grad_norm:3,param_norm:3,activation_rms:3,router:3",
}  # fmt: skip


def _gauges(telemetry) -> dict[str, dict[tuple, float]]:
    found: dict[str, dict[tuple, float]] = {}
    for name, point in telemetry.points():
        if name.startswith(P):
            found.setdefault(name, {})[tuple(point.attributes.values())] = point.value
    return found


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
