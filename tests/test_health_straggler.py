"""Stragglers (health/straggler.py, docs/health.md): busy time per step over windows, the
leave-one-out score, 2 consecutive windows, and the cause; synthetic counters with the
per-step times given by hand."""

from __future__ import annotations

import pytest

from otel_training.health import straggler
from otel_training.health.straggler import RankCounters, assess


def counters(
    rank: int,
    *,
    steps: int = 200,
    every: int = 10,
    data: float = 0.01,
    compute: float = 0.03,
    optimizer: float = 0.002,
    communication: float = 0.02,
    slow_from: int = 0,
    slow_data: float = 0.0,
    slow_compute: float = 0.0,
    group: int | None = None,
    clock: float | None = None,
    temperature: float | None = None,
) -> RankCounters:
    """A rank sampled every ``every`` steps; from step ``slow_from`` on, its data or compute
    per step is longer by the given fraction (and it waits that much less)."""
    iterations, phases = [], {p: [] for p in straggler.PHASES}
    totals = dict.fromkeys(straggler.PHASES, 0.0)
    for step in range(1, steps + 1):
        slow = step > slow_from
        d = data * (1 + (slow_data if slow else 0))
        c = compute * (1 + (slow_compute if slow else 0))
        totals["data_loading"] += d
        totals["forward_backward"] += c
        totals["optimizer"] += optimizer
        totals["communication"] += communication
        if step % every == 0:
            iterations.append(float(step))
            for p in straggler.PHASES:
                phases[p].append(totals[p])
    return RankCounters(rank, iterations, phases, group, clock, temperature)


def test_the_leave_one_out_score():
    """busy / median of the others: a 2-rank group compares with the other rank alone."""
    assert straggler.leave_one_out_score(1.5, [1.0]) == 1.5
    assert straggler.leave_one_out_score(1.0, [1.0, 2.0, 3.0]) == 0.5
    assert straggler.leave_one_out_score(1.0, []) is None


def test_a_compute_straggler_is_flagged_with_its_cause():
    """Compute +50 % on rank 1 of 4: score 1.36 in every window, cause compute."""
    ranks = [counters(r, slow_compute=0.5 if r == 1 else 0.0) for r in range(4)]
    report = assess(ranks, window_steps=20)
    assert report.window_steps == 20 and len(report.windows) == 9  # from step 10 to 190
    (found,) = report.stragglers
    expected = (0.01 + 0.045 + 0.002) / (0.01 + 0.03 + 0.002)
    assert found.rank == 1 and found.cause == "compute" and found.windows == 9
    assert found.score == pytest.approx(expected)
    assert found.excess_s["compute"] == pytest.approx(0.015)
    assert all(s == pytest.approx(1.0) for r in (0, 2, 3) for s in report.scores[r])


def test_a_data_straggler_is_flagged_with_its_cause():
    """Data +100 % on rank 2: cause data."""
    ranks = [counters(r, slow_data=1.0 if r == 2 else 0.0) for r in range(4)]
    (found,) = assess(ranks).stragglers
    assert (found.rank, found.cause) == (2, "data")


def test_both_parts_slower_is_mixed():
    """Data and compute each +50 %: neither explains 80 % of the excess."""
    ranks = [counters(r, **({"slow_data": 1.5, "slow_compute": 0.5} if r == 0 else {}))
             for r in range(3)]  # fmt: skip
    (found,) = assess(ranks).stragglers
    assert found.cause == "mixed"


def test_one_window_is_not_enough():
    """Slow only in the last window: flagged in no run of 2 consecutive windows."""
    ranks = [counters(r, slow_compute=0.5 if r == 1 else 0.0, slow_from=170) for r in range(4)]
    report = assess(ranks)
    assert report.scores[1][-1] > 1.2 and report.stragglers == []


def test_two_ranks_work_by_leaving_one_out():
    """With 2 ranks a plain median would halve the signal; left out, 1.36 is seen."""
    ranks = [counters(0), counters(1, slow_compute=0.5)]
    (found,) = assess(ranks).stragglers
    assert found.rank == 1 and found.score == pytest.approx(0.057 / 0.042)


def test_peers_are_the_same_pipeline_stage():
    """Stage 1 does twice the work of stage 0: no straggler across stages."""
    ranks = [counters(r, group=0) for r in range(2)] + [
        counters(r, group=1, compute=0.06) for r in (2, 3)
    ]
    assert assess(ranks).stragglers == []


def test_without_communication_the_cause_is_unattributed():
    """No communication phase recorded: waiting hides in compute, so the cause is not guessed."""
    ranks = [counters(r, communication=0.0, slow_data=1.0 if r == 1 else 0.0) for r in range(3)]
    report = assess(ranks)
    assert not report.attributed
    (found,) = report.stragglers
    assert found.cause == "unattributed"


def test_a_throttled_gpu_is_the_cause_of_a_compute_straggler():
    """Its SM clock under 0.95 x the peers' median: gpu_throttle."""
    ranks = [
        counters(r, slow_compute=0.5 if r == 1 else 0.0, clock=1.2e9 if r == 1 else 1.98e9)
        for r in range(4)
    ]
    (found,) = assess(ranks).stragglers
    assert found.cause == "gpu_throttle"
    hot = [
        counters(r, slow_compute=0.5 if r == 1 else 0.0, temperature=90.0 if r == 1 else 70.0)
        for r in range(4)
    ]
    assert assess(hot).stragglers[0].cause == "gpu_throttle"


def test_windows_widen_to_the_steps_between_exports():
    """Exported every 50 steps: windows of 50 steps (the counters say nothing finer)."""
    ranks = [counters(r, every=50, steps=500) for r in range(2)]
    report = assess(ranks, window_steps=20)
    assert report.window_steps == 50 and report.windows[0] == (50.0, 100.0)


def test_a_healthy_job_has_no_straggler():
    """Equal ranks: every score 1.0, nothing flagged."""
    report = assess([counters(r) for r in range(4)])
    assert report.stragglers == [] and report.attributed
