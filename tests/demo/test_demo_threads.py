"""demo/threads.py and the demo's closing lines: torch's threads chosen for the processes on
the machine and said; the viewing commands printed as they run from here."""

from __future__ import annotations

import logging
import os
import stat
import sys

import pytest
from support import import_or_unavailable

from otel_training import cli, config
from otel_training.demo.threads import choose_threads, machine_cpus


def test_a_thread_count_asked_for_or_set_in_omp_num_threads_wins():
    """--threads first, then OMP_NUM_THREADS (torchrun sets it to 1 for several processes)."""
    assert choose_threads(8, 1, 0.0, omp_num_threads=3, asked=2).threads == 2
    choice = choose_threads(8, 2, 0.0, omp_num_threads=1)
    assert (choice.threads, choice.why) == (1, "OMP_NUM_THREADS=1")
    assert choice.sentence == "1 torch thread per process (OMP_NUM_THREADS=1)"


@pytest.mark.parametrize(
    ("cpus", "processes", "load", "threads"),
    [
        (8, 1, 0.2, 7),  # one CPU's worth of others' load: 7 left idle
        (8, 1, None, 8),  # load unknown: the CPUs
        (2, 2, 0.0, 1),  # two ranks on two CPUs
        (16, 4, 4.0, 3),  # 12 idle CPUs for 4 ranks
        (2, 1, 6.4, 1),  # a loaded 2-core machine: one thread (4.7x faster than two)
        (1, 8, 30.0, 1),  # never fewer than one
    ],
)
def test_the_cpus_are_shared_by_the_processes_and_the_load(cpus, processes, load, threads):
    """CPUs // processes, and no more than the idle CPUs // processes, at least 1."""
    choice = choose_threads(cpus, processes, load)
    assert choice.threads == threads
    assert f"{cpus} CPU" in choice.why
    if load is not None:
        assert f"load average {load:.1f}" in choice.why
    if processes > 1:
        assert f"shared by {processes} processes" in choice.why


def test_machine_cpus_is_the_affinity_mask():
    """The CPUs this process may run on (a container's or SLURM's set), not the machine's."""
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert machine_cpus() == expected


def test_omp_num_threads_is_read_by_config_with_its_policy(caplog):
    """A whole number, the first of a list; anything else one warning naming it, and unset."""
    assert config.load_omp_num_threads({"OMP_NUM_THREADS": "4"}) == 4
    assert config.load_omp_num_threads({"OMP_NUM_THREADS": " 4,2 "}) == 4
    assert config.load_omp_num_threads({}) is None
    with caplog.at_level(logging.WARNING):
        assert config.load_omp_num_threads({"OMP_NUM_THREADS": "0"}) is None
        assert config.load_omp_num_threads({"OMP_NUM_THREADS": "many"}) is None
    warnings = [r.getMessage() for r in caplog.records if "OMP_NUM_THREADS" in r.getMessage()]
    assert len(warnings) == 2


def _executable(path) -> None:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_command_printed_is_the_one_that_runs_from_here(tmp_path, monkeypatch):
    """Not on PATH: the venv's script, relative to the working directory when it is inside
    it; on PATH as this installation: the bare name; no script: python -m."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    _executable(bin_dir / "python")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.chdir(tmp_path)
    assert cli.command_name() == f"{sys.executable} -m otel_training.cli"
    _executable(bin_dir / "otel-training")
    assert cli.command_name() == ".venv/bin/otel-training"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert cli.command_name() == str(bin_dir / "otel-training")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert cli.command_name() == "otel-training"


def test_the_demo_says_its_threads_and_how_to_view_its_files(tmp_path, capsys, monkeypatch):
    """`otel-training demo` prints the threads it chose, and a last line whose commands run
    as printed (here: not on PATH, so the script's path)."""
    torch = import_or_unavailable("torch")
    before = torch.get_num_threads()
    monkeypatch.setenv("PATH", "/nonexistent")
    argv = ["demo", "--steps", "2", "--log-interval", "1", "--layers", "1", "--d-model", "16",
            "--heads", "2", "--seq-len", "16", "--batch-size", "2", "--device", "cpu",
            "--max-data-bytes", "200000", "--threads", "1", "--tensor-metrics", "none"]  # fmt: skip
    try:
        assert cli.main(argv) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert "threads: 1 torch thread per process (--threads 1)" in out
    assert "with 1 torch thread per process (--threads 1)" in out
    last = out.strip().splitlines()[-1]
    command = cli.command_name()
    assert last.startswith(f"view them: {command} report ") and command != "otel-training"
