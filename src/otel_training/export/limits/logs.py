"""Log records within their budget: :func:`bounded_log_record` applies rules 1-4 of
:mod:`otel_training.export.limits` to a ``ReadableLogRecord`` (its body, attribute keys and
values, which may also be bytes, maps and nested lists, its severity text and event name, its
scope and resource); a record still over its budget is cut by :func:`_fit_log_record`.
"""

from __future__ import annotations

from typing import Any

from otel_training.export.limits.cost import (
    _ENTRY_COST,
    _LOG_RECORD_COST,
    _char_cost,
    _plain_bound,
    _quick_bound,
    any_cost,
    json_cost,
    log_record_cost,
)
from otel_training.export.limits.fit import (
    _MIN_CUT,
    _collect_strings,
    _cut_strings,
    _water_level,
)
from otel_training.export.limits.scopes import bounded_resource, bounded_scope
from otel_training.export.limits.strings import (
    DEFAULT_LIMITS,
    MAX_NAME_LENGTH,
    Limits,
    _any_needs_work,
    _cut,
    _is_clean,
    _is_clean_name,
    _safe_name,
    bounded_any,
    plain,
    safe_text,
)

__all__ = ["bounded_log_record"]


def bounded_log_record(record: Any, limits: Limits = DEFAULT_LIMITS) -> Any:
    """A ``ReadableLogRecord`` after rules 1-4 (body, attribute keys and values, severity
    text, event name, scope and resource), as a new record when anything changed, else the
    same object. Runs on an exporter's thread; never raises (a record that cannot even be
    read is returned as it is)."""
    try:
        return _bounded_log_record(record, limits)
    except Exception:
        return record


def _bounded_log_record(record: Any, limits: Limits) -> Any:
    import copy
    import dataclasses

    from opentelemetry.attributes import BoundedAttributes

    limit = limits.value_length
    log_record = record.log_record
    body = log_record.body
    attributes = plain(log_record.attributes or {})
    severity_text = log_record.severity_text
    event_name = log_record.event_name
    scope = record.instrumentation_scope
    resource = record.resource
    new_scope = bounded_scope(scope, limit)
    new_resource = bounded_resource(resource, limit)
    changed = (
        _any_needs_work(body, limit)
        or any(
            type(k) is not str or not _is_clean(k, MAX_NAME_LENGTH) or _any_needs_work(v, limit)
            for k, v in attributes.items()
        )
        or (severity_text is not None and not _is_clean_name(severity_text))
        or (event_name is not None and not _is_clean_name(event_name))
    )
    others_changed = new_scope is not scope or new_resource is not resource
    budget = limits.record_budget_bytes
    if not changed and not others_changed:
        primitive = type(body) in (str, int, float, bool, type(None)) and all(
            type(v) in (str, int, float, bool) for v in attributes.values()
        )
        if (
            primitive
            and limit is not None
            and _LOG_RECORD_COST + _quick_bound(len(attributes) + 3, limit) <= budget
        ):
            return record
        texts = (body if type(body) is str else None, severity_text, event_name)
        if primitive and _plain_bound(texts, attributes) <= budget:
            return record
        if log_record_cost(record) <= budget:
            return record
    changes: dict[str, Any] = {}
    if new_scope is not scope:
        changes["instrumentation_scope"] = new_scope
    if new_resource is not resource:
        changes["resource"] = new_resource
    if changed or log_record_cost(record) > budget:
        body = bounded_any(body, limit)
        cleaned = {
            safe_text(k, MAX_NAME_LENGTH): bounded_any(v, limit) for k, v in attributes.items()
        }
        if severity_text is not None:
            severity_text = _safe_name(severity_text)
        if event_name is not None:
            event_name = _safe_name(event_name)
        body, cleaned = _fit_log_record(body, cleaned, budget)
        dropped = getattr(log_record.attributes, "dropped", 0)
        new_attributes = BoundedAttributes(attributes=cleaned)  # no cap, immutable
        new_attributes.dropped = dropped
        new_record = copy.copy(log_record)
        new_record.body = body
        new_record.attributes = new_attributes
        new_record.severity_text = severity_text
        if event_name is not None:
            new_record.event_name = event_name
        changes["log_record"] = new_record
    return dataclasses.replace(record, **changes)


def _fit_log_record(body: Any, attributes: dict[str, Any], budget: int) -> tuple[Any, dict]:
    """Cuts the longest strings of a log record's body and attributes alike (water-filling)
    until its worst-case cost fits ``budget``; a record that does not fit even then (very
    many values) keeps the attributes that fit, in order, and its body as bounded text."""

    def cost() -> int:
        return (
            _LOG_RECORD_COST
            + any_cost(body)
            + 2
            + sum(json_cost(k) + _ENTRY_COST + any_cost(v) for k, v in attributes.items())
        )

    if cost() <= budget:
        return body, attributes
    strings: list[str] = []
    _collect_strings(body, strings)
    for value in attributes.values():
        _collect_strings(value, strings)
    fixed = cost() - sum(json_cost(s) - 2 for s in strings)
    cap = max(_MIN_CUT, _water_level(strings, budget - fixed))
    body = _cut_strings(body, cap)
    attributes = {k: _cut_strings(v, cap) for k, v in attributes.items()}
    if cost() <= budget:
        return body, attributes
    kept: dict[str, Any] = {}
    used = _LOG_RECORD_COST
    for key, value in attributes.items():
        entry = json_cost(key) + _ENTRY_COST + any_cost(value)
        if used + entry > budget // 2:
            break
        kept[key] = value
        used += entry
    attributes = kept
    text = body if type(body) is str else safe_text(body, None)
    room = max(_MIN_CUT, (budget - used) // _char_cost(text) - 8)
    body = _cut(text, room) if len(text) > room else text
    return body, attributes
