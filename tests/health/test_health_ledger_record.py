"""The ledger's progress record (``docs/health.md``, "The progress record"): what it holds after
each kind of moment, when it is copied (every step's end, a pause, DDP's wait, a heartbeat, a
phase opened ``SYNC_S`` after the last copy), and the file ``record_in`` makes for a rank."""

from __future__ import annotations

import logging
import os
import struct
import threading

import pytest
from support import LedgerClock

from otel_training.health import ledger as L
from otel_training.health import record as R


@pytest.fixture
def recorded(tmp_path):
    """(ledger, clock, read): a ledger created at 98 s with its record attached, and a reader
    of the record file."""
    clock = LedgerClock()
    ledger = L.Ledger(clock.unix() - 2.0, perf=clock.perf, unix=clock.unix)
    path = tmp_path / "ledger-rank0-t.bin"
    ledger.record_to(str(path), {"dl.rank": 0})
    return ledger, clock, lambda: R.read(path)


def spend(ledger, clock, code, seconds, **exit_kwargs):
    token = ledger.enter(code)
    clock.t += seconds
    ledger.exit(token, code, **exit_kwargs)


def test_a_step_end_copies_the_whole_state(recorded):
    """After each step: the phase times, the open phase (other, since the step's end), the
    step and when it completed, exactly as the ledger reads them."""
    ledger, clock, read = recorded
    for step in (1, 2, 3):
        iteration = ledger.enter(L.ITERATION)
        for code, seconds in ((L.DATA_LOADING, 0.01), (L.FORWARD_BACKWARD, 0.02)):
            spend(ledger, clock, code, seconds)
        clock.t += 0.005
        ledger.exit(iteration, L.ITERATION, step)
        found, reading = read(), ledger.read()
        assert found.phase_s == pytest.approx(tuple(reading.phase_time_s[p] for p in L.PHASES))
        assert (found.open_phase, found.open_s, found.iteration) == (L.OTHER, 0.0, step)
        assert found.time_s == found.progress_s == pytest.approx(clock.unix())
    assert ledger.read().steps == 3 and found.phase_s[L.WARMUP] == pytest.approx(0.035)


def test_a_phase_is_copied_when_it_opens_sync_s_after_the_last_copy(recorded):
    """Within SYNC_S of the step's end (the last copy) a phase opens unseen by the record; at
    SYNC_S still unseen; past it, copied as it opens; a heartbeat copies whatever is open."""
    ledger, clock, read = recorded
    spend(ledger, clock, L.ITERATION, 1.0, iteration=1)
    copied = read().time_s
    token = ledger.enter(L.DATA_LOADING)
    assert (read().time_s, read().open_phase) == (copied, L.OTHER)
    clock.t += L.SYNC_S
    ledger.exit(token, L.DATA_LOADING)
    ledger.enter(L.DATA_LOADING)  # exactly SYNC_S after the copy: not yet
    assert read().open_phase == L.OTHER
    clock.t += 0.001
    ledger.enter(L.COMMUNICATION)  # a phase inside it, past SYNC_S: copied
    assert (read().open_phase, read().time_s) == (L.COMMUNICATION, pytest.approx(clock.unix()))
    token = ledger.enter(L.OPTIMIZER)  # at once again: not copied
    assert read().open_phase == L.COMMUNICATION
    clock.t += 0.2
    ledger.heartbeat()
    found = read()
    assert (found.open_phase, found.alive_s) == (L.OPTIMIZER, clock.unix())
    assert found.time_s == pytest.approx(clock.unix() - 0.2)  # its last transition


def test_an_iteration_after_the_first_is_copied_only_sync_s_after_the_last_copy(recorded):
    ledger, clock, read = recorded
    spend(ledger, clock, L.ITERATION, 1.0, iteration=1)
    step = ledger.enter(L.ITERATION)  # right after the step's end: nothing new to copy
    assert read().open_phase == L.OTHER
    ledger.exit(step, L.ITERATION, 2)
    clock.t += 0.1
    ledger.enter(L.ITERATION)
    assert read().open_phase == L.FORWARD_BACKWARD


def test_pauses_and_the_wait_are_copied_as_they_open_and_close(recorded):
    """A save, a load and an evaluation, each of 0.5 s then 0.2 s, and DDP's wait: each opens
    and closes in the record; the longest of each is its first (0.5 s), the last pause's end
    the last one's."""
    ledger, clock, read = recorded
    spend(ledger, clock, L.ITERATION, 1.0, iteration=1)
    for code in (L.CHECKPOINT_SAVE, L.CHECKPOINT_LOAD, L.EVALUATE):
        for seconds in (0.5, 0.2):
            token = ledger.enter(code)
            assert read().open_phase == code
            clock.t += seconds
            ledger.exit(token, code, 1)
            assert read().open_phase == L.OTHER
            assert read().pause_end_s == pytest.approx(clock.unix())
            clock.t += 0.01
    assert read().longest_s == pytest.approx({c: 0.5 for c in R.LONGEST})
    assert ledger.read().longest_s == pytest.approx({L.PHASES[c]: 0.5 for c in R.LONGEST})
    ledger.enter(L.ITERATION)
    ledger.enter(L.FORWARD_BACKWARD)
    clock.t += 0.1
    ledger.collective_wait()
    found = read()
    assert (found.open_phase, found.time_s) == (L.COMMUNICATION, pytest.approx(clock.unix()))


def test_an_error_that_leaves_a_phase_or_the_run_reaches_the_record(recorded, tmp_path):
    """Ledger.raised() on the ledger's thread notes when (Unix seconds), the latest one kept;
    on another thread it is ignored; a record of a version without the slot (zeros there)
    says none."""
    ledger, clock, read = recorded
    spend(ledger, clock, L.ITERATION, 1.0, iteration=1)
    assert read().raised_s is None
    clock.t += 0.5
    ledger.raised()
    assert read().raised_s == pytest.approx(clock.unix())
    clock.t += 0.5
    elsewhere = threading.Thread(target=ledger.raised)
    elsewhere.start()
    elsewhere.join()
    assert read().raised_s == pytest.approx(clock.unix() - 0.5)
    older = tmp_path / "ledger-rank0-older.bin"
    data = bytearray(read().path.read_bytes())
    data[64 + 8 * R.RAISED_UNIX : 64 + 8 * (R.RAISED_UNIX + 1)] = bytes(8)
    older.write_bytes(bytes(data))
    assert R.read(older).raised_s is None and R.read(older).iteration == 1


def test_the_signal_telemetry_flushed_on_reaches_the_record(recorded):
    """Ledger.signalled("SIGTERM") notes signal 15, read back by its name; a name that is no
    signal notes nothing; a record without it says none."""
    ledger, clock, read = recorded
    spend(ledger, clock, L.ITERATION, 1.0, iteration=1)
    assert read().signal is None
    ledger.signalled("NOT_A_SIGNAL")
    assert read().signal is None
    ledger.signalled("SIGTERM")
    assert read().signal == "SIGTERM"
    assert read().path.read_bytes()[64 + 8 * R.SIGNAL : 64 + 8 * (R.SIGNAL + 1)] == (
        struct.pack("<d", 15.0)
    )


def test_progress_saves_loads_and_logged_steps_reach_the_record(recorded):
    """A load restoring step 40, steps 41 and 42, a save of 42, an asynchronous save of 42
    completed later, a logged step and the shutdown: the record says each."""
    ledger, clock, read = recorded
    spend(ledger, clock, L.CHECKPOINT_LOAD, 0.3, iteration=40)
    found = read()
    assert (found.loaded_iteration, found.iteration) == (40, 40)
    assert found.progress_s == pytest.approx(clock.unix())
    spend(ledger, clock, L.ITERATION, 0.5, iteration=41)
    completed = clock.unix()
    spend(ledger, clock, L.ITERATION, 0.1)  # no number: 42
    spend(ledger, clock, L.CHECKPOINT_SAVE, 0.2)  # the last completed step: 42
    found = read()
    assert (found.iteration, found.saved_iteration) == (42, 42)
    assert found.safe_s == pytest.approx(clock.unix() - 0.2)
    spend(ledger, clock, L.ASYNC_SAVE, 0.1, iteration=41)  # pending: not yet good
    assert read().saved_iteration == 42
    ledger.checkpoint_save_completed(41)  # older than the save of 42: the age stays
    assert (read().saved_iteration, read().safe_s) == (41, pytest.approx(clock.unix() - 0.3))
    assert ledger.training_logged() == 42 and read().logged_iteration == 42
    ledger.shut_down()
    assert read().shutdown_s == clock.unix()
    assert completed < read().safe_s


def test_asynchronous_saves_complete_oldest_first_and_a_failed_one_is_dropped(recorded):
    ledger, clock, read = recorded
    for step in (1, 2, 3):
        spend(ledger, clock, L.ITERATION, 0.1, iteration=step)
        spend(ledger, clock, L.ASYNC_SAVE, 0.05)  # of the last completed step
    ledger.checkpoint_save_completed()  # the oldest: step 1
    assert ledger.saved_iteration == 1 and read().saved_iteration == 1
    ledger.checkpoint_save_completed(3, succeeded=False)
    ledger.checkpoint_save_completed(9)  # none pending: nothing
    ledger.checkpoint_save_completed()  # step 2
    assert (ledger.saved_iteration, read().saved_iteration) == (2, 2)
    ledger.checkpoint_save_completed()  # nothing left
    assert ledger.saved_iteration == 2


def test_a_save_whose_earlier_stage_failed_is_no_good_save(recorded):
    """A stage that raised, then one that completed: the save is still bad; the rank writes
    checkpoints, so its progress is at risk from when training began."""
    ledger, clock, read = recorded
    spend(ledger, clock, L.ITERATION, 1.0, iteration=1)
    began = clock.unix() - 1.0
    save = ledger.enter(L.CHECKPOINT_SAVE)
    spend(ledger, clock, L.CHECKPOINT_SAVE, 0.1, failed=True)
    spend(ledger, clock, L.CHECKPOINT_SAVE, 0.1)
    ledger.exit(save, L.CHECKPOINT_SAVE, 1)
    assert ledger.saved_iteration is None and read().saved_iteration is None
    assert read().safe_s == pytest.approx(began)


def test_the_pause_age_is_0_in_a_pause_none_before_one_and_exact_after(recorded):
    ledger, clock, _ = recorded
    assert ledger.read().pause_age_s == 0.0  # startup is a pause
    spend(ledger, clock, L.ITERATION, 1.0, iteration=1)  # warm-up ends
    clock.t += 0.3
    assert ledger.read().pause_age_s == pytest.approx(0.3)
    token = ledger.enter(L.EVALUATE)
    assert ledger.read().pause_age_s == 0.0
    ledger.exit(token, L.EVALUATE)
    fresh = L.Ledger(perf=lambda: 0.0, unix=lambda: 0.0)
    fresh.enter(L.ITERATION)
    fresh.exit(fresh.enter(L.DATA_LOADING), L.DATA_LOADING)
    assert fresh.read().pause_age_s == 0.0  # in warm-up


def test_record_in_names_the_file_by_rank_and_process_and_writes_the_identity(
    tmp_path, monkeypatch, caplog
):
    """The file of rank 3 of process tag abc123 in the run directory, its identity the six
    keys of the resource and the process's creation; without an instance id the tag is the
    pid; a rank that is no int is rank 0; a directory that is gone: None and one warning."""
    clock = LedgerClock()
    ledger = L.Ledger(clock.unix() - 5.0, perf=clock.perf, unix=clock.unix)
    monkeypatch.setattr(L, "LEDGER", ledger)
    resource = {
        "service.instance.id": "run-rank3-abc123",
        "dl.rank": 3,
        "dl.world_size": 8,
        "dl.job.id": "job",
        "dl.run.id": "run",
        "dl.run.attempt": 1,
        "host.name": "not in the identity",
    }
    path = L.record_in(str(tmp_path), resource)
    assert path == os.path.join(str(tmp_path), "ledger-rank3-abc123.bin")
    assert ledger.record_path == path
    found = R.read(path)
    expected = {k: v for k, v in resource.items() if k != "host.name"}
    assert found.identity == {**expected, "created_s": clock.unix() - 5.0}
    assert found.created_s == clock.unix() - 5.0
    other = L.record_in(str(tmp_path), {"dl.rank": "3"})
    assert other == os.path.join(str(tmp_path), f"ledger-rank0-{os.getpid()}.bin")
    assert R.read(other).identity["dl.rank"] == "3"
    with caplog.at_level(logging.WARNING, logger="otel_training.health.ledger"):
        gone = L.record_in(str(tmp_path / "gone"), resource)
    assert gone is None and ledger.record_path == other
    (said,) = caplog.records
    assert str(tmp_path / "gone") in said.getMessage()
    assert "could not be created" in said.getMessage()


@pytest.mark.parametrize("succeeded", [True, False])
def test_a_write_that_ends_before_its_asynchronous_save_closes_completes_it(recorded, succeeded):
    """The writer's thread outran the training thread: the write of step 2 ended while its
    save was still open. It completes the save as it closes (good, or dropped); a write that
    ends while no asynchronous save is open or pending is nobody's."""
    ledger, clock, read = recorded
    for step in (1, 2):
        spend(ledger, clock, L.ITERATION, 0.1, iteration=step)
    ledger.checkpoint_save_completed(1)  # no save open: nothing
    save = ledger.enter(L.ASYNC_SAVE)
    ledger.checkpoint_save_completed(2, succeeded=succeeded)  # before the save closes
    assert ledger.saved_iteration is None
    clock.t += 0.05
    ledger.exit(save, L.ASYNC_SAVE, 2)
    expected = 2 if succeeded else None
    assert (ledger.saved_iteration, read().saved_iteration) == (expected, expected)
    spend(ledger, clock, L.ASYNC_SAVE, 0.05, iteration=2)  # a later one is pending again
    assert ledger.saved_iteration == expected
    sync = ledger.enter(L.CHECKPOINT_SAVE)
    ledger.checkpoint_save_completed()  # while a synchronous save is open: the pending one
    ledger.exit(sync, L.CHECKPOINT_SAVE, 2)
    assert ledger.saved_iteration == 2
