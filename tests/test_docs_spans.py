"""docs/spans.md names every span, group and variable that the code has."""

from __future__ import annotations

import re
from pathlib import Path

from otel_training.config import variables as environment_variables
from otel_training.semconv.spans import SPAN_GROUP_LEVELS, SPANS

DOC = (Path(__file__).resolve().parent.parent / "docs" / "spans.md").read_text()


def _names_in_table() -> set[str]:
    """Span names of the names table: `megatron.x.{part}` rows expand by the function's words."""
    section = DOC.split("## Span names", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in section.splitlines():
        cells = row.split(" | ")
        if len(cells) < 3 or not row.startswith("|"):
            continue
        name = cells[1].strip("` ")
        words = re.findall(r'"(\w+)"', cells[0])
        if "{" in name:
            names.update(re.sub(r"\{\w+\}", word, name) for word in words)
        else:
            names.add(name)
    return names


def test_every_registered_span_is_in_the_names_table():
    assert set(SPANS) <= _names_in_table()


def test_every_span_group_is_in_the_presets_table():
    section = DOC.split("## Span groups", 1)[1].split("\n## ", 1)[0]
    for group in SPAN_GROUP_LEVELS:
        assert f"`{group}`" in section, group


def test_every_span_variable_is_documented():
    names = [
        environment_variables.OTEL_PYTHON_TRAINING_SPAN_GROUPS,
        environment_variables.OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS,
        environment_variables.OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS,
        environment_variables.OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET,
        environment_variables.MEGATRON_OTEL_SPAN_GROUPS,
        environment_variables.NEMO_LENS_SPAN_GROUPS,
        environment_variables.MEGATRON_OTEL_EXPORT_STRATEGY,
        environment_variables.MEGATRON_OTEL_RUN_ID,
    ]
    for name in names:
        assert name in DOC, name
