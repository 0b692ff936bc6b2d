r"""Train a tiny GPT-2 with the Hugging Face Trainer, recorded by otel-training.

    make setup                                      # .venv with both frameworks (minutes)
    .venv/bin/python examples/transformers_example.py   # telemetry to ./otel-training-telemetry
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 \
        .venv/bin/python examples/transformers_example.py

In another environment, install the extra from the checkout first (the package is on no
index): ``pip install -e '.[transformers]'``, then run it with that environment's ``python``.

The one line that matters is ``callbacks=[OtelTrainingCallback()]``. The model is built from a
``GPT2Config`` (byte-level: token ids are bytes) and the data are the bytes of the Python
standard library's sources; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import otel_training.configuration
from otel_training.demo.threads import apply_threads
from otel_training.integrations.transformers import OtelTrainingCallback


def stdlib_samples(seq_len: int, limit: int) -> list[dict[str, torch.Tensor]]:
    """Samples of ``seq_len`` byte ids from up to ``limit`` bytes of the standard library."""
    chunks, size = [], 0
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        chunk = path.read_bytes()[: limit - size]
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    ids = torch.tensor(list(b"".join(chunks)), dtype=torch.long)
    rows = ids[: len(ids) // seq_len * seq_len].reshape(-1, seq_len)
    return [{"input_ids": row, "labels": row} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--seq-len", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--accumulate", type=int, default=4, help="micro-batches per step")
    parser.add_argument("--log-every", type=int, default=10, help="steps per logging step")
    parser.add_argument("--data-bytes", type=int, default=1_000_000, help="bytes of sources")
    args = parser.parse_args()
    # torch's threads for the CPUs this process may use, shared with what else runs on them (its
    # default, one per CPU of the machine, is several times slower on busy CPUs): the demo's rule.
    apply_threads()

    config = GPT2Config(
        vocab_size=256, n_positions=args.seq_len, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    data = stdlib_samples(args.seq_len, args.data_bytes)
    with tempfile.TemporaryDirectory(prefix="transformers-example-") as output_dir:
        training = TrainingArguments(
            output_dir=output_dir,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=args.accumulate,
            logging_steps=args.log_every,
            learning_rate=1e-3,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=GPT2LMHeadModel(config),
            args=training,
            train_dataset=data,
            callbacks=[OtelTrainingCallback()],
        )
        trainer.train()
    destination = otel_training.configuration.current().destination
    print(f"trained {trainer.state.global_step} steps; {destination}")


if __name__ == "__main__":
    main()
