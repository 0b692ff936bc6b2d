"""The demo training loop: a byte-level GPT on the standard library's sources, fully instrumented.

`train` runs AdamW with linear warmup and cosine decay, gradient clipping and gradient
accumulation, skips the update when the loss or the gradient norm is non-finite, and records the
eight Megatron-LM training metrics through `otel_training.instruments.record_training_metrics`:

- ``step_duration_ms``: once per optimizer step (one histogram point per step), in ms;
- every ``log_interval`` steps: ``loss`` (mean of the micro-batch losses of the interval's
  non-skipped steps), ``grad_norm`` (global L2 norm before clipping, of the last step),
  ``learning_rate``, ``tokens_per_sec`` (global: all data-parallel ranks, here one process),
  ``throughput_tflops`` (TFLOP/s per device from `otel_training.throughput.gpt_flops_per_token`),
  ``skipped_iters`` (count in the interval) and, on CUDA only, ``memory_allocated_gb``
  (``torch.cuda.memory_allocated() / 2**30``: current allocated GiB, not the peak).

Loss and gradient norm are passed as 0-d tensors; the only host reads are the per-step finiteness
check that decides whether to skip the update (training logic, which also makes step times exact
on CUDA) and the per-interval reads for the log line.

``--inject-nonfinite-at STEP`` (hidden from ``--help``) multiplies that optimizer step's loss by
NaN, so the step is skipped and ``skipped_iters`` and the NaN handling can be tested end to end.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from opentelemetry.metrics import Meter

from otel_training.demo.data import VOCAB_SIZE, ByteCorpus, load_stdlib_corpus
from otel_training.demo.model import GPT, GPTConfig
from otel_training.instruments import record_training_metrics
from otel_training.memory import memory_allocated_gib
from otel_training.semconv.attributes import MEGATRON_CHECKPOINT_SIZE
from otel_training.spans import (
    checkpoint_save,
    data_loading,
    evaluation,
    forward_backward,
    optimizer_step,
    startup,
    training_iteration,
    training_run,
)
from otel_training.tensor import (
    BUILTIN_METRICS,
    DEFAULT_SCHEDULE,
    TensorObserver,
    parse_schedule,
)
from otel_training.throughput import StepAccumulator, gpt_flops_per_token, tflops_per_device

try:
    from tqdm import tqdm
except ModuleNotFoundError:  # pragma: no cover - tqdm ships with the torch extra
    tqdm = None

__all__ = ["DemoConfig", "TrainResult", "build_parser", "format_summary", "train"]


def _opt(help_text: str, flag: str | None = None, hidden: bool = False) -> Any:
    return {"help": help_text, "flag": flag, "hidden": hidden}


@dataclass
class DemoConfig:
    """Settings of the demo run; each field is also a command-line flag (``--field-name``)."""

    steps: int = field(default=400, metadata=_opt("optimizer steps"))
    batch_size: int = field(default=16, metadata=_opt("sequences per micro-batch"))
    seq_len: int = field(default=128, metadata=_opt("bytes per sequence"))
    layers: int = field(default=2, metadata=_opt("transformer blocks"))
    d_model: int = field(default=128, metadata=_opt("hidden size"))
    heads: int = field(default=4, metadata=_opt("attention heads"))
    lr: float = field(default=3e-3, metadata=_opt("peak learning rate"))
    warmup: int = field(default=20, metadata=_opt("linear warmup steps"))
    min_lr_ratio: float = field(default=0.1, metadata=_opt("final LR / peak LR (cosine decay)"))
    weight_decay: float = field(default=0.1, metadata=_opt("AdamW weight decay"))
    grad_clip: float = field(default=1.0, metadata=_opt("clip the global grad norm to this"))
    log_interval: int = field(default=20, metadata=_opt("optimizer steps per metrics interval"))
    grad_accum: int = field(default=1, metadata=_opt("micro-batches per optimizer step"))
    moe: bool = field(default=False, metadata=_opt("use a mixture-of-experts MLP"))
    experts: int = field(default=4, metadata=_opt("experts per MoE layer"))
    top_k: int = field(default=2, metadata=_opt("experts per token"))
    aux_loss_coef: float = field(default=0.01, metadata=_opt("MoE load-balancing loss weight"))
    seed: int = field(default=0, metadata=_opt("random seed"))
    device: str = field(default="auto", metadata=_opt("auto, cpu, cuda, cuda:N"))
    quiet: bool = field(default=False, metadata=_opt("no progress bar and no per-interval lines"))
    eval_interval: int = field(
        default=0, metadata=_opt("print held-out loss every N steps and at the end (0: off)")
    )
    eval_batches: int = field(default=8, metadata=_opt("batches per evaluation"))
    checkpoint_interval: int = field(
        default=200, metadata=_opt("save a checkpoint with torch.save every N steps (0: off)")
    )
    checkpoint_dir: str | None = field(
        default=None,
        metadata=_opt("directory of the checkpoints (default: a temporary one, removed at exit)"),
    )
    max_data_bytes: int | None = field(
        default=None, metadata=_opt("read at most about this many bytes of sources")
    )
    tensor_metrics: str | None = field(
        default=None,
        metadata=_opt(
            "tensor metrics, NAME:INTERVAL,... or none; when unset, "
            "$OTEL_PYTHON_TRAINING_TENSOR_METRICS, else "
            + ",".join(f"{name}:{interval}" for name, interval in DEFAULT_SCHEDULE)
        ),
    )
    inject_nonfinite_at: int | None = field(
        default=None, metadata=_opt("make this optimizer step's loss NaN", hidden=True)
    )

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "seq_len", "layers", "d_model", "heads")
        for name in (*positive, "log_interval", "grad_accum", "experts", "top_k", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.eval_interval < 0 or self.checkpoint_interval < 0:
            raise ValueError("warmup, eval_interval and checkpoint_interval must be >= 0")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.tensor_metrics is not None:
            for name, _ in parse_schedule(self.tensor_metrics):  # raises ValueError
                if name not in BUILTIN_METRICS:
                    raise ValueError(f"--tensor-metrics: unknown tensor metric {name!r}")

    def model_config(self) -> GPTConfig:
        """The model shape these settings describe."""
        return GPTConfig(
            vocab_size=VOCAB_SIZE,
            seq_len=self.seq_len,
            n_layers=self.layers,
            d_model=self.d_model,
            n_heads=self.heads,
            moe=self.moe,
            n_experts=self.experts,
            top_k=self.top_k,
        )


@dataclass
class TrainResult:
    """What a run produced.

    Attributes:
        steps: optimizer steps run (skipped ones included).
        skipped_iters: optimizer steps whose update was skipped.
        interval_steps: the step that closed each log interval.
        interval_losses: mean training loss of each interval (nats per byte; NaN when every step
            of the interval was skipped).
        interval_tokens_per_sec: global tokens/s of each interval.
        interval_tflops: TFLOP/s per device of each interval.
        eval_losses: ``(step, held-out loss)`` pairs, when evaluation was on.
        wall_time_s: wall time of `train`, data loading included, in seconds.
        flops_per_token: training FLOPs per token used for TFLOP/s.
        n_params: parameters of the model (tied head counted once).
        device: the device trained on.
        model: the trained model.
        tensor_observer: the tensor-metric observer of the run (its gauges read it until it is
            dropped, so keep the result until telemetry is shut down).
        checkpoints: paths of the checkpoints saved (gone with their temporary directory when
            ``--checkpoint-dir`` was not given).
    """

    steps: int
    skipped_iters: int
    interval_steps: list[int]
    interval_losses: list[float]
    interval_tokens_per_sec: list[float]
    interval_tflops: list[float]
    eval_losses: list[tuple[int, float]]
    wall_time_s: float
    flops_per_token: float
    n_params: int
    device: str
    model: GPT
    tensor_observer: TensorObserver | None = None
    checkpoints: list[str] = field(default_factory=list)

    @property
    def first_loss(self) -> float:
        """Loss of the first log interval (NaN if there was none)."""
        return self.interval_losses[0] if self.interval_losses else math.nan

    @property
    def last_loss(self) -> float:
        """Loss of the last log interval (NaN if there was none)."""
        return self.interval_losses[-1] if self.interval_losses else math.nan


_FLAG_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Command-line parser of the demo; defaults come from `DemoConfig`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a small GPT-style model on the Python standard library's sources and "
        "emit the Megatron-LM training metrics through OpenTelemetry.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in fields(DemoConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = argparse.SUPPRESS if f.metadata["hidden"] else f.metadata["help"]
        if f.type in (bool, "bool"):
            parser.add_argument(flag, action="store_true", help=help_text)
        else:
            kind = _FLAG_TYPES[str(f.type).replace(" | None", "")]
            parser.add_argument(
                flag, type=kind, default=f.default, help=help_text, metavar=f.name.upper()
            )
    return parser


def config_from_args(argv: Sequence[str] | None = None, prog: str | None = None) -> DemoConfig:
    """Parses demo flags into a `DemoConfig`.

    Raises:
        SystemExit: on ``--help`` or invalid flags (argparse's behaviour).
    """
    parser = build_parser(prog)
    namespace = parser.parse_args(argv)
    try:
        return DemoConfig(**vars(namespace))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _resolve_device(name: str) -> torch.device:
    """The device to train on. Raises ValueError for a name torch does not know or a CUDA
    device this machine does not have."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device {name!r}: {exc}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ValueError(f"--device {name!r}: this machine has {count} CUDA device(s)")
    elif device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"--device {name!r}: there is one CPU device")
    return device


def _lr_at(config: DemoConfig, step: int) -> float:
    """Learning rate for 1-based ``step``: linear warmup, then cosine to ``min_lr_ratio * lr``."""
    if config.warmup and step <= config.warmup:
        return config.lr * step / config.warmup
    decay_steps = max(1, config.steps - config.warmup)
    progress = min(1.0, (step - config.warmup) / decay_steps)
    min_lr = config.lr * config.min_lr_ratio
    return min_lr + 0.5 * (config.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def _make_optimizer(model: GPT, config: DemoConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


@torch.no_grad()
def evaluate(model: GPT, corpus: ByteCorpus, config: DemoConfig, device: torch.device) -> float:
    """Mean cross-entropy (nats per byte) on held-out batches drawn with a fixed seed."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(config.seed + 1)
    total = torch.zeros((), device=device)
    for _ in range(config.eval_batches):
        inputs, targets = corpus.batch("eval", config.batch_size, config.seq_len, generator, device)
        logits = model(inputs)
        total += _cross_entropy(logits, targets)
    model.train(was_training)
    return (total / config.eval_batches).item()


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[B, S, V]`` against ``targets[B, S]``, as a 0-d fp32 tensor."""
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1)
    )


def train(config: DemoConfig, meter: Meter, *, corpus: ByteCorpus | None = None) -> TrainResult:
    """Trains the demo model and records the Megatron-LM training metrics on ``meter``.

    The phases are spans of the configured pipeline (``otel_training.spans``): the run
    (``megatron.train``), startup, each iteration with its data loading, forward/backward and
    optimizer step, evaluations, and a checkpoint (a real ``torch.save`` of the model and
    optimizer state) every ``checkpoint_interval`` steps. ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``
    chooses which of them are recorded (by default run, startup, checkpoints, evaluations).

    Args:
        config: run settings.
        meter: where the metrics go (e.g. ``configure(...).meter``, or a meter of a provider with
            an ``InMemoryMetricReader`` in tests).
        corpus: training text; defaults to `load_stdlib_corpus` (``config.max_data_bytes``).

    Returns:
        A `TrainResult` with per-interval losses and rates and the trained model.

    Raises:
        ValueError: if the settings do not fit the data. Telemetry never raises.
    """
    with contextlib.ExitStack() as stack:
        directory = config.checkpoint_dir
        if config.checkpoint_interval and directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="otel-demo-ckpt-"))
        elif directory is not None:
            os.makedirs(directory, exist_ok=True)
        with training_run():
            return _train(config, meter, corpus, directory)


def _save_checkpoint(
    model: GPT, optimizer: torch.optim.Optimizer, step: int, directory: str
) -> str:
    """Saves the model and optimizer state with ``torch.save`` inside a checkpoint span that
    carries the path and the bytes written. Returns the path."""
    path = os.path.join(directory, f"step-{step:06d}.pt")
    with checkpoint_save(path, iteration=step) as save:
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, path)
        save.set_attribute(MEGATRON_CHECKPOINT_SIZE, os.path.getsize(path))
    return path


def _train(
    config: DemoConfig, meter: Meter, corpus: ByteCorpus | None, checkpoint_dir: str | None
) -> TrainResult:
    started = time.perf_counter()
    with startup():
        torch.manual_seed(config.seed)
        device = _resolve_device(config.device)
        if corpus is None:
            corpus = load_stdlib_corpus(max_bytes=config.max_data_bytes)
        generator = torch.Generator().manual_seed(config.seed)
        model = GPT(config.model_config()).to(device)
        optimizer = _make_optimizer(model, config)
    observer = TensorObserver(model, config.tensor_metrics, meter=meter)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = gpt_flops_per_token(
        model.active_non_embedding_params(),
        config.layers,
        config.d_model,
        config.seq_len,
        vocab_size=VOCAB_SIZE,
    )
    accumulator = StepAccumulator(data_parallel_size=1)
    tokens_per_micro_batch = config.batch_size * config.seq_len
    on_cuda = device.type == "cuda"
    quiet = config.quiet

    def say(line: str) -> None:
        if quiet:
            return
        if tqdm is not None:
            tqdm.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    progress = None
    if tqdm is not None and not quiet and sys.stderr.isatty():
        progress = tqdm(total=config.steps, file=sys.stderr, unit="step", leave=False)

    result = TrainResult(
        steps=0,
        skipped_iters=0,
        interval_steps=[],
        interval_losses=[],
        interval_tokens_per_sec=[],
        interval_tflops=[],
        eval_losses=[],
        wall_time_s=0.0,
        flops_per_token=flops_per_token,
        n_params=n_params,
        device=str(device),
        model=model,
        tensor_observer=observer,
    )
    say(
        f"model: {n_params:,} parameters, {config.layers} layers, d_model {config.d_model}"
        f"{f', MoE {config.experts} experts top-{config.top_k}' if config.moe else ''} | "
        f"data: {corpus.train.numel():,} train / {corpus.eval.numel():,} held-out bytes from "
        f"{corpus.n_files} stdlib files | device: {device}"
    )

    model.train()
    step_started = time.perf_counter()
    try:
        for step in range(1, config.steps + 1):
            with training_iteration(iteration=step):
                lr = _lr_at(config, step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                observer.begin_step(step)
                for _ in range(config.grad_accum):
                    with data_loading(iteration=step):
                        inputs, targets = corpus.batch(
                            "train", config.batch_size, config.seq_len, generator, device
                        )
                    with forward_backward(iteration=step):
                        logits = model(inputs)
                        loss = _cross_entropy(logits, targets)
                        if step == config.inject_nonfinite_at:
                            loss = loss * math.nan
                        objective = loss
                        aux = model.aux_loss()
                        if aux is not None:
                            objective = objective + config.aux_loss_coef * aux
                        (objective / config.grad_accum).backward()
                    accumulator.add_micro_batch(loss.detach(), tokens=tokens_per_micro_batch)

                with optimizer_step(iteration=step):
                    observer.commit()  # tensor metrics: gradients before clipping and update
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
                    # One host read per step: whether to apply the update (NaN loss -> NaN norm).
                    skipped = not bool(torch.isfinite(grad_norm))
                    if not skipped:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            now = time.perf_counter()
            record = accumulator.end_step(now - step_started, skipped=skipped)
            step_started = now
            result.steps = step
            result.skipped_iters += int(skipped)
            record_training_metrics(meter, step_duration_ms=record.duration_ms)
            if progress is not None:
                progress.update(1)

            last = step == config.steps
            log_due = step % config.log_interval == 0 or last
            eval_due = bool(config.eval_interval) and (step % config.eval_interval == 0 or last)
            if log_due:
                _log_interval(
                    config,
                    meter,
                    accumulator,
                    result,
                    step,
                    lr,
                    grad_norm,
                    flops_per_token,
                    on_cuda,
                    say,
                )
            if eval_due:
                with evaluation(iteration=step):
                    eval_loss = evaluate(model, corpus, config, device)
                result.eval_losses.append((step, eval_loss))
                say(f"step {step}/{config.steps} | eval loss {eval_loss:.3f}")
            checkpoint_due = bool(config.checkpoint_interval) and (
                step % config.checkpoint_interval == 0
            )
            if checkpoint_due and checkpoint_dir is not None:
                result.checkpoints.append(_save_checkpoint(model, optimizer, step, checkpoint_dir))
            if log_due or eval_due or checkpoint_due:
                # Logging, evaluation and checkpoint time is not part of the next step.
                step_started = time.perf_counter()
    finally:
        if progress is not None:
            progress.close()
    result.wall_time_s = time.perf_counter() - started
    return result


def _log_interval(
    config: DemoConfig,
    meter: Meter,
    accumulator: StepAccumulator,
    result: TrainResult,
    step: int,
    lr: float,
    grad_norm: torch.Tensor,
    flops_per_token: float,
    on_cuda: bool,
    say: Any,
) -> None:
    stats = accumulator.interval()
    per_device = stats.tokens_per_sec_per_device
    tflops = None if per_device is None else tflops_per_device(flops_per_token, per_device)
    memory_gib = memory_allocated_gib() if on_cuda else None
    record_training_metrics(
        meter,
        loss=stats.loss,
        grad_norm=grad_norm,
        learning_rate=lr,
        tokens_per_sec=stats.tokens_per_sec_global,
        throughput_tflops=tflops,
        skipped_iters=stats.skipped_iters,
        memory_allocated_gb=memory_gib,
    )
    loss_value = math.nan if stats.loss is None else float(stats.loss)
    rate = stats.tokens_per_sec_global or 0.0
    result.interval_steps.append(step)
    result.interval_losses.append(loss_value)
    result.interval_tokens_per_sec.append(rate)
    result.interval_tflops.append(tflops or 0.0)
    line = (
        f"step {step}/{config.steps} | loss {loss_value:.3f} | lr {lr:.1e} | "
        f"grad {float(grad_norm):.2f} | {rate:,.0f} tok/s | {tflops or 0.0:.3f} TFLOP/s"
    )
    if stats.skipped_iters:
        line += f" | skipped {stats.skipped_iters}"
    if memory_gib is not None:
        line += f" | mem {memory_gib:.2f} GiB"
    say(line)


def format_summary(result: TrainResult, destination: str | None = None) -> str:
    """A few lines that close a run: loss first vs last interval, steps, time, telemetry."""
    lines = [
        f"loss {result.first_loss:.3f} -> {result.last_loss:.3f} "
        f"(first vs last interval) over {result.steps} steps"
        + (f", {result.skipped_iters} skipped" if result.skipped_iters else ""),
        f"wall time {result.wall_time_s:.1f} s on {result.device}",
    ]
    if result.eval_losses:
        lines.append(f"held-out loss {result.eval_losses[-1][1]:.3f}")
    if destination:
        prefixed = destination.lower().startswith("telemetry")
        lines.append(destination if prefixed else f"telemetry: {destination}")
    return "\n".join(lines)
