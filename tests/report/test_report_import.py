"""otel_training.report: the public surface, and what importing it does not import."""

from __future__ import annotations

import subprocess
import sys

import otel_training.report as report


def test_every_public_name_imports():
    """Each name of ``__all__`` is there; the surface cannot drift unnoticed."""
    assert sorted(report.__all__) == sorted(set(report.__all__))
    for name in report.__all__:
        assert getattr(report, name) is not None, name


def test_importing_needs_neither_plotly_nor_torch():
    """Importing otel_training and otel_training.report loads no plotly, jinja2 or torch."""
    code = (
        "import sys, otel_training, otel_training.report; "
        "print(sorted(m for m in ('plotly', 'jinja2', 'torch') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
