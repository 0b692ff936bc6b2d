"""The embedded default's files: a directory per run, no symlink followed, no torn line
glued to."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

import otel_training as ot
from otel_training import files, setup


def test_run_directory_names_are_safe_and_latest_points_at_the_newest(tmp_path):
    """Odd run ids give a safe name; latest follows the newest run."""
    assert files.run_directory_name("slurm-123.4") == "slurm-123.4"
    assert files.run_directory_name("../../etc") == "_.._etc"
    assert files.run_directory_name("a/b\udcff c") == "a_b__c"
    assert files.run_directory_name("..") == "run"
    first = files.run_directory(str(tmp_path), "run-a")
    second = files.run_directory(str(tmp_path), "run-b")
    assert os.readlink(tmp_path / "latest") == "run-b"
    assert Path(first).is_dir() and (tmp_path / "latest").resolve() == Path(second)


def test_open_append_never_follows_a_planted_symlink(tmp_path):
    """A symlink at the file's path is refused: its target is not touched."""
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / "metrics-rank0.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        files.open_append(str(tmp_path / "metrics-rank0.jsonl"))
    assert target.read_text() == "precious\n"


def test_a_planted_symlink_warns_and_falls_back(tmp_path, monkeypatch, caplog):
    """configure() with a symlink planted at this run's metrics file: one warning naming it,
    the default directory is used instead, the symlink's target stays untouched."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "chosen"
    target = tmp_path / "victim"
    target.write_text("precious\n")
    env = {"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out), "OTEL_PYTHON_TRAINING_RUN_ID": "r1"}
    (out / "r1").mkdir(parents=True)
    (out / "r1" / "metrics-rank0.jsonl").symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        telemetry = setup.configure(environ=env)
    ot.record_training_metrics(telemetry.meter, loss=1.0)
    assert telemetry.shutdown()
    assert target.read_text() == "precious\n"
    warnings = [r.getMessage() for r in caplog.records if "a symlink is there" in r.getMessage()]
    assert len(warnings) == 1 and "metrics-rank0.jsonl" in warnings[0]
    fallback = tmp_path / "otel-training-telemetry" / "r1" / "metrics-rank0.jsonl"
    assert json.loads(fallback.read_text().splitlines()[-1])["resourceMetrics"]


def test_a_torn_last_line_is_not_glued_to(tmp_path):
    """A run appending to a file a killed run left mid-line starts on a fresh line: the torn
    tail stays alone and every new line parses."""
    env = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path),
        "OTEL_PYTHON_TRAINING_RUN_ID": "resumed",
        "OTEL_METRICS_EXPORTER": "otlp_json_file",
    }
    run = tmp_path / "resumed"
    run.mkdir()
    for name in ("metrics-rank0.jsonl", "traces-rank0.jsonl", "spans-rank0.jsonl"):
        (run / name).write_text('{"complete": 1}\n{"torn": "mid-li')
    telemetry = setup.configure(environ=env)
    ot.record_training_metrics(telemetry.meter, loss=1.0)
    with ot.training_run():
        pass
    assert telemetry.shutdown()
    for name in ("metrics-rank0.jsonl", "traces-rank0.jsonl", "spans-rank0.jsonl"):
        lines = (run / name).read_text().splitlines()
        assert lines[:2] == ['{"complete": 1}', '{"torn": "mid-li'], name
        assert len(lines) > 2 and all(json.loads(line) for line in lines[2:]), name


def test_two_runs_never_share_a_file(tmp_path):
    """Two runs in one output directory write two directories; latest is the second."""
    env = {"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path), "OTEL_METRICS_EXPORTER": "none"}
    first = setup.configure(environ={**env, "OTEL_PYTHON_TRAINING_RUN_ID": "one"})
    second = setup.configure(environ={**env, "OTEL_PYTHON_TRAINING_RUN_ID": "two"})
    assert first.output_dir != second.output_dir
    assert (tmp_path / "latest").resolve() == Path(second.output_dir)
    second.shutdown()


def _stream(directory: Path, name: str = "metrics-rank0.jsonl") -> files.AppendStream:
    return files.AppendStream(
        str(directory / name),
        what=name.split("-")[0],
        setting="OTEL_PYTHON_TRAINING_OUTPUT_DIR=/somewhere",
        identity={"dl.run.id": "r", "dl.rank": 0},
    )


def _write(stream: files.AppendStream, *lines: str) -> None:
    for line in lines:
        stream.write(line + "\n")
    stream.flush()


def test_a_removed_directory_is_recreated_once_for_all_its_files(tmp_path, caplog):
    """Two files of one run directory, the directory removed: both are written again there,
    one warning for the directory (naming it and the variable), a gap record per file with
    the lines that went with it."""
    run = tmp_path / "out" / "run-1"
    run.mkdir(parents=True)
    metrics, spans = _stream(run), _stream(run, "spans-rank0.jsonl")
    _write(metrics, "m1", "m2")
    _write(spans, "s1")
    shutil.rmtree(run)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        _write(metrics, "m3")
        _write(spans, "s2")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and str(run) in said[0] and "OUTPUT_DIR=/somewhere" in said[0]
    assert (run / "metrics-rank0.jsonl").read_text() == "m3\n"
    assert (run / "spans-rank0.jsonl").read_text() == "s2\n"
    gaps = [json.loads(line) for line in (run / "gaps-rank0.jsonl").read_text().splitlines()]
    assert {(g["file"], g["gone_lines"], g["lost_lines"]) for g in gaps} == {
        ("metrics-rank0.jsonl", 2, 0),
        ("spans-rank0.jsonl", 1, 0),
    }
    assert gaps[0]["resource"] == {"dl.run.id": "r", "dl.rank": 0}
    metrics.close()
    spans.close()


def test_failed_writes_are_counted_said_twice_and_recorded(tmp_path, caplog):
    """The run directory replaced by a file: each write is dropped and counted (records too),
    one warning when it starts, one with the count when writing works again; a gap record."""
    run = tmp_path / "run-2"
    run.mkdir()
    stream = _stream(run, "traces-rank0.jsonl")
    _write(stream, "t1")
    shutil.rmtree(run)
    run.write_text("not a directory\n")
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        for batch in range(3):
            stream.records(5)
            _write(stream, f"lost{batch}")
        assert stream.lost_lines == 3 and stream.lost_records == 15
        run.unlink()
        _write(stream, "t2")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "cannot write traces" in said[0] and "cannot be recreated" in said[0]
    assert "writes again" in said[1] and "3 lines (15 spans)" in said[1]
    assert (run / "traces-rank0.jsonl").read_text() == "t2\n"
    (gap,) = [json.loads(line) for line in (run / "gaps-rank0.jsonl").read_text().splitlines()]
    assert (gap["lost_lines"], gap["lost_records"], gap["gone_lines"]) == (3, 15, 1)
    assert gap["from_unix_ns"] <= gap["to_unix_ns"]
    stream.close()


def test_a_flapping_directory_warns_a_bounded_number_of_times(tmp_path, caplog):
    """Ten outages of one file: at most MAX_OUTAGE_WARNINGS announced (two lines each), then a
    total at close."""
    run = tmp_path / "run-3"
    run.mkdir()
    stream = _stream(run)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        for _ in range(10):
            shutil.rmtree(run)
            run.write_text("x")
            _write(stream, "lost")
            run.unlink()
            _write(stream, "kept")
        stream.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 * files.MAX_OUTAGE_WARNINGS + 1
    assert "10 lines" in said[-1] and "10 outages" in said[-1]
