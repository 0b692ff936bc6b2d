"""One line of a run file, and the OTLP/JSON values in it, as Python values: the one decoding
of the files that the report, the trace and run health read (:mod:`otel_training.report.reader`)
and that finding a job's run directories peeks at (:mod:`otel_training.report.rundir`).

Metrics and traces files hold one OTLP/JSON document per line (an
``ExportMetricsServiceRequest`` or ``ExportTraceServiceRequest``, as the collector's
``otlpjsonfile`` receiver reads them: ids in hex, 64-bit integers as strings); span and gap
files hold one JSON record per line (``docs/spans.md``). The documents are decoded with orjson
and :mod:`json` directly (the OTLP/JSON mapping of ``opentelemetry-proto``), which is several
times faster than parsing them into protobuf messages. Nothing here raises but :func:`loads`
(:class:`Torn`) and the value readers on a document of the wrong shape (``KeyError``,
``TypeError``, ``ValueError``: the reader counts the line as unreadable).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import orjson

from otel_training.export.limits import safe_text
from otel_training.report.run import Attributes

__all__ = [
    "Torn",
    "any_value",
    "attributes",
    "double",
    "hex_id",
    "loads",
    "number",
    "optional_int",
    "point_attributes",
    "resource_of",
    "safe_strings",
    "status",
    "temporality",
]

_STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}
_STATUS_NAMES = {"STATUS_CODE_UNSET": "UNSET", "STATUS_CODE_OK": "OK", "STATUS_CODE_ERROR": "ERROR"}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class Torn(Exception):
    """A line that is not a whole JSON document (cut while it was written, or not JSON)."""


def loads(raw: bytes) -> Any:
    """One line as one JSON document.

    orjson parses these lines about twice as fast as json; json reads what it refuses (bare
    NaN and Infinity, and lone surrogates such as ``"\\ud800"``, which no UTF-8 text can hold:
    each becomes a backslash escape, as the string rule of
    :func:`otel_training.export.limits.safe_text` writes it, so that the report and the trace can
    always be written).

    Raises:
        Torn: when ``raw`` is not one JSON document.
    """
    try:
        return orjson.loads(raw)
    except ValueError:
        pass
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise Torn from error
    if b"\\ud" in raw or b"\\uD" in raw:
        document = safe_strings(document)
    return document


def safe_strings(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string, keys too,
    through :func:`otel_training.export.limits.safe_text` without a length limit: lone surrogates
    as backslash escapes, the rest as it is. Never raises."""
    if isinstance(value, str):
        return safe_text(value, None)
    if isinstance(value, list):
        return [safe_strings(v) for v in value]
    if isinstance(value, dict):
        return {safe_text(k, None): safe_strings(v) for k, v in value.items()}
    return value


def any_value(value: Mapping[str, Any]) -> Any:
    """An OTLP/JSON ``AnyValue`` as a Python value (``None`` when empty)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return double(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", ())]
    if "kvlistValue" in value:
        return attributes(value["kvlistValue"].get("values", ()))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP/JSON ``KeyValue`` pairs (a resource's, a span's, a point's) as a dict."""
    return {kv["key"]: any_value(kv.get("value", {})) for kv in pairs or ()}


def point_attributes(pairs: Any) -> Attributes:
    """A point's ``KeyValue`` pairs as :data:`Attributes` (a series key)."""
    if not pairs:
        return ()
    return tuple(sorted((kv["key"], _hashable(any_value(kv.get("value", {})))) for kv in pairs))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def double(value: Any) -> float:
    """An OTLP/JSON double: a number, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (or a
    number's text)."""
    if isinstance(value, str):
        return _NON_FINITE[value] if value in _NON_FINITE else float(value)
    return float(value)


def number(point: Mapping[str, Any]) -> float | None:
    """A number data point's value (``asDouble`` or ``asInt``), ``None`` when it has none."""
    if "asDouble" in point:
        return double(point["asDouble"])
    if "asInt" in point:
        return float(int(point["asInt"]))
    return None


def temporality(value: Any) -> str:
    """An ``aggregationTemporality`` as ``"delta"`` or ``"cumulative"``."""
    return "delta" if value in (1, "AGGREGATION_TEMPORALITY_DELTA") else "cumulative"


def status(value: Any) -> tuple[str, str | None]:
    """A span's OTLP/JSON ``status`` as (``UNSET``/``OK``/``ERROR``, message or ``None``)."""
    if not isinstance(value, dict):
        return "UNSET", None
    code = value.get("code", 0)
    name = _STATUS_CODES.get(code) if isinstance(code, int) else _STATUS_NAMES.get(code)
    return name or "UNSET", value.get("message") or None


def optional_int(value: Any) -> int | None:
    """``int(value)``, or ``None`` for ``None``."""
    return None if value is None else int(value)


def hex_id(value: Any) -> str | None:
    """A trace or span id in lower-case hex, ``None`` when absent or empty."""
    return value.lower() if isinstance(value, str) and value else None


def resource_of(document: Any) -> dict[str, Any]:
    """The resource attributes of one line: a span, stacks or gap record's ``resource``, or
    the first resource of an OTLP/JSON document; empty when it has none. Never raises."""
    if not isinstance(document, dict):
        return {}
    if isinstance(document.get("resource"), dict):
        return dict(document["resource"])
    for key in ("resourceMetrics", "resourceSpans", "resourceLogs"):
        entries = document.get(key)
        if isinstance(entries, list) and entries and isinstance(entries[0], dict):
            try:
                return attributes((entries[0].get("resource") or {}).get("attributes"))
            except (KeyError, TypeError, ValueError, AttributeError):
                return {}
    return {}
