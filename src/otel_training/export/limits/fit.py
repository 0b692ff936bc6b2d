"""Rule 3's cuts (:mod:`otel_training.export.limits`): a record over its budget made to fit,
alike for every signal.

While a record does not fit: its longest strings are cut alike (water-filling,
:func:`_water_level`, each string's characters weighted by the most JSON bytes one of them
takes), down to :data:`_MIN_CUT` characters; then its sequences are cut to fewer items, alike
(:func:`_fewer_items`); then its attributes are dropped, the last first (:func:`_drop_last`).
:func:`_fit_attributes` takes these steps for a set of attributes (a scope's, a resource's, a
metric point's); spans and log records take them with steps of their own between
(:mod:`~otel_training.export.limits.spans`, :mod:`~otel_training.export.limits.logs`). Costs are
worst cases (:mod:`~otel_training.export.limits.cost`), so that a fit is a fit for any content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_training.export.limits.cost import (
    _ITEM_COST,
    _attributes_cost,
    _char_cost,
    json_cost,
)
from otel_training.export.limits.strings import _cut

#: Fewest characters a string is cut to when a record is over its budget.
_MIN_CUT = 32


def _fit_attributes(attributes: dict[str, Any], budget: int) -> dict[str, Any]:
    """``attributes`` (bounded) cut until their worst-case cost fits ``budget``: the longest
    strings cut alike down to :data:`_MIN_CUT` characters, then sequences cut to fewer
    items alike, then attributes dropped, the last first (rule 3)."""
    total = _attributes_cost(attributes)
    if total <= budget:
        return attributes
    strings: list[str] = []
    for value in attributes.values():
        _collect_strings(value, strings)
    fixed = total - sum(json_cost(s) - 2 for s in strings)
    cap = max(_MIN_CUT, _water_level(strings, budget - fixed))
    attributes = {k: _cut_strings(v, cap) for k, v in attributes.items()}
    attributes, total = _fewer_items(attributes, _attributes_cost(attributes), budget)
    return _drop_last(attributes, total, budget)


def _drop_last(attributes: dict[str, Any], total: int, budget: int) -> dict[str, Any]:
    """``attributes`` without their last entries, as many as ``total`` (their cost in a
    record) must lose to fit ``budget``."""
    for key in reversed(list(attributes)):
        if total <= budget:
            break
        total -= _attributes_cost({key: attributes.pop(key)}) - 2
    return attributes


def _collect_strings(value: Any, out: list[str]) -> None:
    """Appends to ``out`` the strings of a bounded value (sequences are tuples then)."""
    kind = type(value)
    if kind is str:
        out.append(value)
    elif kind is tuple:
        for item in value:
            _collect_strings(item, out)
    elif kind is dict:
        for item in value.values():
            _collect_strings(item, out)


def _cut_strings(value: Any, cap: int) -> Any:
    kind = type(value)
    if kind is str:
        return _cut(value, cap) if len(value) > cap else value
    if kind is tuple:
        return tuple(_cut_strings(v, cap) for v in value)
    if kind is dict:
        return {k: _cut_strings(v, cap) for k, v in value.items()}
    return value


def _water_level(strings: Sequence[str], total: int) -> int:
    """The largest cap ``c`` (characters) with ``sum(w(s) * min(len(s), c)) <= total``, where
    ``w(s)`` is the most JSON bytes a character of ``s`` takes (:func:`_char_cost`)."""
    weighted = sorted((len(s), _char_cost(s)) for s in strings if s)
    above = sum(w for _, w in weighted)  # the weight of the strings not yet under the level
    used = 0
    for length, weight in weighted:
        if used + above * length > total:
            return max(0, (total - used) // above)
        used += weight * length
        above -= weight
    return weighted[-1][0] if weighted else 0


def _fewer_items(attributes: dict[str, Any], total: int, budget: int) -> tuple[dict[str, Any], int]:
    """``attributes`` with every sequence cut to the most items ``k`` (alike) with which
    ``total`` (the cost of the record holding them) fits ``budget``, and the new total."""
    sequences = {k: v for k, v in attributes.items() if type(v) is tuple and v}
    if not sequences:
        return attributes, total
    prefixes = {}
    for key, items in sequences.items():
        sums, used = [0], 0
        for item in items:
            used += json_cost(item) + _ITEM_COST
            sums.append(used)
        prefixes[key] = sums
    others = total - sum(sums[-1] for sums in prefixes.values())

    def cost(k: int) -> int:
        return others + sum(sums[min(k, len(sums) - 1)] for sums in prefixes.values())

    low, high = 0, max(len(v) for v in sequences.values())
    while low < high:
        middle = (low + high + 1) // 2
        if cost(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    attributes.update({k: v[:low] for k, v in sequences.items()})
    return attributes, cost(low)
