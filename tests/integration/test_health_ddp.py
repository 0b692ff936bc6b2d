"""A hang and a straggler under real DistributedDataParallel (2 gloo ranks), named from the
embedded files alone. DDP runs its all-reduce inside ``loss.backward()``: no rank is ever in a
``grad_sync`` phase. Rank 1 computes 50 % longer, then gets stuck at step 200:

- in its data loading, plain DDP: rank 0 waits in forward_backward, rank 1 in data_loading at
  the same iteration: culprit rank 1 by ``behind_in_step``; no straggler can be seen (rank 0
  waits inside backward as long as rank 1 works longer), and the health notes say so;
- in its forward pass, plain DDP: both ranks are in forward_backward at the same iteration,
  and only the watchdogs' stacks tell them apart: rank 0's stands in autograd's backward
  (DDP's all-reduce), rank 1's does not: culprit rank 1 by ``outside_collective``;
- in its forward pass, with ``otel_training.integrations.ddp.register_comm_hook``: rank 0 waits
  in ``communication`` (from the last bucket's all-reduce on), so rank 1 is the culprit by
  ``outside_communication``, and the straggler's cause is ``compute``.

About 30 s each on a loaded 2-core machine."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from doc_rules import documents
from otlp_receiver import free_port
from support import child_env, gloo_or_unavailable

JOB = textwrap.dedent(
    """
    import os, time
    import torch
    import torch.distributed as dist
    import otel_training as ot
    from otel_training.integrations.ddp import register_comm_hook

    ot.configure()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    if os.environ["HOOK"] == "1":
        register_comm_hook(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(8, 16)

    def stuck(step, where):
        if rank == 1 and step == 200 and os.environ["WHERE"] == where:
            print("stuck", flush=True)
            time.sleep(3600)

    for step in range(1, 100_000):
        with ot.training_iteration(iteration=step):
            with ot.data_loading(iteration=step):
                time.sleep(0.005)
                stuck(step, "data")
            with ot.forward_backward(iteration=step):
                time.sleep(0.03 if rank == 1 else 0.02)   # rank 1: compute +50 %
                stuck(step, "forward")
                model(inputs).square().mean().backward()
            with ot.optimizer_step(iteration=step):
                optimizer.step()
                optimizer.zero_grad()
                time.sleep(0.002)
    """
)


def _health(env: dict[str, str], directory: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "health", "--json", directory],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@documents("health.md", "so the ranks wait in `forward_backward` for the one still loading")
@documents("health.md", "Under DistributedDataParallel the all-reduce runs inside `loss.backward")
@documents("health.md", "Busy time is then work alone (stragglers and their causes are seen)")
@documents("health.md", "Without the hook, `behind_in_step` still names a rank stuck in data")
@documents("health.md", "`outside_communication`: while at least half of the ranks are in")
@documents("health.md", "`outside_collective`: when the watchdogs' stacks of the stall show")
@documents("health.md", "It names a rank stuck in its forward pass under plain DDP, whose phase")
@documents("health.md", "and `outside_collective` one stuck in its forward pass (from")
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("hook", "where", "rule", "waiting", "cause"),
    [
        ("0", "data", "behind_in_step", "forward_backward", None),
        ("0", "forward", "outside_collective", "forward_backward", None),
        ("1", "forward", "outside_communication", "communication", "compute"),
    ],
)
def test_a_ddp_hang_has_its_culprit_and_the_straggler_its_cause(
    tmp_path, hook, where, rule, waiting, cause
):
    """Rank 1 stuck at step 200 (data loading or its forward pass, plain DDP; or its forward
    pass, with the comm hook): hung, culprit rank 1 by the rule of its case, rank 0 waiting
    where the case says; with the hook, rank 1 the straggler with cause compute; without, none
    and a note why."""
    gloo_or_unavailable()
    env = child_env(
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path),
        OTEL_PYTHON_TRAINING_RUN_ID="ddp-job",
        OTEL_METRIC_EXPORT_INTERVAL="500",
        OTEL_PYTHON_TRAINING_HANG_FLOOR_S="1",
        OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM="false",
        HOOK=hook,
        WHERE=where,
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
        deadline = time.monotonic() + 60
        found = _health(env, str(tmp_path))
        while time.monotonic() < deadline and (found["hang"] or {}).get("rule") != rule:
            time.sleep(1.0)
            found = _health(env, str(tmp_path))
        hang = found["hang"]
        assert hang is not None, found
        assert (hang["rule"], hang["culprits"]) == (rule, [1]), hang
        assert hang["stalled_ranks"] == [0, 1]
        assert hang["phases"]["0"] == waiting
        stragglers = [(s["rank"], s["cause"]) for s in found["stragglers"]]
        assert stragglers == ([(1, cause)] if cause else []), found["stragglers"]
        hidden = [n for n in found["notes"] if "waiting cannot be told from working" in n]
        assert bool(hidden) == (cause is None), found["notes"]
    finally:
        for process in ranks:
            process.kill()
            process.wait(30)
            process.stdout.close()
