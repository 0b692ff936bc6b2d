"""Goodput over attempts (health/goodput.py, docs/health.md): scripted timelines on the real
ledger, every bucket against the value computed by hand from the script."""

from __future__ import annotations

import pytest
from doc_rules import documents
from health_sim import SimRank

from otel_training.health import goodput, hang
from otel_training.health import ledger as L
from otel_training.health.evidence import Attempt, PhaseSpan, Process, Sample, attempts

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


@documents("health.md", "goodput = productive / W.")
@documents("health.md", "other = W − productive − the other buckets")
@documents(
    "health.md",
    "startup, checkpoint_load, checkpoint_save (its blocking part), evaluate: their phases",
)
@documents("health.md", "data_wait = `data_loading`")
@documents("health.md", "warmup_excess = the first step of the process − the attempt's median step")
@documents("health.md", "The last attempt loses nothing")
@documents("health.md", "lost_progress = the step phases")
@documents("health.md", "downtime = S_{i+1} − E_i")
@documents("health.md", "W = E_n − S_1 (the wall time)")
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
    assert second.buckets["lost_progress"] == 0.0
    assert first.median_step_s == pytest.approx(STEP)


@documents("health.md", "Productive time and the ten buckets add up to W exactly")
def test_buckets_and_productive_time_add_up_to_the_wall_time():
    """Whatever the script, the partition is exact: productive + buckets = W."""
    p0, p1, _ = two_attempts(step_spans=False)
    job = goodput.account(attempts([p0, p1]))
    assert job.productive_s + sum(job.buckets.values()) == pytest.approx(job.wall_s, abs=1e-6)
    for item in job.attempts:
        assert item.productive_s + sum(item.buckets.values()) == pytest.approx(item.wall_s)


@documents(
    "health.md", "The reference rank's ledger splits `[its creation, E_i]` into the ten phases"
)
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


@documents("health.md", "Saves, loads and evaluations after b_i stay in their own buckets")
@documents("health.md", "lost_progress = the step phases")
@documents("health.md", "b_i = when step r_i completed")
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


@documents(
    "health.md",
    "hang = when at E_i the reference rank had made no progress for longer than H",
)
@documents("health.md", "`hung` ([hung](#hangs) at its end)")
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


@documents(
    "health.md",
    "the lowest rank that exported the ledger until within one export interval",
)
def test_the_reference_rank_dying_first_leaves_the_rest_to_its_peers():
    """Rank 0 dies 0.4 s before rank 1: the attempt ends with rank 1, and the 0.4 s is lost."""
    r0 = run_attempt(T0, 0, load=None, last=47, cut_s=0.05, rank=0)
    r1 = run_attempt(T0, 0, load=None, last=47, cut_s=0.45, rank=1)
    p0, p1 = r0.end(), r1.end()
    a1 = run_attempt(r1.now + 1.5, 1, load=40, last=41)
    found = attempts([p0, p1, a1.end()])
    job = goodput.account(found)
    assert job.attempts[0].reference_rank == 0
    assert job.attempts[0].end_s == pytest.approx(r1.now, abs=1e-6)
    assert job.attempts[0].buckets["lost_progress"] == pytest.approx(
        GAP + 7 * (STEP + GAP) + 0.45, abs=1e-3
    )


@documents("health.md", "Meta's time to start (its first step's end − S_i) and time to recover")
def test_time_to_start_and_time_to_recover():
    """Meta's: first step's end minus the attempt's start; the next one's minus the end."""
    p0, p1, killed = two_attempts()
    job = goodput.account(attempts([p0, p1]))
    first_end = T0 + 2.0 + WARMUP
    assert job.attempts[0].time_to_start_s == pytest.approx(first_end - T0)
    restart_first_end = killed + 1.5 + 2.0 + 0.3 + WARMUP
    assert job.attempts[0].time_to_recover_s == pytest.approx(restart_first_end - killed)
    assert job.attempts[1].time_to_start_s == pytest.approx(restart_first_end - killed - 1.5)


@documents("health.md", "How an attempt ended (`ended`)")
@documents("health.md", "`running` (its last evidence is within two export intervals of now")
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


@documents("health.md", "Without phase spans either, all of its time is `other`")
def test_an_attempt_without_the_ledger_is_other_with_a_note():
    """Files of a version without the ledger: the time is other, and a note says why."""
    r = SimRank(T0)
    r.advance(10.0)
    process = r.end()
    process.samples = []
    job = goodput.account([Attempt(0, True, [process])])
    assert job.buckets["other"] == pytest.approx(10.0)
    assert job.productive_s == 0.0 and "ledger" in job.notes[0]


@documents(
    "health.md", "The reference rank's ledger splits `[its creation, E_i]` into the ten phases"
)
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


@documents(
    "health.md",
    "the lowest rank that exported the ledger until within one export interval",
)
def test_the_reference_rank_is_the_lowest_that_exported_until_the_end():
    """5 s exports: rank 0 ending 4 s before rank 1 is the reference; ending 30 s before, it
    is not (rank 1 is)."""
    for gap, reference in ((4.0, 0), (30.0, 1)):
        r0 = run_attempt(T0, 0, load=None, last=30, rank=0)
        r1 = run_attempt(T0, 0, load=None, last=30, rank=1)
        r1.advance(gap)
        job = goodput.account(attempts([r0.end(), r1.end()]))
        assert job.attempts[0].reference_rank == reference, gap


@documents(
    "health.md",
    "E_i = their last evidence of life, cut at S_{i+1} when attempts overlap",
)
def test_an_attempt_runs_from_its_first_process_to_its_last_evidence_or_the_next_start():
    """S_i: rank 1 created 3 s before rank 0; E_i: cut where the next attempt starts when the
    old processes outlive it (2 s here): no downtime, W from S_1 to E_2."""
    r1 = run_attempt(T0, 0, load=None, last=47, cut_s=0.05, rank=1)
    r0 = run_attempt(T0 + 3.0, 0, load=None, last=47, cut_s=0.05, rank=0)
    old_end = max(r0.now, r1.now)
    a1 = run_attempt(old_end - 2.0, 1, load=40, last=60)
    job = goodput.account(attempts([r0.end(), r1.end(), a1.end()]))
    first, second = job.attempts
    assert first.start_s == T0 and job.start_s == T0
    assert (
        first.end_s == pytest.approx(old_end - 2.0, abs=1e-6) and first.buckets["downtime"] == 0.0
    )
    assert second.start_s == pytest.approx(old_end - 2.0, abs=1e-6)
    assert job.wall_s == pytest.approx(a1.now - T0)


@documents("health.md", "Time before the reference rank was created is `startup`")
def test_time_before_the_reference_rank_was_created_is_startup():
    """Rank 1 created 3 s before rank 0 (the reference): startup is rank 0's 2 s and the 3 s."""
    r1 = run_attempt(T0, 0, load=None, last=30, rank=1)
    r0 = run_attempt(T0 + 3.0, 0, load=None, last=30, rank=0)
    job = goodput.account(attempts([r0.end(), r1.end()]))
    assert job.attempts[0].reference_rank == 0
    assert job.buckets["startup"] == pytest.approx(2.0 + 3.0, abs=1e-3)


@documents("health.md", "without a load, its first iteration − 1")
def test_without_a_load_the_next_attempt_restored_the_step_before_its_first():
    """The restart loads nothing and starts at step 41: step 40 is b_i, steps 41-47 are lost,
    as with a load of step 40."""
    p0, _, killed = two_attempts()
    r = SimRank(killed + 1.5, attempt=1)
    r.advance(2.0)
    r.iteration = 40
    for _ in range(10):
        r.step()
        r.advance(GAP)
    job = goodput.account(attempts([p0, r.end()]))
    first = job.attempts[0]
    assert first.lost_iterations == (41, 47)
    assert first.buckets["lost_progress"] == pytest.approx(GAP + 7 * (STEP + GAP) + 0.05, abs=1e-3)


@documents("health.md", "Taken from, in order: that iteration's span end")
def test_the_restored_step_is_dated_by_the_best_evidence_in_order():
    """When step 10 completed: its span's end (100), else an export at that progress (101),
    else an export whose last save is it (120 - 15), else its save's start (106), else the
    progress of the exports around it interpolated (step 8 at 90, step 12 at 110: 100)."""
    process = Process(rank=0, created_s=0.0)
    process.spans = [
        PhaseSpan("megatron.train.iteration", L.ITERATION, 99.0, 100.0, 10),
        PhaseSpan("megatron.checkpoint.save", L.CHECKPOINT_SAVE, 106.0, 107.0, 10),
    ]
    process.samples = [
        Sample(95.0, iteration=8, progress_s=90.0),
        Sample(102.0, iteration=10, progress_s=101.0),
        Sample(115.0, iteration=12, progress_s=110.0),
        Sample(120.0, iteration=12, progress_s=110.0, saved_iteration=10, checkpoint_age_s=15.0),
    ]
    assert goodput.completion_s(process, 10) == 100.0
    process.spans.pop(0)
    assert goodput.completion_s(process, 10) == 101.0
    del process.samples[1]
    assert goodput.completion_s(process, 10) == 105.0
    process.samples.pop()
    assert goodput.completion_s(process, 10) == 106.0
    process.spans.clear()
    assert goodput.completion_s(process, 10) == pytest.approx(100.0)


@documents("health.md", "A running attempt is judged at now, as the hang verdict is")
def test_a_running_attempt_is_judged_at_now_as_far_as_its_files_show():
    """Stuck 55 s in a step, 60 s floor: at its last evidence it is not hung; still exporting
    8 s later (within two export intervals of now) it is, and the hang is counted to then.
    Judged 8 s after its last evidence with nothing newer, it runs but is not hung: the files
    never make a stall longer than they show it (every rank killed inside a long step)."""
    policy = hang.HangPolicy(floor_s=60.0)
    r = run_attempt(T0, 0, load=None, last=30, cut_s=55.0)
    r.advance(8.0)  # still stuck, still exporting (every 5 s)
    process = r.end()
    running = goodput.account([Attempt(0, True, [process])], policy, now_s=r.now + 1.0)
    assert running.attempts[0].ended == "hung"
    assert running.attempts[0].buckets["hang"] == pytest.approx(GAP + 63.0, abs=1e-3)

    r = run_attempt(T0, 0, load=None, last=30, cut_s=55.0)
    process = r.end()
    silent = goodput.account([Attempt(0, True, [process])], policy, now_s=r.now + 8.0)
    assert silent.attempts[0].ended == "running"
    assert silent.attempts[0].buckets["hang"] == 0.0
    ended = goodput.account([Attempt(0, True, [process])], policy)
    assert ended.attempts[0].ended == "killed" and ended.attempts[0].buckets["hang"] == 0.0


@documents("health.md", "How an attempt ended (`ended`)")
@documents("health.md", "`sigterm` (spans truncated on that signal, or the progress record")
def test_each_way_an_attempt_ends():
    """sigterm: spans truncated on the signal; failed: its last iteration raised; exited: an
    attempt before the last that shut down; completed: the last one that did."""

    def ended(process, *, last=True):
        found = [Attempt(0, True, [process])]
        if not last:
            later = run_attempt(process.alive_s + 1.0, 1, load=None, last=5).end()
            found.append(Attempt(1, True, [later]))
        return goodput.account(found).attempts[0].ended

    assert ended(run_attempt(T0, 0, load=None, last=30).end()) == "completed"
    assert ended(run_attempt(T0, 0, load=None, last=30).end(), last=False) == "exited"
    stopped = run_attempt(T0, 0, load=None, last=30).end()
    stopped.signal = "SIGTERM"
    assert ended(stopped) == "sigterm"
    r = run_attempt(T0, 0, load=None, last=30)
    start = r.now
    r.advance(0.05)
    r.process.spans.append(PhaseSpan("megatron.train.iteration", L.ITERATION, start, r.now, 31,
                                     failed=True))  # fmt: skip
    assert ended(r.end()) == "failed"


@documents(
    "health.md",
    "Without per-step spans the last progress known is that of the last export, checkpoint",
)
def test_without_step_spans_the_last_progress_known_is_the_last_exports_or_saves():
    """Default span groups: of steps 1-47 the last known is the save of step 40 (after the last
    export); with iteration spans, step 47 at its end."""
    r = run_attempt(T0, 0, load=None, last=47, step_spans=False)
    process = r.end()
    exported = max(s.iteration for s in process.samples if s.time_s < r.now)
    save = [s for s in process.spans if s.phase == L.CHECKPOINT_SAVE and s.iteration == 40][0]
    assert exported < 40 and goodput.last_progress(process) == (40, save.start_s)
    spans = run_attempt(T0, 0, load=None, last=47).end()
    step = [s for s in spans.spans if s.iteration == 47][0]
    assert goodput.last_progress(spans) == (47, step.end_s)


@documents(
    "health.md",
    "step time = `data_loading + forward_backward + optimizer + communication`, samples",
)
def test_the_median_step_is_the_step_phases_per_step_after_the_warm_up():
    """Steps of 0.095 s (data, compute, communication, optimizer) with 0.9 s of other between
    them after a 20 s warm-up step, no iteration spans, exports every 5 s: the median step is
    0.095 s (within the share of a step an export cuts), not 1 s and not the warm-up's."""
    r = SimRank(T0, step_spans=False)
    r.advance(2.0)
    r.step(extra_first=20.0)
    for _ in range(10):
        r.advance(0.9)
        r.step()
    process = r.end()
    assert goodput.median_step_s(process) == pytest.approx(STEP, rel=0.1)


@documents("health.md", "is that pause's badput, not productive communication")
def test_a_peers_longer_save_is_the_jobs_blocked_time():
    """Rank 1 saves step 20 for 3 s, rank 0 (the reference) for 1 s and then waits 2 s in the
    next all-reduce: the job's checkpoint_save is 3 s, and the wait is not productive."""
    sims = []
    for rank, save_s in ((0, 1.0), (1, 3.0)):
        sim = SimRank(T0, rank=rank)
        sim.advance(1.0)
        for _ in range(20):
            sim.step()
        sim.phase(L.CHECKPOINT_SAVE, save_s, 20)
        sim.step(communication=0.005 + (3.0 - save_s))  # waits for the slower saver
        for _ in range(9):
            sim.step()
        sim.sample()  # the export at shutdown
        sim.end()
        sims.append(sim)
    (item,) = goodput.account(attempts([s.process for s in sims])).attempts
    assert item.reference_rank == 0
    assert item.buckets["checkpoint_save"] == pytest.approx(3.0, abs=1e-5)
    # 30 steps: the warm-up less its excess (0.095) and 29 x (compute 0.06 + comm 0.005 +
    # optimizer 0.01); the 2 s wait is the save's
    assert item.productive_s == pytest.approx(0.095 + 29 * 0.075, abs=1e-5)
    assert item.buckets["data_wait"] == pytest.approx(29 * 0.02, abs=1e-5)
    total = item.productive_s + sum(v for k, v in item.buckets.items() if k != "downtime")
    assert total == pytest.approx(item.end_s - item.start_s, abs=1e-6)


@documents("health.md", "`killed` (no shutdown ran")
def test_a_rank_waiting_for_a_peers_save_is_no_hang_in_the_account():
    """Killed while rank 1 saves within its budget and rank 0 (the reference) has waited 100 s
    in communication, past its 60 s floor: the job was not hung, so no hang bucket; the same
    account without the job's verdict would have called it one."""
    from otel_training.report.health_incidents import judge_attempt

    policy = hang.HangPolicy(floor_s=60.0)
    sims = []
    for rank in (0, 1):
        sim = SimRank(T0, rank=rank)
        sim.advance(1.0)
        for _ in range(20):
            sim.step()
        code = L.COMMUNICATION if rank == 0 else L.CHECKPOINT_SAVE
        sim.ledger.enter(code)
        sim.advance(100.0)
        sim.sample()
        sim.process.open_spans += 1
        sims.append(sim.end())
    found = attempts(sims)
    alone = goodput.account(found, policy).attempts[0]
    joint = goodput.account(
        found, policy, hung_at=lambda a, t: judge_attempt(a, t, policy).hung
    ).attempts[0]
    assert alone.buckets["hang"] > 99.0 and alone.ended == "hung"
    assert joint.buckets["hang"] == 0.0 and joint.ended == "killed"
