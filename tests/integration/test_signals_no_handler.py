"""SIGTERM into a busy program with no SIGTERM handler of its own (issue 25), in real processes:
the program stops at once, telemetry flushes while it stands still, the default disposition
ends it within the bound (2 s with the embedded default, the OTLP timeout + 1 s), everything
recorded before the signal is exported, nothing after it, no traceback. The program-handler
cases are in ``test_signals.py``, ``test_signals_frameworks.py`` and ``test_guest.py``."""

from __future__ import annotations

import random
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from doc_rules import documents
from sigterm_trials import trial
from support import build_shared_library, start_python, terminate_when_ready

#: Trials per exporter here; ``make bench-bad-day`` runs 30 of each, quiet and loaded.
TRIALS = 3


@documents("limits.md", "no statement of the program's runs after the signal")
@documents("limits.md", "within 2 s of the signal with only local files")
@documents("limits.md", "Everything recorded before the signal is exported")
@documents("limits.md", "no SDK traceback reaches stderr")
@pytest.mark.parametrize("exporter", ["file", "otlp"])
def test_sigterm_into_a_busy_program_stops_it_and_keeps_every_step(otlp_receiver, exporter):
    """A tight loop with a system call every 64 steps, SIGTERM at a random moment: ended by
    SIGTERM within the bound, every step before the signal exported, none after, no
    traceback (sigterm_trials.py)."""
    rng = random.Random(f"issue-25-{exporter}")
    for _ in range(TRIALS):
        result = trial(exporter, rng, otlp_receiver)
        assert result.status == -signal.SIGTERM, result.stderr[-3000:]
        assert result.within_bound, (result.seconds, result.stderr[-3000:])
        assert result.kept_all, (result.steps_at_signal, result.exported, result.stderr[-3000:])
        assert result.stood_still, (result.ran_on, result.exported, result.steps_at_end)
        assert not result.traceback, result.stderr[-3000:]


# The SDK's own code holding its aggregation lock when the handler runs: a gauge's aggregate()
# whose code is the SDK module's (exec'd in its namespace, as the handler classifies frames by
# module) sends SIGTERM to its process inside the lock and runs on a few hundred bytecodes, so
# that the handler runs there. Standing still at once would leave the lock held and the final
# collection waiting on it (the deadlock of a handler that flushes on the main thread).
LOCK_HELD = textwrap.dedent(
    """
    import os, signal
    import otel_training as ot
    from opentelemetry.sdk.metrics._internal import aggregation

    SDK_CODE = '''
    def aggregate(self, measurement, should_sample_exemplar=True):
        if measurement.value == 2.0:
            with self._lock:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):
                    pass
        return original(self, measurement, should_sample_exemplar)
    '''
    namespace = {"__name__": aggregation.__name__, "os": os, "signal": signal,
                 "original": aggregation._LastValueAggregation.aggregate}
    exec(SDK_CODE, namespace)
    aggregation._LastValueAggregation.aggregate = namespace["aggregate"]
    meter = ot.get_meter()
    ot.record_training_metrics(meter, loss=1.0)
    ot.record_training_metrics(meter, loss=2.0, grad_norm=0.5)
    print("went on", flush=True)
    ot.record_training_metrics(meter, loss=3.0)
    """
)


@documents("limits.md", "the main thread first runs on to the end of that call")
def test_sigterm_while_telemetry_holds_an_sdk_lock_finishes_that_call_first(
    run_python, otlp_receiver
):
    """The handler interrupts the SDK inside its aggregation lock: the main thread runs on to
    the end of that record_training_metrics call, stands still there (the program never
    prints), and the final collection, which takes that lock, exports it."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    result = run_python(LOCK_HELD, env=env)
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]
    assert "went on" not in result.stdout
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [2.0]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.grad_norm")] == [0.5]
    assert "Traceback" not in result.stderr


# configure() called again holds otel-training's own lock while it logs that it retires the
# first pipeline; the program's logging handler, called there, is where SIGTERM is handled.
LOGGING_UNDER_TELEMETRYS_LOCK = textwrap.dedent(
    """
    import logging, os, signal
    import otel_training as ot
    from otel_training.configuration import current

    class Handler(logging.Handler):
        def emit(self, record):
            if "configure() was called again" in record.getMessage():
                ot.record_training_metrics(current().meter, loss=5.0)
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):
                    pass
                print("handler returned", flush=True)

    logging.getLogger().addHandler(Handler())
    logging.getLogger().setLevel(logging.INFO)
    ot.configure()
    ot.configure()
    print("configured", flush=True)
    """
)


@documents("limits.md", "the main thread first runs on to the end of that call")
def test_sigterm_in_a_logging_handler_called_under_telemetrys_lock(run_python, otlp_receiver):
    """SIGTERM handled in the program's logging handler while configure() holds its lock: the
    handler and configure() finish, the program stands still on configure()'s return, and the
    new pipeline's final collection (which needs that lock) exports what was recorded."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    result = run_python(LOGGING_UNDER_TELEMETRYS_LOCK, env=env)
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["handler returned"]
    assert 5.0 in [p.value for p in otlp_receiver.metrics("megatron.training.loss")]


RETURNS_FROM_C = textwrap.dedent(
    """
    import ctypes, sys
    import otel_training as ot
    spin = ctypes.CDLL(sys.argv[1]).spin
    meter = ot.get_meter()
    ot.record_training_metrics(meter, loss=1.0)
    # a torch op, a collective: C code that returns after a while, within the 0.8 s the watcher
    # waits at least (0.3 s to stand still, then 0.5 s for the handler after the flush)
    spin(400)
    print("went on", flush=True)
    ot.record_training_metrics(meter, loss=2.0)
    """
)
SPIN_C = (
    "#include <stdio.h>\n#include <time.h>\n"
    "void spin(int ms){struct timespec a,b;clock_gettime(CLOCK_MONOTONIC,&a);"
    'fputs("ready\\n",stdout);fflush(stdout);'
    "do{clock_gettime(CLOCK_MONOTONIC,&b);}"
    "while((b.tv_sec-a.tv_sec)*1000+(b.tv_nsec-a.tv_nsec)/1000000<ms);}\n"
)


@pytest.fixture
def spin_library(tmp_path) -> Path:
    """A C function that spins for N seconds, built with gcc (a failure under CI without)."""
    source = tmp_path / "spin.c"
    source.write_text(SPIN_C)
    return build_shared_library(source, tmp_path / "libspin.so", "-O0")


@documents("limits.md", "one that comes back from C code runs the handler")
def test_a_main_thread_in_c_code_stands_still_when_it_returns(otlp_receiver, spin_library):
    """SIGTERM while the main thread is in C code that returns after a while: telemetry
    flushes meanwhile; once back, the main thread runs the handler before any more of the
    program's code, and the process ends by SIGTERM with only what came before."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    child = start_python(RETURNS_FROM_C, str(spin_library), env=env)
    code, stderr = terminate_when_ready(child)
    assert code == -signal.SIGTERM, stderr[-3000:]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [1.0]


TWO_THREADS = textwrap.dedent(
    """
    import os, sys, threading
    import otel_training as ot
    meter = ot.get_meter()
    worker_steps = meter.create_counter("worker.steps")

    def worker():
        while True:
            worker_steps.add(1)

    threading.Thread(target=worker, daemon=True).start()
    step = 0
    while True:
        step += 1
        ot.record_training_metrics(meter, step_duration_ms=1.0)
        if step == 1000:
            print("ready", flush=True)
    """
)


@documents("limits.md", "Threads of the program's other than the main one run on")
def test_sigterm_with_another_thread_recording_ends_the_process(otlp_receiver):
    """The main thread and a thread of the program's both record: the process ends by SIGTERM
    (the other thread's recording does not keep it alive) and both series are exported once."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    code, stderr = terminate_when_ready(start_python(TWO_THREADS, env=env), delay_s=0.2)
    assert code == -signal.SIGTERM, stderr[-3000:]
    (steps,) = otlp_receiver.metrics("megatron.training.step_duration_ms")
    (worker,) = otlp_receiver.metrics("worker.steps")
    assert steps.count >= 1000 and worker.value > 0
    assert "Traceback" not in stderr


SECOND_SIGTERM = textwrap.dedent(
    """
    import otel_training as ot
    meter = ot.get_meter()
    ot.record_training_metrics(meter, loss=1.0)
    print("ready", flush=True)
    while True:
        ot.record_training_metrics(meter, step_duration_ms=1.0)
    """
)


@documents("limits.md", "a second SIGTERM ends the process at once")
def test_a_second_sigterm_during_the_flush_ends_the_process_at_once(black_hole):
    """The flush waits on a collector that never answers (timeout 10 s); a second SIGTERM
    ends the process at once, by the default disposition."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": black_hole.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "10",
    }
    child = start_python(SECOND_SIGTERM, env=env)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
        child.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert child.poll() is None  # still flushing towards the black hole (up to 11 s)
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=5)  # well before the first SIGTERM's bound
    except subprocess.TimeoutExpired:
        pytest.fail("a second SIGTERM did not end the process at once")
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGTERM


FULL_DISK = textwrap.dedent(
    """
    import resource
    import otel_training as ot
    meter = ot.get_meter()
    ot.record_training_metrics(meter, loss=1.0)
    ot.force_flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    print("ready", flush=True)
    while True:   # every write that extends a file now fails (EFBIG), as on a full disk
        ot.record_training_metrics(meter, step_duration_ms=1.0)
    """
)


def test_a_full_disk_during_the_final_flush_is_said_and_ends_in_time(tmp_path):
    """The embedded default's files cannot grow (RLIMIT_FSIZE: EFBIG, as ENOSPC) when SIGTERM
    comes: the final flush says what could not be written, without a traceback, and the
    process ends by SIGTERM within the bound, 2 s."""
    child = start_python(FULL_DISK, env={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)})
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
        start = time.monotonic()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
        seconds = time.monotonic() - start
        stderr = child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGTERM, stderr[-3000:]
    assert seconds <= 2.0, stderr[-3000:]
    assert "cannot write" in stderr and "Traceback" not in stderr, stderr[-3000:]
