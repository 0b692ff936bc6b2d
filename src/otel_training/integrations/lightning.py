"""PyTorch Lightning: ``Trainer(callbacks=[OtelTrainingCallback()])``.

Needs ``lightning`` (otel-training's extra ``lightning``); with only the older
``pytorch_lightning`` package installed, the callback is a ``pytorch_lightning.Callback``
instead. What it records and what it cannot know: ``docs/integrations.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from otel_training import spans
from otel_training.integrations._recorder import (
    FrameworkIdentity,
    RunRecorder,
    count_tokens,
    guarded,
    missing_framework,
    validate_options,
    warn_once,
)
from otel_training.metrics.throughput import global_count

try:
    from lightning.pytorch import Callback
except ImportError as _lightning_error:
    try:
        from pytorch_lightning import Callback
    except ImportError:
        Callback = None
        _IMPORT_ERROR: ImportError | None = _lightning_error
    else:
        _IMPORT_ERROR = None
else:
    _IMPORT_ERROR = None

__all__ = ["OtelTrainingCallback"]

_Base: type = Callback if Callback is not None else object


class OtelTrainingCallback(_Base):
    """Records a Lightning ``fit``: ``Trainer(callbacks=[OtelTrainingCallback()])``.

    What it records (definitions of the README's metric table):

    - ``megatron.training.step_duration_ms``: one point per optimizer step, all micro-batches of
      ``accumulate_grad_batches`` included, from the end of the previous step (or of the
      validation or checkpoint save after it, or ``on_train_start``) to the end of this step's
      update, in ms;
    - every ``log_every_n_steps`` optimizer steps, and for the steps left at the end of ``fit``:
      ``loss``, the mean of the ``training_step`` losses of the interval's micro-batches on this
      rank (Lightning's division by ``accumulate_grad_batches`` undone); ``grad_norm``, the
      total norm that Lightning's clipping computed (only with ``gradient_clip_val`` and the
      ``norm`` algorithm); ``learning_rate`` of the first parameter group in the last step;
      ``tokens_per_sec`` of the job (this rank's count, with ``tokens_per_sample`` or
      ``tokens_per_batch``, times the world size); ``throughput_tflops`` per device
      (``flops_per_token``, else the module's ``flops_per_batch`` attribute, per device as
      Lightning's ``ThroughputMonitor`` has it), both as
      `otel_training.metrics.throughput.throughput` defines them;
      ``memory_allocated_gb`` on CUDA; ``skipped_iters``, steps whose update did not run (AMP
      overflow: the gradient scaler skipped ``optimizer.step()``);
    - spans: the run (``setup`` of ``fit`` to its end), each iteration numbered from the
      trainer's restored ``global_step``, the optimizer update (from
      ``on_before_optimizer_step``, clipping included), each checkpoint save
      (``trainer.save_checkpoint``) and load (``fit(ckpt_path=...)``, with the restored
      ``global_step``), each validation loop (not the sanity check), per the span groups of
      ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``. An exception that ends ``fit``, caught by the caller
      or not, ends the run and the phase it interrupted with status ERROR, and that step
      records no point;
    - tensor metrics of the ``LightningModule`` through ``TensorObserver``, committed in
      ``on_before_optimizer_step`` (gradients before clipping);
    - the rank identity from the trainer (``global_rank``, ``local_rank``, ``world_size``,
      ``node_rank``) in the Resource, when the callback configures the pipeline.

    Values stay tensors until read off the training thread (``record_training_metrics``'
    deferred path); hooks read no device value.

    Args:
        meter_provider: Where the metrics go; default: the pipeline that
            :func:`otel_training.configure` builds from ``OTEL_*`` at ``fit`` start (or the one
            already configured).
        tracer_provider: Where the spans go; default: the same pipeline.
        tensor_metrics: A ``TensorObserver`` schedule (``"grad_norm:10,param_norm:10"``, or
            ``"none"``); default: ``OTEL_PYTHON_TRAINING_TENSOR_METRICS``, else the observer's.
        tokens_per_sample: Tokens in one sample; tokens per micro-batch are the batch's leading
            dimension times this.
        tokens_per_batch: ``batch -> int``, the tokens of one micro-batch on this rank, called
            in ``on_train_batch_start`` (a count from shapes reads no device value).
        flops_per_token: Training FLOPs per token (forward and backward), for
            ``throughput_tflops``.

    Raises:
        ModuleNotFoundError: when neither ``lightning`` nor ``pytorch_lightning`` is installed.
        ValueError: on a malformed ``tensor_metrics`` schedule, both token arguments, or a
            count that is not positive. The hooks never raise: a failure is logged once and
            that record is skipped.
    """

    def __init__(
        self,
        *,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        tensor_metrics: str | None = None,
        tokens_per_sample: int | None = None,
        tokens_per_batch: Callable[[Any], int] | None = None,
        flops_per_token: float | None = None,
    ) -> None:
        if Callback is None:
            missing_framework("lightning", "lightning", _IMPORT_ERROR)
        super().__init__()
        validate_options(tensor_metrics, tokens_per_sample, tokens_per_batch, flops_per_token)
        self._run = RunRecorder(
            meter_provider=meter_provider,
            tracer_provider=tracer_provider,
            tensor_metrics=tensor_metrics,
            flops_per_token=flops_per_token,
        )
        self._tokens_per_sample = tokens_per_sample
        self._tokens_per_batch = tokens_per_batch
        self._restore: list[Callable[[], None]] = []
        self._reset()

    def _reset(self) -> None:
        """Forgets everything of a fit (a failed one included)."""
        self._batch_tokens: int | None = None
        self._interval_flops = 0.0
        self._world_size = 1
        self._has_flops = False
        self._step_from: int | None = None
        self._updated = False
        self._grad_norm: Any = None
        self._learning_rate: Any = None

    # -- fit ------------------------------------------------------------------------------

    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Starts the run of a ``fit`` before Lightning restores a checkpoint (``ckpt_path=``):
        pipeline with the trainer's rank identity, run span, and the taps on checkpoint loads
        and saves."""
        if stage == "fit":
            self._start(trainer)

    @guarded
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """The tensor observer, and the taps on clipping and optimizer updates (the optimizers
        exist now)."""
        if not self._run.active:
            self._start(trainer)
        self._run.watch_model(pl_module)
        # Looked up once, as Lightning's ThroughputMonitor does: a missing attribute of an
        # nn.Module costs an exception on every lookup.
        self._has_flops = hasattr(pl_module, "flops_per_batch")
        self._tap_gradient_clipping(trainer)
        self._tap_optimizer_updates(trainer)

    def _start(self, trainer: Any) -> None:
        self._untap()
        self._reset()
        identity = FrameworkIdentity(
            rank=int(trainer.global_rank),
            local_rank=int(trainer.local_rank),
            world_size=int(trainer.world_size),
            node_rank=int(trainer.node_rank),
            local_world_size=int(getattr(trainer, "num_devices", 0)) or None,
        )
        device = getattr(trainer.strategy, "root_device", None)
        self._run.start_run(identity, on_cuda=getattr(device, "type", None) == "cuda")
        self._world_size = identity.world_size
        self._tap_checkpoint_loads(trainer)
        self._tap_checkpoint_saves(trainer)

    @guarded
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """The training loop starts: the first step starts now (after the checkpoint load and
        the sanity check)."""
        self._run.mark_boundary()

    @guarded
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Records the steps left since the last interval and ends the run."""
        if self._run.steps_in_interval:
            self._record_interval(trainer)
        self._finish()

    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Records ``exception`` (status ERROR) on the run and on the iteration, evaluation or
        checkpoint it interrupted, and ends them; the interrupted step records no point.
        Lightning calls this for every exception that leaves ``fit``, one the caller catches
        and ``KeyboardInterrupt`` included."""
        self._run.fail_run(exception)
        self._untap()
        self._reset()

    @guarded
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Ends the run and removes the taps if the fit ended without ``on_fit_end``."""
        if stage == "fit":
            self._finish()

    def _finish(self) -> None:
        self._run.end_run()
        self._untap()
        self._reset()

    # -- steps ----------------------------------------------------------------------------

    @guarded
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Opens the optimizer step at its first micro-batch (numbered from the trainer's
        restored ``global_step``) and counts the batch's tokens."""
        if not self._run.active:
            return
        if not self._run.in_step:
            self._step_from = int(trainer.global_step)
            self._run.begin_step(self._step_from + 1)
            self._updated = False
        self._batch_tokens = count_tokens(batch, self._tokens_per_sample, self._tokens_per_batch)
        if self._has_flops:
            flops = getattr(pl_module, "flops_per_batch", None)
            if isinstance(flops, (int, float)) and not isinstance(flops, bool) and flops > 0:
                self._interval_flops += float(flops)

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Before clipping and the update: the learning rate the update uses, the tensor
        observer's commit, the optimizer span."""
        groups = getattr(optimizer, "param_groups", None)
        if groups:
            self._learning_rate = groups[0].get("lr")
        self._run.begin_optimizer()

    @guarded
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Counts the micro-batch; after the last one of a step (the trainer's ``global_step``
        moved since the step began), ends the step and, at the logging interval, records the
        interval."""
        if not self._run.active or not self._run.in_step:
            return
        self._run.add_micro_batch(_loss_of(outputs), self._batch_tokens)
        self._batch_tokens = None
        global_step = int(trainer.global_step)
        if global_step == self._step_from:
            return  # accumulating
        self._run.end_step(skipped=not self._updated)
        every = int(getattr(trainer, "log_every_n_steps", 0) or 0)
        if every and global_step % every == 0:
            self._record_interval(trainer)

    def _record_interval(self, trainer: Any) -> None:
        automatic = getattr(trainer.lightning_module, "automatic_optimization", True)
        scale = float(trainer.accumulate_grad_batches) if automatic else 1.0
        flops = self._interval_flops or None
        self._run.record_interval(
            loss_scale=scale,
            grad_norm=self._grad_norm,
            learning_rate=self._learning_rate,
            flops_global=None if flops is None else global_count(flops, self._world_size),
        )
        self._grad_norm = None
        self._interval_flops = 0.0

    # -- validation -----------------------------------------------------------------------

    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Opens the validation loop's evaluation span (not for the sanity check before fit)."""
        if not getattr(trainer, "sanity_checking", False):
            self._run.begin_evaluation(int(trainer.global_step))

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Ends the evaluation span; the next step starts now."""
        if not getattr(trainer, "sanity_checking", False):
            self._run.end_evaluation()

    # -- taps -----------------------------------------------------------------------------

    def _tap_checkpoint_loads(self, trainer: Any) -> None:
        """Wraps ``trainer.strategy.load_checkpoint`` (what ``fit(ckpt_path=...)`` reads the
        checkpoint with) in a checkpoint-load span that holds the restored ``global_step``."""
        strategy = trainer.strategy
        original = strategy.load_checkpoint
        run = self._run

        def load_checkpoint(checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                path = os.fspath(checkpoint_path)
            except TypeError:
                path = None
            run.begin_checkpoint_load(path)
            try:
                checkpoint = original(checkpoint_path, *args, **kwargs)
            except BaseException as error:
                run.fail_checkpoint(error)
                raise
            step = checkpoint.get("global_step") if isinstance(checkpoint, Mapping) else None
            run.end_checkpoint_load(step if isinstance(step, int) else None)
            return checkpoint

        self._replace(strategy, "load_checkpoint", load_checkpoint)

    def _tap_checkpoint_saves(self, trainer: Any) -> None:
        """Wraps ``trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls) in a checkpoint
        span; Lightning has no callback hook after a save. A save that raises ends its span
        with status ERROR."""
        original = trainer.save_checkpoint
        run = self._run
        io_name = type(getattr(trainer.strategy, "checkpoint_io", None)).__name__.lower()
        strategy = "async" if "async" in io_name else "sync"

        def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            run.begin_checkpoint(os.fspath(filepath), int(trainer.global_step), strategy)
            try:
                result = original(filepath, *args, **kwargs)
            except BaseException as error:
                run.fail_checkpoint(error)
                raise
            run.end_checkpoint()
            return result

        self._replace(trainer, "save_checkpoint", save_checkpoint)
        if strategy == "async":
            self._tap_async_writes(getattr(trainer.strategy, "checkpoint_io", None))

    def _tap_async_writes(self, wrapper: Any) -> None:
        """``AsyncCheckpointIO`` writes on a thread of its own, through the plugin it wraps:
        that plugin's ``save_checkpoint`` returning (or raising) is when the save becomes good
        (or is dropped): :func:`otel_training.checkpoint_save_completed`, for the step in the
        checkpoint it writes."""
        inner = getattr(wrapper, "checkpoint_io", None)
        original = getattr(inner, "save_checkpoint", None)
        if original is None:
            return

        def save_checkpoint(checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
            step = checkpoint.get("global_step") if isinstance(checkpoint, Mapping) else None
            step = step if isinstance(step, int) else None
            try:
                result = original(checkpoint, *args, **kwargs)
            except BaseException:
                spans.checkpoint_save_completed(step, succeeded=False)
                raise
            spans.checkpoint_save_completed(step)
            return result

        self._replace(inner, "save_checkpoint", save_checkpoint)

    def _replace(self, owner: Any, name: str, replacement: Callable) -> None:
        """Sets ``replacement`` as ``owner``'s own attribute ``name``, until :meth:`_untap`
        (which removes it only if it is still ours)."""
        setattr(owner, name, replacement)

        def restore() -> None:
            if owner.__dict__.get(name) is replacement:
                delattr(owner, name)

        self._restore.append(restore)

    def _tap_gradient_clipping(self, trainer: Any) -> None:
        """Keeps the total norm that Lightning's clipping by norm computes and drops.

        Replaces the precision plugin's ``clip_grad_by_norm`` only where it is Lightning's own
        (``torch.nn.utils.clip_grad_norm_`` over the optimizer's parameters): the same call,
        with its return value kept. Plugins that clip otherwise (FSDP, DeepSpeed) are left
        alone, and ``grad_norm`` is then not recorded.
        """
        plugin = getattr(trainer, "precision_plugin", None)
        method = getattr(type(plugin), "clip_grad_by_norm", None)
        if method is None or method.__qualname__ != "Precision.clip_grad_by_norm":
            return
        import torch

        def clip_grad_by_norm(optimizer: Any, clip_val: float) -> None:
            parameters = plugin.main_params(optimizer)
            self._grad_norm = torch.nn.utils.clip_grad_norm_(parameters, clip_val)

        self._replace(plugin, "clip_grad_by_norm", clip_grad_by_norm)

    def _tap_optimizer_updates(self, trainer: Any) -> None:
        """A step post-hook on each optimizer: the update ran (a gradient scaler that finds
        inf/NaN skips ``optimizer.step()``, and then the hook does not run)."""
        for optimizer in getattr(trainer, "optimizers", ()) or ():
            register = getattr(optimizer, "register_step_post_hook", None)
            if register is None:
                warn_once("post_hook", "otel-training: cannot see skipped optimizer steps")
                continue
            handle = register(self._after_update)
            self._restore.append(handle.remove)

    @guarded
    def _after_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._updated = True
        self._run.end_optimizer()

    def _untap(self) -> None:
        restore, self._restore = self._restore, []
        for undo in reversed(restore):
            try:
                undo()
            except Exception:
                warn_once("untap", "otel-training: could not remove a tap", exc_info=True)


def _loss_of(outputs: Any) -> Any:
    """The loss in ``training_step``'s outputs as ``on_train_batch_end`` gets them (a tensor,
    or the ``"loss"`` of a mapping), or ``None``."""
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    if outputs is None or getattr(outputs, "numel", None) is None:
        return None
    return outputs if outputs.numel() == 1 else None
