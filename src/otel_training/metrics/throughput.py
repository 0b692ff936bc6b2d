"""Training throughput: tokens/s for the job and per device, and TFLOP/s per device, defined
once here and used by `StepAccumulator`, the framework callbacks and the demo; and the per-step
accounting that feeds them, correct under gradient accumulation.

One optimizer step is made of ``grad_accum`` micro-batches on each of ``data_parallel_size``
ranks. The numbers that the Megatron-LM training metrics want are per *optimizer step* and per
*log interval*, and they must not move when only the accumulation setting changes.

The definitions (:func:`throughput`, :func:`global_count`), over a log interval of optimizer
steps whose summed wall time is ``duration_s``:

- tokens of the job = this rank's tokens × ``data_parallel_size``: every data-parallel rank
  processes as many tokens per micro-batch (DDP, FSDP, ZeRO); a count the framework gathered
  over the ranks is taken as it is;
- ``tokens_per_sec`` for the job = tokens of the job / ``duration_s``, in tokens/s: the scope of
  Megatron-LM's ``tokens_per_sec``. Neither one micro-batch's tokens over the step time, nor a
  mean of per-micro-batch rates (both are known bugs: nanochat #177, composer #271, xtuner #977);
- ``tokens_per_sec`` per device = the job's rate / ``world_size`` (every GPU of the job, tensor
  and pipeline parallel ones included);
- ``throughput_tflops`` per device = FLOPs of the interval over all devices / (``duration_s``
  × 10^12 × ``world_size``), as Megatron-LM's ``training_log`` computes its "throughput per GPU
  (TFLOP/s/GPU)" (``num_floating_point_operations(args, batch_size) /
  (elapsed_time_per_iteration * 10**12 * args.world_size)``, ``megatron/training/training.py``).
  The FLOPs of the interval are ``flops_per_token`` × tokens of the job, or a framework's own
  count; ``flops_per_token`` of a GPT-style decoder is :func:`gpt_flops_per_token` (PaLM,
  Chowdhery et al. 2022, appendix B, which extends Kaplan et al. 2020, section 2.1, with the
  attention term; Megatron-LM's ``num_floating_point_operations`` has the same leading terms).
  Model FLOPs, not hardware FLOPs: activation recomputation is not counted;
- ``loss`` = the mean of the micro-batch losses over the interval's non-skipped optimizer steps
  (not their sum and not the last micro-batch's value: transformers #35204).

Typical use, one process per rank::

    acc = StepAccumulator(data_parallel_size=dp)
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        for micro_batch in micro_batches:
            loss = model(micro_batch)            # 0-d tensor, kept as is
            acc.add_micro_batch(loss, tokens=micro_batch.numel())
            ...
        record = acc.end_step(time.perf_counter() - t0, skipped=not finite)
        record_training_metrics(meter, step_duration_ms=record.duration_ms)
        if step % log_interval == 0:
            stats = acc.interval()
            rates = stats.throughput(flops_per_token=gpt_flops_per_token(...))
            record_training_metrics(meter, loss=stats.loss,
                                    tokens_per_sec=rates.tokens_per_sec_global,
                                    throughput_tflops=rates.tflops_per_device, ...)

The module is pure Python and never imports torch: 0-d tensors passed as losses are averaged with
tensor operations (``torch.stack(...).mean()``, taken from the already imported ``torch`` module)
so that accounting causes no device synchronisation.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from otel_training._log_once import LogOnce

__all__ = [
    "IntervalStats",
    "StepAccumulator",
    "StepRecord",
    "Throughput",
    "gpt_flops_per_token",
    "tflops_per_device",
    "throughput",
    "global_count",
    "mean_loss",
]

_warn_once = LogOnce(logging.getLogger(__name__))


def _is_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def mean_loss(values: Sequence[Any]) -> Any:
    """Mean of floats or 0-d tensors, without reading tensors on the host: the one mean of
    losses (StepAccumulator's, the callbacks' recorder's).

    Returns ``None`` for an empty sequence, a ``float`` when every value is a plain number, and a
    0-d tensor (on the first tensor's device, float32 or wider) when any value is a tensor.
    """
    if not values:
        return None
    if any(_is_tensor(v) for v in values):
        torch = sys.modules["torch"]
        first = next(v for v in values if _is_tensor(v))
        dtype = (
            torch.promote_types(first.dtype, torch.float32)
            if first.is_floating_point()
            else torch.float32
        )
        stacked = torch.stack(
            [torch.as_tensor(v, dtype=dtype, device=first.device).reshape(()) for v in values]
        )
        return stacked.mean()
    return math.fsum(float(v) for v in values) / len(values)


def global_count(count_on_rank: float, data_parallel_size: int) -> float:
    """The whole job's count (tokens, or model FLOPs) from one rank's: ``count_on_rank ×
    data_parallel_size``, as if every data-parallel rank processed as much (DDP, FSDP, ZeRO;
    under tensor or pipeline parallelism pass the data-parallel size, not the world size).
    Never raises."""
    return count_on_rank * data_parallel_size


@dataclass(frozen=True)
class Throughput:
    """The throughput figures of one interval, as :func:`throughput` defines them.

    Attributes:
        tokens_per_sec_global: Tokens of the job / the interval's wall time, in tokens/s
            (``megatron.training.tokens_per_sec``); ``None`` without a token count or a time.
        tokens_per_sec_per_device: ``tokens_per_sec_global / world_size``, in tokens/s per
            device; ``None`` likewise.
        tflops_per_device: FLOPs of the interval over all devices / (time × 10^12 ×
            ``world_size``), in TFLOP/s per device (``megatron.training.throughput_tflops``);
            ``None`` without a FLOP count or a time.
    """

    tokens_per_sec_global: float | None
    tokens_per_sec_per_device: float | None
    tflops_per_device: float | None


def throughput(
    duration_s: float | None,
    *,
    world_size: int = 1,
    tokens_global: float | None = None,
    flops_per_token: float | None = None,
    flops_global: float | None = None,
) -> Throughput:
    """The throughput of an interval of optimizer steps: the one definition (module docstring).

    - tokens/s for the job = ``tokens_global / duration_s``;
    - tokens/s per device = tokens/s for the job / ``world_size``;
    - TFLOP/s per device = FLOPs / (``duration_s`` × 10^12 × ``world_size``), the FLOPs being
      ``flops_per_token × tokens_global`` when both are given, else ``flops_global``
      (Megatron-LM's ``training_log``).

    Args:
        duration_s: Summed wall time of the interval's optimizer steps, in seconds (evaluations
            and checkpoint saves between them excluded).
        world_size: Devices (GPUs) of the job, the divisor of the per-device figures.
        tokens_global: Tokens of the interval over all data-parallel ranks (:func:`global_count`
            of this rank's count, or a count the framework gathered); ``None``: not counted.
        flops_per_token: Training FLOPs per token (forward and backward, e.g.
            :func:`gpt_flops_per_token`); needs ``tokens_global``.
        flops_global: Model FLOPs of the interval over all devices, as a framework counts them;
            used unless ``flops_per_token`` and ``tokens_global`` are both given.

    Returns:
        The :class:`Throughput`; each figure is ``None`` where its inputs are missing, or the
        time is not a positive number. Never raises.
    """
    if duration_s is None or not duration_s > 0 or world_size < 1:
        return Throughput(None, None, None)
    rate = None if tokens_global is None else tokens_global / duration_s
    flops = flops_global
    if flops_per_token is not None and tokens_global is not None:
        flops = flops_per_token * tokens_global
    tflops = None if flops is None else flops / (duration_s * 1e12 * world_size)
    return Throughput(rate, None if rate is None else rate / world_size, tflops)


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step, as returned by `StepAccumulator.end_step`.

    Attributes:
        step: 1-based index of the optimizer step since the accumulator was created.
        loss: mean of this step's micro-batch losses on this rank (a float, a 0-d tensor when the
            losses were tensors, or ``None`` when no loss was given). One loss per optimizer step.
        micro_batches: number of micro-batches of this step on this rank.
        tokens_global: tokens of the step summed over micro-batches and data-parallel ranks.
        duration_s: wall time of the whole optimizer step in seconds (all micro-batches), or
            ``None`` when the given duration was invalid.
        skipped: whether the optimizer update was skipped (non-finite loss or gradient norm).
        world_size: number of devices the global rate is divided by for the per-device rate.
    """

    step: int
    loss: Any
    micro_batches: int
    tokens_global: int
    duration_s: float | None
    skipped: bool
    world_size: int

    @property
    def duration_ms(self) -> float | None:
        """Step wall time in milliseconds, the unit of ``megatron.training.step_duration_ms``."""
        return None if self.duration_s is None else self.duration_s * 1000.0

    @property
    def tokens_per_sec_global(self) -> float | None:
        """Global rate of this step (:func:`throughput`): ``tokens_global / duration_s``, in
        tokens/s."""
        return self.throughput().tokens_per_sec_global

    @property
    def tokens_per_sec_per_device(self) -> float | None:
        """Per-device rate of this step (:func:`throughput`): ``tokens_per_sec_global /
        world_size``, in tokens/s."""
        return self.throughput().tokens_per_sec_per_device

    def throughput(self, *, flops_per_token: float | None = None) -> Throughput:
        """This step's :class:`Throughput` (:func:`throughput` over its tokens and time)."""
        return throughput(
            self.duration_s,
            world_size=self.world_size,
            tokens_global=self.tokens_global,
            flops_per_token=flops_per_token,
        )


@dataclass(frozen=True)
class IntervalStats:
    """Aggregates over one log interval, as returned by `StepAccumulator.interval`.

    Attributes:
        steps: optimizer steps in the interval, skipped ones included.
        skipped_iters: optimizer steps whose update was skipped.
        loss: mean of the micro-batch losses of the non-skipped steps (a float, or a 0-d tensor
            when the losses were tensors; ``None`` when every step was skipped or had no loss).
        tokens_global: tokens of all steps of the interval, over all data-parallel ranks. Skipped
            steps count: their forward and backward passes ran.
        duration_s: summed wall time of the interval's steps in seconds.
        tokens_per_sec_global: ``tokens_global / duration_s`` in tokens/s, over all
            data-parallel ranks (the scope of Megatron-LM's ``tokens_per_sec``); ``None`` when
            no time was measured.
        tokens_per_sec_per_device: ``tokens_per_sec_global / world_size`` in tokens/s per device
            (GPU); ``None`` when no time was measured.
        mean_step_duration_s: ``duration_s / steps`` in seconds; ``None`` when no steps.
        world_size: Devices of the job, the divisor of the per-device figures.
    """

    steps: int
    skipped_iters: int
    loss: Any
    tokens_global: int
    duration_s: float
    tokens_per_sec_global: float | None
    tokens_per_sec_per_device: float | None
    mean_step_duration_s: float | None
    world_size: int = 1

    def throughput(
        self,
        *,
        flops_per_token: float | None = None,
        flops_global: float | None = None,
        count_tokens: bool = True,
    ) -> Throughput:
        """This interval's :class:`Throughput` (:func:`throughput` over its tokens and summed
        step time), with TFLOP/s from ``flops_per_token`` or a framework's ``flops_global``.
        ``count_tokens=False``: no token count was given (no tokens/s, and TFLOP/s only from
        ``flops_global``)."""
        return throughput(
            self.duration_s,
            world_size=self.world_size,
            tokens_global=self.tokens_global if count_tokens else None,
            flops_per_token=flops_per_token,
            flops_global=flops_global,
        )

    @property
    def mean_step_duration_ms(self) -> float | None:
        """Mean step wall time in milliseconds."""
        if self.mean_step_duration_s is None:
            return None
        return self.mean_step_duration_s * 1000.0


class StepAccumulator:
    """Accumulates micro-batches into optimizer steps, and optimizer steps into log intervals.

    Call `add_micro_batch` once per micro-batch on this rank, `end_step` once per optimizer step,
    and `interval` once per log interval. All rates are derived from token counts and summed step
    times, never from per-micro-batch rates, so gradient accumulation does not change them: with
    8 data-parallel ranks, 4 micro-batches of 2 x 2048 tokens and a 1.6 s step, the step's global
    rate is 8 * 4 * 4096 / 1.6 = 81,920 tokens/s and the per-device rate 10,240 tokens/s.

    Not thread-safe: call it from the training thread. The hot-path methods never raise; invalid
    values are dropped with a warning logged once per cause.

    Args:
        data_parallel_size: number of data-parallel ranks that each process the same number of
            tokens per micro-batch; this rank's token counts are multiplied by it.
        world_size: number of devices (GPUs) of the job, the divisor of the per-device rate.
            Defaults to ``data_parallel_size`` (pure data parallelism); with tensor or pipeline
            parallelism pass the full world size.

    Raises:
        ValueError: if ``data_parallel_size`` or ``world_size`` is not a positive integer.
    """

    def __init__(self, *, data_parallel_size: int = 1, world_size: int | None = None) -> None:
        if isinstance(data_parallel_size, bool) or not isinstance(data_parallel_size, int):
            raise ValueError(f"data_parallel_size must be an int, got {data_parallel_size!r}")
        if data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
        if world_size is None:
            world_size = data_parallel_size
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.data_parallel_size = data_parallel_size
        self.world_size = world_size
        self._step = 0
        # Current optimizer step.
        self._step_losses: list[Any] = []
        self._step_micro_batches = 0
        self._step_tokens = 0
        # Current log interval.
        self._interval_losses: list[Any] = []
        self._interval_steps = 0
        self._interval_skipped = 0
        self._interval_tokens = 0
        self._interval_duration_s = 0.0

    @property
    def step(self) -> int:
        """Number of optimizer steps ended so far (skipped ones included)."""
        return self._step

    def add_micro_batch(self, loss: Any = None, tokens: int = 0) -> None:
        """Records one micro-batch of the current optimizer step on this rank.

        Args:
            loss: the micro-batch's mean loss: a float or a 0-d tensor on any device (detached
                and kept on its device, not read on the host), or ``None`` to count tokens
                only.
            tokens: tokens of this micro-batch on this rank (e.g. ``batch * seq_len``); the
                global count is ``tokens * data_parallel_size``.

        Never raises; a negative or non-integral token count is dropped with a warning.
        """
        self._step_micro_batches += 1
        if loss is not None:
            if _is_tensor(loss):
                if loss.numel() == 1:
                    # Detach so that the autograd graph of the micro-batch is not kept alive.
                    self._step_losses.append(loss.detach())
                else:
                    _warn_once(
                        "loss-shape",
                        "StepAccumulator: dropping a loss of shape %s (a scalar is needed)",
                        tuple(loss.shape),
                    )
            else:
                try:
                    self._step_losses.append(float(loss))
                except (TypeError, ValueError, OverflowError):
                    _warn_once("loss-type", "StepAccumulator: dropping the loss %r", loss)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            try:
                as_int = int(tokens)
                valid = as_int == tokens and as_int >= 0
            except (TypeError, ValueError, OverflowError):
                valid = False
            if not valid:
                _warn_once("tokens", "StepAccumulator: dropping invalid token count %r", tokens)
                return
            tokens = as_int
        self._step_tokens += global_count(tokens, self.data_parallel_size)

    def add_tokens_global(self, tokens: int) -> None:
        """Adds ``tokens`` counted over all data-parallel ranks already (a framework's gathered
        count) to the current optimizer step, without a micro-batch. Never raises; a negative
        or non-integral count is dropped with a warning."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            _warn_once("tokens", "StepAccumulator: dropping invalid token count %r", tokens)
            return
        self._step_tokens += tokens

    def end_step(self, duration_s: float, skipped: bool = False) -> StepRecord:
        """Closes the current optimizer step.

        Args:
            duration_s: wall time of the whole optimizer step in seconds, from the start of its
                first micro-batch to the end of the optimizer update (or its skip).
            skipped: whether the update was skipped (non-finite loss or gradient norm); the
                step's losses are then left out of the interval's loss, its tokens and time are
                not (the work was done).

        Returns:
            The step's `StepRecord`; its ``loss`` is the mean of the step's micro-batch losses.

        Never raises; a negative or non-finite duration is dropped with a warning (the step's
        tokens are then left out of the rates too).
        """
        self._step += 1
        try:
            duration: float | None = float(duration_s)
        except (TypeError, ValueError):
            duration = None
        if duration is not None and (not math.isfinite(duration) or duration < 0):
            duration = None
        if duration is None:
            _warn_once("duration", "StepAccumulator: dropping invalid duration_s %r", duration_s)

        step_loss = mean_loss(self._step_losses)
        record = StepRecord(
            step=self._step,
            loss=step_loss,
            micro_batches=self._step_micro_batches,
            tokens_global=self._step_tokens,
            duration_s=duration,
            skipped=bool(skipped),
            world_size=self.world_size,
        )
        self._interval_steps += 1
        if record.skipped:
            self._interval_skipped += 1
        else:
            self._interval_losses.extend(self._step_losses)
        if duration is not None:
            self._interval_tokens += self._step_tokens
            self._interval_duration_s += duration
        self._step_losses = []
        self._step_micro_batches = 0
        self._step_tokens = 0
        return record

    def interval(self) -> IntervalStats:
        """Returns the aggregates of the steps ended since the last call, and starts a new interval.

        Micro-batches added after the last `end_step` stay with the open step.

        Returns:
            `IntervalStats` with the mean loss of the non-skipped steps' micro-batches, the global
            and per-device token rates, and the step and skip counts. Never raises.
        """
        duration = self._interval_duration_s
        rates = throughput(
            duration, world_size=self.world_size, tokens_global=self._interval_tokens
        )
        stats = IntervalStats(
            steps=self._interval_steps,
            skipped_iters=self._interval_skipped,
            loss=mean_loss(self._interval_losses),
            tokens_global=self._interval_tokens,
            duration_s=duration,
            tokens_per_sec_global=rates.tokens_per_sec_global,
            tokens_per_sec_per_device=rates.tokens_per_sec_per_device,
            mean_step_duration_s=duration / self._interval_steps if self._interval_steps else None,
            world_size=self.world_size,
        )
        self._interval_losses = []
        self._interval_steps = 0
        self._interval_skipped = 0
        self._interval_tokens = 0
        self._interval_duration_s = 0.0
        return stats


def gpt_flops_per_token(
    n_params_non_embedding: int,
    n_layers: int,
    d_model: int,
    seq_len: int,
    *,
    vocab_size: int = 0,
) -> float:
    """Training FLOPs per token of a GPT-style decoder (forward + backward).

    ``6 * N + 12 * L * d * S (+ 6 * d * V)``: ``2 * N`` multiply-adds per token for the
    weight matmuls in the forward pass and twice that in the backward pass (Kaplan et al. 2020,
    section 2.1), plus the attention scores and their weighted sum, ``2 * 2 * L * d * S`` in the
    forward pass and three times that for forward + backward (PaLM, Chowdhery et al. 2022,
    appendix B; Megatron-LM's ``num_floating_point_operations`` has the same terms). Causal masking
    is not discounted, as in both references. Activation recomputation is not counted: this is the
    "model FLOPs" of model FLOPs utilisation.

    Args:
        n_params_non_embedding: ``N``, parameters used per token outside the token and position
            embeddings (for a mixture of experts, the *active* parameters: the top-k experts).
        n_layers: ``L``, transformer layers.
        d_model: ``d``, hidden size (heads * head dimension).
        seq_len: ``S``, sequence length in tokens.
        vocab_size: ``V``; when > 0 adds ``6 * d * V`` for an output head whose weights are not
            in ``N`` (e.g. tied to the embedding), as Megatron-LM counts the logit layer.

    Returns:
        FLOPs per token for one training step.

    Raises:
        ValueError: if any argument is negative.
    """
    args = {
        "n_params_non_embedding": n_params_non_embedding,
        "n_layers": n_layers,
        "d_model": d_model,
        "seq_len": seq_len,
        "vocab_size": vocab_size,
    }
    for name, value in args.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return float(
        6 * n_params_non_embedding + 12 * n_layers * d_model * seq_len + 6 * d_model * vocab_size
    )


def tflops_per_device(flops_per_token: float, tokens_per_sec_per_device: float) -> float:
    """Achieved model throughput per device in TFLOP/s (10^12 FLOP/s), from a per-device token
    rate: :func:`throughput` over one second of one device, that is
    ``flops_per_token * tokens_per_sec_per_device / 1e12``, the unit of
    ``megatron.training.throughput_tflops``, which Megatron-LM reports per GPU.

    Args:
        flops_per_token: training FLOPs per token, e.g. from `gpt_flops_per_token`.
        tokens_per_sec_per_device: tokens/s processed by one device (the global rate divided by
            the world size).

    Returns:
        TFLOP/s per device.
    """
    figures = throughput(
        1.0, tokens_global=tokens_per_sec_per_device, flops_per_token=flops_per_token
    )
    return figures.tflops_per_device
