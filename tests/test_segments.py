"""Trace segments (otel_training.segments): ids every rank derives alike from the run id, as
docs/spans.md writes them, and this rank's segment spans, one per N iterations, ended, linked and
registered as open in order."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Decision, Sampler
from opentelemetry.sdk.trace.sampling import SamplingResult as SdkSamplingResult
from opentelemetry.trace import TraceFlags

from otel_training.segments import TraceSegments, derived_ids

DOC = (Path(__file__).resolve().parent.parent / "docs" / "spans.md").read_text()
RUN = "20261201-091143-a3f9c1-a1"


def _sha256_ids(text: str) -> tuple[int, int]:
    """The first 32 and next 16 hex digits of SHA-256 of ``text``, as numbers."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    return int(digest[:32], 16), int(digest[32:48], 16)


def test_the_ids_are_sha256_of_the_run_and_part_as_docs_spans_md_says():
    """docs/spans.md: "The ids are SHA-256 of `otel-training/{run id}/{part}`": 16 bytes of
    trace id, the next 8 of span id, the same for any rank that computes them."""
    assert "The ids are SHA-256 of `otel-training/{run id}/{part}`." in DOC
    for part in ("run", "segment/0", "segment/41"):
        assert derived_ids(RUN, part) == _sha256_ids(f"otel-training/{RUN}/{part}")
    assert derived_ids(RUN, "run") != derived_ids(RUN + "x", "run")


class RecordingSampler(Sampler):
    """Keeps (trace id, name) of every decision; samples trace ids whose low bit is set."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, str]] = []

    def should_sample(self, parent_context, trace_id, name, *args, **kwargs):
        self.asked.append((trace_id, name))
        decision = Decision.RECORD_AND_SAMPLE if trace_id & 1 else Decision.DROP
        return SdkSamplingResult(decision)

    def get_description(self) -> str:
        return "RecordingSampler"


def _segments(n: int = 2, sampler: Sampler = ALWAYS_ON, **kwargs):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    segments = TraceSegments(provider.get_tracer("test"), RUN, n, sampler, **kwargs)
    return segments, exporter


def _parent(context) -> trace_api.SpanContext:
    return trace_api.get_current_span(context).get_span_context()


def test_the_run_context_is_the_shared_remote_parent_with_the_samplers_decision():
    """The run trace's parent: the derived ids of "run", remote, sampled as the pipeline's
    sampler decides on the derived trace id (asked with the part's name)."""
    trace_id, span_id = _sha256_ids(f"otel-training/{RUN}/run")
    sampler = RecordingSampler()
    segments, _ = _segments(sampler=sampler)
    parent = _parent(segments.run_context())
    assert (parent.trace_id, parent.span_id, parent.is_remote) == (trace_id, span_id, True)
    assert sampler.asked == [(trace_id, "run")]
    expected = TraceFlags.SAMPLED if trace_id & 1 else TraceFlags.DEFAULT
    assert parent.trace_flags == expected
    for choice, flags in ((ALWAYS_ON, TraceFlags.SAMPLED), (ALWAYS_OFF, TraceFlags.DEFAULT)):
        assert _parent(_segments(sampler=choice)[0].run_context()).trace_flags == flags


def test_iterations_form_segments_of_n():
    """Iterations s*N+1 .. (s+1)*N are segment s; N below 1 counts as 1."""
    segments, _ = _segments(n=3)
    assert [segments.segment_of(i) for i in (1, 2, 3, 4, 6, 7, 0)] == [0, 0, 0, 1, 1, 2, 0]
    ones, _ = _segments(n=0)
    assert [ones.segment_of(i) for i in (1, 2, 3)] == [0, 1, 2]


def test_segment_spans_start_under_the_shared_parent_and_end_when_the_next_starts():
    """A segment span per segment, in the segment's derived trace under its shared parent,
    with its number; it ends at the instant the next one starts, links to the previous one
    and to the run span, and is registered as open only while it is."""
    open_spans: dict = {}
    segments, exporter = _segments(n=2, open_spans=open_spans)
    run_span = TracerProvider().get_tracer("run").start_span("megatron.train")
    segments.run_span = run_span
    first = segments.context_for(1)
    assert segments.context_for(2) is first  # the same segment: the same context
    span = trace_api.get_current_span(first)
    assert list(open_spans) == [span]
    second = segments.context_for(3)
    assert list(open_spans) == [trace_api.get_current_span(second)]
    segments.close()
    assert open_spans == {}
    ended = exporter.get_finished_spans()
    assert [s.name for s in ended] == ["megatron.train.segment"] * 2
    assert [s.attributes["otel_training.trace.segment"] for s in ended] == [0, 1]
    for number, s in enumerate(ended):
        trace_id, span_id = _sha256_ids(f"otel-training/{RUN}/segment/{number}")
        assert (s.context.trace_id, s.parent.span_id, s.parent.is_remote) == (
            trace_id,
            span_id,
            True,
        )
    assert ended[0].end_time == ended[1].start_time
    assert [link.context for link in ended[0].links] == [run_span.get_span_context()]
    assert [link.context for link in ended[1].links] == [
        ended[0].context,
        run_span.get_span_context(),
    ]


def test_close_is_idempotent_and_a_closed_segment_opens_anew(caplog):
    """close() twice ends the segment span once (no warning of a second end); a later
    iteration of the same segment starts a new segment span."""
    segments, exporter = _segments(n=10)
    segments.context_for(1)
    with caplog.at_level(logging.WARNING):
        segments.close()
        segments.close()
    assert caplog.records == []
    reopened = segments.context_for(2)
    assert trace_api.get_current_span(reopened).is_recording()
    segments.close()
    assert len(exporter.get_finished_spans()) == 2


def test_a_segment_span_ended_elsewhere_is_not_ended_again(caplog):
    """A segment span that something else ended (shutdown ends open spans) is not ended a
    second time when the next segment starts."""
    segments, exporter = _segments(n=1)
    trace_api.get_current_span(segments.context_for(1)).end()
    with caplog.at_level(logging.WARNING):
        segments.context_for(2)
    assert caplog.records == []
    assert len(exporter.get_finished_spans()) == 1


def test_without_segment_spans_phases_start_under_the_segments_shared_parent():
    """With the group job off (segment_spans=False), the context of an iteration holds the
    segment's shared remote parent: still the segment's trace, no span of this rank's."""
    segments, exporter = _segments(n=2, segment_spans=False)
    trace_id, span_id = _sha256_ids(f"otel-training/{RUN}/segment/1")
    parent = _parent(segments.context_for(4))
    assert (parent.trace_id, parent.span_id, parent.is_remote) == (trace_id, span_id, True)
    segments.close()
    assert exporter.get_finished_spans() == ()
    default, _ = _segments()
    assert trace_api.get_current_span(default.context_for(1)).is_recording()


class FailingTracer:
    """A tracer whose spans cannot start the first ``failures`` times."""

    def __init__(self, failures: int = 10**9) -> None:
        self.failures = failures
        self.tracer = TracerProvider().get_tracer("x")

    def start_span(self, *args, **kwargs):
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("no span today")
        return self.tracer.start_span(*args, **kwargs)


def test_a_segment_span_that_cannot_start_gives_no_context_and_is_tried_again():
    """When the tracer raises, context_for returns None (the phase keeps its own context),
    never raises, and the next phase of the segment tries again."""
    segments = TraceSegments(FailingTracer(), RUN, 2, ALWAYS_ON)
    assert segments.context_for(1) is None and segments.context_for(2) is None
    segments.close()
    once = TraceSegments(FailingTracer(failures=1), RUN, 2, ALWAYS_ON)
    assert once.context_for(1) is None
    assert trace_api.get_current_span(once.context_for(2)).is_recording()


def test_run_level_parents_are_the_run_span_or_none():
    """A phase belongs to the run when its parent is this rank's run span or no span at all;
    under any other span it does not."""
    segments, _ = _segments()
    tracer = TracerProvider().get_tracer("x")
    segments.run_span = tracer.start_span("megatron.train")
    assert segments.is_run_level(segments.run_span)
    assert segments.is_run_level(trace_api.INVALID_SPAN)
    assert segments.is_run_level(trace_api.NonRecordingSpan(trace_api.INVALID_SPAN_CONTEXT))
    assert not segments.is_run_level(tracer.start_span("megatron.train.iteration"))


@pytest.mark.parametrize("n", [1, 1000])
def test_every_rank_derives_the_same_segment_parents(n):
    """Two ranks (two pipelines) of one run put the same iteration under the same shared
    parent, whatever their own span ids."""
    first, _ = _segments(n=n, segment_spans=False)
    second, _ = _segments(n=n, segment_spans=False)
    for iteration in (1, n, n + 1, 5 * n + 3):
        assert _parent(first.context_for(iteration)) == _parent(second.context_for(iteration))
