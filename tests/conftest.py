"""Every test starts with clean OpenTelemetry globals and no OTEL_* variables of the host."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

# Test modules sit in folders that mirror src/otel_training/; the helpers they share are
# importable from every one of them: tests/ (support.py, report_files.py,
# nvtx_injection) and tests/integration/ (otlp_receiver.py, framework_checks.py, ...).
sys.path.insert(0, str(Path(__file__).resolve().parent / "integration"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nvtx_injection  # noqa: E402
from hypothesis import settings
from support import UNDER_MUTATION, InMemoryMeter, child_env, new_in_memory_meter

from otel_training import testing

# Under mutation testing every mutant runs the property tests again: a repeatable, shorter
# search (support.examples caps the tests that set their own number).
settings.register_profile("mutation", max_examples=25, derandomize=True, database=None)
if UNDER_MUTATION:
    settings.load_profile("mutation")


@pytest.fixture(autouse=True)
def _clean_telemetry(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_OUTPUT_DIR", str(tmp_path / "telemetry"))
    # Defaults relative to the working directory (a configure(environ=...) that does not name
    # an output directory, a child process) land in the test's own directory, never in the
    # checkout: `make test` leaves the tree as it found it (pytest_sessionfinish below).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM", "false")
    testing.reset()
    yield
    testing.reset()


@pytest.fixture
def in_memory_meter() -> Iterator[InMemoryMeter]:
    """A meter provider of the test's own with an in-memory reader (``.meter``, ``.reader``,
    ``.points()``), shut down after the test."""
    meter = new_in_memory_meter()
    yield meter
    meter.provider.shutdown()


@pytest.fixture(scope="session")
def recorder_library(tmp_path_factory) -> Path:
    """The NVTX injection recorder (tests/nvtx_injection/recorder.c), built once per session
    with gcc; without a compiler a skip, under CI a failure."""
    from nvtx_injection import build

    return build(tmp_path_factory.mktemp("nvtx"))


@pytest.fixture
def record(recorder_library, tmp_path):
    """Runs Python code in a child with the NVTX recorder attached; returns the records
    (tests/trace/test_processors_nvtx.py and the phases' tests)."""

    def run(code: str, **env: str) -> list[dict]:
        output = tmp_path / "nvtx.jsonl"
        variables = {
            **nvtx_injection.environment(recorder_library, output),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            **env,
        }
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=child_env(variables),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return nvtx_injection.read(output)

    return run


_CHECKOUT = Path(__file__).resolve().parent.parent
#: What a test session may add to the checkout: caches and the installed environment.
_BUILD_OUTPUT = ("__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache", ".egg-info", ".venv")


def _checkout_state() -> set[str] | None:
    """The checkout's untracked and ignored entries (git's view), build output left out;
    ``None`` outside a git checkout, or when these tests are a copy inside one (``make
    mutation`` runs them in ``mutants/``, which git ignores as a whole)."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=_CHECKOUT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        if Path(top).resolve() != _CHECKOUT:
            return None
        listed = subprocess.run(
            ["git", "status", "--porcelain", "--ignored=matching"],
            cwd=_CHECKOUT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {line for line in listed.splitlines() if not any(part in line for part in _BUILD_OUTPUT)}


def pytest_sessionstart(session):
    session.config._checkout_before = _checkout_state()


def pytest_sessionfinish(session, exitstatus):
    """The suite leaves the checkout as it found it: no telemetry directory, no stray file
    (a fresh clone's `git status` stays clean, and `otel-training report` still shows the
    user's own newest run)."""
    before = getattr(session.config, "_checkout_before", None)
    after = _checkout_state()
    if before is None or after is None:
        return
    added = sorted(after - before)
    if added and session.config.option.collectonly is False:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            "the tests left these in the checkout: " + ", ".join(added), red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
