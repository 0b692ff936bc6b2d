"""Logs for people who read logs: a key=value formatter, and spans as log lines.

``KeyValueFormatter`` renders a ``logging`` record as one line of ``key=value`` pairs (the
logfmt convention), with the current span's name and ids so that a log line can be found in a
trace, the rank, and the record's ``extra=`` fields::

    time=2026-03-02T14:03:07.412Z level=INFO logger=train msg="saved checkpoint" rank=0
    span=megatron.checkpoint.save trace_id=4bf9...4736 span_id=00f0...02b7 path=/ckpt/iter_2000

``LogSpanProcessor`` logs one record when a span starts and one when it ends (name, ids,
duration in ms, status, attributes as fields), so that the phases of training appear in the job's
log. It runs on the thread that starts or ends the span and formats nothing itself: cost is the
logger's. ``configure()`` does not install it; pass it in ``span_processors=``.

Values are quoted (``"..."``, with ``\\"``, ``\\\\`` and ``\\n`` escaped) when they are empty or
contain spaces, quotes, ``=`` or control characters; NaN and infinities are written ``NaN``,
``Inf`` and ``-Inf``. Neither class raises on a value: it writes its text by the string rule of
:mod:`otel_training.export.limits` (its ``str()``, ``<TypeName>`` when that raises).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from otel_training.export.limits import safe_text

__all__ = ["KeyValueFormatter", "LogSpanProcessor", "format_pairs"]

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/+@,[]()")


def _value(value: Any) -> str:
    """One value as logfmt text."""
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Inf" if value > 0 else "-Inf"
        return repr(value)
    if value is None:
        return "null"
    text = value if kind is str else safe_text(value, None)  # the string rule's text
    if text and all(c in _PLAIN for c in text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    escaped = escaped.replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'


def _key(key: Any) -> str:
    text = key if type(key) is str else safe_text(key, None)
    if text and all(c in _PLAIN and c not in "\"'=" for c in text):
        return text
    return "".join(c if c in _PLAIN else "_" for c in text) or "_"


def format_pairs(pairs: Iterable[tuple[str, Any]]) -> str:
    """``key=value`` pairs joined by spaces, quoted where needed. Never raises."""
    return " ".join(f"{_key(k)}={_value(v)}" for k, v in pairs)


class KeyValueFormatter(logging.Formatter):
    """Formats ``logging`` records as ``key=value`` lines (logfmt).

    Args:
        rank: Written as ``rank=`` on every line when given (``dl.rank``; one log per rank is
            easier to merge with it).
        with_span: Add the current span's name, trace id and span id (``span=``,
            ``trace_id=``, ``span_id=``) when a span is recording and sampled (so exported:
            the ids name a span that exists in the trace) and the record does not carry its
            own (those of :class:`LogSpanProcessor` do).
        utc: Timestamps in UTC (``...Z``); else local time with its offset.

    Fields, in order: ``time`` (ISO 8601, milliseconds), ``level``, ``logger``, ``msg``,
    ``rank``, the span fields, the record's ``extra=`` fields, and ``exc`` (the formatted
    exception) when there is one. Runs on the logging thread; never raises on a value.
    """

    def __init__(self, *, rank: int | None = None, with_span: bool = True, utc: bool = True):
        super().__init__()
        self._rank = rank
        self._with_span = with_span
        self._utc = utc

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        seconds = int(record.created)
        millis = int((record.created - seconds) * 1000)
        if self._utc:
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
        stamp = time.localtime(seconds)
        offset = time.strftime("%z", stamp)
        return time.strftime("%Y-%m-%dT%H:%M:%S", stamp) + f".{millis:03d}{offset[:3]}:{offset[3:]}"

    def format(self, record: logging.LogRecord) -> str:
        pairs: list[tuple[str, Any]] = [
            ("time", self.formatTime(record)),
            ("level", record.levelname),
            ("logger", record.name),
            ("msg", record.getMessage()),
        ]
        if self._rank is not None:
            pairs.append(("rank", self._rank))
        if self._with_span and "span_id" not in record.__dict__:
            span = trace_api.get_current_span()
            context = span.get_span_context()
            # Ids only of a span that is recorded and sampled: one that will be exported.
            if context.is_valid and context.trace_flags.sampled and span.is_recording():
                name = getattr(span, "name", None)
                if name is not None:
                    pairs.append(("span", name))
                pairs.append(("trace_id", f"{context.trace_id:032x}"))
                pairs.append(("span_id", f"{context.span_id:016x}"))
        pairs.extend(
            (key, value) for key, value in record.__dict__.items() if key not in _RECORD_FIELDS
        )
        if record.exc_info:
            pairs.append(("exc", self.formatException(record.exc_info)))
        elif record.exc_text:
            pairs.append(("exc", record.exc_text))
        return format_pairs(pairs)


class LogSpanProcessor(SpanProcessor):
    """Logs a record when each span starts and when it ends.

    Args:
        logger: Where the records go (default: the ``otel_training.spans`` logger).
        level: Their level.
        starts: Also log span starts (``event=span_start``); ends are always logged.

    Each record's message is ``span_start NAME`` or ``span_end NAME``; its ``extra=`` fields
    are ``event``, ``span``, ``trace_id``, ``span_id``, ``parent_span_id`` (the ids only for a
    sampled span: one recorded but not sampled is never exported), and for ends
    ``duration_ms`` and ``status``, then the span's attributes, which ``KeyValueFormatter``
    writes as pairs. Runs on the thread that starts or ends the span; never raises.
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        level: int = logging.INFO,
        starts: bool = True,
    ) -> None:
        self._logger = logger or logging.getLogger("otel_training.spans")
        self._level = level
        self._starts = starts

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._starts and self._logger.isEnabledFor(self._level):
            self._log("span_start", span, {})

    def on_end(self, span: ReadableSpan) -> None:
        if not self._logger.isEnabledFor(self._level):
            return
        start, end = span.start_time, span.end_time
        fields: dict[str, Any] = {
            "duration_ms": (end - start) / 1e6 if start is not None and end is not None else None,
            "status": span.status.status_code.name,
        }
        if span.status.status_code is StatusCode.ERROR and span.status.description:
            fields["error"] = span.status.description
        self._log("span_end", span, fields)

    def _log(self, event: str, span: Any, fields: Mapping[str, Any]) -> None:
        try:
            context = span.context
            parent = span.parent
            extra: dict[str, Any] = {"event": event, "span": span.name}
            if context.trace_flags.sampled:  # a span recorded but not sampled is never exported
                extra["trace_id"] = f"{context.trace_id:032x}"
                extra["span_id"] = f"{context.span_id:016x}"
                extra["parent_span_id"] = f"{parent.span_id:016x}" if parent is not None else None
            extra.update(fields)
            for key, value in (span.attributes or {}).items():
                if key in _RECORD_FIELDS:  # logging refuses extras named like its own fields
                    key = "span." + key
                extra.setdefault(key, value)
            self._logger.log(self._level, "%s %s", event, span.name, extra=extra)
        except Exception:
            pass

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
