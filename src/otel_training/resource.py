"""The training-job resource: who this process is within the job (rank identity).

Rank identity lives in the Resource, never in point attributes (DESIGN.md section 3.5).
Attribute names are declared in ``semconv/``; ``dl.rank``, ``dl.local_rank`` and
``dl.world_size`` are the names NVIDIA NeMo Lens uses, so its dashboards keep working.
"""

from __future__ import annotations

import socket
from datetime import datetime, timezone

from opentelemetry.sdk.resources import Resource, ResourceDetector
from opentelemetry.semconv._incubating.attributes.host_attributes import HOST_NAME
from opentelemetry.semconv._incubating.attributes.process_attributes import (
    PROCESS_CREATION_TIME,
)
from opentelemetry.semconv.attributes.k8s_attributes import K8S_NAMESPACE_NAME, K8S_POD_NAME
from opentelemetry.semconv.attributes.service_attributes import SERVICE_INSTANCE_ID

from otel_training import clock, config
from otel_training.identity import process_run_id, process_tag
from otel_training.semconv.attributes import (
    DL_JOB_ID,
    DL_LOCAL_RANK,
    DL_NODE_RANK,
    DL_RANK,
    DL_RUN_ATTEMPT,
    DL_RUN_ID,
    DL_WORLD_SIZE,
)


def identity_attributes(identity: config.RankIdentity) -> dict[str, str | int]:
    """Resource attributes for ``identity``: rank, local rank, world size, node rank, host,
    job and run ids, the attempt (when known), ``process.creation.time`` (ISO 8601, UTC, ms),
    ``service.instance.id`` (``{run_id}-rank{rank}-{process tag}``: never shared by two
    processes, :func:`otel_training.identity.process_tag`) and, in Kubernetes, the pod name
    and namespace. Never raises."""
    run_id = identity.run_id or process_run_id()
    attributes: dict[str, str | int] = {
        DL_RANK: identity.rank,
        DL_LOCAL_RANK: identity.local_rank,
        DL_WORLD_SIZE: identity.world_size,
        DL_NODE_RANK: identity.node_rank,
        DL_RUN_ID: run_id,
        HOST_NAME: socket.gethostname(),
        SERVICE_INSTANCE_ID: f"{run_id}-rank{identity.rank}-{process_tag()}",
        PROCESS_CREATION_TIME: iso8601(clock.process_creation_unix_s()),
    }
    if identity.attempt is not None:
        attributes[DL_RUN_ATTEMPT] = identity.attempt
    if identity.job_id is not None:
        attributes[DL_JOB_ID] = identity.job_id
    if identity.k8s_pod_name is not None:
        attributes[K8S_POD_NAME] = identity.k8s_pod_name
    if identity.k8s_namespace is not None:
        attributes[K8S_NAMESPACE_NAME] = identity.k8s_namespace
    return attributes


def iso8601(unix_s: float) -> str:
    """``unix_s`` as OpenTelemetry's semantic conventions write a time: ISO 8601, UTC, with
    milliseconds (``2026-12-01T20:30:00.123Z``)."""
    moment = datetime.fromtimestamp(unix_s, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class TrainingResourceDetector(ResourceDetector):
    """Detects the rank identity from torchrun, SLURM and Kubernetes variables.

    See :class:`otel_training.config.RankIdentity` for the variables read. Usable on its own
    with ``opentelemetry.sdk.resources.get_aggregated_resources([TrainingResourceDetector()])``.
    Never raises.
    """

    def detect(self) -> Resource:
        return Resource(identity_attributes(config.load_identity()))
