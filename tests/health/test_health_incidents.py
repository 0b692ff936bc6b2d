"""Incidents and their moments (health/incidents.py, report/health.py, docs/health.md
"Incidents"): scripted ranks on a fake clock, every moment computed by hand from the script."""

from __future__ import annotations

import json

import pytest
from doc_rules import documents
from health_sim import SimRank

from otel_training.health import incidents as I
from otel_training.health import ledger as L
from otel_training.health.evidence import Job
from otel_training.health.hang import HangPolicy, HangVerdict
from otel_training.report import health as report_health
from otel_training.report import health_incidents
from otel_training.report.health import assess, format_text

T0 = 1_800_000_000.0
#: H in a step phase for these jobs: the floor (5 median steps of 0.095 s are less).
POLICY = HangPolicy(floor_s=10.0)
#: Steps of SimRank.step(): 0.02 + 0.06 + 0.005 + 0.01 s; the first 0.505 s longer.
STEP_S = 0.095
FIRST_S = 0.6
#: The precision of a detection moment (incidents.TOLERANCE_S).
TOL = I.TOLERANCE_S + 1e-6


def start(ranks: int, created: float, attempt: int | None, **kw) -> list[SimRank]:
    """``ranks`` processes created at ``created`` that start for 2 s and run 30 steps: step k
    ends at created + 2 + 0.6 + (k - 1) x 0.095 (step 30 at created + 5.355)."""
    sims = [SimRank(created, rank=r, attempt=attempt, **kw) for r in range(ranks)]
    for sim in sims:
        sim.process.resource["dl.world_size"] = ranks
        sim.advance(2.0)
        for _ in range(30):
            sim.step()
    return sims


def stuck(sims: list[SimRank], culprit: int, seconds: float, waits_in: int = L.COMMUNICATION):
    """``culprit`` is stuck in forward_backward, the others wait in ``waits_in``, for
    ``seconds``; then every process dies (no shutdown: its last export is its last sign)."""
    for sim in sims:
        sim.ledger.enter(L.ITERATION)
        sim.ledger.enter(L.FORWARD_BACKWARD if sim.process.rank == culprit else waits_in)
        sim.advance(seconds)
    for sim in sims:
        sim.process.alive_s = sim.process.last_s
        sim.process.open_spans = 1


def processes(*groups: list[SimRank]) -> Job:
    return Job("job", [], [sim.process for group in groups for sim in group])


def only(health, kind: str) -> I.Incident:
    (incident,) = [x for x in health.incidents if x.kind == kind]
    return incident


@documents("health.md", "An incident's counts from when the incident began.")
@documents("health.md", "An attempt's `time_to_recover_s` ([goodput](#goodput)) is Meta's")
@documents("health.md", "`watchdog`: when a rank's watchdog first wrote its stacks during the")
@documents("health.md", "for a hang that lasted until its attempt ended, the first step completed")
@documents("health.md", "detected: the earliest moment at which the verdict, judged with the files")
@documents("health.md", "began: the latest of any rank's last progress before it (its last")
def test_a_hang_followed_by_a_restart_is_recovered_by_the_first_step_of_the_restart():
    """Attempt 0: step 30 ends at T0 + 5.355, then rank 1 is stuck in compute while rank 0
    waits in communication, until both die at T0 + 45 (the last export); rank 1's watchdog
    wrote its stacks at T0 + 16. H = 10 s: detected and localised (outside_communication) at
    T0 + 15.355; attempt 1, created at T0 + 50, completes its first step at T0 + 52.6:
    recovered 47.245 s after it began."""
    first = start(2, T0, 0)
    stuck(first, culprit=1, seconds=40.0)
    first[1].process.stacks.append({"record": "stacks", "time_ns": int((T0 + 16.0) * 1e9)})
    second = [SimRank(T0 + 50.0, rank=r, attempt=1) for r in (0, 1)]
    for sim in second:
        sim.advance(2.0)
        sim.step()
        sim.end()
    health = assess(processes(first, second), now_s=T0 + 1000.0, policy=POLICY)
    x = only(health, "hang")
    began = T0 + 2.0 + FIRST_S + 29 * STEP_S
    assert x.began_s == pytest.approx(began, abs=1e-4)
    assert began + 10.0 < x.detected_s <= began + 10.0 + TOL
    assert x.localised_s == x.detected_s
    assert x.culprits == (1,) and x.rule == "outside_communication" and x.stalled == 2
    assert x.recovered_s == pytest.approx(T0 + 50.0 + 2.0 + FIRST_S)
    assert x.time_to_recover_s == pytest.approx(47.245)
    assert x.recovered_in == (1, 0) and x.restarts == 1 and x.unrecovered is None
    assert (x.attempt, x.cohort) == (0, 0)
    assert x.watchdog_s == pytest.approx(T0 + 16.0)
    # the attempts' own time to recover counts from the hung attempt's end, not from the hang
    assert health.account.attempts[0].time_to_recover_s == pytest.approx(52.6 - 45.0)


@documents("health.md", "however many attempts failed in between (`restarts` counts the attempts")
def test_a_hang_in_attempt_1_is_recovered_in_attempt_3_after_a_crash_loop():
    """Attempt 1 hangs (rank 0 the culprit, stuck in compute) and dies; attempt 2 dies in its
    startup after 1 s without a step; attempt 3 completes its first step at T0 + 60 + 2.6:
    recovered there, after 2 restarts."""
    first = start(2, T0, 1)
    stuck(first, culprit=0, seconds=30.0)
    crash = [SimRank(T0 + 40.0, rank=r, attempt=2) for r in (0, 1)]
    for sim in crash:
        sim.advance(1.0)
        sim.end()
    third = [SimRank(T0 + 60.0, rank=r, attempt=3) for r in (0, 1)]
    for sim in third:
        sim.advance(2.0)
        for _ in range(3):
            sim.step()
        sim.end()
    health = assess(processes(first, crash, third), now_s=T0 + 1000.0, policy=POLICY)
    x = only(health, "hang")
    assert x.attempt == 1 and x.culprits == (0,)
    assert x.recovered_s == pytest.approx(T0 + 62.6)
    assert x.recovered_in == (3, 0) and x.restarts == 2
    assert x.time_to_recover_s == pytest.approx(62.6 - 5.355, abs=1e-4)
    text = format_text(health)
    assert "(in attempt 3, after 2 restarts)" in text


@documents("health.md", "`not_restarted` (no later attempt: a job killed and never restarted)")
def test_a_killed_job_that_was_never_restarted_has_no_recovery_and_says_so():
    """The hung attempt is the last and ended long before now: recovered null,
    unrecovered "not_restarted", in the JSON and the terminal."""
    first = start(2, T0, 0)
    stuck(first, culprit=1, seconds=30.0)
    health = assess(processes(first), now_s=T0 + 3600.0, policy=POLICY)
    (entry,) = health.to_json()["incidents"]
    assert entry["kind"] == "hang" and entry["recovered"] is None
    assert entry["time_to_recover_s"] is None and entry["unrecovered"] == "not_restarted"
    assert entry["recovered_in"] is None and entry["restarts"] == 0
    assert "not recovered: the job was not restarted after it" in format_text(health)


@documents("health.md", "`no_step_after` (later attempts, none of which completed a step)")
def test_a_hang_whose_restarts_never_completed_a_step_is_not_recovered():
    """Two restarts after the hang, each dead in its startup: no_step_after, 2 restarts."""
    first = start(2, T0, 0)
    stuck(first, culprit=1, seconds=30.0)
    later = []
    for n in (1, 2):
        for r in (0, 1):
            sim = SimRank(T0 + 30.0 + 10.0 * n, rank=r, attempt=n)
            sim.advance(1.0)
            sim.end()
            later.append(sim)
    x = only(assess(processes(first, later), now_s=T0 + 3600.0, policy=POLICY), "hang")
    assert x.recovered_s is None and x.unrecovered == "no_step_after" and x.restarts == 2


@documents(
    "health.md", "Without a recovery, recovered is null and `unrecovered` says why: `running`"
)
def test_a_running_job_that_is_still_hung_is_not_recovered():
    """Judged within two export intervals of its last export: running, still hung."""
    first = start(2, T0, 0)
    stuck(first, culprit=1, seconds=30.0)
    x = only(assess(processes(first), now_s=first[0].now + 1.0, policy=POLICY), "hang")
    assert x.unrecovered == "running" and x.recovered_s is None
    assert "not recovered: still hung now" in format_text(
        assess(processes(first), now_s=first[0].now + 1.0, policy=POLICY)
    )


def stall_and_resume(step_spans: bool) -> list[SimRank]:
    """Two ranks, 200 steps (step 200 ends at T0 + 5.355 + 170 x 0.095 = T0 + 21.505); step
    201 takes 25.095 s (rank 1 computes 25 s longer, rank 0 waits as long in communication)
    and ends at T0 + 46.6; then 60 more steps of 0.095 s: a hang that ends within its
    attempt."""
    sims = start(2, T0, 0, step_spans=step_spans)
    for sim in sims:
        for _ in range(170):
            sim.step()
    sims[0].step(communication=25.005)
    sims[1].step(compute=25.06)
    for sim in sims:
        for _ in range(60):
            sim.step()
        sim.end()
    return sims


@documents("health.md", "Without per-step spans the first step after a stall that ended within its")
@documents("health.md", "recovered: for a hang that ended within its attempt (progress came again)")
@documents("health.md", "A hang is one stretch of an attempt during which the")
@pytest.mark.parametrize("step_spans", [True, False], ids=["per_step", "default_groups"])
def test_a_stall_that_resolves_itself_is_an_incident_recovered_by_its_next_step(step_spans):
    """Began when step 200 ended (T0 + 21.505), detected and localised 10 s later, recovered
    when step 201 completed (T0 + 46.6), in the same attempt. Without per-step spans the files
    date it through the next export's step (step 236, T0 + 49.925) less 35 median steps
    (0.095 s): within a step of it, said to be estimated."""
    sims = stall_and_resume(step_spans)
    health = assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY)
    x = only(health, "hang")
    began = T0 + 21.505
    assert x.began_s == pytest.approx(began, abs=1e-4)
    assert began + 10.0 < x.detected_s <= began + 10.0 + TOL
    assert x.culprits == (1,) and x.localised_s == x.detected_s
    assert x.recovered_s == pytest.approx(T0 + 46.6, abs=1e-4 if step_spans else STEP_S)
    assert x.time_to_recover_s == pytest.approx(25.095, abs=1e-4 if step_spans else STEP_S)
    assert x.recovered_in == (0, 0) and x.restarts == 0
    assert bool(x.estimated) is not step_spans
    assert health.attempts[0].hang is not None and not health.attempts[0].hang.hung


@documents("health.md", "A stretch without progress is judged at the last export inside it, the")
@pytest.mark.parametrize("step_spans", [True, False], ids=["per_step", "default_groups"])
def test_a_stall_shorter_than_h_is_no_incident(step_spans):
    """A 9.695 s stall (step 31 ends at T0 + 15.05) under a 10 s H: nothing. Without per-step
    spans the files show no progress from step 30 (T0 + 5.355) to the step that the export at
    T0 + 20 dates (T0 + 19.99), longer than H; but the last export inside that stretch
    (T0 + 15) is 9.645 s after its start."""
    sims = start(2, T0, 0, step_spans=step_spans)
    sims[0].step(communication=0.005 + 9.6)
    sims[1].step(compute=0.06 + 9.6)
    for sim in sims:
        for _ in range(60):
            sim.step()
        sim.end()
    assert assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY).incidents == []
    if not step_spans:
        dated = sorted(s.progress_s for s in sims[0].process.samples if s.progress_s)
        assert any(b - a > 10.0 for a, b in zip(dated, dated[1:]))


@documents("health.md", "and the end of a pause span (a checkpoint save or load, an evaluation")
def test_a_long_save_within_its_budget_is_no_incident_and_a_hang_after_it_begins_at_its_end():
    """Rank 0 saves for 40 s (budget 60 s) while rank 1 waits in communication: no incident;
    then rank 1 is stuck: the hang began when the save ended (the waiting peer's hang age
    counts from it), not at the save's start."""
    sims = start(2, T0, 0)
    policy = HangPolicy(floor_s=10.0, phase_budget_s=60.0)
    sims[0].phase(L.CHECKPOINT_SAVE, 40.0, 30)
    comm = sims[1].ledger.enter(L.COMMUNICATION)
    sims[1].advance(40.0)
    sims[1].ledger.exit(comm, L.COMMUNICATION)
    save_end = sims[0].now
    stuck(sims, culprit=1, seconds=30.0)
    x = only(assess(processes(sims), now_s=T0 + 3600.0, policy=policy), "hang")
    assert x.began_s == pytest.approx(save_end)
    assert save_end + 10.0 < x.detected_s <= save_end + 10.0 + TOL


@documents("health.md", "A hang's `culprits` and `rule` are its verdict's at its end")
@documents(
    "health.md", "localised: the earliest moment from detected on at which that verdict names"
)
@documents("health.md", "judged with the files as they stood then (nothing written later)")
def test_a_silent_culprit_is_localised_when_its_silence_is_seen():
    """Rank 1's exports stop after T0 + 5 (SIGSTOP, a GIL held), its spans show step 30 done
    at T0 + 5.355; both ranks sit in forward_backward (DDP without the hook: no rule tells
    them apart until the silence). H = 10 s: hung at T0 + 15.355 with no culprit; rank 1 is
    silent from its last export + 2 intervals + 1 s = T0 + 16: localised then."""
    sims = start(2, T0, 0)
    for sim in sims:
        sim.ledger.enter(L.ITERATION)
        sim.ledger.enter(L.FORWARD_BACKWARD)
    sims[1].next_export = float("inf")
    sims[1].advance(30.0)
    sims[0].advance(30.0)
    for sim in sims:
        sim.process.alive_s = sim.process.last_s
        sim.process.open_spans = 1
    x = only(assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY), "hang")
    assert x.culprits == (1,) and x.rule == "silent"
    assert T0 + 15.355 < x.detected_s <= T0 + 15.355 + TOL
    assert T0 + 16.0 < x.localised_s <= T0 + 16.0 + TOL
    assert x.time_to_localise_s == pytest.approx(16.0 - 5.355, abs=TOL)


@documents("health.md", "and before that just before each silence of a rank in it ended")
def test_a_rank_stopped_in_its_save_and_continued_is_a_hang_that_ended_with_its_silence():
    """Rank 0 enters a 40 s save (budget 60 s) right after step 30 (T0 + 5.355) and is stopped
    for 35 s (no export from T0 + 5 to T0 + 40); rank 1 waits in communication. Hung while rank
    0 is silent (from T0 + 16: 2 intervals + 1 s after its last export; rank 1 stalled since
    T0 + 15.355), not at the last export before progress (rank 0 then paused within its
    budget, excusing rank 1): one incident, culprit rank 0 (silent), detected at T0 + 16,
    recovered when step 31 ended (T0 + 45.45)."""
    sims = start(2, T0, 0)
    policy = HangPolicy(floor_s=10.0, phase_budget_s=60.0)
    saving, waiting = sims
    began = saving.now
    token = saving.ledger.enter(L.CHECKPOINT_SAVE)
    saving.next_export = float("inf")
    saving.advance(34.645)
    saving.next_export = T0 + 40.0
    saving.advance(5.355)
    saving.ledger.exit(token, L.CHECKPOINT_SAVE, 30)
    saving.span("megatron.checkpoint.save", L.CHECKPOINT_SAVE, began, saving.now, 30)
    comm = waiting.ledger.enter(L.COMMUNICATION)
    waiting.advance(40.0)
    waiting.ledger.exit(comm, L.COMMUNICATION)
    for sim in sims:
        for _ in range(60):
            sim.step()
        sim.end()
    x = only(assess(processes(sims), now_s=T0 + 3600.0, policy=policy), "hang")
    assert x.culprits == (0,) and x.rule == "silent"
    assert x.began_s == pytest.approx(T0 + 5.355, abs=1e-4)
    assert T0 + 16.0 < x.detected_s <= T0 + 16.0 + TOL and x.localised_s == x.detected_s
    assert x.recovered_s == pytest.approx(T0 + 45.45, abs=1e-4)


@documents("health.md", "null when it names none (every rank waits at the same place)")
def test_a_hang_with_no_culprit_is_never_localised():
    """Every rank waits in forward_backward at the same step: rule null, localised null."""
    sims = start(2, T0, 0)
    stuck(sims, culprit=1, seconds=30.0, waits_in=L.FORWARD_BACKWARD)
    x = only(assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY), "hang")
    assert x.culprits == () and x.rule is None
    assert x.localised_s is None and x.time_to_localise_s is None
    assert "no culprit named" in format_text(
        assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY)
    )


def straggler_job(hang_after: bool = False) -> list[SimRank]:
    """4 ranks, export every second, steps of 0.1 s (the first 0.6 s) after 0.45 s of startup:
    step k ends at T0 + 1.05 + (k - 1) x 0.1. During steps 51-130 rank 2 computes 0.03 s
    longer and the others wait that long in communication (all steps 0.13 s); then 70 more
    steps of 0.1 s. Windows of 20 steps from step 10 (the first sampled after the warm-up):
    [50, 70] ... [110, 130] flag rank 2, [130, 150] on do not."""
    sims = [SimRank(T0, rank=r, export_s=1.0) for r in range(4)]
    for sim in sims:
        sim.process.resource["dl.world_size"] = 4
        sim.advance(0.45)
        slow = sim.process.rank == 2
        for k in range(1, 201):
            episode = 51 <= k <= 130
            sim.step(
                data=0.02,
                compute=0.06 + (0.03 if episode and slow else 0.0),
                communication=0.01 + (0.03 if episode and not slow else 0.0),
                optimizer=0.01,
                extra_first=0.5,
            )
    if hang_after:
        stuck(sims, culprit=3, seconds=30.0)
    else:
        for sim in sims:
            sim.end()
    return sims


def step_end(k: int) -> float:
    """When step k of :func:`straggler_job` ends."""
    slow = min(max(k - 50, 0), 80)
    return T0 + 1.05 + (k - 1) * 0.1 + slow * 0.03


@documents("health.md", "A straggler is one run of consecutive windows that flag one rank")
@documents("health.md", "began: the start of the run's first window")
@documents("health.md", "detected: the end of the window that made it a straggler (the third")
@documents("health.md", "localised: when it was detected: the score names the rank and its cause")
@documents("health.md", "recovered: the end of the run's last window, when a later window of the")
@documents("health.md", "a straggler's `culprits` is its rank, with its `cause` and median `score`")
def test_a_straggler_episode_begins_with_its_first_flagged_window_and_ends_with_its_last():
    """Began at the start of window [50, 70] (step 50 ended, T0 + 5.95), detected at the end
    of the third flagged window [90, 110] (T0 + 13.75), localised then (rank 2, compute),
    recovered at the end of the last flagged window [110, 130] (T0 + 16.35)."""
    health = assess(processes(straggler_job()), now_s=T0 + 3600.0, policy=POLICY)
    x = only(health, "straggler")
    assert x.culprits == (2,) and x.cause == "compute" and x.rule is None
    assert x.score == pytest.approx(0.12 / 0.09, rel=0.02)
    assert x.began_s == pytest.approx(step_end(50)) == pytest.approx(T0 + 5.95)
    assert x.detected_s == pytest.approx(step_end(110)) == pytest.approx(T0 + 13.75)
    assert x.localised_s == x.detected_s
    assert x.recovered_s == pytest.approx(step_end(130)) == pytest.approx(T0 + 16.35)
    assert x.time_to_recover_s == pytest.approx(10.4)
    assert x.recovered_in is None and x.unrecovered is None
    (straggler,) = health.attempts[0].stragglers.stragglers
    assert straggler.windows == 4  # the incident's windows are the ones assess() counted


@documents("health.md", "An incident is a hang or a straggler with its moments")
@documents("health.md", "`otel-training health` prints one line per incident and `incidents` in")
def test_two_incidents_in_one_job_a_straggler_then_a_hang_recovered_by_a_restart():
    """The straggler episode above, then rank 3 stuck after step 200 and a restart at
    T0 + 80 whose first step ends at T0 + 82.6: two incidents, by when they began."""
    first = straggler_job(hang_after=True)
    second = [SimRank(T0 + 80.0, rank=r, attempt=1) for r in range(4)]
    for sim in second:
        sim.advance(2.0)
        sim.step()
        sim.end()
    health = assess(processes(first, second), now_s=T0 + 3600.0, policy=POLICY)
    assert [x.kind for x in health.incidents] == ["straggler", "hang"]
    straggler, hang = health.incidents
    assert straggler.began_s == pytest.approx(T0 + 5.95)
    assert hang.began_s == pytest.approx(step_end(200))
    assert step_end(200) + 10.0 < hang.detected_s <= step_end(200) + 10.0 + TOL
    assert hang.culprits == (3,) and hang.recovered_s == pytest.approx(T0 + 82.6)
    document = health.to_json()
    assert json.loads(json.dumps(document, allow_nan=False)) == document
    assert [x["kind"] for x in document["incidents"]] == ["straggler", "hang"]
    lines = format_text(health).splitlines()
    start = lines.index("incidents:")
    assert lines[start + 1].startswith("  straggler in attempt 0: began 5.9 s into the job")
    assert "stopped being flagged after 10.4 s" in lines[start + 1]
    assert lines[start + 2].startswith("  hang in attempt 0:")


@documents("health.md", "else null (`still_flagged`)")
def test_a_straggler_still_flagged_when_its_attempt_ended_is_not_recovered():
    """Rank 2 slow from step 51 to the end: still_flagged."""
    sims = [SimRank(T0, rank=r, export_s=1.0) for r in range(4)]
    for sim in sims:
        sim.advance(0.45)
        for k in range(1, 161):
            slow = k > 50 and sim.process.rank == 2
            sim.step(compute=0.06 + 0.03 * slow, communication=0.01 + 0.03 * (k > 50 and not slow),
                     data=0.02, optimizer=0.01, extra_first=0.5)  # fmt: skip
        sim.end()
    x = only(assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY), "straggler")
    assert x.recovered_s is None and x.unrecovered == "still_flagged"


@pytest.mark.slow
@documents("health.md", "`stalled` how many ranks were stalled then")
def test_the_culprit_of_4096_ranks_is_rank_4095():
    """4,096 ranks; rank 4095 stuck in data loading while the others wait in communication:
    one incident, culprit rank 4095, detected 10 s after step 3; its JSON does not list the
    stalled ranks (a count)."""
    sims = []
    for r in range(4096):
        sim = SimRank(T0, rank=r, export_s=5.0, step_spans=False)
        sim.process.resource["dl.world_size"] = 4096
        sim.advance(2.0)
        for _ in range(3):
            sim.step()
        sim.ledger.enter(L.ITERATION)
        sim.ledger.enter(L.DATA_LOADING if r == 4095 else L.COMMUNICATION)
        sim.advance(13.0)
        sim.process.alive_s = sim.process.last_s
        sim.process.open_spans = 1
        sims.append(sim)
    health = assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY)
    x = only(health, "hang")
    began = T0 + 2.0 + FIRST_S + 2 * STEP_S
    assert x.culprits == (4095,) and x.rule == "outside_communication" and x.stalled == 4096
    assert began + 10.0 < x.detected_s <= began + 10.0 + TOL
    (entry,) = health.to_json()["incidents"]
    assert entry["stalled"] == 4096 and entry["culprits"] == [4095]


# -- the arithmetic alone ---------------------------------------------------------------------


@documents("health.md", "Moments are Unix seconds, durations seconds, and all three durations")
def test_the_durations_count_from_when_it_began():
    """time_to_detect, _localise, _recover: each moment minus began; None where None."""
    x = I.Incident("hang", 0, 0, 100.0, 160.0, 170.0, 300.0)
    assert (x.time_to_detect_s, x.time_to_localise_s, x.time_to_recover_s) == (60.0, 70.0, 200.0)
    y = I.Incident("hang", 0, 0, 100.0, 160.0)
    assert y.time_to_localise_s is None and y.time_to_recover_s is None


@pytest.mark.parametrize("guess", [None, 5.0, 12.3456 + 0.005, 12.4, 90.0, 200.0])
def test_the_first_moment_is_found_to_the_tolerance(guess):
    """A predicate true from 12.3456: found in [12.3456, 12.3456 + tolerance], whatever the
    guess (right, too early, too late, outside the range)."""
    calls = []

    def predicate(t: float) -> bool:
        calls.append(t)
        return t >= 12.3456

    found = I.first_moment(predicate, 0.0, 100.0, guess_s=guess)
    assert 12.3456 <= found <= 12.3456 + I.TOLERANCE_S
    if guess == 12.3456 + 0.005:
        assert len(calls) == 3  # the low end, the guess, a tolerance before it


def test_a_verdict_that_is_not_hung_makes_no_incident():
    """hang_incident: None when the verdict at the judged moment is not hung."""
    calm = HangVerdict((), (), False, (), None, 1.0)
    assert I.hang_incident(lambda t: calm, 0.0, 50.0, attempt=0) is None


def test_recovery_is_the_first_later_attempt_that_completed_a_step():
    """Restarts in order: the first with a step end recovers; none: why."""
    later = [I.Restart(2, 0, None), I.Restart(3, 0, 500.0), I.Restart(4, 0, 900.0)]
    assert I.recovery(later) == (500.0, (3, 0), 2, None)
    assert I.recovery([I.Restart(2, 0, None)]) == (None, None, 1, "no_step_after")
    assert I.recovery([]) == (None, None, 0, "not_restarted")


def counting(monkeypatch) -> list[float]:
    """The moments judge_attempt is asked to judge, from now on, by the assessment and by the
    incidents (each module calls it by its own name)."""
    moments: list[float] = []
    judge = health_incidents.judge_attempt

    def counted(attempt, at_s, policy):
        moments.append(at_s)
        return judge(attempt, at_s, policy)

    for module in (report_health, health_incidents):
        monkeypatch.setattr(module, "judge_attempt", counted)
    return moments


@documents("health.md", "Each moment is found among the verdicts of the whole attempt")
def test_a_hang_costs_a_few_verdicts_and_a_long_jobs_pauses_cost_none(monkeypatch):
    """A plain hang: its detection where the step threshold is crossed, in 4 verdicts more
    than the assessment's own; twenty 15 s evaluations (budget 60 s, floor 10 s) with steps
    between: no incident, and no verdict more than the assessment's own."""
    sims = start(2, T0, 0)
    stuck(sims, culprit=1, seconds=30.0)
    moments = counting(monkeypatch)
    assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY)
    with_hang = len(moments)
    monkeypatch.setattr(report_health, "hang_incidents", lambda *a, **k: [])
    moments.clear()
    assess(processes(sims), now_s=T0 + 3600.0, policy=POLICY)
    assert with_hang - len(moments) <= 4
    monkeypatch.undo()

    sims = start(2, T0, 0)
    for _ in range(20):
        for sim in sims:
            sim.phase(L.EVALUATE, 15.0, sim.iteration)
            for _ in range(20):
                sim.step()
    for sim in sims:
        sim.end()
    moments = counting(monkeypatch)
    health = assess(
        processes(sims), now_s=T0 + 3600.0, policy=HangPolicy(floor_s=10.0, phase_budget_s=60.0)
    )
    assert health.incidents == [] and len(moments) <= 2
