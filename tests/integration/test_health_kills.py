"""SIGKILL at a random moment with the default span groups (issue 23, item 1): the killed
attempt's end, last step, lost progress and the downtime after it within one step time of the
truth the job logs itself (``kill_trials.py``). Three trials here, about 8 s each; twenty in
``make bench-health`` (``bench/health.py kills``)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from doc_rules import documents
from kill_trials import errors, trial
from support import child_env


@documents("health.md", "lost progress is exact to the step and downtime within")
@pytest.mark.timeout(300)
def test_a_kill_anywhere_is_placed_within_a_step(tmp_path):
    """Three kills at random moments: each figure within the longest step of the run."""
    rng = random.Random()
    for k in range(3):
        found = trial(tmp_path / f"trial{k}", rng)
        tolerance = found.longest_step_s + 0.01
        error = errors(found)
        report = {name: round(value, 4) for name, value in error.items()}
        first = found.health["attempts"][0]
        assert first["ended"] == "killed", report
        assert 0 <= error["last_step"] <= 1, report  # the truth log is written after the step
        assert -tolerance <= error["end_s"] <= 0.005, report
        assert abs(error["lost_s"]) <= tolerance, report
        assert abs(error["downtime_s"]) <= tolerance, report
        last = first["last_iteration"]
        lost = None if last == found.saved else [found.saved + 1, last]
        assert first["lost_iterations"] == lost, report
        assert found.health["attempts"][1]["resumed_from"] == found.saved
        assert first["estimated"] == [], report


@documents("health.md", "a progress record that no shutdown closed")
@pytest.mark.timeout(300)
def test_with_no_span_at_all_a_kill_still_reads_killed(tmp_path):
    """Span groups off: no span is left open to tell a kill, yet the progress record that no
    shutdown closed does, and it places the end and the last step as with the default groups."""
    found = trial(tmp_path, random.Random(11), groups="none")
    error = errors(found)
    first, second = found.health["attempts"]
    assert first["ended"] == "killed" and second["ended"] in ("completed", "exited")
    assert (
        0 <= error["last_step"] <= 1 and -(found.longest_step_s + 0.01) <= error["end_s"] <= 0.005
    )


@documents("health.md", "a killed attempt with processes that kept no progress record")
@pytest.mark.timeout(300)
def test_without_its_record_a_kill_is_said_to_be_estimated(tmp_path):
    """The same kill with its progress record gone (an older version, another exporter): the
    end falls back to the last export, and health says beside the attempt that lost progress
    and downtime are estimates."""
    found = trial(tmp_path, random.Random(7))
    telemetry = tmp_path / "telemetry"
    for record in (telemetry / "kill-run-a0").glob("ledger-rank*.bin"):
        record.unlink()
    command = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", "--json", str(telemetry)],
        env=child_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    first = json.loads(command.stdout)["attempts"][0]
    assert first["ended"] == "killed" and first["end"] < found.killed_at
    (why,) = first["estimated"]
    assert why.startswith("rank 0 kept no progress record") and "are estimates" in why
