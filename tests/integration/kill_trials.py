"""SIGKILL at a random moment with the default span groups, then a restart at once: what
``otel-training health --json`` finds against the truth the job logs itself (issue 23, item 1).

:func:`trial` starts one rank of :data:`JOB` (the embedded default, the default span groups: no
per-step spans), lets it train for a random 1-3 s (steps of about 35 ms, a save every 25 steps),
kills it with SIGKILL, restarts it at once as attempt 1 from its last save (10 more steps,
then a clean exit) and runs the real command. The truth comes from the job's own log (an
unbuffered ``os.write`` of ``time.time()`` after every step and around every save) and the
times taken here (before each ``Popen``, right before the kill); never from the telemetry.

Used by ``test_health_kills.py`` (a few trials) and ``bench/health.py kills`` (20).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import child_env

#: One rank: steps of data (10 ms), forward/backward (20 ms), optimizer (5 ms); a 50 ms save
#: every 25 steps; ``RESUME`` (a load first) and ``STEPS`` from the environment.
JOB = textwrap.dedent(
    """
    import os, time
    import otel_training as ot
    truth = os.open(os.environ["TRUTH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    def log(event, step):
        os.write(truth, f"{event} {step} {time.time():.6f}\\n".encode())
    telemetry = ot.configure()
    resume, steps = int(os.environ["RESUME"]), int(os.environ["STEPS"])
    with ot.training_run():
        if resume:
            with ot.checkpoint_load(iteration=resume):
                time.sleep(0.05)
        log("begin", resume)
        for step in range(resume + 1, steps + 1):
            with ot.training_iteration(step):
                with ot.data_loading(step):
                    time.sleep(0.010)
                with ot.forward_backward(step):
                    time.sleep(0.020)
                with ot.optimizer_step(step):
                    time.sleep(0.005)
            log("step", step)
            if step % 25 == 0:
                log("save", step)
                with ot.checkpoint_save(iteration=step):
                    time.sleep(0.050)
                log("saved", step)
    telemetry.shutdown()
    """
)


@dataclass
class Trial:
    """One kill and restart: the truth and what the command said.

    Attributes:
        killed_at: ``time.time()`` right before the kill.
        restarted_at: ``time.time()`` right before the restart's ``Popen``.
        last_step: The last step the truth log holds as completed.
        saved: The step of the last save the truth log holds as finished (the resume point).
        true_lost_s: The step time after that step completed: its completion to the kill, less
            the saves after it (they are the save bucket's), one the kill cut included.
        longest_step_s: The longest time between two completions: the tolerance.
        health: What ``otel-training health --json`` said.
    """

    killed_at: float
    restarted_at: float
    last_step: int
    saved: int
    true_lost_s: float
    longest_step_s: float
    health: dict[str, Any]


def _read(path: Path) -> list[tuple[str, int, float]]:
    entries = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # a line cut by the kill is left out
            entries.append((parts[0], int(parts[1]), float(parts[2])))
    return entries


def _env(base: Path, attempt: int, resume: int, steps: int, groups: str) -> dict[str, str]:
    return child_env(
        OTEL_PYTHON_TRAINING_SPAN_GROUPS=groups,
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(base / "telemetry"),
        OTEL_PYTHON_TRAINING_RUN_ID="kill-run",
        TORCHELASTIC_RUN_ID="kill-job",
        TORCHELASTIC_RESTART_COUNT=str(attempt),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        TRUTH_LOG=str(base / f"truth-a{attempt}.log"),
        RESUME=str(resume),
        STEPS=str(steps),
    )


def trial(
    base: Path, rng: random.Random, *, timeout_s: float = 120.0, groups: str = "default"
) -> Trial:
    """One trial in the directory ``base`` (created; left for the caller), with the span
    groups ``groups`` (``OTEL_PYTHON_TRAINING_SPAN_GROUPS``)."""
    base.mkdir(parents=True, exist_ok=True)
    log0 = base / "truth-a0.log"
    first = subprocess.Popen(
        [sys.executable, "-c", JOB], env=_env(base, 0, 0, 10**6, groups), stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + timeout_s
    while not (log0.exists() and "begin" in log0.read_text()):
        if first.poll() is not None or time.monotonic() > deadline:
            first.kill()
            raise RuntimeError(f"the job did not start: {first.stderr.read().decode()[-3000:]}")
        time.sleep(0.02)
    time.sleep(rng.uniform(1.0, 3.0))
    killed_at = time.time()
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    first.stderr.close()
    entries = _read(log0)
    step_done = {step: t for event, step, t in entries if event == "step"}
    begun = {step: t for event, step, t in entries if event == "save"}
    ended = {step: t for event, step, t in entries if event == "saved"}
    saved = max(ended, default=0)
    after = step_done.get(saved, min(t for e, _, t in entries if e == "begin"))
    in_saves = sum(
        ended.get(step, killed_at) - t for step, t in begun.items() if t >= after
    )  # the saves after the resume point, one the kill cut included
    times = sorted(step_done.values())
    longest = max(b - a for a, b in zip(times, times[1:]))
    restarted_at = time.time()
    second = subprocess.run(
        [sys.executable, "-c", JOB],
        env=_env(base, 1, saved, saved + 10, groups),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if second.returncode != 0:
        raise RuntimeError(f"the restart failed: {second.stderr[-3000:]}")
    command = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", "--json", str(base / "telemetry")],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if command.returncode != 0:
        raise RuntimeError(f"otel-training health failed: {command.stderr[-3000:]}")
    return Trial(
        killed_at, restarted_at, max(step_done), saved, killed_at - after - in_saves, longest,
        json.loads(command.stdout),
    )  # fmt: skip


def errors(found: Trial) -> dict[str, float]:
    """What the command said minus the truth: the killed attempt's end (s), its last step
    (steps), its lost progress and the downtime after it (s)."""
    first = found.health["attempts"][0]
    second = found.health["attempts"][1]
    return {
        "end_s": first["end"] - found.killed_at,
        "last_step": int((first["last_iteration"] or 0) - found.last_step),
        "lost_s": first["badput_s"]["lost_progress"] - found.true_lost_s,
        "downtime_s": first["badput_s"]["downtime"] - (found.restarted_at - found.killed_at),
        "restart_start_s": second["start"] - found.restarted_at,
    }
