"""The benches' verdicts: a missed target exits non-zero and is named, a noisy figure says so.

The benches run in their quick modes with ``BENCH_FORCE_MISS=1`` (every target impossible), so
that the exit path is tested without timing anything; nothing here asserts a time.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each bench runs in a child process

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@pytest.fixture
def bench_path(monkeypatch):
    """bench/ importable as the benches see it (their own directory first on the path)."""
    monkeypatch.syspath_prepend(str(BENCH))
    yield
    for name in ("_verdict", "overhead", "health"):
        sys.modules.pop(name, None)


def _run(script: str, *args: str, force: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["BENCH_FORCE_MISS"] = "1" if force else "0"
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_all_met_exits_0(bench_path, monkeypatch, capsys):
    """Figures within their targets exit 0 and say so."""
    monkeypatch.delenv("BENCH_FORCE_MISS", raising=False)
    verdict = importlib.import_module("_verdict").Verdict("b")
    assert verdict.at_most("ratio", 1.5, wall=[1.1, 1.2, 1.15], cpu=[1.0, 1.1, 1.05])
    assert verdict.at_least("speed-up", 1.3, wall=[2.0, 2.1, 1.9])
    assert verdict.check("copies", True, "1 per step")
    assert verdict.exit_status() == 0
    assert "all 3 target(s) met" in capsys.readouterr().out


def test_missed_target_exits_1_and_is_named(bench_path, monkeypatch, capsys):
    """A figure over its target exits 1 and the last line names it."""
    monkeypatch.delenv("BENCH_FORCE_MISS", raising=False)
    verdict = importlib.import_module("_verdict").Verdict("b")
    assert verdict.at_most("fine", 2.0, cpu=[1.0, 1.1, 1.05]) is True
    assert verdict.at_most("ratio", 1.5, cpu=[1.7, 1.8, 1.75]) is False
    assert verdict.exit_status() == 1
    assert capsys.readouterr().out.splitlines()[-1] == "b: MISSED 1 target(s): ratio"


def test_noisy_figure_is_not_a_figure(bench_path, monkeypatch, capsys):
    """Rounds that spread too widely around the target give no figure, no verdict, exit 3."""
    monkeypatch.delenv("BENCH_FORCE_MISS", raising=False)
    verdict = importlib.import_module("_verdict").Verdict("b")
    assert verdict.at_most("on / off", 1.01, wall=[0.09, 0.63, 1.88]) is None
    out = capsys.readouterr().out
    assert "too noisy: rounds spread 0.09-1.88" in out
    assert "0.63" not in out
    assert verdict.exit_status() == 3


def test_noisy_rounds_all_on_one_side_are_judged(bench_path, monkeypatch):
    """Noisy rounds that all miss (or all meet) the target are judged all the same."""
    monkeypatch.delenv("BENCH_FORCE_MISS", raising=False)
    verdict = importlib.import_module("_verdict").Verdict("b")
    assert verdict.at_most("missed", 1.0, cpu=[1.1, 3.0, 2.0]) is False
    assert verdict.at_most("met", 1.0, cpu=[0.1, 0.9, 0.5]) is True
    assert verdict.at_most("negative rounds", 1.01, wall=[-1.6, 0.5, 0.9]) is True
    assert verdict.at_most("negative, straddling", 1.01, wall=[-1.6, 0.5, 1.9]) is None


def test_overhead_judges_its_rounds(bench_path, monkeypatch, capsys):
    """bench-overhead: each figure judged on CPU time against 0.5 %, rounds within 10 %; a
    part of the telemetry that was not on is a miss; a forced miss exits 1."""
    overhead = importlib.import_module("overhead")
    monkeypatch.delenv("BENCH_FORCE_MISS", raising=False)
    on = {"tensor metrics": "grad_norm:10", "hang watchdog": "thread running"}
    noisy_wall = [0.09, 0.63, 1.88]
    assert overhead.judge({"demo": {"cpu": [1.0, 1.002, 1.004], "wall": noisy_wall}}, on) == 0
    assert overhead.judge({"demo": {"cpu": [0.5, 1.0, 1.5], "wall": [1.0] * 3}}, on) == 3
    figures = {
        "demo step: all on": {"cpu": [1.0, 1.001, 1.002], "wall": [1.0] * 3},
        "demo step: accounted": {"cpu": [1.006, 1.008, 1.01]},
    }
    assert overhead.judge(figures, on) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "bench-overhead: MISSED 1 target(s): demo step: accounted"
    fine = {"demo": {"cpu": [1.0, 1.002, 1.004], "wall": [1.0] * 3}}
    assert overhead.judge(fine, on | {"health ledger": ""}) == 1
    assert "missing: health ledger" in capsys.readouterr().out
    monkeypatch.setenv("BENCH_FORCE_MISS", "1")
    assert overhead.judge(fine, on) == 1


def test_health_exits_1_on_a_variant_outside_tolerance(bench_path, monkeypatch, capsys):
    """bench-health: a variant with a bucket outside its tolerance exits 1, named."""
    health = importlib.import_module("health")
    monkeypatch.delenv("BENCH_FORCE_MISS", raising=False)

    class Outcome:
        truth = {"tolerance_s": 0.5, "wall_s": 60.0}
        health = {"attempts": [{"lost_iterations": 8}]}
        seconds = 1.0

    good = {b: 0.1 for b in (*health.BUCKETS, "productive")} | {"goodput_points": 0.1}
    bad = good | {"productive": 2.0}
    found = {"sigkill": good, "sigterm": bad}

    def run_variant(base, name):
        outcome = Outcome()
        outcome.name = name
        return outcome

    monkeypatch.setattr(health, "run_variant", run_variant)
    monkeypatch.setattr(health, "errors", lambda outcome: found[outcome.name])
    assert health.main(["sigkill"]) == 0
    assert health.main(["sigkill", "sigterm"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "bench-health: MISSED 1 target(s): sigterm"


@pytest.mark.parametrize(
    "script, args",
    [
        ("record_metrics.py", ["--quick"]),
        ("spans.py", ["--quick"]),
        ("tensor_metrics.py", ["--quick"]),
        ("bad_day.py", ["--skip", "shutdown,sigterm,unhandled,handled,burst"]),
    ],
)
def test_bench_exits_1_on_a_forced_miss(script, args):
    """Each bench with targets exits 1 when it misses one, and names it on its last line."""
    result = _run(script, *args)
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert "MISSED" in last, result.stdout


#: The benches of the Makefile that judge with bench/_verdict.py (bench/faults.py, the fault
#: campaign, and bench/record_values.py judge their own for now).
VERDICT_BENCHES = (
    "bad_day.py",
    "health.py",
    "health_alerts.py",
    "integrations.py",
    "limits.py",
    "overhead.py",
    "prometheus_scale.py",
    "record_metrics.py",
    "report.py",
    "scale_model.py",
    "spans.py",
    "tensor_metrics.py",
    "trace_roots.py",
)


@pytest.mark.parametrize("script", VERDICT_BENCHES)
def test_help_states_the_duration(script):
    """Every bench's --help says how long it takes."""
    result = _run(script, "--help", force=False)
    assert result.returncode == 0, result.stderr
    assert "Expected duration:" in result.stdout
