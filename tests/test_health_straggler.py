"""Stragglers (health/straggler.py, docs/health.md): busy time per step over windows, the
leave-one-out score, 2 consecutive windows, and the cause; synthetic counters with the
per-step times given by hand."""

from __future__ import annotations

import pytest
from doc_rules import documents

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


@documents("health.md", "score(r) = busy(r) ÷ median(busy(q) for the peers q ≠ r): leave-one-out")
def test_the_leave_one_out_score():
    """busy / median of the others: a 2-rank group compares with the other rank alone."""
    assert straggler.leave_one_out_score(1.5, [1.0]) == 1.5
    assert straggler.leave_one_out_score(1.0, [1.0, 2.0, 3.0]) == 0.5
    assert straggler.leave_one_out_score(1.0, []) is None


@documents(
    "health.md", "Windows are ranges of optimizer steps, the same for every rank of an attempt"
)
@documents(
    "health.md", "busy(r) = `data_loading + forward_backward + optimizer` per optimizer step"
)
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


@documents("health.md", "else `data` (`data_loading`) or `compute`")
def test_a_data_straggler_is_flagged_with_its_cause():
    """Data +100 % on rank 2: cause data."""
    ranks = [counters(r, slow_data=1.0 if r == 2 else 0.0) for r in range(4)]
    (found,) = assess(ranks).stragglers
    assert (found.rank, found.cause) == (2, "data")


@documents("health.md", "when that part explains ≥ 80 % of the excess; else `mixed`")
def test_both_parts_slower_is_mixed():
    """Data and compute each +50 %: neither explains 80 % of the excess."""
    ranks = [counters(r, **({"slow_data": 1.5, "slow_compute": 0.5} if r == 0 else {}))
             for r in range(3)]  # fmt: skip
    (found,) = assess(ranks).stragglers
    assert found.cause == "mixed"


@documents("health.md", "Straggler: score > 1.2 in at least 2 consecutive windows")
def test_one_window_is_not_enough():
    """Slow only in the last window: flagged in no run of 2 consecutive windows."""
    ranks = [counters(r, slow_compute=0.5 if r == 1 else 0.0, slow_from=170) for r in range(4)]
    report = assess(ranks)
    assert report.scores[1][-1] > 1.2 and report.stragglers == []


@documents("health.md", "score(r) = busy(r) ÷ median(busy(q) for the peers q ≠ r): leave-one-out")
def test_two_ranks_work_by_leaving_one_out():
    """With 2 ranks a plain median would halve the signal; left out, 1.36 is seen."""
    ranks = [counters(0), counters(1, slow_compute=0.5)]
    (found,) = assess(ranks).stragglers
    assert found.rank == 1 and found.score == pytest.approx(0.057 / 0.042)


@documents("health.md", "Peers: the same `dl.pipeline_parallel.rank` (all ranks when not set)")
def test_peers_are_the_same_pipeline_stage():
    """Stage 1 does twice the work of stage 0: no straggler across stages."""
    ranks = [counters(r, group=0) for r in range(2)] + [
        counters(r, group=1, compute=0.06) for r in (2, 3)
    ]
    assert assess(ranks).stragglers == []


@documents(
    "health.md", "`unattributed` when no rank of the peer group ever recorded `communication`"
)
def test_without_communication_the_cause_is_unattributed():
    """No communication phase recorded: waiting hides in compute, so the cause is not guessed."""
    ranks = [counters(r, communication=0.0, slow_data=1.0 if r == 1 else 0.0) for r in range(3)]
    report = assess(ranks)
    assert not report.attributed
    (found,) = report.stragglers
    assert found.cause == "unattributed"


@documents(
    "health.md",
    "`gpu_throttle` when the excess is not mostly data and the rank's device shows",
)
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


@documents("health.md", "a window is never finer than what the exports resolve")
@documents("health.md", "the median number of steps between two exports)` steps each")
def test_windows_widen_to_the_steps_between_exports():
    """Exported every 50 steps: windows of 50 steps (the counters say nothing finer)."""
    ranks = [counters(r, every=50, steps=500) for r in range(2)]
    report = assess(ranks, window_steps=20)
    assert report.window_steps == 50 and report.windows[0] == (50.0, 100.0)


def test_a_healthy_job_has_no_straggler():
    """Equal ranks: every score 1.0, nothing flagged."""
    report = assess([counters(r) for r in range(4)])
    assert report.stragglers == [] and report.attributed


def per_step(rank: int, compute_of_step, *, steps: int = 200, every: int = 10) -> RankCounters:
    """A rank whose compute in step s is ``compute_of_step(s)`` (data 0.01, optimizer 0.002,
    communication 0.02 a step), sampled every ``every`` steps."""
    return counters(rank, steps=steps, every=every) if compute_of_step is None else RankCounters(
        rank,
        [float(s) for s in range(every, steps + 1, every)],
        {
            "data_loading": [0.01 * s for s in range(every, steps + 1, every)],
            "forward_backward": [sum(compute_of_step(k) for k in range(1, s + 1))
                                 for s in range(every, steps + 1, every)],
            "optimizer": [0.002 * s for s in range(every, steps + 1, every)],
            "communication": [0.02 * s for s in range(every, steps + 1, every)],
        },
    )  # fmt: skip


@documents(
    "health.md",
    "A rank's phase times at a window's edges are interpolated linearly in the iteration",
)
def test_phase_times_at_window_edges_are_interpolated_between_samples():
    """Samples every 7 steps, windows of 20: each window's busy time per step is exactly the
    0.042 s of every step (the edges fall between samples)."""
    report = assess([counters(r, every=7) for r in range(2)], window_steps=20)
    assert report.window_steps == 20 and report.windows[0] == (7.0, 27.0)
    for rank in (0, 1):
        assert report.busy_s[rank] == pytest.approx([0.042] * len(report.windows), abs=1e-12)


@documents("health.md", "Straggler: score > 1.2 in at least 2 consecutive windows")
def test_a_straggler_scores_above_1_2_in_two_consecutive_windows():
    """Score 1.25 everywhere is a straggler, 1.15 is not; above 1.2 in two windows apart is not,
    in two windows in a row is."""
    slow = {1.25: 0.03 + 0.25 * 0.042, 1.15: 0.03 + 0.15 * 0.042}
    for score, compute in slow.items():
        ranks = [per_step(r, (lambda s, c=compute: c) if r == 1 else None) for r in range(4)]
        found = assess(ranks, window_steps=20).stragglers
        assert [(s.rank, round(s.score, 6)) for s in found] == ([(1, score)] if score > 1.2 else [])

    def windows(*slow_windows):
        def compute(step):
            return slow[1.25] if (step - 11) // 20 in slow_windows else 0.03

        return [per_step(r, compute if r == 1 else None) for r in range(4)]

    assert assess(windows(1, 3), window_steps=20).stragglers == []
    (found,) = assess(windows(3, 4), window_steps=20).stragglers
    assert (found.rank, found.windows) == (1, 2)


@documents("health.md", "when that part explains ≥ 80 % of the excess; else `mixed`")
def test_the_cause_is_the_part_that_explains_80_percent_of_the_excess():
    """Compute 85 % of the excess: compute; 78 %: mixed (data and compute together)."""
    for compute_share, cause in ((0.85, "compute"), (0.78, "mixed")):
        data_excess = 0.015 * (1 - compute_share) / compute_share  # compute excess 0.015 s
        ranks = [
            counters(
                r, **({"slow_compute": 0.5, "slow_data": data_excess / 0.01} if r == 1 else {})
            )
            for r in range(4)
        ]
        (found,) = assess(ranks).stragglers
        assert found.cause == cause, compute_share
        assert found.excess_s["data"] == pytest.approx(data_excess)


@documents(
    "health.md",
    "`gpu_throttle` when the excess is not mostly data and the rank's device shows",
)
def test_throttling_is_an_sm_clock_under_0_95_or_10_degrees_above_the_peers():
    """0.94 x the peers' median clock or +11 °C: gpu_throttle; 0.96 x or +9 °C: compute; a data
    straggler on a throttled device: data."""

    def cause(clock=None, temperature=None, slow="slow_compute"):
        factor = 0.5 if slow == "slow_compute" else 2.0  # either way a score of 1.36 or more
        ranks = [
            counters(r, **({slow: factor, "clock": clock, "temperature": temperature} if r == 1
                           else {"clock": 2.0e9, "temperature": 70.0}))
            for r in range(4)
        ]  # fmt: skip
        return assess(ranks).stragglers[0].cause

    assert cause(clock=0.94 * 2.0e9) == "gpu_throttle"
    assert cause(clock=0.96 * 2.0e9) == "compute"
    assert cause(temperature=81.0) == "gpu_throttle"
    assert cause(temperature=79.0) == "compute"
    assert cause(clock=0.5 * 2.0e9, slow="slow_data") == "data"


@documents(
    "health.md",
    "A rise of `communication` on every rank without any busy excess is a job-wide",
)
def test_communication_rising_on_every_rank_is_no_straggler():
    """Every rank waits 10 x longer in communication from step 100 (a slow network): busy time
    is unchanged, no rank is flagged."""
    ranks = [per_step(r, lambda s: 0.03) for r in range(4)]
    for r in ranks:
        r.phase_s["communication"][10:] = [
            c + 0.18 * (i + 1) * 10 for i, c in enumerate(r.phase_s["communication"][10:])
        ]
    report = assess(ranks)
    assert report.stragglers == [] and report.attributed
    assert all(s == pytest.approx(1.0) for row in report.scores.values() for s in row)
