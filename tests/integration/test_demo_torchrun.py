"""`otel-training demo` under a real `torchrun --nproc_per_node=2` on gloo: data-parallel
training on disjoint shards, what each rank exports to the embedded default's files, and what
rank 0 prints."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rank_jobs import (
    RankMetrics,
    last_metrics,
    metric_files,
    rank_stdout,
    torchrun_args,
)
from support import child_env, gloo_or_unavailable, import_or_unavailable

P = "megatron.training."
STEPS, BATCH, SEQ, LAYERS, D_MODEL = 6, 4, 32, 1, 32
DEMO = [
    "demo", "--steps", str(STEPS), "--log-interval", str(STEPS), "--layers", str(LAYERS),
    "--d-model", str(D_MODEL), "--heads", "2", "--seq-len", str(SEQ), "--batch-size", str(BATCH),
    "--warmup", "2", "--max-data-bytes", "200000", "--checkpoint-interval", str(STEPS),
]  # fmt: skip
RANK_LINE = re.compile(r"rank (\d+): own loss ([\d.]+) on its shard \| parameters sha256 (\w+)")


class Job:
    """A finished two-rank demo: each rank's stdout and last metrics snapshot."""

    def __init__(self, root: Path, stdout: list[str], output: Path, checkpoints: Path) -> None:
        self.root, self.stdout, self.output, self.checkpoints = root, stdout, output, checkpoints
        files = metric_files(output)
        self.metrics: dict[int, RankMetrics] = {}
        for path in files:
            snapshot = last_metrics(path)
            self.metrics[snapshot.resource["dl.rank"]] = snapshot


@pytest.fixture(scope="module")
def job(tmp_path_factory, repo_root) -> Job:
    import_or_unavailable("torch")
    gloo_or_unavailable()
    root = tmp_path_factory.mktemp("demo2")
    output, checkpoints, logs = root / "telemetry", root / "checkpoints", root / "logs"
    env = child_env(OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(output))
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun_args(
            logs, "otel_training.cli", *DEMO, "--checkpoint-dir", str(checkpoints), module=True
        ),
    ]
    try:
        done = subprocess.run(
            argv, env=env, cwd=root, capture_output=True, text=True, timeout=180,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the two-rank demo still ran after 180 s: {exc.stderr!r}")
    assert done.returncode == 0, done.stderr[-4000:]
    return Job(root, [rank_stdout(logs, rank) for rank in (0, 1)], output, checkpoints)


def _own_lines(job: Job) -> dict[int, tuple[float, str]]:
    return {int(r): (float(loss), sha) for r, loss, sha in RANK_LINE.findall(job.stdout[0])}


def test_each_rank_exports_under_its_own_identity_and_one_run_id(job):
    """Two files, dl.rank 0 and 1 of dl.world_size 2, one dl.run.id for the job."""
    assert sorted(job.metrics) == [0, 1]
    resources = [job.metrics[rank].resource for rank in (0, 1)]
    assert [(r["dl.rank"], r["dl.world_size"]) for r in resources] == [(0, 2), (1, 2)]
    assert resources[0]["service.instance.id"] != resources[1]["service.instance.id"]
    assert resources[0]["dl.run.id"] == resources[1]["dl.run.id"]


def test_exported_loss_is_the_mean_over_ranks(job):
    """Both ranks export the same loss, the mean of the ranks' own losses on their (different)
    shards that rank 0 prints."""
    losses = [job.metrics[rank].gauges[P + "loss"] for rank in (0, 1)]
    assert losses[0] == losses[1]
    own = _own_lines(job)
    assert sorted(own) == [0, 1]
    assert own[0][0] != own[1][0]  # disjoint data: the ranks' own losses differ
    assert losses[0] == pytest.approx((own[0][0] + own[1][0]) / 2, abs=1e-4)
    assert 0 < losses[0] < math.log(256) + 0.5


def test_tokens_per_sec_is_the_whole_jobs_and_tflops_per_gpu(job):
    """tokens/s = both ranks' tokens / this rank's step time; TFLOP/s divides it per device."""
    from otel_training.demo.data import VOCAB_SIZE
    from otel_training.demo.model import GPT, GPTConfig
    from otel_training.metrics.throughput import gpt_flops_per_token

    model = GPT(GPTConfig(seq_len=SEQ, n_layers=LAYERS, d_model=D_MODEL, n_heads=2))
    flops = gpt_flops_per_token(
        model.active_non_embedding_params(), LAYERS, D_MODEL, SEQ, vocab_size=VOCAB_SIZE
    )
    tokens = 2 * STEPS * BATCH * SEQ  # both ranks, --batch-size per rank
    for rank in (0, 1):
        snapshot = job.metrics[rank]
        count, total_ms = snapshot.histograms[P + "step_duration_ms"]
        assert count == STEPS
        rate = snapshot.gauges[P + "tokens_per_sec"]
        assert rate == pytest.approx(tokens / (total_ms / 1000), rel=1e-9), rank
        tflops = snapshot.gauges[P + "throughput_tflops"]
        assert tflops == pytest.approx(flops * rate / 2 / 1e12, rel=1e-9), rank


def test_ddp_keeps_the_replicas_identical(job):
    """Gradients are averaged (the same grad norm on both ranks) and the parameters end
    bitwise equal; rank 0 alone saved the checkpoint."""
    grads = [job.metrics[rank].gauges[P + "grad_norm"] for rank in (0, 1)]
    assert grads[0] == grads[1]
    own = _own_lines(job)
    assert own[0][1] == own[1][1]
    assert [p.name for p in job.checkpoints.iterdir()] == [f"step-{STEPS:06d}.pt"]


def test_rank_zero_prints_and_names_the_files_last(job):
    """Rank 0 prints the summary, its last line names the run's directory (absolute, holding
    both ranks' files) and the report and trace commands; rank 1 prints nothing."""
    assert job.stdout[1] == ""
    lines = job.stdout[0].rstrip("\n").splitlines()
    assert any(line.startswith(f"step {STEPS}/{STEPS} | loss") for line in lines)
    assert "data parallel: 2 ranks (gloo)" in job.stdout[0]
    match = re.search(r"otel-training report (\S+)", lines[-1])
    assert match and "otel-training trace" in lines[-1]
    directory = Path(match.group(1))
    assert directory.is_absolute()
    assert {p.name for p in directory.glob("metrics-rank*.jsonl")} == {
        "metrics-rank0.jsonl",
        "metrics-rank1.jsonl",
    }
