"""The health ledger: phase times, progress and checkpoints per rank (docs/health.md)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from doc_rules import documents
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support import LedgerClock, fork_or_unavailable

import otel_training as ot
from otel_training.health import ledger as health
from otel_training.health.ledger import (
    ASYNC_SAVE,
    CHECKPOINT_LOAD,
    CHECKPOINT_SAVE,
    COMMUNICATION,
    DATA_LOADING,
    EVALUATE,
    FORWARD_BACKWARD,
    ITERATION,
    OPTIMIZER,
    PHASES,
    STARTUP,
    Ledger,
)
from otel_training.semconv.attributes import ATTRIBUTES, DL_TRAINING_PHASE


def make_ledger(started_s_ago: float = 2.0) -> tuple[Ledger, LedgerClock]:
    fake = LedgerClock()
    return Ledger(fake.unix() - started_s_ago, perf=fake.perf, unix=fake.unix), fake


def spend(ledger: Ledger, fake: LedgerClock, phase: int, seconds: float, **exit_kwargs) -> None:
    token = ledger.enter(phase)
    fake.advance(seconds)
    ledger.exit(token, phase, **exit_kwargs)


def test_phases_are_the_registry_members_in_order():
    """The ledger's phase codes index dl.training.phase's members as the registry lists them."""
    assert PHASES == ATTRIBUTES[DL_TRAINING_PHASE].members
    assert len(PHASES) == 10 and PHASES[STARTUP] == "startup" and PHASES[-1] == "other"


def test_a_synthetic_timeline_gives_the_hand_computed_times():
    """Startup backdated to creation, warm-up as a whole, then steps split by phase."""
    ledger, fake = make_ledger(started_s_ago=2.0)
    fake.advance(0.5)  # still startup: no phase open, no iteration begun
    token = ledger.enter(CHECKPOINT_LOAD)  # a load between startup and the first step
    fake.advance(0.3)
    ledger.exit(token, CHECKPOINT_LOAD, iteration=40)
    # The first iteration: everything inside it is warmup.
    step = ledger.enter(ITERATION)
    spend(ledger, fake, DATA_LOADING, 0.1)
    spend(ledger, fake, FORWARD_BACKWARD, 0.9)
    ledger.exit(step, ITERATION, iteration=41)
    fake.advance(0.05)  # between steps: other
    for iteration in (42, 43):
        step = ledger.enter(ITERATION)
        spend(ledger, fake, DATA_LOADING, 0.02)
        spend(ledger, fake, FORWARD_BACKWARD, 0.06)
        fake.advance(0.004)  # inside the iteration, outside its phases: forward_backward
        spend(ledger, fake, COMMUNICATION, 0.007)
        spend(ledger, fake, OPTIMIZER, 0.01)
        ledger.exit(step, ITERATION, iteration=iteration)
        fake.advance(0.001)
    spend(ledger, fake, EVALUATE, 0.4)
    reading = ledger.read()
    expected = {
        "startup": 2.5,
        "checkpoint_load": 0.3,
        "warmup": 1.0,
        "data_loading": 0.04,
        "forward_backward": 0.128,
        "optimizer": 0.02,
        "communication": 0.014,
        "checkpoint_save": 0.0,
        "evaluate": 0.4,
        "other": 0.052,
    }
    assert reading.phase_time_s == pytest.approx(expected, abs=1e-9)
    assert sum(reading.phase_time_s.values()) == pytest.approx(fake.unix() - ledger.created_unix_s)
    assert reading.iteration == 43 and reading.loaded_iteration == 40
    assert reading.open_phase == "other" and reading.open_s == pytest.approx(0.0)


def test_absorbing_phases_take_the_time_inside_them():
    """A data load inside an evaluation is evaluation; a load inside startup is a load."""
    assert health.effective(EVALUATE, DATA_LOADING) == EVALUATE
    assert health.effective(CHECKPOINT_SAVE, COMMUNICATION) == CHECKPOINT_SAVE
    assert health.effective(STARTUP, CHECKPOINT_LOAD) == CHECKPOINT_LOAD
    assert health.effective(STARTUP, DATA_LOADING) == STARTUP
    assert health.effective(health.WARMUP, EVALUATE) == EVALUATE
    assert health.effective(FORWARD_BACKWARD, COMMUNICATION) == COMMUNICATION
    ledger, fake = make_ledger()
    outer = ledger.enter(EVALUATE)
    spend(ledger, fake, DATA_LOADING, 0.25)
    spend(ledger, fake, FORWARD_BACKWARD, 0.5)
    ledger.exit(outer, EVALUATE)
    times = ledger.read().phase_time_s
    assert times["evaluate"] == pytest.approx(0.75)
    assert times["data_loading"] == times["forward_backward"] == 0.0


def test_a_failed_iteration_or_checkpoint_is_no_progress():
    """An iteration that raised completes no step; a failed save or load records nothing."""
    ledger, fake = make_ledger()
    spend(ledger, fake, ITERATION, 0.1, iteration=1)
    spend(ledger, fake, ITERATION, 0.1, iteration=2, failed=True)
    spend(ledger, fake, CHECKPOINT_SAVE, 0.1, iteration=2, failed=True)
    spend(ledger, fake, CHECKPOINT_LOAD, 0.1, iteration=7, failed=True)
    reading = ledger.read()
    assert reading.iteration == 1
    assert reading.saved_iteration is None and reading.loaded_iteration is None


def test_iterations_without_numbers_count_from_the_last_one():
    """An iteration without a number completes the last one + 1 (from a load's, too)."""
    ledger, fake = make_ledger()
    spend(ledger, fake, ITERATION, 0.1)
    spend(ledger, fake, ITERATION, 0.1)
    assert ledger.read().iteration == 2
    spend(ledger, fake, CHECKPOINT_LOAD, 0.1, iteration=40)
    spend(ledger, fake, ITERATION, 0.1)
    assert ledger.read().iteration == 41


@documents("health.md", "Progress age of a rank: seconds since its last completed step")
def test_progress_and_checkpoint_ages_follow_the_clock():
    """Age is since the last completed step; checkpoint age since the step the save holds."""
    ledger, fake = make_ledger(started_s_ago=3.0)
    assert ledger.read().age_s == pytest.approx(3.0)  # before any step: since creation
    assert ledger.read().checkpoint_age_s is None
    spend(ledger, fake, ITERATION, 1.0, iteration=1)
    step1_done = fake.unix()
    # a rank that has not saved (DDP's rank > 0 never does) has no checkpoint age of its own
    assert ledger.read().checkpoint_age_s is None
    spend(ledger, fake, ITERATION, 1.0, iteration=2)
    spend(ledger, fake, CHECKPOINT_SAVE, 0.5, iteration=1)  # holds step 1, not step 2
    fake.advance(2.0)
    reading = ledger.read()
    assert reading.saved_iteration == 1
    assert reading.progress_unix_s == pytest.approx(step1_done + 1.0, abs=1e-6)
    assert reading.age_s == pytest.approx(2.5)
    assert reading.checkpoint_age_s == pytest.approx(fake.unix() - step1_done)
    spend(ledger, fake, CHECKPOINT_LOAD, 0.5, iteration=2)
    # a load restores progress; the age stays that of this rank's last good save
    assert ledger.read().checkpoint_age_s == pytest.approx(fake.unix() - step1_done)
    assert ledger.read().progress_unix_s == pytest.approx(fake.unix(), abs=1e-6)


def test_a_rank_that_only_loads_has_no_checkpoint_age():
    """A load makes no rank a saver: DDP's rank > 0 resumes and never shows a climbing risk."""
    ledger, fake = make_ledger()
    spend(ledger, fake, CHECKPOINT_LOAD, 0.5, iteration=40)
    for iteration in range(41, 45):
        spend(ledger, fake, ITERATION, 1.0, iteration=iteration)
    reading = ledger.read()
    assert reading.loaded_iteration == 40 and reading.checkpoint_age_s is None
    assert reading.saved_iteration is None


@documents("health.md", "A **good checkpoint**")
def test_a_save_is_good_when_its_outermost_span_ends_and_no_stage_failed():
    """A stage ending is no save; a stage that raised spoils its save; the save ends it."""
    ledger, fake = make_ledger()
    for iteration in (1, 2):
        spend(ledger, fake, ITERATION, 1.0, iteration=iteration)
    step2_done = fake.unix()
    save = ledger.enter(CHECKPOINT_SAVE)
    spend(ledger, fake, CHECKPOINT_SAVE, 1.0)  # the state-dict stage
    assert ledger.read().saved_iteration is None  # still being written
    spend(ledger, fake, CHECKPOINT_SAVE, 1.0)  # the write
    ledger.exit(save, CHECKPOINT_SAVE, iteration=2)
    assert ledger.read().saved_iteration == 2
    assert ledger.read().checkpoint_age_s == pytest.approx(fake.unix() - step2_done)
    spend(ledger, fake, ITERATION, 1.0, iteration=3)
    # the next save's finalize raises (a disk quota) and the program carries on
    save = ledger.enter(CHECKPOINT_SAVE)
    spend(ledger, fake, CHECKPOINT_SAVE, 1.0)
    spend(ledger, fake, CHECKPOINT_SAVE, 0.5, failed=True)
    ledger.exit(save, CHECKPOINT_SAVE, iteration=3)
    assert ledger.read().saved_iteration == 2  # step 3's save is not good
    spend(ledger, fake, CHECKPOINT_SAVE, 1.0, iteration=3, failed=True)  # a save that raised
    assert ledger.read().saved_iteration == 2
    spend(ledger, fake, CHECKPOINT_SAVE, 1.0, iteration=3)  # and one that did not
    assert ledger.read().saved_iteration == 3


def test_a_save_cut_by_its_iteration_ending_is_not_good():
    """An iteration closed around a save still open (out of order) leaves no good save."""
    ledger, fake = make_ledger()
    spend(ledger, fake, ITERATION, 1.0, iteration=1)
    step = ledger.enter(ITERATION)
    ledger.enter(CHECKPOINT_SAVE)
    fake.advance(1.0)
    ledger.exit(step, ITERATION, iteration=2)
    assert ledger.read().saved_iteration is None
    spend(ledger, fake, CHECKPOINT_SAVE, 1.0, iteration=2)  # the next save is judged afresh
    assert ledger.read().saved_iteration == 2


@documents("health.md", "An **asynchronous save**")
def test_an_asynchronous_save_is_good_when_its_write_completes():
    """Until the background write completes, the last good checkpoint is the one before."""
    ledger, fake = make_ledger()
    spend(ledger, fake, ITERATION, 1.0, iteration=1)
    spend(ledger, fake, CHECKPOINT_SAVE, 0.2, iteration=1)
    step1_done = fake.unix() - 0.2
    spend(ledger, fake, ITERATION, 1.0, iteration=2)
    step2_done = fake.unix()
    spend(ledger, fake, ASYNC_SAVE, 0.1, iteration=2)  # the training loop is blocked 0.1 s
    for iteration in range(3, 8):  # the write goes on for several steps
        spend(ledger, fake, ITERATION, 1.0, iteration=iteration)
        assert ledger.read().saved_iteration == 1
    assert ledger.read().checkpoint_age_s == pytest.approx(fake.unix() - step1_done)
    done = threading.Thread(target=lambda: ledger.checkpoint_save_completed(2))
    done.start()
    done.join()
    assert ledger.read().saved_iteration == 2
    assert ledger.read().checkpoint_age_s == pytest.approx(fake.unix() - step2_done)
    # a write that fails leaves the last good one
    spend(ledger, fake, ASYNC_SAVE, 0.1, iteration=7)
    ledger.checkpoint_save_completed(7, succeeded=False)
    ledger.checkpoint_save_completed(7)  # nothing pending any more: no effect
    assert ledger.read().saved_iteration == 2


@documents("health.md", "Threshold H for the phase a rank is in (its innermost phase")
def test_the_open_phase_and_how_long_it_has_been_open():
    """phase.elapsed names the innermost phase, from when its outermost run of itself began."""
    ledger, fake = make_ledger()
    save = ledger.enter(CHECKPOINT_SAVE)
    fake.advance(4.0)
    inner = ledger.enter(CHECKPOINT_SAVE)  # a stage inside the save
    fake.advance(1.0)
    reading = ledger.read()
    assert reading.open_phase == "checkpoint_save" and reading.open_s == pytest.approx(5.0)
    ledger.exit(inner, CHECKPOINT_SAVE)
    ledger.exit(save, CHECKPOINT_SAVE)
    fake.advance(0.5)
    # startup, outside any phase, has been open since process creation (2 s before the save)
    assert ledger.read().open_phase == "startup" and ledger.read().open_s == pytest.approx(7.5)
    spend(ledger, fake, ITERATION, 1.0)
    fake.advance(0.5)
    assert ledger.read().open_phase == "other" and ledger.read().open_s == pytest.approx(0.5)


def test_out_of_order_exits_close_what_was_opened_after():
    """Stopping an outer handle first closes the inner ones; a stale token changes nothing."""
    ledger, fake = make_ledger()
    outer = ledger.enter(ITERATION)
    inner = ledger.enter(FORWARD_BACKWARD)
    fake.advance(1.0)
    ledger.exit(outer, ITERATION, iteration=1)
    ledger.exit(inner, FORWARD_BACKWARD)
    fake.advance(1.0)
    reading = ledger.read()
    assert reading.open_phase == "other" and reading.iteration == 1
    assert reading.phase_time_s["warmup"] == pytest.approx(1.0)
    assert reading.phase_time_s["other"] == pytest.approx(1.0)


def test_phases_of_another_thread_are_ignored():
    """The ledger follows the thread that entered first; an async checkpoint's thread is not it."""
    ledger, fake = make_ledger()
    spend(ledger, fake, ITERATION, 1.0, iteration=1)
    tokens = []
    thread = threading.Thread(target=lambda: tokens.append(ledger.enter(CHECKPOINT_SAVE)))
    thread.start()
    thread.join()
    assert tokens == [-1]
    fake.advance(1.0)
    assert ledger.read().open_phase == "other"
    assert ledger.read().phase_time_s["checkpoint_save"] == 0.0


@documents("health.md", "the thread that begins the first iteration, which takes the ledger over")
def test_the_thread_of_the_first_iteration_takes_the_ledger_over():
    """A loader thread opens data_loading 1 s before the training thread's first iteration and
    never closes it while the steps run: its 1 s is counted, then the training thread's steps
    are the ledger's (5 steps, warm-up and forward/backward); the loader's exit and a
    second thread's iteration later change nothing."""
    ledger, fake = make_ledger()
    tokens = []
    loader = threading.Thread(target=lambda: tokens.append(ledger.enter(DATA_LOADING)))
    loader.start()
    loader.join()
    fake.advance(1.0)
    for step in range(1, 6):
        spend(ledger, fake, ITERATION, 0.5, iteration=step)
    reading = ledger.read()
    assert (reading.iteration, reading.open_phase) == (5, "other")
    assert reading.phase_time_s["data_loading"] == pytest.approx(1.0)
    assert reading.phase_time_s["warmup"] == pytest.approx(0.5)
    assert reading.phase_time_s["forward_backward"] == pytest.approx(2.0)
    late = threading.Thread(target=lambda: (ledger.exit(tokens[0], DATA_LOADING),
                                            tokens.append(ledger.enter(ITERATION))))  # fmt: skip
    late.start()
    late.join()
    assert tokens[1] == -1 and ledger.read().open_phase == "other"


def test_phase_times_sum_to_the_time_since_creation_on_the_real_clock():
    """The invariant, on the real clocks: the sum over phases is now - creation (to 1 ms)."""
    from otel_training import clock

    ledger = Ledger()
    for iteration in range(1, 20):
        with_data = ledger.enter(ITERATION)
        spend_real(ledger, DATA_LOADING)
        spend_real(ledger, FORWARD_BACKWARD)
        ledger.exit(with_data, ITERATION, iteration=iteration)
    reading = ledger.read()
    total = sum(reading.phase_time_s.values())
    assert total == pytest.approx(clock.unix_s() - ledger.created_unix_s, abs=1e-3)


def spend_real(ledger: Ledger, phase: int) -> None:
    token = ledger.enter(phase)
    time.sleep(0.0005)
    ledger.exit(token, phase)


def test_readings_never_decrease_while_the_training_thread_writes():
    """A reader racing the training thread never sees a phase time go down (counters)."""
    ledger = Ledger()
    stop = threading.Event()
    failures = []

    def read():
        last = dict.fromkeys(PHASES, 0.0)
        while not stop.is_set():
            times = ledger.read().phase_time_s
            failures.extend(p for p in PHASES if times[p] < last[p])
            last = times

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for iteration in range(1, 3000):
            step = ledger.enter(ITERATION)
            for phase in (DATA_LOADING, FORWARD_BACKWARD, COMMUNICATION, OPTIMIZER):
                ledger.exit(ledger.enter(phase), phase)
            ledger.exit(step, ITERATION, iteration=iteration)
    finally:
        stop.set()
        reader.join()
    assert failures == []


CONFIGURATIONS = {
    "all groups": {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"},
    "default groups": {},
    "no groups": {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "none"},
    "NVTX-only fine groups": {
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all",
        "OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS": "fine",
    },
    "SDK disabled": {"OTEL_SDK_DISABLED": "true"},
    "rank that does not export": {"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "1", "RANK": "0"},
}


@documents(
    "health.md",
    'Wrap the blocking part of synchronisation in `grad_sync("finish")` (or Megatron-LM\'s',
)
@pytest.mark.parametrize("environ", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_the_phase_functions_feed_the_ledger_whatever_the_configuration(environ):
    """Enabled, disabled or NVTX-only groups, SDK off or a silent rank: the same ledger."""
    base = {"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"}
    base.update({"OTEL_LOGS_EXPORTER": "none", "WORLD_SIZE": "2"})
    ot.configure(environ={**base, **environ})
    ledger = health.LEDGER
    with ot.startup(), ot.model_init():
        pass
    with ot.checkpoint_load(iteration=10):
        pass
    for iteration in (11, 12, 13):
        with ot.training_iteration(iteration=iteration):
            with ot.data_loading(iteration=iteration):
                pass
            with ot.forward_backward(iteration=iteration):
                with ot.microbatch("forward"):
                    pass
                with ot.grad_sync("finish"):
                    assert ledger.read().open_phase == (
                        "warmup" if iteration == 11 else "communication"
                    )
                with ot.p2p("recv_backward"):  # Megatron-LM's pipeline receives wait too
                    assert ledger.read().open_phase == (
                        "warmup" if iteration == 11 else "communication"
                    )
                with ot.p2p("send_forward"):
                    assert ledger.read().open_phase == (
                        "warmup" if iteration == 11 else "forward_backward"
                    )
            with ot.optimizer_step(iteration=iteration):
                assert ledger.read().open_phase == ("warmup" if iteration == 11 else "optimizer")
    with pytest.raises(RuntimeError):
        with ot.training_iteration(iteration=14):
            raise RuntimeError("a step that fails")
    with ot.checkpoint_save(iteration=13):
        assert ledger.read().open_phase == "checkpoint_save"
    with ot.evaluation(iteration=13), ot.data_loading():
        assert ledger.read().open_phase == "evaluate"
    reading = ledger.read()
    assert (reading.iteration, reading.saved_iteration, reading.loaded_iteration) == (13, 13, 10)
    assert reading.open_phase == "other"


def test_span_recorder_handles_feed_the_ledger():
    """Callbacks' handles (SpanRecorder) complete steps, also stopped out of order."""
    ot.configure(environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"})
    recorder = ot.SpanRecorder()
    for step in (1, 2):
        it = recorder.start_phase(ot.training_iteration, iteration=step)
        fb = recorder.start_phase(ot.forward_backward, iteration=step, parent=it)
        recorder.stop(it)
        recorder.stop(fb)
    failed = recorder.start_phase(ot.training_iteration, iteration=3)
    recorder.error(failed, RuntimeError("x"))
    recorder.stop(failed)
    reading = health.LEDGER.read()
    assert reading.iteration == 2 and reading.open_phase == "other"


def test_the_instruments_export_the_ledger():
    """Eight instruments, 27 series at most, in the registry's units; unknown values absent."""
    reader = InMemoryMetricReader()
    ot.configure(
        metric_readers=[reader],
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
    )
    points = _points(reader)
    assert "dl.training.progress.iteration" not in points
    assert "dl.training.checkpoint.iteration" not in points
    assert len(points["dl.training.phase.time"]) == 10
    for iteration in (1, 2):
        with ot.training_iteration(iteration=iteration):
            pass
    with ot.checkpoint_save(iteration=2):
        pass
    points = _points(reader)
    assert points["dl.training.progress.iteration"] == [({}, 2)]
    assert points["dl.training.checkpoint.iteration"] == [
        ({"megatron.checkpoint.operation": "save"}, 2)
    ]
    elapsed = dict((a["dl.training.phase"], v) for a, v in points["dl.training.phase.elapsed"])
    assert [phase for phase, value in elapsed.items() if value > 0] in ([], ["other"])
    assert sum(len(series) for series in points.values()) <= 30
    units = {m.name: m.unit for m in _metrics(reader)}
    assert units["dl.training.phase.time"] == "s"
    assert units["dl.training.progress.iteration"] == "{iteration}"


@pytest.mark.parametrize("groups", ["default", "none"])
def test_the_public_phases_export_only_good_checkpoints(groups):
    """Through the public functions, whatever the span groups: a save whose finalize stage
    raised (the program carries on) exports no checkpoint; an asynchronous save exports one
    only once checkpoint_save_completed() says so, from the writer's thread."""
    import threading

    reader = InMemoryMetricReader()
    ot.configure(
        metric_readers=[reader],
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none",
                 "OTEL_PYTHON_TRAINING_SPAN_GROUPS": groups},
    )  # fmt: skip
    for iteration in (1, 2, 3):
        with ot.training_iteration(iteration=iteration):
            pass
    with ot.checkpoint_save(iteration=2):
        with ot.checkpoint_save_stage("state_dict"):
            pass
        try:
            with ot.checkpoint_save_stage("finalize"):
                raise OSError("disk quota exceeded")
        except OSError:
            pass
    assert "dl.training.checkpoint.iteration" not in _points(reader)
    with ot.checkpoint_save(iteration=3, strategy="async"):
        pass
    assert "dl.training.checkpoint.iteration" not in _points(reader)
    writer = threading.Thread(target=ot.checkpoint_save_completed, args=(3,))
    writer.start()
    writer.join()
    points = _points(reader)
    assert points["dl.training.checkpoint.iteration"] == [
        ({"megatron.checkpoint.operation": "save"}, 3)
    ]
    (age,) = points["dl.training.checkpoint.age"]
    assert 0 <= age[1] < 5.0


def _metrics(reader):
    data = reader.get_metrics_data()
    return [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def _points(reader) -> dict[str, list]:
    found: dict[str, list] = {}
    for metric in _metrics(reader):
        if metric.name.startswith("dl.training."):
            found[metric.name] = [(dict(p.attributes), p.value) for p in metric.data.data_points]
    return found


def test_a_forked_child_starts_its_own_ledger():
    """A DataLoader worker's ledger has no progress of its parent's."""
    fork_or_unavailable()
    ledger = health.LEDGER
    token = ledger.enter(ITERATION)
    ledger.exit(token, ITERATION, iteration=5)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write_fd, repr(health.LEDGER.read().iteration).encode())
        os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    assert os.read(read_fd, 64) == b"None"
    assert ledger.read().iteration == 5


@pytest.mark.parametrize("groups", ["all", "none"])
def test_an_iteration_set_while_open_is_what_the_ledger_records(groups):
    """megatron.iteration set on an open load or save (known once read) reaches the ledger,
    whether or not the group records spans."""
    ot.configure(
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": groups,
        }
    )
    with ot.checkpoint_load() as load:
        load.set_attribute("megatron.iteration", 40)
    with ot.checkpoint_save() as save:
        save.set_attribute("megatron.iteration", 41)
    reading = health.LEDGER.read()
    assert (reading.loaded_iteration, reading.saved_iteration) == (40, 41)


def test_the_logged_iteration_is_the_step_the_training_values_describe():
    """record_training_metrics with a log interval's values notes the last completed step; a
    step duration alone does not; an open iteration's record_metrics notes its own number."""
    reader = InMemoryMetricReader()
    telemetry = ot.configure(
        metric_readers=[reader],
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
    )
    assert "dl.training.progress.logged_iteration" not in _points(reader)
    for iteration in range(1, 4):
        with ot.training_iteration(iteration=iteration):
            pass
        ot.record_training_metrics(telemetry.meter, step_duration_ms=5.0)
    assert health.LEDGER.read().logged_iteration is None  # only step durations so far
    ot.record_training_metrics(telemetry.meter, loss=2.0, learning_rate=1e-3)
    assert _points(reader)["dl.training.progress.logged_iteration"] == [({}, 3)]
    with ot.training_iteration(iteration=4) as step:
        step.record_metrics(loss=1.5)  # inside step 4: its values
        assert health.LEDGER.read().logged_iteration == 4
    for iteration in (5, 6):
        with ot.training_iteration(iteration=iteration):
            pass
    ot.record_training_metrics(telemetry.meter, step_duration_ms=5.0)
    assert health.LEDGER.read().logged_iteration == 4
    ot.record_training_metrics(telemetry.meter, skipped_iters=0)
    assert _points(reader)["dl.training.progress.logged_iteration"] == [({}, 6)]


def test_without_phases_the_logged_iteration_counts_the_step_durations():
    """A loop that records a step duration each step but no phase: the values of a log
    interval are at the count of steps recorded so far (the report's step clock then)."""
    meter = ot.configure(
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"}
    ).meter
    ot.record_training_metrics(meter, loss=3.0)  # before any step: nothing to say
    assert health.LEDGER.read().logged_iteration is None
    for step in range(1, 21):
        ot.record_training_metrics(meter, step_duration_ms=5.0)
        if step % 10 == 0:
            ot.record_training_metrics(meter, loss=1.0 / step)
            assert health.LEDGER.read().logged_iteration == step


def test_a_save_of_a_step_older_than_the_steps_kept_is_dated_by_the_save():
    """The ledger keeps the completion times of the last 256 steps: a save of an older step
    counts from the save's own time (an upper bound), a save of a kept step from that step."""
    ledger, fake = make_ledger()
    for iteration in range(1, 301):
        spend(ledger, fake, ITERATION, 1.0, iteration=iteration)
    step_100_done = fake.unix() - 200.0
    spend(ledger, fake, CHECKPOINT_SAVE, 2.0, iteration=100)
    assert ledger.read().checkpoint_age_s == pytest.approx(fake.unix() - step_100_done)
    spend(ledger, fake, CHECKPOINT_SAVE, 2.0, iteration=10)  # older than the kept 256 steps
    reading = ledger.read()
    assert reading.saved_iteration == 10
    assert reading.checkpoint_age_s == pytest.approx(0.0)  # the save's own time


def test_saves_and_loads_without_numbers_or_steps():
    """A save without a number holds the last completed step; a save at startup, before any
    step, counts from the save; a save right after a load holds the loaded state."""
    ledger, fake = make_ledger()
    spend(ledger, fake, CHECKPOINT_SAVE, 0.5, iteration=0)  # before any iteration began
    fake.advance(1.0)
    assert ledger.read().checkpoint_age_s == pytest.approx(1.0)
    assert ledger.read().saved_iteration == 0
    spend(ledger, fake, CHECKPOINT_LOAD, 0.5, iteration=40)
    loaded = fake.unix()
    fake.advance(3.0)
    spend(ledger, fake, CHECKPOINT_SAVE, 0.5, iteration=40)
    reading = ledger.read()
    assert reading.saved_iteration == 40
    assert reading.checkpoint_age_s == pytest.approx(fake.unix() - loaded)
    spend(ledger, fake, ITERATION, 1.0, iteration=41)
    spend(ledger, fake, CHECKPOINT_SAVE, 0.5)
    assert ledger.read().saved_iteration == 41
    assert ledger.read().checkpoint_age_s == pytest.approx(0.5)
    fresh, _ = make_ledger()
    fresh.checkpoint_saved()  # nothing completed, nothing named: nothing saved
    assert fresh.read().saved_iteration is None and fresh.read().checkpoint_age_s is None


@documents("health.md", "Threshold H for the phase a rank is in (its innermost phase")
def test_the_innermost_phase_is_open_since_it_began():
    """open_s of a phase nested in another is its own time, not its parent's; the progress age
    right after a step is zero."""
    ledger, fake = make_ledger()
    spend(ledger, fake, ITERATION, 1.0, iteration=1)
    assert ledger.read().age_s == 0.0
    ledger.enter(ITERATION)
    fake.advance(1.0)
    ledger.enter(COMMUNICATION)
    fake.advance(0.25)
    reading = ledger.read()
    assert reading.open_phase == "communication" and reading.open_s == pytest.approx(0.25)


def test_stale_and_foreign_tokens_close_nothing():
    """A token of -1 (another thread's), a token closed by an outer exit, or an exit from
    another thread leaves the open phases and the progress as they were."""
    ledger, fake = make_ledger()
    step = ledger.enter(ITERATION)
    save = ledger.enter(CHECKPOINT_SAVE)
    ledger.exit(step, ITERATION, iteration=1)  # closes the save too, which did not complete
    again = ledger.enter(ITERATION)
    ledger.exit(save, CHECKPOINT_SAVE, iteration=1)  # the save's token is stale now
    ledger.exit(-1, ITERATION, iteration=9)
    other = threading.Thread(target=ledger.exit, args=(again, ITERATION, 7))
    other.start()
    other.join()
    fake.advance(1.0)
    reading = ledger.read()
    assert reading.open_phase == "forward_backward" and reading.open_s == pytest.approx(1.0)
    assert (reading.iteration, reading.saved_iteration) == (1, None)


def test_reset_keeps_the_ledgers_clocks():
    """A ledger started afresh reads the same clocks it was given (a test's fake ones)."""
    ledger, fake = make_ledger()
    ledger.reset()
    spend(ledger, fake, ITERATION, 1.0, iteration=1)
    reading = ledger.read()
    assert reading.phase_time_s["warmup"] == 1.0
    assert reading.progress_unix_s == fake.unix()


def test_after_fork_the_ledger_starts_at_the_fork_on_its_own_clocks():
    """The fork hook (run in a forked child) starts the process's ledger afresh, from the
    time of the fork, keeping the clocks the ledger reads."""
    from otel_training import clock

    ledger = health.LEDGER
    fake = LedgerClock()
    try:
        ledger.__init__(fake.unix(), perf=fake.perf, unix=fake.unix)
        spend(ledger, fake, ITERATION, 1.0, iteration=5)
        before = clock.unix_s()
        health._after_fork_in_child()
        after = clock.unix_s()
        assert ledger.read().iteration is None
        assert before <= ledger.created_unix_s <= after
        assert ledger._perf == fake.perf and ledger._unix == fake.unix
    finally:
        ledger.__init__()


def _fake_ledger_points(ledger: Ledger) -> dict[str, list]:
    from opentelemetry.sdk.metrics import MeterProvider

    from otel_training.health.metrics import observe_ledger

    reader = InMemoryMetricReader()
    observe_ledger(MeterProvider(metric_readers=[reader]).get_meter("health"), lambda: ledger)
    return reader


def test_the_instruments_carry_the_ledgers_values_and_the_registrys_descriptions():
    """Every instrument's value is the reading's (built on fake clocks): the open phase's
    elapsed time and 0 for the others, progress time and age, saved and loaded iterations,
    checkpoint age; names, units and descriptions are the registry's."""
    from otel_training.semconv.metrics import METRICS

    ledger, fake = make_ledger(started_s_ago=2.0)
    spend(ledger, fake, CHECKPOINT_LOAD, 1.0, iteration=40)
    spend(ledger, fake, ITERATION, 1.0, iteration=41)
    done = fake.unix()
    spend(ledger, fake, CHECKPOINT_SAVE, 0.5, iteration=41)
    ledger.enter(EVALUATE)
    fake.advance(0.25)
    reader = _fake_ledger_points(ledger)
    points = _points(reader)
    elapsed = {a["dl.training.phase"]: v for a, v in points["dl.training.phase.elapsed"]}
    assert elapsed == {phase: (0.25 if phase == "evaluate" else 0.0) for phase in PHASES}
    assert points["dl.training.progress.iteration"] == [({}, 41)]
    assert points["dl.training.progress.timestamp"] == [({}, done)]
    assert points["dl.training.progress.age"] == [({}, pytest.approx(0.75))]
    assert sorted(points["dl.training.checkpoint.iteration"], key=str) == [
        ({"megatron.checkpoint.operation": "load"}, 40),
        ({"megatron.checkpoint.operation": "save"}, 41),
    ]
    assert points["dl.training.checkpoint.age"] == [({}, pytest.approx(0.75))]
    for metric in _metrics(reader):
        spec = METRICS[metric.name]
        assert (metric.unit, metric.description) == (spec.unit, spec.description), metric.name


def test_a_creation_time_after_now_counts_from_now():
    """A process creation time later than the ledger's wall clock (clocks that disagree) gives
    no negative and no invented startup: the time counts from now."""
    fake = LedgerClock()
    ledger = Ledger(fake.unix() + 5.0, perf=fake.perf, unix=fake.unix)
    assert ledger.read().phase_time_s["startup"] == 0.0
    fake.advance(0.5)
    assert ledger.read().phase_time_s["startup"] == pytest.approx(0.5)


def test_a_ledger_that_cannot_be_read_leaves_its_instruments_empty_and_says_so_once(caplog):
    """A ledger read that raises: the collection goes on without the ledger's points, and one
    warning (with the traceback) says why, not one per collection."""
    from opentelemetry.sdk.metrics import MeterProvider

    from otel_training.health.metrics import observe_ledger

    def broken() -> Ledger:
        raise RuntimeError("no ledger")

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observe_ledger(provider.get_meter("test"), broken)
    with caplog.at_level("WARNING", logger="otel_training.health"):
        assert reader.get_metrics_data() is None  # no points at all
        assert reader.get_metrics_data() is None
    said = [r for r in caplog.records if r.name == "otel_training.health"]
    assert [r.getMessage() for r in said] == ["reading the health ledger failed"]
    assert said[0].exc_info[1].args == ("no ledger",)
    provider.shutdown()


def test_a_rank_whose_saves_fail_is_at_risk_since_training_began():
    """A writer with no good save (its first save raised, or its asynchronous write failed)
    has a checkpoint age from when its first iteration began: no silence where a save failed."""
    for asynchronous in (False, True):
        ledger, fake = make_ledger(started_s_ago=5.0)
        began = fake.unix()
        for iteration in (1, 2):
            spend(ledger, fake, ITERATION, 1.0, iteration=iteration)
        if asynchronous:
            spend(ledger, fake, ASYNC_SAVE, 0.5, iteration=2)
            assert ledger.read().checkpoint_age_s is None  # pending: not known to fail yet
            ledger.checkpoint_save_completed(2, succeeded=False)
        else:
            spend(ledger, fake, CHECKPOINT_SAVE, 0.5, iteration=2, failed=True)
        assert ledger.read().saved_iteration is None
        assert ledger.read().checkpoint_age_s == pytest.approx(fake.unix() - began)


# -- DDP: the tail of backward is waiting (integrations/ddp.py) ---------------------------------


@documents("health.md", "from the moment DDP hands the hook the last gradient bucket of a")
def test_a_collective_wait_turns_the_rest_of_backward_into_communication(tmp_path):
    """forward_backward opens at 0; the last bucket's all-reduce is issued at 0.3 s (the hook's
    mark); backward returns at 0.5 s: 0.3 s forward_backward, 0.2 s communication, the open
    phase read as communication since 0.3 s, and the record says so too; the next phase is
    accounted as usual."""
    from otel_training.health import record

    ledger, fake = make_ledger()
    path = tmp_path / "ledger-rank0-t.bin"
    ledger.record_to(str(path), {"dl.rank": 0})
    spend(ledger, fake, ITERATION, 1.0, iteration=1)  # the warm-up step
    iteration = ledger.enter(ITERATION)
    before = ledger.read().phase_time_s
    token = ledger.enter(FORWARD_BACKWARD)
    fake.advance(0.3)
    ledger.collective_wait()
    ledger.collective_wait()  # a second mark changes nothing
    fake.advance(0.1)
    reading = ledger.read()
    assert (reading.open_phase, reading.open_s) == ("communication", pytest.approx(0.1))
    assert record.read(path).open_phase == COMMUNICATION
    fake.advance(0.1)
    ledger.exit(token, FORWARD_BACKWARD)
    spend(ledger, fake, OPTIMIZER, 0.05)
    ledger.exit(iteration, ITERATION, iteration=2)
    after = ledger.read().phase_time_s
    gained = {p: after[p] - before[p] for p in after if after[p] != before[p]}
    assert gained == pytest.approx(
        {"forward_backward": 0.3, "communication": 0.2, "optimizer": 0.05}
    )
    assert ledger.iteration == 2 and ledger.read().open_phase == "other"


@documents("health.md", "The mark is a few stores on the thread that runs backward, once per pass.")
def test_a_collective_wait_outside_backward_or_in_communication_changes_nothing():
    """In data loading, in communication already, or with no phase open, the mark is ignored;
    from another thread than the ledger's it is taken (CUDA runs backward on its own thread
    while the training thread waits in backward())."""
    ledger, fake = make_ledger()
    spend(ledger, fake, ITERATION, 1.0, iteration=1)
    ledger.collective_wait()
    assert ledger.read().open_phase == "other"
    for phase in (DATA_LOADING, COMMUNICATION):
        token = ledger.enter(phase)
        fake.advance(0.1)
        ledger.collective_wait()
        assert ledger.read().open_phase == PHASES[phase]
        ledger.exit(token, phase)
    token = ledger.enter(FORWARD_BACKWARD)
    fake.advance(0.1)
    worker = threading.Thread(target=ledger.collective_wait)
    worker.start()
    worker.join()
    assert ledger.read().open_phase == "communication"
    ledger.exit(token, FORWARD_BACKWARD)


@documents("health.md", "`otel_training.integrations.ddp.register_comm_hook(model)`")
def test_the_comm_hook_runs_the_given_hook_and_marks_the_last_bucket():
    """The wrapped hook's future comes back unchanged for every bucket; only the last one
    marks the wait (in the process's ledger)."""
    from otel_training.integrations import ddp

    class Bucket:
        def __init__(self, last: bool) -> None:
            self.last = last

        def is_last(self) -> bool:
            return self.last

    seen = []
    hook = ddp.comm_hook(lambda state, bucket: seen.append((state, bucket)) or f"future{len(seen)}")
    calls = []

    class Probe(Ledger):
        __slots__ = ()

        def collective_wait(self) -> None:
            calls.append(1)

    first, last = Bucket(False), Bucket(True)
    saved = health.LEDGER
    health.LEDGER = Probe()
    try:
        assert hook("group", first) == "future1" and calls == []
        assert hook("group", last) == "future2" and calls == [1]
    finally:
        health.LEDGER = saved
    assert seen == [("group", first), ("group", last)]
