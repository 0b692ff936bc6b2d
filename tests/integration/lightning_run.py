"""A small Lightning run with OtelTrainingCallback and the test's own probes, for the tests.

`train()` fits a byte-level model (an embedding, two residual layers ``layers.N`` and a head)
on text the caller gives and returns what the test saw itself, independently of the callback:
each micro-batch's logged loss and learning rate, the timestamps around the callback's hooks,
the pre-clipping gradient norm, the parameters and gradients at each commit point, and the
gradient scaler's scale. Run as a script (``python lightning_run.py OUT_DIR ...``) it does the
same under Lightning's own DDP launcher and writes ``OUT_DIR/rank{R}.json``.

Not a test module.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script too
from framework_checks import callbacks_with_readers, one_torch_thread, throughput_gauges  # noqa: E402

VOCAB = 256


def _framework(package: str):
    return importlib.import_module("lightning.pytorch" if package == "lightning" else package)


def corpus(seq: int, samples: int) -> torch.Tensor:
    """``samples`` rows of ``seq + 1`` byte ids [samples, seq + 1] from the standard library's
    ``os.py`` (inputs and next-byte targets)."""
    data = torch.tensor(list(Path(os.__file__).read_bytes()), dtype=torch.long)
    rows = data[: samples * (seq + 1)].reshape(samples, seq + 1)
    return rows


def build_module(
    package: str,
    *,
    d_model: int = 16,
    fail_at_step: int = 0,
    inf_at_step: int = 0,
    interrupt_at_step: int = 0,
    fail_validation_at_step: int = 0,
    fail_save: bool = False,
    batch_sleep_s: float = 0.0,
    validation_sleep_s: float = 0.0,
    save_sleep_s: float = 0.0,
    flops_per_batch: float | None = None,
    events: list | None = None,
):
    """A LightningModule of the given package (``lightning`` or ``pytorch_lightning``).

    Failures injected at an optimizer step: ``fail_at_step`` (RuntimeError in training_step),
    ``interrupt_at_step`` (KeyboardInterrupt), ``fail_validation_at_step`` (in the validation
    after that step), ``fail_save`` (inside every checkpoint save). Sleeps make batches,
    validation steps (the sanity check's too) and saves last at least that long; a save
    appends ``("save", "-", t, step)`` to ``events`` after its sleep, inside the save."""
    L = _framework(package)

    class TinyLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, d_model)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(d_model, d_model) for _ in range(2))
            self.head = torch.nn.Linear(d_model, VOCAB)
            if flops_per_batch is not None:
                self.flops_per_batch = flops_per_batch

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x)
            for layer in self.layers:
                h = h + torch.tanh(layer(h))
            return self.head(h)

        def _loss(self, batch) -> torch.Tensor:
            (rows,) = batch
            logits = self(rows[:, :-1])
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB).float(), rows[:, 1:].reshape(-1)
            )

        def training_step(self, batch, batch_idx):
            step = self.trainer.global_step + 1
            if step == fail_at_step:
                raise RuntimeError(f"injected failure at step {step}")
            if step == interrupt_at_step:
                raise KeyboardInterrupt(f"injected interrupt at step {step}")
            if batch_sleep_s:
                time.sleep(batch_sleep_s)
            loss = self._loss(batch)
            self.log("train_loss", loss, on_step=True, on_epoch=False)
            self.log("lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
            return loss * math.inf if step == inf_at_step else loss

        def validation_step(self, batch, batch_idx):
            if self.trainer.global_step == fail_validation_at_step and not (
                self.trainer.sanity_checking
            ):
                raise RuntimeError(
                    f"injected failure in validation at step {fail_validation_at_step}"
                )
            if validation_sleep_s:
                time.sleep(validation_sleep_s)
            self.log("val_loss", self._loss(batch))

        def on_save_checkpoint(self, checkpoint):
            if fail_save:
                raise OSError("injected failure in a checkpoint save")
            if save_sleep_s:
                time.sleep(save_sleep_s)
            if events is not None:
                events.append(("save", "-", time.perf_counter(), self.trainer.global_step))

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"},
            }

    return TinyLM()


def make_probe(
    package: str,
    record: dict,
    *,
    snapshot_every: int = 0,
    flush_every: int = 0,
    events: list | None = None,
    side: str = "-",
    readers: dict | None = None,
    every: int = 0,
    eval_sleep_s: float = 0.0,
):
    """A callback that records, at the moments the test needs, what the framework did.

    With ``events``, it appends ``(tag, side, perf_counter(), step)`` at the hooks where the
    callback sets a step boundary (``start``: on_train_start, ``end``: a step's last
    micro-batch, ``eval``: validation end; before the callback with ``side="-"``, after it
    with ``"+"``) and, before the callback, ``("begin", "", t, step)`` at a step's first
    micro-batch; it sleeps ``eval_sleep_s`` at validation end before its timestamp. With
    ``readers`` (name -> InMemoryMetricReader), at each logging step it keeps the gauges
    tokens_per_sec and throughput_tflops of each reader in ``record["intervals"]``.
    """
    L = _framework(package)

    def event(tag: str, step: int, mark: str = side) -> None:
        if events is not None:
            events.append((tag, mark, time.perf_counter(), step))

    class Probe(L.Callback):
        def __init__(self) -> None:
            self.last_step = 0
            self.begun = -1

        def on_fit_start(self, trainer, pl_module):
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            record["scales"] = [] if scaler is None else [scaler.get_scale()]

        def on_train_start(self, trainer, pl_module):
            record["train_start"] = time.perf_counter()
            self.last_step = trainer.global_step
            event("start", trainer.global_step)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            (rows,) = batch
            record.setdefault("batch_rows", []).append(int(rows.shape[0]))
            step = trainer.global_step + 1
            record.setdefault("micro", []).append((step, int(rows.shape[0]), even_tokens(batch)))
            if side == "-" and self.begun != step:
                self.begun = step
                event("begin", step, "")

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking:
                return
            if eval_sleep_s:
                time.sleep(eval_sleep_s)
            event("eval", trainer.global_step)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            step = trainer.global_step + 1
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            norms = torch.stack([torch.linalg.vector_norm(g.double()) for g in grads])
            record.setdefault("grad_norm", {})[step] = float(torch.linalg.vector_norm(norms))
            if snapshot_every and step % snapshot_every == 0:
                snap = record.setdefault("snapshots", {})[step] = {}
                for name, p in pl_module.named_parameters():
                    snap["param:" + name] = float(torch.linalg.vector_norm(p.detach().double()))
                    snap["grad:" + name] = float(torch.linalg.vector_norm(p.grad.double()))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            now = time.perf_counter()
            metrics = trainer.callback_metrics
            record.setdefault("micro_losses", []).append(float(metrics["train_loss"]))
            record.setdefault("micro_steps", []).append(trainer.global_step)
            record.setdefault("lrs", []).append(float(metrics["lr"]))
            if trainer.global_step != self.last_step:
                self.last_step = trainer.global_step
                record.setdefault("step_ends", []).append(now)
                event("end", trainer.global_step)
                if readers and every and trainer.global_step % every == 0:
                    record.setdefault("intervals", {})[trainer.global_step] = {
                        name: throughput_gauges(reader) for name, reader in readers.items()
                    }
                scaler = getattr(trainer.precision_plugin, "scaler", None)
                if scaler is not None:
                    record["scales"].append(scaler.get_scale())
                if flush_every and trainer.global_step % flush_every == 0:
                    import otel_training

                    otel_training.force_flush()

    return Probe()


def even_tokens(batch) -> int:
    """The test's own token count of a batch: the even byte ids among its targets (what
    ``tokens_per_batch=even_tokens`` counts, and the probe counts for itself)."""
    (rows,) = batch
    return int((rows[:, 1:] % 2 == 0).sum())


def save_at_micro_batch(path: Path, number: int, package: str = "lightning"):
    """A callback that saves a checkpoint to ``path`` after the ``number``-th micro-batch
    (1-based) of the fit, whether or not it ends an optimizer step."""
    L = _framework(package)

    class SaveAt(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx + 1 == number:
                trainer.save_checkpoint(path)

    return SaveAt()


def timed_checkpoint(package: str, events: list, **kwargs):
    """A ModelCheckpoint that appends ``("save", "+", t, step)`` when a save has returned."""
    L = _framework(package)

    class TimedCheckpoint(L.callbacks.ModelCheckpoint):
        def _save_checkpoint(self, trainer, filepath):
            super()._save_checkpoint(trainer, filepath)
            events.append(("save", "+", time.perf_counter(), trainer.global_step))

    return TimedCheckpoint(**kwargs)


def train(
    root: Path,
    *,
    package: str = "lightning",
    callback_kwargs: dict[str, Any] | list[dict[str, Any]] | None = None,
    trainer_kwargs: dict[str, Any] | None = None,
    module_kwargs: dict[str, Any] | None = None,
    seq: int = 16,
    samples: int = 96,
    batch_size: int = 4,
    snapshot_every: int = 0,
    flush_every: int = 0,
    ckpt_path: str | None = None,
    probe_kwargs: dict[str, Any] | None = None,
    events: list | None = None,
    callback: Any = None,
) -> dict:
    """Fits the tiny model with probes before and after the callback (one callback per dict
    of ``callback_kwargs`` when it is a list, or ``callback`` itself); returns the records
    (``before``, ``after``: the probes'; ``trainer``: the Trainer), the callback (and
    ``callbacks``) and ``events``."""
    from otel_training.integrations.lightning import OtelTrainingCallback

    L = _framework(package)
    rows = corpus(seq, samples)
    loader = DataLoader(TensorDataset(rows), batch_size=batch_size)
    val_loader = DataLoader(TensorDataset(rows[:8]), batch_size=batch_size)
    before, after = {}, {}
    kwargs_list = callback_kwargs if isinstance(callback_kwargs, list) else [callback_kwargs]
    callbacks = [OtelTrainingCallback(**(kwargs or {})) for kwargs in kwargs_list]
    if callback is not None:
        callbacks = [callback]
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 6,
        "logger": L.loggers.CSVLogger(str(root / "logs")),
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "default_root_dir": str(root),
        **(trainer_kwargs or {}),
    }
    probe_options = {"events": events, **(probe_kwargs or {})}
    after_options = {k: v for k, v in probe_options.items() if k != "eval_sleep_s"}
    options["callbacks"] = [
        make_probe(package, before, snapshot_every=snapshot_every, side="-", **probe_options),
        *callbacks,
        make_probe(package, after, flush_every=flush_every, side="+", **after_options),
        *options.get("callbacks", []),
    ]
    trainer = L.Trainer(**options)
    module = build_module(package, events=events, **(module_kwargs or {}))
    with one_torch_thread():
        trainer.fit(module, loader, val_loader, ckpt_path=ckpt_path)
    return {
        "before": before,
        "after": after,
        "trainer": trainer,
        "callback": callbacks[0],
        "callbacks": callbacks,
        "events": events,
    }


def _throughput_run(out: Path, every: int) -> dict:
    """Two callbacks in one 2-rank DDP fit, each with providers of its own: ``per_sample``
    (``tokens_per_sample``, ``flops_per_token``) and ``per_batch`` (``tokens_per_batch``, the
    module's ``flops_per_batch``); gradient accumulation 2, a validation every 2 steps and a
    checkpoint save every 3, both slow."""
    options = {
        "per_sample": {
            "tokens_per_sample": THROUGHPUT_SEQ,
            "flops_per_token": THROUGHPUT_FLOPS_PER_TOKEN,
        },
        "per_batch": {"tokens_per_batch": even_tokens},
    }
    readers, callback_kwargs = callbacks_with_readers(options)
    events: list = []
    saver = timed_checkpoint(
        "lightning", events, dirpath=out / "checkpoints", every_n_train_steps=3, save_top_k=-1
    )
    result = train(
        out,
        callback_kwargs=callback_kwargs,
        trainer_kwargs={
            "devices": 2,
            "strategy": "ddp",
            "max_steps": 6,
            "accumulate_grad_batches": 2,
            "log_every_n_steps": every,
            "limit_val_batches": 1,
            "val_check_interval": 4,  # micro-batches: after every second optimizer step
            "enable_checkpointing": True,
            "callbacks": [saver],
        },
        module_kwargs={
            "batch_sleep_s": 0.01,
            "save_sleep_s": THROUGHPUT_PAUSE_S,
            "flops_per_batch": THROUGHPUT_FLOPS_PER_BATCH,
        },
        seq=THROUGHPUT_SEQ,
        probe_kwargs={"readers": readers, "every": every, "eval_sleep_s": THROUGHPUT_PAUSE_S},
        events=events,
    )
    trainer = result["trainer"]
    return {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "steps": trainer.global_step,
        "events": events,
        "micro": result["before"]["micro"],
        "intervals": result["after"].get("intervals", {}),
    }


THROUGHPUT_SEQ = 16
THROUGHPUT_FLOPS_PER_TOKEN = 3e6
THROUGHPUT_FLOPS_PER_BATCH = 5e8
THROUGHPUT_PAUSE_S = 0.25  # each validation and checkpoint save lasts at least this long


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=2)
    parser.add_argument("--throughput", action="store_true")
    args = parser.parse_args(argv)
    if args.throughput:
        record = _throughput_run(args.out, args.log_every)
        (args.out / f"rank{record['rank']}.json").write_text(json.dumps(record))
        return 0
    result = train(
        args.out,
        callback_kwargs={"tokens_per_sample": 16, "tensor_metrics": "none"},
        trainer_kwargs={
            "devices": args.devices,
            "strategy": "ddp",
            "max_steps": args.steps,
            "accumulate_grad_batches": args.accumulate,
            "log_every_n_steps": args.log_every,
        },
        flush_every=args.log_every,
    )
    trainer = result["trainer"]
    record = dict(result["after"])
    record.update(
        rank=trainer.global_rank, world_size=trainer.world_size, steps=trainer.global_step
    )
    (args.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
