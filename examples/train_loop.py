"""A plain PyTorch training loop with otel-training: the README's "Use it in your training loop".

Trains a small byte-level GPT (otel-training's demo model) on the Python standard library's own
``.py`` sources (read from this interpreter's install, no download) and records the Megatron-LM
training metrics: one step-duration point per optimizer step and, every ``--log-interval``
steps, the loss, gradient norm, learning rate, tokens/s and skipped iterations. With nothing
configured, telemetry goes to the embedded default (OTLP-JSON files in a directory per run under
``./otel-training-telemetry``); set ``OTEL_EXPORTER_OTLP_ENDPOINT`` to send it to a collector.

The learning rate is warmed up linearly: optimizer step ``s`` (1-based) runs at
``lr * min(1, s / warmup)``, and that is the rate logged for step ``s``.

Run it from the repository root::

    .venv/bin/python examples/train_loop.py            # about 10 s on 2 CPU cores
    .venv/bin/python examples/train_loop.py --help

The part between the ``readme-snippet`` markers is the README's snippet, word for word (a test
keeps them equal). `train_ddp.py` runs the same loop on several processes under torchrun.
"""

from __future__ import annotations

import argparse
import time

import torch

import otel_training
from otel_training.demo.data import load_stdlib_corpus
from otel_training.demo.model import GPT, GPTConfig
from otel_training.demo.threads import apply_threads

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=100, help="optimizer steps")
parser.add_argument("--log-interval", type=int, default=10, help="steps per metrics interval")
parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per step")
parser.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch")
parser.add_argument("--seq-len", type=int, default=64, help="bytes per sequence")
parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
parser.add_argument("--warmup", type=int, default=20, help="linear warmup steps")
parser.add_argument("--max-data-bytes", type=int, default=2_000_000, help="bytes of sources")
args = parser.parse_args()

# torch's threads for the CPUs this process may use, shared with what else runs on them (its
# default, one per CPU of the machine, is several times slower on busy CPUs): the demo's rule.
apply_threads()
torch.manual_seed(0)
corpus = load_stdlib_corpus(max_bytes=args.max_data_bytes)  # train[N] uint8 bytes
model = GPT(GPTConfig(seq_len=args.seq_len, n_layers=2, d_model=64, n_heads=4))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
# Step s (1-based) runs after s - 1 scheduler steps, at lr * min(1, s / warmup).
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda done: min(1.0, (done + 1) / args.warmup)
)
max_steps, log_interval, grad_accum = args.steps, args.log_interval, args.grad_accum
world_size = 1  # one process; train_ddp.py runs this loop on every data-parallel rank
generator = torch.Generator().manual_seed(0)


def micro_batches():
    """The step's ``grad_accum`` micro-batches: ``(inputs[B, S], targets[B, S])`` int64 bytes,
    targets shifted by one."""
    for _ in range(grad_accum):
        yield corpus.batch("train", args.batch_size, args.seq_len, generator)


# [readme-snippet-start]
meter = otel_training.get_meter()  # configures from OTEL_* on first use
steps = otel_training.StepAccumulator(data_parallel_size=world_size)

for step in range(1, max_steps + 1):
    started = time.perf_counter()
    for inputs, targets in micro_batches():
        logits = model(inputs)  # [B, S, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        (loss / grad_accum).backward()
        steps.add_micro_batch(loss.detach(), tokens=inputs.numel())  # no .item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    skipped = not torch.isfinite(grad_norm)  # skip a NaN/Inf update (one host read)
    learning_rate = scheduler.get_last_lr()[0]  # the rate this step ran at
    if not skipped:
        optimizer.step()
        scheduler.step()  # sets the next step's rate
    optimizer.zero_grad(set_to_none=True)
    # one histogram point per optimizer step (add torch.cuda.synchronize() first if you
    # want device time rather than host time)
    record = steps.end_step(time.perf_counter() - started, skipped=skipped)
    otel_training.record_training_metrics(meter, step_duration_ms=record.duration_ms)
    if step % log_interval == 0:
        interval = steps.interval()
        otel_training.record_training_metrics(
            meter,
            loss=interval.loss,  # tensors are fine; CUDA ones are read
            grad_norm=grad_norm,  # by a background thread, no sync here
            learning_rate=learning_rate,
            tokens_per_sec=interval.tokens_per_sec_global,  # all data-parallel ranks
            skipped_iters=interval.skipped_iters,
        )
        print(f"step {step} | loss {float(interval.loss):.3f} | lr {learning_rate:.2e}")
otel_training.shutdown()  # also runs at exit and on SIGTERM
# [readme-snippet-end]
