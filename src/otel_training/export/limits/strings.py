"""The one string rule: any value as a string every encoder accepts, cut to its limit
(rules 1, 2 and 4 of :mod:`otel_training.export.limits`), and the sizes it cuts to.

:func:`safe_text` is the rule for one string; :func:`bounded_value` and
:func:`bounded_attributes` apply it to attribute values and attributes, :func:`bounded_any` to a
log body or log attribute value (also bytes, maps and nested lists). :func:`python_number` says
which plain number a value stands for, :func:`plain` reads the SDK's attributes without their
lock. :class:`Limits` are one signal's bounds; the sizes (:data:`DEFAULT_VALUE_LENGTH`,
:data:`MAX_NAME_LENGTH`, the budgets...) are the ones the package's docstring names. Nothing
here raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_VALUE_LENGTH",
    "GROUP_BUDGET_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_SEQUENCE_LENGTH",
    "MAX_VALUE_DEPTH",
    "RECORD_BUDGET_BYTES",
    "Limits",
    "bounded_any",
    "bounded_attributes",
    "bounded_value",
    "cut_marker",
    "plain",
    "python_number",
    "safe_text",
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
    attributes = plain(attributes)
    for key in attributes:
        if key not in clean_keys:
            if type(key) is not str or not _is_clean(key, MAX_NAME_LENGTH):
                return True
            if len(clean_keys) < _MAX_CLEAN_KEYS:
                clean_keys.add(key)
    return not _clean_items(attributes.values(), limit)


def _clean_items(items: Iterable[Any], limit: int | None) -> bool:
    """Whether every one of ``items`` is a value that :func:`bounded_value` keeps as it is: a
    clean string, an int within int64, a float, a bool, or a tuple of at most
    :data:`MAX_SEQUENCE_LENGTH` such items (the SDK keeps a sequence as a tuple)."""
    for item in items:
        kind = type(item)
        if kind is str:
            if not _is_clean(item, limit):
                return False
        elif kind is int:
            if not _INT64_MIN <= item <= _INT64_MAX:
                return False
        elif kind is tuple:
            if len(item) > MAX_SEQUENCE_LENGTH or not _clean_items(item, limit):
                return False
        elif kind is not float and kind is not bool:
            return False
    return True


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


# -- any value: log bodies and log attribute values ----------------------------------------


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
