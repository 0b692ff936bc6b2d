"""The hang watchdog (health/watchdog.py): once per stall, every thread's Python stack, as a
log record with its trace context and as a stacks record of the span JSON lines; a thread of
its own, stopped at shutdown, none in a forked child."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from doc_rules import documents
from health_sim import FakeClock
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from support import fork_or_unavailable

import otel_training as ot
from otel_training.health import ledger as L
from otel_training.health import watchdog
from otel_training.health.hang import HangPolicy
from otel_training.health.watchdog import Watchdog


def scripted(floor_s: float = 10.0, budget_s: float = 600.0):
    clock = FakeClock(1_800_000_000.0)
    ledger = L.Ledger(clock.t, perf=clock.perf, unix=clock.unix)
    records = []
    dog = Watchdog(HangPolicy(floor_s=floor_s, phase_budget_s=budget_s), records.append,
                   ledger=ledger)  # fmt: skip
    return clock, ledger, dog, records


def steps(clock, ledger, dog, n: int, seconds: float = 0.1) -> None:
    for _ in range(n):
        token = ledger.enter(L.ITERATION)
        clock.t += seconds
        ledger.exit(token, L.ITERATION)
        dog.check()


@documents(
    "health.md", "When the age exceeds H it writes every thread's Python stack, once per stall"
)
def test_a_stall_longer_than_h_writes_the_stacks_once():
    """10 s floor: nothing at 9 s without progress, one record at 11 s, none after."""
    clock, ledger, dog, records = scripted()
    steps(clock, ledger, dog, 20)
    stuck = ledger.enter(L.ITERATION)
    clock.t += 9.0
    assert dog.check() is None
    clock.t += 2.0
    record = dog.check()
    assert record is not None and records == [record]
    assert record["record"] == "stacks" and record["phase"] == "forward_backward"
    assert record["progress_age_s"] == pytest.approx(11.0) and record["threshold_s"] == 10.0
    assert record["iteration"] == 20
    threads = record["threads"]
    assert threads[0]["training"] and threads[0]["id"] == threading.get_ident()
    assert "test_a_stall_longer_than_h_writes_the_stacks_once" in threads[0]["stack"]
    clock.t += 30.0
    assert dog.check() is None  # the same stall
    ledger.exit(stuck, L.ITERATION)
    steps(clock, ledger, dog, 5)
    ledger.enter(L.ITERATION)
    clock.t += 11.0
    assert dog.check() is not None and len(records) == 2  # a new stall


@documents("health.md", "with the rank's own median step and longest phases")
def test_the_median_step_raises_h_above_the_floor():
    """4 s steps: H = 20 s, not the 10 s floor."""
    clock, ledger, dog, records = scripted()
    steps(clock, ledger, dog, 10, seconds=4.0)
    assert dog.median_step_s() == pytest.approx(4.0)
    ledger.enter(L.ITERATION)
    clock.t += 15.0
    assert dog.check() is None
    clock.t += 6.0
    assert dog.check()["threshold_s"] == pytest.approx(20.0)


def test_a_checkpoint_save_within_its_budget_is_no_hang():
    """A 50 s save with a 60 s budget: quiet; past it, one record naming checkpoint_save."""
    clock, ledger, dog, records = scripted(floor_s=10.0, budget_s=60.0)
    steps(clock, ledger, dog, 10)
    ledger.enter(L.CHECKPOINT_SAVE)
    for _ in range(50):
        clock.t += 1.0
        assert dog.check() is None
    clock.t += 11.0
    record = dog.check()
    assert record["phase"] == "checkpoint_save" and record["threshold_s"] == 60.0


@documents("health.md", "with the rank's own median step and longest phases")
def test_the_longest_save_seen_sets_the_next_budget():
    """After a 100 s save, a second save gets 2 x 100 s."""
    clock, ledger, dog, records = scripted(floor_s=10.0, budget_s=60.0)
    steps(clock, ledger, dog, 10)
    save = ledger.enter(L.CHECKPOINT_SAVE)
    for _ in range(100):
        clock.t += 1.0
        dog.check()
    ledger.exit(save, L.CHECKPOINT_SAVE, 10)
    steps(clock, ledger, dog, 3)
    ledger.enter(L.CHECKPOINT_SAVE)
    clock.t += 150.0
    assert dog.check() is None
    clock.t += 60.0
    assert dog.check()["threshold_s"] == pytest.approx(200.0, abs=2.0)


def stuck_in_forward(seconds: float) -> None:
    """The function a person should see in the stack."""
    with ot.forward_backward(iteration=6):
        time.sleep(seconds)


@documents("health.md", "The log record is the event `otel_training.hang.stalled`")
@documents("health.md", "one `logging` warning on stderr naming where")
@documents("health.md", "a `stacks` record in the span JSON lines")
@documents(
    "health.md",
    "an OpenTelemetry log record (severity WARN) in the trace of the newest span still open",
)
@documents(
    "health.md",
    "Each rank runs a watchdog thread (`otel-training-watchdog`, started by `configure()`",
)
def test_a_configured_rank_writes_a_log_record_and_a_span_line(tmp_path, monkeypatch, caplog):
    """Floor 0.3 s, a step stuck 1.5 s: a WARN log record in the step's trace and a stacks
    line in spans-rank0.jsonl, both with the training thread's stack, and a logging warning
    naming where; the thread stops at shutdown."""
    exporter = InMemoryLogRecordExporter()
    telemetry = ot.configure(
        environ={"OTEL_PYTHON_TRAINING_HANG_FLOOR_S": "0.3",
                 "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path),
                 "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step", "OTEL_LOGS_EXPORTER": "none"},
        log_processors=[SimpleLogRecordProcessor(exporter)],
    )  # fmt: skip
    dog = watchdog.current()
    assert dog is not None and dog.running
    for step in range(1, 6):
        with ot.training_iteration(iteration=step):
            time.sleep(0.01)
    with ot.training_iteration(iteration=6) as iteration_phase:
        stuck_in_forward(1.5)
    assert telemetry.shutdown()
    assert not dog.running
    (record,) = [r for r in exporter.get_finished_logs() if r.log_record.attributes.get(
        "otel_training.hang.threshold") is not None]  # fmt: skip
    log = record.log_record
    assert log.severity_text == "WARN"
    assert log.attributes["dl.training.phase"] == "forward_backward"
    assert log.attributes["megatron.iteration"] == 5  # the last completed step
    assert log.attributes["thread.id"] == threading.get_ident()
    assert log.attributes["thread.name"] == threading.current_thread().name
    assert log.attributes["otel_training.hang.progress_age"] > 0.3
    assert "stuck_in_forward" in log.attributes["code.stacktrace"]
    assert "stuck_in_forward" in log.body
    assert log.event_name == "otel_training.hang.stalled"
    detect = log.attributes["otel_training.hang.time_to_detect"]
    assert 0.3 < detect < 1.5
    assert log.attributes["otel_training.hang.began"] == pytest.approx(
        log.timestamp / 1e9 - detect, abs=0.01
    )
    span_context = iteration_phase._span.get_span_context()
    assert log.trace_id == span_context.trace_id
    lines = [
        json.loads(x) for x in (tmp_path / "latest" / "spans-rank0.jsonl").read_text().splitlines()
    ]
    (stacks,) = [x for x in lines if x["record"] == "stacks"]
    assert stacks["rank"] == 0 and stacks["resource"]["dl.run.id"]
    assert stacks["trace_id"] == f"{span_context.trace_id:032x}"
    assert "stuck_in_forward" in stacks["threads"][0]["stack"] and stacks["threads"][0]["training"]
    assert not any(t["name"] == "otel-training-watchdog" for t in stacks["threads"])
    (warning,) = [r for r in caplog.records if r.name == "otel_training.health"]
    assert warning.levelname == "WARNING" and "spans-rank0.jsonl" in warning.getMessage()
    assert "the log records" in warning.getMessage()


@documents("health.md", "started by `configure()` for a pipeline that records")
def test_a_rank_that_does_not_export_runs_no_watchdog():
    """The SDK disabled: no thread."""
    ot.configure(environ={"OTEL_SDK_DISABLED": "true"})
    assert watchdog.current() is None
    assert "otel-training-watchdog" not in {t.name for t in threading.enumerate()}


@documents("health.md", "none in a forked child")
def test_a_forked_child_runs_no_watchdog(tmp_path):
    """A DataLoader worker: the parent's watchdog is not the child's."""
    fork_or_unavailable()
    ot.configure(environ={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)})
    assert watchdog.current() is not None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if watchdog.current() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert watchdog.current() is not None


@documents("health.md", "About once a second (a quarter of the floor when that is shorter)")
def test_it_reads_about_once_a_second_or_four_times_a_floor():
    """60 s floor: every 1 s; 2 s floor: every 0.5 s (a quarter of it)."""
    assert Watchdog(HangPolicy(floor_s=60.0), print).period_s == 1.0
    assert Watchdog(HangPolicy(floor_s=2.0), print).period_s == 0.5


@documents("health.md", "8 stalls a process at most")
def test_at_most_eight_stalls_a_process_write_their_stacks():
    """Ten stalls, each ended by progress: the first eight write a record, the rest none."""
    clock, ledger, dog, records = scripted()
    steps(clock, ledger, dog, 10)
    for _ in range(10):
        stuck = ledger.enter(L.ITERATION)
        clock.t += 11.0
        dog.check()
        ledger.exit(stuck, L.ITERATION)
        steps(clock, ledger, dog, 3)
    assert len(records) == watchdog.MAX_DUMPS == 8


# -- the exact longest phase, and the peers of its run directory ------------------------------


@documents("health.md", "(the ledger measures each long phase when it closes, exactly)")
def test_the_longest_save_is_measured_when_it_closes():
    """A save of 7.3 s (a stage inside it) gives 7.3 s, not a multiple of the 1 s readings;
    a shorter save keeps it, a longer one replaces it; the next save's H is 2 x 7.3 = 14.6 s."""
    clock, ledger, dog, records = scripted(floor_s=10.0, budget_s=10.0)
    steps(clock, ledger, dog, 10)
    save = ledger.enter(L.CHECKPOINT_SAVE)
    for _ in range(7):
        clock.t += 1.0
        assert dog.check() is None
    stage = ledger.enter(L.CHECKPOINT_SAVE)
    clock.t += 0.3
    ledger.exit(stage, L.CHECKPOINT_SAVE)
    assert "checkpoint_save" not in ledger.read().longest_s  # a stage is not the save
    ledger.exit(save, L.CHECKPOINT_SAVE, 10)
    assert ledger.read().longest_s == {"checkpoint_save": pytest.approx(7.3, abs=1e-6)}
    steps(clock, ledger, dog, 3)
    ledger.enter(L.CHECKPOINT_SAVE)
    clock.t += 14.5
    assert dog.check() is None
    clock.t += 0.2
    assert dog.check()["threshold_s"] == pytest.approx(14.6, abs=1e-6)


def test_the_record_holds_the_longest_phases_and_the_last_pause_end(tmp_path):
    """A warm-up step of 1 s, an evaluation of 3 s and a save of 2 s then 5 s, each followed by
    1 s between steps, in the record: 3 and 5 s, the pause ended at the last save's end (Unix
    seconds, 14 s in), the heartbeat when the ledger was told (15 s in)."""
    from otel_training.health import record as R

    clock = FakeClock(1_800_000_000.0)
    ledger = L.Ledger(clock.t, perf=clock.perf, unix=clock.unix)
    path = tmp_path / "ledger-rank0-a.bin"
    ledger.record_to(str(path), {"dl.rank": 0})
    for code, seconds in (
        (L.ITERATION, 1.0),
        (L.EVALUATE, 3.0),
        (L.CHECKPOINT_SAVE, 2.0),
        (L.CHECKPOINT_SAVE, 5.0),
    ):
        token = ledger.enter(code)
        clock.t += seconds
        ledger.exit(token, code)
        clock.t += 1.0
    ledger.heartbeat()
    found = R.read(path)
    assert found.longest_s == {L.EVALUATE: 3.0, L.CHECKPOINT_SAVE: 5.0}
    assert found.pause_end_s == pytest.approx(1_800_000_014.0)
    assert found.alive_s == 1_800_000_015.0 and found.last_evidence_s == 1_800_000_015.0
    assert ledger.read().pause_age_s == pytest.approx(1.0)


@documents("health.md", "with the rank's own median step and longest phases")
def test_after_its_own_long_save_a_rank_is_not_stalled_in_its_next_step():
    """A 100 s save (H in a step phase 10 s): 5 s into the next step no stacks (hang age 5 s,
    from the save's end); 11 s into it, stacks."""
    clock, ledger, dog, records = scripted(floor_s=10.0, budget_s=600.0)
    steps(clock, ledger, dog, 10)
    save = ledger.enter(L.CHECKPOINT_SAVE)
    clock.t += 100.0
    ledger.exit(save, L.CHECKPOINT_SAVE, 10)
    ledger.enter(L.ITERATION)
    clock.t += 5.0
    assert dog.check() is None
    clock.t += 6.0
    assert dog.check()["progress_age_s"] == pytest.approx(111.0)


@documents(
    "health.md", "its watchdog's stacks record and log record say when that rank's stall began"
)
def test_the_stacks_record_says_when_the_stall_began_and_how_long_until_it_was_found():
    """Step 20 ends at T0 + 2 (floor 10 s): the check at T0 + 13 finds the stall, which began
    at T0 + 2 (its last progress): time to detect 11 s."""
    clock, ledger, dog, records = scripted()
    steps(clock, ledger, dog, 20)
    began = clock.t
    ledger.enter(L.ITERATION)
    clock.t += 11.0
    record = dog.check()
    assert record["began_s"] == pytest.approx(began)
    assert record["time_to_detect_s"] == pytest.approx(11.0)


@documents(
    "health.md", "its watchdog's stacks record and log record say when that rank's stall began"
)
def test_after_a_long_save_the_stall_began_when_the_save_ended():
    """A 100 s save, then a stuck step: the stall began when the save ended (the hang age
    counts from it), not at the last step; found 11 s later."""
    clock, ledger, dog, records = scripted(floor_s=10.0, budget_s=600.0)
    steps(clock, ledger, dog, 10)
    save = ledger.enter(L.CHECKPOINT_SAVE)
    clock.t += 100.0
    ledger.exit(save, L.CHECKPOINT_SAVE, 10)
    save_end = clock.t
    ledger.enter(L.ITERATION)
    clock.t += 11.0
    record = dog.check()
    assert record["began_s"] == pytest.approx(save_end)
    assert record["time_to_detect_s"] == pytest.approx(11.0)
    assert record["progress_age_s"] == pytest.approx(111.0)


def two_ranks(tmp_path, *, attempt_of_peer=0, run_of_peer="run", floor_s=10.0, budget_s=60.0):
    """Rank 0 and rank 1 of one attempt on one clock, each with its ledger's record in the run
    directory ``tmp_path`` and a watchdog (rank 1's stands for its heartbeat), after 10 steps
    of 0.1 s."""
    clock = FakeClock(1_800_000_000.0)
    ledgers, dogs, emitted = [], [], []
    for rank, run, attempt in ((0, "run", 0), (1, run_of_peer, attempt_of_peer)):
        ledger = L.Ledger(clock.t, perf=clock.perf, unix=clock.unix)
        identity = {"dl.rank": rank, "dl.run.id": run, "dl.run.attempt": attempt}
        ledger.record_to(str(tmp_path / f"ledger-rank{rank}-t{rank}.bin"), identity)
        records: list = []
        ledgers.append(ledger)
        dogs.append(Watchdog(HangPolicy(floor_s=floor_s, phase_budget_s=budget_s), records.append,
                             ledger=ledger))  # fmt: skip
        emitted.append(records)
    for _ in range(10):
        tokens = [ledger.enter(L.ITERATION) for ledger in ledgers]
        clock.t += 0.1
        for ledger, token in zip(ledgers, tokens):
            ledger.exit(token, L.ITERATION)
        for dog in dogs:
            dog.check()
    return clock, ledgers, dogs, emitted


@documents("health.md", "Before it writes stacks, it reads the progress records of its run")
@documents("health.md", "A waiting peer is not stalled.")
def test_a_rank_waiting_for_a_peer_saving_within_its_budget_writes_no_stacks(tmp_path):
    """Rank 1 saves (H 60 s, its watchdog alive); rank 0 waits in communication (H 10 s):
    no stacks for 60 s; at 61 s the save is past its budget and rank 0 writes its stacks
    (progress age 61 s), once; rank 1 writes its own."""
    clock, (own, peer), (dog, peer_dog), (mine, theirs) = two_ranks(tmp_path)
    peer.enter(L.CHECKPOINT_SAVE)
    own.enter(L.ITERATION)
    own.enter(L.COMMUNICATION)
    for _ in range(60):
        clock.t += 1.0
        assert peer_dog.check() is None
        assert dog.check() is None
    (state,) = dog.peers(clock.t)
    assert (state.rank, state.phase, state.paused) == (1, "checkpoint_save", True)
    clock.t += 1.0
    assert peer_dog.check()["phase"] == "checkpoint_save"
    record = dog.check()
    assert record["phase"] == "communication" and record["progress_age_s"] == pytest.approx(61.0)
    clock.t += 1.0
    assert dog.check() is None and len(mine) == 1 and len(theirs) == 1


def test_the_peers_records_are_read_only_when_the_verdict_can_change(tmp_path, monkeypatch):
    """Excused by a peer saving since 20 s (H 60 s): the records are read once, then not
    again until min(10 - 0, 60 - 20) = 10 s later."""
    clock, (own, peer), (dog, peer_dog), _ = two_ranks(tmp_path)
    peer.enter(L.CHECKPOINT_SAVE)
    own.enter(L.ITERATION)
    clock.t += 20.0
    peer_dog.check()
    reads = []
    real = dog.peers
    monkeypatch.setattr(dog, "peers", lambda *a: reads.append(clock.t) or real(*a))
    for _ in range(12):
        assert dog.check() is None
        clock.t += 1.0
        peer_dog.check()
    assert reads == [pytest.approx(1_800_000_021.0), pytest.approx(1_800_000_031.0)]


@documents("health.md", "with its last transition or its watchdog's note as its latest evidence")
def test_a_peer_that_died_in_its_save_excuses_no_one_past_h(tmp_path):
    """Rank 1 enters a save and its process dies (no heartbeat after): its pause ends, for
    rank 0, at its last transition, so rank 0 (H 10 s) writes its stacks 11 s after it."""
    clock, (own, peer), (dog, _), (mine, _) = two_ranks(tmp_path)
    own.enter(L.ITERATION)
    peer.enter(L.CHECKPOINT_SAVE)
    clock.t += 10.0
    assert dog.check() is None
    clock.t += 1.5
    assert dog.check()["progress_age_s"] == pytest.approx(11.5)


@pytest.mark.parametrize("peer", [{"attempt_of_peer": 1}, {"run_of_peer": "other"}])
@documents("health.md", "of the same `dl.run.id` and `dl.run.attempt`, and applies the same rule")
def test_a_saving_process_of_another_attempt_or_run_excuses_no_one(tmp_path, peer):
    """The same save in the same directory, but the record names another attempt (or run):
    rank 0 writes its stacks at 11 s."""
    clock, (own, other), (dog, other_dog), _ = two_ranks(tmp_path, **peer)
    other.enter(L.CHECKPOINT_SAVE)
    own.enter(L.ITERATION)
    clock.t += 11.0
    other_dog.check()
    assert dog.peers(clock.t) == []
    assert dog.check() is not None


@documents("health.md", "A peer whose record is not in its run directory (another node, no shared")
def test_a_peer_in_another_directory_is_not_seen(tmp_path):
    """Rank 1's record in a directory of its own (another node): rank 0 sees no peer and
    writes its stacks at 11 s; a rank without a record of its own reads none."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    clock, (own, peer), (dog, peer_dog), _ = two_ranks(tmp_path / "a")
    peer.record_to(str(tmp_path / "b" / "ledger-rank1-t1.bin"),
                   {"dl.rank": 1, "dl.run.id": "run", "dl.run.attempt": 0})  # fmt: skip
    (tmp_path / "a" / "ledger-rank1-t1.bin").unlink()
    peer.enter(L.CHECKPOINT_SAVE)
    own.enter(L.ITERATION)
    clock.t += 11.0
    peer_dog.check()
    assert dog.check() is not None
    assert Watchdog(HangPolicy(), print, ledger=L.Ledger()).peers(clock.t) == []
