"""A small Hugging Face Trainer run with OtelTrainingCallback and the test's own probes.

`train()` trains a two-layer GPT-2 built from a ``GPT2Config`` (byte-level: token ids are the
bytes of the standard library's ``os.py``, nothing downloaded) and returns what the test saw
itself: the timestamps around the callback's hooks, the parameter and gradient norms at each
commit point, and the Trainer (its ``state.log_history``). Run as a script under torchrun
(``python -m torch.distributed.run --standalone --nproc_per_node 2 transformers_run.py OUT``)
it trains on gloo and writes ``OUT/rank{R}.json``.

Not a test module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

VOCAB = 256


def samples(seq: int, count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` training samples of ``seq`` byte ids each (``input_ids`` = ``labels``)."""
    data = torch.tensor(list(Path(os.__file__).read_bytes()), dtype=torch.long)
    rows = data[: count * seq].reshape(count, seq)
    return [{"input_ids": row, "labels": row} for row in rows]


def build_model(seq: int) -> GPT2LMHeadModel:
    """A two-layer GPT-2 with a byte vocabulary, randomly initialised (seeded)."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=seq,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


class Probe(TrainerCallback):
    """Records, at the moments the test needs, what the Trainer did."""

    def __init__(self, record: dict, *, snapshot_every: int = 0, flush: bool = False,
                 fail_at_step: int = 0) -> None:  # fmt: skip
        self.record = record
        self.snapshot_every = snapshot_every
        self.flush = flush
        self.fail_at_step = fail_at_step

    def on_train_begin(self, args, state, control, **kwargs):
        self.record["train_begin"] = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.fail_at_step:
            raise RuntimeError(f"injected failure at step {self.fail_at_step}")

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        step = state.global_step + 1
        if self.snapshot_every and step % self.snapshot_every == 0:
            snap = self.record.setdefault("snapshots", {})[step] = {}
            for name, p in model.named_parameters():
                snap["param:" + name] = float(torch.linalg.vector_norm(p.detach().double()))
                snap["grad:" + name] = float(torch.linalg.vector_norm(p.grad.double()))

    def on_step_end(self, args, state, control, **kwargs):
        self.record.setdefault("step_ends", []).append(time.perf_counter())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.flush and logs and "loss" in logs:
            import otel_training

            otel_training.force_flush()


class AfterProbe(Probe):
    """The probe that runs after the callback (a class of its own: the Trainer warns about two
    callbacks of one class)."""


def train(
    root: Path,
    *,
    callback_kwargs: dict[str, Any] | None = None,
    args_kwargs: dict[str, Any] | None = None,
    seq: int = 32,
    count: int = 64,
    snapshot_every: int = 0,
    fail_at_step: int = 0,
) -> dict:
    """Trains with probes before and after the callback; returns the probes' records
    (``before``, ``after``), the Trainer and the callback."""
    from otel_training.integrations.transformers import OtelTrainingCallback

    data = samples(seq, count)
    options = {
        "output_dir": str(root / "out"),
        "max_steps": 6,
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "logging_steps": 2,
        "learning_rate": 1e-3,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        **(args_kwargs or {}),
    }
    before, after = {}, {}
    callback = OtelTrainingCallback(**(callback_kwargs or {}))
    probes = [
        Probe(before, snapshot_every=snapshot_every, fail_at_step=fail_at_step),
        callback,
        AfterProbe(after, flush=True),
    ]
    trainer = Trainer(
        model=build_model(seq),
        args=TrainingArguments(**options),
        train_dataset=data,
        eval_dataset=data[:8],
        callbacks=probes,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only contend on a shared machine
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return {"before": before, "after": after, "trainer": trainer, "callback": callback}


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    result = train(
        args.out,
        callback_kwargs={"tensor_metrics": "none"},
        args_kwargs={
            "max_steps": args.steps,
            "ddp_backend": "gloo",
            "include_num_input_tokens_seen": "all",
        },
    )
    trainer = result["trainer"]
    record = {
        "rank": trainer.args.process_index,
        "world_size": trainer.args.world_size,
        "steps": trainer.state.global_step,
        "tokens_seen": trainer.state.num_input_tokens_seen,
        "log_history": trainer.state.log_history,
        "before": result["before"],
        "after": result["after"],
    }
    (args.out / f"rank{record['rank']}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
