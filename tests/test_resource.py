"""TrainingResourceDetector: rank identity as resource attributes, usable by any SDK setup."""

from __future__ import annotations

import socket

from opentelemetry.sdk.resources import get_aggregated_resources
from opentelemetry.util._importlib_metadata import entry_points

from otel_training.resource import TrainingResourceDetector


def test_detector_reads_torchrun(monkeypatch):
    """Under torchrun the resource has dl.* rank identity, host and a per-rank instance id."""
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
    assert attributes["service.instance.id"] == "abc-rank6"


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
