"""The spans and span groups of the registry, for ``scripts/generate_semconv.py``.

Span groups and their presets are in ``semconv/span_groups.yaml`` (Megatron-LM's, and
otel-training's ``custom``); each span of ``semconv/registry/*.yaml`` names its group in
``annotations.otel_training.group`` and takes its preset level from the group.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SPAN_GROUPS_PATH = Path(__file__).resolve().parent.parent / "semconv" / "span_groups.yaml"
_GROUP_NAME = re.compile(r"[a-z][a-z_]*")


@dataclass(frozen=True)
class SpanGroup:
    """One span group: the smallest preset that enables it, a brief, whether it is one of the
    fine-grained groups that may run on NVTX ranges only."""

    name: str
    level: str
    brief: str
    nvtx_only: bool


@dataclass(frozen=True)
class SpanGroups:
    """``semconv/span_groups.yaml``: the preset levels (smallest first, cumulative), preset
    aliases (``profiling`` = ``all``) and the groups."""

    levels: tuple[str, ...]
    aliases: Mapping[str, str]
    groups: Mapping[str, SpanGroup]

    def larger_levels(self, level: str) -> tuple[str, ...]:
        """``level`` and the presets after it: those that enable a group of ``level``."""
        return self.levels[self.levels.index(level) :]


@dataclass(frozen=True)
class Span:
    """A span defined in the registry: its name (the registry ``type``) and span group."""

    name: str
    brief: str
    note: str
    stability: str
    group: str
    level: str
    attributes: tuple[tuple[str, str], ...]  # (key, requirement level)


def load_span_groups(path: Path = SPAN_GROUPS_PATH) -> SpanGroups:
    """Reads the span groups. Raises ``OSError``/``yaml.YAMLError``/``ValueError`` when the
    file is unreadable or malformed (a level that is not a preset, a bad name)."""
    document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    levels = tuple(document.get("levels") or ())
    if not levels:
        raise ValueError(f"{path}: no levels")
    groups = {}
    for name, entry in (document.get("groups") or {}).items():
        entry = entry or {}
        if not _GROUP_NAME.fullmatch(str(name)) or entry.get("level") not in levels:
            raise ValueError(f"{path}: group {name!r} needs a lower-case name and a level")
        brief = str(entry.get("brief") or "").strip()
        if not brief.endswith("."):
            raise ValueError(f"{path}: the brief of group {name!r} must end with a period")
        groups[name] = SpanGroup(name, entry["level"], brief, bool(entry.get("nvtx_only")))
    aliases = dict(document.get("aliases") or {})
    if not set(aliases.values()) <= set(levels) or set(aliases) & (set(levels) | set(groups)):
        raise ValueError(f"{path}: an alias must name a level and not shadow a level or group")
    return SpanGroups(levels, aliases, groups)


def _ours(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = entry.get("annotations") or {}
    value = annotations.get("otel_training") if isinstance(annotations, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def span_group_problems(
    spans: Sequence[Mapping[str, Any]], groups: SpanGroups
) -> list[tuple[str, str]]:
    """``(span name, problem)`` for each span whose ``annotations.otel_training.group`` is not
    a group of ``groups`` (rule ``span_group``)."""
    problems = []
    for span in spans:
        group = _ours(span).get("group")
        if group not in groups.groups:
            problems.append(
                (
                    str(span.get("type")),
                    f"annotations.otel_training.group {group!r} is not a group of "
                    "semconv/span_groups.yaml",
                )
            )
    return problems


def build_spans(
    spans: Sequence[Mapping[str, Any]], groups: SpanGroups, clean, requirement
) -> list[Span]:
    """The spans to generate, sorted by name; ``clean`` and ``requirement`` are the
    generator's text and requirement-level helpers. The registry must be valid."""
    built = []
    for s in spans:
        group = groups.groups[_ours(s)["group"]]
        built.append(
            Span(
                name=s["type"],
                brief=clean(s["brief"]),
                note=clean(s.get("note", "")),
                stability=s["stability"],
                group=group.name,
                level=group.level,
                attributes=tuple(
                    (str(r["ref"]), requirement(r.get("requirement_level")))
                    for r in s.get("attributes") or ()
                    if isinstance(r, Mapping) and "ref" in r
                ),
            )
        )
    return sorted(built, key=lambda s: s.name)


def _literal(value: Any) -> str:
    return f"``{json.dumps(value, ensure_ascii=False)}``"


def span_doc(span: Span, groups: SpanGroups) -> str:
    """The docstring text of a span constant: brief; group, presets and attributes; note."""
    facts = (
        f"Span group: {_literal(span.group)}, on in the span-group presets "
        + ", ".join(_literal(level) for level in groups.larger_levels(span.level))
        + f". Kind: internal. Stability: {span.stability}."
    )
    if span.attributes:
        listed = (f"{_literal(key)} ({level.replace('_', ' ')})" for key, level in span.attributes)
        facts += " Attributes: " + ", ".join(listed) + "."
    return "\n\n".join(p for p in (span.brief, facts, span.note) if p)
