"""The demo's data parallelism in one process: shards, device choice, the launcher check, and
collectives that are the identity without other ranks (two ranks: tests/integration)."""

from __future__ import annotations

import pytest
from support import import_or_unavailable

torch = import_or_unavailable("torch")

from otel_training.demo import TrainResult  # noqa: E402
from otel_training.demo.data import ByteCorpus  # noqa: E402
from otel_training.demo.distributed import (  # noqa: E402
    DataParallel,
    parameter_digest,
    resolve_device,
)
from otel_training.demo.train import RankSummary, format_summary  # noqa: E402


def test_shards_are_disjoint_contiguous_and_cover_each_split():
    """Three ranks' shards, in rank order, are the whole train and held-out streams."""
    corpus = ByteCorpus(
        train=torch.arange(100, dtype=torch.uint8),
        eval=torch.arange(10, dtype=torch.uint8),
        n_files=2,
    )
    shards = [corpus.shard(rank, 3) for rank in range(3)]
    assert torch.equal(torch.cat([s.train for s in shards]), corpus.train)
    assert torch.equal(torch.cat([s.eval for s in shards]), corpus.eval)
    assert [s.train.numel() for s in shards] == [33, 33, 34]
    with pytest.raises(ValueError):
        corpus.shard(3, 3)


def test_without_a_launcher_nothing_is_initialised(monkeypatch):
    """Outside torchrun, setup gives rank 0 of 1, no backend, and no process group."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    data_parallel = DataParallel.setup("cpu")
    assert (data_parallel.rank, data_parallel.world_size, data_parallel.backend) == (0, 1, None)
    assert not torch.distributed.is_initialized()
    value = torch.tensor(2.5)
    assert data_parallel.average(value) is value
    assert data_parallel.gather("x") == ["x"]
    data_parallel.close()  # nothing to destroy


def test_slurm_tasks_without_torchrun_are_refused(monkeypatch):
    """Two SLURM tasks without torchrun's variables would train two unrelated copies: refused."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    with pytest.raises(ValueError, match="torchrun"):
        DataParallel.setup("cpu")


def test_devices_follow_the_local_rank_and_the_machine():
    """auto is CPU without CUDA; a CUDA device or a second CPU this machine lacks is refused."""
    if torch.cuda.is_available():
        assert resolve_device("cuda", local_rank=0) == torch.device("cuda", 0)
    else:
        assert resolve_device("auto", local_rank=1) == torch.device("cpu")
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda", local_rank=1)
    with pytest.raises(ValueError):
        resolve_device("cpu:1")
    with pytest.raises(ValueError):
        resolve_device("no-such-device")


def test_parameter_digest_sees_one_changed_bit():
    """Equal tensors give equal digests; flipping the lowest bit of one value changes it."""
    params = [torch.randn(3, 4), torch.randn(5)]
    copy = [p.clone() for p in params]
    assert parameter_digest(params) == parameter_digest(copy)
    copy[1].view(torch.int32)[2] ^= 1
    assert parameter_digest(params) != parameter_digest(copy)


def test_summary_names_the_ranks_and_ends_with_how_to_view_the_files(tmp_path):
    """Two ranks: the summary lists each rank's own loss and digest; the last line names the
    directory with the report and trace commands."""
    result = TrainResult(
        steps=4,
        skipped_iters=0,
        interval_steps=[4],
        interval_losses=[2.5],
        interval_tokens_per_sec=[1000.0],
        interval_tflops=[0.1],
        eval_losses=[],
        wall_time_s=1.0,
        flops_per_token=1.0,
        n_params=1,
        device="cpu",
        model=torch.nn.Linear(1, 1),
        world_size=2,
        backend="gloo",
        ranks=[RankSummary(0, 2.4, "a" * 64), RankSummary(1, 2.6, "a" * 64)],
    )
    lines = format_summary(result, "telemetry: metrics to X", str(tmp_path)).splitlines()
    assert "parameters identical on every rank" in "\n".join(lines)
    assert any("rank 1: own loss 2.6000" in line for line in lines)
    assert f"otel-training trace {tmp_path}" in lines[-1]
    assert f"otel-training report {tmp_path}" in lines[-1]
    assert lines[-1].endswith(f"otel-training health {tmp_path}")


def test_an_expert_no_token_chose_still_gets_a_zero_gradient():
    """DDP needs every parameter in every step's graph: unchosen experts get zero gradients."""
    from otel_training.demo.model import GPTConfig, MoE

    moe = MoE(GPTConfig(d_model=4, n_heads=1, moe=True, n_experts=4, top_k=2))
    with torch.no_grad():  # every positive token prefers experts 0 and 1
        moe.router.weight.copy_(torch.tensor([[1.0] * 4, [0.5] * 4, [-1.0] * 4, [-1.0] * 4]))
    moe(torch.rand(2, 3, 4) + 0.1).sum().backward()
    for e in (2, 3):
        grads = [p.grad for p in moe.experts[e].parameters()]
        assert all(g is not None and not g.any() for g in grads), e
    assert moe.experts[0].fc.weight.grad.any()
