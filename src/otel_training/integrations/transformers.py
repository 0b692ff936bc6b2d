"""The Hugging Face ``Trainer``: ``Trainer(..., callbacks=[OtelTrainingCallback()])``.

Needs ``transformers`` (otel-training's extra ``transformers``). What it records and
what it cannot know: ``docs/integrations.md``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from otel_training.integrations._recorder import (
    FrameworkIdentity,
    RunRecorder,
    count_tokens,
    guarded,
    missing_framework,
    validate_options,
    warn_once,
)

try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as _transformers_error:
    TrainerCallback = None
    PREFIX_CHECKPOINT_DIR = "checkpoint"
    _IMPORT_ERROR: ImportError | None = _transformers_error
else:
    _IMPORT_ERROR = None

__all__ = ["OtelTrainingCallback"]

_Base: type = TrainerCallback if TrainerCallback is not None else object

_EVALUATE, _SAVE = "evaluate", "save"


class OtelTrainingCallback(_Base):
    """Records a ``Trainer.train()`` with otel-training: ``callbacks=[OtelTrainingCallback()]``.

    What it records (definitions of the README's metric table):

    - ``megatron.training.step_duration_ms``: one point per optimizer step, all
      ``gradient_accumulation_steps`` micro-batches and their data loading included, from the
      end of the previous step (or of the evaluation or checkpoint save after it, or
      ``on_train_begin``) to ``on_step_end``, in ms;
    - at each logging step (``logging_steps``), from the ``logs`` the Trainer computed:
      ``loss`` (its mean over the interval's micro-batches and all ranks), ``grad_norm``
      (before clipping), ``learning_rate`` (of the step that ran); and from the interval's
      steps: ``tokens_per_sec`` of the job (``state.num_input_tokens_seen`` when
      ``include_num_input_tokens_seen`` is on, else the main input's elements in each training
      forward pass, or ``tokens_per_sample``/``tokens_per_batch``, times the world size),
      ``throughput_tflops`` per device (``flops_per_token``, else the Trainer's own count over
      all ranks, ``state.total_flos``), both as `otel_training.metrics.throughput.throughput`
      defines them; ``memory_allocated_gb`` on CUDA, ``skipped_iters`` (steps whose update
      Accelerate skipped, ``optimizer.step_was_skipped``: AMP overflow);
    - spans: the run (``trainer.train()`` to ``on_train_end``), each iteration
      (``on_step_begin`` to ``on_step_end``, numbered from the restored ``state.global_step``),
      the optimizer update (``on_pre_optimizer_step`` to ``on_optimizer_step``), each
      evaluation and checkpoint save that the Trainer's flow schedules, the checkpoint load of
      ``train(resume_from_checkpoint=...)`` with the restored step, per the span groups of
      ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``. An exception that ends ``train()``, caught by the
      caller or not, ends the run and the phase it interrupted with status ERROR (the
      Trainer's ``train`` is wrapped for it, see :meth:`record_exception`), and that step
      records no point;
    - tensor metrics of the model through ``TensorObserver``, committed in
      ``on_pre_optimizer_step`` (the Trainer has no hook before clipping: gradients are read
      clipped);
    - the rank identity from ``TrainingArguments`` (``process_index``, ``local_process_index``,
      ``world_size``) in the Resource, when the callback configures the pipeline.

    The hooks read no device value: the losses and norms come from the Trainer's own logs,
    token counts from shapes.

    Args:
        meter_provider: Where the metrics go; default: the pipeline that
            :func:`otel_training.configure` builds from ``OTEL_*`` at ``on_train_begin`` (or the
            one already configured).
        tracer_provider: Where the spans go; default: the same pipeline.
        tensor_metrics: A ``TensorObserver`` schedule (``"grad_norm:10,param_norm:10"``, or
            ``"none"``); default: ``OTEL_PYTHON_TRAINING_TENSOR_METRICS``, else the observer's.
        tokens_per_sample: Tokens in one sample; tokens per micro-batch are the batch size of
            the main input times this.
        tokens_per_batch: ``inputs -> int``, the tokens of one micro-batch on this rank, given
            the keyword arguments of the model's training forward pass (``input_ids``,
            ``attention_mask``...). A count from shapes reads no device value.
        flops_per_token: Training FLOPs per token (forward and backward), for
            ``throughput_tflops``.

    Raises:
        ModuleNotFoundError: when ``transformers`` is not installed.
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
        if TrainerCallback is None:
            missing_framework(
                "transformers", "transformers", _IMPORT_ERROR, "transformers accelerate"
            )
        validate_options(tensor_metrics, tokens_per_sample, tokens_per_batch, flops_per_token)
        self._run = RunRecorder(
            meter_provider=meter_provider,
            tracer_provider=tracer_provider,
            tensor_metrics=tensor_metrics,
            flops_per_token=flops_per_token,
        )
        self._tokens_per_sample = tokens_per_sample
        self._tokens_per_batch = tokens_per_batch
        self._hook_handle: Any = None
        self._previous_excepthook: Any = None
        self._excepthook: Any = None
        self._reset()

    def _reset(self) -> None:
        """Forgets everything of a ``train()`` (a failed one included)."""
        self._world_size = 1
        self._framework_tokens = False
        self._tokens_seen = 0
        self._total_flos = 0.0
        self._last_logged_step = 0
        self._planned: list[str] = []
        self._waiting_for_log = False
        self._output_dir: str | None = None
        self._began = False  # on_train_begin ran in this run

    # -- the run --------------------------------------------------------------------------

    @guarded
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Wraps the new Trainer's ``train`` (once per Trainer) so that an exception that
        leaves it, caught by the caller or not, is recorded, and a checkpoint load
        (``resume_from_checkpoint=``) is timed inside the run."""
        _wrap_train(_trainer_of(self))

    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs):
        """Starts the run (unless ``train``'s wrapper did, before the checkpoint load): pipeline
        with the ranks of ``args``, run span, the resume point, tensor observer, token
        counting; the first step starts now."""
        _wrap_train(_trainer_of(self))  # for a callback added after the Trainer was built
        if not self._run.active or self._began:
            self._start(args)
        self._began = True
        resumed = int(state.global_step)
        if self._run.loading:
            self._run.end_checkpoint_load(resumed)
        elif resumed > 0:  # loaded before any hook of ours: the resume point, without a time
            self._run.record_checkpoint_load(None, resumed)
        self._run.watch_model(model)
        self._tokens_seen = int(state.num_input_tokens_seen or 0)
        self._total_flos = float(state.total_flos or 0.0)
        self._last_logged_step = resumed
        self._output_dir = getattr(args, "output_dir", None)
        self._framework_tokens = str(args.include_num_input_tokens_seen) not in ("no", "False")
        self._count_tokens_of(model)
        self._hook_exceptions()
        self._run.mark_boundary()
        if getattr(args, "eval_on_start", False):
            self._run.begin_evaluation(resumed)

    def _start(self, args: Any) -> None:
        self._reset()
        self._world_size = max(1, int(args.world_size))
        identity = FrameworkIdentity(
            rank=int(args.process_index),
            local_rank=max(0, int(args.local_process_index)),
            world_size=self._world_size,
        )
        device = getattr(args, "device", None)
        self._run.start_run(identity, on_cuda=getattr(device, "type", None) == "cuda")

    def _train_called(self, trainer: Any, resume_from_checkpoint: Any) -> None:
        """``trainer.train()`` was called: starts the run now, so that the checkpoint load of
        ``resume_from_checkpoint`` is timed inside it (ended at ``on_train_begin`` with the
        restored ``global_step``)."""
        try:
            self._start(trainer.args)
            if resume_from_checkpoint not in (None, False):
                path = None if resume_from_checkpoint is True else str(resume_from_checkpoint)
                self._run.begin_checkpoint_load(path)
        except Exception:
            warn_once("train_called", "otel-training: could not start the run", exc_info=True)

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs) -> None:
        """Ends the run span and removes the hooks."""
        self._run.end_run()
        self._unhook()
        self._reset()

    def record_exception(self, exception: BaseException) -> None:
        """Records ``exception`` (status ERROR) on the run and on the iteration, evaluation,
        checkpoint save or load it interrupted, and ends them; the interrupted step records no
        point. The Trainer has no hook for an exception: its ``train`` is wrapped for this
        when the callback is given to the Trainer (``callbacks=[...]``), an exception the
        caller catches included; the chained ``sys.excepthook`` records one that ends the
        program. Call it yourself only for a callback added with ``add_callback`` whose first
        ``train()`` failed. Never raises."""
        try:
            self._run.fail_run(exception)
        except Exception:
            warn_once("record_exception", "otel-training: could not record an exception")
        self._unhook()
        self._reset()

    # -- steps ----------------------------------------------------------------------------

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs) -> None:
        """Opens the optimizer step before its first micro-batch, numbered from the restored
        ``state.global_step``."""
        self._run.begin_step(int(state.global_step) + 1)

    @guarded
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs) -> None:
        """After clipping, before the update: tensor observer's commit, optimizer span."""
        self._run.begin_optimizer()

    @guarded
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs) -> None:
        """After the update: ends the optimizer span."""
        self._run.end_optimizer()

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs):
        """Ends the step (``skipped`` when Accelerate skipped the update), and plans the
        evaluation and checkpoint save that the Trainer's flow will run after it."""
        if self._framework_tokens:
            seen = int(state.num_input_tokens_seen or 0)
            self._run.add_tokens_global(seen - self._tokens_seen)
            self._tokens_seen = seen
        skipped = getattr(optimizer, "step_was_skipped", False) is True
        self._run.end_step(skipped=skipped)
        self._plan(control, state)

    @guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs) -> None:
        """Plans the epoch's evaluation and checkpoint save (``*_strategy="epoch"``)."""
        self._plan(control, state)

    @guarded
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs) -> None:
        """At a training log: records the interval from the Trainer's ``logs``."""
        if logs and "loss" in logs and self._run.active:
            flos = float(state.total_flos or 0.0)  # over all ranks (the Trainer gathers it)
            flops, self._total_flos = flos - self._total_flos, flos
            self._run.record_interval(
                loss=logs.get("loss"),
                grad_norm=logs.get("grad_norm"),
                learning_rate=logs.get("learning_rate"),
                flops_global=flops if flops > 0 else None,
            )
            self._last_logged_step = int(state.global_step)
        if self._waiting_for_log:
            self._waiting_for_log = False
            self._begin_planned(state)

    @guarded
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs) -> None:
        """Ends the evaluation span; starts the planned checkpoint save's span."""
        self._run.end_evaluation()
        if self._planned and self._planned[0] == _EVALUATE:
            self._planned.pop(0)
        self._begin_planned(state)

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs) -> None:
        """Ends the checkpoint span (the Trainer calls this after the save)."""
        self._run.end_checkpoint()
        self._planned = []

    # -- evaluation and checkpoints -------------------------------------------------------

    def _plan(self, control: Any, state: Any) -> None:
        """The Trainer runs, after a step or an epoch, the log, then the evaluation, then the
        save that ``control`` asks for, with no hook before each: a phase's span starts when
        the one before it ends."""
        if not self._run.active:
            return
        planned = []
        if control.should_evaluate:
            planned.append(_EVALUATE)
        if control.should_save:
            planned.append(_SAVE)
        self._planned = planned
        logs_now = control.should_log and int(state.global_step) > self._last_logged_step
        self._waiting_for_log = bool(planned) and logs_now
        if not self._waiting_for_log:
            self._begin_planned(state)

    def _begin_planned(self, state: Any) -> None:
        if not self._planned:
            return
        step = int(state.global_step)
        if self._planned[0] == _EVALUATE:
            self._run.begin_evaluation(step)
        else:
            path = None
            if self._output_dir is not None:
                path = os.path.join(self._output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
            self._run.begin_checkpoint(path, step)

    # -- tokens and exceptions ------------------------------------------------------------

    def _count_tokens_of(self, model: Any) -> None:
        """A forward pre-hook on the model counts each training micro-batch's tokens on this
        rank, from shapes (no device read), unless the Trainer counts them itself."""
        self._remove_token_hook()
        if self._framework_tokens or model is None:
            return
        main_input = getattr(model, "main_input_name", "input_ids")
        run = self._run
        per_sample, per_batch = self._tokens_per_sample, self._tokens_per_batch

        def count(module: Any, args: Any, kwargs: Any) -> None:
            if not run.in_step or not module.training:
                return
            try:
                inputs = kwargs if kwargs else (args[0] if args else None)
                if per_sample is None and per_batch is None:
                    tensor = inputs.get(main_input) if isinstance(inputs, dict) else inputs
                    tokens = int(tensor.numel()) if hasattr(tensor, "numel") else None
                else:
                    tokens = count_tokens(inputs, per_sample, per_batch)
                if tokens is not None:
                    run.add_micro_batch(tokens=tokens)
            except Exception:
                warn_once("count_tokens", "otel-training: could not count tokens", exc_info=True)

        self._hook_handle = model.register_forward_pre_hook(count, with_kwargs=True)

    def _remove_token_hook(self) -> None:
        handle, self._hook_handle = self._hook_handle, None
        if handle is not None:
            handle.remove()

    def _hook_exceptions(self) -> None:
        """Chains ``sys.excepthook`` for the run: the Trainer has no callback for an exception,
        so one that ends the program is recorded on the run span before it is printed."""
        if self._previous_excepthook is not None:
            return
        previous = sys.excepthook

        def excepthook(kind: Any, value: Any, traceback: Any) -> None:
            # The program's hook always runs; once unhooked (or left inside a hook that the
            # program chained on top of ours) this one only passes the exception on.
            try:
                if self._excepthook is excepthook and isinstance(value, BaseException):
                    self.record_exception(value)
            except Exception:
                pass
            previous(kind, value, traceback)

        if threading.current_thread() is threading.main_thread():
            self._previous_excepthook = previous
            self._excepthook = excepthook
            sys.excepthook = excepthook

    def _unhook(self) -> None:
        self._remove_token_hook()
        previous, self._previous_excepthook = self._previous_excepthook, None
        if previous is not None and sys.excepthook is self._excepthook:
            sys.excepthook = previous
        self._excepthook = None


def _trainer_of(callback: Any) -> Any:
    """The ``Trainer`` whose hooks are running ``callback`` now: the caller frames' ``self``
    whose ``callback_handler`` holds ``callback`` (the Trainer hands its callbacks no reference
    to itself). ``None`` when not found."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            break
        candidate = frame.f_locals.get("self")
        handler = getattr(candidate, "callback_handler", None)
        if handler is not None and any(c is callback for c in getattr(handler, "callbacks", ())):
            return candidate
        frame = frame.f_back
    return None


_WRAPPED = "_otel_training_train"


def _wrap_train(trainer: Any) -> None:
    """Gives ``trainer`` (once) a ``train`` of its own that tells each OtelTrainingCallback in
    its ``callback_handler`` when training starts and which exception ended it. The wrapper
    lives on the Trainer instance; a callback no longer in the handler is not told."""
    if trainer is None or _WRAPPED in vars(trainer):
        return
    original = trainer.train

    def train(*args: Any, **kwargs: Any) -> Any:
        ours = [
            c for c in trainer.callback_handler.callbacks if isinstance(c, OtelTrainingCallback)
        ]
        resume = kwargs.get("resume_from_checkpoint", args[0] if args else None)
        for callback in ours:
            callback._train_called(trainer, resume)
        try:
            return original(*args, **kwargs)
        except BaseException as error:
            for callback in ours:
                callback.record_exception(error)
            raise

    setattr(trainer, _WRAPPED, original)
    trainer.train = functools.wraps(original)(train)
