"""OtelTrainingCallback in real Hugging Face Trainer runs on CPU (a tiny GPT-2 built from a
GPT2Config), exporting to a real OTLP receiver: what arrives equals ``state.log_history`` and
what the test measured itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doc_rules import documents
from framework_checks import (
    STEP,
    by_step_count,
    classify,
    collections_by_rank,
    iteration_spans,
    last_collection,
    rate_bounds,
    receiver_run,
    runs,
    tensor_gauges,
)
from support import import_or_unavailable, l2

from otel_training.semconv.attributes import MEGATRON_CHECKPOINT_PATH, MEGATRON_ITERATION

HERE = Path(__file__).resolve().parent
SEQ = 32


@pytest.fixture
def trainer_run(monkeypatch, otlp_receiver):
    """``run(root, **kwargs)``: transformers_run.train in this process, exporting to the
    receiver (framework_checks.receiver_run)."""
    return receiver_run("transformers", monkeypatch, otlp_receiver)


@documents("README.md", "the scheduler's learning rate at the logged step")
@documents("README.md", "global L2 norm of all gradients, before clipping")
@documents("README.md", "wall time of one optimizer step (all micro-batches); one point per step")
def test_metrics_equal_the_log_history_and_what_the_test_measured(
    trainer_run, otlp_receiver, tmp_path
):
    """Per logging step: loss, grad_norm and learning_rate equal log_history; tokens/s under
    gradient_accumulation_steps=4 equals the interval's tokens over its wall time; one step
    point per optimizer step; tensor gauges equal torch's norms at the last commit."""
    accumulate, batch, every, steps = 4, 2, 2, 6
    result = trainer_run(
        tmp_path,
        callback_kwargs={"tensor_metrics": "grad_norm:3,param_norm:3"},
        args_kwargs={"gradient_accumulation_steps": accumulate, "logging_steps": every},
        snapshot_every=3,
    )
    trainer, before, after = result["trainer"], result["before"], result["after"]
    assert trainer.state.global_step == steps
    found = collections_by_rank(otlp_receiver)[0]
    final = last_collection(found)
    assert final[STEP][0].count == steps

    logged = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(logged) == [2, 4, 6]
    for metric in ("loss", "grad_norm", "learning_rate"):
        arrived = by_step_count(found, f"megatron.training.{metric}")
        assert arrived == pytest.approx({s: logged[s][metric] for s in logged}, rel=1e-6), metric

    rates = by_step_count(found, "megatron.training.tokens_per_sec")
    ends = [before["train_begin"], *before["step_ends"]]
    after_ends = [after["train_begin"], *after["step_ends"]]
    for last in logged:
        tokens = every * accumulate * batch * SEQ  # input_ids elements of the interval
        low, high = rate_bounds(tokens, ends, after_ends, last - every + 1, last)
        assert low <= rates[last] <= high, last

    flops = by_step_count(found, "megatron.training.throughput_tflops")
    assert set(flops) == set(logged) and all(v > 0 for v in flops.values())
    assert "megatron.training.skipped_iters" not in final

    snapshot = before["snapshots"][steps]
    for family in ("grad_norm", "param_norm"):
        kind = family.split("_")[0]
        values = {k.split(":", 1)[1]: v for k, v in snapshot.items() if k.startswith(kind + ":")}
        expected = {"global": l2(values.values())}
        for layer in ("0", "1"):
            expected[f"decoder.layers.{layer}"] = l2(
                v for name, v in values.items() if name.startswith(f"transformer.h.{layer}.")
            )
        assert tensor_gauges(final, family) == pytest.approx(expected, rel=1e-5), family


def test_spans_of_iterations_updates_evaluations_and_checkpoint_saves(
    trainer_run, otlp_receiver, tmp_path
):
    """Iterations with their optimizer spans, one span per evaluation and per checkpoint
    directory the Trainer wrote, each save after the evaluation it follows."""
    result = trainer_run(
        tmp_path,
        callback_kwargs={"tensor_metrics": "none"},
        args_kwargs={
            "eval_strategy": "steps",
            "eval_steps": 2,
            "save_strategy": "steps",
            "save_steps": 3,
        },
    )
    trainer = result["trainer"]
    spans = otlp_receiver.spans()
    roles = classify(spans)
    assert roles["run"].status_code == "unset"
    iterations, saves, evaluations = roles["iterations"], roles["saves"], roles["evaluations"]
    assert sorted(s.attributes[MEGATRON_ITERATION] for s in iterations) == [1, 2, 3, 4, 5, 6]
    assert len(roles["updates"]) == 6  # optimizer spans
    written = sorted(str(p) for p in (tmp_path / "out").glob("checkpoint-*"))
    assert sorted(s.attributes[MEGATRON_CHECKPOINT_PATH] for s in saves) == written
    evaluated = [h["step"] for h in trainer.state.log_history if "eval_loss" in h]
    assert sorted(s.attributes[MEGATRON_ITERATION] for s in evaluations) == evaluated
    (last_eval,) = [s for s in evaluations if s.attributes[MEGATRON_ITERATION] == 6]
    (last_save,) = [s for s in saves if s.attributes[MEGATRON_ITERATION] == 6]
    assert last_save.start_time_unix_nano >= last_eval.end_time_unix_nano


def test_an_exception_that_ends_the_program_is_recorded_on_the_run_span(
    run_python, otlp_receiver, tmp_path
):
    """A failure at step 3 that nobody catches: the process exits 1 and its run span arrives
    with status ERROR and the exception."""
    import_or_unavailable("transformers")
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, 'tests/integration'); "
        "import transformers_run; "
        f"transformers_run.train(Path({str(tmp_path)!r}), fail_at_step=3, "
        "callback_kwargs={'tensor_metrics': 'none'})"
    )
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "600000"}
    result = run_python(code, env=env, timeout_s=180)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "injected failure at step 3" in result.stderr
    (run,) = runs(otlp_receiver.spans())
    assert run.status_code == "error"
    assert run.attributes["error.type"] == "RuntimeError"
    assert any(name == "exception" for name, _ in run.events)
    final = last_collection(collections_by_rank(otlp_receiver)[0])
    assert final[STEP][0].count == 2


def test_two_ranks_under_torchrun_on_gloo_export_under_their_own_identity(
    run_python, otlp_receiver, tmp_path
):
    """torchrun, two CPU processes: each rank arrives with its identity, the Trainer's global
    loss of each logging step, its step count, and tokens/s from num_input_tokens_seen."""
    import_or_unavailable("transformers")
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "600000"}
    env["OTEL_PYTHON_TRAINING_SPAN_GROUPS"] = "all"
    result = run_python(
        module="torch.distributed.run",
        args=[
            "--standalone",
            "--nproc_per_node",
            "2",
            str(HERE / "transformers_run.py"),
            str(tmp_path),
            "--steps",
            "4",
        ],  # fmt: skip
        env=env,
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    found = collections_by_rank(otlp_receiver)
    assert sorted(found) == [0, 1]
    for rank, record in records.items():
        final = last_collection(found[rank])
        resource = final[STEP][0].resource_attributes
        assert (resource["dl.rank"], resource["dl.world_size"]) == (rank, 2)
        assert final[STEP][0].count == record["steps"] == 4
        logged = {h["step"]: h["loss"] for h in record["log_history"] if "loss" in h}
        arrived = by_step_count(found[rank], "megatron.training.loss")
        assert arrived == pytest.approx(logged, rel=1e-6)
        rates = by_step_count(found[rank], "megatron.training.tokens_per_sec")
        ends = [record["before"]["train_begin"], *record["before"]["step_ends"]]
        after_ends = [record["after"]["train_begin"], *record["after"]["step_ends"]]
        tokens = record["tokens_seen"] / 2  # global tokens of each two-step interval
        for last in logged:
            low, high = rate_bounds(tokens, ends, after_ends, last - 1, last)
            assert low <= rates[last] <= high
    steps = iteration_spans(otlp_receiver.spans())
    assert sorted(s.resource_attributes["dl.rank"] for s in steps) == [0] * 4 + [1] * 4
