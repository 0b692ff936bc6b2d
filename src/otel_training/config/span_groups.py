"""The span groups ``OTEL_PYTHON_TRAINING_SPAN_GROUPS`` turns on: every group, the presets,
the names otel-training used before it took Megatron-LM's, and how a list of presets and group
names resolves to groups (alike from the environment and from code).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from otel_training.semconv.spans import SPAN_GROUP_LEVELS, SPAN_LEVELS, SPAN_PRESET_ALIASES

#: The span group of phases whose name is not in the registry (``phase(name)``); it is on in
#: every preset but ``none``.
CUSTOM_SPAN_GROUP: Final = "custom"
#: Every span group: Megatron-LM's and ``custom`` (``otel_training.semconv.SPAN_GROUP_LEVELS``).
SPAN_GROUPS: Final = frozenset(SPAN_GROUP_LEVELS)
#: The presets of ``OTEL_PYTHON_TRAINING_SPAN_GROUPS``: ``none``, and for each level of
#: ``otel_training.semconv.SPAN_LEVELS`` the groups of that level and of the levels before it
#: (Megatron-LM's presets), and the aliases (``profiling`` = ``all``).
SPAN_GROUP_PRESETS: Final = {
    "none": frozenset(),
    **{
        level: frozenset(g for g, at in SPAN_GROUP_LEVELS.items() if SPAN_LEVELS.index(at) <= i)
        for i, level in enumerate(SPAN_LEVELS)
    },
}
SPAN_GROUP_PRESETS.update(
    {alias: SPAN_GROUP_PRESETS[level] for alias, level in SPAN_PRESET_ALIASES.items()}
)
#: Group names of otel-training before it took Megatron-LM's, still accepted (one warning).
RENAMED_SPAN_GROUPS: Final = {
    "run": "job",
    "startup": "job",
    "iteration": "step",
    "evaluation": "evaluate",
}


def resolve_span_groups(
    names: Iterable[str],
) -> tuple[frozenset[str], list[str], list[str], bool]:
    """(groups, unknown names, renamed names used, whether any name was usable)."""
    groups: set[str] = set()
    unknown, renamed = [], []
    usable = False
    for raw in names:
        name = raw.strip().lower()
        if name in RENAMED_SPAN_GROUPS:
            renamed.append(name)
            name = RENAMED_SPAN_GROUPS[name]
        if name in SPAN_GROUP_PRESETS:
            groups |= SPAN_GROUP_PRESETS[name]
            usable = True
        elif name in SPAN_GROUPS:
            groups.add(name)
            usable = True
        elif name:
            unknown.append(raw.strip())
    return frozenset(groups), unknown, renamed, usable


def span_groups_from_names(names: str | Iterable[str]) -> frozenset[str]:
    """The span groups that presets and group ``names`` enable together (as
    ``OTEL_PYTHON_TRAINING_SPAN_GROUPS`` reads them, for explicit configuration in code).

    Raises:
        ValueError: when a name is neither a preset (:data:`SPAN_GROUP_PRESETS`) nor a span
        group (:data:`SPAN_GROUPS`) nor a renamed one (:data:`RENAMED_SPAN_GROUPS`).
    """
    if isinstance(names, str):
        names = names.split(",")
    groups, unknown, _, _ = resolve_span_groups(names)
    if unknown:
        known = sorted(SPAN_GROUP_PRESETS) + sorted(SPAN_GROUPS)
        raise ValueError(f"unknown span group {unknown[0]!r}; known: {', '.join(known)}")
    return groups
