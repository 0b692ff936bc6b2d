"""The cost model of an export: worst-case JSON bytes of a string, a value and a record (rule
3's measure, :mod:`otel_training.export.limits`).

:func:`json_cost` bounds a string or an attribute value, :func:`any_cost` a log body's
``AnyValue``; :func:`span_cost`, :func:`log_record_cost`, :func:`metric_point_cost` and
:func:`metric_cost` a record without its resource and scope, and :func:`scope_cost` an
instrumentation scope or a resource, which a request carries once for the records it groups.
The bounding of each signal fits its records to these costs, and the exporters split their
batches into requests by them.

The worst-case JSON size is what Python's ``json`` (the OTLP-JSON files) and orjson (the span
JSON lines) can make of a string: 6 bytes a UTF-16 code unit outside printable ASCII (``\\u0001``;
a character beyond U+FFFF is two units, ``\\ud83d\\ude00``, 12 bytes), 2 for ``"`` and ``\\``, 1
for any other printable ASCII character; it bounds protobuf (at most 4 bytes a character) too.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link

from otel_training.export.limits.strings import MAX_NAME_LENGTH, plain

__all__ = [
    "any_cost",
    "json_cost",
    "log_record_cost",
    "metric_cost",
    "metric_point_cost",
    "scope_cost",
    "span_cost",
]

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


# -- records -------------------------------------------------------------------------------


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


def _events_cost(events: Sequence[Event]) -> int:
    return sum(_EVENT_COST + json_cost(e.name) + _attributes_cost(e.attributes) for e in events)


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


# -- quick bounds: a record that surely fits, told in O(1) or without escaping -------------


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
