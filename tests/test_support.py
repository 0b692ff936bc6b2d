"""The tests' one way to skip (tests/support.py): a missing part skips on a user's machine and
fails under CI=true; no test skips around it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import support

TESTS = Path(__file__).resolve().parent

#: Calls and decorators that skip, or read CI=true to decide: only tests/support.py may.
_SKIPS = {"pytest.skip", "pytest.importorskip", "pytest.mark.skip", "pytest.mark.skipif"}


def _own_skips(source: str) -> list[str]:
    """``line: what`` of each skip that does not go through tests/support.py: a pytest skip
    call or mark, a name imported from pytest to skip with, or a read of ``CI``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and ast.unparse(node) in _SKIPS:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "pytest":
            for alias in node.names:
                if alias.name in ("skip", "importorskip", "mark"):
                    found.append(f"{node.lineno}: from pytest import {alias.name}")
        elif isinstance(node, ast.Constant) and node.value == "CI":
            found.append(f'{node.lineno}: "CI"')
    return found


def test_every_skip_goes_through_support():
    """No test module skips by itself or reads CI: each goes through tests/support.py, so
    that under CI=true a missing part fails (shown to fail on the copies this replaced)."""
    found = {
        str(path.relative_to(TESTS)): skips
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != "support.py" and path != Path(__file__).resolve()
        if (skips := _own_skips(path.read_text(encoding="utf-8")))
    }
    assert found == {}


@pytest.mark.parametrize(
    "source",
    [
        'if os.environ.get("CI") == "true":\n    pytest.fail(message)\npytest.skip(message)\n',
        'torch = pytest.importorskip("torch")\n',
        '@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")\ndef test(): ...\n',
        "from pytest import skip\n",
        'if os.getenv("CI"):\n    raise AssertionError\n',
    ],
)
def test_the_check_finds_a_skip_of_its_own(source):
    """Each hand-written way to skip or to read CI is found."""
    assert _own_skips(source)


def test_the_check_leaves_the_helpers_alone():
    """Calling the helpers, and pytest's other parts, is no skip."""
    source = (
        'support.unavailable("x")\nimport_or_unavailable("torch")\n'
        "@pytest.mark.timeout(9)\ndef test(): ...\n"
    )
    assert _own_skips(source) == []


_RUN = """
import sys
sys.path.insert(0, {tests!r})
import support
{call}
"""


@pytest.mark.slow
@pytest.mark.parametrize("ci, outcome", [("true", "failed"), ("", "skipped")])
@pytest.mark.parametrize(
    "call",
    [
        'support.unavailable("a part")',
        'support.import_or_unavailable("no_such_module_otel_training")',
        'support.program_or_unavailable("no-such-program-otel-training", install="nowhere")',
    ],
)
def test_a_missing_part_skips_and_under_ci_fails(tmp_path, ci, outcome, call):
    """A missing package or program skips the test; under CI=true it fails the test."""
    test = tmp_path / "test_part.py"
    body = textwrap.indent(_RUN.format(tests=str(TESTS), call=call).strip(), "    ")
    test.write_text(f"def test_part():\n{body}\n")
    env = {"PATH": "/usr/bin:/bin", "CI": ci}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"1 {outcome}" in result.stdout, result.stdout + result.stderr


def test_not_here_skips_under_ci_too(monkeypatch):
    """A test meant for another kind of machine skips whatever CI says."""
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.skip.Exception):
        support.not_here("this machine has no GPU")


def test_a_program_is_found_on_path_or_by_its_variable(tmp_path, monkeypatch):
    """find_program: the executable a variable names first, then the first name on PATH;
    None when neither is there."""
    program = tmp_path / "tool"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert support.find_program("missing", "tool") == str(program)
    assert support.find_program("missing") is None
    monkeypatch.setenv("TOOL_BINARY", str(program))
    assert support.find_program("missing", variable="TOOL_BINARY") == str(program)


def test_a_child_gets_this_checkout_and_none_of_the_hosts_otel_variables(monkeypatch):
    """child_env: no OTEL_* (nor a dropped prefix), src first on PYTHONPATH, one torch thread
    unless set, unbuffered; overrides on top, None removing a variable."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "host")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = support.child_env({"KEEP": "1", "PATH": None}, drop=("SLURM_",), EXTRA="2")
    assert not any(k.startswith(("OTEL_", "SLURM_")) for k in env)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(support.REPO_ROOT / "src"), "elsewhere"]
    assert (env["OMP_NUM_THREADS"], env["PYTHONUNBUFFERED"]) == ("1", "1")
    assert (env["KEEP"], env["EXTRA"]) == ("1", "2") and "PATH" not in env
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert support.child_env()["OMP_NUM_THREADS"] == "4"
