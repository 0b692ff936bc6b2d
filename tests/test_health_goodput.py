"""Goodput over attempts (health/goodput.py, docs/health.md): scripted timelines on the real
ledger, every bucket against the value computed by hand from the script."""

from __future__ import annotations

import pytest
from health_sim import SimRank

from otel_training.health import goodput, hang
from otel_training.health import ledger as L
from otel_training.health.evidence import Attempt, attempts

STEP = 0.02 + 0.06 + 0.005 + 0.01  # data + compute + communication + optimizer
GAP = 0.005  # between steps: the ledger's other
WARMUP = STEP + 0.505
T0 = 1_800_000_000.0


def run_attempt(
    created: float,
    attempt: int | None,
    *,
    load: int | None,
    last: int,
    cut_s: float | None = None,
    step_spans: bool = True,
    rank: int = 0,
    run_id: str = "run",
) -> SimRank:
    """Startup 2 s, a load of ``load`` (0.3 s), steps to ``last`` with a gap after each, an
    evaluation (0.4 s) every 25 steps and a save (0.25 s) every 20; then, with ``cut_s``, a
    step that the end cuts after that many seconds."""
    r = SimRank(created, rank=rank, attempt=attempt, step_spans=step_spans, run_id=run_id)
    r.advance(2.0)
    if load is not None:
        r.phase(L.CHECKPOINT_LOAD, 0.3, load)
        r.iteration = load
    while r.iteration < last:
        r.step()
        r.advance(GAP)
        if r.iteration % 25 == 0:
            r.phase(L.EVALUATE, 0.4, r.iteration)
        if r.iteration % 20 == 0:
            r.phase(L.CHECKPOINT_SAVE, 0.25, r.iteration)
    if cut_s is not None:
        r.begin_step(cut_s)
    return r


def two_attempts(step_spans: bool = True, counter: bool = True):
    a0 = run_attempt(T0, 0 if counter else None, load=None, last=47, cut_s=0.05,
                     step_spans=step_spans)  # fmt: skip
    killed = a0.now
    p0 = a0.end()
    a1 = run_attempt(killed + 1.5, 1 if counter else None, load=40, last=100,
                     step_spans=step_spans)  # fmt: skip
    p1 = a1.end()
    return p0, p1, killed


def expected_buckets(killed: float, end: float) -> tuple[dict[str, float], float]:
    """By hand, from the script of :func:`two_attempts`."""
    kept0 = 39  # steps 2..40 after the warm-up step 1
    lost0 = GAP + 7 * (STEP + GAP) + 0.05  # after step 40: its gap, steps 41-47, the cut step
    kept1 = 59  # steps 42..100 after the warm-up step 41
    buckets = {
        "startup": 2.0 + 2.0,
        "checkpoint_load": 0.3,
        "warmup_excess": 2 * (WARMUP - STEP),
        "checkpoint_save": 2 * 0.25 + 3 * 0.25,
        "evaluate": 1 * 0.4 + 3 * 0.4,
        "data_wait": (kept0 + kept1) * 0.02,
        "lost_progress": lost0,
        "hang": 0.0,
        "downtime": 1.5,
        "other": (40 - 1) * GAP + 60 * GAP,
    }
    productive = (kept0 + kept1) * (STEP - 0.02) + 2 * STEP
    assert buckets["other"] + productive + sum(
        v for k, v in buckets.items() if k != "other"
    ) == pytest.approx(end - T0)
    return buckets, productive


def test_every_bucket_is_the_hand_computed_value():
    """Killed inside step 48, restarted 1.5 s later from step 40: each bucket, to 1 ms."""
    p0, p1, killed = two_attempts()
    job = goodput.account(attempts([p0, p1]))
    buckets, productive = expected_buckets(killed, p1.alive_s)
    assert job.wall_s == pytest.approx(p1.alive_s - T0)
    # placed by spans and the restore point: to the millisecond
    for name in ("startup", "checkpoint_load", "warmup_excess", "checkpoint_save", "evaluate",
                 "lost_progress", "hang", "downtime"):  # fmt: skip
        assert job.buckets[name] == pytest.approx(buckets[name], abs=1e-3), name
    # split in the proportions of an export interval: within a step's data loading
    for name in ("data_wait", "other"):
        assert job.buckets[name] == pytest.approx(buckets[name], abs=0.02), name
    assert job.productive_s == pytest.approx(productive, abs=0.02)
    assert job.goodput == pytest.approx(job.productive_s / job.wall_s)
    assert job.goodput == pytest.approx(productive / job.wall_s, abs=1e-3)  # 0.1 points
    first, second = job.attempts
    assert (first.resumed_from, first.last_iteration, first.lost_iterations) == (None, 47, (41, 47))
    assert (second.resumed_from, second.last_iteration, second.lost_iterations) == (40, 100, None)
    assert first.ended == "killed" and second.ended == "completed"
    assert first.median_step_s == pytest.approx(STEP)


def test_buckets_and_productive_time_add_up_to_the_wall_time():
    """Whatever the script, the partition is exact: productive + buckets = W."""
    p0, p1, _ = two_attempts(step_spans=False)
    job = goodput.account(attempts([p0, p1]))
    assert job.productive_s + sum(job.buckets.values()) == pytest.approx(job.wall_s, abs=1e-6)
    for item in job.attempts:
        assert item.productive_s + sum(item.buckets.values()) == pytest.approx(item.wall_s)


def test_without_step_spans_the_buckets_stay_within_a_step():
    """Default span groups (no iteration spans): the export samples and the checkpoint and
    evaluation spans still place the restore point; each bucket within two steps."""
    p0, p1, killed = two_attempts(step_spans=False)
    job = goodput.account(attempts([p0, p1]))
    buckets, productive = expected_buckets(killed, p1.alive_s)
    for name, value in buckets.items():
        assert job.buckets[name] == pytest.approx(value, abs=2 * STEP), name
    assert job.productive_s == pytest.approx(productive, abs=2 * STEP)
    assert job.attempts[0].lost_iterations is None or job.attempts[0].lost_iterations[0] == 41


def test_attempts_without_a_counter_are_ordered_by_creation_time():
    """No dl.run.attempt: the two processes of each rank are attempts 0 and 1 by start."""
    p0, p1, _ = two_attempts(counter=False)
    found = attempts([p1, p0])
    assert [a.processes[0] for a in found] == [p0, p1]
    assert [a.number for a in found] == [0, 1] and not any(a.numbered for a in found)
    job = goodput.account(found)
    assert job.buckets["lost_progress"] == pytest.approx(GAP + 7 * (STEP + GAP) + 0.05, abs=1e-3)


def test_a_restart_that_loads_an_older_checkpoint_loses_every_step_after_it():
    """The next attempt restored step 20, not 40: steps 21-47 are lost, save 40 is not."""
    p0, _, killed = two_attempts()
    a1 = run_attempt(killed + 1.5, 1, load=20, last=30)
    job = goodput.account(attempts([p0, a1.end()]))
    lost = GAP + 27 * (STEP + GAP) + 0.05  # step 20's gap, steps 21..47 and theirs, the cut
    assert job.attempts[0].lost_iterations == (21, 47)
    assert job.attempts[0].buckets["lost_progress"] == pytest.approx(lost, abs=1e-3)
    assert job.attempts[0].buckets["checkpoint_save"] == pytest.approx(0.5, abs=1e-3)
    assert job.attempts[0].buckets["evaluate"] == pytest.approx(0.4, abs=1e-3)


def test_a_tail_without_progress_longer_than_h_is_hang():
    """Stuck 100 s in compute inside step 48 with a 60 s floor: hang, not lost progress."""
    r = run_attempt(T0, 0, load=None, last=47, cut_s=100.0)
    p0 = r.end()
    last_step_end = [s for s in p0.spans if s.iteration == 47][0].end_s
    a1 = run_attempt(r.now + 1.5, 1, load=40, last=41)
    job = goodput.account(attempts([p0, a1.end()]), hang.HangPolicy(floor_s=60.0))
    first = job.attempts[0]
    assert first.ended == "hung"
    assert first.buckets["hang"] == pytest.approx(r.now - last_step_end, abs=1e-3)
    # the steps after the restore point that did complete are still lost progress
    assert first.buckets["lost_progress"] == pytest.approx(GAP + 7 * STEP + 6 * GAP, abs=1e-3)
    strict = goodput.account(attempts([p0, a1.end()]), hang.HangPolicy(floor_s=200.0))
    assert strict.attempts[0].buckets["hang"] == 0.0


def test_the_reference_rank_dying_first_leaves_the_rest_to_its_peers():
    """Rank 0 dies 0.4 s before rank 1: the attempt ends with rank 1, and the 0.4 s is lost."""
    r0 = run_attempt(T0, 0, load=None, last=47, cut_s=0.05, rank=0)
    r1 = run_attempt(T0, 0, load=None, last=47, cut_s=0.45, rank=1)
    p0, p1 = r0.end(), r1.end()
    a1 = run_attempt(r1.now + 1.5, 1, load=40, last=41)
    found = attempts([p0, p1, a1.end()])
    job = goodput.account(found)
    assert job.attempts[0].reference_rank == 0
    assert job.attempts[0].end_s == pytest.approx(r1.now)
    assert job.attempts[0].buckets["lost_progress"] == pytest.approx(
        GAP + 7 * (STEP + GAP) + 0.45, abs=1e-3
    )


def test_time_to_start_and_time_to_recover():
    """Meta's: first step's end minus the attempt's start; the next one's minus the end."""
    p0, p1, killed = two_attempts()
    job = goodput.account(attempts([p0, p1]))
    first_end = T0 + 2.0 + WARMUP
    assert job.attempts[0].time_to_start_s == pytest.approx(first_end - T0)
    restart_first_end = killed + 1.5 + 2.0 + 0.3 + WARMUP
    assert job.attempts[0].time_to_recover_s == pytest.approx(restart_first_end - killed)
    assert job.attempts[1].time_to_start_s == pytest.approx(restart_first_end - killed - 1.5)


def test_a_job_still_running_is_running():
    """Evidence within two export intervals of now, spans still open: running."""
    r = run_attempt(T0, 0, load=None, last=30, cut_s=0.01)
    process = r.end()
    job = goodput.account([Attempt(0, True, [process])], now_s=r.now + 3.0)
    assert job.attempts[0].ended == "running"
    assert (
        goodput.account([Attempt(0, True, [process])], now_s=r.now + 60).attempts[0].ended
        == "killed"
    )


def test_an_attempt_without_the_ledger_is_other_with_a_note():
    """Files of a version without the ledger: the time is other, and a note says why."""
    r = SimRank(T0)
    r.advance(10.0)
    process = r.end()
    process.samples = []
    job = goodput.account([Attempt(0, True, [process])])
    assert job.buckets["other"] == pytest.approx(10.0)
    assert job.productive_s == 0.0 and "ledger" in job.notes[0]


def test_the_timeline_places_spans_between_exports():
    """Between two exports a save's time is where its span is; the step phases fill the rest."""
    r = SimRank(T0, export_s=5.0)
    r.advance(1.0)
    for _ in range(20):
        r.step(extra_first=0.0)
        r.advance(GAP)
    r.phase(L.CHECKPOINT_SAVE, 1.0, 20)
    for _ in range(10):
        r.step(extra_first=0.0)
        r.advance(GAP)
    process = r.end()
    timeline = goodput.Timeline(process)
    save = [s for s in process.spans if s.phase == L.CHECKPOINT_SAVE][0]
    before, after = timeline.at(save.start_s), timeline.at(save.end_s)
    assert after[L.CHECKPOINT_SAVE] - before[L.CHECKPOINT_SAVE] == pytest.approx(1.0)
    assert sum(timeline.at(r.now)) == pytest.approx(r.now - T0)
    assert timeline.at(save.start_s)[L.CHECKPOINT_SAVE] == pytest.approx(0.0, abs=1e-9)
