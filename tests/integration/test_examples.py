"""The runnable examples: the README's plain loop, and the same loop with DDP under a real
torchrun of two gloo ranks, checked by what the files and the OTLP receiver got."""

from __future__ import annotations

import math

import pytest
from rank_jobs import last_metrics, metric_files, torchrun_args
from support import gloo_or_unavailable, import_or_unavailable

import_or_unavailable("torch")

P = "megatron.training."
SMALL = ["--grad-accum", "2", "--batch-size", "2", "--seq-len", "16", "--max-data-bytes", "200000"]
RUN_SCRIPT = "import runpy; runpy.run_path('examples/train_loop.py', run_name='__main__')"


def test_train_loop_records_the_rate_of_the_step_that_ran(run_python, tmp_path):
    """The plain loop runs as shipped and logs step 6's learning rate (lr * 6 / warmup), its
    tokens over the step time, to the embedded default's files."""
    steps, warmup, lr = 6, 10, 0.01
    args = ["--steps", str(steps), "--log-interval", str(steps), "--warmup", str(warmup)]
    result = run_python(
        RUN_SCRIPT,
        args=[*args, "--lr", str(lr), *SMALL],
        env={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)},
        timeout_s=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"step {steps} |" in result.stdout
    (path,) = metric_files(tmp_path)
    rank = last_metrics(path)
    assert (rank.resource["dl.rank"], rank.resource["dl.world_size"]) == (0, 1)
    # Step s runs at lr * s / warmup; the next step's rate would be lr * 7 / 10.
    assert rank.gauges[P + "learning_rate"] == pytest.approx(lr * steps / warmup, rel=1e-12)
    count, total_ms = rank.histograms[P + "step_duration_ms"]
    assert count == steps
    tokens = steps * 2 * 2 * 16  # steps x micro-batches x sequences x bytes
    assert rank.gauges[P + "tokens_per_sec"] == pytest.approx(tokens / (total_ms / 1000), rel=1e-9)
    assert 0 < rank.gauges[P + "loss"] < math.log(256) + 0.5


def test_train_ddp_under_torchrun_exports_both_ranks(run_python, otlp_receiver, tmp_path):
    """Two gloo ranks export under their own identities and one run id, the same averaged loss
    and averaged gradients, and the job's tokens over each rank's step time."""
    gloo_or_unavailable()
    steps = 4
    result = run_python(
        module="torch.distributed.run",
        args=torchrun_args(
            tmp_path / "logs",
            "examples/train_ddp.py",
            *["--steps", str(steps), "--log-interval", str(steps), *SMALL],
        ),
        env=otlp_receiver.env("grpc"),
        timeout_s=150,
    )
    assert result.returncode == 0, result.stderr[-4000:]

    last: dict[tuple[int, str], object] = {}  # (rank, name) -> the newest point
    for point in otlp_receiver.metrics():
        key = (point.resource_attributes["dl.rank"], point.name)
        if key not in last or point.time_unix_nano >= last[key].time_unix_nano:
            last[key] = point
    assert {rank for rank, _ in last} == {0, 1}
    resources = [last[(rank, P + "loss")].resource_attributes for rank in (0, 1)]
    assert [r["dl.world_size"] for r in resources] == [2, 2]

    losses = [last[(rank, P + "loss")].value for rank in (0, 1)]
    assert losses[0] == losses[1] and 0 < losses[0] < math.log(256) + 0.5
    assert last[(0, P + "grad_norm")].value == last[(1, P + "grad_norm")].value
    for rank in (0, 1):
        duration = last[(rank, P + "step_duration_ms")]
        assert duration.count == steps
        tokens = 2 * steps * 2 * 2 * 16  # ranks x steps x micro-batches x sequences x bytes
        rate = last[(rank, P + "tokens_per_sec")].value
        assert rate == pytest.approx(tokens / (duration.sum / 1000), rel=1e-9), rank
    assert resources[0]["dl.run.id"] == resources[1]["dl.run.id"]
