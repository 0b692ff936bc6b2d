"""Fixtures for integration tests: a real OTLP receiver, a black hole, a refused port, and a
subprocess runner. Everything listens on 127.0.0.1 only."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:  # import the helper whatever pytest's import mode is
    sys.path.insert(0, str(_HERE))

from otlp_receiver import BlackHole, OtlpReceiver, free_port  # noqa: E402
from support import child_env  # noqa: E402

RunPython = Callable[..., "subprocess.CompletedProcess[str]"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test under tests/integration/ with `integration`."""
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A started `OtlpReceiver` (gRPC + HTTP on 127.0.0.1), closed after the test."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    """A `BlackHole` listener that accepts and never answers, closed after the test."""
    with BlackHole() as hole:
        yield hole


@pytest.fixture
def refused_endpoint() -> str:
    """An endpoint "http://127.0.0.1:PORT" with nothing listening: connections are refused."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the directory holding pyproject.toml)."""
    for candidate in _HERE.parents:
        if (candidate / "pyproject.toml").is_file():
            return candidate
    raise RuntimeError(f"no pyproject.toml above {_HERE}")


@pytest.fixture
def run_python(repo_root: Path) -> RunPython:
    """Runs Python code or a module in a subprocess with this interpreter (`sys.executable`).

    Returns a callable::

        run_python(code=None, *, module=None, args=(), env=None, timeout_s=60.0, cwd=None)
            -> subprocess.CompletedProcess[str]

    Exactly one of `code` (run with `-c`) or `module` (run with `-m`) is given; `args` follow it.
    The child's environment is `support.child_env(env)`: `os.environ` without any OTEL_*
    variable, with `<repo>/src` prepended to PYTHONPATH, PYTHONUNBUFFERED=1 and one torch
    thread, then `env` merged on top (a value of None removes the variable). stdout/stderr
    are captured as text; the exit status is not checked. cwd defaults to the repository root.
    A child still running after `timeout_s` seconds is killed and the test fails with whatever
    it printed.
    """

    def run(
        code: str | None = None,
        *,
        module: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str | None] | None = None,
        timeout_s: float = 60.0,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        if (code is None) == (module is None):
            raise TypeError("run_python: give exactly one of code= or module=")
        argv = [sys.executable, *(("-c", code) if code is not None else ("-m", module))]
        argv.extend(args)
        try:
            return subprocess.run(
                argv,
                env=child_env(env),
                cwd=cwd if cwd is not None else repo_root,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            out, err = (
                s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
                for s in (exc.stdout, exc.stderr)
            )
            pytest.fail(
                f"{' '.join(argv)!r} still running after {timeout_s:g} s"
                f"\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
            )

    return run
