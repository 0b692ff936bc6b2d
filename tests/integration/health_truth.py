"""The ground-truth job of ``docs/health.md``: run it, kill it, restart it, and compute from its
own truth logs (never from the telemetry) what ``otel-training health`` must find.

:func:`run_variant` starts 2 ranks of ``health_job.py`` as their own processes on gloo
(attempt 0, held inside step 48), kills them as the variant says, waits 1.5 s, starts attempt 1
(which loads the checkpoint of step 40 and runs to step 100), then runs the real command
``otel-training health --json`` on the output directory. :func:`truth` computes every bucket
from the truth logs, the process start times taken here before each ``Popen`` and the kill
(or exit) times taken here. Used by ``test_health_ground_truth.py`` and
``bench/health.py`` (``make bench-health``).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otlp_receiver import free_port

JOB = Path(__file__).resolve().parent / "health_job.py"
ROOT = Path(__file__).resolve().parents[2]
HOLD_AT = 48
RESTORED = 40
GAP_S = 1.5
BUCKETS = (
    "startup", "checkpoint_load", "warmup_excess", "checkpoint_save", "evaluate", "data_wait",
    "lost_progress", "hang", "downtime", "other",
)  # fmt: skip

#: The variants of the Done-when of issue 16: how attempt 0 ends and how attempts are counted.
VARIANTS = {
    # SIGKILL of both ranks; TORCHELASTIC_RESTART_COUNT: a run id, and directory, per attempt
    # (the run id given plus -a{attempt}, docs/spans.md).
    "sigkill": {"signal": "SIGKILL", "counter": "TORCHELASTIC_RESTART_COUNT"},
    "sigterm": {"signal": "SIGTERM", "counter": "TORCHELASTIC_RESTART_COUNT"},
    # SLURM's counter, a directory per attempt too.
    "slurm": {"signal": "SIGKILL", "counter": "SLURM_RESTART_COUNT"},
    # No counter: both attempts in one run directory (one run id), told apart and ordered by
    # process.creation.time.
    "no_counter": {"signal": "SIGKILL", "counter": None},
    # The default span groups (no per-step spans): the progress record places the kill
    # within the phase it fell in (docs/health.md, "Precision").
    "default_groups": {
        "signal": "SIGKILL", "counter": "TORCHELASTIC_RESTART_COUNT", "groups": "default",
    },
    # Unequal saves, the default groups: rank 1 saves 0.5 s longer than rank 0 (the reference),
    # which waits for it in the next all_reduce: the job's save badput (docs/health.md).
    "unequal_saves": {
        "signal": "SIGKILL", "counter": "TORCHELASTIC_RESTART_COUNT", "groups": "default",
        "save_s": {1: 0.75},
    },
    # Rank 0 killed alone: rank 1 fails in the next all_reduce and exits (no single writer).
    "rank0_first": {
        "signal": "SIGKILL", "counter": "TORCHELASTIC_RESTART_COUNT", "ranks": (0,),
    },
}  # fmt: skip


@dataclass
class Attempt:
    """What the harness saw of one attempt: per rank its start (before ``Popen``) and end (the
    kill, or when it exited), and its truth log."""

    number: int
    started: dict[int, float] = field(default_factory=dict)
    ended: dict[int, float] = field(default_factory=dict)
    logs: dict[int, Path] = field(default_factory=dict)
    returncodes: dict[int, int | None] = field(default_factory=dict)
    killed: set[int] = field(default_factory=set)


@dataclass
class Outcome:
    """A variant's truth and what ``otel-training health --json`` said."""

    variant: str
    truth: dict[str, Any]
    health: dict[str, Any]
    output_dir: Path
    seconds: float


def _env(base: Path, variant: dict, attempt: int, rank: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_",
                                                                      "SLURM_"))}  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env.update(
        OMP_NUM_THREADS="1",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RUN_ID="truth-job",
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(base / "telemetry"),
        OTEL_PYTHON_TRAINING_SPAN_GROUPS=variant.get("groups", "per_step"),
        OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM="true",
        TRUTH_LOG=str(base / f"truth-a{attempt}-rank{rank}.jsonl"),
        CHECKPOINT_DIR=str(base / "checkpoints"),
        SAVE_S=str(variant.get("save_s", {}).get(rank, 0.25)),
    )
    env["OTEL_PYTHON_TRAINING_RUN_ID"] = "truth-run"
    if variant["counter"] is not None:
        env[variant["counter"]] = str(attempt)
    if attempt == 0:
        env["HOLD_AT"] = str(HOLD_AT)
    return env


def _holds(path: Path) -> bool:
    return any(e["event"] == "hold" for e in _read_log(path))


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            pass  # a line cut by the kill
    return entries


def _launch(base: Path, variant: dict, number: int) -> tuple[Attempt, dict[int, subprocess.Popen]]:
    attempt = Attempt(number)
    port = free_port()
    processes = {}
    for rank in (0, 1):
        env = _env(base, variant, number, rank, port)
        attempt.logs[rank] = Path(env["TRUTH_LOG"])
        attempt.started[rank] = time.time()
        processes[rank] = subprocess.Popen(
            [sys.executable, str(JOB)], env=env, stdout=subprocess.DEVNULL,
            stderr=open(base / f"stderr-a{number}-rank{rank}.txt", "w"),  # noqa: SIM115
        )  # fmt: skip
    return attempt, processes


def _wait_exit(processes: dict[int, subprocess.Popen], attempt: Attempt, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for rank, process in processes.items():
            if rank not in attempt.ended and process.poll() is not None:
                attempt.ended[rank] = time.time()
                attempt.returncodes[rank] = process.returncode
        if len(attempt.ended) == len(processes):
            return
        time.sleep(0.002)
    for process in processes.values():
        process.kill()
    raise TimeoutError(f"attempt {attempt.number} did not end within {timeout_s} s")


def run_variant(base: Path, name: str, *, timeout_s: float = 180.0) -> Outcome:
    """Runs the variant ``name`` of :data:`VARIANTS` in ``base`` (see the module docstring)."""
    variant = VARIANTS[name]
    began = time.monotonic()
    (base / "checkpoints").mkdir(parents=True, exist_ok=True)
    first, processes = _launch(base, variant, 0)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # both ranks hold inside step 48
            held = [r for r in (0, 1) if _holds(first.logs[r])]
            if len(held) == 2:
                break
            if any(p.poll() is not None for p in processes.values()):
                raise RuntimeError(f"attempt 0 exited early: {_stderr(base, 0)}")
            time.sleep(0.002)
        else:
            raise TimeoutError("attempt 0 never reached step 48")
        sig = getattr(signal, variant["signal"])
        for rank in variant.get("ranks", (0, 1)):
            moment = time.time()
            processes[rank].send_signal(sig)
            if sig == signal.SIGKILL:
                first.ended[rank] = moment
                first.killed.add(rank)
        _wait_exit(processes, first, 60.0)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    time.sleep(max(0.0, GAP_S - (time.time() - max(first.ended.values()))))
    second, processes = _launch(base, variant, 1)
    try:
        _wait_exit(processes, second, timeout_s)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    if any(code != 0 for code in second.returncodes.values()):
        raise RuntimeError(f"attempt 1 failed: {_stderr(base, 1)}")
    command = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", "--json", str(base / "telemetry")],
        env={**_env(base, variant, 1, 0, 0)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if command.returncode != 0:
        raise RuntimeError(f"otel-training health failed: {command.stderr[-3000:]}")
    return Outcome(
        name, truth([first, second]), json.loads(command.stdout), base / "telemetry",
        time.monotonic() - began,
    )  # fmt: skip


def _stderr(base: Path, attempt: int) -> str:
    return " | ".join((base / f"stderr-a{attempt}-rank{r}.txt").read_text()[-1500:] for r in (0, 1))


def _intervals(entries: list[dict], phase: str) -> list[tuple[float, float, int | None]]:
    """``(begin, end, iteration)`` of each ``phase`` in a truth log (an open one ends never:
    ``inf``)."""
    found, open_at = [], {}
    for e in entries:
        if e["phase"] != phase:
            continue
        key = e.get("iteration")
        if e["event"] == "begin":
            open_at[key] = e["t"]
        elif e["event"] == "end" and key in open_at:
            found.append((open_at.pop(key), e["t"], key))
    found += [(t, float("inf"), key) for key, t in open_at.items()]
    return sorted(found)


def _clip(intervals, a: float, b: float) -> float:
    return sum(max(0.0, min(e, b) - max(s, a)) for s, e, _ in intervals)


def _end(attempt: Attempt, rank: int) -> float:
    """When a rank ended: the kill (SIGKILL); its exit (SIGTERM: telemetry's handler shuts
    down, then the signal ends the process at once); for a process that exits by itself, its
    last truth entry (after ``telemetry.shutdown()``, or when it failed: the interpreter's
    teardown after it is in no file, and not in W)."""
    code = attempt.returncodes.get(rank)
    if rank not in attempt.killed and code is not None and code >= 0:
        entries = _read_log(attempt.logs[rank])
        if entries:
            return entries[-1]["t"]
    return attempt.ended[rank]


def truth(attempts: list[Attempt], reference_rank: int = 0) -> dict[str, Any]:
    """Every bucket of ``docs/health.md`` from the truth logs alone (the reference rank's
    phases; the attempt's start and end as the harness saw them)."""
    buckets = dict.fromkeys(BUCKETS, 0.0)
    productive = 0.0
    per_attempt = []
    starts = [min(a.started.values()) for a in attempts]
    ends = [max(_end(a, rank) for rank in a.ended) for a in attempts]
    for i, attempt in enumerate(attempts):
        entries = _read_log(attempt.logs[reference_rank])
        start, end = starts[i], ends[i]
        steps = [s for s in _intervals(entries, "iteration") if s[1] <= end]
        durations = [e - s for s, e, _ in steps]
        median = statistics.median(durations[1:]) if len(durations) > 1 else None
        restored = RESTORED if i + 1 < len(attempts) else None
        cut = next((e for s, e, it in steps if it == restored), None) if restored else None
        loads = _intervals(entries, "checkpoint_load")
        saves = _intervals(entries, "checkpoint_save")
        evals = _intervals(entries, "evaluate")
        data = _intervals(entries, "data_loading")
        first_begin = steps[0][0] if steps else end
        b = {
            "startup": first_begin - start - _clip(loads, start, first_begin),
            "checkpoint_load": _clip(loads, start, end),
            "checkpoint_save": _clip(saves, start, end),
            "evaluate": _clip(evals, start, end),
        }
        # the job was blocked as long as its slowest rank saved: the reference's wait after
        # its own save (in the next all_reduce) is the save's, of kept or of lost time
        blocked_kept = blocked_lost = 0.0
        others = [_intervals(_read_log(log), "checkpoint_save") for log in attempt.logs.values()]
        for s_, e_, it in saves:
            if e_ > end:
                continue
            extra = max((e - s for o in others for s, e, i in o if i == it and e <= end),
                        default=0.0) - (e_ - s_)  # fmt: skip
            if extra > 0 and (cut is None or e_ <= cut):
                blocked_kept += extra
            elif extra > 0:
                blocked_lost += extra
        b["checkpoint_save"] += blocked_kept + blocked_lost
        kept = [s for s in steps if cut is None or s[1] <= cut]
        excess = max(durations[0] - median, 0.0) if kept and median is not None else 0.0
        b["warmup_excess"] = excess
        kept_later = kept[1:]
        kept_data = sum(_clip(data, s, e) for s, e, _ in kept_later)
        b["data_wait"] = kept_data
        work = sum(e - s for s, e, _ in kept_later) - kept_data
        work += (durations[0] - excess) if kept else 0.0
        work -= blocked_kept
        lost = 0.0
        if cut is not None:
            lost = (end - cut) - _clip(saves + evals + loads, cut, end) - blocked_lost
        b["lost_progress"] = lost
        b["hang"] = 0.0
        b["downtime"] = max(0.0, starts[i + 1] - end) if i + 1 < len(attempts) else 0.0
        b["other"] = (end - start) - work - sum(v for k, v in b.items() if k != "downtime")
        for key, value in b.items():
            buckets[key] += value
        productive += work
        per_attempt.append(
            {
                "start": start, "end": end, "buckets": b, "productive_s": work,
                "median_step_s": median,
                "lost_iterations": [restored + 1, steps[-1][2]] if cut is not None else None,
                "first_iteration": steps[0][2] if steps else None,
                "last_iteration": steps[-1][2] if steps else None,
            }
        )  # fmt: skip
    wall = ends[-1] - starts[0]
    step = statistics.median(
        d for a in per_attempt if a["median_step_s"] for d in [a["median_step_s"]]
    )
    return {
        "wall_s": wall,
        "productive_s": productive,
        "goodput": productive / wall,
        "badput_s": buckets,
        "attempts": per_attempt,
        "step_s": step,
        "tolerance_s": max(0.01 * wall, 2 * step),
    }


def errors(outcome: Outcome) -> dict[str, float]:
    """Per bucket (and productive), what ``health`` said minus the truth, seconds; and the
    goodput's error in points."""
    found, truth_ = outcome.health, outcome.truth
    result = {name: found["badput_s"][name] - truth_["badput_s"][name] for name in BUCKETS}
    result["productive"] = found["productive_s"] - truth_["productive_s"]
    result["wall"] = found["wall_s"] - truth_["wall_s"]
    result["goodput_points"] = 100 * (found["goodput"] - truth_["goodput"])
    return result
