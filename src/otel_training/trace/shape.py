"""The shape of a run's traces: which trace a span goes to, how many spans a trace may hold, and
the trace ids, computed alike on every rank without any communication.

A run's spans go to three kinds of trace (:mod:`otel_training.trace.segments` routes them):

- **run traces** hold each rank's ``megatron.train`` span and what runs outside iterations
  (startup, model and data-loader building, checkpoint loads, phases with no parent);
- per segment of N iterations, **job traces** hold each rank's ``megatron.train.segment`` span
  and its job-level phases (checkpoint saves, evaluations: the groups of
  :data:`JOB_LEVEL_GROUPS`);
- per segment and rank, **step traces** hold that rank's iterations and their phases, and the
  spans its shares of the job trace had no room for.

Run and job traces are shared by ranks: all ranks while they fit the budget, else shards of
ranks. Every trace holds at most B spans (``OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET``): each
rank fills at most its share A of a shared trace and at most B of its own step trace, then
starts its next step trace. The formulas, with W the world size and G the span groups that
record spans:

- ``s = |ONCE_PER_ITERATION ∩ G|`` spans one iteration puts in its step trace at most (the
  iteration, data loading, forward-backward, optimizer: 0 to 4), and ``c`` = 1 when the
  first iteration's wrapper records (once per run) else 0;
- ``N = min(L, max(1, floor((B - c - r) / s)))`` iterations per segment (``N = L`` when
  s = 0), r = 1 for the step trace's root span (a ``megatron.train.segment`` span, when the
  group ``job`` records) else 0, L = ``OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS``: one
  step trace holds a rank's segment when its phases stay within these bounds;
- ``j`` = spans per rank a job trace is sized for: its segment span and one of each span of
  the job-level groups (a save and its three stages, an evaluation and one step: at most 7);
  ``j_run`` the same for a run trace (:data:`ONCE_PER_RUN`: at most 6);
- ``K = ceil(W / max(1, floor(B / j)))`` shards of ``R = ceil(W / K)`` consecutive ranks
  (shard ``q = floor(rank / R)``); each rank may put ``A = floor(B / R) >= j`` spans in its
  shard, so ``R x A <= B``. All ranks meet in one job trace (K = 1) while ``W x j <= B``.

Where the bounds are exceeded, the trace still is not: the phases of :data:`PER_CALL` groups
(communication, micro-batches, layers, activation offload, custom phases: as many spans as the
code calls them, such as a ``phase()`` in a loop) and extra saves or evaluation steps make
more step traces, each of at most B spans, never a bigger one. Spans of another tracer started
inside a phase join its trace without being counted.

**Ids.** ``H(part)`` is SHA-256 of ``otel-training/{run id}/{part}``. A trace belongs to a
family, ``run`` or ``segment/{s}`` (``run{k}/`` before both for a process's k-th run, k >= 2);
its members are ``shard/{q}`` and ``rank/{r}/part/{p}``. A member's trace id is the first 8
bytes of ``H(family/member)`` followed by the last 8 bytes of the first 16 of ``H(family)``;
a shard's shared span id (its keeper's run or segment span: the trace's root) and a step
trace's root span id are bytes 16-24 of ``H(family/member)``.
Every trace of a family thus has the same low 64 bits, the bits that a ``traceidratio``
sampler (the Python SDK's, and the collector's probabilistic sampler in proportional mode)
decides on: it keeps or drops a segment's job traces and step traces together, on every rank.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from otel_training.semconv.spans import (
    MEGATRON_CHECKPOINT_LOAD,
    MEGATRON_CHECKPOINT_LOAD_IO_READ,
    MEGATRON_STARTUP,
    MEGATRON_STARTUP_DATALOADER,
    MEGATRON_STARTUP_MODEL_INIT,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_FIRST_ITERATION,
    MEGATRON_TRAIN_ITERATION,
    MEGATRON_TRAIN_ITERATION_DATA_LOADING,
    MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
    MEGATRON_TRAIN_ITERATION_OPTIMIZER,
    MEGATRON_TRAIN_SEGMENT,
    SPANS,
)

__all__ = [
    "JOB_LEVEL_GROUPS",
    "JOB_LEVEL_SPANS",
    "ONCE_PER_ITERATION",
    "ONCE_PER_RUN",
    "PER_CALL",
    "STEP_TRACE_ONCE",
    "TraceShape",
    "derived_ids",
    "member_ids",
]

#: Groups whose phases with an iteration number go to the job trace of their segment (under
#: the rank's segment span), not to the rank's step trace.
JOB_LEVEL_GROUPS = frozenset({"checkpoint", "evaluate"})

#: Spans of the registry the phase API makes at most once per iteration: those of
#: :func:`otel_training.training_iteration` and the phases it holds.
ONCE_PER_ITERATION = frozenset(
    {
        MEGATRON_TRAIN_ITERATION,
        MEGATRON_TRAIN_ITERATION_DATA_LOADING,
        MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
        MEGATRON_TRAIN_ITERATION_OPTIMIZER,
    }
)
#: Spans a step trace holds once per run: the first iteration's wrapper.
STEP_TRACE_ONCE = frozenset({MEGATRON_TRAIN_FIRST_ITERATION})
#: Spans of a job trace a rank's share is sized for, one each per segment: its segment span
#: and every span of the job-level groups (a save with its stages, an evaluation with a step).
JOB_LEVEL_SPANS = frozenset(
    {MEGATRON_TRAIN_SEGMENT}
    | {name for name, spec in SPANS.items() if spec.group in JOB_LEVEL_GROUPS}
)
#: Spans of a run trace a rank's share is sized for, one each per run.
ONCE_PER_RUN = frozenset(
    {
        MEGATRON_TRAIN,
        MEGATRON_STARTUP,
        MEGATRON_STARTUP_MODEL_INIT,
        MEGATRON_STARTUP_DATALOADER,
        MEGATRON_CHECKPOINT_LOAD,
        MEGATRON_CHECKPOINT_LOAD_IO_READ,
    }
)
#: Spans the code makes as often as it calls them (per micro-batch, layer, transfer): not in
#: the derivation; they make more step traces when a trace is full.
PER_CALL = frozenset(SPANS) - ONCE_PER_ITERATION - STEP_TRACE_ONCE - JOB_LEVEL_SPANS - ONCE_PER_RUN


def derived_ids(run_id: str, part: str) -> tuple[int, int]:
    """(trace id, span id) of ``part`` of the run ``run_id``: bytes 0-16 and 16-24 of SHA-256 of
    ``otel-training/{run_id}/{part}``, the same on every rank (an id of 0 becomes 1)."""
    digest = hashlib.sha256(f"otel-training/{run_id}/{part}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


_LOW_64 = (1 << 64) - 1


def member_ids(run_id: str, family: str, member: str) -> tuple[int, int]:
    """(trace id, shared parent span id) of trace ``member`` (``shard/{q}``,
    ``rank/{r}/part/{p}``) of ``family`` (``run``, ``segment/{s}``, with the run's prefix):
    the high 64 bits of the trace id from ``family/member``, the low 64 bits the family's."""
    member_trace, span_id = derived_ids(run_id, f"{family}/{member}")
    family_low = (derived_ids(run_id, family)[0] & _LOW_64) or 1
    return (member_trace & ~_LOW_64) | family_low, span_id


def _spans_of(names: Iterable[str], groups: frozenset[str]) -> int:
    return sum(1 for name in names if SPANS[name].group in groups)


@dataclass(frozen=True)
class Shards:
    """A shared trace split into shards of consecutive ranks.

    Attributes:
        count: K, the number of shards.
        ranks: R, ranks per shard (the last may have fewer).
    """

    count: int
    ranks: int

    @classmethod
    def of(cls, budget: int, world_size: int, spans_per_rank: int) -> Shards:
        """``K = ceil(W / max(1, floor(B / j)))``, ``R = ceil(W / K)``."""
        world = max(1, int(world_size))
        most = max(1, budget // max(1, spans_per_rank))
        count = -(-world // most)
        return cls(count, -(-world // count))

    def shard_of(self, rank: int) -> int:
        """The shard of ``rank``: ``floor(rank / R)`` (ranks outside the world: the nearest)."""
        return min(self.count - 1, max(0, int(rank)) // self.ranks)

    def allowance(self, budget: int) -> int:
        """A = floor(B / R): the spans each rank of a shard may put in it (>= 1)."""
        return max(1, budget // self.ranks)


@dataclass(frozen=True)
class TraceShape:
    """The derivation of the module docstring for one configuration.

    Attributes:
        budget: B, spans a trace may hold at most.
        world_size: W.
        step_spans: s, spans one iteration puts in its step trace (bounded groups).
        step_once: c, spans a step trace holds once per run.
        segment_iterations: N.
        job_spans: j, the per-rank size a job trace is planned for.
        run_spans: j_run, the same for a run trace.
        job: The job trace's shards.
        run: The run trace's shards.
    """

    budget: int
    world_size: int
    step_spans: int
    step_once: int
    segment_iterations: int
    job_spans: int
    run_spans: int
    job: Shards
    run: Shards

    @classmethod
    def derive(
        cls,
        groups: Iterable[str],
        world_size: int,
        budget: int,
        segment_limit: int,
    ) -> TraceShape:
        """The shape for span groups ``groups`` (those that record spans, not NVTX-only ones),
        ``world_size`` ranks, a span budget of ``budget`` (>= 1) and at most ``segment_limit``
        iterations per segment (>= 1). Never raises for positive integers."""
        groups = frozenset(groups)
        budget = max(1, int(budget))
        limit = max(1, int(segment_limit))
        step = _spans_of(ONCE_PER_ITERATION, groups)
        once = _spans_of(STEP_TRACE_ONCE, groups)
        root = 1 if "job" in groups else 0  # the step trace's root span
        iterations = limit if step == 0 else min(limit, max(1, (budget - once - root) // step))
        job = max(1, _spans_of(JOB_LEVEL_SPANS, groups))
        run = max(1, _spans_of(ONCE_PER_RUN, groups))
        return cls(
            budget=budget,
            world_size=max(1, int(world_size)),
            step_spans=step,
            step_once=once,
            segment_iterations=iterations,
            job_spans=job,
            run_spans=run,
            job=Shards.of(budget, world_size, job),
            run=Shards.of(budget, world_size, run),
        )
