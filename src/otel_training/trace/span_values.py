"""Span attribute values as the phases take them: numbers, strings, booleans, sequences,
numpy scalars and one-element tensors, and device tensors read later.

:func:`attribute_value` runs on the training thread for every attribute a phase gets: plain
Python values pass as they are; numpy scalars and one-element CPU tensors become Python
numbers; a tensor on an asynchronous device (CUDA) is :data:`DEFERRED`, to be read by a
background thread (:mod:`otel_training.metrics.device_reads`); anything else is stored as its text
by the one string rule, :func:`otel_training.export.limits.safe_text` (its ``str()``, ``<TypeName>``
when that raises), and cut at export like every string, to the value-length limit with its marker.
Nothing here raises.
"""

from __future__ import annotations

from typing import Any, Final

from otel_training.export.limits import python_number, safe_text
from otel_training.metrics.device_reads import device_type

__all__ = ["DEFERRED", "PRIMITIVES", "attribute_value", "host_number", "text"]

#: The types OpenTelemetry takes as attribute values as they are.
PRIMITIVES: Final = (str, bool, int, float)
#: What :func:`attribute_value` returns for a device tensor, whose read is deferred.
DEFERRED: Final = object()


def attribute_value(value: Any) -> Any:
    """A value OpenTelemetry accepts, or :data:`DEFERRED` for a device tensor. Never raises."""
    kind = type(value)
    if kind in PRIMITIVES:
        return value
    try:
        if isinstance(value, (list, tuple)):
            items = [attribute_value(v) for v in value]
            if all(type(v) in PRIMITIVES for v in items) and len({type(v) for v in items}) <= 1:
                return tuple(items)
            return text(value)
        if device_type(value) not in (None, "cpu"):
            return DEFERRED
        number = host_number(value)
        if number is not None:
            return number
    except Exception:
        pass
    return text(value)


def host_number(value: Any) -> bool | int | float | None:
    """The Python number in a number, a numpy scalar
    (:func:`otel_training.export.limits.python_number`) or a host-side one-element tensor, else
    ``None``."""
    number = python_number(value)
    if number is not None:
        return number
    item = getattr(value, "item", None)
    if not callable(item):
        return None
    numel = getattr(value, "numel", None)
    size = numel() if callable(numel) else getattr(value, "size", 1)
    if size != 1:
        return None
    number = item()
    return number if isinstance(number, (bool, int, float)) else None


def host_value(value: Any) -> Any:
    """The Python number of a host value read back from a device (a pinned 0-d tensor, or a
    tensor-like test double); runs on the background thread."""
    if type(value) in PRIMITIVES:
        return value
    number = host_number(value) if device_type(value) in (None, "cpu") else None
    return float(value) if number is None else number


def text(value: Any) -> str:
    """``value`` as text by the string rule (:func:`otel_training.export.limits.safe_text`), not
    cut: the exporters cut it to the configured value length, as any string. Never raises."""
    return safe_text(value, None)
