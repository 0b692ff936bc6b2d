"""The loop of `train_loop.py` with DistributedDataParallel, one process per rank under torchrun.

Run it from the repository root on CPU (gloo), two ranks on one machine::

    .venv/bin/torchrun --nproc_per_node=2 examples/train_ddp.py     # about 15 s on 2 cores

What changes from the single-process loop, and why (as Megatron-LM's ``training_log`` in
``megatron/training/training.py`` reports a data-parallel run):

- ``torch.distributed`` is initialised from torchrun's variables (``MASTER_ADDR``, ``RANK``,
  ``WORLD_SIZE``) and the model is wrapped in ``DistributedDataParallel``, which averages the
  gradients over the ranks in the backward pass;
- each rank trains on its own contiguous, disjoint shard of the text; ``--batch-size`` is per
  rank (Megatron-LM's ``--micro-batch-size``), so the global batch is ``world_size`` times it;
- ``StepAccumulator(data_parallel_size=world_size)`` makes ``tokens_per_sec_global`` the tokens
  of every rank over this rank's wall time: the job's throughput;
- the logged loss is averaged over the ranks (one ``all_reduce`` per log interval), so every rank
  exports the same value;
- every rank exports under its own identity: ``dl.rank``, ``dl.world_size`` and the run id come
  from torchrun's variables into the OpenTelemetry Resource, and the embedded default writes
  ``metrics-rank{R}.jsonl`` per rank. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import otel_training
from otel_training.demo.data import load_stdlib_corpus
from otel_training.demo.model import GPT, GPTConfig
from otel_training.demo.threads import apply_threads
from otel_training.integrations.ddp import register_comm_hook

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=100, help="optimizer steps")
parser.add_argument("--log-interval", type=int, default=10, help="steps per metrics interval")
parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per step")
parser.add_argument("--batch-size", type=int, default=8, help="sequences per micro-batch, per rank")
parser.add_argument("--seq-len", type=int, default=64, help="bytes per sequence")
parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
parser.add_argument("--warmup", type=int, default=20, help="linear warmup steps")
parser.add_argument("--max-data-bytes", type=int, default=2_000_000, help="bytes of sources")
args = parser.parse_args()

dist.init_process_group("gloo")  # on GPUs: "nccl", with the model on cuda:LOCAL_RANK
rank, world_size = dist.get_rank(), dist.get_world_size()
# torch's threads: OMP_NUM_THREADS, which torchrun sets to 1 for several ranks per node, else
# the CPUs this process may use shared with what else runs on them (the demo's rule).
apply_threads()

torch.manual_seed(0)  # the same initial model on every rank (DDP also broadcasts rank 0's)
corpus = load_stdlib_corpus(max_bytes=args.max_data_bytes).shard(rank, world_size)
model = DistributedDataParallel(
    GPT(GPTConfig(seq_len=args.seq_len, n_layers=2, d_model=64, n_heads=4))
)
# DDP's all-reduce runs inside backward: the hook records its wait as communication, so run
# health tells a slow or stuck rank from the ranks that wait for it (docs/health.md).
register_comm_hook(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda done: min(1.0, (done + 1) / args.warmup)
)
max_steps, log_interval, grad_accum = args.steps, args.log_interval, args.grad_accum
generator = torch.Generator().manual_seed(rank)


def micro_batches():
    """This rank's ``grad_accum`` micro-batches from its shard: ``(inputs[B, S],
    targets[B, S])`` int64 bytes, targets shifted by one."""
    for _ in range(grad_accum):
        yield corpus.batch("train", args.batch_size, args.seq_len, generator)


meter = otel_training.get_meter()  # this rank's identity comes from torchrun's variables
steps = otel_training.StepAccumulator(data_parallel_size=world_size)

for step in range(1, max_steps + 1):
    started = time.perf_counter()
    for inputs, targets in micro_batches():
        logits = model(inputs)  # [B, S, V]; DDP averages the gradients in backward
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        (loss / grad_accum).backward()
        steps.add_micro_batch(loss.detach(), tokens=inputs.numel())  # this rank's tokens
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    skipped = not torch.isfinite(grad_norm)  # the same on every rank: gradients are averaged
    learning_rate = scheduler.get_last_lr()[0]  # the rate this step ran at
    if not skipped:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    record = steps.end_step(time.perf_counter() - started, skipped=skipped)
    otel_training.record_training_metrics(meter, step_duration_ms=record.duration_ms)
    if step % log_interval == 0:
        interval = steps.interval()
        loss = interval.loss  # this rank's mean loss of the interval, a 0-d tensor
        if loss is not None:  # None on every rank alike, when every step was skipped
            loss = loss.clone()
            dist.all_reduce(loss)  # sum over the ranks (gloo has no average) ...
            loss /= world_size  # ... over the ranks: the data-parallel average
        otel_training.record_training_metrics(
            meter,
            loss=loss,
            grad_norm=grad_norm,  # of the averaged gradients: the same on every rank
            learning_rate=learning_rate,
            tokens_per_sec=interval.tokens_per_sec_global,  # all ranks' tokens
            skipped_iters=interval.skipped_iters,
        )
        if rank == 0:
            print(
                f"step {step} | loss {float(loss):.3f} (mean of {world_size} ranks) | "
                f"{interval.tokens_per_sec_global:,.0f} tok/s (whole job)",
                flush=True,
            )
otel_training.shutdown()  # flush this rank's telemetry before leaving the process group
dist.destroy_process_group()
