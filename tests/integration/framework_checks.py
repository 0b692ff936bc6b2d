"""What the framework-callback tests share: requiring a framework, and reading what arrived.

Not a test module.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Iterable, Sequence

import pytest

STEP = "megatron.training.step_duration_ms"


def require(module: str):
    """Imports ``module``; skips the test without it, except under ``CI=true`` where the test
    extra installs it and its absence is a failure."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        message = f"{module} is not installed (pip install -e '.[test]'): {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def collections_by_rank(receiver) -> dict[int, list[dict[str, list]]]:
    """Per ``dl.rank``, the metric collections in time order, each ``{name: [points]}`` (the
    points of one collection share its ``time_unix_nano``)."""
    grouped: dict[int, dict[int, dict[str, list]]] = {}
    for point in receiver.metrics():
        rank = point.resource_attributes.get("dl.rank")
        by_time = grouped.setdefault(rank, {})
        by_time.setdefault(point.time_unix_nano, {}).setdefault(point.name, []).append(point)
    return {rank: [found[t] for t in sorted(found)] for rank, found in grouped.items()}


def by_step_count(collections: Sequence[dict[str, list]], name: str) -> dict[int, float]:
    """``{optimizer steps recorded so far: value of the gauge or counter name}``, from each
    collection that has both (the first collection of each step count)."""
    found: dict[int, float] = {}
    for collection in collections:
        if STEP not in collection or name not in collection:
            continue
        steps = collection[STEP][0].count
        points = [p for p in collection[name] if not p.attributes]
        if points and steps not in found:
            found[steps] = points[0].value
    return found


def last_collection(collections: Sequence[dict[str, list]]) -> dict[str, list]:
    """The final collection (the one at shutdown)."""
    return collections[-1]


def l2(values: Iterable[float]) -> float:
    """The L2 norm of norms: sqrt(sum(v^2))."""
    return math.sqrt(math.fsum(v * v for v in values))


def tensor_gauges(collection: dict[str, list], family: str) -> dict[str, float]:
    """``{layer label: value}`` of the tensor-metric gauge ``family`` in one collection."""
    points = collection.get(f"megatron.training.tensor.{family}", [])
    return {p.attributes["megatron.training.layer"]: p.value for p in points}


def rate_bounds(
    tokens: float, before_ends: Sequence[float], after_ends: Sequence[float], first: int, last: int
) -> tuple[float, float]:
    """Bounds of tokens/s over the steps ``first..last`` (1-based), from timestamps taken by
    probes just before and just after the callback's hook at each boundary: index 0 is the
    start of the run, index i the end of step i. The callback's clock reads lie between."""
    shortest = before_ends[last] - after_ends[first - 1]
    longest = after_ends[last] - before_ends[first - 1]
    return tokens / longest, tokens / shortest


def runs(spans: Sequence) -> list:
    """The spans whose parent did not arrive: each rank's run span (told apart by place in
    the trace, not by name: the names belong to ``otel_training.spans``)."""
    ids = {s.span_id for s in spans}
    return [s for s in spans if s.parent_span_id not in ids]


def iteration_spans(spans: Sequence) -> list:
    """The spans below a run that have children of their own (an iteration and its optimizer
    span, with the ``all`` span groups)."""
    roots = {s.span_id for s in runs(spans)}
    parents = {s.parent_span_id for s in spans}
    return [s for s in spans if s.parent_span_id in roots and s.span_id in parents]
