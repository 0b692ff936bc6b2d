"""Spans for the phases of training, named as Megatron-LM names them: context managers that
also work as decorators.

Usage::

    import otel_training as ot

    with ot.training_run():
        with ot.startup():
            with ot.model_init():
                model, optimizer = build()
        for step in range(1, steps + 1):
            with ot.training_iteration(iteration=step, record_step_duration=True) as it:
                with ot.forward_backward(iteration=step, num_microbatches=8):
                    loss = train_step(batch)
                with ot.optimizer_step(iteration=step) as opt:
                    ok = optimizer.step()
                    opt.set_attribute(MEGATRON_UPDATE_SUCCESSFUL, ok)
                it.record_metrics(loss=loss.detach())    # a span attribute and a metric
            if step % 1000 == 0:
                with ot.checkpoint_save(path, iteration=step) as save:
                    torch.save(state, path)
                    save.set_attribute(MEGATRON_CHECKPOINT_SIZE, os.path.getsize(path))

Every phase is an OpenTelemetry span of the tracer that :func:`otel_training.configure` built
(the first phase configures from the environment if nothing was), named as Megatron-LM's code
names it (``megatron.train``, ``megatron.train.iteration``, ``megatron.checkpoint.save``...:
:mod:`otel_training.semconv.spans`, with Megatron-LM's span attributes), and made the current
span inside its ``with`` block, so nested phases are its children. ``configure()`` mirrors
spans as NVTX ranges and JSON lines.

**Span groups** control the overhead (``OTEL_PYTHON_TRAINING_SPAN_GROUPS``, Megatron-LM's
groups and presets): ``default`` records the run, startup, checkpoint saves, evaluations and
the first iteration; ``per_step`` adds iterations, forward-backward, optimizer, model building,
checkpoint loads, communication and data loading; ``all`` adds micro-batches, layers and
activation offload. A phase of a disabled group costs a set lookup and returns a shared no-op
object, or a small one that feeds the health ledger. A group listed in
``OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS`` is mirrored to NVTX only: an NVTX range, no span. The
groups change what is exported, never how a call behaves: what it returns, raises (nothing),
warns and gives the health ledger (:mod:`otel_training.phases`).

**Traces across ranks.** Every rank's run span is in the run trace; per segment of N
iterations, every rank's segment span, checkpoint saves and evaluations are in the segment's
job trace, and each rank's iterations in step traces of its own, linked to it. Their ids are
derived from the run id without any communication, and no trace holds more than
``OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET`` spans at any world size
(:mod:`otel_training.trace.segments`, :mod:`otel_training.trace.shape`).

**The first iteration.** The first :func:`training_iteration` of a process, and the first
after each :func:`training_run` starts, is wrapped in a ``megatron.train.first_iteration`` span
(group ``first_iteration``, on by default), as in Megatron-LM: its one-off costs (compilation,
CUDA graph capture) stand apart.

An exception that leaves a phase is recorded on its span (status ERROR, an ``exception`` event
with type, message and stack trace, and ``error.type``) and re-raised unchanged. ``SystemExit(0)``
and ``GeneratorExit`` are not errors; still, a phase that any exception left, or that was open
when its pipeline shut down, did not complete: no step duration, no completed step or
checkpoint in the health ledger.

Attribute values: see :mod:`otel_training.trace.span_values` (a CUDA tensor is read by a background
thread, never on the training thread). As a decorator (``@checkpoint_save(strategy="async")``),
each call is a phase; decorated before ``configure()``, the group is checked at each call;
decorated after, the function keeps what its group did then (left undecorated when the group
was off and there was nothing to count).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from otel_training.config import CUSTOM_SPAN_GROUP, SPAN_GROUPS, span_groups_from_names
from otel_training.health.ledger import LEDGER
from otel_training.phases import (
    NOOP_PHASE,
    RUN,
    Phase,
    bind,
    enabled_groups,
    fine,
    first_iteration_due,
    make,
    reset_first_iteration,
    state_for,
    unbind,
)
from otel_training.phases import warn_once as _warn_once
from otel_training.semconv.attributes import (
    IS_GOODPUT_SPAN,
    MEGATRON_CHECKPOINT_PATH,
    MEGATRON_CHECKPOINT_STRATEGY,
    MEGATRON_CHECKPOINT_TYPE,
    MEGATRON_EVAL_ITERATION,
    MEGATRON_ITERATION,
    MEGATRON_LAYER_NUMBER,
    NUM_MICROBATCHES,
)
from otel_training.semconv.spans import (
    MEGATRON_ACTIVATION_OFFLOAD,
    MEGATRON_ACTIVATION_RELOAD,
    MEGATRON_CHECKPOINT_LOAD,
    MEGATRON_CHECKPOINT_LOAD_IO_READ,
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_CHECKPOINT_SAVE_FINALIZE,
    MEGATRON_CHECKPOINT_SAVE_IO_WRITE,
    MEGATRON_CHECKPOINT_SAVE_STATE_DICT,
    MEGATRON_EVALUATE,
    MEGATRON_EVALUATE_STEP,
    MEGATRON_GRAD_SYNC_FINISH,
    MEGATRON_GRAD_SYNC_START,
    MEGATRON_LAYER_FORWARD,
    MEGATRON_LAYER_MLP,
    MEGATRON_LAYER_SELF_ATTENTION,
    MEGATRON_MICROBATCH_BACKWARD,
    MEGATRON_MICROBATCH_FORWARD,
    MEGATRON_P2P_RECV_BACKWARD,
    MEGATRON_P2P_RECV_FORWARD,
    MEGATRON_P2P_SEND_BACKWARD,
    MEGATRON_P2P_SEND_FORWARD,
    MEGATRON_STARTUP,
    MEGATRON_STARTUP_DATALOADER,
    MEGATRON_STARTUP_MODEL_INIT,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_FIRST_ITERATION,
    MEGATRON_TRAIN_ITERATION,
    MEGATRON_TRAIN_ITERATION_DATA_LOADING,
    MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
    MEGATRON_TRAIN_ITERATION_OPTIMIZER,
    SPANS,
)

__all__ = [
    "NOOP_PHASE",
    "Phase",
    "SpanRecorder",
    "activation_offload",
    "checkpoint_load",
    "checkpoint_load_stage",
    "checkpoint_save",
    "checkpoint_save_completed",
    "checkpoint_save_stage",
    "data_loading",
    "dataloader_init",
    "enabled_groups",
    "evaluation",
    "evaluation_step",
    "first_iteration",
    "forward_backward",
    "grad_sync",
    "layer",
    "microbatch",
    "model_init",
    "optimizer_step",
    "p2p",
    "phase",
    "startup",
    "training_iteration",
    "training_run",
]


def _with(attributes: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if value is not None:
        attributes[key] = value
    return attributes


# -- the run and its startup (groups job, model_init, data_loading) -------------------------


def training_run(**attributes: Any) -> Phase:
    """The whole training run of this rank: span ``megatron.train`` (group ``job``).

    Its span starts in the run trace, shared by every rank (by a shard of ranks in a large
    world); the segments linked to it end with it. An exception that leaves the run is
    recorded on the span (status ERROR, an ``exception`` event with the stack trace,
    ``error.type``) before it propagates.
    """
    attributes[IS_GOODPUT_SPAN] = True
    return make(MEGATRON_TRAIN, "job", attributes, role=RUN)


def startup(**attributes: Any) -> Phase:
    """Setting up before the first iteration: span ``megatron.startup`` (group ``job``)."""
    attributes[IS_GOODPUT_SPAN] = True
    return make(MEGATRON_STARTUP, "job", attributes)


def model_init(**attributes: Any) -> Phase:
    """Building the model and optimizer: span ``megatron.startup.model_init`` (group
    ``model_init``, on in ``per_step``)."""
    attributes[IS_GOODPUT_SPAN] = True
    return make(MEGATRON_STARTUP_MODEL_INIT, "model_init", attributes)


def dataloader_init(**attributes: Any) -> Phase:
    """Building the data loaders: span ``megatron.startup.dataloader`` (group
    ``data_loading``, on in ``per_step``)."""
    attributes[IS_GOODPUT_SPAN] = True
    return make(MEGATRON_STARTUP_DATALOADER, "data_loading", attributes)


# -- iterations (groups first_iteration, step, forward_backward, optimizer, data_loading) ---


def training_iteration(
    iteration: int | None = None, *, record_step_duration: bool = False, **attributes: Any
) -> Phase:
    """One training iteration (optimizer step): span ``megatron.train.iteration`` (group
    ``step``, on in ``per_step``), in this rank's step trace of its segment.

    The first one of the process is wrapped in ``megatron.train.first_iteration`` (group
    ``first_iteration``, on by default), as Megatron-LM does. Set ``megatron.skipped`` on it
    (``it.set_attribute(MEGATRON_SKIPPED, True)``) when the update was skipped.

    Args:
        iteration: The iteration number (attribute ``megatron.iteration``), from 1.
        record_step_duration: Also record the phase's wall time, in milliseconds, as one point
            of ``megatron.training.step_duration_ms`` on the configured meter (one point per
            optimizer step that completed: none for one that raised or was interrupted by a
            shutdown), whether or not the iteration span is recorded.
        **attributes: More span attributes.
    """
    _with(attributes, MEGATRON_ITERATION, iteration)
    attributes[IS_GOODPUT_SPAN] = True
    outer = None
    if first_iteration_due():
        # Not a phase of the health ledger here: the iteration inside is (its first is warmup).
        outer = make(
            MEGATRON_TRAIN_FIRST_ITERATION,
            "first_iteration",
            _with({IS_GOODPUT_SPAN: True}, MEGATRON_ITERATION, iteration),
            iteration=iteration,
            ledger=False,
        )
        if outer is NOOP_PHASE:
            outer = None
    return make(
        MEGATRON_TRAIN_ITERATION,
        "step",
        attributes,
        record_step_duration,
        iteration=iteration,
        outer=outer,
    )


def first_iteration(iteration: int | None = None, **attributes: Any) -> Phase:
    """The first iteration this process runs: span ``megatron.train.first_iteration`` (group
    ``first_iteration``, on by default). :func:`training_iteration` opens it by itself around
    the first iteration; call it only around an iteration you do not wrap in that."""
    _with(attributes, MEGATRON_ITERATION, iteration)
    attributes[IS_GOODPUT_SPAN] = True
    return make(MEGATRON_TRAIN_FIRST_ITERATION, "first_iteration", attributes, iteration=iteration)


def forward_backward(
    iteration: int | None = None, *, num_microbatches: int | None = None, **attributes: Any
) -> Phase:
    """The forward and backward passes of all micro-batches: span
    ``megatron.train.iteration.forward_backward`` (group ``forward_backward``, on in
    ``per_step``), with ``num_microbatches``."""
    _with(attributes, MEGATRON_ITERATION, iteration)
    _with(attributes, NUM_MICROBATCHES, num_microbatches)
    return make(
        MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
        "forward_backward",
        attributes or None,
        iteration=iteration,
    )


def optimizer_step(iteration: int | None = None, **attributes: Any) -> Phase:
    """The optimizer update: span ``megatron.train.iteration.optimizer`` (group
    ``optimizer``, on in ``per_step``). Set ``megatron.update_successful`` on it."""
    _with(attributes, MEGATRON_ITERATION, iteration)
    return make(
        MEGATRON_TRAIN_ITERATION_OPTIMIZER, "optimizer", attributes or None, iteration=iteration
    )


def data_loading(iteration: int | None = None, **attributes: Any) -> Phase:
    """Fetching the next batch: span ``megatron.train.iteration.data_loading`` (group
    ``data_loading``, on in ``per_step``)."""
    _with(attributes, MEGATRON_ITERATION, iteration)
    return make(
        MEGATRON_TRAIN_ITERATION_DATA_LOADING,
        "data_loading",
        attributes or None,
        iteration=iteration,
    )


# -- fine-grained phases (groups microbatch, layer, communication, activation_offload) ------

_MICROBATCH = {"forward": MEGATRON_MICROBATCH_FORWARD, "backward": MEGATRON_MICROBATCH_BACKWARD}
_LAYER = {
    "forward": MEGATRON_LAYER_FORWARD,
    "self_attention": MEGATRON_LAYER_SELF_ATTENTION,
    "mlp": MEGATRON_LAYER_MLP,
}
_P2P = {
    "send_forward": MEGATRON_P2P_SEND_FORWARD,
    "recv_forward": MEGATRON_P2P_RECV_FORWARD,
    "send_backward": MEGATRON_P2P_SEND_BACKWARD,
    "recv_backward": MEGATRON_P2P_RECV_BACKWARD,
}
_GRAD_SYNC = {"start": MEGATRON_GRAD_SYNC_START, "finish": MEGATRON_GRAD_SYNC_FINISH}
_OFFLOAD = {"offload": MEGATRON_ACTIVATION_OFFLOAD, "reload": MEGATRON_ACTIVATION_RELOAD}


def _named(table: Mapping[str, str], which: str, what: str) -> str | None:
    name = table.get(which)
    if name is None:
        _unknown(table, which, what)
    return name


def _unknown(table: Mapping[str, str], which: str, what: str) -> Phase:
    """The phase of an unknown ``which``: nothing, said once."""
    _warn_once(f"{what}:{which}", "no %s phase %r (known: %s)", what, which, ", ".join(table))
    return NOOP_PHASE


def microbatch(direction: Literal["forward", "backward"] = "forward", **attributes: Any) -> Phase:
    """One micro-batch's forward or backward pass: span ``megatron.microbatch.forward`` or
    ``.backward`` (group ``microbatch``, on in ``all``; NVTX-only with
    ``OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS=fine``). An unknown direction is logged once and
    records nothing."""
    name = _MICROBATCH.get(direction)
    if name is None:
        return _unknown(_MICROBATCH, direction, "microbatch")
    return fine(name, "microbatch", attributes)


def layer(
    part: Literal["forward", "self_attention", "mlp"] = "forward",
    layer_number: int | None = None,
    **attributes: Any,
) -> Phase:
    """A transformer layer's forward pass or one of its blocks: span ``megatron.layer.forward``,
    ``.self_attention`` or ``.mlp`` (group ``layer``, on in ``all``), with
    ``megatron.layer_number`` (from 1, as Megatron-LM counts)."""
    name = _LAYER.get(part)
    if name is None:
        return _unknown(_LAYER, part, "layer")
    return fine(name, "layer", attributes, MEGATRON_LAYER_NUMBER, layer_number)


def p2p(
    op: Literal["send_forward", "recv_forward", "send_backward", "recv_backward"],
    **attributes: Any,
) -> Phase:
    """A pipeline-parallel point-to-point transfer: span ``megatron.p2p.{op}`` (group
    ``communication``, on in ``per_step``)."""
    name = _P2P.get(op)
    if name is None:
        return _unknown(_P2P, op, "p2p")
    return fine(name, "communication", attributes)


def grad_sync(stage: Literal["start", "finish"], **attributes: Any) -> Phase:
    """Starting, or waiting for, the data-parallel gradient reduction: span
    ``megatron.grad_sync.start`` or ``.finish`` (group ``communication``)."""
    name = _GRAD_SYNC.get(stage)
    if name is None:
        return _unknown(_GRAD_SYNC, stage, "grad_sync")
    return fine(name, "communication", attributes)


def activation_offload(direction: Literal["offload", "reload"], **attributes: Any) -> Phase:
    """Moving activations to host memory and back: span ``megatron.activation.offload`` or
    ``.reload`` (group ``activation_offload``, on in ``all``)."""
    name = _OFFLOAD.get(direction)
    if name is None:
        return _unknown(_OFFLOAD, direction, "activation_offload")
    return fine(name, "activation_offload", attributes)


# -- checkpoints (groups checkpoint, load_checkpoint) ---------------------------------------


def checkpoint_save(
    path: str | os.PathLike[str] | None = None,
    *,
    checkpoint_type: str = "global",
    strategy: str = "sync",
    iteration: int | None = None,
    **attributes: Any,
) -> Phase:
    """Saving a checkpoint: span ``megatron.checkpoint.save`` (group ``checkpoint``), in the
    job trace of ``iteration``'s segment.

    Args:
        path: The checkpoint's file or directory (``megatron.checkpoint.path``).
        checkpoint_type: ``global`` (shared storage) or ``local`` (``megatron.checkpoint.type``).
        strategy: ``sync`` or ``async`` (``megatron.checkpoint.strategy``); for ``async`` wrap
            only the time the training loop is blocked, and call
            :func:`checkpoint_save_completed` when the background write ends: until then the
            save is not a good checkpoint (``docs/health.md``).
        iteration: The iteration saved (``megatron.iteration``).
        **attributes: More span attributes. Set the bytes written with
            ``phase.set_attribute(MEGATRON_CHECKPOINT_SIZE, n)`` once known.
    """
    return make(
        MEGATRON_CHECKPOINT_SAVE,
        "checkpoint",
        _checkpoint_attributes(path, checkpoint_type, strategy, iteration, attributes),
        iteration=iteration,
        asynchronous=strategy == "async",
    )


def checkpoint_save_completed(iteration: int | None = None, *, succeeded: bool = True) -> None:
    """The background write of an asynchronous save (``checkpoint_save(strategy="async")``)
    of ``iteration`` (default: the oldest still pending) ended: when ``succeeded`` (finalize
    included), it is the last good checkpoint now, its progress at risk counted from when its
    step completed; else it is dropped. Megatron-LM calls this point its async save's
    finalization (``finalize_async_save``); the Lightning callback calls it for
    ``AsyncCheckpointIO``. Any thread (the writer's, typically); never raises."""
    LEDGER.checkpoint_save_completed(iteration, succeeded)


def checkpoint_save_stage(
    stage: Literal["state_dict", "io_write", "finalize"], **attributes: Any
) -> Phase:
    """A stage of a checkpoint save: span ``megatron.checkpoint.save.state_dict``,
    ``.io_write`` or ``.finalize`` (group ``checkpoint``)."""
    table = {
        "state_dict": MEGATRON_CHECKPOINT_SAVE_STATE_DICT,
        "io_write": MEGATRON_CHECKPOINT_SAVE_IO_WRITE,
        "finalize": MEGATRON_CHECKPOINT_SAVE_FINALIZE,
    }
    name = _named(table, stage, "checkpoint save stage")
    return NOOP_PHASE if name is None else make(name, "checkpoint", attributes or None)


def checkpoint_load(
    path: str | os.PathLike[str] | None = None,
    *,
    checkpoint_type: str = "global",
    strategy: str = "sync",
    iteration: int | None = None,
    **attributes: Any,
) -> Phase:
    """Loading a checkpoint: span ``megatron.checkpoint.load`` (group ``load_checkpoint``, on
    in ``per_step``). Arguments as :func:`checkpoint_save` (``megatron.checkpoint.size``:
    bytes read; ``iteration``: the iteration the checkpoint holds)."""
    return make(
        MEGATRON_CHECKPOINT_LOAD,
        "load_checkpoint",
        _checkpoint_attributes(path, checkpoint_type, strategy, iteration, attributes),
        iteration=iteration,  # the resume point, for the health ledger (the run trace)
    )


def checkpoint_load_stage(stage: Literal["io_read"] = "io_read", **attributes: Any) -> Phase:
    """Reading a checkpoint's files: span ``megatron.checkpoint.load.io_read`` (group
    ``load_checkpoint``)."""
    name = _named({"io_read": MEGATRON_CHECKPOINT_LOAD_IO_READ}, stage, "checkpoint load stage")
    return NOOP_PHASE if name is None else make(name, "load_checkpoint", attributes or None)


def _checkpoint_attributes(path, checkpoint_type, strategy, iteration, attributes) -> dict:
    attributes[MEGATRON_CHECKPOINT_TYPE] = checkpoint_type
    attributes[MEGATRON_CHECKPOINT_STRATEGY] = strategy
    attributes[IS_GOODPUT_SPAN] = True
    if path is not None:
        attributes[MEGATRON_CHECKPOINT_PATH] = os.fspath(path)
    return _with(attributes, MEGATRON_ITERATION, iteration)


# -- evaluation (group evaluate) ------------------------------------------------------------


def evaluation(iteration: int | None = None, **attributes: Any) -> Phase:
    """Evaluating on held-out data: span ``megatron.evaluate`` (group ``evaluate``), in the
    job trace of ``iteration``'s segment."""
    _with(attributes, MEGATRON_ITERATION, iteration)
    return make(MEGATRON_EVALUATE, "evaluate", attributes or None, iteration=iteration)


def evaluation_step(eval_iteration: int | None = None, **attributes: Any) -> Phase:
    """One step of an evaluation: span ``megatron.evaluate.step`` (group ``evaluate``), with
    ``megatron.eval_iteration`` (from 1)."""
    _with(attributes, MEGATRON_EVAL_ITERATION, eval_iteration)
    return make(MEGATRON_EVALUATE_STEP, "evaluate", attributes or None)


# -- any phase ----------------------------------------------------------------------------


def phase(name: str, /, *, group: str | None = None, **attributes: Any) -> Phase:
    """Any phase, as a span named ``name``.

    Args:
        name: The span name (lower-case and dotted, such as ``myproject.preprocess``); a name
            of the registry (``otel_training.semconv.spans``) takes its group.
        group: The span group that turns it on or off; default: the group of ``name`` in the
            registry, else ``custom`` (on in every preset but ``none``). An unknown group is
            logged once and treated as ``custom``.
        **attributes: Span attributes (``**{"my.key": 1}`` for dotted keys); one named
            ``megatron.iteration`` puts the phase in this rank's step trace of that iteration's
            segment (the job trace for a phase of the ``checkpoint`` or ``evaluate`` group).
    """
    if group is None:
        spec = SPANS.get(name) if type(name) is str else None
        group = spec.group if spec is not None else CUSTOM_SPAN_GROUP
    elif group not in SPAN_GROUPS:
        _warn_once(f"group:{group}", "unknown span group %r, using 'custom'", group)
        group = CUSTOM_SPAN_GROUP
    iteration = attributes.get(MEGATRON_ITERATION)
    if type(iteration) is not int:
        iteration = None
    role = RUN if name == MEGATRON_TRAIN else None
    return make(name, group, attributes or None, iteration=iteration, role=role)


# -- callback frameworks ----------------------------------------------------------------


class SpanRecorder:
    """Start, stop, event and error by handle, for callback frameworks (Lightning, the
    Hugging Face Trainer) where a ``with`` block does not fit.

    Spans started here are not made current: give ``parent=`` to nest them. A span with a
    ``megatron.iteration`` attribute whose parent is the run goes to its segment's trace. Every
    method never raises; a handle of a disabled group exports nothing and behaves as any other
    (its health-ledger phase, its failure and its metrics still count). A handle of a group
    mirrored to NVTX only is a start/end NVTX range.

    Args:
        tracer_provider: Where the spans go; default: the tracer of the configured pipeline
            (:func:`otel_training.configure`, from the environment on first use).
        meter_provider: Where ``record_metrics`` and ``record_step_duration`` of the phases
            record; default: the configured pipeline's meter.
        span_groups: Presets and group names that record spans (as
            ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``); default: the configured pipeline's groups,
            else that variable's. With none of the three, the recorder follows the configured
            pipeline (its traces and NVTX-only groups included), even one configured
            later; with a provider missing, the missing one is taken from the pipeline
            configured now (configuring it from the environment if needed).

    Raises:
        ValueError: when ``span_groups`` names an unknown preset or group.

    Example::

        recorder = SpanRecorder()
        run = recorder.start_phase(training_run)
        step = recorder.start_phase(training_iteration, iteration=1, parent=run)
        recorder.event(step, "loss_spike", {"loss": 9.1})
        recorder.stop(step)
        recorder.error(run, exc)   # if the run fails
        recorder.stop(run)
    """

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        span_groups: str | Iterable[str] | None = None,
    ) -> None:
        self._state = None
        if tracer_provider is None and meter_provider is None and span_groups is None:
            return
        groups = None if span_groups is None else span_groups_from_names(span_groups)
        self._state = state_for(tracer_provider, meter_provider, groups)

    def start(
        self,
        name: str,
        *,
        group: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        parent: Phase | None = None,
    ) -> Phase:
        """Starts a span named ``name`` and returns its handle (see :func:`phase` for
        ``group``)."""
        return self.start_phase(phase, name, group=group, parent=parent, **dict(attributes or {}))

    def start_phase(
        self,
        phase_function: Callable[..., Phase],
        /,
        *args: Any,
        parent: Phase | None = None,
        **kwargs: Any,
    ) -> Phase:
        """Starts the phase that ``phase_function(*args, **kwargs)`` describes
        (:func:`training_iteration`, :func:`optimizer_step`, :func:`checkpoint_save`...), with
        this recorder's providers and groups, and returns its handle. The span names and groups
        stay those of the phase functions."""
        state = self._state
        token = None if state is None else bind(state)
        try:
            handle = phase_function(*args, **kwargs)
        except Exception:
            _warn_once("start_phase", "could not make the phase %r", phase_function)
            return NOOP_PHASE
        finally:
            if token is not None:
                unbind(token)
        return handle.start(parent=parent)

    def stop(self, handle: Phase, attributes: Mapping[str, Any] | None = None) -> None:
        """Ends the span of ``handle``, after adding ``attributes``."""
        handle.stop(attributes)

    def event(self, handle: Phase, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """Adds an event to the span of ``handle``."""
        handle.add_event(name, attributes)

    def error(self, handle: Phase, exception: BaseException) -> None:
        """Records that ``exception`` ended the phase of ``handle``: it does not complete, and
        its span gets status ERROR and the exception event (see :meth:`Phase.error`). Call it
        before :meth:`stop`."""
        handle.error(exception)


def _reset_first_iteration() -> None:
    """Lets the next :func:`training_iteration` be a first iteration again (for tests)."""
    reset_first_iteration()
