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

:func:`bounded_span` applies rules 1-4 to a finished span, :func:`bounded_log_record` to a
log record (its body and attribute values may also be bytes, maps and nested lists:
:func:`bounded_any`), on an exporter's thread, never on the training thread. Nothing here
raises.
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
    "MAX_VALUE_DEPTH",
    "RECORD_BUDGET_BYTES",
    "Limits",
    "any_cost",
    "bounded_any",
    "bounded_attributes",
    "bounded_log_record",
    "bounded_span",
    "bounded_value",
    "cut_marker",
    "json_cost",
    "log_record_cost",
    "plain",
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


def plain(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """The dict inside the SDK's ``BoundedAttributes`` (whose ``items()`` goes through a lock
    and ``__getitem__`` per key), else the mapping itself."""
    inner = getattr(mapping, "_dict", None)
    return inner if type(inner) is dict else mapping


#: Attribute keys found clean before: a run uses few keys, and each is checked once.
_CLEAN_KEYS: set[str] = set()
_MAX_CLEAN_KEYS = 4096


def _needs_work(attributes: Mapping[str, Any] | None, limit: int | None) -> bool:
    if not attributes:
        return False
    clean_keys = _CLEAN_KEYS
    for key, value in plain(attributes).items():
        if key not in clean_keys:
            if type(key) is not str or not _is_clean(key, MAX_NAME_LENGTH):
                return True
            if len(clean_keys) < _MAX_CLEAN_KEYS:
                clean_keys.add(key)
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
    for key, value in plain(attributes).items():  # json_cost inlined: runs for every span
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


# -- log records ----------------------------------------------------------------------------

#: Levels of nesting kept of a log body or attribute value (maps and lists in maps...); a
#: deeper value is written as its bounded ``str()``.
MAX_VALUE_DEPTH: Final = 8


def bounded_any(value: Any, limit: int | None = DEFAULT_VALUE_LENGTH, _depth: int = 0) -> Any:
    """A log body or log attribute value (OTLP ``AnyValue``: also bytes, maps and nested
    lists) after rules 1, 2 and 4: strings escaped and cut, bytes cut (ending with the
    marker's bytes), integers beyond int64 as floats, maps and lists cut to
    :data:`MAX_SEQUENCE_LENGTH` items and :data:`MAX_VALUE_DEPTH` levels, map keys as names;
    anything else as its bounded ``str()``. Never raises."""
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return value
    if kind is str:
        return value if _is_clean(value, limit) else safe_text(value, limit)
    if kind is int:
        return value if _INT64_MIN <= value <= _INT64_MAX else float(value)
    if kind is bytes:
        if limit is None or len(value) <= limit:
            return value
        marker = cut_marker(len(value) - limit).encode("ascii")
        if limit <= len(marker) + 8:
            return value[:limit]
        keep = limit - len(marker)
        return value[:keep] + cut_marker(len(value) - keep).encode("ascii")
    if _depth >= MAX_VALUE_DEPTH:
        return safe_text(value, limit)
    try:
        if isinstance(value, Mapping):
            items = list(value.items())[:MAX_SEQUENCE_LENGTH]
            return {
                safe_text(k, MAX_NAME_LENGTH): bounded_any(v, limit, _depth + 1) for k, v in items
            }
        if isinstance(value, (list, tuple)):
            return tuple(bounded_any(v, limit, _depth + 1) for v in value[:MAX_SEQUENCE_LENGTH])
        if isinstance(value, (bool, int, float)):  # numpy scalars and other subclasses
            return bounded_value(value, limit)
    except Exception:  # a container that changed or misbehaved under us
        pass
    return safe_text(value, limit)


def _any_needs_work(value: Any, limit: int | None, depth: int = 0) -> bool:
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return False
    if kind is str:
        return not _is_clean(value, limit)
    if kind is int:
        return not _INT64_MIN <= value <= _INT64_MAX
    if kind is bytes:
        return limit is not None and len(value) > limit
    if depth >= MAX_VALUE_DEPTH:
        return True
    if kind is tuple or kind is list:
        return len(value) > MAX_SEQUENCE_LENGTH or any(
            _any_needs_work(v, limit, depth + 1) for v in value
        )
    if kind is dict:
        return len(value) > MAX_SEQUENCE_LENGTH or any(
            type(k) is not str
            or not _is_clean(k, MAX_NAME_LENGTH)
            or _any_needs_work(v, limit, depth + 1)
            for k, v in value.items()
        )
    return True


def any_cost(value: Any) -> int:
    """An upper bound of the bytes ``value`` (an ``AnyValue``) takes as OTLP/JSON, in the
    unit of rule 3 (:func:`json_cost`); maps cost their keys and :data:`_ENTRY_COST` per
    entry, bytes their base64."""
    kind = type(value)
    if kind is str:
        return json_cost(value)
    if kind is bytes:
        return 4 * (len(value) + 2) // 3 + 2
    if kind is tuple or kind is list:
        return 2 + sum(any_cost(v) + 1 for v in value)
    if kind is dict:
        return 2 + sum(json_cost(k) + _ENTRY_COST + any_cost(v) for k, v in value.items())
    return 24


def log_record_cost(record: Any) -> int:
    """Worst-case JSON bytes of a ``ReadableLogRecord``'s strings and values (rule 3's
    measure); ids, times and the resource are not counted (a few hundred bytes)."""
    log_record = record.log_record
    cost = 300 + any_cost(log_record.body)
    attributes = log_record.attributes
    if attributes:
        cost += 2 + sum(
            json_cost(k) + _ENTRY_COST + any_cost(v) for k, v in plain(attributes).items()
        )
    for text in (log_record.severity_text, getattr(log_record, "event_name", None)):
        if text:
            cost += json_cost(text) if type(text) is str else 24
    return cost


def bounded_log_record(record: Any, limits: Limits = DEFAULT_LIMITS) -> Any:
    """A ``ReadableLogRecord`` after rules 1-4 (body, attribute keys and values, severity
    text, event name and the scope's name), as a new record when anything changed, else the
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
    event_name = getattr(log_record, "event_name", None)
    scope = record.instrumentation_scope
    changed = (
        _any_needs_work(body, limit)
        or any(
            type(k) is not str or not _is_clean(k, MAX_NAME_LENGTH) or _any_needs_work(v, limit)
            for k, v in attributes.items()
        )
        or (severity_text is not None and not _is_clean_name(severity_text))
        or (event_name is not None and not _is_clean_name(event_name))
    )
    scope_changed = scope is not None and not _is_clean_name(scope.name)
    budget = limits.record_budget_bytes
    if not changed and not scope_changed:
        primitive = type(body) in (str, int, float, bool, type(None)) and all(
            type(v) in (str, int, float, bool) for v in attributes.values()
        )
        if (
            primitive
            and limit is not None
            and (len(attributes) + 2) * (6 * limit + 64) + 400 <= budget
        ):
            return record
        if log_record_cost(record) <= budget:
            return record
    body = bounded_any(body, limit)
    cleaned = {safe_text(k, MAX_NAME_LENGTH): bounded_any(v, limit) for k, v in attributes.items()}
    if severity_text is not None:
        severity_text = safe_text(severity_text, MAX_NAME_LENGTH)
    if event_name is not None:
        event_name = safe_text(event_name, MAX_NAME_LENGTH)
    body, cleaned = _fit_log_record(body, cleaned, budget)
    dropped = getattr(log_record.attributes, "dropped", 0)
    new_attributes = BoundedAttributes(maxlen=None, attributes=cleaned, immutable=True)
    new_attributes.dropped = dropped
    new_record = copy.copy(log_record)
    new_record.body = body
    new_record.attributes = new_attributes
    new_record.severity_text = severity_text
    if event_name is not None:
        new_record.event_name = event_name
    changes: dict[str, Any] = {"log_record": new_record}
    if scope_changed:
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        changes["instrumentation_scope"] = InstrumentationScope(
            safe_text(scope.name, MAX_NAME_LENGTH),
            scope.version,
            scope.schema_url,
            scope.attributes,
        )
    return dataclasses.replace(record, **changes)


def _is_clean_name(value: Any) -> bool:
    return type(value) is str and _is_clean(value, MAX_NAME_LENGTH)


def _fit_log_record(body: Any, attributes: dict[str, Any], budget: int) -> tuple[Any, dict]:
    """Cuts the longest strings of a log record's body and attributes alike (water-filling)
    until its worst-case cost fits ``budget``; a record that does not fit even then (very
    many values) keeps the attributes that fit, in order, and its body as bounded text."""

    def cost() -> int:
        return (
            300
            + any_cost(body)
            + 2
            + sum(json_cost(k) + _ENTRY_COST + any_cost(v) for k, v in attributes.items())
        )

    if cost() <= budget:
        return body, attributes
    lengths: list[int] = []
    _any_string_lengths(body, lengths)
    for value in attributes.values():
        _any_string_lengths(value, lengths)
    # What the record costs with every string empty: keys, numbers, quotes, structure.
    fixed = (
        300
        + any_cost(_cut_any(body, 0))
        + 2
        + sum(json_cost(k) + _ENTRY_COST + any_cost(_cut_any(v, 0)) for k, v in attributes.items())
    )
    cap = max(_MIN_CUT, _water_level(lengths, max(0, budget - fixed) // 6))
    body = _cut_any(body, cap)
    attributes = {k: _cut_any(v, cap) for k, v in attributes.items()}
    if cost() <= budget:
        return body, attributes
    kept: dict[str, Any] = {}
    used = 300
    for key, value in attributes.items():
        entry = json_cost(key) + _ENTRY_COST + any_cost(value)
        if used + entry > budget // 2:
            break
        kept[key] = value
        used += entry
    attributes = kept
    text = body if type(body) is str else safe_text(body, None)
    body = _cut(text, max(_MIN_CUT, (budget - used) // 6 - 8)) if len(text) > _MIN_CUT else text
    return body, attributes


def _any_string_lengths(value: Any, out: list[int]) -> None:
    kind = type(value)
    if kind is str:
        out.append(len(value))
    elif kind is tuple or kind is list:
        for v in value:
            _any_string_lengths(v, out)
    elif kind is dict:
        for v in value.values():
            _any_string_lengths(v, out)


def _cut_any(value: Any, cap: int) -> Any:
    kind = type(value)
    if kind is str:
        return _cut(value, cap) if len(value) > cap else value
    if kind is tuple or kind is list:
        return tuple(_cut_any(v, cap) for v in value)
    if kind is dict:
        return {k: _cut_any(v, cap) for k, v in value.items()}
    return value
