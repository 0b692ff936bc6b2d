"""Goodput over attempts that roll back, crash in a loop or end in every way (health/goodput.py,
docs/health.md, "Goodput"): scripted attempts on the real ledger (``run_attempt`` of
test_health_goodput, :class:`health_sim.SimRank`), each value computed by hand from the script."""

from __future__ import annotations

import pytest
from doc_rules import documents
from test_health_goodput import GAP, STEP, T0, WARMUP, run_attempt

from otel_training.health import goodput
from otel_training.health.evidence import attempts

DOWN = 1.5  # seconds between one attempt's end and the next one's start


def assert_partition(job) -> None:
    """Productive time and the buckets add up to W, per attempt and for the job; none is
    negative."""
    assert job.productive_s + sum(job.buckets.values()) == pytest.approx(job.wall_s, abs=1e-6)
    for item in job.attempts:
        assert item.productive_s + sum(item.buckets.values()) == pytest.approx(item.wall_s)
        assert item.productive_s >= 0.0 and min(item.buckets.values()) >= 0.0
    assert 0.0 <= job.goodput <= 1.0


def rolled_back(resume_2: int):
    """Attempt 0 runs steps 1-250 (saves every 20 steps, 100 and 200 among them); attempt 1
    loads step 200 and runs to 300; attempt 2 loads ``resume_2`` and runs 20 steps."""
    a0 = run_attempt(T0, 0, load=None, last=250)
    p0 = a0.end()
    a1 = run_attempt(a0.now + DOWN, 1, load=200, last=300)
    p1 = a1.end()
    a2 = run_attempt(a1.now + DOWN, 2, load=resume_2, last=resume_2 + 20)
    return p0, p1, a2.end()


@documents("health.md", "r_i = min over j > i, the attempts that tell none left out")
@documents("health.md", "A later rollback to an older checkpoint")
@documents("health.md", "the steps after r_i and the cut tail")
def test_a_rollback_discards_every_earlier_attempts_steps_after_it():
    """Attempt 2 resumes from step 100 (a rollback): attempt 0 loses steps 101-250, not only
    201-250; attempt 1, which resumed from 200, loses every step it ran (201-300)."""
    p0, p1, p2 = rolled_back(100)
    job = goodput.account(attempts([p0, p1, p2]))
    first, second, third = job.attempts
    assert goodput.restore_points(attempts([p0, p1, p2])) == [100, 100, None]
    # attempt 0: after step 100's end, its gap and steps 101-250 with theirs (the evaluations
    # and saves between them stay in their buckets)
    assert first.lost_iterations == (101, 250)
    assert first.buckets["lost_progress"] == pytest.approx(GAP + 150 * (STEP + GAP), abs=1e-3)
    assert first.buckets["evaluate"] == pytest.approx(10 * 0.4, abs=1e-3)  # 25, 50 ... 250
    assert first.buckets["checkpoint_save"] == pytest.approx(12 * 0.25, abs=1e-3)  # 20 ... 240
    # kept: the warm-up step 1 (less its excess over the median step) and steps 2-100
    assert first.productive_s == pytest.approx(STEP + 99 * (STEP - 0.02), abs=0.02)
    # attempt 1 resumed from 200 > 100: nothing of it is kept, its warm-up step included
    assert second.lost_iterations == (201, 300)
    assert second.buckets["lost_progress"] == pytest.approx(
        WARMUP + GAP + 99 * (STEP + GAP), abs=1e-3
    )
    assert second.productive_s == 0.0 and second.buckets["warmup_excess"] == 0.0
    assert second.buckets["data_wait"] == 0.0
    # the last attempt loses nothing
    assert third.lost_iterations is None and third.buckets["lost_progress"] == 0.0
    assert third.productive_s == pytest.approx(STEP + 19 * (STEP - 0.02), abs=0.02)
    assert job.buckets["lost_progress"] == pytest.approx(
        GAP + 150 * (STEP + GAP) + WARMUP + GAP + 99 * (STEP + GAP), abs=2e-3
    )
    assert job.buckets["downtime"] == pytest.approx(2 * DOWN)
    assert_partition(job)


@documents("health.md", "b_i = when step r_i completed")
def test_a_later_attempt_that_resumes_further_on_changes_nothing():
    """Attempt 2 resumes from 300 (no regression): attempt 0 loses 201-250 as attempt 1's
    resume point says; attempt 1 loses only the gap after step 300 (its evaluation and save
    of 300 are not lost)."""
    p0, p1, p2 = rolled_back(300)
    job = goodput.account(attempts([p0, p1, p2]))
    first, second, _ = job.attempts
    assert goodput.restore_points(attempts([p0, p1, p2])) == [200, 300, None]
    assert first.lost_iterations == (201, 250)
    assert first.buckets["lost_progress"] == pytest.approx(GAP + 50 * (STEP + GAP), abs=1e-3)
    assert second.lost_iterations is None
    assert second.buckets["lost_progress"] == pytest.approx(GAP, abs=1e-3)
    assert second.productive_s == pytest.approx(STEP + 99 * (STEP - 0.02), abs=0.02)
    assert_partition(job)
