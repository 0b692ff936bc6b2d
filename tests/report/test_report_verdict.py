"""The verdict (report/verdict.py) on jobs simulated in memory (tests/health_sim.py): each
question's level and sentence, the word of the worst, the terminal's lines; a goodput that
cannot be known reads unknown (never 0 %) in the verdict and in ``health --json``; a
one-rank job's stragglers are not judged; a job under ten minutes is not judged on its
goodput. The report's block in Chromium: tests/integration/test_report_verdict_browser.py."""

from __future__ import annotations

import json

import pytest
from health_sim import SimRank
from test_report_health import hung_job

from otel_training.health import ledger as L
from otel_training.health.evidence import Job, Process
from otel_training.report.health import assess
from otel_training.report.verdict import (
    GOODPUT_JUDGED_AFTER_S,
    LOW_GOODPUT,
    judge,
    worst,
)

T0 = 1_800_000_000.0


def _finding(verdict, topic):
    (found,) = [f for f in verdict.findings if f.topic == topic]
    return found


def _ranks(n: int, *, startup_s: float = 2.0, steps: int = 60) -> list[SimRank]:
    """``n`` ranks of one attempt that start for ``startup_s`` and run ``steps`` steps of 0.1 s."""
    ranks = [SimRank(T0, rank=r) for r in range(n)]
    for sim in ranks:
        sim.advance(startup_s)
        for _ in range(steps):
            sim.step()
    return ranks


def _ended(ranks: list[SimRank]) -> tuple[Job, float]:
    processes = [sim.end() for sim in ranks]
    return Job("job", [], processes), max(p.last_s for p in processes) + 1.0


def test_a_healthy_short_job_reads_healthy_and_its_goodput_is_not_judged():
    """Two ranks, 60 steps after 2 s of start-up, ended cleanly: Healthy; its goodput is
    given but not judged (shorter than ten minutes)."""
    job, now = _ended(_ranks(2))
    verdict = judge(assess(job, now_s=now))
    goodput = _finding(verdict, "goodput")
    assert goodput.level == "ok"
    assert goodput.text.startswith("goodput ") and "not judged: shorter than 10 min" in goodput.text
    assert verdict.level == "ok" and verdict.word == "Healthy"
    assert _finding(verdict, "hang").text == "hang: none"


def test_a_long_job_mostly_starting_needs_attention_for_its_goodput():
    """12 minutes of start-up, then 60 steps: goodput far under 50 % of a job longer than
    the judged minimum reads Attention, the verdict's headline."""
    startup = GOODPUT_JUDGED_AFTER_S + 120.0
    job, now = _ended(_ranks(2, startup_s=startup))
    health = assess(job, now_s=now)
    assert health.account.goodput < LOW_GOODPUT
    verdict = judge(health)
    goodput = _finding(verdict, "goodput")
    assert goodput.level == "attention" and goodput.text.endswith("below 50 %")
    assert verdict.level == "attention" and verdict.headline == goodput.text
    assert verdict.lines()[0] == f"Attention: {goodput.text}"


def test_one_rank_has_no_peer_so_its_stragglers_are_not_judged():
    job, now = _ended(_ranks(1, steps=100))
    stragglers = _finding(judge(assess(job, now_s=now)), "stragglers")
    assert stragglers.level == "unknown"
    assert stragglers.text == "stragglers: not judged: one rank, no peer to compare it with"


def test_too_few_steps_for_a_window_is_not_judged_and_says_the_variable():
    job, now = _ended(_ranks(2, steps=10))
    stragglers = _finding(judge(assess(job, now_s=now)), "stragglers")
    assert stragglers.level == "unknown"
    assert "OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS" in stragglers.text


def _blind_job() -> tuple[Job, float]:
    """Two ranks seen only through their resource and the times of their lines: no ledger
    exported to the files, no phase span (metrics sent only to Prometheus), for 20 minutes."""
    processes = []
    for rank in (0, 1):
        process = Process(rank=rank, run_id="run", attempt=0, created_s=T0,
                          resource={"dl.rank": rank, "dl.run.id": "run"})  # fmt: skip
        for t in range(0, 1201, 60):
            process.see(T0 + t)
        process.alive_s = process.last_s
        processes.append(process)
    return Job("job", [], processes), T0 + 1300.0


def test_a_goodput_nobody_exported_is_unknown_with_its_reason_never_zero():
    """The verdict says unknown and why; the level is unknown, which makes nothing worse;
    ``health --json`` gives null (the job's and the attempt's), with the reason."""
    job, now = _blind_job()
    health = assess(job, now_s=now)
    verdict = judge(health)
    goodput = _finding(verdict, "goodput")
    assert goodput.level == "unknown"
    assert goodput.text.startswith("goodput unknown: no rank exported the health ledger")
    assert "0.0 %" not in goodput.text
    assert verdict.level != "problem" or _finding(verdict, "state").level == "problem"
    document = json.loads(json.dumps(health.to_json(), allow_nan=False))
    assert document["goodput"] is None and document["productive_s"] is None
    assert document["goodput_unknown"] == goodput.text.removeprefix("goodput unknown: ")
    assert [a["goodput"] for a in document["attempts"]] == [None]
    assert [a["productive_s"] for a in document["attempts"]] == [None]


def test_a_known_goodput_is_a_number_in_the_json():
    job, now = _ended(_ranks(2))
    document = assess(job, now_s=now).to_json()
    assert document["goodput_unknown"] is None
    assert 0.0 < document["goodput"] < 1.0
    assert document["attempts"][0]["goodput"] == pytest.approx(document["goodput"])


def test_a_hung_job_is_a_problem_headed_by_its_culprit():
    job, now = hung_job()
    verdict = judge(assess(job, now_s=now))
    hang = _finding(verdict, "hang")
    assert hang.level == "problem" and "culprit: rank 1" in hang.text
    assert verdict.word == "Problem" and verdict.headline == hang.text
    lines = verdict.lines()
    assert lines[0] == f"Problem: {hang.text}"
    assert all(line.startswith("  ") for line in lines[1:])
    assert not any(hang.text in line for line in lines[1:])  # the headline once


def test_a_killed_attempt_before_the_last_is_named_with_its_lost_steps():
    first = _ranks(2, steps=40)
    for sim in first:
        sim.begin_step(0.05)
    processes = [sim.end(evidence=False) for sim in first]
    start = max(p.last_s for p in processes) + 30.0
    second = [SimRank(start, rank=r, attempt=1) for r in (0, 1)]
    for sim in second:
        sim.advance(2.0)
        sim.phase(L.CHECKPOINT_LOAD, 1.0, 0)
        for _ in range(30):
            sim.step()
        processes.append(sim.end())
    now = max(p.last_s for p in processes) + 1.0
    verdict = judge(assess(Job("job", [], processes), now_s=now))
    attempts = _finding(verdict, "attempts")
    assert attempts.level == "attention"
    assert attempts.text.startswith("attempts: 2, 1 failed or killed before the last: attempt 0 ")
    assert _finding(verdict, "state").text.startswith("completed (attempt 1, the last of 2")


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        (["ok", "unknown"], "ok"),
        (["unknown", "unknown"], "unknown"),
        ([], "unknown"),
        (["ok", "problem", "attention", "unknown"], "problem"),
        (["attention", "ok"], "attention"),
    ],
)
def test_the_worst_level_ignores_what_is_unknown(levels, expected):
    assert worst(levels) == expected
