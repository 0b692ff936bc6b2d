"""The pipeline's Resource: one set of attributes shared by its metrics, spans and logs, built
from the settings in one place and in one order of precedence.

The rank identity it starts from is :func:`otel_training.resource.identity_attributes`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import (
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
)
from opentelemetry.sdk.version import __version__ as _SDK_VERSION
from opentelemetry.semconv.attributes.service_attributes import SERVICE_INSTANCE_ID, SERVICE_NAME

from otel_training import config, limits
from otel_training.resource import identity_attributes

__all__ = ["build_resource"]


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
    Every value follows the string rule of :mod:`otel_training.limits`.
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
