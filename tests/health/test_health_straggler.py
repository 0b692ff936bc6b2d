"""Stragglers (health/straggler.py, docs/health.md): busy time per step over windows, the
peer reference (leave-one-out, lower quartile), 3 consecutive windows, and the cause;
synthetic counters with the per-step times given by hand."""

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


@documents("health.md", "score(r) = busy(r) ÷ reference(r).")
@documents("health.md", "In a peer group of 2 or 3 ranks the reference is the median of the others")
@documents("health.md", "In a group of 4 or more it is the group's **lower quartile**, r included")
def test_the_peer_reference():
    """2-3 ranks: the median of the others; 4 or more: the 0.25 quantile of the group with the
    rank, at rank 0.25 x (n - 1) between the sorted values (worked out by hand)."""
    assert straggler.peer_reference(1.5, [1.0]) == 1.0
    assert straggler.peer_reference(1.0, [1.0, 3.0]) == 2.0
    assert straggler.peer_reference(1.0, []) is None
    # [1, 2, 3, 4]: rank 0.75 -> 1 + 0.75 x (2 - 1)
    assert straggler.peer_reference(4.0, [3.0, 1.0, 2.0]) == 1.75
    # [1, 2, 3, 4, 5]: rank 1 -> 2, whichever rank is scored
    assert straggler.peer_reference(1.0, [5.0, 2.0, 4.0, 3.0]) == 2.0
    # two slow ranks of four do not move it: [1, 1, 1.4, 1.4] -> 1
    assert straggler.peer_reference(1.4, [1.0, 1.0, 1.4]) == 1.0
    assert straggler.score(1.4, [1.0, 1.0, 1.4]) == pytest.approx(1.4)
    assert straggler.score(1.0, [0.0]) is None


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
    assert found.rank == 1 and found.cause == "compute" and found.windows == 8  # not the first
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


@documents("health.md", "Straggler: score > 1.15 in at least 3 consecutive windows")
def test_two_windows_are_not_enough():
    """Slow only in the last 2 windows: no run of 3; in the last 3: flagged in those 3."""
    ranks = [counters(r, slow_compute=0.5 if r == 1 else 0.0, slow_from=150) for r in range(4)]
    report = assess(ranks)
    assert report.scores[1][-2] > 1.15 and report.stragglers == []
    ranks = [counters(r, slow_compute=0.5 if r == 1 else 0.0, slow_from=130) for r in range(4)]
    (found,) = assess(ranks).stragglers
    assert (found.rank, found.windows) == (1, 3)


@documents("health.md", "with 2 of 4 ranks slow,")
def test_two_slow_ranks_of_four_are_both_flagged():
    """Ranks 1 and 3 of 4 compute 40 % slower: both flagged at their full score (the lower
    quartile is a fast rank's busy time), the fast ranks score 1.0."""
    ranks = [counters(r, slow_compute=0.4 if r in (1, 3) else 0.0) for r in range(4)]
    report = assess(ranks)
    assert [s.rank for s in report.stragglers] == [1, 3]
    expected = (0.01 + 0.042 + 0.002) / 0.042
    assert all(s.score == pytest.approx(expected) for s in report.stragglers)
    assert all(v == pytest.approx(1.0) for r in (0, 2) for v in report.scores[r])


@documents("health.md", "A single slow step (a spike) falls in one")
def test_a_single_spike_flags_no_one():
    """One step of rank 2 takes 1.5 s more (36 times a step) in the middle of the job, its
    export interval straddling a window edge: at most 2 windows score high; no straggler."""
    ranks = [per_step(r, (lambda s: 0.03 + (1.5 if s == 95 else 0.0)) if r == 2 else None,
                      every=13) for r in range(4)]  # fmt: skip
    report = assess(ranks, window_steps=20)
    high = [w for w, v in enumerate(report.scores[2]) if v > straggler.SCORE_THRESHOLD]
    assert 1 <= len(high) <= 2 and report.stragglers == []


@documents("health.md", "never in the first window of an")
def test_the_first_window_of_an_attempt_never_flags():
    """Rank 1 slow in the first 3 windows only (the steps after a restart): scores high there,
    but only 2 of them count: no straggler. Slow in the first 4: flagged in 3."""

    def slow_until(last):
        def compute(step):
            return 0.06 if step <= last else 0.03

        return [per_step(r, compute if r == 1 else None) for r in range(4)]

    report = assess(slow_until(70), window_steps=20)  # windows from step 10: 10-30, 30-50, 50-70
    assert all(v > 1.15 for v in report.scores[1][:3]) and report.stragglers == []
    (found,) = assess(slow_until(90), window_steps=20).stragglers
    assert found.windows == 3


@documents("health.md", "(**leave-one-out**: with r in it, a slow rank of two would score 1 + half")
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


@documents("health.md", "Straggler: score > 1.15 in at least 3 consecutive windows")
def test_a_straggler_scores_above_1_15_in_three_consecutive_windows():
    """Score 1.2 everywhere is a straggler, 1.1 is not; above 1.15 in three windows not in a
    row is not, in three in a row is."""
    slow = {1.2: 0.03 + 0.2 * 0.042, 1.1: 0.03 + 0.1 * 0.042}
    for score, compute in slow.items():
        ranks = [per_step(r, (lambda s, c=compute: c) if r == 1 else None) for r in range(4)]
        found = assess(ranks, window_steps=20).stragglers
        assert [(s.rank, round(s.score, 6)) for s in found] == (
            [(1, score)] if score > 1.15 else []
        )

    def windows(*slow_windows):
        def compute(step):
            return slow[1.2] if (step - 11) // 20 in slow_windows else 0.03

        return [per_step(r, compute if r == 1 else None) for r in range(4)]

    assert assess(windows(1, 2, 4), window_steps=20).stragglers == []
    (found,) = assess(windows(3, 4, 5), window_steps=20).stragglers
    assert (found.rank, found.windows) == (1, 3)


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
