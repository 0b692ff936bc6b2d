"""otel-training health (report/health.py, cli.py): the JSON of issue 16 item 3, a hang judged
while the job runs, the terminal summary, the command's exit status."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from doc_rules import documents
from health_sim import SimRank

from otel_training import cli
from otel_training.health import ledger as L
from otel_training.health.evidence import Job
from otel_training.health.hang import HangPolicy
from otel_training.report.health import assess, format_text

T0 = 1_800_000_000.0


def hung_job(
    *, silent_rank: bool = False, waits_in: int = L.COMMUNICATION, more_s: float = 0.0
) -> tuple[Job, float]:
    """Two ranks, 30 steps; then rank 1 is stuck in compute (or stops exporting altogether)
    while rank 0 waits in the collective (in ``waits_in``), for 120 s (+ ``more_s``) of
    exports."""
    ranks = [SimRank(T0, rank=r) for r in (0, 1)]
    for sim in ranks:
        sim.advance(2.0)
        for _ in range(30):
            sim.step()
    ranks[0].ledger.enter(L.ITERATION)
    ranks[0].ledger.enter(waits_in)
    ranks[1].ledger.enter(L.ITERATION)
    if silent_rank:
        ranks[1].advance(1.0)
        ranks[1].next_export = float("inf")  # no more exports: SIGSTOP, a GIL held
        ranks[1].advance(119.0 + more_s)
    else:
        ranks[1].advance(120.0 + more_s)
    ranks[0].advance(120.0 + more_s)
    ranks[1].process.stacks.append(
        {"record": "stacks", "time_ns": int((T0 + 70) * 1e9), "phase": "forward_backward",
         "threads": [{"name": "MainThread", "training": True, "stack": "  in stuck_here\n"}]}
    )  # fmt: skip
    processes = [sim.process for sim in ranks]
    for process in processes:
        process.alive_s = process.last_s
        process.open_spans = 1
    return Job("job", [], processes), ranks[0].now + 1.0


def test_the_json_has_the_shape_of_the_issue():
    """Exactly the keys and types of issue 16 item 3 (more keys welcome)."""
    job, now = hung_job()
    document = assess(job, now_s=now).to_json()
    assert json.loads(json.dumps(document, allow_nan=False)) == document
    assert isinstance(document["job"], str)
    for key in ("wall_s", "goodput", "productive_s"):
        assert isinstance(document[key], float)
    assert list(document["badput_s"]) == [
        "startup", "checkpoint_load", "warmup_excess", "checkpoint_save", "evaluate",
        "data_wait", "lost_progress", "hang", "downtime", "other",
    ]  # fmt: skip
    assert all(isinstance(v, float) for v in document["badput_s"].values())
    (attempt,) = document["attempts"]
    types = {"attempt": int, "run_id": str, "start": float, "end": float,
             "last_iteration": int, "ended": str}  # fmt: skip
    for key, kind in types.items():
        assert isinstance(attempt[key], kind), key
    assert attempt["resumed_from"] is None
    hang = document["hang"]
    assert isinstance(hang["stalled_ranks"], list) and isinstance(hang["culprits"], list)
    assert isinstance(hang["since_s"], float)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in hang["phases"].items())
    assert isinstance(document["stragglers"], list)


@documents(
    "health.md", "`outside_communication`: while at least half of the ranks are in `communication`"
)
def test_a_rank_stuck_outside_the_collective_is_the_culprit():
    """Rank 0 waits in communication, rank 1 computes for 2 minutes: hung, culprit rank 1, its
    stacks in the verdict, the attempt hung."""
    job, now = hung_job()
    document = assess(job, now_s=now).to_json()
    hang = document["hang"]
    assert hang["culprits"] == [1] and hang["rule"] == "outside_communication"
    assert hang["stalled_ranks"] == [0, 1]
    assert hang["phases"] == {"0": "communication", "1": "forward_backward"}
    assert 119.0 < hang["since_s"] <= 120.0  # to its last evidence (an export every 5 s)
    assert "stuck_here" in hang["stacks"]["1"][0]["threads"][0]["stack"]
    assert document["attempts"][0]["ended"] == "hung"
    assert document["badput_s"]["hang"] > 119.0


@documents("health.md", "A rank that holds the GIL or is stopped cannot: it is the silent culprit")
def test_a_rank_that_went_silent_is_the_culprit():
    """Rank 1's exports stop while rank 0's go on: silent, the first rule."""
    job, now = hung_job(silent_rank=True)
    hang = assess(job, now_s=now).to_json()["hang"]
    assert hang["culprits"] == [1] and hang["rule"] == "silent" and hang["silent_ranks"] == [1]


def test_a_healthy_job_has_no_hang():
    """Judged right after its last export, progressing: hang null."""
    job, _ = hung_job()
    for process in job.processes:
        process.samples = [s for s in process.samples if s.time_s < T0 + 10]
        process.alive_s = process.last_s = process.samples[-1].time_s
    assert assess(job, now_s=T0 + 10).to_json()["hang"] is None


def test_the_summary_names_goodput_the_culprit_and_its_stack():
    """The terminal summary: goodput, every bucket, the attempt, the culprit and its stack."""
    job, now = hung_job()
    text = format_text(assess(job, now_s=now))
    assert "goodput" in text and "lost_progress" in text and "downtime" in text
    assert "culprit: rank 1" in text and "rank 1: in forward_backward  <- culprit" in text
    assert "in stuck_here" in text


@documents("health.md", "the job is hung with no culprit (`rule` null, no")
def test_a_hang_whose_ranks_wait_at_the_same_place_names_no_one_and_shows_every_stack():
    """Both ranks in forward_backward at iteration 30 (DDP without the hook, rank 1 stuck in
    its forward pass): hung, no culprit, rule null; the summary says why and shows the stack
    that exists."""
    job, now = hung_job(waits_in=L.FORWARD_BACKWARD)
    health = assess(job, now_s=now)
    hang = health.to_json()["hang"]
    assert hang["culprits"] == [] and hang["rule"] is None and hang["stalled_ranks"] == [0, 1]
    text = format_text(health)
    assert "no culprit: every rank waits at the same place" in text
    assert "<- culprit" not in text and "in stuck_here" in text


def test_the_command_reports_a_directory_without_a_run(tmp_path, capsys):
    """No run in DIR: one line on stderr, exit status 2."""
    assert cli.main(["health", str(tmp_path)]) == 2
    assert "no run found" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_on_a_real_run(tmp_path):
    """A real run of a few steps: --json parses, the summary prints, both exit 0."""
    script = (
        "import otel_training as ot\n"
        "t = ot.configure()\n"
        "with ot.checkpoint_load(iteration=3):\n    pass\n"
        "for i in range(4, 30):\n"
        "    with ot.training_iteration(iteration=i):\n"
        "        with ot.data_loading(iteration=i):\n            pass\n"
        "t.shutdown()\n"
    )
    env = {"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    found = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", "--json", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    document = json.loads(found.stdout)
    (attempt,) = document["attempts"]
    assert attempt["resumed_from"] == 3 and attempt["last_iteration"] == 29
    assert attempt["ended"] == "completed" and document["hang"] is None
    assert abs(document["productive_s"] + sum(document["badput_s"].values())
               - document["wall_s"]) < 1e-6  # fmt: skip
    text = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert text.returncode == 0 and "goodput" in text.stdout


@pytest.mark.slow
@documents("health.md", "also when the run itself raised after its last completed step")
@documents("health.md", "so that `failed` is told with the span groups `none` too")
@documents("health.md", "or the progress record's note that telemetry flushed on it")
@documents("health.md", "an evaluation or a save whose error the program caught")
@documents("health.md", "What the ending cannot know: the process's exit status.")
@documents("health.md", "A program that ends with")
@documents("health.md", "A failed save after the last step makes the attempt `failed`")
@pytest.mark.parametrize("groups", ["default", "none"])
@pytest.mark.parametrize(
    ("case", "ended"),
    [
        ("ctrl-c-between-steps", "failed"),  # handled by the program, as the demo does
        ("error-in-a-step", "failed"),  # not handled: the program ends with a traceback
        ("sys-exit-0", "completed"),  # a clean stop is no failure
        ("second-run-after-ctrl-c", "completed"),  # steps completed after it
        ("sigterm-in-a-step", "sigterm"),  # flushed on the signal: no truncated span says it
        ("error-caught-in-an-evaluation", "completed"),  # steps completed after it
        ("a-loader-thread-first", "completed"),  # its phase opened before the first step
        ("sys-exit-1-after-the-run", "completed"),  # the exit status is not seen
        ("a-save-that-fails-after-the-last-step", "failed"),  # caught, then a clean exit
    ],
)
def test_how_a_run_ends_by_an_error_or_a_signal_with_and_without_spans(
    tmp_path, groups, case, ended
):
    """Real processes, with the default span groups and with none: training_run() left by a
    KeyboardInterrupt after step 5, outside any step, which the program catches before it
    shuts down, failed (not completed); an exception in step 6 that ends the program, failed;
    a SystemExit(0) there, completed; a second run of the process that completes steps after
    the interrupt, completed; SIGTERM in step 3 (the process flushes and ends on it), sigterm
    with every span group off too; an evaluation whose error the program catches in step 3,
    completed (the per-step spans off: the ledger knows the steps after it); a data loader's
    thread that opens a phase before the first step and holds it open while the steps run,
    completed, the training thread's 5 steps counted."""
    after = {
        "ctrl-c-between-steps": "raise KeyboardInterrupt",
        "second-run-after-ctrl-c": "raise KeyboardInterrupt",
        "sys-exit-0": "raise SystemExit(0)",
    }.get(case, "pass")
    script = (
        "import os, signal, time\n"
        "import otel_training as ot\n"
        "import threading\n"
        "t = ot.configure()\n"
        "opened, done = threading.Event(), threading.Event()\n"
        "def load():\n"
        "    with ot.data_loading():\n"
        "        opened.set()\n"
        "        done.wait(60)\n"
        "if %r == 'a-loader-thread-first':\n"
        "    loader = threading.Thread(target=load)\n"
        "    loader.start()\n"
        "    opened.wait(60)\n"
        "try:\n"
        "    with ot.training_run():\n"
        "        for i in range(1, 6 if %r != 'error-in-a-step' else 7):\n"
        "            with ot.training_iteration(iteration=i):\n"
        "                if i == 6:\n"
        "                    raise ValueError('loss is NaN')\n"
        "                if i == 3 and %r == 'sigterm-in-a-step':\n"
        "                    os.kill(os.getpid(), signal.SIGTERM)\n"
        "                    time.sleep(30)\n"
        "            if i == 3 and %r == 'error-caught-in-an-evaluation':\n"
        "                try:\n"
        "                    with ot.evaluation(iteration=i):\n"
        "                        raise ValueError('bad batch')\n"
        "                except ValueError:\n"
        "                    pass\n"
        f"        {after}\n"
        "    if %r == 'a-save-that-fails-after-the-last-step':\n"
        "        try:\n"
        "            with ot.checkpoint_save(iteration=5):\n"
        "                raise OSError('disk full')\n"
        "        except OSError:\n"
        "            pass\n"
        "except (KeyboardInterrupt, SystemExit):\n"
        "    pass\n"
        "if %r == 'second-run-after-ctrl-c':\n"
        "    with ot.training_run():\n"
        "        for i in range(6, 9):\n"
        "            with ot.training_iteration(iteration=i):\n"
        "                pass\n"
        "done.set()\n"
        "t.shutdown()\n"
        "if %r == 'sys-exit-1-after-the-run':\n"
        "    raise SystemExit(1)\n"
    ) % (case, case, case, case, case, case, case)
    env = {"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    if groups == "none":
        env["OTEL_PYTHON_TRAINING_SPAN_GROUPS"] = "none"
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    status = {
        "error-in-a-step": 1,
        "sigterm-in-a-step": -signal.SIGTERM,
        "sys-exit-1-after-the-run": 1,
    }.get(case, 0)
    assert run.returncode == status, run.stderr
    found = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", "--json", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (attempt,) = json.loads(found.stdout)["attempts"]
    assert attempt["ended"] == ended
    last = {"second-run-after-ctrl-c": 8, "sigterm-in-a-step": 2}.get(case, 5)
    assert attempt["last_iteration"] == last


@pytest.mark.slow
@documents("health.md", "a save says it reached that step")
@pytest.mark.parametrize("groups", ["default", "none"])
def test_a_restart_loses_the_steps_after_the_checkpoint_it_resumed_from(tmp_path, groups):
    """Attempt 0 saves step 10 and fails in step 20; attempt 1 resumes from step 10: steps
    11-19 are lost, with the per-step spans and with every span group off (where the first
    export shows step 19 only: the save of step 10 says the attempt reached it), 9 steps of
    10 ms at least."""
    script = (
        "import os, time\n"
        "import otel_training as ot\n"
        "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "t = ot.configure()\n"
        "try:\n"
        "    with ot.training_run():\n"
        "        start = 1\n"
        "        if attempt == 1:\n"
        "            with ot.checkpoint_load(iteration=10):\n"
        "                start = 11\n"
        "        for i in range(start, 31):\n"
        "            with ot.training_iteration(iteration=i):\n"
        "                time.sleep(0.01)\n"
        "                if attempt == 0 and i == 20:\n"
        "                    raise ValueError('loss is NaN')\n"
        "            if i == 10 and attempt == 0:\n"
        "                with ot.checkpoint_save(iteration=10):\n"
        "                    pass\n"
        "except ValueError:\n"
        "    pass\n"
        "t.shutdown()\n"
    )
    env = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path),
        "OTEL_PYTHON_TRAINING_RUN_ID": "restarted",
        "PATH": "/usr/bin:/bin",
    }
    if groups == "none":
        env["OTEL_PYTHON_TRAINING_SPAN_GROUPS"] = "none"
    for attempt in (0, 1):
        env["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    found = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", "--json", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    document = json.loads(found.stdout)
    first, second = document["attempts"]
    assert (first["ended"], first["lost_iterations"]) == ("failed", [11, 19])
    assert (second["ended"], second["resumed_from"]) == ("completed", 10)
    assert 0.09 <= document["badput_s"]["lost_progress"] < 1.0


@documents("health.md", "`otel-training health` judges the last attempt at *now* while it runs")
@documents("health.md", "A hung job's waiting ranks keep")
def test_a_running_attempt_is_judged_now_as_far_as_its_files_show_and_an_ended_one_at_its_end():
    """The hung job judged 2 s after its last evidence (running): as at its last evidence,
    never longer than the files show; judged 1,000 s after it (ended): as at its end; its
    ranks exporting 10 s more, still stuck: 10 s more without progress."""
    job, _ = hung_job()
    end = max(p.alive_s for p in job.processes)
    at_end = assess(job, now_s=end).to_json()["hang"]["since_s"]
    running = assess(job, now_s=end + 2.0).to_json()["hang"]["since_s"]
    ended = assess(job, now_s=end + 1000.0).to_json()["hang"]["since_s"]
    assert running == pytest.approx(at_end) and ended == pytest.approx(at_end)
    later, _ = hung_job(more_s=10.0)
    end_later = max(p.alive_s for p in later.processes)
    running = assess(later, now_s=end_later + 0.5).to_json()["hang"]["since_s"]
    assert running == pytest.approx(at_end + 10.0)


@documents("health.md", "never past its latest evidence of life (an export, a line,")
def test_a_job_killed_inside_a_long_step_is_not_hung_while_it_still_counts_as_running():
    """Every rank of a job killed (SIGKILL, as a restart does) 1.5 s into a 1.8 s step, with
    a 2 s floor: judged 1.5 s after its last evidence (within two export intervals: it still
    counts as running), it is not hung, where judging at now made the step 3 s long (the fault
    campaign's gauntlet raised this false hang); the rules see the targets down."""
    ranks = [SimRank(T0, rank=r, export_s=1.0) for r in (0, 1)]
    for sim in ranks:
        sim.advance(2.0)
        for _ in range(40):
            sim.step(data=0.02, compute=0.15, communication=0.01, optimizer=0.02)
        sim.ledger.enter(L.ITERATION)
        sim.ledger.enter(L.FORWARD_BACKWARD)  # a recompilation: a long forward/backward
        sim.advance(1.5)
    processes = [sim.end() for sim in ranks]
    for process in processes:
        process.open_spans = 1  # its step's span never ended
    killed = max(p.alive_s for p in processes)
    policy = HangPolicy(floor_s=2.0)
    health = assess(Job("job", [], processes), now_s=killed + 1.5, policy=policy)
    assert health.attempts[-1].account.ended == "running"
    assert not health.attempts[-1].hang.hung
    assert health.to_json()["hang"] is None


def save_while_peer_waits(save_s: float, after_s: float = 0.0):
    """Two ranks, 30 steps; then rank 0 saves for ``save_s`` (no span: its exports alone tell)
    while rank 1 waits in communication; ``after_s`` after the save's end (0: the save still
    open) rank 0 waits in communication too. Returns the attempt, the moment judged and when
    the save began."""
    from otel_training.health.evidence import Attempt

    ranks = [SimRank(T0, rank=r) for r in (0, 1)]
    for sim in ranks:
        sim.advance(2.0)
        for _ in range(30):
            sim.step()
    began = ranks[0].now
    save = ranks[0].ledger.enter(L.CHECKPOINT_SAVE)
    ranks[1].ledger.enter(L.ITERATION)
    ranks[1].ledger.enter(L.COMMUNICATION)
    ranks[0].advance(save_s)
    if after_s:
        ranks[0].ledger.exit(save, L.CHECKPOINT_SAVE, 30)
        ranks[0].ledger.enter(L.ITERATION)
        ranks[0].ledger.enter(L.COMMUNICATION)
        ranks[0].advance(after_s)
    ranks[1].advance(ranks[0].now - ranks[1].now)
    attempt = Attempt(0, True, [sim.process for sim in ranks])
    return attempt, ranks[0].now, began


@documents("health.md", "A waiting peer is not stalled.")
def test_the_report_excuses_a_rank_waiting_for_a_save_within_its_budget():
    """From the exports alone (5 s apart): rank 0 has saved for 300 s of its 600 s budget,
    rank 1 waits in communication (H 60 s): no rank stalled. At 601 s: both, rank 0 the
    culprit."""
    from otel_training.health.hang import HangPolicy
    from otel_training.report.health_incidents import judge_attempt

    attempt, at, _ = save_while_peer_waits(300.0)
    assert judge_attempt(attempt, at, HangPolicy()).stalled_ranks == ()
    attempt, at, _ = save_while_peer_waits(601.0)
    verdict = judge_attempt(attempt, at, HangPolicy())
    assert verdict.stalled_ranks == (0, 1) and verdict.culprits == (0,)


def test_the_report_counts_the_wait_from_the_end_of_the_peers_save():
    """A 302.5 s save ended between two exports: its end is placed at its start + 302.5 s
    (the last export with it open, plus the pause time gained after); 50 s after it, rank 1
    (352.5 s without progress) is not stalled; 61 s after it, both are."""
    from otel_training.health.hang import HangPolicy
    from otel_training.report.health_incidents import judge_attempt, pause_end_s

    attempt, at, began = save_while_peer_waits(302.5, after_s=50.0)
    assert pause_end_s(attempt.processes[0], at) == pytest.approx(began + 302.5)
    assert judge_attempt(attempt, at, HangPolicy()).stalled_ranks == ()
    attempt, at, _ = save_while_peer_waits(302.5, after_s=61.0)
    assert judge_attempt(attempt, at, HangPolicy()).stalled_ranks == (0, 1)


@documents("health.md", "in a pause, how long that pause has been open")
def test_a_load_after_a_long_startup_is_judged_on_the_load_alone():
    """A restart: 700 s of start-up (H 1,800 s), then a checkpoint load open for 30 s (H
    600 s) on both ranks: not hung, though neither rank has progressed for 730 s. The same
    load open for 650 s (past its 600 s) is a hang, and so is a start-up of 1,900 s."""

    def restarted(startup_s: float, load_s: float) -> tuple[Job, float]:
        ranks = [SimRank(T0, rank=r, attempt=1) for r in (0, 1)]
        for sim in ranks:
            sim.advance(startup_s)
            sim.ledger.enter(L.CHECKPOINT_LOAD)
            sim.advance(load_s)
        processes = [sim.process for sim in ranks]
        for process in processes:
            process.alive_s = process.last_s
        return Job("job", [], processes), ranks[0].now + 1.0

    job, now = restarted(700.0, 30.0)
    verdict = assess(job, now_s=now).attempts[-1].hang
    assert not verdict.hung and verdict.stalled_ranks == (), verdict
    job, now = restarted(700.0, 650.0)
    assert assess(job, now_s=now).attempts[-1].hang.hung
    ranks = [SimRank(T0, rank=r, attempt=1) for r in (0, 1)]
    for sim in ranks:
        sim.advance(1900.0)
    processes = [sim.process for sim in ranks]
    assert assess(Job("job", [], processes), now_s=ranks[0].now + 1.0).attempts[-1].hang.hung


@documents("health.md", "max(2 × the longest of that phase seen in the attempt (any rank)")
def test_a_pause_budget_is_the_attempts_longest_as_the_rules_take_it():
    """Rank 1 once saved for 8 s, rank 0 never longer than 1 s; rank 0 now saves for 12 s
    (budget 6 s) while rank 1 waits: within 2 x the attempt's longest (16 s), not hung, as
    the rules judge it; past it (17 s), hung, rank 0 the culprit over its budget."""

    def job(save_s: float) -> tuple[Job, float]:
        ranks = [SimRank(T0, rank=r, export_s=1.0) for r in (0, 1)]
        for sim in ranks:
            sim.advance(2.0)
            for _ in range(20):
                sim.step()
            sim.phase(L.CHECKPOINT_SAVE, 8.0 if sim.process.rank == 1 else 1.0, sim.iteration)
            if sim.process.rank == 0:
                sim.phase(L.COMMUNICATION, 7.0)  # waits for rank 1's save
            for _ in range(20):
                sim.step()
        ranks[0].ledger.enter(L.CHECKPOINT_SAVE)
        ranks[1].ledger.enter(L.ITERATION)
        ranks[1].ledger.enter(L.COMMUNICATION)
        for sim in ranks:
            sim.advance(save_s)
        processes = [sim.end() for sim in ranks]
        for process in processes:
            process.open_spans = 1
        return Job("job", [], processes), max(p.alive_s for p in processes) + 0.1

    policy = HangPolicy(floor_s=2.0, phase_budget_s=6.0)
    within, now = job(12.0)
    verdict = assess(within, now_s=now, policy=policy).attempts[-1].hang
    assert not verdict.hung, verdict
    over, now = job(17.0)
    verdict = assess(over, now_s=now, policy=policy).attempts[-1].hang
    assert verdict.hung and verdict.culprits == (0,) and verdict.rule == "pause_over_budget"
