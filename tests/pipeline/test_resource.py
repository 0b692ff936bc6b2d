"""TrainingResourceDetector: rank identity as resource attributes, usable by any SDK setup."""

from __future__ import annotations

import re
import socket
import time
from datetime import datetime, timezone

import pytest
from doc_rules import documents
from opentelemetry.sdk.resources import get_aggregated_resources
from opentelemetry.util._importlib_metadata import entry_points

from otel_training import clock, config
from otel_training.config.identity import process_tag
from otel_training.pipeline.resource import TrainingResourceDetector, identity_attributes, iso8601


@documents("README.md", "detected from torchrun, SLURM and Kubernetes")
@documents("spans.md", "`service.instance.id` is `{run id}-rank{R}-{8 hex digits}`")
def test_detector_reads_torchrun(monkeypatch):
    """Under torchrun the resource has dl.* rank identity, host and a per-process instance id."""
    for name, value in {
        "RANK": "6",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "8",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "abc",
    }.items():
        monkeypatch.setenv(name, value)
    attributes = dict(get_aggregated_resources([TrainingResourceDetector()]).attributes)
    assert attributes["dl.rank"] == 6
    assert attributes["dl.local_rank"] == 2
    assert attributes["dl.world_size"] == 8
    assert attributes["dl.node_rank"] == 1
    assert attributes["dl.run.id"] == "abc"
    assert attributes["dl.job.id"] == "abc"
    assert attributes["host.name"] == socket.gethostname()
    assert attributes["service.instance.id"] == f"abc-rank6-{process_tag()}"


def test_single_process_has_a_stable_run_id():
    """Without a launcher the run id is random per process but stable across detections."""
    first = TrainingResourceDetector().detect().attributes
    second = TrainingResourceDetector().detect().attributes
    assert first["dl.run.id"] == second["dl.run.id"]
    assert first["dl.rank"] == 0 and first["dl.world_size"] == 1
    assert "dl.job.id" not in first


def test_registered_as_an_sdk_resource_detector():
    """The entry point lets OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=training find the detector."""
    (found,) = entry_points(group="opentelemetry_resource_detector", name="training")
    assert found.load() is TrainingResourceDetector


@documents(
    "spans.md",
    "`SLURM_RESTART_COUNT × (TORCHELASTIC_MAX_RESTARTS + 1) + TORCHELASTIC_RESTART_COUNT`",
)
@documents(
    "spans.md", "`OTEL_PYTHON_TRAINING_RUN_ATTEMPT`, else NVRx's `NVRX_CYCLE`, else torchrun's"
)
@pytest.mark.parametrize(
    ("environ", "attempt"),
    [
        ({}, None),
        ({"TORCHELASTIC_RESTART_COUNT": "0"}, 0),
        ({"TORCHELASTIC_RESTART_COUNT": "2"}, 2),
        ({"SLURM_RESTART_COUNT": "3"}, 3),
        ({"TORCHELASTIC_RESTART_COUNT": "1", "SLURM_RESTART_COUNT": "3"}, 4),
        (
            {
                "TORCHELASTIC_RESTART_COUNT": "1",
                "TORCHELASTIC_MAX_RESTARTS": "2",
                "SLURM_RESTART_COUNT": "3",
            },
            10,
        ),
        ({"NVRX_CYCLE": "5", "TORCHELASTIC_RESTART_COUNT": "1"}, 5),
        ({"OTEL_PYTHON_TRAINING_RUN_ATTEMPT": "7", "NVRX_CYCLE": "5"}, 7),
        ({"OTEL_PYTHON_TRAINING_RUN_ATTEMPT": "x", "NVRX_CYCLE": "5"}, 5),
        ({"OTEL_PYTHON_TRAINING_RUN_ATTEMPT": "-1"}, None),
    ],
)
def test_the_attempt_comes_from_the_first_launcher_that_counts_restarts(environ, attempt):
    """dl.run.attempt: ours, else NVRx's cycle, else torchrun's and SLURM's restart counts
    (each requeue a block of TORCHELASTIC_MAX_RESTARTS + 1 numbers)."""
    attributes = identity_attributes(config.load_identity(environ))
    assert attributes.get("dl.run.attempt") == attempt


@documents(
    "spans.md", "The process's start is also on the Resource, as `process.creation.time` (ISO 8601"
)
def test_process_creation_time_is_when_this_process_started():
    """process.creation.time is ISO 8601 UTC with ms, at or before now, from /proc."""
    value = identity_attributes(config.load_identity({}))["process.creation.time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", value)
    started = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert started.timestamp() <= time.time()
    kernel = clock.process_start_unix_s()
    if kernel is not None:  # /proc: within one clock tick and the ms rounding
        assert abs(started.timestamp() - kernel) < 0.02
    assert iso8601(0.5) == "1970-01-01T00:00:00.500Z"
