"""What the otel-training command shows in a terminal and in a pipe (cli.py, issue 26 item 4):
``health`` within 80 columns (the terminal's width in a terminal), the demo's progress bar in
a pseudo-terminal and nowhere else."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from health_sim import SimRank, job_resource, simulated, write_process
from support import child_env, import_or_unavailable

from otel_training import cli
from otel_training.health import ledger as L

pytestmark = pytest.mark.slow  # the demo and the command run in child processes and a terminal

BIN = Path(sys.executable).parent


def _killed_and_resumed(out: Path, run_ids: tuple[str, str], attempts=(0, 1)) -> None:
    """The README's walk: attempt 0 killed inside a step after its checkpoint, attempt 1
    resumed; one rank each, in two run directories named by their run ids."""
    first = SimRank(1_800_000_000.0)
    first.advance(4.0)
    for _ in range(220):
        first.step()
        if first.iteration == 200:
            first.phase(L.CHECKPOINT_SAVE, 0.2, first.iteration)
    first.begin_step(0.05)
    second = simulated(1_800_000_000.0 + 60.0, steps=100)
    for sim, run_id, attempt in zip((first, second), run_ids, attempts):
        created = "2027-01-15T08:00:00.000Z" if sim is first else "2027-01-15T08:01:00.000Z"
        write_process(out / run_id, sim, job_resource(0, attempt, created, run_id, "my-job"))


def _health(out: Path, capsys) -> list[str]:
    assert cli.main(["health", str(out)]) == 0
    return capsys.readouterr().out.splitlines()


def test_health_of_the_readme_walk_fits_80_columns(tmp_path, capsys):
    """The README's crash walk (job my-job, two attempts): no line over 80 characters, the
    attempts as records since their table would be 111 wide."""
    _killed_and_resumed(tmp_path / "out", ("my-job-a0", "my-job-a1"))
    lines = _health(tmp_path / "out", capsys)
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    assert "  attempt 0" in lines and "  attempt 1" in lines
    assert any("run: my-job-a0" in line and "ranks: 1" in line for line in lines)
    assert any("ended: killed" in line for line in lines)


@pytest.mark.parametrize("length", [22, 200])
def test_health_with_long_run_ids_fits_80_columns(tmp_path, capsys, length):
    """Timestamped run ids (20261206-172426-a97df2, attempts told apart by start time), and
    ids of 200 characters: no line over 80, every part of the id shown."""
    ids = tuple(("20261206-172426-a97df2" + "x" * length)[:length] + f"-{n}" for n in (0, 1))
    _killed_and_resumed(tmp_path / "out", ids, attempts=(None, None))
    lines = _health(tmp_path / "out", capsys)
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    assert "(by start time)" in "\n".join(lines)
    assert ids[1] in "".join(line.strip() for line in lines)


def test_the_width_is_80_in_a_pipe_and_the_terminal_s_in_a_terminal():
    """A pipe (not a terminal): 80 columns, whatever COLUMNS says."""

    class Pipe:
        def isatty(self) -> bool:
            return False

    assert cli.terminal_width(Pipe()) == 80


def _pty_run(argv: list[str], *, columns: int = 0, timeout_s: float = 240.0, env=None):
    """``argv`` with stdin, stdout and stderr on a new pseudo-terminal of ``columns`` columns
    (0: a terminal that reports no size, as one a program opens); its exit status and
    everything it wrote."""
    master, slave = os.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    process = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env or child_env(), close_fds=True
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    return process.wait(), output.decode(errors="replace")


def test_health_in_a_terminal_fits_its_width(tmp_path):
    """In a terminal of 60 columns: no line over 60 (COLUMNS unset)."""
    _killed_and_resumed(tmp_path / "out", ("my-job-a0", "my-job-a1"))
    status, output = _pty_run(
        [str(BIN / "otel-training"), "health", str(tmp_path / "out")],
        columns=60,
        env=child_env(COLUMNS=None),
    )
    assert status == 0, output
    lines = output.replace("\r\n", "\n").splitlines()
    assert lines and max(map(len, lines)) <= 60, output


DEMO = ["demo", "--steps", "30", "--log-interval", "10", "--tensor-metrics", "none"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("columns", [0, 100])
def test_the_demo_shows_its_progress_bar_in_a_pseudo_terminal(tmp_path, columns):
    """Under a pseudo-terminal (with no size, as a program opens one, and with one) the demo
    draws a progress bar of its steps (tqdm's ``n/total`` and ``step/s``), redrawn in place."""
    import_or_unavailable("torch")
    import_or_unavailable("tqdm")
    env = child_env(OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path / "out"), COLUMNS=None)
    status, output = _pty_run([str(BIN / "otel-training"), *DEMO], columns=columns, env=env)
    assert status == 0, output[-3000:]
    assert "30/30" in output and "step/s" in output, output[-3000:]
    assert "\r" in output.replace("\r\n", "")  # drawn in place, not line after line
    assert "step 30/30 | loss" in output


@pytest.mark.timeout(300)
def test_the_demo_shows_no_progress_bar_in_a_pipe(tmp_path):
    """stdout and stderr to pipes: the per-interval lines, and no bar on either."""
    import_or_unavailable("torch")
    import_or_unavailable("tqdm")
    done = subprocess.run(
        [str(BIN / "otel-training"), *DEMO], capture_output=True, text=True, timeout=240,
        env=child_env(OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path / "out")),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step 30/30 | loss" in done.stdout
    for stream in (done.stdout, done.stderr):
        assert "step/s" not in stream and "\r" not in stream and "%|" not in stream
