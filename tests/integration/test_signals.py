"""SIGTERM and exit in real processes against a real OTLP receiver: no hang, the last interval
kept, open spans ended as truncated, a main thread stuck in C code, forked children."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import build_shared_library

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


def _start(code: str, env: dict[str, str], repo_root: Path) -> subprocess.Popen:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    child_env.update(env)
    child_env["PYTHONPATH"] = str(repo_root / "src")
    child_env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _terminate_when_ready(child: subprocess.Popen, delay_s: float = 0.0) -> tuple[int, str]:
    """Waits for "ready", sends SIGTERM after ``delay_s``, returns (exit status, stderr); a
    child that does not end within 30 s is a hang and fails the test."""
    try:
        line = child.stdout.readline().strip()
        assert line == "ready", child.stderr.read()[-3000:]
        if delay_s:
            time.sleep(delay_s)
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the child hung after SIGTERM")
        return child.returncode, child.stderr.read()
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("trial", range(12))
def test_sigterm_into_a_tight_record_loop_keeps_the_last_interval(otlp_receiver, repo_root, trial):
    """SIGTERM delivered anywhere in a tight record_training_metrics loop: the process ends by
    SIGTERM, and the final collection (the only one: the interval is 60 s) reaches the
    receiver with values recorded after "ready"."""
    env = {**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    child = _start(TIGHT_LOOP, env, repo_root)
    code, stderr = _terminate_when_ready(child, delay_s=random.Random(trial).uniform(0, 0.05))
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
    code, stderr = _terminate_when_ready(_start(OPEN_SPANS, env, repo_root))
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
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    child_env.update(otlp_receiver.env("grpc"), PYTHONPATH=str(repo_root / "src"))
    child = subprocess.Popen(
        [sys.executable, "-c", STUCK_IN_C, str(spin_library)],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, stderr = _terminate_when_ready(child)
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
