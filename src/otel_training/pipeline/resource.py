"""The training-job Resource: who this process is within the job (its rank identity), and the
one Resource a pipeline's metrics, spans and logs share, built from the settings in one place and
in one order of precedence.

Rank identity lives in the Resource, never in point attributes (DESIGN.md section 3.5).
Attribute names are declared in ``semconv/``; ``dl.rank``, ``dl.local_rank`` and
``dl.world_size`` are the names NVIDIA NeMo Lens uses, so its dashboards keep working.
:class:`TrainingResourceDetector` gives the identity to any SDK setup (the entry point
``opentelemetry_resource_detector`` ``training``); :func:`build_resource` is what ``configure()``
uses.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from opentelemetry.sdk.resources import (
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
    ResourceDetector,
)
from opentelemetry.sdk.version import __version__ as _SDK_VERSION
from opentelemetry.semconv._incubating.attributes.host_attributes import HOST_NAME
from opentelemetry.semconv._incubating.attributes.process_attributes import (
    PROCESS_CREATION_TIME,
)
from opentelemetry.semconv.attributes.k8s_attributes import K8S_NAMESPACE_NAME, K8S_POD_NAME
from opentelemetry.semconv.attributes.service_attributes import SERVICE_INSTANCE_ID, SERVICE_NAME

from otel_training import clock, config
from otel_training.config.identity import process_run_id, process_tag
from otel_training.export import limits
from otel_training.semconv.attributes import (
    DL_JOB_ID,
    DL_LOCAL_RANK,
    DL_NODE_RANK,
    DL_RANK,
    DL_RUN_ATTEMPT,
    DL_RUN_ID,
    DL_WORLD_SIZE,
)

__all__ = ["TrainingResourceDetector", "build_resource", "identity_attributes", "iso8601"]


def identity_attributes(identity: config.RankIdentity) -> dict[str, str | int]:
    """Resource attributes for ``identity``: rank, local rank, world size, node rank, host,
    job and run ids, the attempt (when known), ``process.creation.time`` (ISO 8601, UTC, ms),
    ``service.instance.id`` (``{run_id}-rank{rank}-{process tag}``: never shared by two
    processes, :func:`otel_training.config.identity.process_tag`) and, in Kubernetes, the pod name
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


def _unknown_service() -> str:
    executable = os.path.basename(sys.executable or "") or "python"
    return f"unknown_service:{executable}"


def build_resource(
    settings: config.Settings, service_name: str | None, extra: Mapping[str, object]
) -> Resource:
    """The resource, built here alone (not by ``Resource.create()``, which would parse
    ``OTEL_RESOURCE_ATTRIBUTES`` from ``os.environ`` a second time).

    Precedence, lowest first: the SDK's attributes, the detected rank identity,
    ``service_name``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``, then the
    attributes passed in code. A ``service.instance.id`` given for a whole job or pod gets
    ``-rank{R}`` appended when the job has several ranks, so ranks stay distinct series.
    Every value follows the string rule of :mod:`otel_training.export.limits`.
    """
    attributes: dict[str, Any] = {
        TELEMETRY_SDK_LANGUAGE: "python",
        TELEMETRY_SDK_NAME: "opentelemetry",
        TELEMETRY_SDK_VERSION: _SDK_VERSION,
        SERVICE_NAME: _unknown_service(),
    }
    identity = settings.identity
    attributes.update(identity_attributes(identity))
    detected_instance = attributes[SERVICE_INSTANCE_ID]
    if service_name:
        attributes[SERVICE_NAME] = service_name
    attributes.update(settings.resource_attributes)
    if settings.service_name:
        attributes[SERVICE_NAME] = settings.service_name
    attributes.update(extra)
    instance = attributes.get(SERVICE_INSTANCE_ID)
    suffix = f"-rank{identity.rank}"
    if (
        identity.world_size > 1
        and instance != detected_instance
        and not str(instance).endswith(suffix)
    ):
        attributes[SERVICE_INSTANCE_ID] = f"{instance}{suffix}"
    limit = settings.span_limits.value_length
    return Resource(
        {
            limits.safe_text(key, limits.MAX_NAME_LENGTH): limits.bounded_value(value, limit)
            for key, value in attributes.items()
            if value is not None
        }
    )
