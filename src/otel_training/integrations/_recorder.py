"""What the framework callbacks share: one training run recorded with the project's definitions.

A callback maps its framework's hooks onto a :class:`RunRecorder`; the recorder owns the
pipeline (``configure()`` with the framework's rank identity, or the providers given), the phase
spans (through :class:`otel_training.spans.SpanRecorder` and the phase functions, so span names
and groups stay theirs), the optimizer-step accounting (:class:`~otel_training.StepAccumulator`)
and the tensor observer. Nothing here imports a framework; torch is imported only when tensor
metrics are scheduled.

Every method runs on the training thread, reads no device value and never raises: a failure is
logged once per method and the run goes on without that record.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_training import config, configuration, spans
from otel_training._log_once import LogOnce
from otel_training.metrics.instruments import record_training_metrics
from otel_training.metrics.memory import memory_allocated_gib
from otel_training.metrics.throughput import StepAccumulator, mean_loss
from otel_training.semconv.attributes import MEGATRON_ITERATION

_logger = logging.getLogger("otel_training.integrations")
#: ``warn_once(cause, message, *args, exc_info=False)``: logged the first time ``cause`` is seen
#: in this process; never raises.
warn_once = LogOnce(_logger)
# At the end of a run that ended well, how long the tensor observer's last device results are
# waited for (s): the training loop is over, and the final collection should have them.
_FINAL_FLUSH_S = 2.0


def guarded(method: Callable) -> Callable:
    """Makes a callback hook never raise: an exception is logged once per hook and dropped
    (telemetry must never stop training)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception:
            warn_once(
                f"hook:{method.__qualname__}",
                "otel-training: %s failed; that record is skipped (shown once)",
                method.__qualname__,
                exc_info=True,
            )
            return None

    return wrapper


def missing_framework(
    package: str, extra: str, error: BaseException | None, requirements: str | None = None
) -> None:
    """Raises the ``ModuleNotFoundError`` of a callback whose framework is not installed,
    saying what to install from an index (``requirements``, default ``package``) and which
    extra of otel-training brings it (the package itself is on no index)."""
    raise ModuleNotFoundError(
        f"this callback needs {package}: pip install {requirements or package} "
        f"(otel-training's extra {extra})",
        name=package,
    ) from error


@dataclass(frozen=True)
class FrameworkIdentity:
    """Where this process sits in the job, as the framework says.

    Attributes:
        rank: Global rank, 0-based.
        local_rank: Rank on this node.
        world_size: Number of processes of the job.
        node_rank: Index of this node, or ``None`` when the framework does not say (the
            launcher's variables then decide).
        local_world_size: Processes on this node, or ``None`` when not known.
    """

    rank: int
    local_rank: int
    world_size: int
    node_rank: int | None = None
    local_world_size: int | None = None

    def environ(self) -> dict[str, str]:
        """The torchrun variables that describe this identity, for ``configure(environ=)``."""
        values = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
        }
        if self.node_rank is not None:
            values["GROUP_RANK"] = str(self.node_rank)
        if self.local_world_size is not None:
            values["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return values


def validate_options(
    tensor_metrics: str | None,
    tokens_per_sample: int | None,
    tokens_per_batch: Callable[[Any], int] | None,
    flops_per_token: float | None,
) -> None:
    """Checks the callbacks' shared keyword arguments.

    Raises:
        ValueError: on a malformed ``tensor_metrics`` schedule or an unknown metric in it,
            both token arguments given, a token count that is not a positive int, or a
            ``flops_per_token`` that is not a positive finite number.
        TypeError: when ``tokens_per_batch`` is not callable.
    """
    if tensor_metrics is not None:
        from otel_training.tensor.observer import parse_schedule

        for name, _ in parse_schedule(tensor_metrics):
            if name not in config.TENSOR_METRIC_NAMES:
                known = ", ".join(config.TENSOR_METRIC_NAMES)
                raise ValueError(f"tensor_metrics: unknown tensor metric {name!r}; known: {known}")
    if tokens_per_sample is not None and tokens_per_batch is not None:
        raise ValueError("give tokens_per_sample= or tokens_per_batch=, not both")
    if tokens_per_sample is not None and (
        isinstance(tokens_per_sample, bool)
        or not isinstance(tokens_per_sample, int)
        or tokens_per_sample < 1
    ):
        raise ValueError(f"tokens_per_sample must be a positive int, got {tokens_per_sample!r}")
    if tokens_per_batch is not None and not callable(tokens_per_batch):
        raise TypeError(f"tokens_per_batch must be callable, got {tokens_per_batch!r}")
    if flops_per_token is not None:
        try:
            valid = math.isfinite(float(flops_per_token)) and float(flops_per_token) > 0
        except (TypeError, ValueError):
            valid = False
        if not valid:
            raise ValueError(f"flops_per_token must be a positive number, got {flops_per_token!r}")


def batch_size_of(batch: Any) -> int | None:
    """The leading dimension of the first tensor in ``batch`` (a tensor, a mapping or a
    sequence of them, nested; searched breadth first, so the shallowest tensor), read from its
    shape: no device access. ``None`` if none."""
    pending = [batch]
    while pending:
        item = pending.pop(0)
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0])
        if isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return None


def count_tokens(batch: Any, tokens_per_sample: int | None, tokens_per_batch) -> int | None:
    """Tokens of one micro-batch on this rank: ``tokens_per_batch(batch)``, or the batch size
    times ``tokens_per_sample``; ``None`` when neither is given or the count is unusable."""
    if tokens_per_batch is not None:
        value = tokens_per_batch(batch)
        try:
            tokens = int(value)
        except (TypeError, ValueError, RuntimeError):
            warn_once("tokens_per_batch", "tokens_per_batch returned %r, not an int", value)
            return None
        return tokens if tokens >= 0 else None
    if tokens_per_sample is not None:
        size = batch_size_of(batch)
        if size is None:
            warn_once("batch_size", "tokens_per_sample: no tensor in the batch to take its size")
            return None
        return size * tokens_per_sample
    return None


class RunInterrupted(RuntimeError):
    """What a run that ended without its framework's end hook is recorded with: an exception
    the caller caught where the framework has no hook for it, or a second fit that started
    before the first ended."""


class RunRecorder:
    """One training run of a framework, recorded as the README's metric table defines it.

    Args:
        meter_provider: Where the metrics go; default: the pipeline ``configure()`` builds.
        tracer_provider: Where the spans go; default: the same pipeline.
        tensor_metrics: A ``TensorObserver`` schedule (``"grad_norm:10,param_norm:10"``,
            ``"none"``); default: ``OTEL_PYTHON_TRAINING_TENSOR_METRICS``, else the observer's.
        flops_per_token: Training FLOPs per token (forward and backward), for
            ``throughput_tflops``; overrides what the framework counts.

    Step accounting: a step lasts from the previous *boundary* (the end of the previous step,
    of an evaluation or checkpoint save after it, or the start of the training loop) to the end
    of its optimizer update, so its data loading is in it and evaluations, saves, checkpoint
    loads and sanity checks are not. Tokens are this rank's, counted for the job by
    :func:`otel_training.metrics.throughput.global_count` with the world size; throughput figures
    are :func:`otel_training.metrics.throughput.throughput`'s.

    Every run starts from a clean state: nothing of a previous run (one that failed included)
    reaches the next. A run, iteration, evaluation, checkpoint save or load ended by an
    exception is exported with status ERROR and the exception (:meth:`fail_run`,
    :meth:`fail_checkpoint`); the step it interrupted records no ``step_duration_ms`` point.
    """

    _PHASES = ("_checkpoint", "_load", "_evaluation", "_optimizer", "_iteration", "_run")

    def __init__(
        self,
        *,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        tensor_metrics: str | None = None,
        flops_per_token: float | None = None,
    ) -> None:
        self._meter_provider = meter_provider
        self._tracer_provider = tracer_provider
        self._tensor_metrics = tensor_metrics
        self._flops_per_token = None if flops_per_token is None else float(flops_per_token)
        self._meter = None
        self._recorder: spans.SpanRecorder | None = None
        self.observer = None
        self._run = None
        self._reset()

    def _reset(self) -> None:
        """Forgets everything of the run (phases, step, interval, counters)."""
        self._load = None
        self._iteration = None
        self._optimizer = None
        self._evaluation = None
        self._checkpoint = None
        self._accumulator: StepAccumulator | None = None
        self._world_size = 1
        self._on_cuda = False
        self._step: int | None = None
        self._boundary = 0.0
        self._interval_steps = 0
        self._step_losses: list[Any] = []
        self._interval_losses: list[Any] = []
        self.counts_tokens = False

    # -- the run --------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether a run is being recorded (between :meth:`start_run` and its end)."""
        return self._run is not None

    def start_run(self, identity: FrameworkIdentity, *, on_cuda: bool = False) -> None:
        """Starts the run: resolves the pipeline, opens the run span, starts the clock. A run
        still open is failed first with :class:`RunInterrupted` (it never ended)."""
        if self._run is not None:
            self.fail_run(RunInterrupted("the previous run ended without its end hook"))
        self._reset()
        self._resolve_pipeline(identity)
        self._world_size = max(1, int(identity.world_size))
        self._on_cuda = on_cuda
        self._accumulator = StepAccumulator(
            data_parallel_size=self._world_size, world_size=self._world_size
        )
        self._run = self._recorder.start_phase(spans.training_run)
        self._boundary = time.perf_counter()

    def end_run(self) -> None:
        """Ends the phases still open and the run span; a step still open records no point.
        Closes the tensor observer (its last values stay observable until the next run's)."""
        self._end_phases(self._PHASES)
        self._close_observer(flush_s=_FINAL_FLUSH_S)
        self._reset()

    def fail_run(self, exception: BaseException) -> None:
        """Records ``exception`` on every phase still open and on the run span (status ERROR,
        an ``exception`` event), ends them, and drops the step it interrupted (no
        ``step_duration_ms`` point, its micro-batches in no interval)."""
        self._end_phases(self._PHASES, exception)
        self._close_observer()
        self._reset()

    def _end_phases(self, names: tuple[str, ...], exception: BaseException | None = None) -> None:
        """Ends the phases ``names`` still open, innermost first; with ``exception`` recorded
        on each (status ERROR)."""
        for name in names:
            handle = getattr(self, name)
            if handle is not None:
                setattr(self, name, None)
                if exception is not None:
                    handle.error(exception)
                handle.stop()

    def _resolve_pipeline(self, identity: FrameworkIdentity) -> None:
        meter_provider, tracer_provider = self._meter_provider, self._tracer_provider
        if meter_provider is None or tracer_provider is None:
            telemetry = _pipeline_for(identity)
            self._meter = (
                telemetry.meter
                if meter_provider is None
                else meter_provider.get_meter(configuration.INSTRUMENTATION_NAME)
            )
        else:
            self._meter = meter_provider.get_meter(configuration.INSTRUMENTATION_NAME)
        if meter_provider is None and tracer_provider is None:
            self._recorder = spans.SpanRecorder()
        else:
            self._recorder = spans.SpanRecorder(
                tracer_provider=tracer_provider, meter_provider=meter_provider
            )

    # -- the model ------------------------------------------------------------------------

    def watch_model(self, model: Any) -> None:
        """Builds the ``TensorObserver`` of ``model`` when tensor metrics are scheduled; the
        previous run's observer is closed. Raises nothing; a failure is logged."""
        self._close_observer()
        schedule = self._tensor_metrics
        if schedule is None:
            if config.tensor_metric_schedule() == ():
                return  # OTEL_PYTHON_TRAINING_TENSOR_METRICS=none
        elif schedule.strip().lower() in ("none", "off", ""):
            return
        from otel_training.tensor import TensorObserver

        try:
            self.observer = TensorObserver(model, schedule, meter=self._meter)
        except Exception:
            warn_once("observer", "otel-training: no tensor metrics for this model", exc_info=True)

    def _close_observer(self, flush_s: float = 0.0) -> None:
        """Closes the tensor observer; after a run that ended well, its in-flight results
        (CUDA copies of the last due step) are first published, waiting up to ``flush_s``."""
        observer, self.observer = self.observer, None
        if observer is None:
            return
        if flush_s > 0:
            try:
                observer.flush(flush_s)
            except Exception:
                warn_once("observer_flush", "otel-training: tensor metrics not flushed")
        observer.close()

    # -- steps ----------------------------------------------------------------------------

    @property
    def in_step(self) -> bool:
        """Whether an optimizer step is open (between :meth:`begin_step` and :meth:`end_step`)."""
        return self._step is not None

    def begin_step(self, step: int) -> None:
        """Opens optimizer step ``step`` (1-based, as the framework numbers it) before its first
        forward pass: the iteration span, and the tensor observer's step."""
        if self._run is None or self._step is not None:
            return
        self._step = step
        self._iteration = self._recorder.start_phase(
            spans.training_iteration, iteration=step, parent=self._run
        )
        if self.observer is not None:
            self.observer.begin_step(step)

    def add_micro_batch(self, loss: Any = None, tokens: int | None = None) -> None:
        """Counts one micro-batch of the open step: its loss (a float or 0-d tensor, kept as
        it is) and its tokens on this rank (``None``: not counted)."""
        if self._accumulator is None:
            return
        if tokens is not None:
            self.counts_tokens = True
        if loss is not None:
            # Kept as they are until the interval's mean: one stack and mean per interval
            # rather than per step (StepAccumulator would average every step's losses).
            self._step_losses.append(loss.detach() if hasattr(loss, "detach") else loss)
        self._accumulator.add_micro_batch(None, tokens=tokens or 0)

    def add_tokens_global(self, tokens: int) -> None:
        """Counts ``tokens`` of the open step that the framework counted over all ranks."""
        if self._accumulator is None:
            return
        self.counts_tokens = True
        self._accumulator.add_tokens_global(tokens)

    def begin_optimizer(self) -> None:
        """Before the optimizer update: commits the tensor observer (gradients as they are now)
        and opens the optimizer span."""
        if self._run is None:
            return
        if self.observer is not None:
            self.observer.commit()
        if self._optimizer is None:
            parent = self._iteration or self._run
            self._optimizer = self._recorder.start_phase(
                spans.optimizer_step, iteration=self._step, parent=parent
            )

    def end_optimizer(self) -> None:
        """After the optimizer update: ends the optimizer span."""
        handle, self._optimizer = self._optimizer, None
        if handle is not None:
            handle.stop()

    def end_step(self, *, skipped: bool = False) -> None:
        """Closes the open step: one ``step_duration_ms`` point (since the last boundary), the
        step's tokens and losses into the interval, and the iteration span."""
        if self._run is None:
            return
        now = time.perf_counter()
        self.end_optimizer()
        record = self._accumulator.end_step(now - self._boundary, skipped=skipped)
        self._boundary = now
        self._interval_steps += 1
        if not skipped:
            self._interval_losses.extend(self._step_losses)
        self._step_losses = []
        record_training_metrics(self._meter, step_duration_ms=record.duration_ms)
        handle, self._iteration = self._iteration, None
        if handle is not None:
            handle.stop()
        self._step = None

    def mark_boundary(self) -> None:
        """The next step starts now (at the start of the training loop, after an evaluation or
        a checkpoint save)."""
        self._boundary = time.perf_counter()

    # -- evaluation and checkpoints -------------------------------------------------------

    def begin_evaluation(self, iteration: int | None) -> None:
        """Opens an evaluation span (a child of the run)."""
        if self._run is None or self._evaluation is not None:
            return
        self._evaluation = self._recorder.start_phase(
            spans.evaluation, iteration=iteration, parent=self._run
        )

    def end_evaluation(self) -> None:
        """Ends the evaluation span, and the next step starts now."""
        handle, self._evaluation = self._evaluation, None
        if handle is not None:
            handle.stop()
        self.mark_boundary()

    def begin_checkpoint(
        self, path: str | None, iteration: int | None, strategy: str = "sync"
    ) -> None:
        """Opens a checkpoint-save span (a child of the run)."""
        if self._run is None or self._checkpoint is not None:
            return
        self._checkpoint = self._recorder.start_phase(
            spans.checkpoint_save, path, iteration=iteration, strategy=strategy, parent=self._run
        )

    def end_checkpoint(self) -> None:
        """Ends the checkpoint span, and the next step starts now."""
        handle, self._checkpoint = self._checkpoint, None
        if handle is not None:
            handle.stop()
        self.mark_boundary()

    def fail_checkpoint(self, exception: BaseException) -> None:
        """Ends the checkpoint save (or load) that ``exception`` ended, with status ERROR; it
        does not count as a save (or as the resume point)."""
        self._end_phases(("_checkpoint", "_load"), exception)
        self.mark_boundary()

    @property
    def loading(self) -> bool:
        """Whether a checkpoint load is open (between :meth:`begin_checkpoint_load` and
        :meth:`end_checkpoint_load`)."""
        return self._load is not None

    def begin_checkpoint_load(self, path: str | None) -> None:
        """Opens a checkpoint-load span (a child of the run) before the framework reads it."""
        if self._run is None or self._load is not None:
            return
        self._load = self._recorder.start_phase(spans.checkpoint_load, path, parent=self._run)

    def end_checkpoint_load(self, iteration: int | None) -> None:
        """Ends the checkpoint-load span: ``iteration``, the optimizer steps the checkpoint
        holds (the resume point), goes on the span (``megatron.iteration``) and to the health
        ledger (``dl.training.checkpoint.iteration{operation=load}``)."""
        handle, self._load = self._load, None
        if handle is None:
            return
        if iteration is not None:  # known once read: the span's and the ledger's resume point
            handle.set_attribute(MEGATRON_ITERATION, iteration)
        handle.stop()

    def record_checkpoint_load(self, path: str | None, iteration: int) -> None:
        """Records a checkpoint load that the framework finished before any hook (no time of
        its own): an instant span with the iteration restored, and the resume point."""
        self.begin_checkpoint_load(path)
        self.end_checkpoint_load(iteration)

    # -- the log interval -----------------------------------------------------------------

    def record_interval(
        self,
        *,
        loss: Any = None,
        loss_scale: float = 1.0,
        grad_norm: Any = None,
        learning_rate: Any = None,
        flops_global: float | None = None,
    ) -> None:
        """Records the log interval that ends now and starts the next one.

        Args:
            loss: The framework's interval loss; ``None``: the mean of the micro-batch losses
                handed to :meth:`add_micro_batch` over the interval's non-skipped steps (a 0-d
                tensor when they were tensors), times ``loss_scale``.
            loss_scale: Factor that undoes a framework's division of micro-batch losses (by
                the accumulation steps).
            grad_norm: Global gradient norm before clipping, as the framework computed it.
            learning_rate: The learning rate of the interval's last step.
            flops_global: Model FLOPs of the interval over all devices, as the framework counts
                them; ``flops_per_token`` of the constructor wins.
        """
        if self._accumulator is None:
            return
        stats = self._accumulator.interval()
        self._interval_steps = 0
        losses, self._interval_losses = self._interval_losses, []
        if loss is None and losses:
            loss = mean_loss(losses)
            if loss_scale != 1.0:
                loss = loss * loss_scale
        figures = stats.throughput(
            flops_per_token=self._flops_per_token,
            flops_global=flops_global or None,
            count_tokens=self.counts_tokens,
        )
        record_training_metrics(
            self._meter,
            loss=loss,
            grad_norm=grad_norm,
            learning_rate=learning_rate,
            tokens_per_sec=figures.tokens_per_sec_global,
            throughput_tflops=figures.tflops_per_device,
            skipped_iters=stats.skipped_iters,
            memory_allocated_gb=memory_allocated_gib() if self._on_cuda else None,
        )

    @property
    def steps_in_interval(self) -> int:
        """Optimizer steps ended since the last recorded interval."""
        return self._interval_steps


def _pipeline_for(identity: FrameworkIdentity) -> configuration.Telemetry:
    """The configured pipeline, or one configured now from ``OTEL_*`` with the framework's
    rank identity (so that the Resource, the file names and the export-rank policy use it)."""
    current = configuration.current()
    if current is not None:
        known = current.settings.identity
        if (known.rank, known.world_size) != (identity.rank, identity.world_size):
            warn_once(
                "identity",
                "otel-training was configured before the framework set up its ranks: the "
                "resource says rank %d of %d, the framework rank %d of %d. Let the callback "
                "configure it, or launch with torchrun.",
                known.rank,
                known.world_size,
                identity.rank,
                identity.world_size,
            )
        return current
    return configuration.configure(environ=config.environ_with(identity.environ()))
