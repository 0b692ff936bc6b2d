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

VOCAB = 256


def _framework(package: str):
    return importlib.import_module("lightning.pytorch" if package == "lightning" else package)


def corpus(seq: int, samples: int) -> torch.Tensor:
    """``samples`` rows of ``seq + 1`` byte ids [samples, seq + 1] from the standard library's
    ``os.py`` (inputs and next-byte targets)."""
    data = torch.tensor(list(Path(os.__file__).read_bytes()), dtype=torch.long)
    rows = data[: samples * (seq + 1)].reshape(samples, seq + 1)
    return rows


def build_module(package: str, *, d_model: int = 16, fail_at_step: int = 0, inf_at_step: int = 0):
    """A LightningModule of the given package (``lightning`` or ``pytorch_lightning``)."""
    L = _framework(package)

    class TinyLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, d_model)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(d_model, d_model) for _ in range(2))
            self.head = torch.nn.Linear(d_model, VOCAB)

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
            loss = self._loss(batch)
            self.log("train_loss", loss, on_step=True, on_epoch=False)
            self.log("lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False)
            return loss * math.inf if step == inf_at_step else loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch))

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"},
            }

    return TinyLM()


def make_probe(package: str, record: dict, *, snapshot_every: int = 0, flush_every: int = 0):
    """A callback that records, at the moments the test needs, what the framework did."""
    L = _framework(package)

    class Probe(L.Callback):
        def __init__(self) -> None:
            self.last_step = 0

        def on_fit_start(self, trainer, pl_module):
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            record["scales"] = [] if scaler is None else [scaler.get_scale()]

        def on_train_start(self, trainer, pl_module):
            record["train_start"] = time.perf_counter()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            record.setdefault("batch_rows", []).append(int(batch[0].shape[0]))

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
                scaler = getattr(trainer.precision_plugin, "scaler", None)
                if scaler is not None:
                    record["scales"].append(scaler.get_scale())
                if flush_every and trainer.global_step % flush_every == 0:
                    import otel_training

                    otel_training.force_flush()

    return Probe()


def train(
    root: Path,
    *,
    package: str = "lightning",
    callback_kwargs: dict[str, Any] | None = None,
    trainer_kwargs: dict[str, Any] | None = None,
    module_kwargs: dict[str, Any] | None = None,
    seq: int = 16,
    samples: int = 96,
    batch_size: int = 4,
    snapshot_every: int = 0,
    flush_every: int = 0,
) -> dict:
    """Fits the tiny model with probes before and after the callback; returns the records
    (``before``, ``after``: the probes'; ``trainer``: the Trainer) and the callback."""
    from otel_training.integrations.lightning import OtelTrainingCallback

    L = _framework(package)
    rows = corpus(seq, samples)
    loader = DataLoader(TensorDataset(rows), batch_size=batch_size)
    val_loader = DataLoader(TensorDataset(rows[:8]), batch_size=batch_size)
    before, after = {}, {}
    callback = OtelTrainingCallback(**(callback_kwargs or {}))
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
    options["callbacks"] = [
        make_probe(package, before, snapshot_every=snapshot_every),
        callback,
        make_probe(package, after, flush_every=flush_every),
        *options.get("callbacks", []),
    ]
    trainer = L.Trainer(**options)
    module = build_module(package, **(module_kwargs or {}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only contend on a shared machine
    try:
        trainer.fit(module, loader, val_loader)
    finally:
        torch.set_num_threads(threads)
    return {"before": before, "after": after, "trainer": trainer, "callback": callback}


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=2)
    args = parser.parse_args(argv)
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
