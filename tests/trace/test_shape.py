"""The trace shape's derivations (otel_training.trace.shape), each checked against a search or a
hash computed here: segment length, shards, the span tables, the ids."""

from __future__ import annotations

import hashlib

from doc_rules import documents
from hypothesis import given
from hypothesis import strategies as st

from otel_training import config
from otel_training.semconv.spans import SPAN_GROUP_LEVELS, SPANS
from otel_training.trace.shape import (
    JOB_LEVEL_SPANS,
    ONCE_PER_ITERATION,
    ONCE_PER_RUN,
    PER_CALL,
    STEP_TRACE_ONCE,
    Shards,
    TraceShape,
    member_ids,
)

GROUPS = sorted(SPAN_GROUP_LEVELS)


@documents(
    "spans.md",
    "j = its segment span and one of each span of the `checkpoint` and `evaluate` groups",
)
@documents("spans.md", "s = the once-per-iteration spans recorded")
def test_the_span_tables_split_the_registry():
    """Every span of the registry is in exactly one table, and the tables hold the spans the
    phase API makes once per iteration, once per run, once per segment or per call."""
    tables = [ONCE_PER_ITERATION, STEP_TRACE_ONCE, JOB_LEVEL_SPANS, ONCE_PER_RUN, PER_CALL]
    assert sum(len(t) for t in tables) == len(SPANS)
    assert frozenset().union(*tables) == frozenset(SPANS)
    assert ONCE_PER_ITERATION == {
        "megatron.train.iteration",
        "megatron.train.iteration.data_loading",
        "megatron.train.iteration.forward_backward",
        "megatron.train.iteration.optimizer",
    }
    assert STEP_TRACE_ONCE == {"megatron.train.first_iteration"}
    assert JOB_LEVEL_SPANS == {
        "megatron.train.segment",
        "megatron.checkpoint.save",
        "megatron.checkpoint.save.state_dict",
        "megatron.checkpoint.save.io_write",
        "megatron.checkpoint.save.finalize",
        "megatron.evaluate",
        "megatron.evaluate.step",
    }
    assert ONCE_PER_RUN == {
        "megatron.train",
        "megatron.startup",
        "megatron.startup.model_init",
        "megatron.startup.dataloader",
        "megatron.checkpoint.load",
        "megatron.checkpoint.load.io_read",
    }
    assert {SPANS[name].group for name in PER_CALL} == {
        "communication",
        "microbatch",
        "layer",
        "activation_offload",
    }


def _longest(budget: int, per_iteration: int, once: int, limit: int) -> int:
    """The most iterations (at most ``limit``, at least 1) whose spans (and ``once`` more)
    fit ``budget``, by counting up."""
    n = 1
    while n < limit and once + per_iteration * (n + 1) <= budget:
        n += 1
    return n


@documents("spans.md", "N = min(L, max(1, ⌊(B − c − r) / s⌋)), N = L when s = 0")
@documents("spans.md", "r = 1 for the step trace's root span when the group `job` records")
@documents("spans.md", "s = the once-per-iteration spans recorded")
@given(
    st.sets(st.sampled_from(GROUPS)),
    st.integers(1, 3000),
    st.integers(1, 400),
)
def test_the_segment_length_is_the_longest_that_fits_the_budget(groups, budget, limit):
    """N: the most iterations, up to the limit, whose once-per-iteration spans (and the first
    iteration's wrapper, and the step trace's root span with the group job) fit the budget; at
    least 1; the limit when no such span records."""
    shape = TraceShape.derive(groups, 8, budget, limit)
    per_iteration = sum(1 for n in ONCE_PER_ITERATION if SPANS[n].group in groups)
    once = 1 if "first_iteration" in groups else 0
    root = 1 if "job" in groups else 0
    assert (shape.step_spans, shape.step_once) == (per_iteration, once)
    if per_iteration == 0:
        assert shape.segment_iterations == limit
    else:
        assert shape.segment_iterations == _longest(budget, per_iteration, once + root, limit)


def _fewest_shards(budget: int, world: int, per_rank: int) -> int:
    """The fewest shards of (nearly) equal, consecutive ranks whose ranks times ``per_rank``
    fit ``budget``, by trying each count; one rank per shard when none fits."""
    for count in range(1, world + 1):
        if -(-world // count) * per_rank <= budget:
            return count
    return world


@documents("spans.md", "A = ⌊B / R⌋ ≥ j, so R × A ≤ B")
@documents("spans.md", "K = ⌈W / max(1, ⌊B / j⌋)⌉ shards of R = ⌈W / K⌉ consecutive ranks")
@given(st.integers(1, 5000), st.integers(1, 30_000), st.integers(1, 12))
def test_shards_are_the_fewest_that_fit_the_budget(world, budget, per_rank):
    """K: the fewest shards that fit; R ranks each, consecutive, none empty; each rank's share
    A fits R x A within the budget and holds at least the spans it is planned for."""
    shards = Shards.of(budget, world, per_rank)
    assert shards.count == _fewest_shards(budget, world, per_rank)
    assert shards.ranks == -(-world // shards.count)
    members = [shards.shard_of(rank) for rank in range(world)]
    assert members == sorted(members) and set(members) == set(range(shards.count))
    share = shards.allowance(budget)
    if per_rank <= budget:
        assert share >= per_rank and shards.ranks * share <= budget
    else:
        assert (shards.count, shards.ranks, share) == (world, 1, budget)


@documents("spans.md", "8 ranks: 2,500; 4,096: 9")
@documents("spans.md", "8 ranks: K = 1; 4,096: K = 2, R = 2,048")
@documents(
    "spans.md",
    "j = its segment span and one of each span of the `checkpoint` and `evaluate` groups",
)
@documents("spans.md", "From B, W and the groups that record spans")
def test_the_shape_of_a_4096_rank_job_at_the_default_budget():
    """At 4,096 ranks and 20,000 spans: per_step keeps 1,000-iteration segments; the job trace
    (7 spans a rank) and the run trace (6) each split into 2 shards of 2,048 ranks with 9
    spans a rank; 8 ranks share one of each."""
    per_step = config.SPAN_GROUP_PRESETS["per_step"]
    shape = TraceShape.derive(per_step, 4096, config.DEFAULT_TRACE_SPAN_BUDGET, 1000)
    assert (shape.step_spans, shape.step_once, shape.segment_iterations) == (4, 1, 1000)
    assert (shape.job_spans, shape.run_spans) == (7, 6)
    assert (shape.job.count, shape.job.ranks, shape.job.allowance(20_000)) == (2, 2048, 9)
    assert (shape.run.count, shape.run.ranks, shape.run.allowance(20_000)) == (2, 2048, 9)
    node = TraceShape.derive(per_step, 8, 20_000, 1000)
    assert (node.job.count, node.run.count, node.job.allowance(20_000)) == (1, 1, 2500)
    small = TraceShape.derive(per_step, 8, 60, 1000)
    assert small.segment_iterations == 14  # (60 - 1) // 4


def _sha(part: str) -> bytes:
    return hashlib.sha256(f"otel-training/run-7/{part}".encode()).digest()


@documents(
    "spans.md",
    "A member's trace id is the first 8 bytes of `H(family/member)` followed by bytes 8–16",
)
@documents("spans.md", "`H(part)` is SHA-256 of `otel-training/{run id}/{part}`")
def test_member_ids_share_the_low_bits_of_their_family():
    """A member's trace id: 8 bytes of H(family/member), then bytes 8-16 of H(family); its
    shared parent span id: bytes 16-24 of H(family/member)."""
    trace_id, span_id = member_ids("run-7", "segment/3", "shard/1")
    assert trace_id.to_bytes(16, "big") == _sha("segment/3/shard/1")[:8] + _sha("segment/3")[8:16]
    assert span_id.to_bytes(8, "big") == _sha("segment/3/shard/1")[16:24]
    members = ["shard/0", "shard/1", "rank/0/part/0", "rank/5/part/2"]
    ids = [member_ids("run-7", "segment/3", m)[0] for m in members]
    assert len(set(ids)) == len(ids)
    assert {i & (2**64 - 1) for i in ids} == {int.from_bytes(_sha("segment/3")[8:16], "big")}
    assert member_ids("run-7", "segment/4", "shard/0")[0] & (2**64 - 1) != ids[0] & (2**64 - 1)


@documents("spans.md", "meet in one job trace while W × j ≤ B (2,857 ranks at the default budget)")
def test_one_job_trace_holds_every_rank_while_w_times_j_fits_the_budget():
    """At the default budget of 20,000 and 7 job-level spans a rank: one job trace up to 2,857
    ranks (19,999 spans), two shards from 2,858; the run trace (6 a rank) up to 3,333."""
    assert Shards.of(20_000, 2857, 7).count == 1 and Shards.of(20_000, 2858, 7).count == 2
    assert Shards.of(20_000, 3333, 6).count == 1 and Shards.of(20_000, 3334, 6).count == 2


def test_ranks_outside_the_world_belong_to_the_nearest_shard():
    """A rank beyond the world is in the last shard, a negative one in the first."""
    shards = Shards.of(budget=10, world_size=8, spans_per_rank=5)  # 4 shards of 2 ranks
    assert (shards.count, shards.ranks) == (4, 2)
    assert [shards.shard_of(rank) for rank in (-3, 0, 7, 8, 9, 1000)] == [0, 0, 3, 3, 3, 3]


def test_a_shape_without_span_groups_plans_one_span_a_rank_and_one_rank_at_least():
    """No group records spans: the job and run traces are planned for one span a rank (never
    zero), and a world of 0 or 1 rank is one rank."""
    for world in (0, 1):
        shape = TraceShape.derive((), world, 20_000, 1000)
        assert (shape.world_size, shape.step_spans, shape.segment_iterations) == (1, 0, 1000)
        assert (shape.job_spans, shape.run_spans) == (1, 1)
    assert TraceShape.derive((), 3, 20_000, 1000).world_size == 3
