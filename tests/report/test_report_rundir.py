"""report.rundir: which directory holds the run to read."""

from __future__ import annotations

import os
import time

import pytest

from otel_training.report import RunNotFoundError, find_run_directory


def _touch(directory, name="metrics-rank0.jsonl", age_s=0.0):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("{}\n")
    moment = time.time() - age_s
    os.utime(path, (moment, moment))
    return path


def test_a_run_directory_is_itself(tmp_path):
    """A directory holding rank files (a run directory, or the old flat layout) is the run."""
    _touch(tmp_path, "spans-rank3.jsonl")
    assert find_run_directory(tmp_path) == tmp_path.absolute()


def test_latest_is_followed(tmp_path):
    """An output directory's ``latest`` link names the run, even when another is newer."""
    _touch(tmp_path / "run-a", age_s=100)
    _touch(tmp_path / "run-b")
    (tmp_path / "latest").symlink_to("run-a")
    assert find_run_directory(tmp_path) == (tmp_path / "run-a").resolve()


def test_without_latest_the_newest_run_is_taken(tmp_path):
    """Without ``latest`` (or with a dangling one), the subdirectory written last is the run."""
    _touch(tmp_path / "run-a")
    _touch(tmp_path / "run-b", age_s=100)
    (tmp_path / "empty").mkdir()
    (tmp_path / "latest").symlink_to("gone")
    assert find_run_directory(tmp_path) == (tmp_path / "run-a").absolute()


def test_the_default_is_the_output_directory_of_the_environment(tmp_path, monkeypatch):
    """No directory given: ``OTEL_PYTHON_TRAINING_OUTPUT_DIR`` is searched."""
    _touch(tmp_path / "out" / "run-a")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_OUTPUT_DIR", str(tmp_path / "out"))
    assert find_run_directory() == (tmp_path / "out" / "run-a").absolute()


@pytest.mark.parametrize("layout", ["absent", "empty", "file", "unrelated"])
def test_no_run_raises_run_not_found(tmp_path, layout):
    """An absent path, a file, or a directory without rank files raises RunNotFoundError."""
    target = tmp_path / "out"
    if layout == "empty":
        target.mkdir()
    elif layout == "file":
        target.write_text("x")
    elif layout == "unrelated":
        _touch(target / "sub", "notes.txt")
    with pytest.raises(RunNotFoundError, match=str(target)):
        find_run_directory(target)
