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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script too
from framework_checks import callbacks_with_readers, one_torch_thread, throughput_gauges  # noqa: E402

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
    """Records, at the moments the test needs, what the Trainer did.

    With ``events``, it appends ``(tag, side, perf_counter(), step)`` at the hooks where the
    callback sets a step boundary (``start``: on_train_begin, ``end``: on_step_end, ``eval``:
    on_evaluate, ``save``: on_save; before the callback with ``side="-"``, after it with
    ``"+"``) and, before the callback, ``("begin", "", t, step)`` at on_step_begin; before its
    ``eval`` and ``save`` timestamps it sleeps ``pause_s``. It counts each training forward's
    inputs in ``record["micro"]`` (step, main input elements, rows, even ids) with a forward
    pre-hook of its own, and with ``readers`` keeps the throughput gauges of each reader at
    each training log in ``record["intervals"]``.
    """

    def __init__(self, record: dict, *, snapshot_every: int = 0, flush: bool = False,
                 fail_at_step: int = 0, events: list | None = None, side: str = "-",
                 readers: dict | None = None, pause_s: float = 0.0) -> None:  # fmt: skip
        self.record = record
        self.snapshot_every = snapshot_every
        self.flush = flush
        self.fail_at_step = fail_at_step
        self.events, self.side, self.readers, self.pause_s = events, side, readers, pause_s
        self.step = 0
        self.handle = None

    def _event(self, tag: str, step: int, side: str | None = None) -> None:
        if self.events is not None:
            mark = self.side if side is None else side
            self.events.append((tag, mark, time.perf_counter(), step))

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.record["train_begin"] = time.perf_counter()
        self._event("start", state.global_step)
        if self.side == "-" and model is not None and self.handle is None:
            self.handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        if module.training and "input_ids" in kwargs:
            ids = kwargs["input_ids"]
            micro = (self.step, int(ids.numel()), int(ids.shape[0]), even_ids({"input_ids": ids}))
            self.record.setdefault("micro", []).append(micro)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1
        if state.global_step + 1 == self.fail_at_step:
            raise RuntimeError(f"injected failure at step {self.fail_at_step}")
        if self.side == "-":
            self._event("begin", state.global_step + 1, "")

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        step = state.global_step + 1
        if self.snapshot_every and step % self.snapshot_every == 0:
            snap = self.record.setdefault("snapshots", {})[step] = {}
            for name, p in model.named_parameters():
                snap["param:" + name] = float(torch.linalg.vector_norm(p.detach().double()))
                snap["grad:" + name] = float(torch.linalg.vector_norm(p.grad.double()))

    def on_step_end(self, args, state, control, **kwargs):
        self.record.setdefault("step_ends", []).append(time.perf_counter())
        self._event("end", state.global_step)

    def on_evaluate(self, args, state, control, **kwargs):
        if self.pause_s:
            time.sleep(self.pause_s)
        self._event("eval", state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if self.pause_s:
            time.sleep(self.pause_s)
        self._event("save", state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            if self.readers:
                self.record.setdefault("intervals", {})[state.global_step] = {
                    name: throughput_gauges(reader) for name, reader in self.readers.items()
                }
            if self.flush:
                import otel_training

                otel_training.force_flush()


class AfterProbe(Probe):
    """The probe that runs after the callback (a class of its own: the Trainer warns about two
    callbacks of one class)."""


def even_ids(inputs) -> int:
    """The test's own token count of a micro-batch: its even input ids (what
    ``tokens_per_batch=even_ids`` counts, and the probe counts for itself)."""
    return int((inputs["input_ids"] % 2 == 0).sum())


def train(
    root: Path,
    *,
    callback_kwargs: dict[str, Any] | list[dict[str, Any]] | None = None,
    args_kwargs: dict[str, Any] | None = None,
    seq: int = 32,
    count: int = 64,
    snapshot_every: int = 0,
    fail_at_step: int = 0,
    trainer_class: type = Trainer,
    model: Any = None,
    resume_from_checkpoint: str | None = None,
    probe_kwargs: dict[str, Any] | None = None,
    add_callback: bool = False,
    callback: Any = None,
) -> dict:
    """Trains with probes before and after the callback (one callback per dict of
    ``callback_kwargs`` when it is a list); returns the probes' records (``before``,
    ``after``), the Trainer and the callback (and ``callbacks``); ``callback``: one built
    already. ``add_callback``: the callbacks are added with ``trainer.add_callback`` after
    the Trainer is built."""
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
    kwargs_list = callback_kwargs if isinstance(callback_kwargs, list) else [callback_kwargs]
    callbacks = [OtelTrainingCallback(**(kwargs or {})) for kwargs in kwargs_list]
    if callback is not None:
        callbacks = [callback]
    probe_options = dict(probe_kwargs or {})
    after_options = {k: v for k, v in probe_options.items() if k != "pause_s"}
    before_probe = Probe(
        before, snapshot_every=snapshot_every, fail_at_step=fail_at_step, **probe_options
    )
    after_probe = AfterProbe(after, flush=True, side="+", **after_options)
    trainer = trainer_class(
        model=model if model is not None else build_model(seq),
        args=TrainingArguments(**options),
        train_dataset=data,
        eval_dataset=data[:8],
        callbacks=[before_probe] if add_callback else [before_probe, *callbacks, after_probe],
    )
    if add_callback:
        for callback in [*callbacks, after_probe]:
            trainer.add_callback(callback)
    with one_torch_thread():
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return {
        "before": before,
        "after": after,
        "trainer": trainer,
        "callback": callbacks[0],
        "callbacks": callbacks,
    }


THROUGHPUT_FLOPS_PER_TOKEN = 3e6
THROUGHPUT_PAUSE_S = 0.25  # each evaluation and checkpoint save lasts at least this long


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters outside ``nn.Embedding`` modules, counted here (the N of the Trainer's
    ``6 × N × tokens`` FLOP estimate)."""
    embedding = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()
    }
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def _throughput_run(out: Path) -> dict:
    """Two callbacks in one 2-rank training, each with providers of its own: ``per_sample``
    (``tokens_per_sample``, ``flops_per_token``) and ``per_batch`` (``tokens_per_batch``, the
    Trainer's own FLOP count); gradient accumulation 2, an evaluation every 2 steps and a
    checkpoint save every 3, both slow."""
    seq = 32
    options = {
        "per_sample": {"tokens_per_sample": seq, "flops_per_token": THROUGHPUT_FLOPS_PER_TOKEN},
        "per_batch": {"tokens_per_batch": even_ids},
    }
    readers, callback_kwargs = callbacks_with_readers(options)
    events: list = []
    model = build_model(seq)
    result = train(
        out,
        callback_kwargs=callback_kwargs,
        args_kwargs={
            "max_steps": 6,
            "gradient_accumulation_steps": 2,
            "logging_steps": 2,
            "eval_strategy": "steps",
            "eval_steps": 2,
            "save_strategy": "steps",
            "save_steps": 3,
            "ddp_backend": "gloo",
        },
        seq=seq,
        model=model,
        probe_kwargs={"events": events, "readers": readers, "pause_s": THROUGHPUT_PAUSE_S},
    )
    trainer = result["trainer"]
    return {
        "rank": trainer.args.process_index,
        "world_size": trainer.args.world_size,
        "steps": trainer.state.global_step,
        "events": events,
        "micro": result["before"]["micro"],
        "intervals": result["after"].get("intervals", {}),
        "parameters": non_embedding_parameters(model),
    }


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--throughput", action="store_true")
    args = parser.parse_args(argv)
    if args.throughput:
        record = _throughput_run(args.out)
        (args.out / f"rank{record['rank']}.json").write_text(json.dumps(record))
        return 0
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
