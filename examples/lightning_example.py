r"""Train a small byte-level language model with PyTorch Lightning, recorded by otel-training.

    make setup                                      # .venv with both frameworks (minutes)
    .venv/bin/python examples/lightning_example.py   # telemetry to ./otel-training-telemetry
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 \
        .venv/bin/python examples/lightning_example.py

In another environment, install the extra from the checkout first (the package is on no
index): ``pip install -e '.[lightning]'``, then run it with that environment's ``python``.

The one line that matters is ``callbacks=[OtelTrainingCallback(tokens_per_sample=...)]``. The
data are the bytes of the Python standard library's sources; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import otel_training.configuration
from otel_training.demo.threads import apply_threads
from otel_training.integrations.lightning import OtelTrainingCallback


def stdlib_bytes(limit: int) -> torch.Tensor:
    """Up to ``limit`` bytes of the standard library's ``.py`` files, as ids [N] (int64)."""
    chunks, size = [], 0
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        chunk = path.read_bytes()[: limit - size]
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return torch.tensor(list(b"".join(chunks)), dtype=torch.long)


class ByteLM(L.LightningModule):
    """Embedding, a few residual MLP layers (``layers.N``), and a head over 256 bytes."""

    def __init__(self, d_model: int, n_layers: int, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.embed = torch.nn.Embedding(256, d_model)
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(d_model), torch.nn.Linear(d_model, d_model))
            for _ in range(n_layers)
        )
        self.head = torch.nn.Linear(d_model, 256)

    def training_step(self, batch, batch_idx):
        (rows,) = batch
        h = self.embed(rows[:, :-1])
        for layer in self.layers:
            h = h + torch.relu(layer(h))
        logits = self.head(h)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), rows[:, 1:].reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per micro-batch")
    parser.add_argument("--seq-len", type=int, default=64, help="bytes predicted per sequence")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--log-every", type=int, default=10, help="steps per log interval")
    parser.add_argument("--data-bytes", type=int, default=1_000_000, help="bytes of sources")
    args = parser.parse_args()
    # torch's threads for the CPUs this process may use, shared with what else runs on them (its
    # default, one per CPU of the machine, is several times slower on busy CPUs): the demo's rule.
    apply_threads()

    data = stdlib_bytes(args.data_bytes)
    rows = data[: len(data) // (args.seq_len + 1) * (args.seq_len + 1)]
    dataset = TensorDataset(rows.reshape(-1, args.seq_len + 1))
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    with tempfile.TemporaryDirectory(prefix="lightning-example-") as root:
        trainer = L.Trainer(
            max_steps=args.steps,
            accumulate_grad_batches=args.accumulate,
            log_every_n_steps=args.log_every,
            gradient_clip_val=1.0,
            accelerator="auto",
            devices=1,
            default_root_dir=root,
            enable_checkpointing=False,
            logger=False,
            callbacks=[OtelTrainingCallback(tokens_per_sample=args.seq_len)],
        )
        trainer.fit(ByteLM(d_model=64, n_layers=2, lr=3e-3), loader)
    destination = otel_training.configuration.current().destination
    print(f"trained {trainer.global_step} steps; {destination}")


if __name__ == "__main__":
    main()
