"""`otel-training demo --moe` sends per-layer gradient and parameter norms, activation RMS and
router balance as gauges to a real OTLP receiver, equal to torch on the last committed step."""

from __future__ import annotations

import json

import pytest
from support import import_or_unavailable

import_or_unavailable("torch")

DEMO = [
    "demo", "--moe", "--steps", "6", "--batch-size", "4", "--seq-len", "16", "--layers", "2",
    "--d-model", "16", "--heads", "2", "--experts", "4", "--top-k", "2", "--grad-accum", "2",
    "--warmup", "1", "--device", "cpu", "--quiet", "--max-data-bytes", "200000",
    "--tensor-metrics", "grad_norm:3,param_norm:3,activation_rms:3,router:3",
]  # fmt: skip

# The CLI itself runs in the child; CommitSnapshots (tests/tensor_demo_values.py)
# records the tensors of each commit point so that the child can also write the values torch
# gives on them.
DRIVER = r"""
import json, sys
sys.path.insert(0, "tests")
import pytest
from tensor_demo_values import CommitSnapshots, expected_values
snapshots = CommitSnapshots(pytest.MonkeyPatch())
from otel_training.cli import main
status = main(sys.argv[2:])
expected = expected_values(snapshots, 6, experts=4, top_k=2)
with open(sys.argv[1], "w") as out:
    json.dump({f: [[list(k), v] for k, v in values.items()] for f, values in expected.items()}, out)
sys.exit(status)
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_moe_demo_exports_tensor_gauges_equal_to_torch(
    run_python, otlp_receiver, tmp_path, protocol
):
    """The receiver gets each family as a gauge with its unit; values match torch at step 6."""
    expected_path = tmp_path / "expected.json"
    env = {**otlp_receiver.env(protocol), "OTEL_METRIC_EXPORT_INTERVAL": "600000"}
    result = run_python(DRIVER, args=[str(expected_path), *DEMO], env=env, timeout_s=180)
    assert result.returncode == 0, result.stderr[-4000:]
    expected = {
        family: {tuple(key): value for key, value in pairs}
        for family, pairs in json.loads(expected_path.read_text()).items()
    }
    received: dict[str, dict[tuple, float]] = {}
    for point in otlp_receiver.metrics():
        if point.name.startswith("megatron.training.tensor."):
            assert (point.kind, point.unit) == ("gauge", "1"), point.name
            received.setdefault(point.name, {})[tuple(point.attributes.values())] = point.value
    assert set(received) == set(expected)
    for family, values in expected.items():
        assert received[family] == pytest.approx(values, rel=1e-5), family
    layers = {key[0] for key in received["megatron.training.tensor.grad_norm"]}
    assert layers == {"decoder.layers.0", "decoder.layers.1", "global"}
    assert {key[1] for key in received["megatron.training.tensor.router_balance"]} == {
        "max_over_mean",
        "coefficient_of_variation",
        "dead_fraction",
    }
