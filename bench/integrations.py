"""Per-step overhead of the framework callbacks against the same training without them.

For each framework (PyTorch Lightning, the Hugging Face ``Trainer``), three variants train the
same small model on the same data, side by side in one run (interleaved rounds: round r runs
every variant once, in a rotating order, so that a noisy neighbour on the machine hits all
alike):

- **bare**: the framework alone (a timing callback only);
- **callback**: plus ``OtelTrainingCallback(tensor_metrics="none")``: the metrics, the phase
  spans of the default span groups, the step accounting;
- **callback+tensor**: plus the default tensor-metric schedule
  (``grad_norm:10,param_norm:10,activation_rms:10,router:10``, due every tenth step).

A step's time is the wall time between the ends of consecutive optimizer steps (the timing
callback runs after the others); each run drops its first steps (warm-up) and takes the mean
(so the steps where tensor metrics are due weigh as often as they occur). The figures are the
median over rounds of (variant mean / bare mean), of the difference in microseconds per step,
and of the CPU time of the training thread inside the callback's per-step hooks
(``time.thread_time`` around each hook: the cost on the training thread without the machine's
noise; the forward pre-hook that counts the HF Trainer's tokens is not in it).
Telemetry goes to the embedded default (OTLP-JSON files in a temporary directory), as a user
without a collector would have it. torch runs on one thread: on a shared machine more threads
only add noise.

Run: ``.venv/bin/python bench/integrations.py`` (about a minute on 2 CPU cores);
``--rounds``/``--steps`` for more.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import _verdict
import torch

WARMUP_STEPS = 3
SEQ = 64
VARIANTS = ("bare", "callback", "callback+tensor")
# The hooks that run every step or micro-batch (not those of the run's start and end).
PER_STEP_HOOKS = (
    "on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end", "_after_update",
    "on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log",
)  # fmt: skip


def _data(count: int) -> torch.Tensor:
    ids = torch.tensor(list(Path(os.__file__).read_bytes()), dtype=torch.long)
    return ids[: count * (SEQ + 1)].reshape(count, SEQ + 1)


# CPU seconds of the training thread inside the callback's hooks, per variant, since the last
# reset.
_in_hooks: dict[str, float] = {}


def _callback(module, variant: str):
    """The variant's callbacks; the OtelTrainingCallback's hooks are timed into _in_hooks."""
    if variant == "bare":
        return []
    schedule = "none" if variant == "callback" else None
    callback = module.OtelTrainingCallback(tensor_metrics=schedule)
    _in_hooks[variant] = 0.0
    for name in PER_STEP_HOOKS:
        if not hasattr(callback, name):
            continue
        method = getattr(callback, name)

        def timed(*args, _method=method, **kwargs):
            started = time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                _in_hooks[variant] += time.thread_time() - started

        setattr(callback, name, timed)
    return [callback]


def _mean_step_s(ends: list[float]) -> float:
    """Mean step time after the warm-up: due steps of the tensor metrics count as often as
    they occur."""
    gaps = [b - a for a, b in zip(ends, ends[1:])][WARMUP_STEPS:]
    return statistics.fmean(gaps)


# -- Lightning --------------------------------------------------------------------------------


def lightning_run(variant: str, steps: int) -> float:
    """Mean step time (s) of one fit of ``steps`` optimizer steps."""
    import lightning.pytorch as L
    from torch.utils.data import DataLoader, TensorDataset

    from otel_training.integrations import lightning as integration

    class ByteLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(256, 128)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(128, 128) for _ in range(2))
            self.head = torch.nn.Linear(128, 256)

        def training_step(self, batch, batch_idx):
            (rows,) = batch
            h = self.embed(rows[:, :-1])
            for layer in self.layers:
                h = h + torch.tanh(layer(h))
            logits = self.head(h)
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, 256), rows[:, 1:].reshape(-1)
            )

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    ends: list[float] = []

    class Timer(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if len(ends) < trainer.global_step:
                ends.append(time.perf_counter())

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(_data(steps * 2 * 8)), batch_size=8)
    trainer = L.Trainer(
        max_steps=steps,
        accumulate_grad_batches=2,
        log_every_n_steps=5,
        gradient_clip_val=1.0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*_callback(integration, variant), Timer()],
    )
    trainer.fit(ByteLM(), loader)
    return _mean_step_s(ends)


# -- Hugging Face -----------------------------------------------------------------------------


def transformers_run(variant: str, steps: int, output_dir: str) -> float:
    """Mean step time (s) of one ``Trainer.train()`` of ``steps`` optimizer steps."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from otel_training.integrations import transformers as integration

    ends: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    torch.manual_seed(0)
    rows = _data(steps * 2 * 8)[:, :SEQ]
    data = [{"input_ids": row, "labels": row} for row in rows]
    config = GPT2Config(
        vocab_size=256, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        log_level="error",
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=data,
        callbacks=[*_callback(integration, variant), Timer()],
    )
    trainer.remove_callback(PrinterCallback)  # no log lines on stdout
    trainer.train()
    return _mean_step_s(ends)


# -- the comparison ---------------------------------------------------------------------------


def compare(name: str, run, rounds: int, steps: int) -> None:
    """Interleaved rounds of every variant; prints the per-step ratio and difference."""
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    hook_us: dict[str, list[float]] = {v: [] for v in VARIANTS[1:]}
    for r in range(rounds):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for variant in order:
            times[variant].append(run(variant))
            if variant in hook_us:
                hook_us[variant].append(_in_hooks[variant] / steps * 1e6)
    bare = times["bare"]
    print(f"{name}: bare step {statistics.median(bare) * 1e3:.1f} ms (median of {rounds} rounds)")
    sys.stdout.flush()
    for variant in VARIANTS[1:]:
        ratios = [t / b for t, b in zip(times[variant], bare)]
        extra_us = [(t - b) * 1e6 for t, b in zip(times[variant], bare)]
        print(
            f"  {variant:>16}: {statistics.median(ratios):.3f}x bare "
            f"(rounds {min(ratios):.3f}..{max(ratios):.3f}), "
            f"{statistics.median(extra_us):+.0f} us per step; "
            f"{statistics.median(hook_us[variant]):.0f} us CPU per step in its hooks"
        )


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(__doc__, "about a minute on 2 CPU cores", targets=False)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=33, help="optimizer steps per run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    for noisy in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="bench-integrations-") as root:
        os.environ["OTEL_PYTHON_TRAINING_OUTPUT_DIR"] = os.path.join(root, "telemetry")
        os.environ.setdefault("OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM", "false")
        done = False
        try:
            import lightning  # noqa: F401

            compare("Lightning", lambda v: lightning_run(v, args.steps), args.rounds, args.steps)
            done = True
        except ImportError:
            print("Lightning is not installed: pip install 'otel-training[lightning]'")
        try:
            import transformers  # noqa: F401

            out = os.path.join(root, "hf")
            compare(
                "HF Trainer",
                lambda v: transformers_run(v, args.steps, out),
                args.rounds,
                args.steps,
            )
            done = True
        except ImportError:
            print("transformers is not installed: pip install 'otel-training[transformers]'")
        import otel_training

        otel_training.shutdown()
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
