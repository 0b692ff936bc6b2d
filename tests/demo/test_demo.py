"""The demo: a byte-level GPT trained in-process with a tiny config, and the CLI around it."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from doc_rules import documents
from support import import_or_unavailable

torch = import_or_unavailable("torch")

from otel_training import cli, testing  # noqa: E402
from otel_training.demo import DemoConfig, train  # noqa: E402
from otel_training.demo.data import load_stdlib_corpus, stdlib_source_files  # noqa: E402
from otel_training.semconv.metrics import (  # noqa: E402
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)

TINY = {
    "batch_size": 8,
    "seq_len": 32,
    "layers": 1,
    "d_model": 32,
    "heads": 2,
    "lr": 1e-2,
    "warmup": 3,
    "device": "cpu",
    "quiet": True,
}


@pytest.fixture(scope="module")
def corpus():
    return load_stdlib_corpus(max_bytes=2 * 2**20)


def _config(**overrides) -> DemoConfig:
    return DemoConfig(**{**TINY, **overrides})


def test_stdlib_corpus_is_deterministic_and_split():
    """The stdlib file list is sorted, skips site-packages, and yields train and held-out bytes."""
    files = stdlib_source_files()
    assert files == stdlib_source_files()
    assert not any("site-packages" in p.parts for p in files)
    a = load_stdlib_corpus(max_bytes=2**20)
    b = load_stdlib_corpus(max_bytes=2**20)
    assert torch.equal(a.train, b.train) and torch.equal(a.eval, b.eval)
    assert a.eval.numel() > 0 and a.train.numel() > a.eval.numel()


def test_batches_are_shifted_windows(corpus):
    """Targets are the inputs shifted by one byte, drawn deterministically from a seed."""
    x, y = corpus.batch("train", 4, 16, torch.Generator().manual_seed(0))
    x2, _ = corpus.batch("train", 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x, x2)


def test_loss_falls_over_a_short_run(corpus):
    """Thirty steps of a tiny model bring the interval loss well below its first value."""
    result = train(
        _config(steps=30, log_interval=10), testing.configure_in_memory().meter, corpus=corpus
    )
    assert result.steps == 30
    assert result.interval_steps == [10, 20, 30]
    assert all(math.isfinite(v) for v in result.interval_losses)
    assert result.first_loss < math.log(256) + 0.1
    assert result.last_loss < result.first_loss - 0.5


def test_records_the_megatron_metrics_without_memory_on_cpu(corpus):
    """The loss, grad norm, LR, tokens/s, TFLOP/s and step-duration metrics are recorded;
    memory is not on CPU."""
    pipeline = testing.configure_in_memory()
    train(_config(steps=4, log_interval=2), pipeline.meter, corpus=corpus)
    names = {name for name, _ in pipeline.points() if not name.startswith("dl.training.")}
    assert names == {
        MEGATRON_TRAINING_STEP_DURATION_MS,
        MEGATRON_TRAINING_LOSS,
        MEGATRON_TRAINING_GRAD_NORM,
        MEGATRON_TRAINING_LEARNING_RATE,
        MEGATRON_TRAINING_TOKENS_PER_SEC,
        MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    }
    assert MEGATRON_TRAINING_MEMORY_ALLOCATED_GB not in names
    ((_, tflops),) = pipeline.points(MEGATRON_TRAINING_THROUGHPUT_TFLOPS)
    assert tflops.value > 0


def test_one_step_duration_point_per_optimizer_step(corpus):
    """The step-duration histogram gets exactly one point per optimizer step."""
    pipeline = testing.configure_in_memory()
    train(_config(steps=7, log_interval=3, grad_accum=2), pipeline.meter, corpus=corpus)
    ((_, histogram),) = pipeline.points(MEGATRON_TRAINING_STEP_DURATION_MS)
    assert histogram.count == 7


@documents("README.md", "The demo and the callbacks report the job's rate")
@pytest.mark.parametrize(("grad_accum", "batch_size"), [(1, 8), (4, 2)])
def test_tokens_per_sec_counts_every_micro_batch(corpus, grad_accum, batch_size):
    """tokens/s = all micro-batches' tokens / summed step time, whatever the accumulation."""
    steps, seq_len = 4, 32
    pipeline = testing.configure_in_memory()
    config = _config(
        steps=steps,
        log_interval=steps,
        grad_accum=grad_accum,
        batch_size=batch_size,
        seq_len=seq_len,
    )
    result = train(config, pipeline.meter, corpus=corpus)
    ((_, histogram),) = pipeline.points(MEGATRON_TRAINING_STEP_DURATION_MS)
    ((_, rate),) = pipeline.points(MEGATRON_TRAINING_TOKENS_PER_SEC)
    tokens = steps * grad_accum * batch_size * seq_len
    assert tokens == steps * 8 * seq_len  # same global batch in both cases
    assert rate.value == pytest.approx(tokens / (histogram.sum / 1000), rel=1e-6)
    assert result.interval_tokens_per_sec == [pytest.approx(rate.value)]


def test_inject_nonfinite_skips_the_step(corpus):
    """--inject-nonfinite-at makes that step's loss NaN: it is skipped and counted, the
    recorded loss stays finite."""
    pipeline = testing.configure_in_memory()
    result = train(
        _config(steps=6, log_interval=3, inject_nonfinite_at=2), pipeline.meter, corpus=corpus
    )
    assert result.skipped_iters == 1
    ((_, skipped),) = pipeline.points(MEGATRON_TRAINING_SKIPPED_ITERS)
    assert skipped.value == 1
    assert all(math.isfinite(v) for v in result.interval_losses)
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


def test_moe_runs_and_exposes_routers(corpus):
    """--moe trains, and each block has a hookable module named `router` giving logits[T, E]."""
    config = _config(steps=3, log_interval=3, moe=True, experts=4, top_k=2)
    result = train(config, testing.configure_in_memory().meter, corpus=corpus)
    routers = {name: m for name, m in result.model.named_modules() if name.endswith(".router")}
    assert list(routers) == ["blocks.0.mlp.router"]
    seen = []
    routers["blocks.0.mlp.router"].register_forward_hook(lambda m, i, out: seen.append(out))
    result.model(torch.zeros(2, 5, dtype=torch.long))
    assert seen[0].shape == (10, 4)
    assert math.isfinite(result.last_loss)
    aux = result.model.aux_loss()
    assert aux is not None and aux.item() >= 1.0 - 1e-4  # 1.0 is perfectly balanced


def test_eval_interval_reports_held_out_loss(corpus):
    """--eval-interval adds held-out losses at that interval and at the end."""
    result = train(
        _config(steps=5, log_interval=5, eval_interval=2, eval_batches=2),
        testing.configure_in_memory().meter,
        corpus=corpus,
    )
    assert [step for step, _ in result.eval_losses] == [2, 4, 5]
    assert all(math.isfinite(loss) for _, loss in result.eval_losses)


def test_inject_flag_is_hidden_from_help(capsys):
    """`demo --help` lists the flags but not the test-only --inject-nonfinite-at."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--grad-accum" in out and "--moe" in out
    assert "--inject-nonfinite-at" not in out
    # each default once, in words where it is None: never "(default: None)"
    assert "(default: None)" not in out and "(default: 400)" in " ".join(out.split())
    assert " ".join(out.split()).count("(default: a temporary one, removed at exit)") == 1


def test_cli_demo_writes_telemetry(tmp_path, capsys):
    """`otel-training demo` trains, prints the summary with the destination, and exports."""
    argv = [
        "demo",
        "--steps",
        "2",
        "--log-interval",
        "1",
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "2",
        "--quiet",
        "--device",
        "cpu",
        "--max-data-bytes",
        "200000",
    ]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "over 2 steps" in out and "telemetry" in out
    files = list((tmp_path / "telemetry").rglob("metrics*"))
    assert files
    exported = "".join(f.read_text() for f in files)
    names = {
        m["name"]
        for line in exported.splitlines()
        if line.strip()
        for rm in json.loads(line)["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for m in sm["metrics"]
    }
    assert MEGATRON_TRAINING_LOSS in names and MEGATRON_TRAINING_STEP_DURATION_MS in names


def test_cli_without_torch_says_how_to_install(monkeypatch, capsys):
    """Without torch, `demo` exits 1 with the `pip install -e '.[torch]'` hint."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real_find_spec(name, *a),
    )
    assert cli.main(["demo"]) == 1
    assert "pip install -e '.[torch]' in the otel-training checkout" in capsys.readouterr().err


def test_cli_version(capsys):
    """`--version` prints the package version and exits 0."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("otel-training ")


def test_the_demo_resumes_from_the_newest_checkpoint(tmp_path, capsys, monkeypatch):
    """A second run with the same --checkpoint-dir loads its newest checkpoint (a
    checkpoint_load the health ledger records) and trains the steps after it: two attempts of
    one job, the second resumed from step 6."""
    from otel_training.report.health import assess_job

    monkeypatch.setenv("OTEL_PYTHON_TRAINING_RUN_ID", "demo-job")
    small = ["--layers", "1", "--d-model", "16", "--heads", "2", "--seq-len", "16",
             "--batch-size", "2", "--quiet", "--device", "cpu", "--max-data-bytes", "200000",
             "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "3",
             "--log-interval", "1"]  # fmt: skip
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_RUN_ATTEMPT", "0")
    assert cli.main(["demo", "--steps", "6", *small]) == 0
    assert "resumed" not in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "step-000003.pt", "step-000006.pt",
    ]  # fmt: skip
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_RUN_ATTEMPT", "1")
    assert cli.main(["demo", "--steps", "9", *small]) == 0
    out = capsys.readouterr().out
    assert "over 3 steps, resumed from step 6" in out and "otel-training health" in out
    health = assess_job(tmp_path / "telemetry").to_json()
    first, second = health["attempts"]
    assert (first["attempt"], first["last_iteration"]) == (0, 6)
    assert (second["attempt"], second["resumed_from"], second["last_iteration"]) == (1, 6, 9)
    assert health["badput_s"]["checkpoint_load"] > 0
