"""Shared by the tests: what to do when a real part a test needs is missing, how a test
starts a child process, and how it reads what the code produced.

Every skip of the suite goes through here (``tests/test_support.py`` checks it): a missing part
(a package, a program, gloo, fork) skips on a user's machine and fails under ``CI=true``
(:func:`unavailable` and the ``*_or_unavailable`` helpers); a test meant for another kind of
machine (one with a GPU, one without) skips everywhere (:func:`not_here`). A child process gets
its environment from :func:`child_env` (no ``OTEL_*`` of the host, this checkout's ``src``).

What the tests read, read one way: strict JSON (:func:`strict_json`, :func:`strict_json_lines`),
an L2 norm (:func:`l2`), the metric names a PromQL expression selects
(:func:`promql_metric_names`), the metrics of ``MetricsData`` (:func:`metrics_of`; their points:
``otel_training.testing.points``) and a meter of a test's own (:func:`new_in_memory_meter`, or
the ``in_memory_meter`` fixture of ``conftest.py``). Importing this module imports neither
OpenTelemetry nor otel_training (the benches import it).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

#: The repository root (tests/..).
REPO_ROOT = Path(__file__).resolve().parents[1]

#: True in a run of ``make mutation`` (scripts/mutation.py sets the variable for mutmut and every
#: test process it starts), where each of thousands of mutants runs the tests again.
UNDER_MUTATION = os.environ.get("OTEL_TRAINING_MUTATION") == "1"


def examples(n: int) -> int:
    """``n``, the hypothesis examples a property test tries; at most 25 under mutation testing
    (``UNDER_MUTATION``), where a mutant that breaks a rule fails within the first few (the
    profile ``mutation`` of ``conftest.py`` also derandomizes them, so a run repeats)."""
    return min(n, 25) if UNDER_MUTATION else n


def unavailable(reason: str) -> NoReturn:
    """Skips the test on a user's machine; fails it under CI (``CI=true``), where
    ``.ci/run`` installs every part the suite needs, so a missing one is a defect."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: .ci/run should have installed it)")
    pytest.skip(reason)


def child_env(
    overrides: Mapping[str, str | None] | None = None,
    /,
    *,
    drop: tuple[str, ...] = (),
    **extra: str,
) -> dict[str, str]:
    """The environment of a child process a test starts: this one's without any ``OTEL_*``
    variable (nor one starting with a prefix in ``drop``), ``<repo>/src`` first on
    ``PYTHONPATH``, unbuffered output, one torch thread per process unless
    ``OMP_NUM_THREADS`` is set (the tests' processes share the machine's cores), then
    ``overrides`` and ``extra`` on top (a value of ``None`` removes the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", *drop))}
    env.pop("MUTANT_UNDER_TEST", None)  # under make mutation: a child runs the code unmutated
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    for key, value in {**(overrides or {}), **extra}.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def start_python(
    code: str, *args: str, env: Mapping[str, str | None] | None = None, stdin: bool = False
) -> subprocess.Popen[str]:
    """``python -c code *args`` in the environment :func:`child_env` makes of ``env``, its
    stdout and stderr pipes of text (its stdin too when ``stdin``)."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=child_env(env),
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def terminate_when_ready(
    child: subprocess.Popen[str], delay_s: float = 0.0, timeout_s: float = 30.0
) -> tuple[int, str]:
    """Waits for ``child`` to print "ready", sends SIGTERM after ``delay_s`` seconds, and
    returns (exit status, stderr); a child that does not end within ``timeout_s`` seconds (a
    generous bound) is a hang and fails the test. The child is killed and reaped in any case."""
    try:
        line = child.stdout.readline().strip()
        assert line == "ready", child.stderr.read()[-3000:]
        if delay_s:
            time.sleep(delay_s)
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail("the child hung after SIGTERM")
        return child.returncode, child.stderr.read()
    finally:
        child.kill()
        child.wait()


def not_here(reason: str) -> NoReturn:
    """Skips a test meant for another kind of machine (a GPU that NVML reads, no profiler
    attached), under ``CI=true`` too: no install gives CI's machine a GPU."""
    pytest.skip(reason)


def import_or_unavailable(name: str) -> ModuleType:
    """``importlib.import_module(name)``, or :func:`unavailable` when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        unavailable(f"{name} is not installed ({error})")
        raise  # pragma: no cover - unavailable() always raises


def find_program(*names: str, variable: str | None = None) -> str | None:
    """The path of the first of the programs ``names`` on ``PATH`` (the executable named by
    the environment variable ``variable`` first, when set); ``None`` when there is none."""
    chosen = os.environ.get(variable) if variable else None
    for path in (chosen, *(shutil.which(name) for name in names)):
        if path and os.access(path, os.X_OK):
            return path
    return None


def program_or_unavailable(*names: str, install: str, variable: str | None = None) -> str:
    """:func:`find_program`, or :func:`unavailable` saying how to ``install`` it."""
    path = find_program(*names, variable=variable)
    if path is None:
        unavailable(f"{' or '.join(names)} is not installed ({install})")
    return path


def c_compiler() -> str:
    """The C compiler (gcc, else cc), or :func:`unavailable` when there is none."""
    return program_or_unavailable("gcc", "cc", install="apt-get install -y gcc")


def prometheus_or_unavailable() -> str:
    """The ``prometheus`` program ($PROMETHEUS_BINARY, else on PATH), or :func:`unavailable`."""
    return program_or_unavailable(
        "prometheus", install="apt-get install -y prometheus", variable="PROMETHEUS_BINARY"
    )


def promtool_or_unavailable() -> str:
    """The ``promtool`` program (Prometheus's), or :func:`unavailable`."""
    return program_or_unavailable("promtool", install="apt-get install -y prometheus")


def chromium_or_unavailable() -> str:
    """Headless-capable Chromium (``chromium``, else ``chromium-browser``), or
    :func:`unavailable`."""
    return program_or_unavailable(
        "chromium", "chromium-browser", install="Debian's chromium package"
    )


def chromium_dump_dom(url: str, profile: Path, *extra: str, timeout_s: float = 180) -> str:
    """The DOM a headless Chromium (:func:`chromium_or_unavailable`) has after loading ``url``
    (scripts run), with its profile in ``profile``; ``extra`` flags (``--screenshot=PATH``,
    ``--window-size=W,H``) replace ``--dump-dom`` when given.

    Raises:
        AssertionError: when Chromium exits non-zero.
    """
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
    ]
    result = subprocess.run(
        [chromium_or_unavailable(), *flags, *(extra or ["--dump-dom"]), url],
        capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def gloo_or_unavailable() -> None:
    """Returns when ``torch.distributed`` has its gloo backend; else :func:`unavailable`."""
    torch = import_or_unavailable("torch")
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        unavailable("torch.distributed with gloo is not available")


def fork_or_unavailable() -> None:
    """Returns where ``os.fork`` exists (POSIX); else :func:`unavailable`."""
    if not hasattr(os, "fork"):
        unavailable("os.fork is not available on this platform")


def build_shared_library(source: Path, library: Path, *flags: str) -> Path:
    """Compiles the C ``source`` into the shared ``library`` with :func:`c_compiler`.

    Raises:
        subprocess.CalledProcessError: when the compiler rejects the source.
    """
    subprocess.run(
        [c_compiler(), "-shared", "-fPIC", *flags, "-o", str(library), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    return library


def load_script(name: str, directory: str = "scripts") -> ModuleType:
    """The module ``<directory>/<name>.py`` of the repository (``scripts`` or ``bench``),
    imported once, as the script sees itself when run: its own directory first on
    ``sys.path`` (the benches import ``_verdict`` from beside them). Scripts are not a package."""
    if name in sys.modules:
        return sys.modules[name]
    folder = REPO_ROOT / directory
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


# -- reading what the code produced ------------------------------------------------------------


class LedgerClock:
    """A monotonic and a wall clock for a health ledger (``Ledger(perf=c.perf, unix=c.unix)``)
    that move only when told: the monotonic one from 100 s, the wall one 1,000 s ahead."""

    def __init__(self) -> None:
        self.t = 100.0

    def perf(self) -> float:
        return self.t

    def unix(self) -> float:
        return self.t + 1000.0

    def advance(self, seconds: float) -> None:
        self.t += seconds


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"bare {name} in JSON")


def _utf8_text(text: str | bytes) -> str:
    """``bytes`` decoded as UTF-8 (strictly), ``str`` checked to be encodable as UTF-8 (no lone
    surrogate): what a file can hold."""
    if isinstance(text, bytes):
        return text.decode("utf-8")
    text.encode("utf-8")
    return text


def strict_json(text: str | bytes) -> Any:
    """One JSON document as a strict reader takes it: UTF-8, and no bare ``NaN``, ``Infinity``
    or ``-Infinity`` (Python's json writes and reads them; JSON has none).

    Raises:
        ValueError: on such a constant, or text that is not UTF-8 (``UnicodeError``).
    """
    return json.loads(_utf8_text(text), parse_constant=_refuse_constant)


def strict_json_lines(text: str | bytes) -> list[Any]:
    """Each line of ``text`` (JSON lines, as the exporters write them) as :func:`strict_json`
    reads it."""
    return [
        json.loads(line, parse_constant=_refuse_constant) for line in _utf8_text(text).splitlines()
    ]


def l2(values: Iterable[Any]) -> float:
    """The L2 norm of all of ``values`` together, in float64: each one a tensor (all its
    elements count) or a number (an L2 norm of norms: sqrt(sum(v^2)))."""
    return math.sqrt(
        math.fsum(
            float(v.double().square().sum()) if hasattr(v, "double") else float(v) ** 2
            for v in values
        )
    )


_SELECTED_NAME = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: each name followed by a label matcher
    (``megatron_training_loss{job="x"}``)."""
    return set(_SELECTED_NAME.findall(expr))


def metrics_of(data: Any, name: str | None = None) -> list[Any]:
    """The metrics of ``MetricsData`` (``opentelemetry.sdk.metrics.export.Metric``), or of an
    OTLP ``ExportMetricsServiceRequest`` (the same fields), in order, optionally only those named
    ``name``; none for ``None`` (a reader that collected nothing)."""
    if data is None:
        return []
    return [
        metric
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
        if name is None or metric.name == name
    ]


@dataclass
class InMemoryMeter:
    """A meter provider of a test's own, its ``InMemoryMetricReader`` and a meter of it."""

    provider: Any
    reader: Any
    meter: Any

    def points(self, name: str | None = None) -> list[tuple[str, Any]]:
        """Collects now: (metric name, data point) pairs, optionally of one metric."""
        from otel_training import testing

        return testing.points(self.reader.get_metrics_data(), name)


def new_in_memory_meter(name: str = "test") -> InMemoryMeter:
    """A new ``MeterProvider`` with an ``InMemoryMetricReader``, and its meter ``name`` (not the
    global one); the caller shuts it down, or takes the ``in_memory_meter`` fixture."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    return InMemoryMeter(provider, reader, provider.get_meter(name))
