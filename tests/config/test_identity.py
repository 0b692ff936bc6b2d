"""Identity of a process within its job: one run id per attempt, one job id for all attempts, a
service.instance.id no two processes share, and trace-segment ids every rank of an attempt
agrees on without communication."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from doc_rules import documents
from hypothesis import given
from hypothesis import strategies as st
from support import child_env

from otel_training import config
from otel_training.config.identity import attempt_run_id
from otel_training.pipeline.resource import identity_attributes
from otel_training.trace.segments import derived_ids

TORCHRUN = {"WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "rdzv-7", "TORCHELASTIC_MAX_RESTARTS": "3"}


def _identity(rank: int, **environ: str) -> config.RankIdentity:
    return config.load_identity({"RANK": str(rank), "LOCAL_RANK": str(rank), **environ})


@documents("spans.md", "`dl.job.id` is the same for every attempt")
@documents("spans.md", "followed by `-a{attempt}` when the attempt (`dl.run.attempt`) is known")
@documents(
    "spans.md", "The run id names one attempt of a job, so a torchrun restart or a SLURM requeue"
)
def test_each_attempt_has_its_own_run_id_and_the_job_id_stays():
    """A torchrun restart appends -a{attempt} to the run id; dl.job.id is the same for all."""
    first = _identity(0, **TORCHRUN, TORCHELASTIC_RESTART_COUNT="0")
    second = _identity(0, **TORCHRUN, TORCHELASTIC_RESTART_COUNT="1")
    assert (first.run_id, second.run_id) == ("rdzv-7-a0", "rdzv-7-a1")
    assert first.job_id == second.job_id == "rdzv-7"
    assert (first.attempt, second.attempt) == (0, 1)


@documents("spans.md", "followed by `-a{attempt}` when the attempt (`dl.run.attempt`) is known")
def test_without_an_attempt_the_run_id_is_as_before():
    """No restart counter at all: the run id has no -a suffix and no attempt is recorded."""
    identity = _identity(2, WORLD_SIZE="4", TORCHELASTIC_RUN_ID="rdzv-7")
    assert identity.run_id == "rdzv-7" and identity.attempt is None
    assert "dl.run.attempt" not in identity_attributes(identity)


def test_a_given_run_id_gets_the_attempt_and_names_the_job():
    """OTEL_PYTHON_TRAINING_RUN_ID=exp with SLURM_RESTART_COUNT=2 and no launcher job: run
    exp-a2 of job exp."""
    identity = config.load_identity(
        {"OTEL_PYTHON_TRAINING_RUN_ID": "exp", "SLURM_RESTART_COUNT": "2"}
    )
    assert (identity.job_id, identity.run_id, identity.attempt) == ("exp", "exp-a2", 2)


@documents("spans.md", "(in a job array the job is `{SLURM_ARRAY_JOB_ID}_{SLURM_ARRAY_TASK_ID}`)")
def test_slurm_requeue_and_job_arrays():
    """A requeued SLURM job keeps its job id; an array element's job is {array}_{task}."""
    slurm = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    requeued = config.load_identity({**slurm, "SLURM_RESTART_COUNT": "1"})
    assert (requeued.job_id, requeued.run_id) == ("1234", "slurm-1234.0-a1")
    element = config.load_identity(
        {**slurm, "SLURM_ARRAY_JOB_ID": "1200", "SLURM_ARRAY_TASK_ID": "34"}
        | {"SLURM_RESTART_COUNT": "0"}
    )
    assert (element.job_id, element.run_id) == ("1200_34", "slurm-1200_34.0-a0")


@documents("spans.md", "each requeue a block of numbers, so attempts stay distinct and in order")
def test_a_torchrun_restart_and_a_requeue_never_share_an_attempt():
    """torchrun's second attempt of the first allocation and the first attempt after a requeue
    are distinct: the sum of the counts (1 and 1) would have merged them."""
    restarted = _identity(0, **TORCHRUN, TORCHELASTIC_RESTART_COUNT="1", SLURM_RESTART_COUNT="0")
    requeued = _identity(0, **TORCHRUN, TORCHELASTIC_RESTART_COUNT="0", SLURM_RESTART_COUNT="1")
    assert restarted.attempt is not None and requeued.attempt is not None
    assert restarted.attempt < requeued.attempt
    assert restarted.run_id != requeued.run_id


@documents("spans.md", "each requeue a block of numbers, so attempts stay distinct and in order")
@given(
    most=st.integers(0, 20),
    first=st.tuples(st.integers(0, 50), st.integers(0, 20)),
    second=st.tuples(st.integers(0, 50), st.integers(0, 20)),
)
def test_attempts_order_as_requeues_then_restarts(most, first, second):
    """For any (requeues, restarts) pairs within --max-restarts, the attempt numbers are
    distinct for distinct pairs and ordered as the pairs are (requeue first)."""
    pairs = [(r, min(t, most)) for r, t in (first, second)]

    def attempt(pair: tuple[int, int]) -> int | None:
        environ = {
            "SLURM_RESTART_COUNT": str(pair[0]),
            "TORCHELASTIC_RESTART_COUNT": str(pair[1]),
            "TORCHELASTIC_MAX_RESTARTS": str(most),
        }
        return config.load_identity(environ).attempt

    a, b = attempt(pairs[0]), attempt(pairs[1])
    assert a is not None and b is not None
    assert (a < b) == (pairs[0] < pairs[1]) and (a == b) == (pairs[0] == pairs[1])


@documents(
    "spans.md", "Every rank of an attempt computes the same run id, hence the same trace ids"
)
@documents(
    "spans.md", "The run id names one attempt of a job, so a torchrun restart or a SLURM requeue"
)
def test_every_rank_of_an_attempt_derives_the_same_trace_ids():
    """Ranks 0..3 of one attempt compute one run id, so one set of trace-segment ids; the next
    attempt's ids differ (its traces do not merge into the previous attempt's)."""
    for count in ("0", "1"):
        ids = {
            derived_ids(_identity(r, **TORCHRUN, TORCHELASTIC_RESTART_COUNT=count).run_id, "0")
            for r in range(4)
        }
        assert len(ids) == 1
    assert derived_ids(attempt_run_id("rdzv-7", 0), "0") != derived_ids(
        attempt_run_id("rdzv-7", 1), "0"
    )


_INSTANCE = (
    "import json; from otel_training import config; "
    "from otel_training.pipeline.resource import identity_attributes; "
    "a = identity_attributes(config.load_identity()); "
    "print(json.dumps([a['service.instance.id'], a['dl.run.id'], a['process.creation.time']]))"
)


@pytest.mark.slow
@documents("spans.md", "`service.instance.id` is `{run id}-rank{R}-{8 hex digits}`")
def test_two_processes_given_the_same_run_id_have_different_instance_ids():
    """Two real processes with the same run id and rank (a rerun, a copied launch script)
    share dl.run.id but never service.instance.id."""
    env = child_env(
        drop=("TORCHELASTIC",), OTEL_PYTHON_TRAINING_RUN_ID="same", RANK="0", WORLD_SIZE="2"
    )
    seen = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _INSTANCE], env=env, capture_output=True, text=True,
                check=True, timeout=60,
            ).stdout
        )
        for _ in range(2)
    ]  # fmt: skip
    assert seen[0][1] == seen[1][1] == "same"
    assert seen[0][0] != seen[1][0]
    assert all(instance.startswith("same-rank0-") for instance, _, _ in seen)


@documents(
    "spans.md", "`dl.job.id` is the same for every attempt: the SLURM job (array element as above)"
)
@documents("spans.md", "else an id of the process (its start time and 6 random hex digits)")
@documents("spans.md", "the SLURM job and step, `slurm-{job}.{step}`")
@documents("spans.md", "torchrun's rendezvous id (`TORCHELASTIC_RUN_ID`")
@documents("spans.md", "It is the first of")
def test_the_run_id_is_the_first_rule_that_applies_and_the_job_the_launchers():
    """Ours, else torchrun's rendezvous id, else SLURM's job and step, else one id of the
    process; the job: SLURM's job, else the rendezvous id, else the run id we were given,
    else none."""
    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "rdzv"}
    ours = {"OTEL_PYTHON_TRAINING_RUN_ID": "ours"}
    cases = [
        ({**ours, **torchrun, **slurm}, "ours", "77"),
        ({**torchrun, **slurm}, "rdzv", "77"),
        ({**ours, **torchrun}, "ours", "rdzv"),
        (slurm, "slurm-77.3", "77"),
        (ours, "ours", "ours"),
    ]
    for environ, run_id, job_id in cases:
        identity = config.load_identity(environ)
        assert (identity.run_id, identity.job_id) == (run_id, job_id), environ
    alone = config.load_identity({})
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", alone.run_id) and alone.job_id is None


@documents("spans.md", "Where they may not, set `OTEL_PYTHON_TRAINING_RUN_ATTEMPT` or use NVRx")
def test_the_attempt_we_are_given_wins_over_the_launchers_counts():
    """OTEL_PYTHON_TRAINING_RUN_ATTEMPT=5 under torchrun's and SLURM's counts: attempt 5, run
    id rdzv-7-a5 on every rank whatever each node's torchrun counted."""
    ids = {
        _identity(r, **TORCHRUN, TORCHELASTIC_RESTART_COUNT=str(r % 2), SLURM_RESTART_COUNT="1",
                  OTEL_PYTHON_TRAINING_RUN_ATTEMPT="5").run_id
        for r in range(4)
    }  # fmt: skip
    assert ids == {"rdzv-7-a5"}


_AGENT = """
import json, subprocess, sys
code = "from otel_training import config; i = config.load_identity(); print(i.run_id, i.job_id)"
workers = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
           for _ in range(2)]
print(json.dumps([w.stdout.split() for w in workers]))
"""


@pytest.mark.slow
@documents("spans.md", "else the torchrun agent's id of rule 4")
@documents("spans.md", "under torchrun without a rendezvous id, an id of the torchrun agent")
def test_under_torchrun_without_a_rendezvous_id_the_workers_of_an_agent_agree():
    """TORCHELASTIC_RUN_ID=none (torchrun's default): two workers of one parent (the agent)
    have one run id, {start}-{6 hex digits}, which is also the job; another agent's differ."""
    env = child_env(drop=("TORCHELASTIC", "SLURM"), TORCHELASTIC_RUN_ID="none", RANK="0",
                    WORLD_SIZE="2")  # fmt: skip
    agents = [
        json.loads(
            subprocess.run([sys.executable, "-c", _AGENT], env=env, capture_output=True,
                           text=True, check=True, timeout=120).stdout
        )
        for _ in range(2)
    ]  # fmt: skip
    for workers in agents:
        assert workers[0] == workers[1]
        run_id, job_id = workers[0]
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", run_id) and job_id == run_id
    assert agents[0][0] != agents[1][0]
