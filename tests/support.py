"""Shared by the tests: what to do when a real part a test needs is missing."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest


def unavailable(reason: str) -> None:
    """Skips the test on a user's machine; fails it under CI (``CI=true``), where
    ``.ci/run`` installs every part the suite needs, so a missing one is a defect."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: .ci/run should have installed it)")
    pytest.skip(reason)


def import_or_unavailable(name: str) -> ModuleType:
    """``importlib.import_module(name)``, or :func:`unavailable` when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        unavailable(f"{name} is not installed ({error})")
        raise  # pragma: no cover - unavailable() always raises


def c_compiler() -> str:
    """The C compiler (gcc, else cc), or :func:`unavailable` when there is none."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        unavailable("no C compiler (gcc or cc)")
    return compiler


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


def load_script(name: str) -> ModuleType:
    """The module ``scripts/<name>.py`` of the repository, imported once (scripts are not a
    package)."""
    import sys

    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module
