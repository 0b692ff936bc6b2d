"""A hang and a straggler named from the embedded files alone: 2 real gloo ranks, rank 1
computing 50 % longer, then stuck at step 300 while rank 0 waits in the all_reduce, either
inside its forward/backward (a sleep: its watchdog writes its stack) or stopped by SIGSTOP (it
goes silent); ``otel-training health --json``, run while the job hangs, names rank 1 as the
straggler (cause compute) and as the hang's culprit. About 30 s each on a loaded 2-core
machine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from doc_rules import documents
from otlp_receiver import free_port
from support import child_env, gloo_or_unavailable

from otel_training.health import goodput
from otel_training.report import find_run_directory, load_job
from otel_training.report.health import evidence

JOB = textwrap.dedent(
    """
    import os, time
    import torch
    import torch.distributed as dist
    import otel_training as ot

    ot.configure()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    grad = torch.ones(16)

    def compute(step):
        time.sleep(0.03 if rank == 1 else 0.02)   # rank 1: compute +50 %
        if rank == 1 and step == 300:
            print("stuck", flush=True)
            if os.environ["HOW"] == "sleep":
                time.sleep(3600)                    # never reaches the collective

    for step in range(1, 100_000):
        with ot.training_iteration(iteration=step):
            with ot.data_loading(iteration=step):
                time.sleep(0.005)
            with ot.forward_backward(iteration=step):
                compute(step)
                with ot.grad_sync("finish"):
                    dist.all_reduce(grad)
            with ot.optimizer_step(iteration=step):
                time.sleep(0.002)
    """
)


@documents("health.md", "Busy time can")
@documents("health.md", "A synchronous collective makes every rank's *wall* step time equal")
@documents("health.md", "A rank that holds the GIL or is stopped cannot: it is the silent culprit")
@documents("health.md", "Every stalled rank writes its stacks")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["sleep", "sigstop"])
def test_health_names_the_straggler_and_the_hang_culprit_from_the_files(tmp_path, how):
    """Straggler rank 1 (compute); hung, culprit rank 1: outside the collective with its stack
    (sleep), or silent (SIGSTOP) while rank 0's stack shows it waiting in the all_reduce."""
    gloo_or_unavailable()
    port = free_port()
    env = child_env(
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path),
        OTEL_PYTHON_TRAINING_RUN_ID="stuck-job",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        OTEL_PYTHON_TRAINING_HANG_FLOOR_S="1",
        OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM="false",
        HOW=how,
    )
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", JOB],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        assert ranks[1].stdout.readline().strip() == "stuck"
        if how == "sigstop":
            ranks[1].send_signal(signal.SIGSTOP)
        expected = {"0", "1"} if how == "sleep" else {"0"}
        deadline = time.monotonic() + 60
        found = None
        while time.monotonic() < deadline:  # both ranks stalled past H and wrote their stacks
            time.sleep(1.0)
            result = subprocess.run(
                [sys.executable, "-m", "otel_training.cli", "health", "--json", str(tmp_path)],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            found = json.loads(result.stdout)
            hang = found["hang"]
            # SIGSTOP: outside the collective at first, silent once 2 exports are missed
            wanted = "outside_communication" if how == "sleep" else "silent"
            if hang is not None and set(hang["stacks"]) == expected and hang["rule"] == wanted:
                break
        assert found is not None
        hang = found["hang"]
        assert hang is not None, found
        assert hang["culprits"] == [1] and hang["stalled_ranks"] == [0, 1]
        assert hang["since_s"] > 1.0 and hang["phases"]["0"] == "communication"
        waiting_stack = hang["stacks"]["0"][0]["threads"][0]["stack"]
        assert "all_reduce" in waiting_stack
        if how == "sleep":
            assert hang["rule"] == "outside_communication"
            assert hang["phases"]["1"] == "forward_backward"
            culprit_stack = hang["stacks"]["1"][0]["threads"][0]
            assert culprit_stack["training"] and "in compute" in culprit_stack["stack"]
        else:
            assert hang["rule"] == "silent" and hang["silent_ranks"] == [1]
        (attempt,) = found["attempts"]
        assert attempt["ended"] == "hung"
        stragglers = [(s["rank"], s["cause"]) for s in found["stragglers"]]
        assert stragglers == [(1, "compute")], found["stragglers"]
        assert found["stragglers"][0]["score"] > 1.2
        # the wall step is the same on both ranks (rank 0 waits in the all_reduce): only busy
        # time tells the straggler
        job = evidence(load_job(find_run_directory(tmp_path), purpose="health"))
        wall = {p.rank: goodput.median_step_s(p) for p in job.processes}
        assert 0.9 < wall[1] / wall[0] < 1.1, wall
    finally:
        for process in ranks:
            process.kill()  # SIGKILL ends a stopped process too
            process.wait(30)
            process.stdout.close()
