"""The job's progress at risk (health/risk.py, docs/health.md "Checkpoints and progress at
risk"), against times worked out by hand from scripted ranks."""

from __future__ import annotations

import pytest
from doc_rules import documents
from health_sim import SimRank

from otel_training.health import ledger as L
from otel_training.health.risk import progress_at_risk_s

T0 = 1_800_000_000.0
STEP_S = 0.02 + 0.06 + 0.005 + 0.01  # health_sim's step
WARM_S = STEP_S + 0.505  # the first step of a process


def ddp(ranks: int, savers: set[int], failing: set[int] = frozenset()) -> list[SimRank]:
    """``ranks`` ranks in lockstep, 1 s of startup, 50 steps, a 0.5 s save of step 50 on the
    ``savers`` (a barrier: the others wait as long), 30 more steps. A rank of ``failing`` has
    its save raise."""
    sims = [SimRank(T0, rank=r, export_s=1.0) for r in range(ranks)]
    for sim in sims:
        sim.advance(1.0)
        for _ in range(50):
            sim.step()
        token = sim.ledger.enter(
            L.CHECKPOINT_SAVE if sim.process.rank in savers else L.COMMUNICATION
        )
        sim.advance(0.5)
        sim.ledger.exit(token, L.CHECKPOINT_SAVE if sim.process.rank in savers else L.COMMUNICATION,
                        50, failed=sim.process.rank in failing)  # fmt: skip
        for _ in range(30):
            sim.step()
    return sims


@documents("health.md", "before the attempt's first save, the time since training began")
def test_before_any_save_the_risk_is_the_time_since_training_began():
    """At an export before the save: the time since the first step began (startup left out)."""
    sims = ddp(2, savers={0})
    t = T0 + 4.0  # an export, 3 s after training began at T0 + 1
    assert progress_at_risk_s([s.process for s in sims], t) == pytest.approx(3.0, abs=1e-5)
    assert progress_at_risk_s([s.process for s in sims], T0 + 0.5) is None  # no export yet


@documents("health.md", "A rank that never saves (DDP's rank > 0) has no checkpoint age")
def test_under_ddp_the_risk_is_rank_zeros_and_flat_after_its_save():
    """Rank 0 alone saves step 50: afterwards the job's risk is since step 50 completed, on
    every export, and rank 1 (no save, no age) changes nothing."""
    sims = ddp(2, savers={0})
    step50 = T0 + 1.0 + WARM_S + 49 * STEP_S
    processes = [s.process for s in sims]
    after = [s.time_s for s in sims[0].process.samples if s.time_s > step50 + 0.5]
    assert after and all(s.checkpoint_age_s is None for s in sims[1].process.samples)
    for t in after:
        assert progress_at_risk_s(processes, t) == pytest.approx(t - step50, abs=1e-5)
    assert progress_at_risk_s(processes[:1], after[-1]) == progress_at_risk_s(processes, after[-1])


@documents("health.md", "the largest age among the ranks that save (the oldest last save")
def test_a_writer_whose_save_failed_keeps_the_job_at_risk():
    """Sharded: every rank writes; rank 1's save of step 50 raised, so the job has no good
    checkpoint of step 50: rank 1's age runs from when training began, and so does the job's."""
    sims = ddp(2, savers={0, 1}, failing={1})
    t = sims[0].process.samples[-1].time_s
    began = T0 + 1.0
    step50 = T0 + 1.0 + WARM_S + 49 * STEP_S
    assert sims[0].process.samples[-1].checkpoint_age_s == pytest.approx(t - step50, abs=1e-5)
    assert sims[1].process.samples[-1].checkpoint_age_s == pytest.approx(t - began, abs=1e-5)
    assert progress_at_risk_s([s.process for s in sims], t) == pytest.approx(t - began, abs=1e-5)
