"""The main job end to end: `otel-training demo` trains on real text and its eight metrics
reach a real OTLP receiver (gRPC and OTLP/HTTP), or local OTLP-JSON files by default."""

from __future__ import annotations

import json
import math
import re

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

P = "megatron.training."
SMALL = [
    "demo", "--steps", "12", "--log-interval", "4", "--layers", "1", "--d-model", "32",
    "--heads", "2", "--seq-len", "32", "--batch-size", "4", "--warmup", "2",
    "--lr", "0.003", "--max-data-bytes", "200000", "--inject-nonfinite-at", "8",
]  # fmt: skip
LOG_LINE = re.compile(
    r"step (\d+)/\d+ \| loss ([\d.]+) \| lr ([\d.e+-]+) \| grad ([\w.]+) \| ([\d,]+) tok/s"
)


def _intervals(stdout: str) -> dict[int, dict[str, float]]:
    found = {}
    for match in LOG_LINE.finditer(stdout):
        step, loss, lr, grad, rate = match.groups()
        found[int(step)] = {
            "loss": float(loss),
            "lr": float(lr),
            "grad": float(grad),
            "rate": float(rate.replace(",", "")),
        }
    return found


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_demo_delivers_the_eight_metrics_over_otlp(run_python, otlp_receiver, protocol):
    """Names, kinds, units and values of the demo's metrics as an OTLP receiver gets them."""
    result = run_python(
        module="otel_training.cli", args=SMALL, env=otlp_receiver.env(protocol), timeout_s=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OTLP/" in result.stdout + result.stderr  # the summary says where telemetry went
    printed = _intervals(result.stdout)
    assert sorted(printed) == [4, 8, 12]

    points = {
        p.name: p
        for p in otlp_receiver.metrics()
        # tensor metrics: tests/integration/test_tensor*; the health ledger's and what full
        # queues dropped: below
        if not p.name.startswith((P + "tensor.", "dl.training.", "otel_training."))
    }
    dropped = {p.name: p.value for p in otlp_receiver.metrics() if p.name.endswith(".dropped")}
    assert dropped == {"otel_training.log_record.dropped": 0, "otel_training.span.dropped": 0}
    health = {p.name for p in otlp_receiver.metrics() if p.name.startswith("dl.training.")}
    assert {
        "dl.training.phase.time",
        "dl.training.phase.elapsed",
        "dl.training.progress.iteration",
        "dl.training.progress.age",
    } <= health
    assert set(points) == {
        P + "step_duration_ms",
        P + "loss",
        P + "throughput_tflops",
        P + "grad_norm",
        P + "skipped_iters",
        P + "learning_rate",
        P + "tokens_per_sec",
        P + "nonfinite_values",
    }  # memory_allocated_gb only on CUDA
    assert {p.protocol for p in points.values()} == {"grpc" if protocol == "grpc" else "http"}

    duration = points[P + "step_duration_ms"]
    assert (duration.kind, duration.unit) == ("histogram", "ms")
    assert duration.count == 12  # one point per optimizer step
    assert duration.explicit_bounds[-1] == 1_800_000
    assert duration.temporality == "cumulative"

    skipped = points[P + "skipped_iters"]
    assert (skipped.kind, skipped.is_monotonic, skipped.value) == ("sum", True, 1)

    # Step 8 was made non-finite: its NaN grad norm is counted, not silently dropped.
    nonfinite = points[P + "nonfinite_values"]
    assert nonfinite.value == 1
    assert nonfinite.attributes == {P + "metric": P + "grad_norm"}

    last = printed[12]
    for name in ("loss", "throughput_tflops", "grad_norm", "learning_rate", "tokens_per_sec"):
        assert points[P + name].kind == "gauge", name
        assert points[P + name].unit == "", name
        assert points[P + name].attributes == {}, name
    assert points[P + "loss"].value == pytest.approx(last["loss"], abs=5e-4)
    assert points[P + "grad_norm"].value == pytest.approx(last["grad"], abs=5e-3)
    assert points[P + "learning_rate"].value == pytest.approx(last["lr"], rel=0.05)
    assert points[P + "tokens_per_sec"].value == pytest.approx(last["rate"], rel=1e-3, abs=1)
    assert 0 < points[P + "loss"].value < math.log(256) + 0.5
    assert points[P + "throughput_tflops"].value > 0

    resource = points[P + "loss"].resource_attributes
    assert resource["service.name"] == "otel-training-demo"
    assert (resource["dl.rank"], resource["dl.world_size"]) == (0, 1)


def test_demo_writes_the_embedded_default_files(run_python, tmp_path):
    """With nothing configured the demo writes OTLP-JSON files that parse, and says where."""
    out = tmp_path / "telemetry"
    result = run_python(
        module="otel_training.cli",
        args=SMALL,
        env={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out)},
        timeout_s=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = (out / "latest").resolve()
    assert run.parent == out
    assert str(run / "metrics-rank0.jsonl") in result.stdout + result.stderr
    lines = (run / "metrics-rank0.jsonl").read_text().splitlines()
    assert lines
    names = set()
    for line in lines:
        request = json_format.Parse(line, ExportMetricsServiceRequest())
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                names.update(m.name for m in sm.metrics)
    assert {P + "loss", P + "step_duration_ms", P + "tokens_per_sec"} <= names
    assert json.loads(lines[-1])["resourceMetrics"]


def test_default_demo_loss_falls(run_python, tmp_path):
    """The demo's loss falls visibly within a short run of the default model."""
    result = run_python(
        module="otel_training.cli",
        args=["demo", "--steps", "60", "--log-interval", "20"],
        env={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)},
        timeout_s=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [v["loss"] for _, v in sorted(_intervals(result.stdout).items())]
    assert len(losses) == 3
    assert losses[-1] < losses[0] - 0.5, losses
