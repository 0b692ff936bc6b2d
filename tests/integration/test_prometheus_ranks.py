"""The Prometheus exporter with several local ranks on one node (case A14): every rank serves
its own port, base port + LOCAL_RANK, and says which."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from prometheus_server import free_port_run
from support import child_env

RANK = textwrap.dedent(
    """
    import sys, time
    import otel_training
    t = otel_training.configure()
    rank = t.settings.identity.rank
    otel_training.record_training_metrics(t.meter, loss=2.0 + rank)
    print(t.destination, flush=True)
    sys.stdin.read()          # stays up until the test closes stdin
    """
)


def _start(rank: int, base: int, repo_root: Path) -> subprocess.Popen:
    env = child_env(
        OTEL_METRICS_EXPORTER="prometheus",
        OTEL_TRACES_EXPORTER="none",
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(base),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="4",
        LOCAL_WORLD_SIZE="4",
        OTEL_PYTHON_TRAINING_RUN_ID="a14",
    )
    return subprocess.Popen(
        [sys.executable, "-c", RANK],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _scrape(url: str) -> str:
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_case_a14_every_local_rank_serves_its_own_port(repo_root):
    """Case A14: four local ranks on one base port each announce a distinct URL, base +
    LOCAL_RANK, that serves their own target_info and loss."""
    base = free_port_run(4)
    ranks = [_start(rank, base, repo_root) for rank in range(4)]
    try:
        urls = []
        for child in ranks:
            line = child.stdout.readline()
            match = re.search(r"Prometheus (http://\S+/metrics)", line)
            assert match, line + child.stderr.read()
            urls.append(match.group(1))
        assert urls == [f"http://127.0.0.1:{base + r}/metrics" for r in range(4)]
        for rank, url in enumerate(urls):
            text = _scrape(url)
            assert re.search(rf'target_info\{{[^}}]*dl_rank="{rank}"', text), text[:2000]
            (loss,) = re.findall(r"^megatron_training_loss(?:\{[^}]*\})? (\S+)$", text, re.M)
            assert float(loss) == 2.0 + rank
    finally:
        for child in ranks:
            child.stdin.close()
            child.wait(timeout=30)


def test_a_rank_that_cannot_serve_says_so_on_stderr(repo_root):
    """A rank whose port is taken names the port and the variable on stderr and carries on."""
    base = free_port_run(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        child = _start(1, base, repo_root)
        try:
            line = child.stdout.readline()
        finally:
            child.stdin.close()
            child.wait(timeout=30)
        stderr = child.stderr.read()
    assert child.returncode == 0, stderr
    assert "metrics to nowhere" in line
    assert f"127.0.0.1:{base + 1}" in stderr and "OTEL_EXPORTER_PROMETHEUS_PORT" in stderr
