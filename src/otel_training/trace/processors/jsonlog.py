"""``JsonLogSpanProcessor``: one JSON object per line when a span ends, and when it starts if
it is still open when the writer runs.

Written for the people who look at the files on the node after a job went wrong: a job hung
inside a checkpoint save leaves the save's ``span_start`` line on disk (within the flush
interval), with no matching ``span_end``. A span that starts and ends within one write of the
writer has only its ``span_end`` line, which carries all its start line would. One file per
rank (``spans-rank{RANK}.jsonl`` when set up by ``configure()``).
The schema, with a sample line, is in ``docs/spans.md``; in short, every line has ``record``
(``span_start`` or ``span_end``), ``name``, ``trace_id``, ``span_id``, ``parent_span_id``,
``start_time_ns``, ``attributes``, ``rank`` and ``resource`` (the rank identity), and
``span_end`` lines add ``end_time_ns``, ``duration_ms``, ``status``, ``status_description`` and
``events`` (an exception event carries ``exception.type``, ``exception.message`` and
``exception.stacktrace``).

Strict JSON: NaN and infinities, which Python's ``json`` would write bare, become the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"``; numpy scalars and one-element tensors become
numbers; any other value becomes its ``str()``. Every string follows the rule of
:mod:`otel_training.export.limits` (lone surrogates as backslash escapes, values cut to the
value-length limit with a marker, each line under 1 MiB), so one odd value never costs a line or a
batch. Nothing here raises.

The training thread only appends a reference to the span to a bounded in-memory queue; a
daemon thread reads what it needs of the span (a start line only for a span still open then),
serialises the records, writes them and flushes the file every ``flush_interval_s`` and at
``force_flush``/``shutdown``. When the queue is full (the disk stalls), records are dropped,
counted, and one warning says so.
In a forked child (a DataLoader worker) the processor records nothing.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import orjson
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from otel_training._log_once import LogOnce
from otel_training.export import files
from otel_training.export import limits as _limits

__all__ = ["IDENTITY_KEYS", "JsonLogSpanProcessor", "jsonable"]

_logger = logging.getLogger(__name__)

#: Resource attributes written as ``resource`` on every line: the rank identity.
IDENTITY_KEYS = (
    "service.name",
    "service.instance.id",
    "host.name",
    "dl.rank",
    "dl.local_rank",
    "dl.world_size",
    "dl.node_rank",
    "dl.job.id",
    "dl.run.id",
    "dl.run.attempt",
    "process.creation.time",
)

_START = 0
_END = 1
_OPEN = 2  # a started span in the queue, as on_start left it
_RECORD = 3  # another record (a rank's thread stacks), as write_record left it
_STATUS = {StatusCode.UNSET: "UNSET", StatusCode.OK: "OK", StatusCode.ERROR: "ERROR"}


def jsonable(value: Any, limit: int | None = _limits.DEFAULT_VALUE_LENGTH) -> Any:
    """``value`` as strict-JSON data: non-finite floats become ``"NaN"``, ``"Infinity"`` or
    ``"-Infinity"``; numpy scalars and one-element tensors become numbers; sequences become
    lists and mappings objects with string keys; anything else its ``str()``; every string
    after the rule of :mod:`otel_training.export.limits`, cut at ``limit`` characters. Never
    raises."""
    kind = type(value)
    if kind is str:
        return _limits.safe_text(value, limit)
    if kind is bool or kind is int or value is None:
        return value
    if kind is float:
        return value if value - value == 0.0 else _nonfinite(value)
    try:
        if isinstance(value, (list, tuple)):
            return [jsonable(v, limit) for v in value]
        if isinstance(value, Mapping):
            return {
                _limits.safe_text(k, _limits.MAX_NAME_LENGTH): jsonable(v, limit)
                for k, v in value.items()
            }
        item = _scalar(value)
        if item is not None:
            return jsonable(item, limit)
        return _limits.safe_text(value, limit)
    except Exception:
        return "<unserializable " + type(value).__name__ + ">"


def _nonfinite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _scalar(value: Any) -> bool | int | float | None:
    """The Python number inside a numpy scalar or a one-element tensor/array, else ``None``."""
    item = getattr(value, "item", None)
    if item is None or not callable(item):
        return None
    size = getattr(value, "size", 1)
    size = size() if callable(size) and not isinstance(size, int) else size
    numel = getattr(value, "numel", None)
    if callable(numel):
        size = numel()
    if size != 1:
        return None
    number = item()
    return number if isinstance(number, (bool, int, float)) else None


class JsonLogSpanProcessor(SpanProcessor):
    """Writes a JSON line when each span ends, and one when it starts if it is still open when
    the writer runs (a span ended by then has only its end line), to one file.

    Args:
        path: The file; appended to (never through a symlink planted at the path; after a
            torn last line, on a fresh line), created with its directory if missing.
        stream: An open text stream to write instead of ``path`` (closed at shutdown); with
            it, ``path`` only names the file in messages.
        flush_interval_s: Longest time, in seconds, a record waits in memory before it is
            written and flushed (a ``span_start`` line reaches the disk within it even if the
            training thread then hangs, as long as it does not hold the GIL).
        max_queue_size: Records held in memory at most; further ones are dropped and counted
            (:attr:`dropped`, exact under any number of threads).
        limits: The string rule's limits (:mod:`otel_training.export.limits`).

    Raises:
        OSError: if the file cannot be opened (the constructor is the only place that raises).
        ValueError: if neither ``path`` nor ``stream`` is given.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        stream: TextIO | None = None,
        flush_interval_s: float = 0.2,
        max_queue_size: int = 262_144,
        limits: _limits.Limits = _limits.DEFAULT_LIMITS,
    ) -> None:
        if stream is None:
            if path is None:
                raise ValueError("JsonLogSpanProcessor needs a path or a stream")
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            stream = files.open_append(os.fspath(path))
        self.path = Path(path) if path is not None else Path(getattr(stream, "name", "<stream>"))
        self._file = stream
        self._limits = limits
        self._value_length = limits.value_length
        self._drop_lock = threading.Lock()
        self._queue: collections.deque = collections.deque()
        self._max_queue_size = max_queue_size
        self._flush_interval_s = flush_interval_s
        self._wake = threading.Event()
        self._closed = False
        self.dropped = 0
        self._resource_cache: tuple[object, tuple[Any, dict[str, Any]]] | None = None
        self._names: dict[str, str] = {}
        self._trace_id = 0
        self._trace_text = ""
        self._write_failed = LogOnce(_logger, exc_info=True)
        self._thread = threading.Thread(target=self._run, name="otel-training-jsonlog", daemon=True)
        self._thread.start()
        if hasattr(os, "register_at_fork"):
            ref = weakref.ref(self)

            def in_child() -> None:
                live = ref()
                if live is not None:
                    live._closed = True  # the writer thread and the file belong to the parent

            os.register_at_fork(after_in_child=in_child)

    # -- the training thread -----------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._closed:
            return
        queue = self._queue
        if len(queue) >= self._max_queue_size:
            self._drop()
            return
        queue.append((_OPEN, span))  # read by the writer if still open when it runs

    def on_end(self, span: ReadableSpan) -> None:
        if self._closed:
            return
        queue = self._queue
        size = len(queue)
        if size >= self._max_queue_size:
            self._drop()
            return
        queue.append((_END, span))
        if size >= _WAKE_AT and not self._wake.is_set():  # a batch is ready: write it now
            self._wake.set()

    def write_record(
        self, record: Mapping[str, Any], resource: Any = None, *, wake: bool = True
    ) -> None:
        """Queues one line that is not a span (``record`` names its kind, such as
        ``stacks`` or ``training_values``), written like the span lines with ``rank`` and
        ``resource`` (the rank identity of ``resource``, an SDK ``Resource``). With
        ``wake=False`` the line waits for the writer's next round (within
        ``flush_interval_s``) instead of waking it: the cheap way for a record of every log
        interval. Any thread; never raises (a full queue drops it, counted)."""
        if self._closed:
            return
        if len(self._queue) >= self._max_queue_size:
            self._drop()
            return
        self._queue.append((_RECORD, dict(record), resource))
        if wake:
            self._wake.set()

    def _drop(self) -> None:
        with self._drop_lock:
            self.dropped += 1
            first = self.dropped == 1
        if first:
            _logger.warning(
                "span JSON lines: the queue of %s is full (%d records); dropping records",
                self.path,
                self._max_queue_size,
            )

    # -- control ------------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Writes and flushes every record queued before the call; False on timeout."""
        if self._closed or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._queue.append(done)
        self._wake.set()
        return done.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Flushes what is queued (bounded by 30 s), stops the writer and closes the file.
        Idempotent."""
        if self._closed:
            return
        self.force_flush()
        self._closed = True
        self._wake.set()
        self._thread.join(5.0)
        try:
            self._file.close()
        except OSError:
            pass

    # -- the writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        queue = self._queue
        while True:
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            waiters = []
            lines = []
            line = self._line
            while queue:
                item = queue.popleft()
                if type(item) is tuple:
                    if item[0] == _OPEN:
                        # A span that has ended by now gets no start line: its end line says
                        # all the start line would. A span still open (hung?) gets both.
                        item = _start_record(item[1])
                        if item is None:
                            continue
                    lines.append(line(item))
                else:  # a force_flush waiter
                    waiters.append(item)
            if lines:
                self._write("".join(lines))
            for waiter in waiters:
                waiter.set()
            if self._closed and not queue:
                return

    def _write(self, text: str) -> None:
        try:
            self._file.write(text)
            self._file.flush()
        except (OSError, ValueError):
            self._write_failed("write", "cannot write span JSON lines to %s", self.path)

    def _line(self, item: tuple) -> str:
        """One line of ``item`` (this runs for every record, on the writer's thread)."""
        if item[0] == _RECORD:
            _, record, resource = item
            rank, identity = self._identity(resource)
            record.update(rank=rank, resource=identity)
            return _dumps(jsonable(record, self._value_length))
        try:
            line = self._format(item)
        except Exception:
            name = item[1] if item[0] == _START else getattr(item[1], "name", None)
            return _dumps({"record": "error", "name": jsonable(name, 256)})
        if len(line) > _CHECK_LINE_CHARS and len(line.encode("utf-8")) >= MAX_LINE_BYTES:
            line = self._smaller(item)
        if not line.isascii():  # characters that str.splitlines() takes for line ends
            line = line.replace("\x85", "\\u0085")
            line = line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
        return line

    def _smaller(self, item: tuple) -> str:
        """The line of ``item`` again, its strings cut to fit :data:`MAX_LINE_BYTES` (a record
        of very many values: the per-record budget of the limits assumed fewer)."""
        budget = _limits.Limits(self._value_length, MAX_LINE_BYTES // 4)
        if item[0] == _START:
            _, name, context, parent, start, attributes, resource = item
            draft = ReadableSpan(name, context=context, attributes=attributes)
            draft = _limits.bounded_span(draft, budget)
            return self._format(
                (_START, draft.name, context, parent, start, draft.attributes, resource)
            )
        return self._format((_END, _limits.bounded_span(item[1], budget)))

    def _format(self, item: tuple) -> str:
        limit = self._value_length
        if item[0] == _START:
            _, name, context, parent, start, attributes, resource = item
            rank, identity = self._identity(resource)
            return _dumps(
                {
                    "record": "span_start",
                    "name": self._name(name),
                    "trace_id": self._trace_hex(context.trace_id),
                    "span_id": "%016x" % context.span_id,  # noqa: UP031 (see _HEX)
                    "parent_span_id": None if parent is None else "%016x" % parent.span_id,  # noqa: UP031
                    "start_time_ns": start,
                    "attributes": _attributes(attributes, limit),
                    "rank": rank,
                    "resource": identity,
                }
            )
        span = item[1]
        context, start, end, status, attributes, resource, events, links = _end_fields(span)
        if events or links or status.description is not None:  # the whole string rule
            span = _limits.bounded_span(span, self._limits)
            context, start, end, status, attributes, resource, events, links = _end_fields(span)
        parent = span.parent
        description = status.description
        code = status.status_code
        rank, identity = self._identity(resource)
        return _dumps(
            {
                "record": "span_end",
                "name": self._name(span.name),
                "trace_id": self._trace_hex(context.trace_id),
                "span_id": "%016x" % context.span_id,  # noqa: UP031 (see _HEX)
                "parent_span_id": None if parent is None else "%016x" % parent.span_id,  # noqa: UP031
                "start_time_ns": start,
                "end_time_ns": end,
                "duration_ms": (
                    (end - start) / 1e6 if end is not None and start is not None else None
                ),
                "status": "UNSET" if code is _UNSET else _STATUS.get(code, "UNSET"),
                "status_description": None if description is None else jsonable(description, limit),
                "events": self._events(events) if events else [],
                "attributes": _attributes(_limits.plain(attributes) if attributes else None, limit),
                "rank": rank,
                "resource": identity,
            }
        )

    def _trace_hex(self, trace_id: int) -> str:
        if trace_id != self._trace_id:  # a step trace holds many spans in a row: formatted once
            self._trace_id, self._trace_text = trace_id, "%032x" % trace_id  # noqa: UP031
        return self._trace_text

    def _name(self, name: Any) -> str:
        if type(name) is not str:  # a name the caller gave as another type: not cached
            return _limits.safe_text(name, _limits.MAX_NAME_LENGTH)
        text = self._names.get(name)
        if text is None:
            text = _limits.safe_text(name, _limits.MAX_NAME_LENGTH)
            if len(self._names) < 4096:
                self._names[name] = text
        return text

    def _events(self, events: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": jsonable(event.name, _limits.MAX_NAME_LENGTH),
                "time_ns": event.timestamp,
                "attributes": jsonable(dict(event.attributes or {}), self._value_length),
            }
            for event in events
        ]

    def _identity(self, resource: Any) -> tuple[Any, dict[str, Any]]:
        """(``rank``, ``resource``) of every line: the rank identity, made once per resource."""
        cached = self._resource_cache
        if cached is not None and cached[0] is resource:
            return cached[1]
        bounded = _limits.bounded_resource(resource, self._value_length)  # under 48 KiB
        values = getattr(bounded, "attributes", None) or {}
        identity = {key: jsonable(values[key]) for key in IDENTITY_KEYS if key in values}
        found = (identity.get("dl.rank"), identity)
        self._resource_cache = (resource, found)
        return found


_UNSET = StatusCode.UNSET
# _HEX: ids are formatted with %-format, not f"{id:016x}": a third of its cost, paid per span on
# the writer's thread (the same text for any int).


def _start_record(span: Any) -> tuple | None:
    """The start record of a span still open, read on the writer's thread (its attributes as
    set by now), or None when it has ended: its end line will say all."""
    try:  # the SDK's fields, as its properties return them (without their wrappers)
        if span._end_time is not None:
            return None
        name, context, parent = span._name, span._context, span._parent
        start, attributes, resource = span._start_time, span._attributes, span._resource
    except AttributeError:  # another Span implementation
        if span.end_time is not None:
            return None
        name, context, parent = span.name, span.context, span.parent
        start, attributes, resource = span.start_time, span.attributes, span.resource
    # a copy of the dict (one step under the GIL): the training thread may still add to it
    attributes = _limits.plain(attributes).copy() if attributes else None
    return (_START, name, context, parent, start, attributes, resource)


def _end_fields(span: Any) -> tuple:
    """(context, start, end, status, attributes, resource, events, links) of an ended span:
    the SDK's fields where it has them (its properties wrap or copy them: this runs for every
    span), else the properties."""
    try:
        return (
            span._context,
            span._start_time,
            span._end_time,
            span._status,
            span._attributes,
            span._resource,
            span._events,
            span._links,
        )
    except AttributeError:
        return (
            span.context,
            span.start_time,
            span.end_time,
            span.status,
            span.attributes,
            span.resource,
            span.events,
            span.links,
        )


#: Longest line written, in bytes (the collector filelog receiver's default maximum).
MAX_LINE_BYTES = files.MAX_LINE_BYTES
#: Lines longer than this many characters have their bytes counted (6 bytes a character at
#: most, as JSON escapes controls: shorter ones fit for sure).
_CHECK_LINE_CHARS = MAX_LINE_BYTES // 6
#: Queued records that wake the writer before its interval ends (a batch is ready).
_WAKE_AT = 1024
_DUMPS_OPTIONS = orjson.OPT_APPEND_NEWLINE


def _dumps(record: dict[str, Any]) -> str:
    """One line of strict JSON: orjson (the record's strings already follow the string rule),
    else :func:`jsonable` of it where orjson refuses a value (an integer beyond 64 bits, a key
    that is not a string, a type it does not know)."""
    try:
        return orjson.dumps(record, option=_DUMPS_OPTIONS).decode()
    except TypeError:
        return orjson.dumps(jsonable(record, None), option=_DUMPS_OPTIONS).decode()


def _attributes(attributes: Mapping[str, Any] | None, limit: int | None) -> Any:
    """Span attributes as JSON data: after the string rule, and through :func:`jsonable` when
    a value is a non-finite float (orjson would write null) or not a JSON type."""
    if not attributes:
        return {}
    attributes = _limits.bounded_attributes(attributes, limit)
    for value in attributes.values():
        kind = type(value)
        if kind is float:
            if value - value != 0.0:  # NaN or an infinity
                return jsonable(attributes, limit)
        elif kind is tuple or kind is list:
            for item in value:
                item_kind = type(item)
                if item_kind is float:
                    if item - item != 0.0:
                        return jsonable(attributes, limit)
                elif item_kind is not str and item_kind is not int and item_kind is not bool:
                    return jsonable(attributes, limit)
        elif kind is not str and kind is not int and kind is not bool:
            return jsonable(attributes, limit)
    return attributes
