"""A span with no room in its parent's trace (otel_training.trace.segments): it starts in the
rank's current step trace of its parent's family, under that trace's root, linked to its real
parent; a run-level parent's goes to the open segment's (segment 0's when none is open yet)."""

from __future__ import annotations

import threading

from doc_rules import documents
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from otel_training.semconv import spans as names
from otel_training.trace.segments import TraceSegments
from otel_training.trace.shape import TraceShape, member_ids

RUN_ID = "segments"
SEGMENT = names.MEGATRON_TRAIN_SEGMENT


def _segments(budget: int, segment_limit: int = 1000, groups=("job",), world: int = 1, rank=0):
    """A TraceSegments of ``rank`` of ``world`` over an in-memory exporter, and the tracer."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    shape = TraceShape.derive(groups, world, budget, segment_limit)
    return TraceSegments(tracer, RUN_ID, shape, rank, ALWAYS_ON), exporter, tracer


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
        placed.append((context, parent, segments.nested(parent, context, now_ns=2)))

    worker = threading.Thread(target=place, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "a span waits for room that never comes"
    ((context, parent, (moved, links)),) = placed
    roots = {(c.trace_id, c.span_id) for c in (_parent(context), _parent(moved))}
    own = {_ids("segment/0", f"rank/0/part/{k}") for k in range(4)}
    assert len(roots) == 2 and roots <= own
    assert [link.context for link in links] == [parent.get_span_context()]
