"""A span with no room in its parent's trace (otel_training.trace.segments): it starts in the
rank's current step trace of its parent's family, under that trace's root, linked to its real
parent; a run-level parent's goes to the open segment's (segment 0's when none is open yet)."""

from __future__ import annotations

import collections
import threading

import pytest
from doc_rules import documents
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from otel_training.semconv import spans as names
from otel_training.trace import segments as module
from otel_training.trace.segments import KEPT, TraceSegments
from otel_training.trace.shape import TraceShape, member_ids

RUN_ID = "segments"
SEGMENT = names.MEGATRON_TRAIN_SEGMENT
SEGMENT_ATTRIBUTE = "otel_training.trace.segment"


def _segments(budget: int, segment_limit: int = 1000, groups=("job",)):
    """A TraceSegments of rank 0 of 1 over an in-memory exporter, and the tracer."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    shape = TraceShape.derive(groups, 1, budget, segment_limit)
    return TraceSegments(tracer, RUN_ID, shape, 0, ALWAYS_ON), exporter, tracer


def _parent(context) -> trace_api.SpanContext:
    """The span context a span started in ``context`` names as its parent."""
    return trace_api.get_current_span(context).get_span_context()


def _ids(family: str, member: str) -> tuple[int, int]:
    return member_ids(RUN_ID, family, member)


@documents("spans.md", "(at B = 1, its root and one span)")
def test_at_a_budget_of_one_every_span_still_starts():
    """At a budget of 1 span per trace (the least the setting takes) a step trace's root fills
    it: a phase of an iteration, and a child beyond its parent's room, each start in a step
    trace of the rank's own under its root (2 spans, the least a rooted trace holds), linked to
    its real parent, instead of waiting for room that never comes."""
    segments, exporter, tracer = _segments(1)
    placed: list = []

    def place() -> None:
        context, _ = segments.routed(1, False, now_ns=1)
        parent = tracer.start_span("parent", context=context)
        moved, links = segments.nested(parent, context, now_ns=2)
        tracer.start_span("child", context=moved, links=links).end()
        parent.end()
        placed.append((context, parent, moved, links))

    worker = threading.Thread(target=place, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "a span waits for room that never comes"
    ((context, parent, moved, links),) = placed
    roots = {(c.trace_id, c.span_id) for c in (_parent(context), _parent(moved))}
    own = {_ids("segment/0", f"rank/0/part/{k}") for k in range(4)}
    assert len(roots) == 2 and roots <= own
    assert [link.context for link in links] == [parent.get_span_context()]
    segments.close()
    counts = collections.Counter(s.context.trace_id for s in exporter.get_finished_spans())
    assert [counts[trace] for trace, _ in roots] == [2, 2] and max(counts.values()) == 2


def _run(segments: TraceSegments, now_ns: int) -> trace_api.Span:
    """The rank's run span, started as the run phase starts it (rank 0 keeps the run trace)."""
    context, links = segments.run_start(now_ns)
    run = segments.start_kept(names.MEGATRON_TRAIN, links, None, now_ns)
    segments.run_started(run)
    return run


@documents(
    "spans.md", "for a run-level parent, the open segment's, segment 0's when none is open yet"
)
def test_phases_without_a_parent_nest_under_the_run_span_then_open_segment_0():
    """With the run span open and no segment yet, a phase with no parent (one started on
    another thread, say) nests under the rank's run span while its share of the run trace
    lasts (4: the run span and 3 more); beyond it segment 0 opens at that phase's start, its
    span and its step trace's root starting then, and the phases start in its step traces (4
    spans each, the root among them) under their roots, each linked to the run span."""
    segments, exporter, tracer = _segments(4)
    run = _run(segments, 1_000)
    placed = [segments.nested(trace_api.INVALID_SPAN, None, now_ns=5_000 + k) for k in range(8)]
    for context, links in placed[:3]:
        assert _parent(context) == run.get_span_context() and links is None
    parts = [_ids("segment/0", f"rank/0/part/{p}") for p in (0, 0, 0, 1, 1)]
    for (context, links), part in zip(placed[3:], parts, strict=True):
        assert (_parent(context).trace_id, _parent(context).span_id) == part
        assert [link.context for link in links] == [run.get_span_context()]
    segments.close()
    finished = exporter.get_finished_spans()
    assert [(s.attributes[SEGMENT_ATTRIBUTE], s.start_time) for s in finished] == [
        (0, 5_003),  # the segment span, then its step traces' roots
        (0, 5_003),
        (0, 5_006),
    ]
    assert (finished[0].context.trace_id, finished[0].context.span_id) == _ids(
        "segment/0", "shard/0"
    )


def test_a_child_of_an_earlier_segment_stays_in_that_segments_traces():
    """The stages of a save of segment 0 that outlast its room after segment 1 opened (an
    asynchronous save): those beyond the rank's share of segment 0's job trace (4: its segment
    span, the save, 2 stages) start in segment 0's step trace, under its root, linked to the
    save; not in segment 1's, so that a sampler keeps or drops them with the save (every trace
    of a family has the family's low trace-id bits)."""
    segments, exporter, tracer = _segments(4, segment_limit=1)
    context, _ = segments.routed(1, True, now_ns=1_000)
    save = tracer.start_span(names.MEGATRON_CHECKPOINT_SAVE, context)
    segments.routed(2, False, now_ns=2_000)  # segment 1 opens, and its step trace
    in_save = trace_api.set_span_in_context(save)
    stages = [segments.nested(save, in_save, now_ns=3_000) for _ in range(4)]
    assert stages[:2] == [(in_save, None)] * 2
    for context, links in stages[2:]:
        parent = _parent(context)
        assert (parent.trace_id, parent.span_id) == _ids("segment/0", "rank/0/part/0")
        assert [link.context for link in links] == [save.get_span_context()]


def test_job_level_phases_beyond_the_share_start_in_the_step_trace_linked_to_the_segment_span():
    """Job-level phases of a segment beyond the rank's share of its job trace (4: its segment
    span and 3) start in the rank's step trace of the segment, under its root, which starts
    with the first of them, each linked to their real parent, the rank's segment span."""
    segments, exporter, tracer = _segments(4)
    placed = [segments.routed(1, True, now_ns=1_000 + k) for k in range(5)]
    segment = next(iter(segments._open_spans)).get_span_context()
    for context, links in placed[:3]:
        assert _parent(context) == segment and links is None
    for context, links in placed[3:]:
        parent = _parent(context)
        assert (parent.trace_id, parent.span_id) == _ids("segment/0", "rank/0/part/0")
        assert [link.context for link in links] == [segment]
    segments.close()
    root = exporter.get_finished_spans()[-1]
    assert (root.context.trace_id, root.context.span_id) == _ids("segment/0", "rank/0/part/0")
    assert root.start_time == 1_003


def test_a_run_span_beyond_the_share_is_linked_to_the_shared_parent_it_would_name():
    """Run spans beyond the rank's share of the run trace (2 here) start in segment 0's step
    trace (segment 0 opening at that start), linked to their real parent: the run trace
    shard's shared parent."""
    segments, exporter, tracer = _segments(2)
    placed = [segments.run_start(1_000 + k) for k in range(3)]
    assert [context for context, _ in placed[:2]] == [KEPT, KEPT]
    context, links = placed[2]
    parent = _parent(context)
    assert (parent.trace_id, parent.span_id) == _ids("segment/0", "rank/0/part/0")
    assert [(k.context.trace_id, k.context.span_id) for k in links] == [_ids("run", "shard/0")]
    segments.close()
    segment = exporter.get_finished_spans()[0]
    assert (segment.attributes[SEGMENT_ATTRIBUTE], segment.start_time) == (0, 1_002)


@pytest.mark.parametrize("first", ["a phase with no parent", "a phase of iteration 1"])
def test_after_a_new_run_begins_nothing_goes_to_the_run_before(monkeypatch, first):
    """The first run of a process, its run span and segment 0 open; the second run begins
    (its run span not yet started). A phase with no parent nests under nothing of the first
    run (it starts where it would without routing); a phase of iteration 1 opens the second
    run's segment 0 (``run2/segment/0``), not the first's, still open."""
    monkeypatch.setattr(module, "_runs", 1)
    segments, exporter, tracer = _segments(25)
    _run(segments, 1_000)
    segments.routed(1, True, now_ns=2_000)
    monkeypatch.setattr(module, "_runs", 2)
    if first == "a phase with no parent":
        assert segments.nested(trace_api.INVALID_SPAN, None, now_ns=3_000) == (None, None)
    else:
        parent = _parent(segments.routed(1, True, now_ns=3_000)[0])
        assert (parent.trace_id, parent.span_id) == _ids("run2/segment/0", "shard/0")
