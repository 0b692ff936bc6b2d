"""Each example says how to run it from the checkout, and that command names a program that
exists there after ``make setup``: ``.venv/bin/python`` or ``.venv/bin/torchrun``, never a bare
``python`` (which is not the venv's outside it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_docstring_runs_the_example_with_the_venv(example):
    """Its docstring runs it as ``.venv/bin/python|torchrun ... examples/<it>``, and no line
    runs it with a bare ``python``."""
    doc = ast.get_docstring(ast.parse(example.read_text())) or ""
    runs = re.findall(rf"^\s*(?:\S+=\S+\s+)*(\S+)[^\n]*examples/{example.name}", doc, re.M)
    assert runs, f"{example.name}: its docstring does not say how to run it"
    assert all(r in (".venv/bin/python", ".venv/bin/torchrun") for r in runs), runs
    assert not re.search(r"(^|\s)python3? examples/", doc), doc
