"""Spans within their budget: :func:`bounded_span` applies rules 1-4 of
:mod:`otel_training.export.limits` to a finished span (its name, status description,
attributes, events and links, its scope and resource); a span still over its budget is cut by
:func:`_fit_span`: strings, then events (exception events kept first), then the items of
sequences, then links and attributes.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link, Status

from otel_training.export.limits.cost import (
    _EVENT_COST,
    _LINK_COST,
    _SPAN_COST,
    _attributes_cost,
    _events_cost,
    _parts,
    _plain_bound,
    _quick_bound,
    _span_cost,
    _trace_states_cost,
    json_cost,
    span_cost,
)
from otel_training.export.limits.fit import (
    _MIN_CUT,
    _collect_strings,
    _cut_strings,
    _drop_last,
    _fewer_items,
    _water_level,
)
from otel_training.export.limits.scopes import bounded_resource, bounded_scope
from otel_training.export.limits.strings import (
    DEFAULT_LIMITS,
    MAX_NAME_LENGTH,
    Limits,
    _is_clean,
    _needs_work,
    _safe_name,
    bounded_attributes,
    safe_text,
)

__all__ = ["bounded_span"]


def bounded_span(span: ReadableSpan, limits: Limits = DEFAULT_LIMITS) -> ReadableSpan:
    """``span`` after rules 1-4, as a new ``ReadableSpan`` when anything changed, else the
    same object. Runs on an exporter's thread; never raises (a span that cannot even be read
    is returned as it is)."""
    try:
        return _bounded_span(span, limits)
    except Exception:
        return span


def _bounded_span(span: ReadableSpan, limits: Limits) -> ReadableSpan:
    limit = limits.value_length
    name, attributes, events, links = _parts(span)
    status = span.status
    description = status.description
    scope = span.instrumentation_scope
    resource = span.resource
    new_scope = bounded_scope(scope, limit)
    new_resource = bounded_resource(resource, limit)
    changed = (
        new_scope is not scope
        or new_resource is not resource
        or type(name) is not str
        or not _is_clean(name, MAX_NAME_LENGTH)
        or (description is not None and not _is_clean(description, limit))
        or _needs_work(attributes, limit)
    )
    values = len(attributes or ())
    if not changed and (events or links):
        for event in events:
            event_attributes = event.attributes
            values += 1 + len(event_attributes or ())
            if (
                type(event.name) is not str
                or not _is_clean(event.name, MAX_NAME_LENGTH)
                or _needs_work(event_attributes, limit)
            ):
                changed = True
                break
        for link in links:
            values += 1 + len(link.attributes or ())
            changed = changed or _needs_work(link.attributes, limit)
    if not changed:
        # Each string is within its limit: only many or long values can exceed the budget. A
        # character costs at most 12 bytes (two escaped UTF-16 units), a value its framing;
        # trace states are counted apart (the quick bounds know nothing of them).
        room = limits.record_budget_bytes - _trace_states_cost(span.context, links)
        if limit is not None and _SPAN_COST + _quick_bound(values + 2, limit) <= room:
            return span
        if not events and not links and _plain_bound((name, description), attributes) <= room:
            return span
        if span_cost(span) <= limits.record_budget_bytes:
            return span
    name = _safe_name(name)
    attributes = dict(bounded_attributes(attributes, limit) or {})
    if description is not None:
        description = safe_text(description, limit)
    new_events = [
        Event(_safe_name(e.name), dict(bounded_attributes(e.attributes, limit) or {}), e.timestamp)
        for e in events
    ]
    new_links = [Link(link.context, bounded_attributes(link.attributes, limit)) for link in links]
    draft = ReadableSpan(
        name=name,
        context=span.context,
        attributes=attributes,
        events=new_events,
        links=new_links,
        status=Status(status.status_code, description),
    )
    draft_cost = span_cost(draft)
    if draft_cost > limits.record_budget_bytes:
        name, attributes, description, new_events, new_links = _fit_span(
            draft, draft_cost, limits.record_budget_bytes
        )
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=new_resource,
        attributes=attributes,
        events=new_events,
        links=new_links,
        kind=span.kind,
        status=Status(status.status_code, description),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=new_scope,
    )


def _fit_span(draft: ReadableSpan, draft_cost: int, budget: int) -> tuple:
    """The name, attributes, description, events and links of ``draft`` cut until its cost
    fits ``budget`` (rule 3), in this order while it does not:

    1. the longest strings (of the span, its events and links) cut alike (water-filling,
       each string's characters weighted by the most JSON bytes one of them takes), down to
       :data:`_MIN_CUT` characters;
    2. events dropped, exception events kept first, then the earliest;
    3. sequences cut to fewer items, alike;
    4. links, then attributes, dropped, the last first.

    Costs are worst cases, so that a fit here is a fit for any content."""
    name, attributes, events, links = _parts(draft)
    description = draft.status.description
    strings: list[str] = []
    for value in (
        name,
        description,
        *attributes.values(),
        *(value for e in events for value in (e.attributes or {}).values()),
        *(value for link in links for value in (link.attributes or {}).values()),
    ):
        _collect_strings(value, strings)
    fixed = draft_cost - sum(json_cost(s) - 2 for s in strings)
    cap = max(_MIN_CUT, _water_level(strings, budget - fixed))

    def cut(mapping: Any) -> dict[str, Any]:
        return {k: _cut_strings(v, cap) for k, v in (mapping or {}).items()}

    name = _cut_strings(name, cap)
    description = _cut_strings(description, cap)
    attributes = cut(attributes)
    links = [Link(link.context, cut(link.attributes)) for link in links]
    # Each step below leaves what already fits as it is.
    others = _span_cost(name, description, attributes, (), links, draft.context)
    events = _fewer_events(
        [Event(e.name, cut(e.attributes), e.timestamp) for e in events], budget - others
    )
    attributes, total = _fewer_items(attributes, others + _events_cost(events), budget)
    while links and total > budget:
        link = links.pop()
        total -= _LINK_COST + _attributes_cost(link.attributes)
    attributes = _drop_last(attributes, total, budget)
    return name, attributes, description, events, links


def _fewer_events(events: list[Event], budget: int) -> list[Event]:
    """Events that fit ``budget``: exception events first, then the earliest; their order
    is kept."""
    ranked = sorted(range(len(events)), key=lambda i: (events[i].name != "exception", i))
    kept, used = set(), 0
    for i in ranked:
        event = events[i]
        cost = _EVENT_COST + json_cost(event.name) + _attributes_cost(event.attributes)
        if used + cost > budget:
            break
        kept.add(i)
        used += cost
    return [event for i, event in enumerate(events) if i in kept]
