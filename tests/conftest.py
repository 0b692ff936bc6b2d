"""Every test starts with clean OpenTelemetry globals and no OTEL_* variables of the host."""

from __future__ import annotations

import os

import pytest

from otel_training import testing


@pytest.fixture(autouse=True)
def _clean_telemetry(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_OUTPUT_DIR", str(tmp_path / "telemetry"))
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM", "false")
    testing.reset()
    yield
    testing.reset()
