"""The run-health alert rules end to end, measured: hangs, stragglers and a healthy control.

Each case is a job of four gloo ranks (tests/integration/health_rank.py, steps of data 15 ms,
forward/backward 30 ms, a blocking all-reduce inside ``grad_sync("finish")``, optimizer 3 ms)
that Debian's Prometheus scrapes every second while it evaluates the rules rendered from the
shipped source with a 1 s hang floor, 1 s evaluation and 10 s straggler windows
(tests/integration/alerts_job.py). Prints:

- ``hang``: rank 2 hung at step 100 in each of four ways (a wait in forward/backward; a C call
  holding the GIL; SIGSTOP; SIGKILL), N times each (default 5): how many were detected
  (TrainingJobHung), how many named rank 2 alone as the culprit (TrainingHangCulprit), and the
  latency from the injection to the evaluation that declared the hang and to the one that named
  the culprit (Prometheus' activeAt): median, p95, max;
- ``straggler``: M episodes (default 10) in one job, alternately rank 1's forward/backward
  50 % slower and rank 2's data loading twice as slow, each until flagged and then undone:
  how many were flagged (TrainingStraggler) within two windows of the slow-down, with the
  right cause and no other rank flagged; the time to the flag in windows; the flagged rank's
  busy score and the naive wall-clock step ratio (slowest / median mean step time over a
  window, the dashboard's old panel) then;
- ``control``: a healthy job of at least 2,000 steps and 100 straggler windows, with a 1 s
  checkpoint save every 200 steps, a 2 s evaluation every 500 and 1 % of steps three times as
  slow: alerts fired (any), straggler flags per window.

Usage: python bench/health_alerts.py [--repeats N] [--stragglers M] [--control-windows W]
[--skip hang,straggler,control] [--json PATH]. Takes about half an hour, mostly waiting:
the ranks sleep, so it runs on two shared cores.
"""

from __future__ import annotations

import json
import math
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import _verdict  # noqa: E402
from alerts_job import (  # noqa: E402
    E2E_PARAMETERS,
    HANG_WAYS,
    HealthJob,
    hang_latency_s,
    inject_hang,
)
from support import find_program  # noqa: E402

WINDOW_S = E2E_PARAMETERS.straggler_window_s
HUNG_RANK = 2
STRAGGLERS = [
    {"rank": 1, "phase": "fb", "factor": 1.5, "cause": "compute"},
    {"rank": 2, "phase": "data", "factor": 2.0, "cause": "data"},
]
QUIET = {"checkpoint_every": 0, "evaluate_every": 0, "steps": 100_000}


def _percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (
        f"median {statistics.median(values):.2f} s, p95 {_percentile(values, 0.95):.2f} s, "
        f"max {max(values):.2f} s"
    )


def run_hangs(binary: str, repeats: int) -> dict[str, Any]:
    cases = []
    for how in HANG_WAYS:
        for trial in range(repeats):
            plan = {**QUIET, "mark_step": 100, "hang": how if how in ("sleep", "gil") else "sleep"}
            with tempfile.TemporaryDirectory(prefix="health-hang-") as workdir:
                with HealthJob(binary, Path(workdir), plan) as job:
                    job.stamp(HUNG_RANK, "mark", timeout_s=120)
                    injected = inject_hang(job, HUNG_RANK, how)
                    result = hang_latency_s(job, injected, timeout_s=30)
            result.update(how=how, trial=trial)
            result["culprit_right"] = result["culprits"] == [HUNG_RANK]
            cases.append(result)
            print(
                f"hang {how:8} #{trial + 1}: detected "
                + (f"{result['detected_s']:.2f} s" if result["detected_s"] is not None else "NO")
                + ", culprit "
                + (f"{result['culprit_s']:.2f} s" if result["culprit_s"] is not None else "NO")
                + f" ranks {result['culprits']} ({', '.join(result['reasons'])})"
                + f", silent {result['silent']}",
                flush=True,
            )
    detected = [c["detected_s"] for c in cases if c["detected_s"] is not None]
    named = [c["culprit_s"] for c in cases if c["culprit_right"] and c["culprit_s"] is not None]
    both = [
        max(c["detected_s"], c["culprit_s"])
        for c in cases
        if c["culprit_right"] and c["detected_s"] is not None and c["culprit_s"] is not None
    ]
    summary = {
        "cases": len(cases),
        "detected": len(detected),
        "culprit_right": sum(c["culprit_right"] for c in cases),
        "detected_p95_s": _percentile(detected, 0.95) if detected else None,
        "culprit_p95_s": _percentile(named, 0.95) if named else None,
        "hung_and_culprit_p95_s": _percentile(both, 0.95) if both else None,
        "by_way": {
            how: {
                "detected": sum(c["detected_s"] is not None for c in cases if c["how"] == how),
                "culprit_right": sum(c["culprit_right"] for c in cases if c["how"] == how),
                "latency_max_s": max(
                    (
                        max(c["detected_s"], c["culprit_s"])
                        for c in cases
                        if c["how"] == how
                        and c["culprit_s"] is not None
                        and c["detected_s"] is not None
                    ),
                    default=None,
                ),  # fmt: skip
            }
            for how in HANG_WAYS
        },
        "trials": cases,
    }
    print(
        f"hang: detected {summary['detected']}/{len(cases)}, culprit right "
        f"{summary['culprit_right']}/{len(cases)}; declared hung: {_spread(detected)}; "
        f"culprit named: {_spread(named)}; both: {_spread(both)}",
        flush=True,
    )
    return summary


def _naive_and_score(job: HealthJob, rank: int) -> tuple[float | None, float | None]:
    """The dashboard's old panel (slowest / median mean wall-clock step time over one window)
    and the busy score of ``rank``, now."""
    window = f"{int(WINDOW_S)}s"
    step = "megatron_training_step_duration_ms_milliseconds"
    mean = (
        f"(sum by (dl_rank) (rate({step}_sum[{window}])) "
        f"/ sum by (dl_rank) (rate({step}_count[{window}])))"
    )
    naive = job.prometheus.value(f"max({mean}) / quantile(0.5, {mean})")
    score = job.prometheus.value(f'rank:dl_training_straggler_score:ratio{{dl_rank="{rank}"}}')
    return naive, score


def run_stragglers(binary: str, episodes: int) -> dict[str, Any]:
    """One job; in turn rank 1 (forward/backward x1.5) and rank 2 (data loading x2) straggle
    until flagged (or four windows), then recover until no straggler fires and one more
    window passes."""
    plan = {
        **QUIET,
        "on_sigusr2": {
            str(spec["rank"]): {"phase": spec["phase"], "factor": spec["factor"]}
            for spec in STRAGGLERS
        },
    }
    cases = []
    with tempfile.TemporaryDirectory(prefix="health-straggler-") as workdir:
        with HealthJob(binary, Path(workdir), plan) as job:
            time.sleep(2 * WINDOW_S)  # full windows of even ranks first
            for trial in range(episodes):
                spec = STRAGGLERS[trial % len(STRAGGLERS)]
                rank = spec["rank"]
                case: dict[str, Any] = {"trial": trial, **spec}
                job.signal(rank, signal.SIGUSR2)
                since = job.stamp(rank, "straggle", timeout_s=30)
                try:
                    record = job.wait_fired(
                        "TrainingStraggler", 4 * WINDOW_S, since=since, dl_rank=str(rank)
                    )
                    case["windows"] = (record.firing_seen - since) / WINDOW_S
                    case["cause_seen"] = record.annotations.get("cause")
                    case["naive_ratio"], case["score"] = _naive_and_score(job, rank)
                except TimeoutError:
                    case["windows"] = case["cause_seen"] = None
                job.signal(rank, signal.SIGUSR2)
                recovered = job.stamp(rank, "recover", timeout_s=30)
                others = job.fired(
                    "TrainingStraggler", since, lambda r, me=str(rank): r.labels["dl_rank"] != me
                )
                case["others_flagged"] = sorted({int(r.labels["dl_rank"]) for r in others})
                poll_quiet = time.time() + 6 * WINDOW_S
                while job.firing_now("TrainingStraggler") and time.time() < poll_quiet:
                    time.sleep(0.5)
                case["resolved_s"] = time.time() - recovered
                time.sleep(WINDOW_S)
                case["ok"] = (
                    case["windows"] is not None
                    and case["windows"] <= 2
                    and case["cause_seen"] == spec["cause"]
                    and not case["others_flagged"]
                )
                cases.append(case)
                print(
                    f"straggler #{trial + 1} rank {rank} {spec['phase']} x{spec['factor']}: "
                    + (
                        f"flagged after {case['windows']:.2f} windows, cause "
                        f"{case['cause_seen']}, score {case['score']:.2f}, naive wall-step "
                        f"ratio {case['naive_ratio']:.3f}"
                        if case["windows"] is not None
                        else "NOT flagged"
                    )
                    + f", other ranks flagged {case['others_flagged']}, resolved "
                    f"{case['resolved_s']:.1f} s after recovery",
                    flush=True,
                )
    windows = [c["windows"] for c in cases if c["windows"] is not None]
    summary = {
        "runs": len(cases),
        "flagged_within_2_windows_right_cause": sum(c["ok"] for c in cases),
        "windows_max": max(windows) if windows else None,
        "naive_ratio_max": max(
            (c["naive_ratio"] for c in cases if c.get("naive_ratio")), default=None
        ),
        "score_min": min((c["score"] for c in cases if c.get("score")), default=None),
        "trials": cases,
    }
    print(
        f"straggler: flagged within 2 windows with the right cause and no other rank "
        f"{summary['flagged_within_2_windows_right_cause']}/{len(cases)}; windows to the flag: "
        + (f"median {statistics.median(windows):.2f}, max {max(windows):.2f}" if windows else "n/a")
        + f"; busy score at the flag >= {summary['score_min']}; naive wall-step ratio <= "
        f"{summary['naive_ratio_max']}",
        flush=True,
    )
    return summary


def run_control(binary: str, min_steps: int, min_windows: int) -> dict[str, Any]:
    plan = {
        "steps": 1_000_000,
        "checkpoint_every": 200,
        "evaluate_every": 500,
        "report_every": 100,
    }
    with tempfile.TemporaryDirectory(prefix="health-control-") as workdir:
        with HealthJob(binary, Path(workdir), plan) as job:
            steps = 0
            # The straggler windows count from the first full window after the start.
            first = job.started_at + WINDOW_S
            while steps < min_steps or time.time() < first + min_windows * WINDOW_S:
                steps = int(job.expect(0, "at", timeout_s=120).split()[1])
            ended = time.time()
            time.sleep(3)  # alerts evaluated up to the end
            fired = job.fired()
            pending = [r for r in job.alerts if r.firing_seen is None]
    windows = int((ended - first) // WINDOW_S)
    stragglers = [r for r in fired if r.name == "TrainingStraggler"]
    flagged_windows = {
        int((r.firing_seen - first) // WINDOW_S) for r in stragglers if r.firing_seen >= first
    }
    summary = {
        "steps": steps,
        "seconds": ended - job.started_at,
        "alerts_fired": [f"{r.name} {r.labels}" for r in fired],
        "alerts_pending_only": [f"{r.name} {r.labels}" for r in pending],
        "straggler_windows": windows,
        "rank_windows": windows * job.size,
        "straggler_flags": len(flagged_windows),
    }
    print(
        f"control: {steps} steps in {summary['seconds']:.0f} s with checkpoint and evaluation "
        f"pauses: {len(fired)} alerts fired {summary['alerts_fired']}; straggler flags in "
        f"{len(flagged_windows)} of {windows} windows ({summary['rank_windows']} rank-windows); "
        f"pending only, never fired: {summary['alerts_pending_only']}",
        flush=True,
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(
        __doc__, "about half an hour, mostly waiting (4 gloo ranks, Prometheus)", targets=False
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stragglers", type=int, default=10)
    parser.add_argument("--control-steps", type=int, default=2000)
    parser.add_argument("--control-windows", type=int, default=100)
    parser.add_argument("--skip", default="", help="comma-separated: hang,straggler,control")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so that each job's ranks and Prometheus are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    binary = find_program("prometheus", variable="PROMETHEUS_BINARY")
    if binary is None or find_program("promtool") is None:
        print("needs Debian's prometheus (apt-get install -y prometheus)", file=sys.stderr)
        return 2
    skip = set(filter(None, args.skip.split(",")))
    figures: dict[str, Any] = {}
    if "hang" not in skip:
        figures["hang"] = run_hangs(binary, args.repeats)
    if "straggler" not in skip:
        figures["straggler"] = run_stragglers(binary, args.stragglers)
    if "control" not in skip:
        figures["control"] = run_control(binary, args.control_steps, args.control_windows)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
