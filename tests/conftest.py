"""Every test starts with clean OpenTelemetry globals and no OTEL_* variables of the host."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# tests/support.py is importable from every test module, tests/integration/ included.
sys.path.insert(0, str(Path(__file__).resolve().parent))

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


@pytest.fixture(scope="session")
def recorder_library(tmp_path_factory) -> Path:
    """The NVTX injection recorder (tests/nvtx_injection/recorder.c), built once per session
    with gcc; without a compiler a skip, under CI a failure."""
    from nvtx_injection import build

    return build(tmp_path_factory.mktemp("nvtx"))
