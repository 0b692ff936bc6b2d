"""The run-health rules end to end: Debian's Prometheus scrapes four gloo ranks every second and
evaluates the rules (1 s hang floor, 10 s straggler windows) every second.

One job holds one case of each kind, in order: a healthy start with a checkpoint save and an
evaluation (no alert may fire), a compute straggler on rank 1 (flagged, cause compute), then a
hang of rank 2 holding the GIL (the job is declared hung and rank 2 named as the culprit). The
dashboard's health panels are read from the same Prometheus at those moments. About a minute,
most of it the four ranks importing torch; the full matrices (every way of hanging, 5 times;
10 stragglers; a 2,000-step control) and their timings are ``make bench-health-alerts``.
Nothing here asserts a duration: alerts must fire (within generous bounds) or not fire.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from alerts_job import (
    E2E_PARAMETERS,
    PANELS_OF_THIS_JOB,
    HealthJob,
    hang_latency_s,
    inject_hang,
)
from prometheus_server import PrometheusServer, grafana_render
from support import gloo_or_unavailable, prometheus_or_unavailable

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "collector-config" / "grafana" / "dashboards" / "training.json"
CULPRIT_PANEL = "Hang culprit"
HEALTH_PANELS = tuple(title for title in PANELS_OF_THIS_JOB if title != CULPRIT_PANEL)

STRAGGLER_FROM = 150
PLAN = {
    "steps": 100_000,
    "checkpoint_every": 0,
    "checkpoint_steps": [60],
    "evaluate_every": 0,
    "evaluate_steps": [120],
    "straggler": {"rank": 1, "from_step": STRAGGLER_FROM, "phase": "fb", "factor": 1.5},
    "hang": "gil",
}


def _panel_query(title: str, prometheus: PrometheusServer) -> list[tuple[dict[str, str], float]]:
    """What the dashboard panel ``title`` shows now, every variable on All."""
    dashboard = json.loads(DASHBOARD.read_text())
    values = {v["name"]: "$__all" for v in dashboard["templating"]["list"]}
    panels = [p for row in dashboard["panels"] for p in (row, *row.get("panels", []))]
    (panel,) = [p for p in panels if p.get("title") == title]
    found = []
    for target in panel["targets"]:
        for sample in prometheus.query(grafana_render(target["expr"], values)):
            found.append((sample["metric"], float(sample["value"][1])))
    return found


@dataclass
class Observed:
    """What the job showed, for the tests below to judge."""

    fired_while_healthy: list[str]
    straggler_cause: str
    stragglers: list[int]
    panels: dict[str, list[tuple[dict[str, str], float]]]
    hang: dict[str, Any]
    output: str


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> Observed:
    gloo_or_unavailable()
    binary = prometheus_or_unavailable()
    with HealthJob(binary, tmp_path_factory.mktemp("health"), PLAN) as job:
        straggling_since = job.stamp(1, "straggle", timeout_s=120)
        fired_while_healthy = [
            f"{record.name} {record.labels}" for record in job.fired()
            if record.firing_seen < straggling_since
        ]  # fmt: skip
        # Two windows after the slow-down plus the scrape and evaluation delays, with room for
        # a loaded machine; bench/health_alerts.py measures the real latency.
        window = E2E_PARAMETERS.straggler_window_s
        straggler = job.wait_fired(
            "TrainingStraggler", 6 * window, since=straggling_since, dl_rank="1"
        )
        panels = {title: _panel_query(title, job.prometheus) for title in HEALTH_PANELS}
        injected = inject_hang(job, 2, "gil")
        hang = hang_latency_s(job, injected, timeout_s=30)
        panels[CULPRIT_PANEL] = _panel_query(CULPRIT_PANEL, job.prometheus)
        stragglers = sorted({int(r.labels["dl_rank"]) for r in job.fired("TrainingStraggler")})
        return Observed(
            fired_while_healthy,
            straggler.annotations.get("cause", ""),
            stragglers,
            panels,
            hang,
            "\n".join(job.output(r) for r in range(job.size)),
        )


def test_a_healthy_start_with_a_checkpoint_and_an_evaluation_raises_no_alert(observed):
    """Until the straggler starts (steps 1-149, a 1 s save at step 60, a 2 s evaluation at
    step 120, 1 % of steps three times as slow), no alert fires, though every pause is longer
    than the 1 s hang floor."""
    assert observed.fired_while_healthy == []


def test_a_compute_straggler_is_flagged_with_cause_compute(observed):
    """Rank 1's forward/backward 50 % slower: TrainingStraggler fires for rank 1 alone, and
    its cause annotation says compute."""
    assert observed.stragglers == [1]
    assert observed.straggler_cause == "compute"


def test_the_dashboard_shows_the_straggler_and_its_cause(observed):
    """The busy-score panels put rank 1 on top, above 1.2, with cause compute, and list the
    four ranks."""
    (top,) = observed.panels["Busy score of the slowest rank"]
    assert (top[0]["dl_rank"], top[0]["cause"]) == ("1", "compute") and top[1] > 1.2
    scores = {labels["dl_rank"]: value for labels, value in observed.panels["Busy score per rank"]}
    assert set(scores) == {"0", "1", "2", "3"} and max(scores, key=scores.get) == "1"
    causes = observed.panels["Straggler cause"]
    assert causes[0][0]["dl_rank"] == "1" and causes[0][0]["cause"] == "compute"


def test_every_panel_left_to_this_job_is_read_here(observed):
    """The panels test_prometheus.py leaves to this job (they need peers or a hang) all
    returned data here."""
    assert set(observed.panels) == set(PANELS_OF_THIS_JOB)
    assert all(observed.panels.values()), observed.panels


def test_a_rank_holding_the_gil_hangs_the_job_and_is_named_the_culprit(observed):
    """Rank 2 stuck in one C call that holds the GIL (its exporter cannot answer): the job is
    declared hung, rank 2 alone is the culprit, as a silent rank, and TrainingRankSilent
    names it; the dashboard's culprit panel shows it."""
    hang = observed.hang
    assert hang["detected_s"] is not None and hang["culprit_s"] is not None, observed.output
    assert hang["culprits"] == [2] and hang["reasons"] == ["silent"], hang
    assert hang["silent"] == [2], hang
    ((labels, tier),) = observed.panels[CULPRIT_PANEL]
    assert (labels["dl_rank"], labels["dl_hang_reason"], tier) == ("2", "silent", 1.0)
