"""SIGTERM and exit in real processes against a real OTLP receiver: no hang, the last interval
kept, open spans ended as truncated, a main thread stuck in C code, forked children."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from support import build_shared_library, start_python, terminate_when_ready

from otel_training.semconv.attributes import OTEL_TRAINING_SPAN_TRUNCATED

TIGHT_LOOP = textwrap.dedent(
    """
    import otel_training
    meter = otel_training.get_meter()
    i = 0
    while True:
        i += 1
        otel_training.record_training_metrics(
            meter, loss=float(i), step_duration_ms=1.0, skipped_iters=1, grad_norm=0.5
        )
        if i == 1000:
            print("ready", flush=True)
    """
)


@pytest.mark.parametrize("trial", range(12))
def test_sigterm_into_a_tight_record_loop_keeps_the_last_interval(otlp_receiver, repo_root, trial):
    """SIGTERM delivered anywhere in a tight record_training_metrics loop: the process ends by
    SIGTERM, and the final collection (the only one: the interval is 60 s) reaches the
    receiver with values recorded after "ready"."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    child = start_python(TIGHT_LOOP, env=env)
    code, stderr = terminate_when_ready(child, delay_s=random.Random(trial).uniform(0, 0.05))
    assert code == -signal.SIGTERM, stderr[-3000:]
    losses = [p.value for p in otlp_receiver.metrics("megatron.training.loss")]
    assert len(losses) == 1 and losses[0] >= 1000.0, stderr[-3000:]
    (skipped,) = otlp_receiver.metrics("megatron.training.skipped_iters")
    assert skipped.value >= 1000 and skipped.value == int(skipped.value)


OPEN_SPANS = textwrap.dedent(
    """
    import time
    import otel_training as ot
    with ot.training_run():
        with ot.training_iteration(iteration=7):
            with ot.checkpoint_save("/ckpt/step-7", iteration=7):
                print("ready", flush=True)
                time.sleep(60)
    """
)


def test_spans_open_at_sigterm_are_ended_truncated_and_exported(otlp_receiver, repo_root, tmp_path):
    """The run, its trace segment, the (first) iteration in progress and the checkpoint save
    open at SIGTERM arrive ended, marked truncated, status ERROR; their JSON lines have a
    span_end."""
    env = {
        **otlp_receiver.env("grpc"),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
        "OTEL_PYTHON_TRAINING_JSONLOG_DIR": str(tmp_path),
    }
    code, stderr = terminate_when_ready(start_python(OPEN_SPANS, env=env))
    assert code == -signal.SIGTERM, stderr[-3000:]
    spans = {s.name: s for s in otlp_receiver.spans()}
    assert set(spans) == {
        "megatron.train",
        "megatron.train.segment",
        "megatron.train.first_iteration",
        "megatron.train.iteration",
        "megatron.checkpoint.save",
    }
    for span in spans.values():
        assert span.attributes[OTEL_TRAINING_SPAN_TRUNCATED] is True
        assert (span.status_code, span.status_message) == ("error", "truncated: SIGTERM")
    save, iteration = spans["megatron.checkpoint.save"], spans["megatron.train.iteration"]
    assert save.parent_span_id == iteration.span_id
    assert save.end_time_unix_nano <= iteration.end_time_unix_nano  # children end first
    lines = [
        json.loads(x) for x in (tmp_path / "latest" / "spans-rank0.jsonl").read_text().splitlines()
    ]
    ends = {line["name"] for line in lines if line["record"] == "span_end"}
    assert ends == set(spans)


STUCK_IN_C = textwrap.dedent(
    """
    import ctypes, sys
    import otel_training
    spin = ctypes.CDLL(sys.argv[1]).spin
    otel_training.record_training_metrics(otel_training.get_meter(), loss=4.5)
    sys.stdout.flush()
    spin(60)   # like a hung collective: C code that never returns to the interpreter
    """
)
# Says "ready" from inside C, so that a SIGTERM sent then always finds the main thread there
# (a "ready" printed by Python just before the call could let the handler run first).
SPIN_C = (
    "#include <stdio.h>\n#include <time.h>\n"
    'void spin(int s){time_t end=time(0)+s;fputs("ready\\n",stdout);fflush(stdout);'
    "while(time(0)<end){}}\n"
)


@pytest.fixture
def spin_library(tmp_path) -> Path:
    """A C function that spins for N seconds, built with gcc (a failure under CI without)."""
    source = tmp_path / "spin.c"
    source.write_text(SPIN_C)
    return build_shared_library(source, tmp_path / "libspin.so", "-O0")


def test_sigterm_while_the_main_thread_is_stuck_in_c_still_flushes(
    otlp_receiver, repo_root, spin_library
):
    """A main thread in C code never runs Python's handler: the watcher, woken through the
    wakeup fd, flushes anyway and ends the process with status 143."""
    child = start_python(STUCK_IN_C, str(spin_library), env=otlp_receiver.env("grpc"))
    code, stderr = terminate_when_ready(child)
    assert code == 128 + signal.SIGTERM, stderr[-3000:]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [4.5]


FORKED_CHILD_TERMINATED = textwrap.dedent(
    """
    import os, signal, time
    import otel_training
    meter = otel_training.get_meter()
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(0.2)
    os.kill(pid, signal.SIGTERM)          # as a DataLoader ends its workers
    _, status = os.waitpid(pid, 0)
    print("child", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
    time.sleep(0.5)                        # had the parent been told, it would be dying now
    otel_training.record_training_metrics(meter, loss=2.0)
    print("parent alive", flush=True)
    """
)


def test_sigterm_to_a_forked_child_ends_only_the_child(run_python, otlp_receiver):
    """A forked worker dies by SIGTERM at once; its parent neither flushes nor terminates."""
    result = run_python(FORKED_CHILD_TERMINATED, env=otlp_receiver.env("grpc"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["child True", "parent alive"]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [2.0]


def test_spans_open_at_normal_exit_are_truncated_with_their_status(run_python, otlp_receiver):
    """A span never stopped (a SpanRecorder handle) is exported at exit, truncated, its
    status left unset; a span that ended normally carries no truncated attribute."""
    result = run_python(
        textwrap.dedent(
            """
            import otel_training as ot
            recorder = ot.SpanRecorder()
            run = recorder.start("megatron.train")
            with ot.evaluation(iteration=1):
                pass
            """
        ),
        env=otlp_receiver.env("grpc"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = otlp_receiver.spans("megatron.train")
    (evaluation,) = otlp_receiver.spans("megatron.evaluate")
    assert run.attributes[OTEL_TRAINING_SPAN_TRUNCATED] is True and run.status_code == "unset"
    assert OTEL_TRAINING_SPAN_TRUNCATED not in evaluation.attributes


# -- the program handles SIGTERM itself: its fate is its own --------------------------------------

PROGRAM_HANDLES = textwrap.dedent(
    """
    import signal, sys, threading
    import otel_training as ot

    mode, checkpoint = sys.argv[1], sys.argv[2]
    received = []
    go = threading.Event()    # the test says when the graceful save may finish
    threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()

    def handler(signum, frame):    # the program's own: finish the step, then save and exit
        received.append(signum)

    if mode == "before":
        signal.signal(signal.SIGTERM, handler)
    ot.configure()
    if mode == "after":
        signal.signal(signal.SIGTERM, handler)
    elif mode == "chained":    # as Lightning composes its handler with the one it found
        previous = signal.getsignal(signal.SIGTERM)
        def composed(signum, frame):
            handler(signum, frame)
            previous(signum, frame)
        signal.signal(signal.SIGTERM, composed)
    elif mode == "ignored":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    meter = ot.get_meter()
    with ot.training_run():
        i = 0
        while not (received or go.is_set()):
            i += 1
            with ot.training_iteration(iteration=i):
                ot.record_training_metrics(meter, loss=float(i))
            if i == 100:
                print("ready", flush=True)
        print("saving", flush=True)
        with ot.checkpoint_save(checkpoint, iteration=i):
            go.wait(60)
            with open(checkpoint, "w") as f:
                f.write(str(len(received)))
        ot.record_training_metrics(meter, loss=-1.0)    # the last interval, after SIGTERM
    sys.exit(7)
    """
)


def _wait_for(condition, what: str, child: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Polls ``condition()`` until true; fails after ``timeout_s`` (a generous bound) or when
    the child ends first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if child.poll() is not None:
            pytest.fail(f"the child ended (status {child.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:g} s")
        time.sleep(0.05)


#: Longer than the 1 s after which the watcher used to end a process whose program handles
#: SIGTERM itself (status 143, its save never run).
_PAST_THE_OLD_KILL_S = 1.5


@pytest.mark.parametrize("mode", ["after", "before", "chained", "ignored"])
def test_sigterm_into_a_program_that_handles_it_leaves_its_fate_alone(
    otlp_receiver, repo_root, tmp_path, mode
):
    """A handler set after configure(), before it, one that calls ours in a chain, or SIG_IGN:
    SIGTERM (twice) flushes the last values while the process lives on (the interval is 60 s),
    the graceful save completes, the exit status is the program's, and what the graceful path
    records and ends after SIGTERM is exported, nothing truncated."""
    checkpoint = tmp_path / "checkpoint"
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    child = start_python(PROGRAM_HANDLES, mode, str(checkpoint), env=env, stdin=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
        child.send_signal(signal.SIGTERM)
        if mode != "ignored":
            assert child.stdout.readline().strip() == "saving"
            _wait_for(
                lambda: otlp_receiver.metrics("megatron.training.loss"), "flush at SIGTERM", child
            )
            child.send_signal(signal.SIGTERM)
        time.sleep(_PAST_THE_OLD_KILL_S)
        assert child.poll() is None, child.stderr.read()[-3000:]
        child.stdin.write("go\n")
        child.stdin.flush()
        child.wait(timeout=30)
        stderr = child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 7, stderr[-3000:]
    assert checkpoint.read_text() == ("0" if mode == "ignored" else "2")
    assert -1.0 in [p.value for p in otlp_receiver.metrics("megatron.training.loss")]
    spans = {s.name: s for s in otlp_receiver.spans()}
    for name in ("megatron.train", "megatron.checkpoint.save"):
        assert OTEL_TRAINING_SPAN_TRUNCATED not in spans[name].attributes, name


EXITS_IN_ITS_HANDLER = textwrap.dedent(
    """
    import os, signal, sys
    import otel_training as ot
    ot.configure()
    meter = ot.get_meter()
    def handler(signum, frame):
        if sys.argv[1] == "sys.exit":
            sys.exit(5)
        os._exit(9)
    signal.signal(signal.SIGTERM, handler)
    i = 0
    try:
        while True:
            i += 1
            ot.record_training_metrics(meter, loss=float(i))
            if i == 1000:
                print("ready", flush=True)
    finally:
        ot.record_training_metrics(meter, loss=-1.0)
    """
)


@pytest.mark.parametrize(("how", "status"), [("sys.exit", 5), ("os._exit", 9)])
def test_a_handler_that_exits_decides_the_exit_status(otlp_receiver, repo_root, how, status):
    """A handler that calls sys.exit(5) or os._exit(9): that is the exit status; after
    sys.exit, what the program records on its way out is exported at exit."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    child = start_python(EXITS_IN_ITS_HANDLER, how, env=env)
    code, stderr = terminate_when_ready(child)
    assert code == status, stderr[-3000:]
    if how == "sys.exit":  # also in the flush at SIGTERM, when that ran after the last record
        assert -1.0 in [p.value for p in otlp_receiver.metrics("megatron.training.loss")]


STUCK_IN_C_PROGRAM_HANDLES = textwrap.dedent(
    """
    import ctypes, signal, sys
    import otel_training as ot
    wait_for_file = ctypes.CDLL(sys.argv[1]).wait_for_file
    ot.configure()
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    meter = ot.get_meter()
    ot.record_training_metrics(meter, loss=4.5)
    wait_for_file(sys.argv[2].encode(), 60)   # a hung collective, until the test lets go
    ot.record_training_metrics(meter, loss=-1.0)
    sys.exit(0 if received == [signal.SIGTERM] else 1)
    """
)
WAIT_FOR_FILE_C = (
    "#include <stdio.h>\n#include <time.h>\n#include <unistd.h>\n"
    "void wait_for_file(const char *path, int s){time_t end=time(0)+s;"
    'fputs("ready\\n",stdout);fflush(stdout);while(time(0)<end&&access(path,F_OK)!=0){}}\n'
)


def test_sigterm_while_stuck_in_c_with_a_handler_of_the_programs_flushes_and_waits(
    otlp_receiver, repo_root, tmp_path
):
    """The main thread in C code, SIGTERM handled by the program: the watcher flushes while
    the process is stuck (the interval is 60 s), and ends nothing; once the C code returns,
    the program's handler runs and the program ends as it decides."""
    source = tmp_path / "wait.c"
    source.write_text(WAIT_FOR_FILE_C)
    library = build_shared_library(source, tmp_path / "libwait.so", "-O0")
    release = tmp_path / "release"
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    child = start_python(STUCK_IN_C_PROGRAM_HANDLES, str(library), str(release), env=env)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
        child.send_signal(signal.SIGTERM)
        _wait_for(
            lambda: otlp_receiver.metrics("megatron.training.loss"), "flush while stuck", child
        )
        time.sleep(_PAST_THE_OLD_KILL_S)
        assert child.poll() is None
        release.touch()
        child.wait(timeout=30)
        stderr = child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, stderr[-3000:]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [4.5, -1.0]


FORKED_CHILD_WITH_A_CHAINED_HANDLER = textwrap.dedent(
    """
    import os, signal, time
    import otel_training as ot
    ot.configure()
    previous = signal.getsignal(signal.SIGTERM)
    def handler(signum, frame):     # a worker's own, chained to what it found (ours)
        previous(signum, frame)
        os._exit(3)
    signal.signal(signal.SIGTERM, handler)
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(0.2)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    print("child", os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status))
    ot.record_training_metrics(ot.get_meter(), loss=2.0)
    print("parent alive", flush=True)
    """
)


def test_a_forked_childs_own_handler_decides_its_fate(run_python, otlp_receiver):
    """A forked worker whose handler chains ours: ours does nothing there, the worker exits
    with its own status (3), and the parent goes on."""
    result = run_python(FORKED_CHILD_WITH_A_CHAINED_HANDLER, env=otlp_receiver.env("grpc"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["child 3", "parent alive"]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [2.0]


ASYNCIO_HANDLES = textwrap.dedent(
    """
    import asyncio, signal, sys
    import otel_training as ot

    async def main():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        if sys.argv[1] == "handler_first":   # asyncio's wakeup fd is set before configure()
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        ot.configure()
        if sys.argv[1] == "configure_first":
            loop.add_signal_handler(signal.SIGTERM, stop.set)
        meter = ot.get_meter()
        i = 0
        while not stop.is_set():
            i += 1
            ot.record_training_metrics(meter, loss=float(i))
            if i == 100:
                print("ready", flush=True)
            await asyncio.sleep(0)
        ot.record_training_metrics(meter, loss=-1.0)
        return 4

    sys.exit(asyncio.run(main()))
    """
)


@pytest.mark.parametrize("order", ["handler_first", "configure_first"])
def test_asyncio_keeps_its_wakeup_fd_and_its_signal_handler(otlp_receiver, repo_root, order):
    """loop.add_signal_handler(SIGTERM) before or after configure(): asyncio's wakeup fd is
    left to it, its callback runs, the exit status is the program's, the last values are
    exported at exit."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    child = start_python(ASYNCIO_HANDLES, order, env=env)
    code, stderr = terminate_when_ready(child)
    assert code == 4, stderr[-3000:]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [-1.0]
