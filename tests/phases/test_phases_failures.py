"""Failures are failures (issue 15 item 3): a phase ended by an exception, or interrupted by a
shutdown, is exported as an error, records no step duration and completes nothing in the health
ledger, on every path (with, decorator, handle, first-iteration wrapper) and in every group."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.trace import StatusCode

import otel_training as ot
from otel_training import testing
from otel_training.health.ledger import LEDGER
from otel_training.semconv import attributes as attrs
from otel_training.semconv import spans as names

STEP = "megatron.training.step_duration_ms"


class Diverged(RuntimeError):
    """A training failure of the program's own."""


# (what leaves the phase, whether the span is an error): every one means "did not complete".
ENDINGS = {
    "Diverged": (lambda: Diverged("loss is NaN"), True),
    "KeyboardInterrupt": (KeyboardInterrupt, True),
    "SystemExit(1)": (lambda: SystemExit(1), True),
    "SystemExit(0)": (lambda: SystemExit(0), False),
    "GeneratorExit": (GeneratorExit, False),
}

# (variables, whether the iteration, evaluation and checkpoints are spans)
GROUPS = {
    "spans": ({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"}, True),
    "disabled groups": ({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "none"}, False),
    "only the first iteration": ({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "first_iteration"}, False),
    "SDK disabled": ({"OTEL_SDK_DISABLED": "true"}, False),
}


def _steps(pipeline: testing.InMemoryTelemetry) -> int:
    return sum(p.count for _, p in pipeline.points(STEP))


def _run_path(path: str, make, ending: BaseException | None) -> None:
    """Runs the phase that ``make()`` returns by ``path``, ended by ``ending`` (or not);
    swallows ``ending`` after it propagated unchanged."""
    try:
        if path == "with":
            with make():
                if ending is not None:
                    raise ending
        elif path == "decorator":

            def body() -> str:
                if ending is not None:
                    raise ending
                return "done"

            assert make()(body)() == "done"
        else:  # a handle of SpanRecorder, as the callbacks use them
            recorder = ot.SpanRecorder()
            handle = recorder.start_phase(lambda: make())
            if ending is not None:
                recorder.error(handle, ending)
            recorder.stop(handle)
            if ending is not None:
                raise ending
    except BaseException as raised:  # noqa: BLE001 - KeyboardInterrupt, SystemExit included
        assert raised is ending  # propagated unchanged
    else:
        assert ending is None


@pytest.mark.parametrize("path", ["with", "decorator", "handle"])
@pytest.mark.parametrize("ending_name", ENDINGS)
@pytest.mark.parametrize("groups", GROUPS)
def test_an_iteration_ended_by_an_exception_is_a_failure_everywhere(path, ending_name, groups):
    """An iteration that an exception ends records no step duration and completes no step in
    the ledger, whatever the group; where it is a span (and its first-iteration wrapper is),
    the span is ERROR with the exception event, except for SystemExit(0) and GeneratorExit."""
    environ, spans_recorded = GROUPS[groups]
    pipeline = testing.configure_in_memory(environ)
    ending_factory, is_error = ENDINGS[ending_name]
    for iteration in (1, 2):  # the first of the process (wrapped), then a plain one
        _run_path(
            path,
            lambda i=iteration: ot.training_iteration(iteration=i, record_step_duration=True),
            ending_factory(),
        )
    assert LEDGER.read().iteration is None  # no step completed
    if groups != "SDK disabled":
        assert _steps(pipeline) == 0
    # a completed one after them counts (the failures left nothing open)
    _run_path(path, lambda: ot.training_iteration(iteration=3, record_step_duration=True), None)
    assert LEDGER.read().iteration == 3
    if groups != "SDK disabled":
        assert _steps(pipeline) == 1
    finished = pipeline.spans.get_finished_spans()
    wrappers = [s for s in finished if s.name == names.MEGATRON_TRAIN_FIRST_ITERATION]
    iterations = [s for s in finished if s.name == names.MEGATRON_TRAIN_ITERATION]
    if groups in ("spans", "only the first iteration") and path != "decorator":
        assert len(wrappers) == 1  # the decorator consumed the first iteration when decorating
        _assert_failed(wrappers[0], is_error, ending_name)
    if spans_recorded:
        assert [s.attributes[attrs.MEGATRON_ITERATION] for s in iterations] == [1, 2, 3]
        for span in iterations[:2]:
            _assert_failed(span, is_error, ending_name)
        assert iterations[2].status.status_code is StatusCode.UNSET
        assert iterations[2].events == ()
    else:
        assert iterations == []


def _assert_failed(span, is_error: bool, ending_name: str) -> None:
    events = [e for e in span.events if e.name == "exception"]
    if is_error:
        assert span.status.status_code is StatusCode.ERROR, span.name
        (event,) = events
        expected = ending_name.split("(")[0]
        assert event.attributes["exception.type"].endswith(expected)
        assert span.attributes["error.type"].endswith(expected)
    else:
        assert span.status.status_code is StatusCode.UNSET, span.name
        assert events == []


@pytest.mark.parametrize("groups", ["spans", "disabled groups"])
def test_failed_evaluations_and_checkpoints_count_for_nothing(groups):
    """A save or load that raised records no checkpoint in the ledger; an evaluation that
    raised is an error span; the successful ones after them count."""
    environ, spans_recorded = GROUPS[groups]
    pipeline = testing.configure_in_memory(environ)
    for make in (
        lambda: ot.checkpoint_save("/ckpt/7", iteration=7),
        lambda: ot.checkpoint_load("/ckpt/6", iteration=6),
        lambda: ot.evaluation(iteration=7),
    ):
        for path in ("with", "decorator", "handle"):
            _run_path(path, make, Diverged("disk full"))
    reading = LEDGER.read()
    assert (reading.saved_iteration, reading.loaded_iteration, reading.iteration) == (None,) * 3
    with ot.checkpoint_load("/ckpt/6", iteration=6), ot.checkpoint_save_stage("io_write"):
        pass
    with ot.checkpoint_save("/ckpt/7", iteration=7):
        pass
    reading = LEDGER.read()
    assert (reading.saved_iteration, reading.loaded_iteration, reading.iteration) == (7, 6, 6)
    failed = [s for s in pipeline.spans.get_finished_spans() if not s.status.is_ok]
    assert len(failed) == (9 if spans_recorded else 0)


def test_an_exception_while_a_device_value_is_pending_is_still_an_error():
    """An iteration that raised while its loss (a device tensor) was being read is ERROR with
    the exception event, carries the value once read, ends at the time it exited, and records
    no step duration."""
    from test_spans import _DeviceScalar

    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    release = threading.Event()
    loss = _DeviceScalar(3.5, release)
    with pytest.raises(Diverged):
        with ot.training_iteration(iteration=1, record_step_duration=True) as it:
            it.set_attribute("megatron.training.loss", loss)
            raise Diverged("NCCL timeout")
    finished = [s.name for s in pipeline.spans.get_finished_spans()]
    assert finished == [names.MEGATRON_TRAIN_FIRST_ITERATION]  # the iteration waits for its value
    release.set()
    assert ot.force_flush(5_000)
    (span,) = [
        s for s in pipeline.spans.get_finished_spans() if s.name == names.MEGATRON_TRAIN_ITERATION
    ]
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]
    assert span.attributes["megatron.training.loss"] == 3.5
    assert _steps(pipeline) == 0
    assert LEDGER.read().iteration is None


@pytest.mark.parametrize("groups", ["spans", "disabled groups"])
@pytest.mark.parametrize("reason", [None, "SIGTERM"])
def test_an_iteration_open_at_shutdown_is_interrupted(groups, reason):
    """An iteration still open when its pipeline shuts down (at exit, on SIGTERM) records no
    step duration when it ends later, and completes no step; its span is the truncated one."""
    environ, spans_recorded = GROUPS[groups]
    pipeline = testing.configure_in_memory(environ)
    with ot.training_iteration(iteration=1, record_step_duration=True):
        pass
    with ot.training_iteration(iteration=2, record_step_duration=True):
        worker = threading.Thread(
            target=pipeline.telemetry.shutdown, kwargs={"reason": reason, "timeout_millis": 5_000}
        )
        worker.start()
        worker.join(10)
    assert _steps(pipeline) == 1  # the first only
    assert LEDGER.read().iteration == 1
    iterations = [
        s for s in pipeline.spans.get_finished_spans() if s.name == names.MEGATRON_TRAIN_ITERATION
    ]
    if spans_recorded:
        assert len(iterations) == 2
        assert iterations[1].attributes[attrs.OTEL_TRAINING_SPAN_TRUNCATED] is True
    else:
        assert iterations == []


def test_an_iteration_truncated_before_it_exits_records_no_step():
    """The race at SIGTERM: the span is truncated, then the iteration exits while the metrics
    are not yet shut down: no step-duration point reaches the final collection."""
    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    recorder = ot.SpanRecorder()
    handle = recorder.start_phase(ot.training_iteration, iteration=1, record_step_duration=True)
    # Runs after the truncation on SIGTERM, before the providers shut down.
    pipeline.telemetry.before_shutdown.append(lambda: recorder.stop(handle))
    assert pipeline.telemetry.shutdown(timeout_millis=5_000, reason="SIGTERM")
    assert _steps(pipeline) == 0
    (span,) = [
        s for s in pipeline.spans.get_finished_spans() if s.name == names.MEGATRON_TRAIN_ITERATION
    ]
    assert span.status.status_code is StatusCode.ERROR  # truncated: SIGTERM


def test_nvtx_only_phases_fail_as_spans_do(record):  # noqa: F811
    """With an NVTX tool attached and the iteration mirrored to NVTX only, an iteration that
    raised (with, decorator, handle) completes no step and records no step duration; its
    ranges are balanced, push/pop inside ``with``, start/end for a handle."""
    records = record(
        """
import otel_training as ot
from otel_training import testing
from otel_training.health.ledger import LEDGER
from otel_training.phases import NvtxPhase
pipeline = testing.configure_in_memory({
    "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "step,first_iteration",
    "OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS": "step,first_iteration",
})
try:
    with ot.training_iteration(iteration=1, record_step_duration=True):
        raise KeyboardInterrupt
except KeyboardInterrupt:
    pass
@ot.training_iteration(iteration=2, record_step_duration=True)
def step():
    raise SystemExit(0)
try:
    step()
except SystemExit:
    pass
recorder = ot.SpanRecorder()
handle = recorder.start_phase(ot.training_iteration, iteration=3, record_step_duration=True)
recorder.error(handle, RuntimeError("NCCL timeout"))
recorder.stop(handle)
assert LEDGER.read().iteration is None, LEDGER.read()
assert pipeline.points("megatron.training.step_duration_ms") == []
with ot.training_iteration(iteration=4, record_step_duration=True):
    pass
assert LEDGER.read().iteration == 4
assert [p.count for _, p in pipeline.points("megatron.training.step_duration_ms")] == [1]
assert pipeline.spans.get_finished_spans() == ()
assert type(ot.training_iteration(iteration=9)) is NvtxPhase
""",
    )
    pushes = [r["message"] for r in records if r["op"] == "push"]
    pops = [r for r in records if r["op"] == "pop"]
    starts = [r["message"] for r in records if r["op"] == "start"]
    ends = [r for r in records if r["op"] == "end"]
    assert pushes == [
        names.MEGATRON_TRAIN_FIRST_ITERATION,  # the first iteration's wrapper
        names.MEGATRON_TRAIN_ITERATION,
        names.MEGATRON_TRAIN_ITERATION,  # the decorated call
        names.MEGATRON_TRAIN_ITERATION,  # the last, completed
    ]
    assert starts == [names.MEGATRON_TRAIN_ITERATION]  # the handle
    assert len(pops) == len(pushes) and len(ends) == len(starts)
