"""Everything works the second time (issue 15 item 11), for the phases: a second run in one
process (its own trace segments and first iteration, nothing linked to the run before), a second
``SpanRecorder``, and the NVTX processor of a second ``configure()``."""

from __future__ import annotations

import pytest
from doc_rules import documents

import otel_training as ot
from otel_training import testing
from otel_training.semconv import spans as names
from otel_training.trace.shape import member_ids

RUN_ID = "second-time"


def _one_run(first: int) -> None:
    with ot.training_run():
        for iteration in (first, first + 1):
            with ot.training_iteration(iteration=iteration):
                pass


@documents("spans.md", "A process's k-th `training_run()` (k ≥ 2: a second fit) uses the families")
def test_a_second_run_has_its_own_traces_and_its_own_first_iteration():
    """Two runs in one process (a second fit): each run span has its own trace, each run's
    segments their own, the second's segment links only to its own run span, and each run's
    first iteration is wrapped in megatron.train.first_iteration; the ids are the documented
    derivation of the run id and the run's number, the same on every rank."""
    pipeline = testing.configure_in_memory(
        {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all", "OTEL_PYTHON_TRAINING_RUN_ID": RUN_ID}
    )
    _one_run(1)
    _one_run(1)  # the same iterations again: a second fit from scratch
    finished = pipeline.spans.get_finished_spans()
    runs = [s for s in finished if s.name == names.MEGATRON_TRAIN]
    firsts = [s for s in finished if s.name == names.MEGATRON_TRAIN_FIRST_ITERATION]
    steps = {s.context.trace_id for s in firsts}
    segments = [
        s
        for s in finished
        if s.name == names.MEGATRON_TRAIN_SEGMENT and s.context.trace_id not in steps
    ]
    by_id = {s.context.span_id: s for s in finished}
    assert len(runs) == len(segments) == len(firsts) == 2
    # Rank 0 keeps the shared traces: its run and segment spans are their roots, with the ids.
    assert [(s.context.trace_id, s.context.span_id) for s in runs] == [
        member_ids(RUN_ID, "run", "shard/0"),
        member_ids(RUN_ID, "run2/run", "shard/0"),
    ]
    assert [(s.context.trace_id, s.context.span_id) for s in segments] == [
        member_ids(RUN_ID, "segment/0", "shard/0"),
        member_ids(RUN_ID, "run2/segment/0", "shard/0"),
    ]
    for run, segment, first in zip(runs, segments, firsts):
        assert run.parent is None and segment.parent is None
        assert [link.context.span_id for link in segment.links] == [run.context.span_id]
        root = by_id[first.parent.span_id]  # the step trace's root, linked to the segment span
        assert [link.context.span_id for link in root.links] == [segment.context.span_id]
        assert first.attributes["megatron.iteration"] == 1


@documents("spans.md", "(ranks that run in step agree on k)")
@pytest.mark.parametrize("groups", ["all", "step", "none"])
def test_runs_are_numbered_alike_whatever_the_groups(groups):
    """The run count moves whether or not the run span is recorded: with the job group on, a
    second run's iterations go to the step trace of its own family; off, each iteration is
    the root of a trace of its own."""
    pipeline = testing.configure_in_memory(
        {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": groups, "OTEL_PYTHON_TRAINING_RUN_ID": RUN_ID}
    )
    _one_run(1)
    _one_run(1)
    iterations = [
        s for s in pipeline.spans.get_finished_spans() if s.name == names.MEGATRON_TRAIN_ITERATION
    ]
    if groups == "none":
        assert iterations == []
        return
    if groups == "step":
        assert all(s.parent is None for s in iterations)
        assert len({s.context.trace_id for s in iterations}) == 4
        return
    step_trace = {
        member_ids(RUN_ID, family, "rank/0/part/0")[0] for family in ("segment/0", "run2/segment/0")
    }
    assert [s.context.trace_id in step_trace for s in iterations] == [True] * 4
    first, second = iterations[0].context.trace_id, iterations[-1].context.trace_id
    assert (first, second) == (
        member_ids(RUN_ID, "segment/0", "rank/0/part/0")[0],
        member_ids(RUN_ID, "run2/segment/0", "rank/0/part/0")[0],
    )


def test_a_second_span_recorder_records_as_the_first():
    """A recorder made before a second configure() and one made after both record into the
    second pipeline, the same spans nested the same way."""
    testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    earlier = ot.SpanRecorder()
    second = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    later = ot.SpanRecorder()
    shapes = []
    for recorder in (earlier, later):
        seen = len(second.spans.get_finished_spans())
        run = recorder.start_phase(ot.training_run)
        step = recorder.start_phase(ot.optimizer_step, iteration=3, parent=run)
        recorder.stop(step)
        recorder.stop(run)
        done = second.spans.get_finished_spans()[seen:]
        by_id = {span.context.span_id: span.name for span in done}
        shapes.append(
            sorted((s.name, by_id.get(s.parent.span_id) if s.parent else None) for s in done)
        )
    expected = [
        (names.MEGATRON_TRAIN, None),
        (names.MEGATRON_TRAIN_ITERATION_OPTIMIZER, names.MEGATRON_TRAIN_SEGMENT),
        (names.MEGATRON_TRAIN_SEGMENT, None),  # in the job trace
        (names.MEGATRON_TRAIN_SEGMENT, None),  # the root of the step trace
    ]
    assert shapes[0] == shapes[1] == expected


def test_the_nvtx_ranges_of_a_second_configure_are_those_of_the_first(record):  # noqa: F811
    """With an NVTX tool attached, the same phases under a second configure() make the same
    ranges (span start/end ranges and NVTX-only push/pop ranges), all balanced; the first
    pipeline's processor makes none after it is replaced."""
    records = record(
        """
import otel_training as ot
from otel_training import configuration as setup
for attempt in range(3):
    telemetry = ot.configure()
    for thread in setup._retiring:
        thread.join(10)
    with ot.training_run(attempt=attempt):
        with ot.training_iteration(iteration=1):
            with ot.layer("forward", layer_number=1):
                pass
        recorder = ot.SpanRecorder()
        handle = recorder.start_phase(ot.layer, "mlp", layer_number=1)
        recorder.stop(handle)
telemetry.shutdown()
""",
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="job,step,layer,first_iteration",
        OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS="layer",
    )
    starts = [r for r in records if r["op"] == "start"]
    pushes = [r for r in records if r["op"] == "push"]
    ends = [r for r in records if r["op"] == "end"]
    pops = [r for r in records if r["op"] == "pop"]
    assert len(starts) == len(ends) and len(pushes) == len(pops)
    per_attempt = len(starts) // 3
    messages = [r.get("message") for r in starts]
    assert messages[:per_attempt] == messages[per_attempt : 2 * per_attempt]
    assert messages[:per_attempt] == messages[2 * per_attempt :]
    # Per attempt: the run, its segment, its step trace's root, the first iteration, the
    # iteration (spans), and the recorder's layer handle (an NVTX-only start/end range); the
    # with-layer is a push/pop.
    assert sorted(m for m in messages[:per_attempt]) == sorted(
        [
            names.MEGATRON_TRAIN,
            names.MEGATRON_TRAIN_SEGMENT,
            names.MEGATRON_TRAIN_SEGMENT,
            names.MEGATRON_TRAIN_FIRST_ITERATION,
            names.MEGATRON_TRAIN_ITERATION,
            names.MEGATRON_LAYER_MLP,
        ]
    )
    assert [r["message"] for r in pushes] == [names.MEGATRON_LAYER_FORWARD] * 3
