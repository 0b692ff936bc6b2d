"""``config/`` is the only reader of the environment (docs/architecture.md): every other module
gets its variables from the settings, or hands ``configure(environ=...)`` what
:func:`otel_training.config.environ_with` makes. Parsed with :mod:`ast`; nothing is imported."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from otel_training import config

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "otel_training"
#: What reads the environment: os.environ, os.environb, os.getenv, os.getenvb.
_READERS = {"environ", "environb", "getenv", "getenvb"}


def _readers(source: str) -> list[int]:
    """Lines of ``source`` that read the environment through ``os``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in _READERS
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            lines += [node.lineno for alias in node.names if alias.name in _READERS]
    return sorted(lines)


def test_no_module_outside_config_reads_the_environment():
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if "config" not in path.relative_to(PACKAGE).parts[:1]
        and (lines := _readers(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_check_sees_each_way_of_reading():
    source = "import os\nfrom os import getenv\na = os.environ\nb = os.getenv('X')\n"
    assert _readers(source) == [2, 3, 4]


def test_environ_with_sets_overrides_on_a_copy(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-the-environment")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    environ = config.environ_with({"RANK": "3", "WORLD_SIZE": "4"})
    assert environ["OTEL_SERVICE_NAME"] == "from-the-environment"
    assert (environ["RANK"], environ["WORLD_SIZE"]) == ("3", "4")
    assert os.environ["RANK"] == "0" and "WORLD_SIZE" not in os.environ
