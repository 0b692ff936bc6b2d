"""Goodput over attempts that roll back, crash in a loop or end in every way (health/goodput.py,
docs/health.md, "Goodput"): scripted attempts on the real ledger (``run_attempt`` of
test_health_goodput, :class:`health_sim.SimRank`), each value computed by hand from the script."""

from __future__ import annotations

import pytest
from doc_rules import documents
from health_sim import SimRank, job_resource, simulated, write_process
from test_health_goodput import GAP, STEP, T0, WARMUP, run_attempt

from otel_training.health import goodput
from otel_training.health import ledger as L
from otel_training.health.evidence import PhaseSpan, Process, attempts
from otel_training.report import load_job

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


# -- endings, attempts without exports, crash loops ------------------------------------------


def crashed_at_startup(created: float, attempt: int, seconds: float, *, how: str) -> Process:
    """A process that dies ``seconds`` into its startup, before its first export (every 5 s)
    when ``seconds`` < 5: ``how`` is ``"killed"`` (its startup span left open), ``"failed"``
    (its startup span ended with status ERROR) or ``"closed"`` (ended without an error)."""
    r = SimRank(created, attempt=attempt)
    r.advance(seconds)
    if how == "killed":
        r.span("megatron.startup", L.STARTUP, created, None)
        r.process.open_spans += 1
    else:
        r.process.spans.append(
            PhaseSpan("megatron.startup", L.STARTUP, created, r.now, failed=how == "failed")
        )
    return r.end()


def failed_in_warmup(created: float, attempt: int, load: int) -> Process:
    """Startup 1 s (its span closed), a load of ``load`` (0.5 s), then its first iteration
    raises after 0.4 s; no export (1.9 s)."""
    r = SimRank(created, attempt=attempt)
    r.advance(1.0)
    r.span("megatron.startup", L.STARTUP, created, r.now)
    r.phase(L.CHECKPOINT_LOAD, 0.5, load)
    start = r.now
    r.advance(0.4)
    r.process.spans.append(
        PhaseSpan("megatron.train.first_iteration", L.WARMUP, start, r.now, load + 1, failed=True)
    )
    return r.end()


def ended(*processes: Process) -> list[str]:
    return [a.ended for a in goodput.account(attempts(processes)).attempts]


@documents("health.md", "also when the run itself raised after its last completed step")
def test_a_run_that_raised_after_its_last_step_failed():
    """The run's span ended ERROR after the last completed step (an exception or a Ctrl-C
    between steps): failed; ended ERROR before steps that completed after it (a second run in
    the same process): completed."""
    process = run_attempt(T0, 0, load=None, last=30).end()
    last_step_end = max(s.end_s for s in process.spans if s.phase == L.ITERATION)
    process.run_raised_s = last_step_end + 0.01
    assert ended(process) == ["failed"]
    process.run_raised_s = last_step_end - 5 * STEP
    assert ended(process) == ["completed"]


@documents("health.md", "an evaluation or a save whose error the program caught")
@pytest.mark.parametrize("step_spans", [True, False], ids=["step-spans", "default-groups"])
def test_an_error_caught_before_more_steps_is_no_failure(step_spans):
    """An evaluation span ended ERROR at step 25 (the program caught it), steps 26-30 after
    it: completed, with the iteration spans and without them (the ledger's exports know the
    steps); the same evaluation after the last step: failed."""
    r = run_attempt(T0, 0, load=None, last=25, step_spans=step_spans)
    start = r.now
    r.advance(0.1)
    r.process.spans.append(PhaseSpan("megatron.evaluate", L.EVALUATE, start, r.now, 25,
                                     failed=True))  # fmt: skip
    while r.iteration < 30:
        r.step()
        r.advance(GAP)
    r.sample()  # the final export, at shutdown
    assert ended(r.end()) == ["completed"]
    late = run_attempt(T0, 0, load=None, last=30, step_spans=step_spans)
    start = late.now
    late.advance(0.1)
    late.process.spans.append(PhaseSpan("megatron.evaluate", L.EVALUATE, start, late.now, 30,
                                        failed=True))  # fmt: skip
    late.sample()
    assert ended(late.end()) == ["failed"]


@documents("health.md", "`completed` (the last attempt, when every process shut down cleanly")
@documents("health.md", "`failed` (a phase raised and no step completed after it")
@documents("health.md", "`killed` (no shutdown ran")
@documents("health.md", "`exited` (the others")
@documents("health.md", "`failed` also when a shutdown ran inside a phase")
@documents("health.md", "once a later attempt has started, an attempt is never running")
def test_an_attempt_is_completed_only_when_it_shut_down_after_completing_a_step():
    """The last attempt: 30 steps and a clean shutdown, completed; dead 3 s into its startup
    with the startup span open, killed; with it ended ERROR, failed; with it closed and no step,
    exited; raised in its first iteration after a load, failed; a shutdown inside a step (the
    iteration span truncated, no signal), failed. Before the last: killed, not exited."""
    assert ended(run_attempt(T0, 0, load=None, last=30).end()) == ["completed"]
    assert ended(crashed_at_startup(T0, 0, 3.0, how="killed")) == ["killed"]
    assert ended(crashed_at_startup(T0, 0, 3.0, how="failed")) == ["failed"]
    assert ended(crashed_at_startup(T0, 0, 3.0, how="closed")) == ["exited"]
    assert ended(failed_in_warmup(T0, 0, 40)) == ["failed"]
    r = run_attempt(T0, 0, load=None, last=30)
    start = r.now
    r.advance(0.05)
    r.process.spans.append(PhaseSpan("megatron.train.iteration", L.ITERATION, start, r.now, 31,
                                     truncated=True))  # fmt: skip
    assert ended(r.end()) == ["failed"]
    first = crashed_at_startup(T0, 0, 3.0, how="killed")
    later = run_attempt(T0 + 10.0, 1, load=None, last=5).end()
    assert ended(first, later) == ["killed", "completed"]
    # judged just after its end, it would be running; a later attempt has started: killed
    assert goodput.account(attempts([first]), now_s=T0 + 4.0).attempts[0].ended == "running"
    judged = goodput.account(attempts([first, later]), now_s=T0 + 4.0)
    assert judged.attempts[0].ended == "killed"


@documents("health.md", "An attempt whose ranks exported no ledger")
@documents("health.md", "the end of its first iteration or warm-up span that completed")
def test_an_attempt_killed_before_its_first_export_is_placed_by_its_spans():
    """Killed 3.855 s in (exports every 5 s: none): startup 1 s and a load of step 40 (0.5 s)
    from its spans, time to start at its warm-up's end (1 + 0.5 + 0.6 s); the next attempt
    loads step 40 again, so its steps 41-58 and the cut step are lost progress."""
    r = SimRank(T0, attempt=0)
    r.advance(1.0)
    r.span("megatron.startup", L.STARTUP, T0, r.now)
    r.phase(L.CHECKPOINT_LOAD, 0.5, 40)
    r.iteration = 40
    for _ in range(18):
        r.step()
        r.advance(GAP)
    r.begin_step(0.05)
    p0 = r.end()
    assert not p0.samples and r.now - T0 == pytest.approx(3.855)
    p1 = run_attempt(r.now + DOWN, 1, load=40, last=45).end()
    job = goodput.account(attempts([p0, p1]))
    first = job.attempts[0]
    assert first.reference_rank == 0 and first.ended == "killed"
    assert first.time_to_start_s == pytest.approx(1.0 + 0.5 + WARMUP)
    assert first.buckets["startup"] == pytest.approx(1.0)
    assert first.buckets["checkpoint_load"] == pytest.approx(0.5)
    assert first.lost_iterations == (41, 58)
    assert first.buckets["lost_progress"] == pytest.approx(
        WARMUP + GAP + 17 * (STEP + GAP) + 0.05, abs=1e-5
    )
    assert first.productive_s == 0.0 and first.buckets["other"] == pytest.approx(0.0, abs=1e-5)
    assert any("Attempt 0" in n and "spans" in n for n in job.notes)
    assert_partition(job)


@documents("health.md", "Each attempt counts, however short")
@documents("health.md", "An attempt that completed no step has no time to start")
@documents("health.md", "none of them negative")
def test_twenty_attempts_of_a_crash_loop_are_twenty_attempts():
    """Attempt 0 runs steps 1-40 (saves at 20 and 40) and dies inside step 41; attempts 1-18
    crash in turn, by threes: killed 1 s into startup (no export), a load of step 40 then a
    first iteration that raises (no export), killed 6 s into startup (one export); attempt 19
    loads step 40 and runs to 60. Every value by hand."""
    a0 = run_attempt(T0, 0, load=None, last=40, cut_s=0.05)
    processes = [a0.end()]
    for i in range(1, 19):
        created = processes[-1].alive_s + DOWN
        if i % 3 == 1:
            processes.append(crashed_at_startup(created, i, 1.0, how="killed"))
        elif i % 3 == 2:
            processes.append(failed_in_warmup(created, i, 40))
        else:
            processes.append(crashed_at_startup(created, i, 6.0, how="killed"))
    processes.append(run_attempt(processes[-1].alive_s + DOWN, 19, load=40, last=60).end())
    assert sum(1 for p in processes if not p.samples) == 12
    job = goodput.account(attempts(processes))
    assert len(job.attempts) == 20 and [a.attempt for a in job.attempts] == list(range(20))
    assert [a.ended for a in job.attempts] == ["killed"] + ["killed", "failed", "killed"] * 6 + [
        "completed"
    ]
    loop = job.attempts[1:19]
    assert all(a.productive_s == 0.0 and a.time_to_start_s is None for a in loop)
    assert all(a.time_to_recover_s is None for a in job.attempts[:18])  # none after it stepped
    assert [a.buckets["startup"] for a in loop] == pytest.approx([1.0, 1.0, 6.0] * 6)
    assert [a.buckets["checkpoint_load"] for a in loop] == pytest.approx([0.0, 0.5, 0.0] * 6)
    # the raising first iteration ran after step 40, which attempt 19 restored: lost
    assert [a.buckets["lost_progress"] for a in loop] == pytest.approx([0.0, 0.4, 0.0] * 6)
    # attempt 0 keeps steps 1-40: it loses the gap after step 40 and the cut step
    first, last = job.attempts[0], job.attempts[19]
    assert first.lost_iterations is None
    assert first.buckets["lost_progress"] == pytest.approx(GAP + 0.05, abs=1e-3)
    productive = STEP + 39 * (STEP - 0.02) + STEP + 19 * (STEP - 0.02)
    assert first.productive_s + last.productive_s == pytest.approx(productive, abs=0.02)
    expected = {
        "startup": 2.0 + 6 * (1.0 + 1.0 + 6.0) + 2.0,
        "checkpoint_load": 6 * 0.5 + 0.3,
        "warmup_excess": 2 * (WARMUP - STEP),
        "checkpoint_save": 2 * 0.25 + 1 * 0.25,  # 20, 40; 60
        "evaluate": 0.4 + 0.4,  # 25; 50
        "data_wait": (39 + 19) * 0.02,
        "lost_progress": GAP + 0.05 + 6 * 0.4,
        "hang": 0.0,
        "downtime": 19 * DOWN,
        "other": 39 * GAP + 20 * GAP,
    }
    for name, value in expected.items():
        assert job.buckets[name] == pytest.approx(value, abs=0.02), name
    wall = processes[-1].alive_s - T0
    assert job.wall_s == pytest.approx(wall)
    assert job.goodput == pytest.approx(productive / wall, abs=1e-3) and job.goodput < 0.1
    assert last.time_to_start_s == pytest.approx(2.0 + 0.3 + WARMUP)
    assert job.attempts[18].time_to_recover_s == pytest.approx(DOWN + 2.0 + 0.3 + WARMUP)
    assert_partition(job)


def killed_in_a_step(created: float) -> SimRank:
    """A process that ran 5 steps and a save and was killed inside step 6 (its span open)."""
    sim = simulated(created)
    sim.begin_step(0.05)
    return sim


def test_an_attempt_that_a_later_one_followed_is_never_in_progress(tmp_path):
    """Attempt 0 killed inside a step (a span left open), its files written just now: alone, it
    is probably still in progress; once attempt 1 has started (its own run directory, or the
    same files), the report and the trace say attempt 0 ended without shutting down."""
    out = tmp_path / "out"
    first = job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run-a0", "job")
    write_process(out / "run-a0", killed_in_a_step(T0), first)
    (alone,) = load_job(out / "run-a0").runs
    assert any("still in progress" in n for n in alone.notes)
    second = job_resource(0, 1, "2027-01-15T08:01:40.000Z", "run-a1", "job")
    write_process(out / "run-a1", simulated(T0 + 100), second)
    for purpose, shown in (("report", "run-a0"), ("trace", "run-a0"), ("report", "run-a1")):
        earlier, later = load_job(out / shown, purpose=purpose).runs
        assert (earlier.attempt, later.attempt) == (0, 1)
        assert not any("in progress" in n for n in earlier.notes), purpose
        assert any("later attempt" in n and "without shutting down" in n for n in earlier.notes)
    # both attempts appended to the same files of one run directory
    same = tmp_path / "same" / "run"
    write_process(same, killed_in_a_step(T0), job_resource(0, 0, first["process.creation.time"],
                                                           "run", "job"))  # fmt: skip
    write_process(same, simulated(T0 + 100), job_resource(0, 1, second["process.creation.time"],
                                                          "run", "job"))  # fmt: skip
    earlier, later = load_job(same).runs
    assert not any("in progress" in n for n in earlier.notes)
    assert any("later attempt" in n for n in earlier.notes)


def test_the_first_step_of_a_lost_range_is_any_ranks_save_after_the_load():
    """Two ranks of an attempt whose exports show step 19 only (the per-step spans off): rank
    0 alone saved step 10 (DDP), rank 1 is the reference. Steps from 10 on were reached; the
    reference's own lowest step is 19; a save at or below the load (step 5) says nothing; a
    failed save span says nothing either."""
    from otel_training.health.evidence import Attempt, Sample

    def rank(number: int, saved: int | None) -> Process:
        process = Process(rank=number, attempt=0, created_s=T0)
        process.samples.append(Sample(T0 + 1.0, loaded_iteration=5))
        process.samples.append(Sample(T0 + 9.0, iteration=19, progress_s=T0 + 8.9,
                                      saved_iteration=saved, loaded_iteration=5))  # fmt: skip
        return process

    reference, saver = rank(1, None), rank(0, 10)
    attempt = Attempt(0, True, [saver, reference])
    assert goodput._first_step(reference, attempt) == 10
    assert goodput._first_step(reference, Attempt(0, True, [reference])) == 19
    assert goodput._first_step(reference, Attempt(0, True, [rank(0, 5), reference])) == 19
    failed = rank(0, None)
    failed.spans.append(PhaseSpan("megatron.checkpoint.save", L.CHECKPOINT_SAVE, T0 + 2.0,
                                  T0 + 2.5, 12, failed=True))  # fmt: skip
    assert goodput._first_step(reference, Attempt(0, True, [failed, reference])) == 19
    failed.spans[0].failed = False
    assert goodput._first_step(reference, Attempt(0, True, [failed, reference])) == 12
