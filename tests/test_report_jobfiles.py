"""Reading a job's files (report/jobfiles.py): processes told apart by their Resource in one
file or across run directories, the job found from any of its directories, other jobs' lines
skipped, the last evidence of life, damage as notes. Metrics lines are the real SDK's
OTLP-JSON (the ledger's instruments on a FileMetricExporter); span lines follow docs/spans.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from doc_rules import documents
from health_sim import SimRank
from opentelemetry.exporter.otlp.json.file import FileMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from otel_training.health import goodput
from otel_training.health import ledger as L
from otel_training.health.evidence import attempts
from otel_training.health.metrics import observe_ledger
from otel_training.report.jobfiles import job_directories, read_job
from otel_training.report.rundir import RunNotFoundError

T0 = 1_800_000_000.0


def resource(rank: int, attempt: int | None, created: str | None, run: str, job: str) -> dict:
    found = {"dl.rank": rank, "dl.run.id": run, "dl.job.id": job, "dl.world_size": 2}
    if attempt is not None:
        found["dl.run.attempt"] = attempt
    if created is not None:
        found["process.creation.time"] = created
    return found


def write_process(directory: Path, sim: SimRank, attrs: dict, *, exports: int = 3) -> None:
    """The sim's ledger exported ``exports`` times by the real SDK into metrics-rank{R}.jsonl,
    its phase spans as span lines into spans-rank{R}.jsonl (both appended)."""
    directory.mkdir(parents=True, exist_ok=True)
    rank = attrs["dl.rank"]
    exporter = FileMetricExporter(directory / f"metrics-rank{rank}.jsonl")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10**9)
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create(attrs))
    observe_ledger(provider.get_meter("otel_training"), source=lambda: sim.ledger)
    try:
        for _ in range(exports):
            provider.force_flush()
    finally:
        provider.shutdown()
    span_resource = {k: v for k, v in attrs.items() if not k.startswith("telemetry.")}
    with open(directory / f"spans-rank{rank}.jsonl", "a") as handle:
        for i, span in enumerate(sim.process.spans):
            line = {
                "record": "span_end" if span.end_s is not None else "span_start",
                "name": span.name,
                "trace_id": "ab" * 16,
                "span_id": f"{rank:04x}{attrs.get('dl.run.attempt') or 0:04x}{i:08x}",
                "parent_span_id": None,
                "start_time_ns": int(span.start_s * 1e9),
                "attributes": {"megatron.iteration": span.iteration},
                "rank": rank,
                "resource": span_resource,
            }
            if span.end_s is not None:
                line.update(end_time_ns=int(span.end_s * 1e9), status="UNSET", events=[])
            handle.write(json.dumps(line) + "\n")


def simulated(created: float, steps: int = 5) -> SimRank:
    sim = SimRank(created)
    sim.advance(1.0)
    for _ in range(steps):
        sim.step()
    sim.phase(L.CHECKPOINT_SAVE, 0.2, sim.iteration)
    return sim


def test_processes_in_one_file_are_told_apart_by_their_resource(tmp_path):
    """Two attempts of rank 0 appended to the same files: two processes, each its own."""
    run = tmp_path / "out" / "run"
    first, second = simulated(T0), simulated(T0 + 100, steps=8)
    write_process(run, first, resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job"))
    write_process(run, second, resource(0, 1, "2027-01-15T08:01:40.000Z", "run", "job"))
    job = read_job([run], "job")
    processes = sorted(job.processes, key=lambda p: p.attempt)
    # 3 flushes and the final export at shutdown
    assert [(p.attempt, p.rank, len(p.samples)) for p in processes] == [(0, 0, 4), (1, 0, 4)]
    assert [p.created_s for p in processes] == [T0, T0 + 100]  # 2027-01-15T08:00:00Z is T0
    assert processes[0].samples[-1].iteration == 5 and processes[1].samples[-1].iteration == 8
    assert processes[0].samples[-1].saved_iteration == 5
    assert [s.name for s in processes[1].spans].count("megatron.checkpoint.save") == 1
    assert processes[0].samples[0].phase_s is not None
    assert sum(processes[0].samples[0].phase_s) == pytest.approx(
        sum(first.ledger.read().phase_time_s.values()), abs=1e-6
    )


def test_span_lines_of_older_versions_go_to_the_process_alive_then(tmp_path):
    """Span lines without attempt and creation time join the process of their run and rank."""
    run = tmp_path / "out" / "run"
    sim = simulated(T0)
    attrs = resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job")
    write_process(run, sim, attrs)
    lines = (run / "spans-rank0.jsonl").read_text().splitlines()
    old = []
    for line in lines:
        record = json.loads(line)
        record["resource"] = {"dl.rank": 0, "dl.run.id": "run", "dl.job.id": "job"}
        old.append(json.dumps(record))
    (run / "spans-rank0.jsonl").write_text("\n".join(old) + "\n")
    (process,) = read_job([run], "job").processes
    assert process.attempt == 0 and len(process.spans) == len(sim.process.spans)


def test_the_job_is_found_from_any_of_its_run_directories(tmp_path):
    """run-a0 and run-a1 of job J, and another job beside them: from either directory or
    the output directory, J's two directories."""
    out = tmp_path / "out"
    write_process(
        out / "run-a0", simulated(T0), resource(0, 0, "2027-01-15T08:00:00.000Z", "run-a0", "J")
    )
    write_process(
        out / "run-a1", simulated(T0), resource(0, 1, "2027-01-15T08:01:00.000Z", "run-a1", "J")
    )
    write_process(
        out / "other", simulated(T0), resource(0, 0, "2027-01-15T07:00:00.000Z", "other", "K")
    )
    os.utime(out / "other" / "metrics-rank0.jsonl", (1, 1))
    os.utime(out / "other" / "spans-rank0.jsonl", (1, 1))
    (out / "latest").symlink_to("run-a1")
    expected = [(out / "run-a0").resolve(), (out / "run-a1").resolve()]
    for where in (out / "run-a0", out / "run-a1", out):
        assert job_directories(where) == ("J", expected)
    assert job_directories(out / "other") == ("K", [(out / "other").resolve()])
    with pytest.raises(RunNotFoundError):
        job_directories(tmp_path / "missing")


def test_the_run_id_without_its_attempt_is_the_job_when_there_is_no_job_id(tmp_path):
    """No dl.job.id: run-a0 and run-a1 are one job, run-b is another."""
    out = tmp_path / "out"
    for run, attempt in (("run-a0", 0), ("run-a1", 1), ("runb", 0)):
        attrs = resource(0, attempt, f"2027-01-15T08:0{attempt}:00.000Z", run, "x")
        del attrs["dl.job.id"]
        write_process(out / run, simulated(T0), attrs)
    key, found = job_directories(out / "run-a0")
    assert key == "run" and [p.name for p in found] == ["run-a0", "run-a1"]


def test_lines_of_another_job_in_the_same_files_are_skipped_with_a_note(tmp_path):
    """The flat layout of older versions: one job's process read, the other named."""
    run = tmp_path / "out"
    write_process(run, simulated(T0), resource(0, 0, "2027-01-15T08:00:00.000Z", "r1", "A"))
    write_process(run, simulated(T0), resource(0, 0, "2027-01-15T09:00:00.000Z", "r2", "B"))
    job = read_job([run], "B")
    assert [p.job_id for p in job.processes] == ["B"]
    assert any("other job" in note and "A" in note for note in job.notes)


def test_a_file_touched_after_the_last_record_moves_the_end_by_one_interval_at_most(tmp_path):
    """Files written 0.8 s after the last record: the end moves 0.8 s; 20 s: not at all (a
    copied directory). (These exports came moments apart: one interval is about nothing.)"""
    run = tmp_path / "out" / "run"
    sim = simulated(T0)
    write_process(run, sim, resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job"))
    (process,) = read_job([run], "job").processes
    last = process.last_s
    for later, moved in ((0.8, 0.8), (20.0, 0.0)):
        for name in ("metrics-rank0.jsonl", "spans-rank0.jsonl"):
            os.utime(run / name, (last + later, last + later))
        (process,) = read_job([run], "job").processes
        assert process.alive_s == pytest.approx(last + moved, abs=1e-3)


def test_damaged_lines_are_notes_and_a_torn_tail_is_not(tmp_path):
    """A line that is not JSON mid-file is counted in a note; a cut last line is normal."""
    run = tmp_path / "out" / "run"
    write_process(run, simulated(T0), resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job"))
    path = run / "spans-rank0.jsonl"
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], "not json", *text[1:]]) + '\n{"record": "span_en')
    job = read_job([run], "job")
    assert job.processes and any("1 unreadable lines" in note for note in job.notes)
    assert not any("torn" in note for note in job.notes)


@documents("health.md", "`is_goodput_span` plays no part")
def test_is_goodput_span_plays_no_part(tmp_path):
    """Megatron-LM's is_goodput_span (true on saves, false on iterations, or absent) changes
    no span read and no figure of the goodput account."""
    run = tmp_path / "out" / "run"
    sim = simulated(T0, steps=8)
    write_process(run, sim, resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job"))
    before = read_job([run], "job").processes
    lines = []
    for line in (run / "spans-rank0.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["attributes"]["is_goodput_span"] = record["name"] == "megatron.checkpoint.save"
        lines.append(json.dumps(record))
    (run / "spans-rank0.jsonl").write_text("\n".join(lines) + "\n")
    after = read_job([run], "job").processes
    assert [p.spans for p in after] == [p.spans for p in before] and before[0].spans
    assert goodput.account(attempts(after)) == goodput.account(attempts(before))
