"""What leaves the process is bounded and always encodes: one rule for every string.

Every string that otel-training hands to an exporter or writes to a file goes through one
function, :func:`safe_text`, so that one odd value never costs a batch, a line or a request.
That covers span names, status descriptions, event names, attribute keys and values (of spans,
events, links, log records, metric points and exemplars), log bodies, severity texts and event
names, metric names, units and descriptions, instrumentation scope names, versions, schema URLs
and attributes, and resource keys, values and schema URLs:

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
3. **Bounded records.** All strings and values of one span or log record together are bounded
   by :data:`RECORD_BUDGET_BYTES` of their worst-case JSON size (:func:`json_cost`): when a
   record is larger, its longest strings are cut further, alike; if that is not enough, events
   beyond what fits are dropped (exception events kept first), then items of sequences, then
   attributes. So a span JSON line stays under 1 MiB (the collector's filelog receiver's
   default) and one span under 1 MiB of protobuf.
4. **Any number.** Integers outside int64 (all OTLP carries) become floats; sequences keep at
   most :data:`MAX_SEQUENCE_LENGTH` items.

:func:`bounded_span` applies rules 1-4 to a finished span, :func:`bounded_log_record` to a log
record (its body and attribute values may also be bytes, maps and nested lists:
:func:`bounded_any`), :func:`bounded_metrics_data` to a collection of metrics; each also bounds
the record's instrumentation scope (:func:`bounded_scope`) and resource
(:func:`bounded_resource`). They run on an exporter's thread, never on the training thread.
Nothing here raises.

The worst-case JSON size is what Python's ``json`` (the OTLP-JSON files) and orjson (the span
JSON lines) can make of a string: 6 bytes a UTF-16 code unit outside printable ASCII (``\\u0001``;
a character beyond U+FFFF is two units, ``\\ud83d\\ude00``, 12 bytes), 2 for ``"`` and ``\\``, 1
for any other printable ASCII character; it bounds protobuf (at most 4 bytes a character) too.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, Status

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_VALUE_LENGTH",
    "GROUP_BUDGET_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_SEQUENCE_LENGTH",
    "MAX_VALUE_DEPTH",
    "RECORD_BUDGET_BYTES",
    "Limits",
    "any_cost",
    "bounded_any",
    "bounded_attributes",
    "bounded_log_record",
    "bounded_metrics_data",
    "bounded_resource",
    "bounded_scope",
    "bounded_span",
    "bounded_value",
    "cut_marker",
    "json_cost",
    "log_record_cost",
    "metric_point_cost",
    "plain",
    "python_number",
    "safe_text",
    "scope_cost",
    "span_cost",
]

#: Characters kept of a string value when no ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` is set.
DEFAULT_VALUE_LENGTH: Final = 16_384
#: Characters kept of names and keys: span, event and metric names, units, attribute keys,
#: scope names, versions and schema URLs.
MAX_NAME_LENGTH: Final = 1_024
#: Worst-case JSON bytes of the strings and values of one span, log record or metric point
#: together.
RECORD_BUDGET_BYTES: Final = 900_000
#: Worst-case JSON bytes of one resource or one instrumentation scope, which a request carries
#: once for the records it groups: a record at its budget, its resource and its scope stay
#: under 1 MiB together.
GROUP_BUDGET_BYTES: Final = 48 * 1024
#: Items kept of a sequence value.
MAX_SEQUENCE_LENGTH: Final = 1_024
#: Levels of nesting kept of a log body or attribute value (maps and lists in maps...); a
#: deeper value is written as its bounded ``str()``.
MAX_VALUE_DEPTH: Final = 8

# Worst-case OTLP/JSON bytes of the structure around the strings, measured on the output of
# the OTLP-JSON file exporter (tests/export/test_limits.py checks them against real output):
#: one attribute beyond its key and value: ``{"key":...,"value":{"stringValue":...}},``.
_ENTRY_COST = 40
#: one item of a sequence beyond its value: ``{"stringValue":...},``.
_ITEM_COST = 28
#: a number or boolean: ``"-9223372036854775808"``, ``-1.7976931348623157e+308``.
_NUMBER_COST = 32
#: a span without its strings: ids, times, kind, flags, status, the lists' brackets.
_SPAN_COST = 400
#: an event beyond its name and attributes: its time and brackets.
_EVENT_COST = 60
#: a link beyond its attributes: two ids, flags, trace state, brackets.
_LINK_COST = 110
#: a log record without its body and attributes: ids, times, severity, brackets.
_LOG_RECORD_COST = 300
#: a metric point without its attributes and buckets: times, value, flags, brackets.
_POINT_COST = 160
#: a metric beyond its name, unit and description: its kind, temporality and brackets.
_METRIC_COST = 120
#: an instrumentation scope or resource beyond its strings and attributes.
_SCOPE_COST = 60
#: Fewest characters a string is cut to when a record is over its budget.
_MIN_CUT = 32

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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


#: Each lone surrogate's escape: ``\\xNN`` for U+DC80..U+DCFF (the bytes ``os.fsdecode``
#: could not decode), ``\\uDXXX`` for any other (``str.translate`` applies it at C speed).
_ESCAPES: Final = {
    code: f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"
    for code in range(0xD800, 0xE000)
}


def safe_text(value: Any, limit: int | None = DEFAULT_VALUE_LENGTH) -> str:
    """``value`` as a string every encoder accepts, at most ``limit`` characters (rules 1-2):
    the one string rule of otel-training (docs/limits.md), which every exporter, the span JSON
    lines, the logging bridge and the phases apply through this function.

    Args:
        value: Anything; not a ``str``: its ``str()``, ``<TypeName>`` when that raises.
        limit: Characters kept, after escaping; ``None``: no cut.

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
            value.encode()  # UTF-8
        except UnicodeEncodeError:
            if limit is not None and len(value) > limit:
                escaped = _escaped_length(value)
                if escaped is not None:  # escape only the head that is kept
                    return _cut(value[:limit].translate(_ESCAPES), limit, escaped)
            value = value.translate(_ESCAPES)
    if limit is not None and len(value) > limit:
        value = _cut(value, limit)
    return value


def _escaped_length(text: str) -> int | None:
    """The length of ``text`` once its lone surrogates are escaped, counted by the codecs at
    C speed (``\\xNN`` is 4 characters, ``\\uDXXX`` 6); None when that cannot be told
    cheaply (surrogates beyond U+DC80..U+DCFF: escape it all)."""
    try:
        kept = len(text.encode("utf-8", "ignore"))  # without the surrogates
        bytes_ = len(text.encode("utf-8", "surrogateescape")) - kept  # one byte each
    except UnicodeEncodeError:
        return None
    return len(text) + 3 * bytes_


def _cut(text: str, limit: int, length: int | None = None) -> str:
    """``text`` cut to ``limit`` characters, its end the marker; ``length``: the length of
    the whole of which ``text`` is the head (its own by default)."""
    length = len(text) if length is None else length
    keep = limit
    for _ in range(3):  # the marker's count has one digit more at most once
        marker = cut_marker(length - keep)
        keep = limit - len(marker)
        if keep + len(cut_marker(length - keep)) <= limit:
            break
    if keep < 8:  # no room for a marker that says so: a plain cut
        return text[:limit]
    return text[:keep] + cut_marker(length - keep)


def _is_clean(value: str, limit: int | None) -> bool:
    """True when ``value`` needs nothing of rules 1-2 (the common case, checked cheaply)."""
    if limit is not None and len(value) > limit:
        return False
    if value.isascii():
        return True
    try:
        value.encode()  # UTF-8
    except UnicodeEncodeError:
        return False
    return True


def _is_clean_name(value: Any) -> bool:
    return type(value) is str and _is_clean(value, MAX_NAME_LENGTH)


def _safe_name(value: Any) -> str:
    return value if _is_clean_name(value) else safe_text(value, MAX_NAME_LENGTH)


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
    number = python_number(value)
    if number is not None:
        return bounded_value(number)  # a bool, an int or a float: nothing to cut
    return safe_text(value, limit)


def python_number(value: Any) -> bool | int | float | None:
    """The plain Python ``bool``, ``int`` or ``float`` that a number stands for: itself, a
    subclass's value (``IntEnum``, ``numpy.float64``) or a numpy scalar's or one-element
    array's (``numpy.float32``, ``numpy.int64``, ``numpy.bool_`` are no subclasses); else
    ``None`` (tensors are :func:`otel_training.trace.span_values.host_number`'s). Never raises."""
    try:
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if type(value).__module__ == "numpy" and hasattr(value, "item"):
            item = value.item()
            if type(item) in (bool, int, float):
                return item
    except Exception:  # a subclass whose conversion raises: its text instead
        pass
    return None


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


# -- scopes and resources: few objects, each bounded once -----------------------------------

# By (id, value-length limit): one resource is bounded for each signal's limit.
_BOUNDED: dict[tuple[int, int | None], tuple[Any, Any]] = {}
_MAX_BOUNDED = 1024


def _remember(original: Any, limit: int | None, bounded: Any) -> Any:
    if len(_BOUNDED) >= _MAX_BOUNDED:
        _BOUNDED.clear()
    # The original is held, so its id is not reused while it is here.
    _BOUNDED[(id(original), limit)] = (original, bounded)
    return bounded


def bounded_scope(
    scope: InstrumentationScope | None, limit: int | None = DEFAULT_VALUE_LENGTH
) -> InstrumentationScope | None:
    """An instrumentation scope with its name, version and schema URL as names (rules 1-2 at
    :data:`MAX_NAME_LENGTH`), its attributes bounded and, all together, under
    :data:`GROUP_BUDGET_BYTES` (rule 3); the same object when nothing needed a change
    (checked once per scope object). Never raises."""
    if scope is None:
        return None
    known = _BOUNDED.get((id(scope), limit))
    if known is not None and known[0] is scope:
        return known[1]
    try:
        name, version, schema_url = scope.name, scope.version, scope.schema_url
        attributes = scope.attributes
        if (
            _is_clean_name(name)
            and (version is None or _is_clean_name(version))
            and (schema_url is None or _is_clean_name(schema_url))
            and not _needs_work(attributes, limit)
            and scope_cost(scope) <= GROUP_BUDGET_BYTES
        ):
            return _remember(scope, limit, scope)
        name = _safe_name(name)
        version = None if version is None else _safe_name(version)
        schema_url = None if schema_url is None else _safe_name(schema_url)
        attributes = _fit_attributes(
            dict(bounded_attributes(attributes, limit) or {}),
            GROUP_BUDGET_BYTES - _group_cost(name, version, schema_url),
        )
        bounded = InstrumentationScope(name, version, schema_url, attributes)
    except Exception:  # a scope that cannot even be read: named for what it is
        bounded = InstrumentationScope("<unreadable scope>")
    return _remember(scope, limit, bounded)


def bounded_resource(resource: Resource | None, limit: int | None = DEFAULT_VALUE_LENGTH) -> Any:
    """A resource with its keys, values and schema URL after rules 1, 2 and 4, all together
    under :data:`GROUP_BUDGET_BYTES` (rule 3); the same object when nothing needed a change
    (checked once per resource object). Never raises."""
    if resource is None:
        return None
    known = _BOUNDED.get((id(resource), limit))
    if known is not None and known[0] is resource:
        return known[1]
    try:
        attributes = resource.attributes
        schema_url = resource.schema_url
        if (
            not _needs_work(attributes, limit)
            and (schema_url is None or _is_clean_name(schema_url))
            and scope_cost(resource) <= GROUP_BUDGET_BYTES
        ):
            return _remember(resource, limit, resource)
        schema_url = None if schema_url is None else _safe_name(schema_url)
        attributes = _fit_attributes(
            dict(bounded_attributes(attributes, limit) or {}),
            GROUP_BUDGET_BYTES - _group_cost(schema_url),
        )
        bounded = Resource(attributes, schema_url)
    except Exception:
        bounded = Resource({})
    return _remember(resource, limit, bounded)


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


# -- worst-case sizes -------------------------------------------------------------------------


def json_cost(value: Any) -> int:
    """An upper bound of the bytes ``value`` takes as JSON, quotes included (the unit of rule
    3): a string costs 6 bytes a UTF-16 code unit unless it is printable ASCII (1 a character,
    2 for ``"`` and ``\\``), a number or boolean :data:`_NUMBER_COST`, a sequence its items
    and :data:`_ITEM_COST` each. With :data:`_ENTRY_COST` per attribute it bounds OTLP/JSON,
    the span JSON lines and protobuf alike."""
    kind = type(value)
    if kind is str:
        if value.isascii():
            if value.isprintable():
                return len(value) + value.count('"') + value.count("\\") + 2
            return 6 * len(value) + 2
        if _wide(value):  # two UTF-16 units, two \\uXXXX escapes each
            return 6 * (len(value.encode("utf-16-le", "surrogatepass")) // 2) + 2
        return 6 * len(value) + 2
    if kind is tuple or kind is list:
        return 2 + sum(json_cost(v) + _ITEM_COST for v in value)
    return _NUMBER_COST


def _wide_by_size(text: str) -> bool:
    return sys.getsizeof(text) >= _STR_BASE + 4 * (len(text) + 1)


def _wide_by_scan(text: str) -> bool:
    return max(text, default="") > "\uffff"


# CPython stores a str at 1, 2 or 4 bytes a character, 4 only when one is beyond U+FFFF, so
# its size says in O(1) what max() finds in O(n). A str that also holds its UTF-8 may look
# wide when it is not: the estimate is then higher, never lower. Elsewhere, a scan.
_STR_BASE = sys.getsizeof("\U00010000") - 8
_wide = (
    _wide_by_size
    if _wide_by_size("\U0001f600" * 3)
    and not _wide_by_size("\u00e9" * 3)
    and not _wide_by_size("\u0100" * 3)
    and not _wide_by_size("\udc80" * 3)
    else _wide_by_scan
)


def _char_cost(text: str) -> int:
    """The most JSON bytes one character of ``text`` (or of any prefix of it) takes."""
    if text.isascii():
        if text.isprintable():
            return 2 if '"' in text or "\\" in text else 1
        return 6
    return 12 if _wide(text) else 6


def _attributes_cost(attributes: Mapping[str, Any] | None) -> int:
    """Worst-case JSON bytes of ``attributes``: their braces, and each key and value with
    :data:`_ENTRY_COST`."""
    if not attributes:
        return 2
    return 2 + sum(
        json_cost(key) + _ENTRY_COST + json_cost(value) for key, value in plain(attributes).items()
    )


def scope_cost(scope: Any) -> int:
    """Worst-case JSON bytes of an instrumentation scope or a resource (name, version, schema
    URL, attributes), which a request carries once for the records it groups."""
    if scope is None:
        return 2
    texts = (getattr(scope, field, None) for field in ("name", "version", "schema_url"))
    return _group_cost(*texts) + _attributes_cost(scope.attributes)


def _group_cost(*texts: Any) -> int:
    """A scope's or resource's cost without its attributes: :data:`_SCOPE_COST` and its
    ``texts`` (name, version, schema URL) that are not empty (a number as a number)."""
    return _SCOPE_COST + sum(json_cost(text) for text in texts if text)


# -- spans ----------------------------------------------------------------------------------


def span_cost(span: ReadableSpan) -> int:
    """Worst-case JSON bytes of ``span``'s strings and values (rule 3's measure); its resource
    and scope are not counted (a request carries each once: :func:`scope_cost`)."""
    name, attributes, events, links = _parts(span)
    return _span_cost(name, span.status.description, attributes, events, links, span.context)


def _span_cost(
    name: Any,
    description: str | None,
    attributes: Mapping[str, Any] | None,
    events: Sequence[Event],
    links: Sequence[Link],
    context: Any,
) -> int:
    """:func:`span_cost` of a span's parts."""
    cost = _SPAN_COST + json_cost(name) + _attributes_cost(attributes) + _events_cost(events)
    if description:
        cost += json_cost(description)
    for link in links:
        cost += _LINK_COST + _attributes_cost(link.attributes)
    return cost + _trace_states_cost(context, links)


def _parts(span: ReadableSpan) -> tuple[Any, Any, Sequence[Event], Sequence[Link]]:
    """A span's name, attributes, events and links: the SDK's private fields where it has
    them (its properties copy the lists, and read attributes through a lock per key; this runs
    for every span an exporter or the JSON lines see), else the properties."""
    name = getattr(span, "_name", None)
    attributes = getattr(span, "_attributes", None)
    events = getattr(span, "_events", None)
    links = getattr(span, "_links", None)
    return (
        span.name if name is None else name,
        span.attributes if attributes is None else attributes,
        span.events if events is None else events,
        span.links if links is None else links,
    )


def _trace_states_cost(context: Any, links: Sequence[Link]) -> int:
    """Worst-case JSON bytes of the trace states of a span's ``context`` and its ``links``:
    twice the header (each character escaped at worst, ASCII) + 2 each."""
    cost = 0
    for state in (c.trace_state for c in (context, *(k.context for k in links)) if c is not None):
        if state:
            cost += 2 * len(state.to_header()) + 2
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


def _quick_bound(slots: int, limit: int) -> int:
    """An upper bound, in O(1), of the cost of ``slots`` attributes, texts, events or links
    that need no escaping or cut (each name within :data:`MAX_NAME_LENGTH`, each value within
    ``limit`` characters): 12 bytes a character of both, 128 a slot for its framing."""
    return slots * (12 * (MAX_NAME_LENGTH + limit) + 128)


def _plain_bound(texts: Sequence[Any], attributes: Mapping[str, Any] | None) -> int:
    """A quick upper bound of the cost of a span (or log record) without events and links
    whose ``texts`` (name, description...) and attribute values are strings or numbers, else
    one too high to pass (:func:`span_cost` then decides): 12 bytes a character, 128 a
    value."""
    chars = 0
    for text in texts:
        if text is not None:
            if type(text) is not str:
                return sys.maxsize
            chars += len(text)
    values = plain(attributes) if attributes else {}
    for key, value in values.items():
        kind = type(value)
        if kind is str:
            chars += len(key) + len(value)
        elif kind is int or kind is float or kind is bool:
            chars += len(key)
        else:
            return sys.maxsize
    return 12 * chars + 128 * len(values) + _SPAN_COST


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


def _events_cost(events: Sequence[Event]) -> int:
    return sum(_EVENT_COST + json_cost(e.name) + _attributes_cost(e.attributes) for e in events)


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


# -- log records ----------------------------------------------------------------------------


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
        marker = cut_marker(len(value) - limit).encode()
        if limit <= len(marker) + 8:
            return value[:limit]
        keep = limit - len(marker)
        return value[:keep] + cut_marker(len(value) - keep).encode()
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
        number = python_number(value)  # numpy scalars and other subclasses
        if number is not None:
            return bounded_value(number)
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
    entry, lists :data:`_ITEM_COST` per item, bytes their base64."""
    kind = type(value)
    if kind is str:
        return json_cost(value)
    if kind is bytes:
        return 4 * (len(value) + 2) // 3 + 2
    if kind is tuple or kind is list:
        return 2 + sum(any_cost(v) + _ITEM_COST for v in value)
    if kind is dict:
        return 2 + sum(json_cost(k) + _ENTRY_COST + any_cost(v) for k, v in value.items())
    return _NUMBER_COST


def log_record_cost(record: Any) -> int:
    """Worst-case JSON bytes of a ``ReadableLogRecord``'s strings and values (rule 3's
    measure); its resource and scope are not counted (a request carries each once)."""
    log_record = record.log_record
    cost = _LOG_RECORD_COST + any_cost(log_record.body)
    attributes = log_record.attributes
    if attributes:
        cost += 2 + sum(
            json_cost(k) + _ENTRY_COST + any_cost(v) for k, v in plain(attributes).items()
        )
    for text in (log_record.severity_text, log_record.event_name):
        if text:
            cost += json_cost(text)  # a number as a number
    return cost


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


# -- metrics --------------------------------------------------------------------------------


def metric_point_cost(point: Any) -> int:
    """Worst-case JSON bytes of one metric data point: its attributes, exemplars and
    buckets (rule 3's measure for metrics, used to split a collection into requests)."""
    cost = _POINT_COST + _attributes_cost(point.attributes)
    for counts in ("bucket_counts", "explicit_bounds"):
        values = getattr(point, counts, None)
        if values:
            cost += (_NUMBER_COST + 1) * len(values)
    for side in ("positive", "negative"):
        buckets = getattr(point, side, None)
        if buckets is not None:
            cost += (_NUMBER_COST + 1) * len(getattr(buckets, "bucket_counts", ()) or ())
    for exemplar in point.exemplars:
        cost += _POINT_COST + _attributes_cost(exemplar.filtered_attributes)
    return cost


def metric_cost(metric: Any) -> int:
    """Worst-case JSON bytes of a metric without its points: name, unit, description."""
    return (
        _METRIC_COST
        + json_cost(metric.name)
        + json_cost(metric.unit or "")
        + json_cost(metric.description or "")
    )


def bounded_metrics_data(
    data: Any, limits: Limits = DEFAULT_LIMITS, saturated: list[str] | None = None
) -> Any:
    """A ``MetricsData`` after rules 1, 2 and 4: resources and scopes bounded
    (:func:`bounded_resource`, :func:`bounded_scope`), metric names and units as names,
    descriptions as values, point and exemplar attributes bounded, and integer points beyond
    int64 saturated at its ends (the name of each such metric is appended to ``saturated``).
    The same object when nothing needed a change. Runs on the reader's thread; never raises
    (data that cannot even be read is returned as it is)."""
    try:
        if not _metrics_need_work(data, limits):
            return data
        return _bounded_metrics_data(data, limits, saturated)
    except Exception:
        return data


def _metrics_need_work(data: Any, limits: Limits) -> bool:
    limit, budget = limits.value_length, limits.record_budget_bytes
    for resource_metrics in data.resource_metrics:
        if bounded_resource(resource_metrics.resource, limit) is not resource_metrics.resource:
            return True
        for scope_metrics in resource_metrics.scope_metrics:
            if bounded_scope(scope_metrics.scope, limit) is not scope_metrics.scope:
                return True
            for metric in scope_metrics.metrics:
                if not (
                    _is_clean_name(metric.name)
                    and _is_clean_name(metric.unit or "")
                    and _is_clean_name(metric.description or "")
                ):
                    return True
                for point in metric.data.data_points:
                    if _needs_work(point.attributes, limit):
                        return True
                    value = getattr(point, "value", None)
                    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
                        return True
                    for exemplar in point.exemplars:
                        if _needs_work(exemplar.filtered_attributes, limit):
                            return True
                    if metric_point_cost(point) > budget:
                        return True
    return False


def _bounded_metrics_data(data: Any, limits: Limits, saturated: list[str] | None) -> Any:
    import dataclasses

    from opentelemetry.sdk.metrics.export import MetricsData

    limit, budget = limits.value_length, limits.record_budget_bytes

    def point(p: Any, metric_name: str) -> Any:
        changes: dict[str, Any] = {}
        attributes = bounded_attributes(p.attributes, limit)
        cost = metric_point_cost(p)
        if cost > budget:
            # The attributes (the series) fit the budget without the exemplars, which go
            # first (below) when the point with them is still over it.
            exemplars_cost = sum(
                _POINT_COST + _attributes_cost(e.filtered_attributes) for e in p.exemplars
            )
            attributes = _fit_attributes(
                dict(attributes or {}),
                budget - (cost - exemplars_cost - _attributes_cost(p.attributes)),
            )
        if attributes is not p.attributes:
            changes["attributes"] = attributes
        value = getattr(p, "value", None)
        if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
            changes["value"] = _INT64_MAX if value > 0 else _INT64_MIN
            if saturated is not None:
                saturated.append(metric_name)
        exemplars = p.exemplars
        if exemplars:
            changes["exemplars"] = [
                dataclasses.replace(
                    e, filtered_attributes=bounded_attributes(e.filtered_attributes, limit)
                )
                for e in exemplars
            ]
            if metric_point_cost(dataclasses.replace(p, **changes)) > budget:
                changes["exemplars"] = []  # a point over its budget keeps its value
        return dataclasses.replace(p, **changes) if changes else p

    resources = []
    for resource_metrics in data.resource_metrics:
        scopes = []
        for scope_metrics in resource_metrics.scope_metrics:
            metrics = []
            for metric in scope_metrics.metrics:
                name = _safe_name(metric.name)
                metrics.append(
                    dataclasses.replace(
                        metric,
                        name=name,
                        description=_safe_name(metric.description or ""),
                        unit=_safe_name(metric.unit or ""),
                        data=dataclasses.replace(
                            metric.data,
                            data_points=[point(p, name) for p in metric.data.data_points],
                        ),
                    )
                )
            scopes.append(
                dataclasses.replace(
                    scope_metrics, scope=bounded_scope(scope_metrics.scope, limit), metrics=metrics
                )
            )
        resources.append(
            dataclasses.replace(
                resource_metrics,
                resource=bounded_resource(resource_metrics.resource, limit),
                scope_metrics=scopes,
            )
        )
    return MetricsData(resource_metrics=resources)
