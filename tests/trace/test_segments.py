"""Where the phases' spans go (otel_training.trace.segments): run, job and step traces, each within
the span budget, nested per rank as the program nested them, linked to the rank's span in the
shared trace; sampled together per segment."""

from __future__ import annotations

import collections
import threading

import pytest
from doc_rules import documents
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_training as ot
from otel_training import testing
from otel_training.semconv import spans as names
from otel_training.trace.segments import KEPT
from otel_training.trace.shape import member_ids

RUN_ID = "segments"


def _pipeline(budget: int, groups: str = "all", **environ: str) -> testing.InMemoryTelemetry:
    return testing.configure_in_memory(
        {
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": groups,
            "OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET": str(budget),
            "OTEL_PYTHON_TRAINING_RUN_ID": RUN_ID,
            **environ,
        }
    )


def _by_trace(spans) -> dict[int, list]:
    found = collections.defaultdict(list)
    for span in spans:
        found[span.context.trace_id].append(span)
    return found


SEGMENT = names.MEGATRON_TRAIN_SEGMENT


def _whole(spans) -> None:
    """Every trace has exactly one root span, and every other span's parent is exported in its
    own trace: no parent in another trace, none that nothing exports."""
    ids = {(s.context.trace_id, s.context.span_id) for s in spans}
    roots = collections.Counter(s.context.trace_id for s in spans if s.parent is None)
    for span in spans:
        if span.parent is not None:
            assert (span.context.trace_id, span.parent.span_id) in ids, span.name
    assert all(roots[trace] == 1 for trace in _by_trace(spans)), roots


def _real_parent(span, by_id):
    """The span the program started ``span`` in: its parent, or, for a span that started in
    the rank's next own trace for want of room (under that trace's root), the span its link
    names."""
    parent = by_id.get(span.parent.span_id) if span.parent else None
    if parent is not None and parent.name == SEGMENT and span.name != SEGMENT and span.links:
        return by_id.get(span.links[0].context.span_id)
    return parent


def _step_trace(spans) -> int:
    """The trace of the first iteration among ``spans``."""
    return next(s.context.trace_id for s in spans if s.name == names.MEGATRON_TRAIN_ITERATION)


def _job_trace(segment: int, shard: int = 0, family: str = "segment") -> int:
    return member_ids(RUN_ID, f"{family}/{segment}", f"shard/{shard}")[0]


def _iteration(it: int, microbatches: int = 0, probes: int = 0) -> None:
    with ot.training_iteration(iteration=it):
        with ot.data_loading(iteration=it):
            pass
        with ot.forward_backward(iteration=it):
            for _ in range(microbatches):
                with ot.microbatch("forward"):
                    pass
            for k in range(probes):
                with ot.phase("myproject.probe", k=k):
                    pass
        with ot.optimizer_step(iteration=it):
            pass


@documents("spans.md", "bounds every trace whatever the world size W and the span groups")
def test_no_trace_exceeds_the_budget_and_every_span_keeps_its_parent():
    """A chatty rank (micro-batches, a loop of user phases, long evaluations) at a budget of
    25: every trace holds at most 25 spans, no span is lost, every trace is whole (one root, no
    parent in another trace), and each span names the span the program started it in as its
    parent, or, when it started in the rank's next own trace, by a link."""
    pipeline = _pipeline(25)
    with ot.training_run() as run:
        with ot.startup():
            pass
        for it in range(1, 13):
            _iteration(it, microbatches=3, probes=40 if it == 4 else 0)
            if it % 6 == 0:
                with ot.evaluation(iteration=it):
                    for k in range(1, 30):
                        with ot.evaluation_step(eval_iteration=k):
                            pass
    spans = pipeline.spans.get_finished_spans()
    roots = [s for s in spans if s.name == SEGMENT and s.context.trace_id != _job_trace(0)]
    roots = [s for s in roots if s.context.trace_id != _job_trace(1)]  # the step traces' roots
    assert len(spans) == 1 + 1 + 2 + 12 * (4 + 3) + 40 + 2 * 30 + 1 + len(roots)
    traces = _by_trace(spans)
    assert max(len(members) for members in traces.values()) <= 25
    _whole(spans)
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:
        parent = _real_parent(span, by_id)
        if span.name in (names.MEGATRON_TRAIN, names.MEGATRON_TRAIN_SEGMENT):
            assert parent is None  # the roots of the run and job traces (rank 0 keeps both)
        elif span.name == names.MEGATRON_STARTUP:
            assert parent.context.span_id == run.span.get_span_context().span_id
        elif span.name in (names.MEGATRON_TRAIN_FIRST_ITERATION, names.MEGATRON_EVALUATE):
            assert parent.name == names.MEGATRON_TRAIN_SEGMENT
        elif span.name == names.MEGATRON_TRAIN_ITERATION:
            assert parent.name in (
                names.MEGATRON_TRAIN_SEGMENT,
                names.MEGATRON_TRAIN_FIRST_ITERATION,
            )
        elif span.name == "myproject.probe" or span.name == names.MEGATRON_MICROBATCH_FORWARD:
            assert parent.name == names.MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD
        elif span.name == names.MEGATRON_EVALUATE_STEP:
            assert parent.name == names.MEGATRON_EVALUATE
        else:
            assert parent.name == names.MEGATRON_TRAIN_ITERATION, span.name


@documents(
    "spans.md",
    "An iteration that would not fit its step trace whole starts the rank's next step trace",
)
def test_an_iteration_that_fits_stays_whole_in_one_step_trace():
    """With only the once-per-iteration groups, a step trace ends before an iteration that would
    not fit: every iteration and its phases share one trace, and a step trace holds
    floor((25 - 1 - 1) / 4) = 5 iterations at most (the first also its wrapper, and every step
    trace its root span)."""
    pipeline = _pipeline(25, "job,first_iteration,step,data_loading,forward_backward,optimizer")
    with ot.training_run():
        for it in range(1, 31):
            _iteration(it)
    spans = pipeline.spans.get_finished_spans()
    traces = _by_trace(spans)
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:
        if span.name.startswith("megatron.train.iteration."):
            assert span.context.trace_id == by_id[span.parent.span_id].context.trace_id
    counts = [
        sum(1 for s in members if s.name == names.MEGATRON_TRAIN_ITERATION)
        for members in traces.values()
    ]
    assert max(counts) == 5 and sum(counts) == 30
    segment = [s for s in spans if s.name == SEGMENT]
    assert len({s.attributes["otel_training.trace.segment"] for s in segment}) == 6  # N = 5
    assert max(len(m) for m in traces.values()) <= 25


@documents("spans.md", "(part p + 1, rooted and linked like the first)")
@documents(
    "spans.md",
    "It is rooted by a `megatron.train.segment` span of the rank's",
)
def test_every_step_trace_links_to_the_rank_s_segment_span():
    """Each of the rank's own traces is rooted by a segment span of its own, its first span,
    linked to the rank's segment span of that segment in the job trace; its other links name
    the real parents of spans that started there for want of room."""
    pipeline = _pipeline(25)
    with ot.training_run():
        for it in range(1, 7):
            _iteration(it, microbatches=5)
    spans = pipeline.spans.get_finished_spans()
    _whole(spans)
    by_id = {s.context.span_id: s for s in spans}
    shared = {member_ids(RUN_ID, "run", "shard/0")[0], _job_trace(0), _job_trace(1)}
    segments = {s.context.span_id: s for s in spans if s.context.trace_id in shared}
    own = {t: m for t, m in _by_trace(spans).items() if t not in shared}
    assert len(own) > 2
    for members in own.values():
        (root,) = [s for s in members if s.parent is None]
        assert root.name == SEGMENT and root.start_time == min(s.start_time for s in members)
        (link,) = [link.context for link in root.links]
        segment = segments[link.span_id]
        assert segment.name == SEGMENT and link.trace_id == segment.context.trace_id
        assert segment.attributes == root.attributes  # the same segment number
        for span in members:
            if span is not root and span.links:
                (real,) = span.links
                assert by_id[real.context.span_id].context.trace_id != root.context.trace_id


@documents(
    "spans.md",
    "a rank fills at most its share A of a run or job trace and at most B of its step trace",
)
def test_a_loop_of_phases_outside_iterations_stays_within_the_budget():
    """A user loop of phases at run level with a run span fills the rank's share of the run
    trace, then the open segment's step traces (segment 0's, opened for them), each within the
    budget, whole, the phases linked to the run span; without one (no group job), each phase is
    the root of a trace of its own."""
    for groups in ("default", "custom"):
        pipeline = _pipeline(20, groups)
        if groups == "default":
            with ot.training_run() as run:
                for k in range(70):
                    with ot.phase("myproject.preprocess", k=k):
                        pass
            anchor = run.span.get_span_context()
        else:
            for k in range(70):
                with ot.phase("myproject.preprocess", k=k):
                    pass
            anchor = None
        spans = pipeline.spans.get_finished_spans()
        phases = [s for s in spans if s.name == "myproject.preprocess"]
        assert len(phases) == 70
        traces = _by_trace(spans)
        assert max(len(m) for m in traces.values()) <= 20 and len(traces) >= 4, groups
        _whole(spans)
        run_trace = member_ids(RUN_ID, "run", "shard/0")
        for span in phases:
            links = [(k.context.trace_id, k.context.span_id) for k in span.links]
            if anchor is None:
                assert span.parent is None and links == []
            elif span.context.trace_id == run_trace[0]:
                assert span.parent.span_id == anchor.span_id and links == []
            else:
                assert links == [(anchor.trace_id, anchor.span_id)]
        testing.reset()


@documents("spans.md", "With the group `job` off there are no run or segment spans")
def test_without_the_job_group_a_phase_without_parent_roots_a_trace_of_its_own():
    """With the group job off: no run or segment span; each iteration and save is the root of
    a trace of its own, its children in it."""
    pipeline = _pipeline(1000, "step,checkpoint")
    for it in (1, 2):
        with ot.training_iteration(iteration=it):
            pass
    with ot.checkpoint_save("/c", iteration=2):
        pass
    spans = pipeline.spans.get_finished_spans()
    assert sorted(s.name for s in spans) == sorted(
        [names.MEGATRON_TRAIN_ITERATION] * 2 + [names.MEGATRON_CHECKPOINT_SAVE]
    )
    assert all(s.parent is None and not s.links for s in spans)
    assert len(_by_trace(spans)) == 3


@documents(
    "spans.md", "Every span a rank starts in one of these traces is counted (an atomic counter"
)
def test_spans_started_on_many_threads_never_overfill_a_trace():
    """Eight threads start phases under one iteration at once, at a budget of 16: no trace
    holds more, no span is lost."""
    pipeline = _pipeline(16)
    with ot.training_run():
        with ot.training_iteration(iteration=1) as iteration:
            barrier = threading.Barrier(8)

            def work() -> None:
                recorder = ot.SpanRecorder()
                barrier.wait()
                for _ in range(50):
                    handle = recorder.start_phase(ot.microbatch, "forward", parent=iteration)
                    recorder.stop(handle)

            threads = [threading.Thread(target=work) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    spans = pipeline.spans.get_finished_spans()
    assert sum(1 for s in spans if s.name == names.MEGATRON_MICROBATCH_FORWARD) == 400
    assert max(len(m) for m in _by_trace(spans).values()) <= 16


@documents(
    "spans.md", "So a sampler keeps or drops a segment's job trace and all its step traces together"
)
@documents("spans.md", "Sampling is decided once per family, at the head, alike on every rank")
@pytest.mark.parametrize("sampler", ["traceidratio", "parentbased_traceidratio"])
def test_a_segment_s_traces_are_sampled_together(sampler):
    """At ratio 0.5, the job trace and the rank's step traces of a segment are all kept or all
    dropped (their shared low trace-id bits and the shared parents' flag), over segments that
    go both ways."""
    pipeline = _pipeline(
        12,
        "per_step",
        OTEL_TRACES_SAMPLER=sampler,
        OTEL_TRACES_SAMPLER_ARG="0.5",
        OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS="2",
    )
    decisions = collections.defaultdict(set)
    with ot.training_run():
        for it in range(1, 41):
            with ot.training_iteration(iteration=it) as step:
                with ot.forward_backward(iteration=it):
                    for _ in range(4):  # fills step traces: more than one a segment
                        with ot.phase("myproject.probe"):
                            pass
                decisions[(it - 1) // 2].add(step.span.get_span_context().trace_flags.sampled)
            if it % 2 == 0:
                with ot.checkpoint_save("/c", iteration=it) as save:
                    decisions[(it - 1) // 2].add(save.span.get_span_context().trace_flags.sampled)
    assert all(len(found) == 1 for found in decisions.values())
    assert {next(iter(found)) for found in decisions.values()} == {True, False}
    kept = pipeline.spans.get_finished_spans()
    segments_kept = {
        s.attributes["otel_training.trace.segment"]
        for s in kept
        if s.name == names.MEGATRON_TRAIN_SEGMENT
    }
    assert segments_kept == {s for s, found in decisions.items() if found == {True}}


def test_a_trace_of_another_tracer_is_joined_uncounted():
    """A phase inside a span of the user's own tracer nests in that trace, which the budget
    does not count (the documented exception)."""
    pipeline = _pipeline(5, "custom")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("user").start_as_current_span("user.root") as root:
        for k in range(12):
            with ot.phase("myproject.step", k=k):
                pass
    spans = pipeline.spans.get_finished_spans()
    assert len(spans) == 12
    assert {s.context.trace_id for s in spans} == {root.get_span_context().trace_id}


@documents("spans.md", "A trace belongs to a family, `run` or `segment/{s}`")
@documents(
    "spans.md",
    "a rank fills at most its share A of a run or job trace and at most B of its step trace",
)
def test_the_run_trace_is_counted_however_many_traces_came_before():
    """After 300 segments (more traces than a rank keeps counting), run-level phases still
    fill only the rank's share of the run trace, then traces of its own."""
    pipeline = _pipeline(8, "default", OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS="1")
    with ot.training_run():
        for it in range(1, 301):
            with ot.evaluation(iteration=it):
                pass
        for k in range(30):
            with ot.phase("myproject.report", k=k):
                pass
    spans = pipeline.spans.get_finished_spans()
    segments = [s for s in spans if s.name == SEGMENT]
    assert len({s.attributes["otel_training.trace.segment"] for s in segments}) == 300
    assert max(len(m) for m in _by_trace(spans).values()) <= 8
    _whole(spans)
    run_trace = member_ids(RUN_ID, "run", "shard/0")[0]
    assert len(_by_trace(spans)[run_trace]) == 8


@documents("spans.md", "A process starts each derived root once")
def test_a_segment_opened_again_goes_on_counting():
    """A save of segment 0 after segment 1 began (an asynchronous save that ends late) opens
    segment 0 again: its job and step traces go on counting from where they were, so neither
    exceeds the budget, and new step traces link to the new segment span. The keeper's second
    segment span of segment 0 starts under its first (the job trace's root), not as a second
    root with the same ids: every trace stays whole."""
    pipeline = _pipeline(12, "per_step")  # N = (12 - 1) // 4 = 2
    with ot.training_run():
        for it in range(1, 5):
            _iteration(it)
        for _ in range(3):
            with ot.checkpoint_save("/c", iteration=2):
                for stage in ("state_dict", "io_write", "finalize"):
                    with ot.checkpoint_save_stage(stage):
                        pass
            with ot.training_iteration(iteration=2):
                with ot.forward_backward(iteration=2):
                    pass
    spans = pipeline.spans.get_finished_spans()
    assert max(len(m) for m in _by_trace(spans).values()) <= 12
    zero = [s for s in spans if s.name == SEGMENT and s.context.trace_id == _job_trace(0)]
    assert len(zero) == 2  # opened twice, in the same job trace
    first, again = sorted(zero, key=lambda s: s.start_time)
    assert first.parent is None and again.parent.span_id == first.context.span_id
    _whole(spans)
    assert len({(s.context.trace_id, s.context.span_id) for s in spans}) == len(spans)


def test_a_rank_beyond_shard_0_starts_under_its_shards_parent_and_links_to_shard_0():
    """Rank 7 of 8 at a budget of 25, every group on (the run trace in 2 shards of 4 ranks, 6
    spans a rank; the job trace in 3 shards of 3, 7 a rank): its run span starts under the run
    trace's shard 1 shared parent (exported by rank 4, the shard's keeper) and links to shard
    0's; its segment span starts under the segment's shard 2 parent (rank 6's), linked to
    shard 0's and to the run span."""
    pipeline = _pipeline(25, RANK="7", WORLD_SIZE="8", LOCAL_RANK="7")
    with ot.training_run():
        _iteration(1)
    finished = pipeline.spans.get_finished_spans()
    spans = {s.name: s for s in finished if s.context.trace_id != _step_trace(finished)}
    run, segment = spans[names.MEGATRON_TRAIN], spans[names.MEGATRON_TRAIN_SEGMENT]
    for span, family, shard in ((run, "run", 1), (segment, "segment/0", 2)):
        trace_id, span_id = member_ids(RUN_ID, family, f"shard/{shard}")
        assert (span.context.trace_id, span.parent.span_id) == (trace_id, span_id)
        assert span.parent.is_remote  # a shared parent: no rank exports it
        shard0 = member_ids(RUN_ID, family, "shard/0")
        (link,) = [
            k.context for k in span.links if (k.context.trace_id, k.context.span_id) == shard0
        ]
        assert link.is_remote and link.trace_flags.sampled  # a shared parent, sampled alike
    assert (run.context.trace_id, run.context.span_id) in [
        (link.context.trace_id, link.context.span_id) for link in segment.links
    ]


def _segments(
    budget: int, segment_limit: int, groups=("job",), world: int = 1, rank: int = 0, **kwargs
):
    """A TraceSegments of ``rank`` of ``world`` over an in-memory exporter (the pipeline's
    parts, direct)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from otel_training.trace.segments import TraceSegments
    from otel_training.trace.shape import TraceShape

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    shape = TraceShape.derive(groups, world, budget, segment_limit)
    tracer = provider.get_tracer("test")
    segments = TraceSegments(tracer, RUN_ID, shape, rank, ALWAYS_ON, **kwargs)
    return segments, exporter


def test_a_segment_span_lasts_from_its_first_phase_to_the_next_segment_or_the_runs_end():
    """A segment span starts at the time given with its first phase, is an open span while it
    lasts, ends when the next segment opens (which links to it) or at the run's end (after
    which the next one links to nothing of it); it names its segment. Rank 0 keeps the job
    trace: its segment span is the root, with the shared ids; rank 1's names it as parent."""
    from otel_training.trace.shape import member_ids as ids

    for rank in (0, 1):
        open_spans: dict = {}
        segments, exporter = _segments(25, 2, world=2, rank=rank, open_spans=open_spans)
        segments.routed(1, True, now_ns=1_000)
        segments.routed(2, True, now_ns=2_000)  # the same segment: nothing opens
        (first,) = open_spans
        assert exporter.get_finished_spans() == ()
        segments.routed(3, True, now_ns=5_000)
        (second,) = open_spans
        segments.end_run(9_000)
        assert open_spans == {}
        segments.routed(5, True, now_ns=10_000)
        segments.close()
        _check_segment_spans(exporter.get_finished_spans(), first, rank, ids)


def _check_segment_spans(spans, first, rank, ids) -> None:
    assert [s.name for s in spans] == [names.MEGATRON_TRAIN_SEGMENT] * 3
    assert [(s.start_time, s.end_time) for s in spans[:2]] == [(1_000, 5_000), (5_000, 9_000)]
    assert spans[2].start_time == 10_000
    assert [s.attributes["otel_training.trace.segment"] for s in spans] == [0, 1, 2]
    assert [[link.context for link in s.links] for s in spans] == [
        [],
        [first.get_span_context()],
        [],
    ]
    for segment, span in enumerate(spans):
        trace_id, span_id = ids(RUN_ID, f"segment/{segment}", "shard/0")
        if rank == 0:  # the keeper: the job trace's root
            assert (span.context.trace_id, span.context.span_id) == (trace_id, span_id)
            assert span.parent is None
        else:
            assert (span.context.trace_id, span.parent.span_id) == (trace_id, span_id)


def test_a_step_trace_is_filled_to_the_budget_exactly_then_the_next_begins():
    """Spans of iterations routed to step traces at a budget of 5: each step trace holds
    exactly 5 (none left empty, none over): its root, a segment span with the part's own ids
    linked to the rank's segment span, and 4 spans under it."""
    segments, exporter = _segments(5, 1000)
    placed = [segments.routed(1, False, now_ns=1) for _ in range(17)]
    segment, *roots = segments._open_spans
    anchor = segment.get_span_context()
    counts = collections.Counter()
    for context, links in placed:
        parent = trace_api.get_current_span(context)
        assert parent in roots and links is None
        counts[parent.get_span_context().trace_id] += 1
    assert sorted(counts.values()) == [1, 4, 4, 4, 4]
    parts = [member_ids(RUN_ID, "segment/0", f"rank/0/part/{k}") for k in range(5)]
    assert list(counts) == [trace for trace, _ in parts]  # the rank's own, numbered from 0
    for root, ids in zip(roots, parts, strict=True):
        assert (root.context.trace_id, root.context.span_id) == ids and root.parent is None
        assert root.name == SEGMENT and [k.context for k in root.links] == [anchor]


def test_children_beyond_their_parents_room_start_in_the_ranks_own_trace_naming_it():
    """A parent in a step trace with room for 5 (its root, the parent, 3 more): 3 children nest
    in its trace as they are; the next ones start in this rank's next own traces, under their
    root span, each linked to its real parent; a parent of another tracer's trace is joined
    uncounted."""
    segments, exporter = _segments(5, 1000)
    context, _ = segments.routed(1, False, now_ns=1)
    tracer = TracerProvider().get_tracer("test")
    parent = tracer.start_span("parent", context=context)
    segment, first_root = segments._open_spans
    placed = [segments.nested(parent, context) for _ in range(9)]
    assert placed[:3] == [(context, None)] * 3
    _, *roots = segments._open_spans
    assert roots[0] is first_root and len(roots) == 3  # 4 more in the next, 2 in the last
    for k, (moved, links) in enumerate(placed[3:]):
        root = trace_api.get_current_span(moved)
        assert root is roots[1 + k // 4] and root.name == SEGMENT
        assert [link.context for link in links] == [parent.get_span_context()]
    user = TracerProvider().get_tracer("user").start_span("user.root")
    assert segments.nested(user, "ctx") == ("ctx", None)


def test_the_kth_run_of_a_process_has_families_of_its_own(monkeypatch):
    """The second run of a process (begun before the router was made, or while it routes)
    starts under the run trace ``run2/run`` and opens ``run2/segment/{s}``; the first keeps
    ``run`` and ``segment/{s}``."""
    from otel_training.trace import segments as module

    monkeypatch.setattr(module, "_runs", 1)
    first, _ = _segments(25, 2, world=2, rank=1)
    monkeypatch.setattr(module, "_runs", 2)
    second, exporter = _segments(25, 2, world=2, rank=1)
    for router in (first, second):  # the first follows the process to its second run
        context, _ = router.run_start()
        parent = trace_api.get_current_span(context).get_span_context()
        assert (parent.trace_id, parent.span_id) == member_ids(RUN_ID, "run2/run", "shard/0")
        router.routed(1, True, now_ns=1)
        router.close()
    segment_id = member_ids(RUN_ID, "run2/segment/0", "shard/0")
    assert [(s.context.trace_id, s.parent.span_id) for s in exporter.get_finished_spans()] == [
        segment_id
    ]
    monkeypatch.setattr(module, "_runs", 1)
    third, _ = _segments(25, 2, world=2, rank=1)
    parent = trace_api.get_current_span(third.run_start()[0]).get_span_context()
    assert (parent.trace_id, parent.span_id) == member_ids(RUN_ID, "run", "shard/0")


def test_a_segments_job_trace_holds_its_share_of_the_job_shard_not_of_the_run_shard():
    """8 ranks at a budget of 25, every group on: a rank's share of a segment's job trace is
    25 // 3 = 8 spans (3 ranks a shard), its share of the run trace 25 // 4 = 6 (4 ranks): the
    segment span and 7 job-level phases fit in the job trace, the 8th starts in the rank's own
    trace; 6 run-level spans fit in the run trace."""
    from otel_training import config

    segments, _ = _segments(25, 1000, config.SPAN_GROUP_PRESETS["all"], world=8, rank=1)
    placed = [segments.routed(1, True, now_ns=1)[0] for _ in range(9)]
    segment = next(iter(segments._open_spans))
    job_trace = segment.get_span_context().trace_id
    traces = [trace_api.get_current_span(c).get_span_context().trace_id for c in placed]
    assert traces[:7] == [job_trace] * 7 and job_trace not in traces[7:]
    run_trace = member_ids(RUN_ID, "run", "shard/0")[0]
    placed = [segments.run_start()[0] for _ in range(8)]
    traces = [trace_api.get_current_span(c).get_span_context().trace_id for c in placed]
    assert traces[:6] == [run_trace] * 6 and run_trace not in traces[6:]


def test_a_rank_keeps_counting_256_traces_the_run_and_the_open_segment_among_them():
    """After 300 segments, a rank counts the newest 256 traces, never forgetting the run's
    and the open segment's: their spans go on counting where they were."""
    segments, _ = _segments(4, 1)
    assert segments.run_start()[0] is KEPT  # rank 0 keeps the run trace: its run span is root
    for iteration in range(1, 301):
        segments.routed(iteration, True, now_ns=iteration)
        segments.routed(iteration, False, now_ns=iteration)
    assert len(segments._traces) == 256
    run_trace = member_ids(RUN_ID, "run", "shard/0")[0]
    placed = [segments.run_start()[0] for _ in range(4)]
    assert placed[:3] == [KEPT] * 3 and placed[3] is not KEPT  # 1 + 3 = the budget of 4
    assert trace_api.get_current_span(placed[3]).get_span_context().trace_id != run_trace
    segment = next(iter(segments._open_spans))
    job_trace = segment.get_span_context().trace_id
    placed = [segments.routed(300, True)[0] for _ in range(4)]
    traces = [trace_api.get_current_span(c).get_span_context().trace_id for c in placed]
    assert traces[:2] == [job_trace] * 2 and traces[2] != job_trace  # segment + 1 + 2 = 4


def test_an_iteration_that_fits_exactly_stays_in_the_step_trace_it_fills():
    """Iterations of 4 spans at a budget of 9 (no first-iteration wrapper): a segment is 2
    iterations, and its step trace holds both and its root, filled to the budget exactly (9
    spans), not one iteration per trace."""
    pipeline = _pipeline(9, "job,step,data_loading,forward_backward,optimizer")
    with ot.training_run():
        for it in range(1, 11):
            _iteration(it)
    spans = pipeline.spans.get_finished_spans()
    step_traces = [
        members
        for members in _by_trace(spans).values()
        if any(s.name == names.MEGATRON_TRAIN_ITERATION for s in members)
    ]
    assert [len(members) for members in step_traces] == [9] * 5


def test_segment_spans_take_their_times_from_the_process_clock(monkeypatch):
    """Without a time given, a segment span starts and ends at the process clock's now
    (otel_training.clock, the same anchor as every phase), not the SDK's."""
    from otel_training.trace import segments as module

    times = iter([7_000, 9_000])
    monkeypatch.setattr(module.clock, "now_ns", lambda: next(times))
    segments, exporter = _segments(25, 2)
    segments.routed(1, True)
    segments.close()
    (span,) = exporter.get_finished_spans()
    assert (span.start_time, span.end_time) == (7_000, 9_000)


def test_a_segment_span_ended_elsewhere_is_not_ended_again(caplog):
    """A segment span that something else ended (a shutdown, say) or that left the registry
    of open spans is closed without a second end() (the SDK would warn) and without a raise."""
    open_spans: dict = {}
    segments, exporter = _segments(25, 2, open_spans=open_spans)
    segments.routed(1, True, now_ns=1_000)
    (span,) = open_spans
    span.end(end_time=2_000)
    open_spans.clear()
    with caplog.at_level("WARNING"):
        segments.close()
    assert not caplog.records
    (ended,) = exporter.get_finished_spans()
    assert ended.end_time == 2_000


def test_a_rank_keeps_the_last_64_segments_it_opened():
    """Of the segments a rank opened, the newest 64 are kept (a segment opened again among
    them goes on counting); the oldest beyond them are forgotten."""
    from otel_training.trace import segments as module

    segments, _ = _segments(25, 1)
    for iteration in range(1, module._KEPT_SEGMENTS + 2):
        segments.routed(iteration, True, now_ns=iteration)
    kept = list(segments._families)
    assert kept == list(range(1, module._KEPT_SEGMENTS + 1))


def test_a_run_span_of_another_trace_does_not_become_the_runs_anchor():
    """run_started with a span of the run trace makes it the anchor the run's own traces link
    to; a span of another trace, or an invalid one, leaves the anchor as it was."""
    segments, _ = _segments(25, 2, world=2, rank=1)
    family = segments._run_family
    before = family.anchor
    segments.run_started(TracerProvider().get_tracer("other").start_span("elsewhere"))
    assert family.anchor is before
    segments.run_started(trace_api.INVALID_SPAN)
    assert family.anchor is before
    context, _ = segments.run_start()
    run = TracerProvider().get_tracer("run").start_span("run", context=context)
    segments.run_started(run)
    assert family.anchor == run.get_span_context()


def test_the_first_run_of_a_router_made_before_it_has_the_plain_names(monkeypatch):
    """A router made before any run began follows the process into its first run: the run
    trace is ``run`` (no prefix); into a second: ``run2/run``, with the run trace's share of
    the ranks (6 of 25 spans for each of 4 ranks of a shard at 8 ranks), not the job's."""
    from otel_training import config
    from otel_training.trace import segments as module

    monkeypatch.setattr(module, "_runs", 0)
    segments, _ = _segments(25, 1000, config.SPAN_GROUP_PRESETS["all"], world=8, rank=1)
    monkeypatch.setattr(module, "_runs", 1)
    parent = trace_api.get_current_span(segments.run_start()[0]).get_span_context()
    assert (parent.trace_id, parent.span_id) == member_ids(RUN_ID, "run", "shard/0")
    monkeypatch.setattr(module, "_runs", 2)
    placed = [segments.run_start()[0] for _ in range(8)]
    traces = [trace_api.get_current_span(c).get_span_context().trace_id for c in placed]
    second = member_ids(RUN_ID, "run2/run", "shard/0")[0]
    assert traces[:6] == [second] * 6 and second not in traces[6:]


@documents("spans.md", "When the keeper does not end its span (it was killed, or hangs)")
def test_without_its_keeper_a_shared_trace_has_no_root_and_the_step_traces_stay_whole():
    """Rank 1 of 2 alone (rank 0, the keeper, killed before it exported anything): its run and
    segment spans name the shared ids, which nothing exports, as their parents; each of its
    step traces is still whole."""
    pipeline = _pipeline(25, "per_step", RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    with ot.training_run():
        for it in range(1, 9):
            _iteration(it)
    spans = pipeline.spans.get_finished_spans()
    shared = {member_ids(RUN_ID, "run", "shard/0"), member_ids(RUN_ID, "segment/0", "shard/0")}
    shared.add(member_ids(RUN_ID, "segment/1", "shard/0"))
    waiting = [s for s in spans if s.parent is not None and s.parent.is_remote]
    assert {s.name for s in waiting} == {names.MEGATRON_TRAIN, SEGMENT}
    assert {(s.context.trace_id, s.parent.span_id) for s in waiting} == shared
    own = [s for s in spans if s.context.trace_id not in {t for t, _ in shared}]
    assert len(_by_trace(own)) >= 2
    _whole(own)
