"""The report's Run health section (report/health_figures.py, html.py): its figures have the
job's data, and a rank killed while hung shows its culprit with its stack, escaped."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from doc_rules import documents
from health_sim import SimRank
from support import child_env, import_or_unavailable

from otel_training.health.evidence import Job
from otel_training.report.health import assess

import_or_unavailable("plotly")

from otel_training.report.health_figures import health_plots, health_tables  # noqa: E402

T0 = 1_800_000_000.0


def straggling_job() -> Job:
    """Two ranks of 400 steps; rank 1 computes 50 % longer (and waits as much less)."""
    sims = [SimRank(T0, rank=r) for r in (0, 1)]
    for sim in sims:
        sim.advance(1.0)
        for _ in range(400):
            slow = sim.process.rank == 1
            sim.step(compute=0.09 if slow else 0.06, communication=0.005 if slow else 0.035)
        sim.end()
    return Job("job", [], [s.process for s in sims])


def test_the_figures_hold_the_job():
    """Goodput by attempt, each rank's phases, progress at risk, stragglers: drawn with data."""
    health = assess(straggling_job(), now_s=T0 + 10_000)
    plots = {p.id: p for p in health_plots(health)}
    assert set(plots) == {
        "plot-health-goodput", "plot-health-phases", "plot-health-risk", "plot-health-stragglers",
    }  # fmt: skip
    assert all(p.points > 0 for p in plots.values())
    for plot in plots.values():  # both axes named, the colour bar too
        layout = plot.figure.layout
        assert layout.xaxis.title.text and layout.yaxis.title.text, plot.id
    assert plots["plot-health-stragglers"].figure.data[0].colorbar.title.text
    assert list(plots["plot-health-phases"].figure.data[0].y) == ["rank 0", "rank 1"]
    assert "rank 1 (attempt 0: score 1.33" in plots["plot-health-stragglers"].caption
    assert "cause compute" in plots["plot-health-stragglers"].caption
    tables = health_tables(health)
    assert tables["rows"][0][0] == "productive" and len(tables["rows"]) == 11
    assert tables["attempts"][0]["ended"] == "completed" and tables["hang"] is None


STALL = """
import time
import otel_training as ot
ot.configure()
for step in range(1, 6):
    with ot.training_iteration(iteration=step):
        pass
def waits_for_a_peer_that_never_comes():
    with ot.forward_backward(iteration=6):
        print("stuck", flush=True)
        time.sleep(60)
with ot.training_iteration(iteration=6):
    waits_for_a_peer_that_never_comes()
"""


@pytest.mark.slow
def test_a_rank_killed_while_hung_shows_its_culprit_and_stack(tmp_path, monkeypatch):
    """Stalled past a 0.3 s floor, killed 1 s later (exports every 0.3 s): the report names
    the hang, the culprit phase and the stack the watchdog wrote (HTML-escaped)."""
    from otel_training.report import find_run_directory, load_run, write_report

    env = child_env(
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path),
        OTEL_PYTHON_TRAINING_HANG_FLOOR_S="0.3",
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="per_step",
        OTEL_METRIC_EXPORT_INTERVAL="300",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", STALL], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "stuck"
        deadline = time.monotonic() + 30
        spans = None
        while time.monotonic() < deadline:  # the watchdog's stacks line on disk
            found = list(tmp_path.glob("*/spans-rank0.jsonl"))
            if found and '"stacks"' in found[0].read_text():
                spans = found[0]
                break
            time.sleep(0.05)
        assert spans is not None
        time.sleep(1.0)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_HANG_FLOOR_S", "0.3")  # the reader's H is the rank's
    page = write_report(load_run(find_run_directory(tmp_path)), tmp_path / "r.html").read_text()
    assert 'id="health-hang"' in page and "forward_backward" in page
    assert "waits_for_a_peer_that_never_comes" in page
    assert "&lt;module&gt;" in page  # the stack's text is escaped
    assert 'id="plot-health-goodput"' in page
    assert 'id="health-incidents"' in page  # the hang as an incident


@documents("health.md", 'The report\'s "Run health" section has the same incidents as a table.')
def test_the_incidents_are_a_table_of_the_section():
    """A job with a straggler: one row, its rank, cause and moments from when it began."""
    health = assess(straggling_job(), now_s=T0 + 10_000)
    assert [x.kind for x in health.incidents] == ["straggler"]
    (row,) = health_tables(health)["incidents"]
    (incident,) = health.incidents
    assert row["kind"] == "straggler" and row["culprits"] == "rank 1"
    assert row["why"].startswith("compute, score 1.33")
    assert row["detect"] == f"{incident.time_to_detect_s:,.1f} s"
    assert row["recover"] == "–" and "still flagged" in row["recovery"]


@pytest.mark.parametrize("damage", ["no ledger", "no files"])
def test_a_run_without_health_data_says_so(tmp_path, damage):
    """Files without the ledger (an older version) or no run: a sentence, not an error."""
    from report_files import span_lines, write_lines

    from otel_training.report import load_run
    from otel_training.report.html import build_report

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if damage == "no ledger":
        write_lines(run_dir / "spans-rank0.jsonl", span_lines("megatron.train", "aa" * 8, None,
                                                             10**18, 10**18 + 10**9))  # fmt: skip
    page = build_report(load_run(run_dir))
    assert 'id="health"' in page
    assert "No health ledger" in page or "could not be assessed" in page


def test_the_health_section_is_titled_and_says_where_its_definitions_are(tmp_path):
    """A run with the health ledger: the page's "Run health" section (id ``health``, linked
    from the header) leads with what it shows and where the definitions are; without the
    ledger it says why there is nothing, and has no lead."""
    from report_files import span_lines, write_ledger_metrics, write_lines

    from otel_training.report import load_run
    from otel_training.report.html import build_report

    write_ledger_metrics(
        tmp_path / "metrics-rank0.jsonl",
        steps=6,
        log_every=2,
        export_at=[3],
        values=lambda step: {"loss": 1.0 / step},
    )
    page = build_report(load_run(tmp_path))
    lead = (
        "Goodput over every attempt of this job, where each rank's time went, the progress "
        "a crash would lose, stragglers and a hang's culprit (definitions: "
        "<code>docs/health.md</code>; the same figures as <code>otel-training health</code>)."
    )
    assert '<section id="health">' in page and '<a href="#health">' in page
    assert "<h2>Run health</h2>" in page and page.count(lead) == 1
    from otel_training.report.html import _health
    from otel_training.report.run import Job

    assert _health(Job.of(load_run(tmp_path)))[2] == ""  # nothing to say instead
    bare = tmp_path / "bare"
    bare.mkdir()
    write_lines(bare / "spans-rank0.jsonl", span_lines("megatron.train", "aa" * 8, None,
                                                       10**18, 10**18 + 10**9))  # fmt: skip
    page = build_report(load_run(bare))
    health = page.split('<section id="health">', 1)[1].split("</section>", 1)[0]
    assert "<h2>Run health</h2>" in health and 'class="lead"' not in health
    assert (
        "No health ledger in these files (<code>dl.training.phase.time</code>): they were "
        "written by a version without it, or with metrics off." in page
    )


def test_what_an_attempt_cannot_know_is_beside_it_in_the_report():
    """An attempt's estimates are a row under it in the report's attempts table."""
    from otel_training.report.health_figures import health_tables

    job = straggling_job()
    for process in job.processes:
        process.resource["dl.world_size"] = 3  # rank 2 left no files
    tables = health_tables(assess(job, now_s=T0 + 10_000))
    (attempt,) = tables["attempts"]
    assert attempt["estimated"] == (
        "rank 2 of its 3 left no files: its figures are those of the other ranks"
    )
