"""What run health reads of a job's files (report/reader.py, report/health.py's ``evidence``):
processes told apart by their Resource in one file or across run directories, the job found
from any of its directories, other jobs' lines left out, the last evidence of life, damage as
notes; the same processes whether the report's whole reading or health's alone. Metrics lines
are the real SDK's OTLP-JSON (the ledger's instruments on a FileMetricExporter); span lines
follow docs/spans.md."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from doc_rules import documents
from health_sim import job_resource, simulated, write_process

from otel_training.health import goodput
from otel_training.health import ledger as L
from otel_training.health.evidence import Job, attempts
from otel_training.report import RunNotFoundError, find_run_directory, job_directories, load_job
from otel_training.report.health import evidence

T0 = 1_800_000_000.0


def read(directory: Path, *, purpose: str = "health") -> Job:
    """The evidence of the job that ``directory`` shows, as ``otel-training health`` reads it
    or as the report does (``purpose="report"``)."""
    return evidence(load_job(find_run_directory(directory), purpose=purpose))


def test_processes_in_one_file_are_told_apart_by_their_resource(tmp_path):
    """Two attempts of rank 0 appended to the same files: two processes, each its own."""
    run = tmp_path / "out" / "run"
    first, second = simulated(T0), simulated(T0 + 100, steps=8)
    write_process(run, first, job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job"))
    write_process(run, second, job_resource(0, 1, "2027-01-15T08:01:40.000Z", "run", "job"))
    job = read(run)
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


def test_the_report_and_health_read_the_same_processes(tmp_path):
    """The report's whole reading and health's alone give the same processes (the report
    keeps more of each file, not different facts)."""
    out = tmp_path / "out"
    for attempt, created in ((0, "2027-01-15T08:00:00.000Z"), (1, "2027-01-15T08:01:40.000Z")):
        for rank in (0, 1):
            attrs = job_resource(rank, attempt, created, f"run-a{attempt}", "job")
            write_process(out / f"run-a{attempt}", simulated(T0 + 100 * attempt), attrs)
    alone, whole = read(out / "run-a1"), read(out / "run-a1", purpose="report")
    assert len(alone.processes) == 4
    for mine, theirs in zip(alone.processes, whole.processes, strict=True):
        assert dataclasses.asdict(mine) == dataclasses.asdict(theirs)
    assert alone.directories == whole.directories == [out / "run-a0", out / "run-a1"]


def test_span_lines_of_older_versions_go_to_the_process_alive_then(tmp_path):
    """Span lines without attempt and creation time join the process of their run and rank."""
    run = tmp_path / "out" / "run"
    sim = simulated(T0)
    attrs = job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job")
    write_process(run, sim, attrs)
    lines = (run / "spans-rank0.jsonl").read_text().splitlines()
    old = []
    for line in lines:
        record = json.loads(line)
        record["resource"] = {"dl.rank": 0, "dl.run.id": "run", "dl.job.id": "job"}
        old.append(json.dumps(record))
    (run / "spans-rank0.jsonl").write_text("\n".join(old) + "\n")
    (process,) = read(run).processes
    assert process.attempt == 0 and len(process.spans) == len(sim.process.spans)


def test_the_job_is_found_from_any_of_its_run_directories(tmp_path):
    """run-a0 and run-a1 of job J, and another job beside them: from either directory or
    the output directory, J's two directories."""
    out = tmp_path / "out"
    write_process(
        out / "run-a0", simulated(T0), job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run-a0", "J")
    )
    write_process(
        out / "run-a1", simulated(T0), job_resource(0, 1, "2027-01-15T08:01:00.000Z", "run-a1", "J")
    )
    write_process(
        out / "other", simulated(T0), job_resource(0, 0, "2027-01-15T07:00:00.000Z", "other", "K")
    )
    os.utime(out / "other" / "metrics-rank0.jsonl", (1, 1))
    os.utime(out / "other" / "spans-rank0.jsonl", (1, 1))
    (out / "latest").symlink_to("run-a1")
    expected = [(out / "run-a0").resolve(), (out / "run-a1").resolve()]
    for where in (out / "run-a0", out / "run-a1", out):
        assert job_directories(find_run_directory(where)) == expected
        job = read(where)
        assert job.job_id == "J" and job.directories == expected
    assert read(out / "other").job_id == "K"
    assert job_directories(out / "other") == [(out / "other").resolve()]
    with pytest.raises(RunNotFoundError):
        read(tmp_path / "missing")


def test_the_run_id_without_its_attempt_is_the_job_when_there_is_no_job_id(tmp_path):
    """No dl.job.id: run-a0 and run-a1 are one job, run-b is another."""
    out = tmp_path / "out"
    for run, attempt in (("run-a0", 0), ("run-a1", 1), ("runb", 0)):
        attrs = job_resource(0, attempt, f"2027-01-15T08:0{attempt}:00.000Z", run, "x")
        del attrs["dl.job.id"]
        write_process(out / run, simulated(T0), attrs)
    assert [p.name for p in job_directories(out / "run-a0")] == ["run-a0", "run-a1"]
    job = read(out / "run-a0")
    assert job.job_id == "run" and sorted(p.run_id for p in job.processes) == ["run-a0", "run-a1"]


def test_lines_of_another_job_in_the_same_files_are_left_out_with_a_note(tmp_path):
    """The flat layout of older versions: the job seen last is read, the other one named."""
    run = tmp_path / "out"
    write_process(run, simulated(T0), job_resource(0, 0, "2027-01-15T08:00:00.000Z", "r1", "A"))
    write_process(
        run, simulated(T0 + 3600), job_resource(0, 0, "2027-01-15T09:00:00.000Z", "r2", "B")
    )
    job = read(run)
    assert [p.job_id for p in job.processes] == ["B"]
    assert any("1 other job (A)" in note for note in job.notes)


def test_a_file_touched_after_the_last_record_moves_the_end_by_one_interval_at_most(tmp_path):
    """Files written 0.8 s after the last record: the end moves 0.8 s; 20 s: not at all (a
    copied directory). (These exports came moments apart: one interval is about nothing.)"""
    run = tmp_path / "out" / "run"
    sim = simulated(T0)
    write_process(run, sim, job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job"))
    (process,) = read(run).processes
    last = process.last_s
    for later, moved in ((0.8, 0.8), (20.0, 0.0)):
        for name in ("metrics-rank0.jsonl", "spans-rank0.jsonl"):
            os.utime(run / name, (last + later, last + later))
        (process,) = read(run).processes
        assert process.alive_s == pytest.approx(last + moved, abs=1e-3)


def test_damaged_lines_are_notes_and_a_torn_tail_is_not(tmp_path):
    """A line that is not JSON mid-file is counted in a note; a cut last line is normal."""
    run = tmp_path / "out" / "run"
    write_process(run, simulated(T0), job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job"))
    path = run / "spans-rank0.jsonl"
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0], "not json", *text[1:]]) + '\n{"record": "span_en')
    job = read(run)
    assert job.processes
    assert any("spans-rank0.jsonl: 1 line not readable" in note for note in job.notes)
    assert not any("cut" in note for note in job.notes)


@documents("health.md", "`is_goodput_span` plays no part")
def test_is_goodput_span_plays_no_part(tmp_path):
    """Megatron-LM's is_goodput_span (true on saves, false on iterations, or absent) changes
    no span read and no figure of the goodput account."""
    run = tmp_path / "out" / "run"
    write_process(
        run, simulated(T0, steps=8), job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job")
    )
    before = read(run).processes
    lines = []
    for line in (run / "spans-rank0.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["attributes"]["is_goodput_span"] = record["name"] == "megatron.checkpoint.save"
        lines.append(json.dumps(record))
    (run / "spans-rank0.jsonl").write_text("\n".join(lines) + "\n")
    after = read(run).processes
    assert [p.spans for p in after] == [p.spans for p in before] and before[0].spans
    assert goodput.account(attempts(after)) == goodput.account(attempts(before))


def _recorded(directory: Path, sim, attrs: dict, name: str) -> Path:
    """The sim's ledger kept in a progress record file of ``directory`` (as ``configure()``
    keeps it), under the identity ``attrs`` names."""
    path = directory / name
    identity = {k: attrs.get(k) for k in ("service.instance.id", "dl.rank", "dl.run.id")}
    sim.ledger.record_to(str(path), {**identity, "created_s": sim.process.created_s})
    return path


@documents("health.md", "as one more sample of the ledger, taken at its last copy")
@pytest.mark.parametrize("matched_by", ["instance", "creation time"])
def test_a_progress_record_is_the_last_sample_of_its_process(tmp_path, matched_by):
    """Steps after the last export, in the record only: the reader gives the process a sample
    at the record's last copy (a step's end, a phase opened SYNC_S after the copy before),
    with its phase times and progress, and evidence of life until then; it finds the record
    by service.instance.id, else by rank and creation time."""
    run = tmp_path / "out" / "run"
    sim = simulated(T0)
    attrs = job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job")
    if matched_by == "instance":
        attrs["service.instance.id"] = "run-rank0-0badcafe"
    write_process(run, sim, attrs)
    _recorded(run, sim, attrs, "ledger-rank0-0badcafe.bin")
    exported = sim.ledger.read()
    for _ in range(4):  # after the last export: 4 more steps, then the kill in a data wait
        sim.step()
    token = sim.ledger.enter(L.DATA_LOADING)  # at once: the record holds the step's end
    (process,) = read(run).processes
    assert (process.samples[-1].open_phase, process.samples[-1].time_s) == ("other", sim.now)
    sim.advance(L.SYNC_S * 2)
    sim.ledger.exit(token, L.DATA_LOADING)
    sim.ledger.enter(L.DATA_LOADING)  # SYNC_S after the last copy: copied
    sim.advance(0.25)  # the kill: nothing after the transition into data loading is known
    truth = sim.ledger.read()
    (process,) = read(run).processes
    last = process.samples[-1]
    assert process.record is not None and exported.iteration == 5
    assert last.iteration == 9 and last.open_phase == "data_loading" and last.open_s == 0.0
    assert last.time_s == pytest.approx(sim.now - 0.25, abs=1e-6)
    assert process.alive_s == pytest.approx(sim.now - 0.25, abs=1e-6)
    assert last.phase_s == pytest.approx(
        tuple(truth.phase_time_s[p] - (0.25 if p == "data_loading" else 0) for p in L.PHASES),
        abs=1e-6,
    )
    assert last.saved_iteration == 5 and last.progress_s == pytest.approx(truth.progress_unix_s)


def test_a_record_of_another_process_is_no_ones(tmp_path):
    """A record whose instance and creation time match no process of the files is left out,
    and a file that is no record (cut short, another format) too."""
    run = tmp_path / "out" / "run"
    sim = simulated(T0)
    attrs = job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "job")
    write_process(run, sim, attrs)
    stranger = simulated(T0 + 50)
    _recorded(run, stranger, {"dl.rank": 0}, "ledger-rank0-stranger.bin")
    (run / "ledger-rank0-cut.bin").write_bytes(b"otlrec\x00\x01" + b"\x00" * 100)
    (process,) = read(run).processes
    assert process.record is None and process.samples[-1].iteration == 5


@documents("health.md", "ranks of its world that left no files")
def test_ranks_that_left_no_files_are_said_beside_the_attempt(tmp_path):
    """World size 2, files of rank 0 only: the attempt says rank 1 left none, in the JSON
    beside its figures and in the terminal summary."""
    from otel_training.report.health import assess, format_text

    run = tmp_path / "out" / "run"
    write_process(run, simulated(T0), job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run", "J"))
    health = assess(read(run), now_s=T0 + 3600)
    (attempt,) = health.to_json()["attempts"]
    assert attempt["estimated"] == [
        "rank 1 of its 2 left no files: its figures are those of the other ranks"
    ]
    assert "estimated, attempt 0: rank 1 of its 2 left no files" in format_text(health)


@documents("health.md", "a last record more than a second after the next attempt's first")
def test_an_attempt_that_ends_after_the_next_one_began_is_said_to_disagree(tmp_path):
    """Attempt 0's host clock runs ahead: its last record is 1.7 s after attempt 1's start;
    health cuts it there and says so beside attempt 0 (and only there)."""
    from otel_training.report.health import assess

    out = tmp_path / "out"
    first, second = simulated(T0), simulated(T0 + 0.5, steps=8)  # attempt 0 ends at T0 + 2.18
    write_process(
        out / "run-a0", first, job_resource(0, 0, "2027-01-15T08:00:00.000Z", "run-a0", "J")
    )
    write_process(
        out / "run-a1", second, job_resource(0, 1, "2027-01-15T08:00:00.500Z", "run-a1", "J")
    )
    one, two = assess(read(out / "run-a1"), now_s=T0 + 3600).to_json()["attempts"]
    (why,) = [w for w in one["estimated"] if "clocks disagree" in w]
    assert why.startswith("its last record is ")
    assert not [w for w in two["estimated"] if "clocks disagree" in w]
    assert one["badput_s"]["downtime"] == 0.0
