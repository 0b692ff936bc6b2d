"""OtelTrainingCallback in real Lightning runs on CPU, exporting to a real OTLP receiver: what
arrives equals what Lightning logged and what the test measured itself."""

from __future__ import annotations

import collections
import json
import math
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
SEQ = 16  # tokens per sample (bytes predicted per row)


@pytest.fixture
def lightning_run(monkeypatch, otlp_receiver):
    """``run(root, **kwargs)``: lightning_run.train in this process, exporting to the
    receiver (framework_checks.receiver_run)."""
    return receiver_run("lightning", monkeypatch, otlp_receiver)


def _interval_steps(every: int, steps: int) -> list[tuple[int, int]]:
    return [(first, min(first + every - 1, steps)) for first in range(1, steps + 1, every)]


@documents("README.md", "the scheduler's learning rate at the logged step")
@documents("README.md", "global L2 norm of all gradients, before clipping")
@documents("README.md", "wall time of one optimizer step (all micro-batches); one point per step")
def test_metrics_equal_what_lightning_logged_and_the_test_measured(
    lightning_run, otlp_receiver, tmp_path
):
    """Loss, grad norm, learning rate, tokens/s (grad accumulation 4) and step count per log
    interval, and tensor gauges of the last commit, as Lightning and torch give them."""
    accumulate, every, steps = 4, 3, 6
    result = lightning_run(
        tmp_path,
        callback_kwargs={"tokens_per_sample": SEQ, "tensor_metrics": "grad_norm:3,param_norm:3"},
        trainer_kwargs={
            "max_steps": steps,
            "accumulate_grad_batches": accumulate,
            "log_every_n_steps": every,
            "gradient_clip_val": 0.5,
        },
        snapshot_every=3,
        flush_every=every,
    )
    before, after = result["before"], result["after"]
    assert result["trainer"].global_step == steps
    (rank,) = collections_by_rank(otlp_receiver)
    found = collections_by_rank(otlp_receiver)[rank]
    final = last_collection(found)
    assert final[STEP][0].count == steps  # one point per optimizer step
    assert final[STEP][0].resource_attributes["dl.world_size"] == 1

    losses = by_step_count(found, "megatron.training.loss")
    norms = by_step_count(found, "megatron.training.grad_norm")
    rates = by_step_count(found, "megatron.training.tokens_per_sec")
    lrs = by_step_count(found, "megatron.training.learning_rate")
    intervals = _interval_steps(every, steps)
    assert sorted(losses) == [last for _, last in intervals]
    micro = before["micro_losses"]
    ends = [before["train_start"], *before["step_ends"]]
    after_ends = [after["train_start"], *after["step_ends"]]
    for first, last in intervals:
        batches = range((first - 1) * accumulate, last * accumulate)
        assert losses[last] == pytest.approx(math.fsum(micro[i] for i in batches) / len(batches))
        assert norms[last] == pytest.approx(before["grad_norm"][last], rel=1e-6)
        assert lrs[last] == pytest.approx(before["lrs"][last * accumulate - 1], rel=1e-6)
        tokens = sum(before["batch_rows"][i] * SEQ for i in batches)
        low, high = rate_bounds(tokens, ends, after_ends, first, last)
        assert low <= rates[last] <= high
    assert "megatron.training.skipped_iters" not in final

    snapshot = before["snapshots"][steps]
    for family in ("grad_norm", "param_norm"):
        kind = family.split("_")[0]
        values = {k.split(":", 1)[1]: v for k, v in snapshot.items() if k.startswith(kind + ":")}
        expected = {"global": l2(values.values())}
        for layer in ("0", "1"):
            expected[f"decoder.layers.{layer}"] = l2(
                v for name, v in values.items() if name.startswith(f"layers.{layer}.")
            )
        assert tensor_gauges(final, family) == pytest.approx(expected, rel=1e-5), family


def test_spans_of_the_run_iterations_updates_validation_and_checkpoints(
    lightning_run, otlp_receiver, tmp_path
):
    """One run span; in its trace segment the iterations (the first wrapped as the first
    iteration), each with its optimizer span, a span per validation loop and per checkpoint
    file ModelCheckpoint wrote, with their paths."""
    lightning = import_or_unavailable("lightning.pytorch")
    checkpoints = tmp_path / "checkpoints"
    saver = lightning.callbacks.ModelCheckpoint(
        dirpath=checkpoints, every_n_train_steps=2, save_top_k=-1
    )
    result = lightning_run(
        tmp_path,
        callback_kwargs={"tensor_metrics": "none"},
        trainer_kwargs={
            "max_steps": 4,
            "accumulate_grad_batches": 2,
            "limit_val_batches": 2,
            "val_check_interval": 4,
            "enable_checkpointing": True,
            "callbacks": [saver],
        },
    )
    spans = otlp_receiver.spans()
    written = sorted(str(path) for path in checkpoints.iterdir())
    assert len(written) >= 2
    validations = result["trainer"].fit_loop.epoch_loop.val_loop.batch_progress.total.completed
    assert validations == 4  # two loops of two batches
    roles = classify(spans)
    run, iterations, updates = roles["run"], roles["iterations"], roles["updates"]
    saves, evaluations = roles["saves"], roles["evaluations"]
    assert run.status_code == "unset"
    assert sorted(s.attributes[MEGATRON_ITERATION] for s in iterations) == [1, 2, 3, 4]
    assert len(updates) == 4  # one optimizer span in each iteration
    assert sorted(s.attributes[MEGATRON_CHECKPOINT_PATH] for s in saves) == written
    assert len(evaluations) == 2
    assert len({s.name for s in evaluations}) == 1


def test_an_exception_is_recorded_on_the_run_span(lightning_run, otlp_receiver, tmp_path):
    """A training_step that raises: the run span ends with status ERROR and the exception."""
    with pytest.raises(RuntimeError, match="injected failure"):
        lightning_run(
            tmp_path,
            callback_kwargs={"tensor_metrics": "none"},
            module_kwargs={"fail_at_step": 3},
        )
    (run,) = runs(otlp_receiver.spans())
    assert run.status_code == "error"
    assert run.attributes["error.type"] == "RuntimeError"
    (event,) = [attributes for name, attributes in run.events if name == "exception"]
    assert "injected failure at step 3" in event["exception.message"]
    final = last_collection(collections_by_rank(otlp_receiver)[0])
    assert final[STEP][0].count == 2


@documents("README.md", "optimizer steps skipped (non-finite loss or gradients)")
def test_amp_overflow_steps_are_skipped_iters_and_leave_the_loss(
    lightning_run, otlp_receiver, tmp_path
):
    """16-mixed on CPU with an inf loss at step 3: the steps the gradient scaler skipped (its
    scale dropped) are counted, and their micro-batches are not in the interval's loss."""
    torch = import_or_unavailable("torch")
    lightning = import_or_unavailable("lightning.pytorch")
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    precision = lightning.plugins.precision.MixedPrecision("16-mixed", "cpu", scaler=scaler)
    result = lightning_run(
        tmp_path,
        callback_kwargs={"tensor_metrics": "none"},
        trainer_kwargs={"max_steps": 4, "log_every_n_steps": 2, "plugins": [precision]},
        module_kwargs={"inf_at_step": 3},
        flush_every=2,
    )
    scales = result["before"]["scales"]
    skipped = [step for step in range(1, 5) if scales[step] < scales[step - 1]]
    assert 3 in skipped
    found = collections_by_rank(otlp_receiver)[0]
    counted = by_step_count(found, "megatron.training.skipped_iters")
    assert max(counted.values()) == len(skipped)
    kept = [loss for i, loss in enumerate(result["before"]["micro_losses"]) if i + 1 not in skipped]
    loss = by_step_count(found, "megatron.training.loss")[4]
    assert loss == pytest.approx(math.fsum(kept[2:]) / len(kept[2:]))


def test_pytorch_lightning_trainers_take_the_same_callback(lightning_run, otlp_receiver, tmp_path):
    """The callback works in a ``pytorch_lightning.Trainer`` too."""
    import_or_unavailable("pytorch_lightning")
    lightning_run(tmp_path, package="pytorch_lightning", callback_kwargs={"tensor_metrics": "none"})
    final = last_collection(collections_by_rank(otlp_receiver)[0])
    assert final[STEP][0].count == 6
    assert "megatron.training.loss" in final


def test_two_ddp_ranks_on_gloo_export_under_their_own_identity(
    run_python, otlp_receiver, tmp_path, repo_root
):
    """Lightning's own DDP launcher (no RANK variable), two CPU processes: each rank arrives
    with the trainer's rank identity, its own loss and its step count."""
    import_or_unavailable("lightning")
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "600000"}
    env["OTEL_PYTHON_TRAINING_SPAN_GROUPS"] = "all"
    script = str(HERE / "lightning_run.py")
    result = run_python(
        f"import runpy, sys; sys.argv = [{script!r}, *sys.argv[1:]]; "
        f"runpy.run_path({script!r}, run_name='__main__')",
        args=[str(tmp_path), "--steps", "4", "--accumulate", "2", "--log-every", "2"],
        env=env,
        timeout_s=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    records = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
    found = collections_by_rank(otlp_receiver)
    assert sorted(found) == [0, 1]
    for rank, record in records.items():
        final = last_collection(found[rank])
        resource = final[STEP][0].resource_attributes
        assert (resource["dl.rank"], resource["dl.world_size"]) == (rank, 2)
        assert resource["dl.local_rank"] == rank
        assert final[STEP][0].count == record["steps"] == 4
        micro = record["micro_losses"]
        losses = by_step_count(found[rank], "megatron.training.loss")
        assert losses[4] == pytest.approx(math.fsum(micro[4:8]) / 4)
    assert records[0]["micro_losses"] != records[1]["micro_losses"]  # each rank's own data
    steps = iteration_spans(otlp_receiver.spans())
    assert collections.Counter(s.resource_attributes["dl.rank"] for s in steps) == {0: 4, 1: 4}
