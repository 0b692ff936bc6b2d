"""Where this process sits in the training job: rank, node, job, run and attempt, from launchers.

Read from the variables torchrun, SLURM and Kubernetes set (see :class:`RankIdentity`), by
:mod:`otel_training.config` (the only reader of the environment) through an
:class:`otel_training.config._env.EnvReader`.

**The attempt** (``dl.run.attempt``, :func:`read_attempt`) numbers the incarnations of one job:
a torchrun restart of the workers, a SLURM requeue, an NVRx restart cycle.

**The run id** (``dl.run.id``) names one incarnation of the job, shared by every rank of it
without any communication: the first of these rules, then ``-a{attempt}`` when the attempt is
known (so a restart or a requeue never writes into the previous attempt's run directory, and
its trace segments get ids of their own):

1. ``OTEL_PYTHON_TRAINING_RUN_ID``, else Megatron-LM's ``MEGATRON_OTEL_RUN_ID``, else NeMo
   Lens' ``NEMO_LENS_RUN_ID``;
2. torchrun's rendezvous id (``TORCHELASTIC_RUN_ID``, set by ``--rdzv-id`` or
   ``--standalone``);
3. the SLURM job and step (``slurm-{job}.{SLURM_STEP_ID}``, the job written
   ``{SLURM_ARRAY_JOB_ID}_{SLURM_ARRAY_TASK_ID}`` in a job array);
4. under torchrun without a rendezvous id (``TORCHELASTIC_RUN_ID=none``, its default):
   derived from the torchrun agent, the parent of every worker of a node, as
   ``{agent start time as YYYYmmdd-HHMMSS}-{hash of host, agent pid and start}``, so all
   ranks of a node agree (ranks on other nodes do not: give multi-node jobs a ``--rdzv-id``);
5. otherwise one id per process, ``{start time as YYYYmmdd-HHMMSS}-{6 random hex digits}``,
   kept by forked children and by a second ``configure()``.

**The job id** (``dl.job.id``) is the same for every attempt: the SLURM job (array element:
``{SLURM_ARRAY_JOB_ID}_{SLURM_ARRAY_TASK_ID}``, as ``squeue`` writes it), else torchrun's
rendezvous id, else the torchrun agent's id of rule 4, else the run id given by rule 1; absent
for a lone process without any of these.

**The process** (:func:`process_tag`): eight hex digits from the host, the process id and the
process's start time, so that ``service.instance.id`` (``{run id}-rank{R}-{tag}``) is never
shared by two processes, even two given the same run id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import secrets
import socket
import time
from dataclasses import dataclass

from otel_training import clock
from otel_training.config import variables as ev
from otel_training.config._env import EnvReader

__all__ = ["RankIdentity", "attempt_run_id", "process_tag", "read_attempt", "read_identity"]


@dataclass(frozen=True)
class RankIdentity:
    """Where this process sits in the training job, from launcher variables.

    Sources, first match wins: torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_RUN_ID``), SLURM (``SLURM_PROCID``,
    ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``, ``SLURM_JOB_ID``,
    ``SLURM_ARRAY_JOB_ID``, ``SLURM_ARRAY_TASK_ID``), Kubernetes (``JOB_COMPLETION_INDEX`` or
    ``PET_NODE_RANK`` for the node rank, ``HOSTNAME`` for the pod). A single process without a
    launcher is rank 0 of 1. ``run_id`` is never empty and already carries the attempt (see
    the module docstring for how both ids are chosen).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    launcher: str = "none"
    job_id: str | None = None
    run_id: str | None = None
    k8s_pod_name: str | None = None
    k8s_namespace: str | None = None
    #: Which attempt of the job this process belongs to (:func:`read_attempt`), or ``None``.
    attempt: int | None = None


def read_attempt(env: EnvReader) -> int | None:
    """The attempt number of this process, the same on every rank of one attempt; ``None`` when
    no launcher counts restarts.

    The first that is set: ``OTEL_PYTHON_TRAINING_RUN_ATTEMPT``; NVRx's ``NVRX_CYCLE``;
    torchrun's ``TORCHELASTIC_RESTART_COUNT`` and SLURM's ``SLURM_RESTART_COUNT`` (either
    alone is the attempt; with both, ``SLURM_RESTART_COUNT * (TORCHELASTIC_MAX_RESTARTS + 1) +
    TORCHELASTIC_RESTART_COUNT``, so that every requeue starts a block of numbers of its own
    and the attempts stay distinct and in order: a sum would give the torchrun restart of the
    first allocation and the first requeue the same number; without
    ``TORCHELASTIC_MAX_RESTARTS``, the sum). A value that is not a whole number >= 0 logs one
    warning and is not used. Never raises.

    torchrun counts restarts per node: its agents agree when every node's workers failed and
    restarted together (the usual case, a collective fails everywhere); NVRx keeps one count
    for the whole job.
    """
    for name in (ev.OTEL_PYTHON_TRAINING_RUN_ATTEMPT, ev.NVRX_CYCLE):
        if env.raw(name) is not None:
            value = env.non_negative_int(name)
            if value is not None:
                return value
    restarts = env.non_negative_int(ev.TORCHELASTIC_RESTART_COUNT)
    requeues = env.non_negative_int(ev.SLURM_RESTART_COUNT)
    if requeues is None:
        return restarts
    if restarts is None:
        return requeues
    most = env.non_negative_int(ev.TORCHELASTIC_MAX_RESTARTS)
    if most is None or restarts > most:
        return requeues + restarts
    return requeues * (most + 1) + restarts


def attempt_run_id(run_id: str, attempt: int | None) -> str:
    """The run id of attempt ``attempt`` of the run ``run_id``: ``{run_id}-a{attempt}``, or
    ``run_id`` itself when no attempt is known."""
    return run_id if attempt is None else f"{run_id}-a{attempt}"


def read_identity(env: EnvReader) -> RankIdentity:
    """The identity the variables of ``env`` describe. Never raises."""
    identity = _read_identity(env)
    attempt = read_attempt(env)
    if attempt is None:
        return identity
    return dataclasses.replace(
        identity, attempt=attempt, run_id=attempt_run_id(identity.run_id or "run", attempt)
    )


def _slurm_job(env: EnvReader) -> str | None:
    """The SLURM job, stable across requeues: ``SLURM_JOB_ID``, or in a job array
    ``{SLURM_ARRAY_JOB_ID}_{SLURM_ARRAY_TASK_ID}`` (the element, as ``squeue`` names it)."""
    job = env.raw("SLURM_JOB_ID")
    array_job, task = env.raw("SLURM_ARRAY_JOB_ID"), env.raw("SLURM_ARRAY_TASK_ID")
    if array_job is not None and task is not None:
        return f"{array_job}_{task}"
    return job


def _read_identity(env: EnvReader) -> RankIdentity:
    given_run = env.first(
        ev.OTEL_PYTHON_TRAINING_RUN_ID, ev.MEGATRON_OTEL_RUN_ID, ev.NEMO_LENS_RUN_ID
    )[1]
    k8s = env.raw("KUBERNETES_SERVICE_HOST") is not None
    k8s_fields = {
        "k8s_pod_name": env.raw("HOSTNAME") if k8s else None,
        "k8s_namespace": env.raw("POD_NAMESPACE") if k8s else None,
    }
    slurm_job = _slurm_job(env) if env.raw("SLURM_JOB_ID") is not None else None
    slurm_run = None
    if slurm_job is not None:
        step = env.raw("SLURM_STEP_ID")
        slurm_run = f"slurm-{slurm_job}" + (f".{step}" if step is not None else "")
    node_from_k8s = env.non_negative_int("JOB_COMPLETION_INDEX") if k8s else None
    if node_from_k8s is None and k8s:
        node_from_k8s = env.non_negative_int("PET_NODE_RANK")

    rank = env.non_negative_int("RANK")
    world_size = env.non_negative_int("WORLD_SIZE")
    if rank is not None and world_size:
        elastic_raw = env.raw("TORCHELASTIC_RUN_ID")
        elastic_run = elastic_raw if elastic_raw and elastic_raw.lower() != "none" else None
        agent_run = _agent_run_id() if elastic_raw is not None and elastic_run is None else None
        local_rank = env.non_negative_int("LOCAL_RANK")
        node_rank = env.non_negative_int("GROUP_RANK")
        if node_rank is None:
            node_rank = env.non_negative_int("NODE_RANK")
        if node_rank is None:
            node_rank = node_from_k8s
        if node_rank is None and slurm_job is not None:
            node_rank = env.non_negative_int("SLURM_NODEID")
        launcher = "torchrun" if elastic_raw else "env"
        if k8s and launcher == "env":
            launcher = "kubernetes"
        return RankIdentity(
            rank=rank,
            local_rank=local_rank if local_rank is not None else 0,
            world_size=world_size,
            local_world_size=env.non_negative_int("LOCAL_WORLD_SIZE") or 1,
            node_rank=node_rank or 0,
            launcher=launcher,
            job_id=slurm_job or elastic_run or agent_run or given_run,
            run_id=given_run or elastic_run or slurm_run or agent_run or process_run_id(),
            **k8s_fields,
        )

    slurm_rank = env.non_negative_int("SLURM_PROCID")
    slurm_world = env.non_negative_int("SLURM_NTASKS")
    if slurm_job is not None and slurm_rank is not None and slurm_world:
        per_node = env.raw("SLURM_NTASKS_PER_NODE")
        local_world = int(per_node) if per_node is not None and per_node.isdigit() else None
        return RankIdentity(
            rank=slurm_rank,
            local_rank=env.non_negative_int("SLURM_LOCALID") or 0,
            world_size=slurm_world,
            local_world_size=local_world or 1,
            node_rank=env.non_negative_int("SLURM_NODEID") or 0,
            launcher="slurm",
            job_id=slurm_job,
            run_id=given_run or slurm_run or process_run_id(),
            **k8s_fields,
        )
    return RankIdentity(
        node_rank=node_from_k8s or 0,
        launcher="kubernetes" if k8s else "none",
        job_id=slurm_job or given_run,
        run_id=given_run or slurm_run or process_run_id(),
        **k8s_fields,
    )


_process_run_id: str | None = None


def process_run_id() -> str:
    """This process's own run id (rule 5 of the module docstring), made on first use and
    inherited by forked children."""
    global _process_run_id
    if _process_run_id is None:
        _process_run_id = f"{_stamp(time.time())}-{secrets.token_hex(3)}"
    return _process_run_id


_process_tag: tuple[int, str] | None = None


def process_tag() -> str:
    """Eight hex digits that tell this process from every other: a hash of the host name,
    the process id and the process's start time
    (:func:`otel_training.clock.process_creation_unix_s`), computed once per process (a forked
    child gets its own)."""
    global _process_tag
    pid = os.getpid()
    if _process_tag is None or _process_tag[0] != pid:
        created = clock.process_creation_unix_s()
        text = f"{socket.gethostname()}:{pid}:{created:.6f}"
        _process_tag = (pid, hashlib.sha256(text.encode()).hexdigest()[:8])
    return _process_tag[1]


def _stamp(seconds: float) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(seconds))


def _agent_run_id() -> str | None:
    """Rule 4: an id from the parent process (the torchrun agent) that every worker of the
    node computes alike; ``None`` where ``/proc`` does not tell the parent's start."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of proc(5), after pid and comm
        with open("/proc/stat", "rb") as stat:
            boot = next(int(line.split()[1]) for line in stat if line.startswith(b"btime"))
        started = boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    digest = hashlib.sha256(f"{socket.gethostname()}:{parent}:{start_ticks}".encode()).hexdigest()
    return f"{_stamp(started)}-{digest[:6]}"
