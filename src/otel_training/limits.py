"""What leaves the process is bounded and always encodes: one rule for every string.

Every string that otel-training hands to an exporter or writes to a file (span names, attribute
keys and values, event attributes, exception messages and stack traces, status descriptions,
log bodies, resource attributes) goes through the same rule, so that one odd value never costs
a batch, a line or a request:

1. **Any string.** A name or key that is not a ``str`` becomes its ``str()`` (``<TypeName>`` if
   that raises). Lone surrogates, which no UTF-8 encoder accepts, become backslash escapes:
   U+DC80..U+DCFF, what ``os.fsdecode`` makes of an undecodable byte of a file name, as
   ``\\xNN`` (the byte, as Python writes bytes); any other lone surrogate as ``\\uDXXX``. The
   rest of the value is kept as it is; control characters stay (every encoder escapes them).
2. **Bounded values.** A string value is cut to the value-length limit, in characters after
   escaping: ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` for spans,
   ``OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT`` for logs, else
   ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else :data:`DEFAULT_VALUE_LENGTH`. Names and keys are
   cut to :data:`MAX_NAME_LENGTH`. A cut string ends with :func:`cut_marker` (``...[N characters
   cut]``) and is still no longer than the limit.
3. **Bounded records.** All strings of one span or log record together are bounded by
   :data:`RECORD_BUDGET_BYTES` of their worst-case JSON size (6 bytes a character): when a
   record is larger, its longest strings are cut further, alike, until it fits; a span with
   more events than fit keeps its exception events and first ones. So a span JSON line stays
   under 1 MiB (the collector's filelog receiver's default) and one span under 1 MiB of
   protobuf.
4. **Any number.** Integers outside int64 (all OTLP carries) become floats; sequences keep at
   most :data:`MAX_SEQUENCE_LENGTH` items.

:func:`bounded_span` applies rules 1-4 to a finished span on an exporter's thread, never on
the training thread. Nothing here raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link, Status

__all__ = [
    "DEFAULT_VALUE_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_SEQUENCE_LENGTH",
    "RECORD_BUDGET_BYTES",
    "Limits",
    "bounded_attributes",
    "bounded_span",
    "bounded_value",
    "cut_marker",
    "json_cost",
    "safe_text",
]

#: Characters kept of a string value when no ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` is set.
DEFAULT_VALUE_LENGTH: Final = 16_384
#: Characters kept of span names, event names and attribute keys.
MAX_NAME_LENGTH: Final = 1_024
#: Items kept of a sequence value.
MAX_SEQUENCE_LENGTH: Final = 1_024
#: Worst-case JSON bytes of the strings and values of one span or log record together.
RECORD_BUDGET_BYTES: Final = 900_000
#: What one attribute costs beyond its key and value: OTLP/JSON writes
#: ``{"key":...,"value":{"stringValue":...}},`` around them.
_ENTRY_COST = 40
#: Fewest characters a string is cut to when a record is over its budget.
_MIN_CUT = 32

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
_PRIMITIVES = (str, bool, int, float)


@dataclass(frozen=True)
class Limits:
    """The bounds of one signal.

    Attributes:
        value_length: Characters kept of a string value (rule 2); ``None``: unbounded, as the
            specification allows when a user asks for it (the record budget still applies).
        record_budget_bytes: Worst-case JSON bytes of one record (rule 3).
    """

    value_length: int | None = DEFAULT_VALUE_LENGTH
    record_budget_bytes: int = RECORD_BUDGET_BYTES


DEFAULT_LIMITS: Final = Limits()


def cut_marker(cut: int) -> str:
    """What ends a string of which ``cut`` characters were cut."""
    return f"...[{cut} characters cut]"


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def safe_text(value: Any, limit: int | None = DEFAULT_VALUE_LENGTH) -> str:
    """``value`` as a string every encoder accepts, at most ``limit`` characters (rules 1-2).

    Never raises.
    """
    if type(value) is not str:
        try:
            value = str(value)
        except Exception:
            value = f"<{type(value).__name__}>"
        if type(value) is not str:  # a str subclass whose methods may misbehave
            value = str.__str__(value)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = _SURROGATE.sub(_escape, value)
    if limit is not None and len(value) > limit:
        value = _cut(value, limit)
    return value


def _cut(text: str, limit: int) -> str:
    keep = limit
    marker = ""
    for _ in range(3):  # the marker's count has one digit more at most once
        marker = cut_marker(len(text) - keep)
        keep = limit - len(marker)
        if keep + len(cut_marker(len(text) - keep)) <= limit:
            break
    if keep < 8:  # no room for a marker that says so: a plain cut
        return text[:limit]
    return text[:keep] + cut_marker(len(text) - keep)


def _is_clean(value: str, limit: int | None) -> bool:
    """True when ``value`` needs nothing of rules 1-2 (the common case, checked cheaply)."""
    if limit is not None and len(value) > limit:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def bounded_value(value: Any, limit: int | None = DEFAULT_VALUE_LENGTH) -> Any:
    """An attribute value after rules 1, 2 and 4: strings escaped and cut, big ints as floats,
    sequences cut to :data:`MAX_SEQUENCE_LENGTH` (items bounded alike); any other type as its
    bounded ``str()``. Never raises."""
    kind = type(value)
    if kind is str:
        return value if _is_clean(value, limit) else safe_text(value, limit)
    if kind is bool or kind is float:
        return value
    if kind is int:
        return value if _INT64_MIN <= value <= _INT64_MAX else float(value)
    if isinstance(value, (list, tuple)):
        items = value[:MAX_SEQUENCE_LENGTH]
        return tuple(bounded_value(v, limit) for v in items)
    if isinstance(value, (bool, int, float)):  # numpy scalars and other subclasses
        try:
            return bounded_value(value.item() if hasattr(value, "item") else float(value), limit)
        except Exception:
            pass
    return safe_text(value, limit)


def _plain(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """The dict inside the SDK's ``BoundedAttributes`` (whose ``items()`` goes through a lock
    and ``__getitem__`` per key), else the mapping itself."""
    inner = getattr(mapping, "_dict", None)
    return inner if type(inner) is dict else mapping


def _needs_work(attributes: Mapping[str, Any] | None, limit: int | None) -> bool:
    if not attributes:
        return False
    for key, value in _plain(attributes).items():
        if type(key) is not str or not _is_clean(key, MAX_NAME_LENGTH):
            return True
        kind = type(value)
        if kind is str:
            if not _is_clean(value, limit):
                return True
        elif kind is int:
            if not _INT64_MIN <= value <= _INT64_MAX:
                return True
        elif kind is not float and kind is not bool:
            return True
    return False


def bounded_attributes(
    attributes: Mapping[str, Any] | None, limit: int | None = DEFAULT_VALUE_LENGTH
) -> Mapping[str, Any] | None:
    """``attributes`` with rules 1, 2 and 4 applied to keys and values; the same object when
    nothing needed a change. Never raises."""
    if not _needs_work(attributes, limit):
        return attributes
    cleaned: dict[str, Any] = {}
    try:
        for key, value in attributes.items():
            cleaned[safe_text(key, MAX_NAME_LENGTH)] = bounded_value(value, limit)
    except Exception:  # a mapping that changed under us: keep what was read
        pass
    return cleaned


def json_cost(value: Any) -> int:
    """An upper bound of the bytes ``value`` takes as JSON (6 a character for strings that are
    not plain printable ASCII, 2 for quotes, 24 for a number), the unit of rule 3; with
    :data:`_ENTRY_COST` per attribute it bounds OTLP/JSON and protobuf alike."""
    kind = type(value)
    if kind is str:
        if value.isascii() and value.isprintable():
            return len(value) + 2
        return 6 * len(value) + 2
    if kind is tuple or kind is list:
        return 2 + sum(json_cost(v) + 1 for v in value)
    return 24


def _attributes_cost(attributes: Mapping[str, Any] | None) -> int:
    if not attributes:
        return 2
    cost = 2
    for key, value in _plain(attributes).items():  # json_cost inlined: runs for every span
        if type(key) is str and key.isascii() and key.isprintable():
            cost += len(key) + 2 + _ENTRY_COST
        else:
            cost += json_cost(key) + _ENTRY_COST
        kind = type(value)
        if kind is str:
            cost += (
                len(value) + 2 if value.isascii() and value.isprintable() else 6 * len(value) + 2
            )
        elif kind is int or kind is float or kind is bool:
            cost += 24
        else:
            cost += json_cost(value)
    return cost


# -- spans ----------------------------------------------------------------------------------


def span_cost(span: ReadableSpan) -> int:
    """Worst-case JSON bytes of ``span``'s strings and values (rule 3's measure); the ids,
    times and resource are not counted (a few hundred bytes)."""
    attributes = getattr(span, "_attributes", None)
    events = getattr(span, "_events", None)
    links = getattr(span, "_links", None)
    cost = 400 + json_cost(span.name)
    cost += _attributes_cost(span.attributes if attributes is None else attributes)
    description = span.status.description
    if description:
        cost += json_cost(description)
    for event in span.events if events is None else events:
        cost += 40 + json_cost(event.name) + _attributes_cost(event.attributes)
    for link in span.links if links is None else links:
        cost += 80 + _attributes_cost(link.attributes)
    return cost


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
    # The SDK's private fields where it has them: its properties copy lists under a lock,
    # and this runs for every span an exporter or the JSON lines see.
    name = getattr(span, "_name", None) or span.name
    status = span.status
    description = status.description
    events = getattr(span, "_events", None)
    events = span.events if events is None else events
    links = getattr(span, "_links", None)
    links = span.links if links is None else links
    attributes = getattr(span, "_attributes", None)
    if attributes is None:
        attributes = span.attributes
    changed = (
        type(name) is not str
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
            values += len(link.attributes or ())
            changed = changed or _needs_work(link.attributes, limit)
    if not changed:
        # Each string is within the limit: only many values can exceed the budget.
        if (
            limit is not None
            and (values + 2) * (6 * limit + 64) + 400 <= limits.record_budget_bytes
        ):
            return span
        if span_cost(span) <= limits.record_budget_bytes:
            return span
    name = safe_text(name, MAX_NAME_LENGTH)
    attributes = dict(bounded_attributes(span.attributes, limit) or {})
    if description is not None:
        description = safe_text(description, limit)
    new_events = [
        Event(
            safe_text(e.name, MAX_NAME_LENGTH),
            dict(bounded_attributes(e.attributes, limit) or {}),
            e.timestamp,
        )
        for e in events
    ]
    new_links = [Link(link.context, bounded_attributes(link.attributes, limit)) for link in links]
    draft = ReadableSpan(
        name=name,
        attributes=attributes,
        events=new_events,
        links=new_links,
        status=Status(status.status_code, description),
    )
    if span_cost(draft) > limits.record_budget_bytes:
        name, attributes, description, new_events = _fit_record(
            name, attributes, description, new_events, new_links, limits.record_budget_bytes
        )
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=new_events,
        links=new_links,
        kind=span.kind,
        status=Status(status.status_code, description),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _fit_record(name, attributes, description, events, links, budget):
    """Cuts the longest strings of a span alike (water-filling) until its cost fits
    ``budget``; if even strings of :data:`_MIN_CUT` characters do not fit, drops events
    (keeping exception events, then the first ones). Costs count 6 bytes a character, the
    worst case, so that a fit here is a fit for any content."""
    mappings = [attributes, *(e.attributes or {} for e in events)]
    lengths = [len(name)] + ([len(description)] if description else [])
    for mapping in mappings:
        for value in mapping.values():
            lengths.extend(_string_lengths(value))
    fixed = _fixed_cost(attributes, events, links)
    cap = _water_level(lengths, max(0, budget - fixed) // 6)
    if cap < _MIN_CUT:
        cap = _MIN_CUT
        events = _fewer_events(events, budget - 400 - _attributes_cost_at(attributes, cap))

    def cut(value):
        if type(value) is str:
            return _cut(value, cap) if len(value) > cap else value
        if type(value) is tuple:
            return tuple(cut(v) for v in value)
        return value

    attributes = {k: cut(v) for k, v in attributes.items()}
    description = cut(description) if description else description
    events = [
        Event(e.name, {k: cut(v) for k, v in (e.attributes or {}).items()}, e.timestamp)
        for e in events
    ]
    return cut(name), attributes, description, events


def _string_lengths(value) -> list[int]:
    if type(value) is str:
        return [len(value)]
    if type(value) is tuple:
        return [len(v) for v in value if type(v) is str]
    return []


def _non_string_cost(value) -> int:
    if type(value) is str:
        return 2
    if type(value) is tuple:
        return 2 + sum(2 + (0 if type(v) is str else json_cost(v)) for v in value)
    return json_cost(value)


def _fixed_cost(attributes, events, links) -> int:
    """What a record costs apart from the characters of its strings: keys, numbers, quotes,
    structure."""

    def mapping_cost(mapping) -> int:
        return sum(
            json_cost(k) + _ENTRY_COST + _non_string_cost(v) for k, v in (mapping or {}).items()
        )

    cost = 400 + mapping_cost(attributes)
    for event in events:
        cost += 40 + json_cost(event.name) + mapping_cost(event.attributes)
    for link in links:
        cost += 80 + _attributes_cost(link.attributes)
    return cost


def _attributes_cost_at(mapping, cap: int) -> int:
    """The cost of ``mapping`` once its strings are cut to ``cap`` characters."""
    return sum(
        json_cost(k)
        + _ENTRY_COST
        + _non_string_cost(v)
        + 6 * sum(min(n, cap) for n in _string_lengths(v))
        for k, v in (mapping or {}).items()
    )


def _water_level(lengths: Sequence[int], total: int) -> int:
    """The largest cap ``c`` with ``sum(min(length, c)) <= total``."""
    ordered = sorted(lengths)
    used = 0
    for i, length in enumerate(ordered):
        left = len(ordered) - i
        if used + length * left > total:
            return (total - used) // left
        used += length
    return ordered[-1] if ordered else 0


def _fewer_events(events: list, budget: int) -> list:
    """Events that fit ``budget`` (at the minimum cut): exception events first, then the
    earliest; their order is kept."""
    ranked = sorted(range(len(events)), key=lambda i: (events[i].name != "exception", i))
    kept, used = set(), 0
    for i in ranked:
        cost = 40 + json_cost(events[i].name) + _attributes_cost_at(events[i].attributes, _MIN_CUT)
        if used + cost > budget:
            break
        kept.add(i)
        used += cost
    return [event for i, event in enumerate(events) if i in kept]


def finite_or_text(value: float) -> float | str:
    """A float as JSON can carry it: itself when finite, else ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"`` (the spelling of the OTLP/JSON mapping)."""
    if value - value == 0.0:
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
