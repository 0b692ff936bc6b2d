"""The roots of the derived traces (otel_training.trace.segments): who starts them, with which
ids, made as the SDK's tracer makes a span, once per process; and what a tracer that cannot
start them (not the SDK's, disabled, failing) leaves instead."""

from __future__ import annotations

import warnings

import pytest
from doc_rules import documents
from opentelemetry import trace as trace_api
from opentelemetry.sdk import trace as trace_sdk
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import Link
from support import unavailable

from otel_training import config
from otel_training.semconv import spans as names
from otel_training.trace import segments as module
from otel_training.trace.segments import KEPT, TraceSegments
from otel_training.trace.shape import TraceShape, member_ids

RUN_ID = "segments"
SEGMENT = names.MEGATRON_TRAIN_SEGMENT
ALL = config.SPAN_GROUP_PRESETS["all"]  # 8 ranks at 25: run shards of 4 ranks, job shards of 3


def _provider(**kwargs) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(**kwargs)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _segments(
    tracer, budget: int = 25, groups=("job",), world: int = 1, rank: int = 0, **kwargs
) -> TraceSegments:
    shape = TraceShape.derive(groups, world, budget, 1000)
    return TraceSegments(tracer, RUN_ID, shape, rank, kwargs.pop("sampler", ALWAYS_ON), **kwargs)


def _ids(family: str, member: str) -> tuple[int, int]:
    return member_ids(RUN_ID, family, member)


def _pair(context: trace_api.SpanContext) -> tuple[int, int]:
    return context.trace_id, context.span_id


def _parent(context) -> trace_api.SpanContext:
    """The span context a span started in ``context`` names as its parent."""
    return trace_api.get_current_span(context).get_span_context()


class _OtherTracer(trace_api.Tracer):
    """A tracer that is not the SDK's ``Tracer`` (a wrapper of the user's, say): it starts spans
    through the SDK's, so they are exported, but none with ids of our choosing."""

    def __init__(self, tracer: trace_api.Tracer, fail: int = 0) -> None:
        self._tracer = tracer
        self._fail = fail  # how many start_span calls raise first

    def start_span(self, *args, **kwargs):
        if self._fail:
            self._fail -= 1
            raise RuntimeError("cannot start a span")
        return self._tracer.start_span(*args, **kwargs)

    def start_as_current_span(self, *args, **kwargs):
        return self._tracer.start_as_current_span(*args, **kwargs)


def test_the_keepers_run_span_is_its_shards_root_with_the_shared_ids():
    """Rank 4 of 8 keeps the run trace's shard 1: its run span is that shard's root, with the
    shard's shared ids, a span of this process (not remote, nor are its children's parent),
    linked to shard 0's root, with the name, attributes and start time the phase gives. It is
    the phase's to end: segments opening and closing, the run's end and close() leave it open.
    Rank 0, the keeper of shard 0, links to nothing."""
    provider, exporter = _provider()
    tracer = provider.get_tracer("test")
    segments = _segments(tracer, groups=ALL, world=8, rank=4)
    context, links = segments.run_start(2_000)
    assert context is KEPT
    assert [_pair(link.context) for link in links] == [_ids("run", "shard/0")]
    run = segments.start_kept(names.MEGATRON_TRAIN, links, {"dl.rank": 4}, 3_000)
    segments.run_started(run)
    child_context, _ = segments.nested(run, trace_api.set_span_in_context(run))
    tracer.start_span(names.MEGATRON_STARTUP, child_context).end(end_time=4_000)
    segments.routed(1, True, now_ns=5_000)
    segments.routed(1001, True, now_ns=6_000)  # the next segment
    segments.end_run(7_000)
    segments.close()
    assert run.end_time is None
    run.end(end_time=8_000)
    startup, *_, ended = exporter.get_finished_spans()
    assert ended.name == names.MEGATRON_TRAIN and ended.parent is None
    assert _pair(ended.context) == _ids("run", "shard/1") and ended.context.is_remote is False
    assert startup.parent == ended.context and startup.parent.is_remote is False
    assert [_pair(link.context) for link in ended.links] == [_ids("run", "shard/0")]
    assert dict(ended.attributes) == {"dl.rank": 4}
    assert (ended.start_time, ended.end_time) == (3_000, 8_000)
    keeper = _segments(tracer, groups=ALL, world=8, rank=0)
    assert keeper.run_start(2_000) == (KEPT, None)


def test_a_run_span_given_no_time_starts_at_the_process_clocks_now(monkeypatch):
    """start_kept without a start time (nor links, nor attributes) starts the run span at the
    process clock's now (otel_training.clock, as every phase), not the SDK's."""
    monkeypatch.setattr(module.clock, "now_ns", lambda: 7_000)
    provider, exporter = _provider()
    segments = _segments(provider.get_tracer("test"))
    segments.run_start()
    segments.start_kept(names.MEGATRON_TRAIN, None, None, None).end(end_time=9_000)
    (run,) = exporter.get_finished_spans()
    assert (run.start_time, run.parent, list(run.links)) == (7_000, None, [])


def test_the_roots_are_made_as_the_tracer_makes_a_span():
    """The run, segment and step-trace roots, which no tracer call can make with their ids,
    carry what a span of the same tracer carries: the provider's resource and span limits (one
    link, one attribute here), the tracer's instrumentation scope; and their contexts are this
    process's own (not remote)."""
    provider, exporter = _provider(
        resource=Resource({"service.name": "trainer"}),
        span_limits=SpanLimits(max_links=1, max_span_attributes=1),
    )
    tracer = provider.get_tracer("test", "1.2")
    segments = _segments(tracer)
    segments.run_start(1_000)
    links = [Link(_other_context(1)), Link(_other_context(2))]
    run = segments.start_kept(names.MEGATRON_TRAIN, links, {"a": 1, "b": 2}, 1_000)
    segments.run_started(run)
    segments.routed(1, True, now_ns=2_000)
    segments.routed(1, False, now_ns=3_000)
    segments.close()
    run.end(end_time=4_000)
    tracer.start_span("probe", links=links, attributes={"a": 1, "b": 2}).end()
    *roots, probe = exporter.get_finished_spans()
    assert sorted(s.name for s in roots) == [names.MEGATRON_TRAIN] + [SEGMENT] * 2
    for root in roots:
        assert root.parent is None and root.context.is_remote is False, root.name
        assert root.resource is probe.resource
        assert root.instrumentation_scope == probe.instrumentation_scope
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert root.instrumentation_info == probe.instrumentation_info
    run = next(s for s in roots if s.name == names.MEGATRON_TRAIN)
    assert len(run.links) == len(probe.links) == 1
    assert len(run.attributes) == len(probe.attributes) == 1


def _other_context(span_id: int) -> trace_api.SpanContext:
    return trace_api.SpanContext(0xABC, span_id, True, trace_api.TraceFlags(1))


@documents("spans.md", "Sampling is decided once per family, at the head, alike on every rank")
def test_a_family_the_sampler_drops_keeps_its_ids():
    """A sampler that drops every family: nothing is exported, yet the keeper's run and segment
    spans carry their shards' shared ids and a step trace's spans name its root's derived ids,
    each unsampled, so that what names them (a child, a log record's trace context) names the
    same span on every rank."""
    provider, exporter = _provider(sampler=ALWAYS_OFF)
    segments = _segments(provider.get_tracer("test"), sampler=ALWAYS_OFF)
    segments.run_start(1_000)
    run = segments.start_kept(names.MEGATRON_TRAIN, None, None, 1_000)
    segments.run_started(run)
    job, _ = segments.routed(1, True, now_ns=2_000)
    step, _ = segments.routed(1, False, now_ns=3_000)
    segments.close()
    run.end()
    assert exporter.get_finished_spans() == ()
    expected = [_ids("run", "shard/0"), _ids("segment/0", "shard/0")]
    expected.append(_ids("segment/0", "rank/0/part/0"))
    contexts = [run.get_span_context(), _parent(job), _parent(step)]
    assert [_pair(c) for c in contexts] == expected
    assert not any(c.trace_flags.sampled or c.is_remote for c in contexts)


def test_a_disabled_tracer_starts_no_root_either():
    """A tracer that the SDK's tracer configurator disables starts no span, and the roots that
    the router makes itself are none either: nothing is exported."""
    disable = getattr(trace_sdk, "_disable_tracer_configurator", None)
    if disable is None:
        unavailable("this opentelemetry-sdk has no tracer configurator")
    provider, exporter = _provider(_tracer_configurator=disable)
    segments = _segments(provider.get_tracer("test"))
    segments.run_start(1_000)
    run = segments.start_kept(names.MEGATRON_TRAIN, None, None, 1_000)
    segments.run_started(run)
    segments.routed(1, True, now_ns=2_000)
    segments.routed(1, False, now_ns=3_000)
    segments.close()
    run.end()
    assert exporter.get_finished_spans() == ()


@documents("spans.md", "a pipeline built again by a second `configure()` within a run")
def test_a_second_pipeline_in_a_run_starts_under_the_roots_already_started():
    """A second router of the same run in one process (a second configure()): its run span
    starts under the run trace's root (the first's), with the name, links, attributes and start
    time the phase gives; its segment span under the first's; its steps in step trace part 1,
    whose root it starts (part 0's is the first's). No span id is exported twice, and every
    trace has one root."""
    provider, exporter = _provider()
    tracer = provider.get_tracer("test")
    routers = [_segments(tracer), _segments(tracer)]
    runs = []
    for k, segments in enumerate(routers):
        assert segments.run_start(1_000 + k)[0] is KEPT
        link = [Link(_other_context(k + 1))]
        runs.append(segments.start_kept(names.MEGATRON_TRAIN, link, {"k": k}, 1_000 + k))
        segments.run_started(runs[-1])
        segments.routed(1, True, now_ns=2_000 + k)
        segments.routed(1, False, now_ns=3_000 + k)
    for segments, run in zip(routers, runs, strict=True):
        segments.close()
        run.end(end_time=9_000)
    spans = exporter.get_finished_spans()
    first, second = (s for s in spans if s.name == names.MEGATRON_TRAIN)
    assert first.parent is None and _pair(first.context) == _ids("run", "shard/0")
    assert _pair(second.parent) == _pair(first.context) and second.parent.is_remote
    assert [link.context for link in second.links] == [_other_context(2)]
    assert (dict(second.attributes), second.start_time) == ({"k": 1}, 1_001)
    segment_roots = [s for s in spans if s.name == SEGMENT and s.parent is None]
    assert sorted(_pair(s.context) for s in segment_roots) == sorted(
        [_ids("segment/0", "shard/0"), _ids("segment/0", "rank/0/part/0")]
        + [_ids("segment/0", "rank/0/part/1")]
    )
    assert len({_pair(s.context) for s in spans}) == len(spans) == 6
    roots = [s.context.trace_id for s in spans if s.parent is None]
    assert len(roots) == len(set(roots)) == len({s.context.trace_id for s in spans})


def test_a_process_remembers_the_newest_roots_it_started(monkeypatch):
    """Of the roots it started, a process remembers the newest (4096; 3 here): a second
    pipeline that opens a segment among them starts its segment span under that root; one
    older than them is forgotten, and started as a root again."""
    monkeypatch.setattr(module, "_KEPT_ROOTS", 3)
    provider, exporter = _provider()
    tracer = provider.get_tracer("test")
    segments = _segments(tracer, budget=25)
    for iteration in (1, 1001, 2001, 3001):  # segments 0 to 3: four roots
        segments.routed(iteration, True, now_ns=iteration)
    segments.close()
    again = _segments(tracer, budget=25)
    again.routed(1001, True, now_ns=5_000)  # segment 1, among the newest 3
    again.routed(1, True, now_ns=6_000)  # segment 0, the oldest
    again.close()
    spans = {
        (s.start_time, s.attributes["otel_training.trace.segment"]): s
        for s in exporter.get_finished_spans()
    }
    assert spans[(5_000, 1)].parent.span_id == _ids("segment/1", "shard/0")[1]
    assert spans[(6_000, 0)].parent is None
    assert _pair(spans[(6_000, 0)].context) == _ids("segment/0", "shard/0")


@pytest.mark.parametrize(
    ("exports", "run_keepers", "job_keepers"),
    [
        (None, {0, 4}, {0, 3, 6}),
        (lambda rank: rank % 4 != 0, {1, 5}, {1, 3, 6}),
        (lambda rank: rank in (2, 7), {2, 7}, {2, 3, 7}),
        (lambda rank: False, {0, 4}, {0, 3, 6}),
        (lambda rank: 1 // 0, {0, 4}, {0, 3, 6}),
    ],
    ids=["no policy", "not the first of 4", "ranks 2 and 7", "none", "raising"],
)
def test_a_shard_is_kept_by_its_first_rank_that_exports(exports, run_keepers, job_keepers):
    """8 ranks, every group on, at a budget of 25 (the run trace in shards of ranks 0-3 and
    4-7, the job trace in 0-2, 3-5 and 6-7): each shard's keeper, whose run or segment span is
    the shard's root, is its first rank that the export policy says exports; the first rank
    when none does, when the policy raises, or without a policy."""
    kept_run, kept_job = set(), set()
    for rank in range(8):
        module._reset_runs()  # each rank is a process of its own
        provider, exporter = _provider()
        segments = _segments(
            provider.get_tracer("test"), groups=ALL, world=8, rank=rank, exports=exports
        )
        if segments.run_start(1_000)[0] is KEPT:
            kept_run.add(rank)
        segments.routed(1, True, now_ns=2_000)
        segments.close()
        (segment,) = exporter.get_finished_spans()
        if segment.parent is None:
            kept_job.add(rank)
    assert (kept_run, kept_job) == (run_keepers, job_keepers)


@documents("spans.md", "cannot start a span with the derived ids")
def test_with_a_tracer_not_the_sdks_step_traces_name_the_segment_span():
    """A tracer that is not the SDK's: the run and segment spans name their shards' shared ids
    (nothing exports a root there); a step trace's spans name the rank's segment span as their
    parent, in the step trace's own trace id, and its first span links to it; a child beyond
    its parent's room names its real parent, in the rank's next step trace, whose first span
    links to the segment span. A step trace holds the budget (4), no root among them."""
    provider, exporter = _provider()
    segments = _segments(_OtherTracer(provider.get_tracer("test")), budget=4)
    context, links = segments.run_start(1_000)
    run = segments.start_kept(names.MEGATRON_TRAIN, links, None, 1_000)
    segments.run_started(run)
    assert run.parent is not None and _pair(run.parent) == _ids("run", "shard/0")
    placed = [segments.routed(1, False, now_ns=2_000) for _ in range(3)]
    segment = next(iter(segments._open_spans))
    anchor = segment.get_span_context()
    assert _pair(segment.parent) == _ids("segment/0", "shard/0")
    part = [_ids("segment/0", f"rank/0/part/{k}")[0] for k in range(2)]
    for k, (context, links) in enumerate(placed):
        parent = _parent(context)
        assert (parent.trace_id, parent.span_id) == (part[0], anchor.span_id)
        assert parent.is_remote and parent.trace_flags.sampled
        assert [link.context for link in links or ()] == ([anchor] if k == 0 else [])
    iteration = provider.get_tracer("test").start_span("iteration", placed[-1][0])
    children = [segments.nested(iteration, placed[-1][0]) for _ in range(3)]
    assert children[0] == (placed[-1][0], None)  # the 4th span of part 0
    for k, (context, links) in enumerate(children[1:]):
        parent = _parent(context)
        assert (parent.trace_id, parent.span_id) == (part[1], iteration.get_span_context().span_id)
        assert parent.is_remote and parent.trace_flags.sampled
        assert [link.context for link in links or ()] == ([anchor] if k == 0 else [])


def test_a_segment_span_that_cannot_start_routes_nothing_and_raises_nothing():
    """A tracer whose start_span raises when the segment span starts: that phase is not routed
    ((None, None): it starts where it would without routing), nothing raises, and the next
    segment opens as usual."""
    provider, exporter = _provider()
    segments = _segments(_OtherTracer(provider.get_tracer("test"), fail=1), budget=25)
    assert segments.routed(1, True, now_ns=1_000) == (None, None)
    context, _ = segments.routed(1001, True, now_ns=2_000)
    segments.close()
    (segment,) = exporter.get_finished_spans()
    assert _parent(context) == segment.context
    assert segment.attributes["otel_training.trace.segment"] == 1


@documents(
    "spans.md", "(the same segment number, from the trace's first span to the segment's end)"
)
def test_a_step_traces_root_lasts_from_its_first_span_to_its_segments_end(monkeypatch):
    """A step trace's root starts with the first span routed to it, at that span's start (the
    process clock's now when none is given), and ends with its segment: when the next segment
    opens, or at the run's end, at that time."""
    monkeypatch.setattr(module.clock, "now_ns", lambda: 4_000)
    provider, exporter = _provider()
    segments = _segments(provider.get_tracer("test"))
    segments.routed(1, False, now_ns=1_000)
    segments.routed(1001, False)  # segment 1, at the process clock's now
    segments.end_run(9_000)
    roots = [s for s in exporter.get_finished_spans() if s.parent is None]
    times = {_pair(s.context): (s.start_time, s.end_time) for s in roots}
    assert times[_ids("segment/0", "rank/0/part/0")] == (1_000, 4_000)
    assert times[_ids("segment/1", "rank/0/part/0")] == (4_000, 9_000)
