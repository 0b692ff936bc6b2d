"""Which job, which attempt and which process a resource belongs to, read by otel-training's
names and by Megatron-LM's.

otel-training writes ``dl.job.id`` (the job, the same in every attempt), ``dl.run.id`` (one
attempt), ``dl.run.attempt``, ``service.instance.id`` (one process) and
``process.creation.time`` (when the process started, ISO 8601). Megatron-LM
(``megatron/training/global_vars.py``, ``build_telemetry_resource_attrs``) writes the same facts
as ``nemo.lens.job_uuid``, ``nemo.lens.run_uuid`` (one incarnation), ``nemo.run.id``,
``slurm.job.id``, ``slurm.array.job_id`` / ``slurm.array.task_id``, ``slurm.restart_count``,
``slurm.torchelastic.restart_count`` and ``nvrx.cycle``; each is read where ours is absent.

Attempts are ordered by their attempt number (ours, else NVRx's cycle, else SLURM's requeue count
then torchrun's restart count), else by the earliest ``process.creation.time`` of their ranks.
Nothing here raises.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ProcessIdentity", "creation_unix_s", "identity_of", "job_key", "job_of"]

# Megatron-LM's and NeMo Lens' resource attribute names (read only, never written by us).
NEMO_LENS_JOB_UUID = "nemo.lens.job_uuid"
NEMO_LENS_RUN_UUID = "nemo.lens.run_uuid"
NEMO_RUN_ID = "nemo.run.id"
SLURM_JOB_ID = "slurm.job.id"
SLURM_ARRAY_JOB_ID = "slurm.array.job_id"
SLURM_ARRAY_TASK_ID = "slurm.array.task_id"
SLURM_RESTART_COUNT = "slurm.restart_count"
SLURM_TORCHELASTIC_RESTART_COUNT = "slurm.torchelastic.restart_count"
NVRX_CYCLE = "nvrx.cycle"
# What otel_training.config.identity.attempt_run_id appends to the run id of an attempt.
_ATTEMPT_SUFFIX = re.compile(r"-a\d+$")


@dataclass(frozen=True)
class ProcessIdentity:
    """Where one process's records belong.

    Attributes:
        job_id: The job, the same in every attempt (``None``: not recorded).
        run_id: The attempt's run id (``None``: not recorded).
        attempt: The attempt number when one number says it (``dl.run.attempt``,
            ``nvrx.cycle``, or one of SLURM's and torchrun's counts), else ``None``.
        order: The key attempts sort by when the counters are known: ``(attempt,)``, or
            Megatron-LM's ``(slurm.restart_count, slurm.torchelastic.restart_count)``;
            ``None`` when no counter was recorded.
        instance: ``service.instance.id``, one per process (``None``: not recorded).
        created_s: ``process.creation.time`` in Unix seconds (``None``: not recorded).
    """

    job_id: str | None = None
    run_id: str | None = None
    attempt: int | None = None
    order: tuple[int, ...] | None = None
    instance: str | None = None
    created_s: float | None = None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()
    return text or None


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def creation_unix_s(value: Any) -> float | None:
    """``process.creation.time`` (ISO 8601, as OpenTelemetry's semantic conventions write it,
    :func:`otel_training.pipeline.resource.iso8601`) in Unix seconds; ``None`` when absent or not a
    time (a time without a zone is UTC)."""
    text = _text(value)
    if text is None:
        return None
    try:
        moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    return moment.timestamp()


def identity_of(resource: Mapping[str, Any]) -> ProcessIdentity:
    """The :class:`ProcessIdentity` of ``resource`` (resource attributes as read from a file).
    Never raises."""
    job = _text(resource.get("dl.job.id")) or _text(resource.get(NEMO_LENS_JOB_UUID))
    if job is None:
        array_job = _text(resource.get(SLURM_ARRAY_JOB_ID))
        task = _text(resource.get(SLURM_ARRAY_TASK_ID))
        job = f"{array_job}_{task}" if array_job and task else _text(resource.get(SLURM_JOB_ID))
    run = (
        _text(resource.get("dl.run.id"))
        or _text(resource.get(NEMO_LENS_RUN_UUID))
        or _text(resource.get(NEMO_RUN_ID))
    )
    attempt = _count(resource.get("dl.run.attempt"))
    if attempt is None:
        attempt = _count(resource.get(NVRX_CYCLE))
    order: tuple[int, ...] | None = None if attempt is None else (attempt,)
    if order is None:
        requeues = _count(resource.get(SLURM_RESTART_COUNT))
        restarts = _count(resource.get(SLURM_TORCHELASTIC_RESTART_COUNT))
        if requeues is not None or restarts is not None:
            order = (requeues or 0, restarts or 0)
            if requeues is None or restarts is None:
                attempt = requeues if restarts is None else restarts
    return ProcessIdentity(
        job_id=job,
        run_id=run,
        attempt=attempt,
        order=order,
        instance=_text(resource.get("service.instance.id")),
        created_s=creation_unix_s(resource.get("process.creation.time")),
    )


def job_of(job_id: str | None, run_id: str | None) -> str | None:
    """The job of a process or run, the same in every attempt: its job id, else its run id
    without the ``-a{N}`` that :func:`otel_training.config.identity.attempt_run_id` appends;
    ``None`` when it has neither."""
    if job_id is not None:
        return job_id
    return _ATTEMPT_SUFFIX.sub("", run_id) if run_id else None


def job_key(resource: Mapping[str, Any]) -> str | None:
    """The job ``resource`` belongs to (:func:`job_of` its :func:`identity_of`)."""
    identity = identity_of(resource)
    return job_of(identity.job_id, identity.run_id)
