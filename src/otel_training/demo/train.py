"""The demo training loop: a byte-level GPT on the standard library's sources, fully instrumented.

`train` runs AdamW with linear warmup and cosine decay, gradient clipping and gradient
accumulation, skips the update when the loss or the gradient norm is non-finite, and records the
eight Megatron-LM training metrics through
`otel_training.metrics.instruments.record_training_metrics`:

- ``step_duration_ms``: once per optimizer step (one histogram point per step), in ms;
- every ``log_interval`` steps: ``loss`` (mean of the micro-batch losses of the interval's
  non-skipped steps, averaged over the data-parallel ranks), ``grad_norm`` (global L2 norm before
  clipping, of the last step), ``learning_rate`` (of the step that ran), ``tokens_per_sec``
  (global: the tokens of all data-parallel ranks over this rank's wall time of the interval),
  ``throughput_tflops`` (TFLOP/s per device, with
  `otel_training.metrics.throughput.gpt_flops_per_token`; both rates as
  `otel_training.metrics.throughput.throughput` defines them), ``skipped_iters`` (count in the
  interval) and, on CUDA only, ``memory_allocated_gb`` (``torch.cuda.memory_allocated() / 2**30``:
  current allocated GiB, not the peak).

Under ``torchrun --nproc_per_node=N`` the demo is data-parallel (`otel_training.demo.distributed`):
``torch.distributed`` on gloo (CPU) or NCCL (CUDA), the model wrapped in
``DistributedDataParallel``, each rank drawing its micro-batches of ``--batch-size`` sequences
(per rank, like Megatron-LM's ``--micro-batch-size``) from its own disjoint shard of the text.
The loss, tokens/s and TFLOP/s are reported as Megatron-LM's ``training_log`` reports them
(``megatron/training/training.py``): loss averaged over the data-parallel ranks, tokens/s of the
whole job, TFLOP/s per GPU. Every rank exports under its own identity (``dl.rank``); only rank 0
prints, and rank 0 alone writes checkpoints (the replicas are identical).

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
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from opentelemetry.metrics import Meter

from otel_training.demo.data import VOCAB_SIZE, ByteCorpus, load_stdlib_corpus
from otel_training.demo.distributed import DataParallel, parameter_digest
from otel_training.demo.model import GPT, GPTConfig
from otel_training.integrations.ddp import register_comm_hook
from otel_training.metrics.instruments import record_training_metrics
from otel_training.metrics.memory import memory_allocated_gib
from otel_training.metrics.throughput import StepAccumulator, gpt_flops_per_token
from otel_training.semconv.attributes import MEGATRON_CHECKPOINT_SIZE
from otel_training.spans import (
    checkpoint_load,
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
    Shard,
    TensorObserver,
    parse_schedule,
)

try:
    from tqdm import tqdm
except ModuleNotFoundError:  # pragma: no cover - tqdm ships with the torch extra
    tqdm = None

__all__ = ["DemoConfig", "RankSummary", "TrainResult", "build_parser", "format_summary", "train"]


def _opt(help_text: str, flag: str | None = None, hidden: bool = False) -> Any:
    return {"help": help_text, "flag": flag, "hidden": hidden}


@dataclass
class DemoConfig:
    """Settings of the demo run; each field is also a command-line flag (``--field-name``)."""

    steps: int = field(default=400, metadata=_opt("optimizer steps"))
    batch_size: int = field(
        default=16, metadata=_opt("sequences per micro-batch on each rank (per GPU)")
    )
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
        metadata=_opt(
            "directory of the checkpoints, resumed from its newest one (default: a temporary "
            "one, removed at exit)"
        ),
    )
    max_data_bytes: int | None = field(
        default=None, metadata=_opt("read at most about this many bytes of sources (default: all)")
    )
    tensor_metrics: str | None = field(
        default=None,
        metadata=_opt(
            "tensor metrics, NAME:INTERVAL,... or none; when unset, "
            "$OTEL_PYTHON_TRAINING_TENSOR_METRICS, else "
            + ",".join(f"{name}:{interval}" for name, interval in DEFAULT_SCHEDULE)
        ),
    )
    threads: int | None = field(
        default=None,
        metadata=_opt(
            "torch threads per process; when unset, OMP_NUM_THREADS, else the CPUs shared by "
            "the processes of the node and left idle by the load (otel_training.demo.threads)"
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
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
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


@dataclass(frozen=True)
class RankSummary:
    """What one rank ended with, for the closing lines on rank 0.

    Attributes:
        rank: the data-parallel rank.
        last_loss: its own mean loss of the last interval on its shard (nats per byte).
        parameter_sha256: `otel_training.demo.distributed.parameter_digest` of its parameters;
            equal on all ranks when data parallelism kept the replicas in sync.
    """

    rank: int
    last_loss: float
    parameter_sha256: str


@dataclass
class TrainResult:
    """What a run produced.

    Attributes:
        steps: optimizer steps run (skipped ones included).
        skipped_iters: optimizer steps whose update was skipped.
        interval_steps: the step that closed each log interval.
        interval_losses: mean training loss of each interval, averaged over the data-parallel
            ranks (nats per byte; NaN when every step of the interval was skipped): what was
            exported, identical on every rank.
        interval_tokens_per_sec: global tokens/s of each interval (all data-parallel ranks).
        interval_tflops: TFLOP/s per device of each interval.
        interval_rank_losses: this rank's own mean loss of each interval, on its shard of the
            data (equal to ``interval_losses`` for a single process).
        eval_losses: ``(step, held-out loss)`` pairs, when evaluation was on.
        wall_time_s: wall time of `train`, data loading included, in seconds.
        flops_per_token: training FLOPs per token used for TFLOP/s.
        n_params: parameters of the model (tied head counted once).
        device: the device trained on.
        model: the trained model.
        tensor_observer: the tensor-metric observer of the run (its gauges read it until it is
            dropped, so keep the result until telemetry is shut down).
        checkpoints: paths of the checkpoints saved (gone with their temporary directory when
            ``--checkpoint-dir`` was not given; rank 0 only).
        rank: this process's data-parallel rank.
        world_size: number of data-parallel ranks.
        backend: the ``torch.distributed`` backend, or ``None`` for a single process.
        ranks: one `RankSummary` per rank, in rank order, gathered on every rank at the end.
        resumed_from: the step of the checkpoint the run resumed from (the newest in
            ``--checkpoint-dir``), or ``None``.
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
    interval_rank_losses: list[float] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    backend: str | None = None
    ranks: list[RankSummary] = field(default_factory=list)
    resumed_from: int | None = None

    @property
    def first_loss(self) -> float:
        """Loss of the first log interval (NaN if there was none)."""
        return self.interval_losses[0] if self.interval_losses else math.nan

    @property
    def last_loss(self) -> float:
        """Loss of the last log interval (NaN if there was none)."""
        return self.interval_losses[-1] if self.interval_losses else math.nan


_FLAG_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default in its help, except ``None``: that flag's help says what it means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Command-line parser of the demo; defaults come from `DemoConfig`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a small GPT-style model on the Python standard library's sources and "
        "emit the Megatron-LM training metrics through OpenTelemetry.",
        formatter_class=_HelpFormatter,
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
def evaluate(
    model: torch.nn.Module,
    corpus: ByteCorpus,
    config: DemoConfig,
    device: torch.device,
    data_parallel: DataParallel | None = None,
) -> float:
    """Mean cross-entropy (nats per byte) on held-out batches drawn with a fixed seed from
    ``corpus`` (this rank's shard), averaged over the data-parallel ranks. Every rank must call
    it. Reads the result on the host (one synchronisation)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(config.seed + 1)
    total = torch.zeros((), device=device)
    for _ in range(config.eval_batches):
        inputs, targets = corpus.batch("eval", config.batch_size, config.seq_len, generator, device)
        logits = model(inputs)
        total += _cross_entropy(logits, targets)
    model.train(was_training)
    mean = total / config.eval_batches
    if data_parallel is not None:
        mean = data_parallel.average(mean)
    return mean.item()


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[B, S, V]`` against ``targets[B, S]``, as a 0-d fp32 tensor."""
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1)
    )


def train(
    config: DemoConfig,
    meter: Meter,
    *,
    corpus: ByteCorpus | None = None,
    data_parallel: DataParallel | None = None,
) -> TrainResult:
    """Trains the demo model and records the Megatron-LM training metrics on ``meter``.

    The phases are spans of the configured pipeline (``otel_training.spans``): the run, startup,
    each iteration with its data loading, forward/backward and optimizer step, evaluations, and
    a checkpoint (a real ``torch.save`` of the model and optimizer state) every
    ``checkpoint_interval`` steps. ``OTEL_PYTHON_TRAINING_SPAN_GROUPS`` chooses which of them
    are recorded (by default run, startup, checkpoints, evaluations).

    Under torchrun (more than one rank) the run is data-parallel, as the module docstring says;
    every rank must call `train` with the same ``config``. Runs on the calling thread.

    Args:
        config: run settings.
        meter: where the metrics go (e.g. ``configure(...).meter``, or a meter of a provider with
            an ``InMemoryMetricReader`` in tests).
        corpus: training text (all of it: each rank takes its shard); defaults to
            `load_stdlib_corpus` (``config.max_data_bytes``).
        data_parallel: the ranks to train with; by default `DataParallel.setup` joins the job
            that launched this process (initialising ``torch.distributed`` under torchrun) and
            the process group it creates is destroyed before `train` returns.

    Returns:
        A `TrainResult` with per-interval losses and rates and the trained model.

    Raises:
        ValueError: if the settings do not fit the data, the device or the launcher. Telemetry
            never raises.
    """
    with contextlib.ExitStack() as stack, training_run():
        return _train(config, meter, corpus, data_parallel, stack)


def _save_checkpoint(
    model: GPT, optimizer: torch.optim.Optimizer, step: int, directory: str
) -> str:
    """Saves the model and optimizer state with ``torch.save`` inside a checkpoint span that
    carries the path and the bytes written. Returns the path."""
    path = os.path.join(directory, f"step-{step:06d}.pt")
    with checkpoint_save(path, iteration=step) as save:
        state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)  # a process killed while saving leaves no half file
        save.set_attribute(MEGATRON_CHECKPOINT_SIZE, os.path.getsize(path))
    return path


def newest_checkpoint(directory: str | None) -> tuple[str, int] | None:
    """The newest ``step-NNNNNN.pt`` in ``directory`` and its step, or ``None``."""
    if directory is None or not os.path.isdir(directory):
        return None
    found = []
    for name in os.listdir(directory):
        stem, dot, suffix = name.partition(".")
        if dot and suffix == "pt" and stem.startswith("step-") and stem[5:].isdigit():
            found.append((int(stem[5:]), os.path.join(directory, name)))
    if not found:
        return None
    step, path = max(found)
    return path, step


def _resume(
    model: GPT, optimizer: torch.optim.Optimizer, config: DemoConfig, device: torch.device
) -> int | None:
    """Loads the newest checkpoint of ``--checkpoint-dir`` (every rank reads it) inside a
    checkpoint-load span that carries the step it holds. Returns that step, or ``None``."""
    newest = newest_checkpoint(config.checkpoint_dir)
    if newest is None:
        return None
    path, step = newest
    with checkpoint_load(path, iteration=step) as load:
        state = torch.load(path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        load.set_attribute(MEGATRON_CHECKPOINT_SIZE, os.path.getsize(path))
    return int(state["step"])


def _checkpoint_directory(
    config: DemoConfig, data_parallel: DataParallel, stack: contextlib.ExitStack
) -> str | None:
    """Where rank 0 saves checkpoints (a temporary directory unless one was given); ``None``
    when checkpoints are off or on other ranks."""
    if not config.checkpoint_interval or data_parallel.rank != 0:
        return None
    if config.checkpoint_dir is None:
        return stack.enter_context(tempfile.TemporaryDirectory(prefix="otel-demo-ckpt-"))
    os.makedirs(config.checkpoint_dir, exist_ok=True)
    return config.checkpoint_dir


def _train(
    config: DemoConfig,
    meter: Meter,
    corpus: ByteCorpus | None,
    data_parallel: DataParallel | None,
    stack: contextlib.ExitStack,
) -> TrainResult:
    started = time.perf_counter()
    with startup():
        if data_parallel is None:
            data_parallel = DataParallel.setup(config.device)
            stack.callback(data_parallel.close)
        device = data_parallel.device
        torch.manual_seed(config.seed)  # the same initial model on every rank
        if corpus is None:
            corpus = load_stdlib_corpus(max_bytes=config.max_data_bytes)
        shard = corpus.shard(data_parallel.rank, data_parallel.world_size)
        generator = torch.Generator().manual_seed(config.seed + data_parallel.rank)
        model = GPT(config.model_config()).to(device)
        trained: torch.nn.Module = model
        if data_parallel.is_distributed:
            # Averages the gradients over the ranks during backward (every parameter takes part
            # in every step, MoE experts included, so no unused-parameter search is needed).
            trained = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
            # The tail of backward, where a rank waits for its peers' gradients, is recorded
            # as communication: busy time is work alone (docs/health.md).
            register_comm_hook(trained)
        optimizer = _make_optimizer(model, config)
        resumed_from = _resume(model, optimizer, config, device)
        if resumed_from is not None:  # other batches than the run that saved it drew
            generator.manual_seed(config.seed + data_parallel.rank + 7919 * resumed_from)
        checkpoint_dir = _checkpoint_directory(config, data_parallel, stack)
    observer = _tensor_observer(model, config, meter, data_parallel)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = gpt_flops_per_token(
        model.active_non_embedding_params(),
        config.layers,
        config.d_model,
        config.seq_len,
        vocab_size=VOCAB_SIZE,
    )
    # Each rank counts its own tokens times the data-parallel size: the job's tokens, as
    # Megatron-LM's tokens/s counts the global batch.
    accumulator = StepAccumulator(data_parallel_size=data_parallel.world_size)
    tokens_per_micro_batch = config.batch_size * config.seq_len
    on_cuda = device.type == "cuda"
    quiet = config.quiet or data_parallel.rank != 0

    def say(line: str) -> None:
        if quiet:
            return
        if tqdm is not None:
            tqdm.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

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
        rank=data_parallel.rank,
        world_size=data_parallel.world_size,
        backend=data_parallel.backend,
        resumed_from=resumed_from,
    )
    first_step = 1 if resumed_from is None else resumed_from + 1
    progress = None if quiet else _progress_bar(first_step - 1, config.steps, sys.stderr)
    ranks = ""
    if data_parallel.is_distributed:
        ranks = (
            f" x {data_parallel.world_size} ranks ({data_parallel.backend}, data-parallel, "
            f"{shard.train.numel():,} train bytes each)"
        )
    say(
        f"model: {n_params:,} parameters, {config.layers} layers, d_model {config.d_model}"
        f"{f', MoE {config.experts} experts top-{config.top_k}' if config.moe else ''} | "
        f"data: {corpus.train.numel():,} train / {corpus.eval.numel():,} held-out bytes from "
        f"{corpus.n_files} stdlib files | device: {device}{ranks}"
    )
    if resumed_from is not None:
        say(f"resumed from step {resumed_from} ({newest_checkpoint(config.checkpoint_dir)[0]})")

    model.train()
    step_started = time.perf_counter()
    try:
        for step in range(first_step, config.steps + 1):
            with training_iteration(iteration=step):
                lr = _lr_at(config, step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                observer.begin_step(step)
                for micro_batch in range(config.grad_accum):
                    with data_loading(iteration=step):
                        inputs, targets = shard.batch(
                            "train", config.batch_size, config.seq_len, generator, device
                        )
                    # DDP averages gradients over the ranks once per optimizer step, at the
                    # backward of the last micro-batch.
                    last_micro_batch = micro_batch == config.grad_accum - 1
                    sync = (
                        contextlib.nullcontext()
                        if last_micro_batch or trained is model
                        else trained.no_sync()
                    )
                    with forward_backward(iteration=step), sync:
                        logits = trained(inputs)
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
                    # The gradients are averaged over the ranks, so all ranks decide alike.
                    skipped = not bool(torch.isfinite(grad_norm))
                    if not skipped:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            now = time.perf_counter()
            record = accumulator.end_step(now - step_started, skipped=skipped)
            step_started = now
            result.steps = step - first_step + 1
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
                    data_parallel,
                    say,
                )
            if eval_due:
                with evaluation(iteration=step):
                    eval_loss = evaluate(model, shard, config, device, data_parallel)
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
    own_last = result.interval_rank_losses[-1] if result.interval_rank_losses else math.nan
    result.ranks = data_parallel.gather(
        RankSummary(data_parallel.rank, own_last, parameter_digest(model.parameters()))
    )
    result.wall_time_s = time.perf_counter() - started
    return result


def _progress_bar(done: int, total: int, stream: Any) -> Any:
    """A tqdm bar of steps on ``stream`` when it is a terminal, else ``None`` (a pipe, a file,
    a log: no bar, the per-interval lines only).

    A pseudo-terminal that reports no size (0 x 0: one opened by a program, ``script``, a
    container's or CI's terminal) made tqdm print nothing at all; the bar then takes 80
    columns (``COLUMNS`` when set), and follows the terminal's width when it has one.
    """
    if tqdm is None:
        return None
    try:
        if not stream.isatty():
            return None
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    sized = size.columns > 0 and size.lines > 0
    fallback = shutil.get_terminal_size((80, 24))  # COLUMNS, LINES, else 80 x 24
    return tqdm(
        total=total,
        initial=done,
        file=stream,
        unit="step",
        leave=False,
        dynamic_ncols=sized,
        ncols=None if sized else fallback.columns,
        nrows=None if sized else fallback.lines,
    )


def _tensor_observer(
    model: GPT, config: DemoConfig, meter: Meter, data_parallel: DataParallel
) -> TensorObserver:
    """Tensor metrics of the (unwrapped) model. Across ranks the parameters and gradients are
    replicated (no communication); activation statistics are reduced over the data-parallel
    ranks (their micro-batches are shards of the global batch), so every rank reports the same
    whole-batch values."""
    if not data_parallel.is_distributed:
        return TensorObserver(model, config.tensor_metrics, meter=meter)
    return TensorObserver(
        model,
        config.tensor_metrics,
        meter=meter,
        process_groups={"dp": torch.distributed.group.WORLD},
        activation_placements={"dp": Shard(0)},
    )


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
    data_parallel: DataParallel,
    say: Any,
) -> None:
    stats = accumulator.interval()
    # Megatron-LM logs the loss averaged over the data-parallel ranks. Every rank has a loss or
    # none alike (skips are decided on the averaged gradients), so all ranks reduce together.
    own_loss = stats.loss
    loss = own_loss
    if torch.is_tensor(own_loss):
        loss = data_parallel.average(own_loss)
    rates = stats.throughput(flops_per_token=flops_per_token)
    tflops = rates.tflops_per_device
    memory_gib = memory_allocated_gib() if on_cuda else None
    record_training_metrics(
        meter,
        loss=loss,
        grad_norm=grad_norm,
        learning_rate=lr,
        tokens_per_sec=rates.tokens_per_sec_global,
        throughput_tflops=tflops,
        skipped_iters=stats.skipped_iters,
        memory_allocated_gb=memory_gib,
    )
    loss_value = math.nan if loss is None else float(loss)
    rate = rates.tokens_per_sec_global or 0.0
    result.interval_steps.append(step)
    result.interval_losses.append(loss_value)
    result.interval_rank_losses.append(math.nan if own_loss is None else float(own_loss))
    result.interval_tokens_per_sec.append(rate)
    result.interval_tflops.append(tflops or 0.0)
    line = (
        f"step {step}/{config.steps} | loss {loss_value:.3f} | lr {lr:.1e} | "
        f"grad {float(grad_norm):.2f} | {rate:,.0f} tok/s | {tflops or 0.0:.3f} TFLOP/s"
    )
    if data_parallel.is_distributed:
        line += " per GPU" if on_cuda else " per process"
    if stats.skipped_iters:
        line += f" | skipped {stats.skipped_iters}"
    if memory_gib is not None:
        line += f" | mem {memory_gib:.2f} GiB"
    say(line)


def format_summary(
    result: TrainResult,
    destination: str | None = None,
    output_dir: str | None = None,
    *,
    threads: str | None = None,
    command: str = "otel-training",
) -> str:
    """The lines that close a run: loss first vs last interval, steps, time, the ranks, where
    telemetry went and, last, how to view the files.

    Args:
        result: the run.
        destination: one line saying where telemetry went (``Telemetry.destination``).
        output_dir: the absolute directory of the run's files, when the embedded default
            wrote them; the last line then names it with the ``report``, ``trace`` and
            ``health`` commands.
        threads: the torch threads per process and why
            (:attr:`otel_training.demo.threads.ThreadChoice.sentence`).
        command: how to run ``otel-training`` from here, as the last line prints it (a path
            such as ``.venv/bin/otel-training`` when the name is not on ``PATH``).
    """
    lines = [
        f"loss {result.first_loss:.3f} -> {result.last_loss:.3f} "
        f"(first vs last interval) over {result.steps} steps"
        + (f", {result.skipped_iters} skipped" if result.skipped_iters else "")
        + (f", resumed from step {result.resumed_from}" if result.resumed_from is not None else ""),
        f"wall time {result.wall_time_s:.1f} s on {result.device}"
        + (f" with {threads}" if threads else ""),
    ]
    if result.interval_tokens_per_sec:
        rate = result.interval_tokens_per_sec[-1]
        scope = f"all {result.world_size} ranks" if result.world_size > 1 else "one process"
        lines[-1] += f"; last interval {rate:,.0f} tok/s ({scope})"
    if result.world_size > 1:
        digests = {summary.parameter_sha256 for summary in result.ranks}
        state = "identical" if len(digests) == 1 else "DIFFERENT"
        lines.append(
            f"data parallel: {result.world_size} ranks ({result.backend}); loss averaged over "
            f"the ranks, tok/s for the whole job; parameters {state} on every rank"
        )
        lines.extend(
            f"  rank {summary.rank}: own loss {summary.last_loss:.4f} on its shard | "
            f"parameters sha256 {summary.parameter_sha256[:16]}"
            for summary in result.ranks
        )
    if result.eval_losses:
        lines.append(f"held-out loss {result.eval_losses[-1][1]:.3f}")
    if destination:
        prefixed = destination.lower().startswith("telemetry")
        lines.append(destination if prefixed else f"telemetry: {destination}")
    if output_dir:
        ranks = f"ranks 0-{result.world_size - 1}" if result.world_size > 1 else "rank 0"
        where = shlex.quote(output_dir)
        lines.append(f"files ({ranks}): {output_dir}")
        lines.append(
            f"view them: {command} report {where} ; {command} trace {where} ; "
            f"{command} health {where}"
        )
    return "\n".join(lines)
