"""The phase API (otel_training.spans): names, parents, groups, errors, values, metrics."""

from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np
import pytest
import torch
from opentelemetry.trace import INVALID_SPAN, StatusCode

import otel_training
from otel_training import configuration as setup
from otel_training import spans, testing
from otel_training.phases import LedgerPhase
from otel_training.semconv import attributes as attrs
from otel_training.semconv import spans as names

STEP = "megatron.training.step_duration_ms"


def _pipeline(groups: str | None = "all", **environ: str) -> testing.InMemoryTelemetry:
    if groups is not None:
        environ["OTEL_PYTHON_TRAINING_SPAN_GROUPS"] = groups
    return testing.configure_in_memory(environ)


def _finished(pipeline: testing.InMemoryTelemetry) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in pipeline.spans.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


# -- names, parents, attributes ---------------------------------------------------------------


def test_nested_phases_are_spans_named_after_megatron_with_their_parents():
    """Phases nest as spans with Megatron-LM's names and attributes: startup and loads under
    the run; the first iteration (wrapped in first_iteration), its evaluation and save in the
    rank's segment span; forward-backward, optimizer and data loading in the iteration."""
    pipeline = _pipeline("all")
    with otel_training.training_run():
        with otel_training.startup():
            with otel_training.model_init():
                pass
        with otel_training.checkpoint_load("/ckpt/iter_6", checkpoint_type="local", iteration=6):
            pass
        with otel_training.training_iteration(iteration=7):
            with otel_training.data_loading(iteration=7):
                pass
            with otel_training.forward_backward(iteration=7, num_microbatches=4):
                pass
            with otel_training.optimizer_step(iteration=7):
                pass
        with otel_training.evaluation(iteration=7):
            with otel_training.evaluation_step(eval_iteration=1):
                pass
        with otel_training.checkpoint_save("/ckpt/iter_7", iteration=7, strategy="async"):
            with otel_training.checkpoint_save_stage("io_write"):
                pass
    found = _finished(pipeline)
    assert set(found) == {
        names.MEGATRON_TRAIN,
        names.MEGATRON_STARTUP,
        names.MEGATRON_STARTUP_MODEL_INIT,
        names.MEGATRON_CHECKPOINT_LOAD,
        names.MEGATRON_TRAIN_SEGMENT,
        names.MEGATRON_TRAIN_FIRST_ITERATION,
        names.MEGATRON_TRAIN_ITERATION,
        names.MEGATRON_TRAIN_ITERATION_DATA_LOADING,
        names.MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
        names.MEGATRON_TRAIN_ITERATION_OPTIMIZER,
        names.MEGATRON_EVALUATE,
        names.MEGATRON_EVALUATE_STEP,
        names.MEGATRON_CHECKPOINT_SAVE,
        names.MEGATRON_CHECKPOINT_SAVE_IO_WRITE,
    }
    # One span of each; two segment spans: the rank's in the job trace, and its step trace's root
    assert all(len(spans_) == 1 for name, spans_ in found.items() if name != SEGMENT)
    assert len(found[SEGMENT]) == 2

    def parent_of(name: str) -> str:
        span = found[name][0]
        parents = [s for spans_ in found.values() for s in spans_]
        (parent,) = [p for p in parents if p.context.span_id == span.parent.span_id]
        return parent.name

    run = found[names.MEGATRON_TRAIN][0]
    step = found[names.MEGATRON_TRAIN_FIRST_ITERATION][0].context.trace_id
    (segment,) = [s for s in found[SEGMENT] if s.context.trace_id != step]
    (root,) = [s for s in found[SEGMENT] if s.context.trace_id == step]
    assert run.parent is None and segment.parent is None  # rank 0 keeps the shared traces
    assert root.parent is None and [k.context for k in root.links] == [segment.context]
    assert run.context.trace_id != segment.context.trace_id  # the run trace, a segment trace
    assert parent_of(names.MEGATRON_STARTUP) == names.MEGATRON_TRAIN
    assert parent_of(names.MEGATRON_STARTUP_MODEL_INIT) == names.MEGATRON_STARTUP
    assert parent_of(names.MEGATRON_CHECKPOINT_LOAD) == names.MEGATRON_TRAIN
    for name in (names.MEGATRON_TRAIN_FIRST_ITERATION, names.MEGATRON_EVALUATE,
                 names.MEGATRON_CHECKPOINT_SAVE):  # fmt: skip
        assert parent_of(name) == names.MEGATRON_TRAIN_SEGMENT, name
    assert parent_of(names.MEGATRON_TRAIN_ITERATION) == names.MEGATRON_TRAIN_FIRST_ITERATION
    for name in (
        names.MEGATRON_TRAIN_ITERATION_DATA_LOADING,
        names.MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
        names.MEGATRON_TRAIN_ITERATION_OPTIMIZER,
    ):
        assert parent_of(name) == names.MEGATRON_TRAIN_ITERATION, name
        assert found[name][0].attributes[attrs.MEGATRON_ITERATION] == 7
    assert parent_of(names.MEGATRON_EVALUATE_STEP) == names.MEGATRON_EVALUATE
    assert parent_of(names.MEGATRON_CHECKPOINT_SAVE_IO_WRITE) == names.MEGATRON_CHECKPOINT_SAVE
    iteration = found[names.MEGATRON_TRAIN_ITERATION][0].attributes
    assert iteration[attrs.MEGATRON_ITERATION] == 7 and iteration[attrs.IS_GOODPUT_SPAN] is True
    forward_backward = found[names.MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD][0].attributes
    assert forward_backward[attrs.NUM_MICROBATCHES] == 4
    assert found[names.MEGATRON_EVALUATE_STEP][0].attributes[attrs.MEGATRON_EVAL_ITERATION] == 1
    assert dict(found[names.MEGATRON_CHECKPOINT_SAVE][0].attributes) == {
        attrs.MEGATRON_CHECKPOINT_TYPE: "global",
        attrs.MEGATRON_CHECKPOINT_STRATEGY: "async",
        attrs.MEGATRON_CHECKPOINT_PATH: "/ckpt/iter_7",
        attrs.MEGATRON_ITERATION: 7,
        attrs.IS_GOODPUT_SPAN: True,
    }
    load = found[names.MEGATRON_CHECKPOINT_LOAD][0].attributes
    assert load[attrs.MEGATRON_CHECKPOINT_TYPE] == "local"
    assert load[attrs.MEGATRON_CHECKPOINT_STRATEGY] == "sync"
    assert segment.attributes[attrs.OTEL_TRAINING_TRACE_SEGMENT] == 0
    assert [link.context.span_id for link in segment.links] == [run.context.span_id]


def test_phases_use_the_configured_tracer_and_resource():
    """Spans come from the configured TracerProvider: scope otel_training, rank in the resource."""
    pipeline = _pipeline("default", RANK="3", WORLD_SIZE="4")
    with otel_training.training_run():
        pass
    (span,) = pipeline.spans.get_finished_spans()
    assert span.instrumentation_scope.name == setup.INSTRUMENTATION_NAME
    assert span.resource.attributes["dl.rank"] == 3
    assert span.resource is pipeline.telemetry.tracer_provider.resource


def test_the_first_phase_configures_from_the_environment(monkeypatch):
    """Without configure(), the first phase configures otel-training from OTEL_* variables."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert setup.current() is None
    with otel_training.training_run() as run:
        assert run.is_recording
    assert setup.current() is not None


def test_a_generic_phase_nests_and_takes_its_group_from_the_registry():
    """phase(name) nests under the current phase; its group defaults to the registry's."""
    pipeline = _pipeline("default")
    with otel_training.phase("myproject.preprocess", shard=3) as outer:
        with otel_training.phase(names.MEGATRON_CHECKPOINT_SAVE):
            pass
        with otel_training.phase(names.MEGATRON_TRAIN_ITERATION):  # group step: off
            pass
    found = _finished(pipeline)
    assert set(found) == {"myproject.preprocess", names.MEGATRON_CHECKPOINT_SAVE}
    assert found["myproject.preprocess"][0].attributes["shard"] == 3
    save = found[names.MEGATRON_CHECKPOINT_SAVE][0]
    assert save.parent.span_id == outer.span.get_span_context().span_id


# -- span groups ------------------------------------------------------------------------------


def test_default_groups_record_run_startup_checkpoint_evaluation_only():
    """The default preset records coarse phases, the first iteration and its segment, and no
    per-step phase."""
    pipeline = _pipeline(None)
    with otel_training.training_run():
        with otel_training.startup():
            pass
        for step in range(1, 4):
            with otel_training.training_iteration(iteration=step):
                with otel_training.forward_backward():
                    pass
        with otel_training.evaluation():
            pass
        with otel_training.checkpoint_save("x"):
            pass
    found = _finished(pipeline)
    assert set(found) == {
        names.MEGATRON_TRAIN,
        names.MEGATRON_STARTUP,
        names.MEGATRON_TRAIN_SEGMENT,
        names.MEGATRON_TRAIN_FIRST_ITERATION,
        names.MEGATRON_EVALUATE,
        names.MEGATRON_CHECKPOINT_SAVE,
    }
    (first,) = found[names.MEGATRON_TRAIN_FIRST_ITERATION]
    assert first.attributes[attrs.MEGATRON_ITERATION] == 1


def test_a_disabled_group_returns_the_shared_no_op_and_creates_nothing():
    """A phase of a disabled group records no span: the one shared no-op object, or, for a
    phase of the health ledger, a LedgerPhase that only feeds the ledger."""
    pipeline = _pipeline("job")
    first = otel_training.training_iteration(iteration=1)
    second = otel_training.forward_backward(iteration=2, extra="x")
    third = otel_training.activation_offload("offload")
    assert type(first) is LedgerPhase and type(second) is LedgerPhase
    assert third is spans.NOOP_PHASE
    for phase in (first, second, third):
        with phase as handle:
            handle.set_attribute("k", 1)
            handle.add_event("e")
        assert not phase.is_recording and phase.span is INVALID_SPAN
    assert pipeline.spans.get_finished_spans() == ()


FIRST = names.MEGATRON_TRAIN_FIRST_ITERATION
SEGMENT = names.MEGATRON_TRAIN_SEGMENT


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "per_step",
            {
                names.MEGATRON_TRAIN,
                SEGMENT,
                FIRST,
                names.MEGATRON_TRAIN_ITERATION,
                names.MEGATRON_TRAIN_ITERATION_OPTIMIZER,
                names.MEGATRON_TRAIN_ITERATION_DATA_LOADING,
            },
        ),
        ("none", set()),
        ("default,optimizer", {names.MEGATRON_TRAIN, SEGMENT, FIRST,
                               names.MEGATRON_TRAIN_ITERATION_OPTIMIZER}),
        ("step", {names.MEGATRON_TRAIN_ITERATION}),
        ("iteration", {names.MEGATRON_TRAIN_ITERATION}),  # our name before Megatron-LM's
        ("profiling", {names.MEGATRON_TRAIN, SEGMENT, FIRST, names.MEGATRON_TRAIN_ITERATION,
                       names.MEGATRON_TRAIN_ITERATION_OPTIMIZER,
                       names.MEGATRON_TRAIN_ITERATION_DATA_LOADING}),
    ],
)  # fmt: skip
def test_span_groups_variable_takes_presets_and_groups(value, expected):
    """OTEL_PYTHON_TRAINING_SPAN_GROUPS combines Megatron-LM's presets and group names."""
    pipeline = _pipeline(value)
    with otel_training.training_run():
        with otel_training.training_iteration(iteration=1):
            with otel_training.optimizer_step():
                pass
            with otel_training.data_loading():
                pass
    assert set(_finished(pipeline)) == expected


def test_an_unusable_span_groups_value_warns_once_and_uses_the_default(caplog):
    """A value naming no group logs one warning naming the variable; the default applies."""
    with caplog.at_level(logging.WARNING):
        pipeline = _pipeline("everything")
    warnings = [r for r in caplog.records if "OTEL_PYTHON_TRAINING_SPAN_GROUPS" in r.getMessage()]
    assert len(warnings) == 1
    assert (
        pipeline.telemetry.settings.span_groups
        == otel_training.config.SPAN_GROUP_PRESETS["default"]
    )


def test_configure_span_groups_overrides_the_environment_and_rejects_unknown_names():
    """configure(span_groups=...) wins over the variable; an unknown name raises ValueError."""
    telemetry = setup.configure(
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "none",
        },
        span_groups=["per_step"],
        set_global=False,
    )
    assert "step" in telemetry.settings.span_groups
    assert spans.enabled_groups() == telemetry.settings.span_groups
    with pytest.raises(ValueError, match="unknown span group 'steps'"):
        setup.configure(environ={}, span_groups="default,steps", set_global=False)


def test_disabled_sdk_exports_no_phase_and_feeds_the_ledger_alike():
    """With OTEL_SDK_DISABLED=true no phase exports: a phase the health ledger does not count
    is the shared no-op; the run and the ledger's phases still feed it (docs/spans.md, "Same
    call, same behaviour"), without a span."""
    setup.configure(environ={"OTEL_SDK_DISABLED": "true"}, set_global=False)
    assert otel_training.phase("my.phase") is spans.NOOP_PHASE
    for phase in (otel_training.training_run(), otel_training.training_iteration(iteration=1)):
        assert isinstance(phase, LedgerPhase) and phase.span is INVALID_SPAN
    assert spans.enabled_groups() == frozenset()


def test_an_unknown_group_in_phase_is_treated_as_custom(caplog):
    """phase(group=...) with an unknown group warns once and records it as a custom phase."""
    pipeline = _pipeline("default")
    with caplog.at_level(logging.WARNING):
        with otel_training.phase("a.b", group="nonsense"):
            pass
        with otel_training.phase("a.c", group="nonsense"):
            pass
    assert set(_finished(pipeline)) == {"a.b", "a.c"}
    assert sum("nonsense" in r.getMessage() for r in caplog.records) == 1


# -- errors --------------------------------------------------------------------------------


def test_an_exception_is_recorded_on_the_span_and_reraised():
    """Status ERROR, an exception event with type, message and stack, error.type; re-raised."""
    pipeline = _pipeline("default")
    with pytest.raises(OSError, match="disk full"):
        with otel_training.checkpoint_save("/ckpt"):
            raise OSError("disk full")
    (span,) = pipeline.spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "OSError: disk full"
    assert span.attributes["error.type"] == "OSError"
    (event,) = span.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "OSError"
    assert event.attributes["exception.message"] == "disk full"
    assert 'raise OSError("disk full")' in event.attributes["exception.stacktrace"]


def test_training_run_records_an_unhandled_exception_before_it_propagates():
    """An exception leaving training_run() ends the run span in error, with the event."""
    pipeline = _pipeline("per_step")

    class Diverged(RuntimeError):
        pass

    with pytest.raises(Diverged):
        with otel_training.training_run():
            with otel_training.training_iteration(iteration=1):
                raise Diverged("loss is NaN")
    found = _finished(pipeline)
    run = found[names.MEGATRON_TRAIN][0]
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes["error.type"].endswith("Diverged")
    assert [e.name for e in run.events] == ["exception"]
    assert found[names.MEGATRON_TRAIN_ITERATION][0].status.status_code is StatusCode.ERROR


def test_system_exit_zero_is_not_an_error():
    """SystemExit(0) leaves the span without error status; SystemExit(2) is an error."""
    pipeline = _pipeline("default")
    with pytest.raises(SystemExit):
        with otel_training.phase("ok.exit"):
            raise SystemExit(0)
    with pytest.raises(SystemExit):
        with otel_training.phase("bad.exit"):
            raise SystemExit(2)
    found = _finished(pipeline)
    assert found["ok.exit"][0].status.status_code is StatusCode.UNSET
    assert found["bad.exit"][0].status.status_code is StatusCode.ERROR


# -- decorators ----------------------------------------------------------------------------


def test_a_phase_works_as_a_decorator_and_checks_its_group_at_each_call():
    """A phase decorates a function: one span per call, group checked when it is called."""

    @otel_training.checkpoint_save(strategy="async")
    def save(step: int) -> int:
        return step * 2

    pipeline = _pipeline("none")  # configured after decoration
    assert save(1) == 2
    assert pipeline.spans.get_finished_spans() == ()
    testing.reset()
    pipeline = _pipeline("default")
    assert save(2) == 4 and save(3) == 6
    recorded = pipeline.spans.get_finished_spans()
    assert [s.name for s in recorded] == [names.MEGATRON_CHECKPOINT_SAVE] * 2
    assert {s.attributes[attrs.MEGATRON_CHECKPOINT_STRATEGY] for s in recorded} == {"async"}


# -- metrics -------------------------------------------------------------------------------


def test_record_step_duration_adds_one_histogram_point_per_iteration_even_when_not_traced():
    """training_iteration(record_step_duration=True) records one step-duration point per
    iteration, whether the iteration span is recorded or not."""
    for groups, spans_expected in (("default", 0), ("per_step", 3)):
        pipeline = _pipeline(groups)
        inner_ms, outer_ms = [], []
        for step in range(3):
            outer = time.perf_counter_ns()
            with otel_training.training_iteration(iteration=step, record_step_duration=True):
                inner = time.perf_counter_ns()
                sum(range(10_000))
                inner_ms.append((time.perf_counter_ns() - inner) / 1e6)
            outer_ms.append((time.perf_counter_ns() - outer) / 1e6)
        ((_, point),) = pipeline.points(STEP)
        assert point.count == 3, groups
        # the recorded duration covers the phase's work and no more than the whole with-block
        assert sum(inner_ms) <= point.sum <= sum(outer_ms)
        assert min(inner_ms) <= point.min and point.max <= max(outer_ms)
        iterations = _finished(pipeline).get(names.MEGATRON_TRAIN_ITERATION, [])
        assert len(iterations) == spans_expected
        testing.reset()


def test_record_metrics_records_the_metric_and_keeps_nan_visible_on_the_span():
    """record_metrics records Megatron metrics; the span carries them, NaN included."""
    pipeline = _pipeline("step")
    with otel_training.training_iteration(iteration=1) as it:
        it.record_metrics(loss=math.nan, grad_norm=0.5)
    (span,) = pipeline.spans.get_finished_spans()
    assert math.isnan(span.attributes["megatron.training.loss"])
    assert span.attributes["megatron.training.grad_norm"] == 0.5
    points = dict(pipeline.points())
    assert points["megatron.training.grad_norm"].value == 0.5
    assert "megatron.training.loss" not in points  # the SDK would drop NaN: counted instead
    assert points["megatron.training.nonfinite_values"].value == 1


def test_record_metrics_on_a_disabled_phase_still_records_the_metrics():
    """Metrics recorded through the shared no-op phase still reach the meter."""
    pipeline = _pipeline("default")
    with otel_training.training_iteration(iteration=1) as it:
        it.record_metrics(loss=2.5)
    assert dict(pipeline.points())["megatron.training.loss"].value == 2.5


# -- attribute values ----------------------------------------------------------------------


def test_numpy_scalars_and_cpu_tensors_become_numbers_and_other_values_strings():
    """numpy scalars and 0-d CPU tensors become Python numbers; other objects strings."""
    pipeline = _pipeline("default")

    class Odd:
        def __str__(self) -> str:
            return "odd"

    with otel_training.phase("values") as p:
        p.set_attributes(
            {
                "np_float": np.float32(1.5),
                "np_int": np.int64(7),
                "np_bool": np.bool_(True),
                "tensor": torch.tensor(2.25),
                "tensor_int": torch.tensor(3),
                "big_tensor": torch.zeros(3),
                "ints": [1, 2, 3],
                "mixed": [1, "a"],
                "object": Odd(),
            },
            plain=4,
        )
    (span,) = pipeline.spans.get_finished_spans()
    values = dict(span.attributes)
    assert values["np_float"] == 1.5 and type(values["np_float"]) is float
    assert values["np_int"] == 7 and type(values["np_int"]) is int
    assert values["np_bool"] is True
    assert values["tensor"] == 2.25 and type(values["tensor"]) is float
    assert values["tensor_int"] == 3 and type(values["tensor_int"]) is int
    assert values["big_tensor"] == str(torch.zeros(3))
    assert values["ints"] == (1, 2, 3)
    assert values["mixed"] == "[1, 'a']"
    assert values["object"] == "odd"
    assert values["plain"] == 4


class _DeviceScalar:
    """A 0-d CUDA tensor double: counts host reads and remembers their threads (case A6)."""

    device = "cuda:0"

    def __init__(self, value: float, release: threading.Event | None = None) -> None:
        self.value = value
        self.reads: list[str] = []
        self.release = release

    def __float__(self) -> float:
        if self.release is not None:
            self.release.wait(10)
        self.reads.append(threading.current_thread().name)
        return self.value

    def item(self) -> float:
        return self.__float__()


def test_a_device_tensor_attribute_is_read_off_the_training_thread():
    """Case A6: a CUDA scalar on a span is never read on the training thread; the exported
    span carries the plain number and the end time of the phase."""
    pipeline = _pipeline("step")
    release = threading.Event()
    grad_norm = _DeviceScalar(1091.08, release)
    with otel_training.training_iteration(iteration=1) as it:
        it.set_attribute("megatron.training.grad_norm", grad_norm)
    exited_ns = time.time_ns()
    assert grad_norm.reads == []  # nothing read on this thread, and the span not yet ended
    assert pipeline.spans.get_finished_spans() == ()
    time.sleep(0.05)
    release.set()
    assert otel_training.force_flush(5_000)
    (span,) = pipeline.spans.get_finished_spans()
    assert span.attributes["megatron.training.grad_norm"] == 1091.08
    assert grad_norm.reads == ["otel-training-span-end"]
    assert span.end_time <= exited_ns  # ended with the time the phase exited


def test_a_device_tensor_given_at_start_is_deferred_too():
    """A CUDA scalar passed as a start attribute is also read off-thread, and other
    attributes are set at once."""
    pipeline = _pipeline("step")
    loss = _DeviceScalar(2.5)
    with otel_training.training_iteration(iteration=4, loss=loss):
        pass
    assert otel_training.force_flush(5_000)
    (span,) = pipeline.spans.get_finished_spans()
    assert dict(span.attributes) == {
        attrs.MEGATRON_ITERATION: 4,
        attrs.IS_GOODPUT_SPAN: True,
        "loss": 2.5,
    }
    assert loss.reads == ["otel-training-span-end"]


# -- the recorder for callback frameworks -------------------------------------------------------


def test_span_recorder_starts_stops_and_records_events_and_errors_by_handle():
    """SpanRecorder: start/stop/event/error by handle, parent given explicitly, out of order."""
    pipeline = _pipeline("per_step")
    recorder = otel_training.SpanRecorder()
    run = recorder.start(names.MEGATRON_TRAIN)
    first = recorder.start(names.MEGATRON_TRAIN_ITERATION, parent=run, attributes={"a": 1})
    second = recorder.start(names.MEGATRON_TRAIN_ITERATION, parent=run)
    recorder.event(first, "loss_spike", {"loss": 9.5})
    recorder.stop(first, {"b": 2})
    recorder.error(second, ValueError("bad batch"))
    recorder.stop(second)
    recorder.stop(run)
    recorder.stop(run)  # idempotent
    found = _finished(pipeline)
    done_first, done_second = found[names.MEGATRON_TRAIN_ITERATION]
    run_span = found[names.MEGATRON_TRAIN][0]
    assert {done_first.parent.span_id, done_second.parent.span_id} == {run_span.context.span_id}
    assert dict(done_first.attributes) == {"a": 1, "b": 2}
    assert [(e.name, dict(e.attributes)) for e in done_first.events] == [
        ("loss_spike", {"loss": 9.5})
    ]
    assert done_second.status.status_code is StatusCode.ERROR
    assert len(found[names.MEGATRON_TRAIN]) == 1


def test_span_recorder_handles_of_disabled_groups_are_the_no_op():
    """A recorder span of a disabled group records no span (the ledger's phases still count)."""
    _pipeline("default")
    recorder = otel_training.SpanRecorder()
    handle = recorder.start(names.MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD)
    assert type(handle) is LedgerPhase and handle.span is INVALID_SPAN
    assert recorder.start(names.MEGATRON_ACTIVATION_OFFLOAD) is spans.NOOP_PHASE
    recorder.error(handle, RuntimeError("x"))
    recorder.stop(handle)


def test_every_public_phase_name_is_exported():
    """The phase API is importable from otel_training and listed in __all__."""
    for name in spans.__all__:
        if name in ("NOOP_PHASE", "enabled_groups"):
            continue
        assert name in otel_training.__all__, name
        assert getattr(otel_training, name) is getattr(spans, name)
