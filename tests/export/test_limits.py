"""The string rule of otel_training.export.limits: any string encodes, values are bounded, cut
values say so, records fit their budget."""

from __future__ import annotations

import dataclasses
import importlib
import io
import json
import logging
import os
import pkgutil
import threading

import pytest
from doc_rules import documents
from hypothesis import example, given, settings
from hypothesis import strategies as st
from opentelemetry import trace as trace_api
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.exporter.otlp.json.file._log_exporter import FileLogExporter
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, Status, StatusCode
from support import examples, import_or_unavailable, metrics_of, new_in_memory_meter

import otel_training as ot
from otel_training import testing
from otel_training.export import limits
from otel_training.export.limits import (
    Limits,
    bounded_log_record,
    bounded_span,
    bounded_value,
    cut_marker,
    safe_text,
)

CONTEXT = trace_api.SpanContext(0x1234, 0x5678, is_remote=False)
#: Any Python string: lone surrogates (what os.fsdecode makes of undecodable bytes), controls,
#: quotes and backslashes on top of all other characters (st.text() leaves surrogates out).
ANY_TEXT = st.lists(
    st.one_of(
        st.characters(),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
        st.sampled_from(["\x00", "\n", "\u2028", "\x1b", '"', "\\"]),
    ),
    max_size=300,
).map("".join)


def span(name="s", attributes=None, events=(), description=None) -> ReadableSpan:
    status = Status(StatusCode.ERROR, description) if description else Status()
    return ReadableSpan(
        name,
        context=CONTEXT,
        attributes=attributes or {},
        events=list(events),
        status=status,
        start_time=1,
        end_time=2,
    )


def strings_of(record: ReadableSpan) -> list[str]:
    found = [record.name, record.status.description or ""]
    values = list(record.attributes.values())
    for event in record.events:
        values.extend(event.attributes.values())
    for value in values:
        found.extend([value] if isinstance(value, str) else [v for v in value if type(v) is str]
                     if isinstance(value, tuple) else [])  # fmt: skip
    return found


@documents("limits.md", "Lone surrogates, which no UTF-8 encoder accepts")
@documents("limits.md", "The rest of the value is kept")
def test_undecodable_file_name_bytes_become_backslash_escapes():
    """Case A12: os.fsdecode's lone surrogates become \\xNN; the rest is kept intact."""
    path = os.fsdecode(b"/ckpt/run-\xff\xfe/step-000100.pt")
    assert safe_text(path) == "/ckpt/run-\\xff\\xfe/step-000100.pt"
    assert safe_text("a\ud800b") == "a\\ud800b"
    assert safe_text("caf\u00e9 \U0001f600 \x00\x07") == "caf\u00e9 \U0001f600 \x00\x07"


@documents("limits.md", "A name or key that is not a `str` becomes its `str()`")
def test_non_strings_and_broken_str_become_text():
    """A name that is not a str is its str(); one whose __str__ raises is <TypeName>."""

    class Broken:
        def __str__(self):
            raise RuntimeError("no")

    assert safe_text(42) == "42"
    assert safe_text(Broken()) == "<Broken>"


@documents("limits.md", "A cut string ends with")
def test_a_cut_value_says_so_and_keeps_the_limit():
    """A string over the limit keeps its head, ends with the marker, and is exactly the limit."""
    text = "x" * 5_000_000
    cut = safe_text(text, 4096)
    assert len(cut) == 4096
    assert cut.endswith(cut_marker(5_000_000 - 4096 + len(cut_marker(5_000_000 - 4096))))
    assert cut.startswith("x" * 4000)
    assert safe_text("short", 4096) == "short"


@settings(max_examples=examples(300), deadline=None)
@given(text=ANY_TEXT, limit=st.integers(min_value=0, max_value=400))
def test_any_string_encodes_and_is_bounded(text, limit):
    """Property: whatever the string, the result encodes as UTF-8 and is within the limit."""
    result = safe_text(text, limit)
    result.encode("utf-8")
    assert len(result) <= limit
    json.loads(json.dumps(result, ensure_ascii=False))


@documents("limits.md", "Integers beyond int64 (all OTLP carries) become floats in attributes")
@documents("limits.md", "Sequences keep 1,024 items.")
def test_numbers_beyond_int64_become_floats_and_sequences_are_cut():
    """OTLP carries int64 only; a sequence keeps at most MAX_SEQUENCE_LENGTH items."""
    assert bounded_value(2**70) == float(2**70)
    assert bounded_value(-(2**63)) == -(2**63)
    assert len(bounded_value(tuple(range(5000)))) == limits.MAX_SEQUENCE_LENGTH
    assert bounded_value(("a\udcff", "b")) == ("a\\xff", "b")


def test_a_clean_span_is_returned_as_it_is():
    """Nothing to change: the same object, no copy."""
    record = span(attributes={"a": 1, "b": "text"})
    assert bounded_span(record) is record


@documents("limits.md", "This includes exception messages, stack traces and status descriptions")
def test_huge_values_exception_and_description_are_bounded_by_the_limit():
    """Case A11: attribute, exception message, stack trace and status description are cut."""
    message = "shard mismatch: " + "y" * 3_000_000
    record = span(
        attributes={"manifest": "z" * 5_000_000},
        events=[
            Event(
                "exception",
                {"exception.message": message, "exception.stacktrace": message},
            )
        ],
        description="RuntimeError: " + message,
    )
    bounded = bounded_span(record, Limits(value_length=4096))
    assert all(len(text) <= 4096 for text in strings_of(bounded))
    assert bounded.attributes["manifest"].endswith(" characters cut]")
    assert bounded.status.status_code is StatusCode.ERROR
    assert bounded.context == record.context and bounded.end_time == record.end_time


def test_many_large_values_fit_the_record_budget():
    """100 values at the full default length fit one record: the longest are cut alike."""
    record = span(attributes={f"k{i}": chr(0x4E00 + i) * 16_384 for i in range(100)})
    bounded = bounded_span(record)
    assert limits.span_cost(bounded) <= limits.RECORD_BUDGET_BYTES
    lengths = {len(v) for v in bounded.attributes.values()}
    assert len(lengths) == 1 and lengths.pop() < 16_384
    assert len(encode_spans([bounded]).SerializeToString()) < 1024 * 1024


attribute_values = st.one_of(
    ANY_TEXT,
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.lists(ANY_TEXT, max_size=5).map(tuple),
)


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None)
@given(
    name=ANY_TEXT,
    attributes=st.dictionaries(ANY_TEXT, attribute_values, max_size=8),
    event_attributes=st.dictionaries(ANY_TEXT, attribute_values, max_size=4),
    description=st.one_of(st.none(), ANY_TEXT),
)
def test_any_span_encodes_in_protobuf_and_json(name, attributes, event_attributes, description):
    """Property: any span, once bounded, encodes as OTLP protobuf and as strict UTF-8 JSON."""
    record = span(name, attributes, [Event("e", event_attributes)], description)
    bounded = bounded_span(record, Limits(value_length=64))
    encode_spans([bounded]).SerializeToString()
    text = json.dumps(
        {"name": bounded.name, "attributes": dict(bounded.attributes)}, ensure_ascii=False
    )
    text.encode("utf-8")


# -- the worst-case estimate, against real output ---------------------------------------------

#: Attribute values of every kind the SDK takes, strings of any content among them.
VALUES = st.one_of(
    ANY_TEXT,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(ANY_TEXT, max_size=20).map(tuple),
    st.lists(st.floats(allow_nan=False), max_size=20).map(tuple),
)
MAPS = st.dictionaries(ANY_TEXT, VALUES, max_size=6)


def _otlp_json_bytes(exporter_class, record) -> int:
    stream = io.StringIO()
    exporter_class(stream=stream).export([record])
    return len(stream.getvalue().encode("utf-8"))


@pytest.mark.slow
@documents("limits.md", "and the structure around them as the")
@settings(max_examples=examples(60), deadline=None)
@given(
    name=ANY_TEXT,
    attributes=MAPS,
    events=st.lists(st.tuples(ANY_TEXT, MAPS), max_size=12),
    links=st.lists(MAPS, max_size=10),
    description=st.one_of(st.none(), ANY_TEXT),
    scope=st.tuples(ANY_TEXT, ANY_TEXT, MAPS),
    resource=MAPS,
)
def test_the_estimate_is_never_below_the_real_size(
    name, attributes, events, links, description, scope, resource
):
    """Property: for any span and log record (after the string rule), its worst-case cost,
    with its scope's and resource's, is at least the bytes of its real OTLP-JSON line and
    of its protobuf request."""
    record = bounded_span(
        ReadableSpan(
            name,
            context=CONTEXT,
            parent=CONTEXT,
            attributes=attributes,
            events=[Event(n, a, 2**63 - 1) for n, a in events],
            links=[Link(CONTEXT, a) for a in links],
            status=Status(StatusCode.ERROR, description) if description else Status(),
            start_time=2**63 - 1,
            end_time=2**63 - 1,
            resource=Resource(resource),
            instrumentation_scope=InstrumentationScope(*scope),
        )
    )
    groups = limits.scope_cost(record.instrumentation_scope) + limits.scope_cost(record.resource)
    estimate = limits.span_cost(record) + groups
    assert _otlp_json_bytes(FileSpanExporter, record) <= estimate
    assert len(encode_spans([record]).SerializeToString()) <= estimate
    log = bounded_log_record(
        ReadableLogRecord(
            LogRecord(
                timestamp=2**63 - 1,
                observed_timestamp=2**63 - 1,
                body=name,
                attributes=attributes,
                severity_text=description,
            ),
            resource=record.resource,
            instrumentation_scope=record.instrumentation_scope,
        )
    )
    estimate = limits.log_record_cost(log) + groups
    assert _otlp_json_bytes(FileLogExporter, log) <= estimate
    assert len(encode_logs([log]).SerializeToString()) <= estimate


@documents("limits.md", "down to 32 characters")
def test_long_values_beyond_u_ffff_are_cut_alike_and_none_is_dropped():
    """64 values of 16,384 characters beyond U+FFFF (12 bytes each in JSON) fit the record
    budget by being cut alike: every attribute is kept, all at the same length."""
    record = span(attributes={f"k{i}": "\U0001f600" * 16_384 for i in range(64)})
    bounded = bounded_span(record)
    assert limits.span_cost(bounded) <= limits.RECORD_BUDGET_BYTES
    lengths = {len(v) for v in bounded.attributes.values()}
    assert len(bounded.attributes) == 64 and len(lengths) == 1 and lengths.pop() < 16_384


def _line(records: list) -> tuple[int, int]:
    """(real OTLP-JSON bytes, estimate) of one line of ``records`` (spans or log records):
    each record's cost, each resource's once and each scope's once per resource, as the
    exporters count a request."""
    is_span = isinstance(records[0], ReadableSpan)
    cost = limits.span_cost if is_span else limits.log_record_cost
    resources = {id(r.resource): r.resource for r in records}
    scopes = {
        (id(r.resource), id(r.instrumentation_scope)): r.instrumentation_scope for r in records
    }
    estimate = sum(map(cost, records)) + sum(map(limits.scope_cost, resources.values()))
    estimate += sum(map(limits.scope_cost, scopes.values()))
    stream = io.StringIO()
    (FileSpanExporter if is_span else FileLogExporter)(stream=stream).export(records)
    return len(stream.getvalue().encode("utf-8")), estimate


END = 2**63 - 1
RESOURCE, SCOPE = Resource({}), InstrumentationScope("")


def _spans(count: int = 1, groups=lambda i: {}, **fields) -> list[ReadableSpan]:
    """``count`` spans with every field at its longest but strings; ``groups(i)`` may give
    the i-th its own scope or resource."""
    fields = {"resource": RESOURCE, "instrumentation_scope": SCOPE, **fields}
    return [
        ReadableSpan(
            "",
            context=CONTEXT,
            parent=CONTEXT,
            start_time=END,
            end_time=END,
            status=Status(StatusCode.ERROR, ""),
            kind=trace_api.SpanKind.CONSUMER,
            **{**fields, **groups(i)},
        )
        for i in range(count)
    ]


def _logs(count: int = 1, **fields) -> list:
    """``count`` log records with every field at its longest but strings."""
    fields = {"body": "", "severity_number": SeverityNumber.FATAL4, **fields}
    return [
        ReadableLogRecord(
            LogRecord(
                timestamp=END,
                observed_timestamp=END,
                trace_id=2**128 - 1,
                span_id=2**64 - 1,
                trace_flags=trace_api.TraceFlags(1),
                **fields,
            ),
            resource=RESOURCE,
            instrumentation_scope=SCOPE,
        )
        for _ in range(count)
    ]


BIG, SMALL = -(2**63), -1.7976931348623157e308
#: Each structure around the strings, many times over, with strings that cost exactly their
#: estimate (empty, or plain ASCII): what the estimate adds for it is what the real line does.
STRUCTURES = {
    "spans": lambda: _spans(200),
    "events": lambda: _spans(events=[Event("", {}, END)] * 500),
    "links": lambda: _spans(links=[Link(CONTEXT, {})] * 200),
    "int attributes": lambda: _spans(attributes={f"{i}": BIG for i in range(500)}),
    "float attributes": lambda: _spans(attributes={f"{i}": SMALL for i in range(500)}),
    "string attributes": lambda: _spans(attributes={f"{i}": "" for i in range(500)}),
    "string items": lambda: _spans(attributes={"s": ("",) * 1000}),
    "float items": lambda: _spans(attributes={"f": (SMALL,) * 1000}),
    "scopes": lambda: _spans(
        200, lambda i: {"instrumentation_scope": InstrumentationScope(f"{i}", "", "")}
    ),
    "scope attributes": lambda: _spans(
        instrumentation_scope=InstrumentationScope("", "", "", {f"{i}": "" for i in range(300)})
    ),
    "resources": lambda: _spans(200, lambda i: {"resource": Resource({"k": f"{i}"})}),
    "log records": lambda: _logs(200),
    "log attributes": lambda: _logs(attributes={f"{i}": BIG for i in range(500)}),
    "log body list": lambda: _logs(body=[BIG] * 1000),
    "log body map": lambda: _logs(body={f"{i}": "" for i in range(500)}),
}


@documents("limits.md", "the structure around them as the OTLP-JSON files write it")
@pytest.mark.parametrize("structure", STRUCTURES)
def test_the_estimate_of_each_structure_is_at_least_its_real_size_and_close(structure):
    """What the estimate adds for each structure around the strings (spans and log records,
    events, links, attributes of each type, sequence items, scopes, resources, log bodies) is
    at least what the real OTLP-JSON line adds, and at most twice that."""
    records = STRUCTURES[structure]()
    real, estimate = _line(records)
    if structure in ("scopes", "resources"):  # against as many spans in one group
        base = _spans(len(records))
    else:
        base = records[:1] if len(records) > 1 else _logs() if structure[:3] == "log" else _spans()
    base_real, base_estimate = _line(base)
    assert base_real <= base_estimate
    added_real, added_estimate = real - base_real, estimate - base_estimate
    assert added_real <= added_estimate <= 2 * added_real


@documents(
    "limits.md", "Names and keys are cut to 1,024 characters, and so are metric descriptions"
)
def test_names_keys_and_metric_descriptions_are_cut_at_1024_characters():
    """Span, event and scope names, attribute keys and metric descriptions of 5,000
    characters are exported at 1,024 with the marker; a value of 5,000 is kept whole."""
    long = "n" * 5000
    record = bounded_span(
        ReadableSpan(
            long,
            context=CONTEXT,
            attributes={long: long},
            events=[Event(long, {long: 1})],
            instrumentation_scope=InstrumentationScope(long, long, long),
        )
    )
    (key,) = record.attributes
    (event_key,) = record.events[0].attributes
    scope = record.instrumentation_scope
    for name in (record.name, key, record.events[0].name, event_key, scope.name, scope.version):
        assert len(name) == 1024 and name.endswith("n...[4000 characters cut]")
    assert record.attributes[key] == long
    sdk = new_in_memory_meter("m")
    sdk.meter.create_counter("c", description=long).add(1)
    data = limits.bounded_metrics_data(sdk.reader.get_metrics_data())
    (metric,) = data.resource_metrics[0].scope_metrics[0].metrics
    assert len(metric.description) == 1024 and metric.description.endswith(" characters cut]")
    sdk.provider.shutdown()


@documents("limits.md", "then events beyond what fits are dropped, exception events kept")
def test_exception_events_are_kept_first_when_events_must_go():
    """A span whose events cannot all fit keeps its exception event, wherever it was, then
    the earliest others, in their order."""
    heavy = {f"a{i}": "v" * 100 for i in range(100)}  # ~14 KB each at the cut of 32 characters
    events = [Event(f"e{i}", heavy, i) for i in range(200)]
    events.insert(150, Event("exception", {"exception.message": "boom"}, 150))
    bounded = bounded_span(span(events=events))
    names = [event.name for event in bounded.events]
    assert "exception" in names and 0 < len(names) < 201
    assert names[: names.index("exception")] == [f"e{i}" for i in range(len(names) - 1)]
    assert limits.span_cost(bounded) <= limits.RECORD_BUDGET_BYTES


@documents("limits.md", "then sequences keep fewer items, alike")
@documents("limits.md", "then links, then attributes are dropped")
def test_sequences_then_links_then_attributes_give_way_in_that_order():
    """Past the shortest cut, sequences keep fewer items alike (every attribute kept); when
    even that is not enough (very many long keys), links go first, then the last attributes."""
    sequences = {f"s{i}": ("x" * 64,) * 1024 for i in range(40)}
    bounded = bounded_span(span(attributes=sequences))
    kept = {len(v) for v in bounded.attributes.values()}
    assert len(bounded.attributes) == 40 and len(kept) == 1 and 0 < kept.pop() < 1024
    keys = {f"{i}" + "k" * 1000: i for i in range(1000)}  # ~1 MB of keys alone
    links = [Link(CONTEXT, {"l": "v"}) for _ in range(10)]
    record = ReadableSpan("s", context=CONTEXT, attributes=keys, links=links)
    bounded = bounded_span(record)
    assert not bounded.links and 0 < len(bounded.attributes) < 1000
    assert list(bounded.attributes.values()) == list(range(len(bounded.attributes)))
    assert limits.span_cost(bounded) <= limits.RECORD_BUDGET_BYTES


@documents("limits.md", "so does a value that is not a string, number, boolean or sequence")
def test_objects_given_to_a_phase_or_a_log_record_are_their_text_by_the_rule():
    """An object given to a phase, or as a logging extra= field, arrives as its str() cut by
    the string rule with its marker (not at a length of its own), or as <TypeName>."""

    class Huge:
        def __str__(self):
            return "h" * 50_000

    class Broken:
        def __str__(self):
            raise RuntimeError("no")

    memory = testing.configure_in_memory()
    with ot.phase("work", huge=Huge(), broken=Broken()):
        pass
    log = logging.getLogger("objects")
    log.addHandler(ot.logging_handler())
    log.warning("with extras", extra={"huge": Huge(), "broken": Broken()})
    ot.force_flush()
    (recorded,) = [s for s in memory.spans.get_finished_spans() if s.name == "work"]
    exported = bounded_span(recorded)
    expected = safe_text("h" * 50_000, limits.DEFAULT_VALUE_LENGTH)
    assert exported.attributes["huge"] == expected and exported.attributes["broken"] == "<Broken>"
    (record,) = [r for r in memory.logs.get_finished_logs() if r.log_record.body == "with extras"]
    attributes = bounded_log_record(record).log_record.attributes
    assert attributes["huge"] == expected and attributes["broken"] == "<Broken>"
    testing.reset()


@documents("limits.md", "Escaping and cutting run on the exporters' threads")
def test_escaping_and_cutting_never_run_on_the_training_thread(monkeypatch):
    """A phase with a long value and an undecodable path ends on the training thread without
    the rule's escaping or cutting running there; bounding the span (the exporter's thread's
    work) applies them."""
    threads: list[str] = []

    def recording(function):
        def record(*args):
            threads.append(threading.current_thread().name)
            return function(*args)

        return record

    modules = [
        importlib.import_module(f"{limits.__name__}.{module.name}")
        for module in pkgutil.iter_modules(limits.__path__)
    ]
    memory = testing.configure_in_memory()
    for name in ("safe_text", "_cut"):  # the rule's escaping and cutting
        # Each module of the package reads the name from its own namespace: patched in each
        # that has it (the package's, read as ``limits.safe_text``, included).
        for module in (limits, *modules):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, recording(getattr(module, name)))
    path = os.fsdecode(b"/ckpt/\xff") + "p" * 20_000
    with ot.checkpoint_save(path):
        pass
    assert threads == []
    exported = bounded_span(memory.spans.get_finished_spans()[0])
    assert threads and all(name == threading.current_thread().name for name in threads)
    assert exported.attributes["megatron.checkpoint.path"].startswith("/ckpt/\\xff")
    testing.reset()


@documents("limits.md", "The SDK itself refuses a metric name or unit outside its ASCII grammar")
def test_the_sdk_refuses_an_instrument_named_outside_its_grammar(in_memory_meter):
    """An instrument named or with a unit outside the SDK's ASCII grammar is refused when it
    is created; nothing of it is collected."""
    for name, unit in (("ckpt-\udc80", ""), ("ok", "\udc80")):
        with pytest.raises(Exception, match="Expected ASCII string"):
            in_memory_meter.meter.create_counter(name, unit=unit)
    assert not metrics_of(in_memory_meter.reader.get_metrics_data())


# -- each thing the rule looks at, one at a time ---------------------------------------------

ODD = "odd\udc80"  # a lone surrogate: what the rule must change
FIXED = "odd\\x80"


def _clean_span(**changes) -> ReadableSpan:
    """A span with every part the rule looks at, all clean, but for ``changes``."""
    fields = {
        "name": "step",
        "attributes": {"a": "x", "n": 1, "f": 1.5, "b": True},
        "events": [Event("e", {"k": "v"}, 5)],
        "links": [Link(CONTEXT, {"l": "w"})],
        "description": "failed",
        "resource": Resource({"service.name": "train"}),
        "scope": InstrumentationScope("otel_training", "1.0", "https://schema", {"s": "v"}),
    }
    fields.update(changes)
    return ReadableSpan(
        fields["name"],
        context=CONTEXT,
        parent=CONTEXT,
        attributes=fields["attributes"],
        events=fields["events"],
        links=fields["links"],
        kind=trace_api.SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, fields["description"]),
        start_time=3,
        end_time=4,
        resource=fields["resource"],
        instrumentation_scope=fields["scope"],
    )


def _span_parts(record: ReadableSpan) -> dict:
    return {
        "name": record.name,
        "attributes": dict(record.attributes),
        "events": [(e.name, dict(e.attributes), e.timestamp) for e in record.events],
        "links": [(link.context, dict(link.attributes)) for link in record.links],
        "status": (record.status.status_code, record.status.description),
        "resource": (dict(record.resource.attributes), record.resource.schema_url),
        "scope": (
            record.instrumentation_scope.name,
            record.instrumentation_scope.version,
            record.instrumentation_scope.schema_url,
            dict(record.instrumentation_scope.attributes or {}),
        ),
        "rest": (record.context, record.parent, record.kind, record.start_time, record.end_time),
    }


SPAN_CHANGES = {
    "name: a lone surrogate": ({"name": ODD}, {"name": FIXED}),
    "name: not a string": ({"name": 42}, {"name": "42"}),
    # 1,002 kept + 23 cut = 1,025 characters; 1,002 + the 22 of the marker = 1,024.
    "name: longer than 1,024": ({"name": "n" * 1025}, {"name": "n" * 1002 + cut_marker(23)}),
    "status description": ({"description": ODD}, {"status": (StatusCode.ERROR, FIXED)}),
    "attribute value": (
        {"attributes": {"a": ODD, "big": 2**64}},
        {"attributes": {"a": FIXED, "big": float(2**64)}},
    ),
    "attribute key": ({"attributes": {ODD: 1}}, {"attributes": {FIXED: 1}}),
    "event name": ({"events": [Event(ODD, {}, 5)]}, {"events": [(FIXED, {}, 5)]}),
    "event attribute": (
        {"events": [Event("e", {"k": ODD}, 5)]},
        {"events": [("e", {"k": FIXED}, 5)]},
    ),
    "event attribute, a later event": (
        {"events": [Event("e", {}, 5), Event("e", {"k": 2**70}, 6)]},
        {"events": [("e", {}, 5), ("e", {"k": float(2**70)}, 6)]},
    ),
    "link attribute": (
        {"links": [Link(CONTEXT, {"l": ODD})]},
        {"links": [(CONTEXT, {"l": FIXED})]},
    ),
    "resource": (
        {"resource": Resource({"service.name": ODD})},
        {"resource": ({"service.name": FIXED}, "")},
    ),
    "scope": (
        {"scope": InstrumentationScope(ODD, "1.0", "https://schema", {"s": "v"})},
        {"scope": (FIXED, "1.0", "https://schema", {"s": "v"})},
    ),
}


@documents("limits.md", "A name or key that is not a `str` becomes its `str()`")
@pytest.mark.parametrize("change", list(SPAN_CHANGES), ids=list(SPAN_CHANGES))
def test_each_part_of_a_span_is_bounded_and_nothing_else_changes(change):
    """One part of a span needs the rule: that part is fixed in a new span, every other part
    is as it was; the span without the change is handed on as the same object."""
    clean = _clean_span()
    assert bounded_span(clean) is clean
    given, fixed = SPAN_CHANGES[change]
    record = _clean_span(**given)
    bounded = bounded_span(record)
    assert bounded is not record
    expected = _span_parts(clean) | fixed
    assert _span_parts(bounded) == expected
    assert bounded_span(bounded) is bounded  # nothing left to do


def test_an_odd_string_in_a_sequence_value_is_bounded():
    """A sequence attribute value is bounded item by item, in a span and in attributes alone:
    its odd string escaped, the other items and attributes kept."""
    attributes = {"a": ("x", ODD), "n": 1}
    assert dict(bounded_span(_clean_span(attributes=attributes)).attributes) == {
        "a": ("x", FIXED),
        "n": 1,
    }
    assert limits.bounded_attributes(attributes) == {"a": ("x", FIXED), "n": 1}


def _clean_log(limits_=None, **changes):
    fields = {
        "body": "loss went up",
        "attributes": {"a": "x", "n": 1, "f": 1.5, "b": True, "t": ("u", "v")},
        "severity_text": "WARNING",
        "event_name": "train.event",
        "resource": Resource({"service.name": "train"}),
        "scope": InstrumentationScope("otel_training", "1.0"),
    }
    fields.update(changes)
    return ReadableLogRecord(
        LogRecord(
            timestamp=3,
            observed_timestamp=4,
            body=fields["body"],
            attributes=fields["attributes"],
            severity_text=fields["severity_text"],
            severity_number=SeverityNumber.WARN,
            event_name=fields["event_name"],
        ),
        resource=fields["resource"],
        instrumentation_scope=fields["scope"],
    )


def _log_parts(record) -> dict:
    log = record.log_record
    return {
        "body": log.body,
        "attributes": dict(log.attributes),
        "severity_text": log.severity_text,
        "event_name": log.event_name,
        "resource": dict(record.resource.attributes),
        "scope": record.instrumentation_scope.name,
        "rest": (log.timestamp, log.observed_timestamp, log.severity_number),
    }


def _nested(value, levels: int, kind=list):
    for _ in range(levels):
        value = kind([value])
    return value


LOG_CHANGES = {
    "body: a lone surrogate": ({"body": ODD}, {"body": FIXED}),
    "body: bytes beyond the limit": (
        {"body": b"\xff" * 20_000},
        {"body": b"\xff" * 16_360 + cut_marker(3_640).encode()},  # 16,384 bytes in all
    ),
    "body: a map with a key that is not a string": ({"body": {1: "v"}}, {"body": {"1": "v"}}),
    "body: a map with an odd key": ({"body": {ODD: "v"}}, {"body": {FIXED: "v"}}),
    "body: a list with an odd item": ({"body": ["a", [ODD]]}, {"body": ("a", (FIXED,))}),
    "body: beyond int64": ({"body": -(2**64)}, {"body": float(-(2**64))}),
    "body: nine levels deep": (
        {"body": _nested(["deep"], 8)},
        {"body": _nested("['deep']", 8, tuple)},
    ),
    "attribute key": ({"attributes": {ODD: 1}}, {"attributes": {FIXED: 1}}),
    "attribute value": ({"attributes": {"a": ODD}}, {"attributes": {"a": FIXED}}),
    "attribute value: a map": (
        {"attributes": {"a": {"k": ODD}}},
        {"attributes": {"a": {"k": FIXED}}},
    ),
    "severity text": ({"severity_text": ODD}, {"severity_text": FIXED}),
    "event name": ({"event_name": ODD}, {"event_name": FIXED}),
    "resource": (
        {"resource": Resource({"service.name": ODD})},
        {"resource": {"service.name": FIXED}},
    ),
    "scope": ({"scope": InstrumentationScope(ODD)}, {"scope": FIXED}),
}


@pytest.mark.parametrize("change", list(LOG_CHANGES), ids=list(LOG_CHANGES))
def test_each_part_of_a_log_record_is_bounded_and_nothing_else_changes(change):
    """One part of a log record needs the rule (body, attribute keys and values, severity
    text, event name, resource, scope): that part is fixed in a new record, every other part
    is as it was; the record without the change is handed on as the same object."""
    clean = _clean_log()
    assert bounded_log_record(clean) is clean
    given, fixed = LOG_CHANGES[change]
    record = _clean_log(**given)
    bounded = bounded_log_record(record)
    assert bounded is not record
    assert _log_parts(bounded) == _log_parts(clean) | fixed
    assert bounded_log_record(bounded) is bounded


def test_a_string_is_wide_when_a_character_is_beyond_u_ffff_by_size_or_by_scan():
    """A string costs two escapes a character (12 bytes) when one of its characters is beyond
    U+FFFF: CPython's storage size tells in O(1), a scan elsewhere; both agree."""
    wide = ["\U0001f600", "a\U00010000", "é" * 5 + "\U0010ffff"]
    narrow = ["", "abc", "é" * 5, "\u0100\uffff", "\udc80" * 3, "\ud83d"]
    for check in (limits._wide_by_scan, limits._wide_by_size):
        assert [check(text) for text in wide + narrow] == [True] * 3 + [False] * 6, check
    assert limits.json_cost("\U0001f600" * 3) == 6 * 6 + 2  # two \\uXXXX escapes each


def _metrics(**changes):
    """MetricsData with one sum point (and its exemplar), all clean but for ``changes``."""
    from opentelemetry.sdk.metrics._internal.exemplar import Exemplar
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )

    fields = {
        "name": "train.tokens",
        "unit": "{token}",
        "description": "tokens seen",
        "attributes": {"a": "x", "n": 1},
        "value": 7,
        "exemplar": {"e": "y"},
        "resource": Resource({"service.name": "train"}),
        "scope": InstrumentationScope("otel_training", "1.0"),
    }
    fields.update(changes)
    exemplars = [] if fields["exemplar"] is None else [Exemplar(fields["exemplar"], 1.0, 2)]
    point = NumberDataPoint(fields["attributes"], 1, 2, fields["value"], exemplars)
    data = Sum([point], AggregationTemporality.CUMULATIVE, True)
    metric = Metric(fields["name"], fields["description"], fields["unit"], data)
    scope = ScopeMetrics(fields["scope"], [metric], "")
    return MetricsData([ResourceMetrics(fields["resource"], [scope], "")])


def _metric_parts(data) -> dict:
    (resource_metrics,) = data.resource_metrics
    (scope_metrics,) = resource_metrics.scope_metrics
    (metric,) = scope_metrics.metrics
    (point,) = metric.data.data_points
    return {
        "name": metric.name,
        "unit": metric.unit,
        "description": metric.description,
        "attributes": dict(point.attributes),
        "value": point.value,
        "exemplar": [dict(e.filtered_attributes) for e in point.exemplars],
        "resource": dict(resource_metrics.resource.attributes),
        "scope": scope_metrics.scope.name,
        "rest": (point.start_time_unix_nano, point.time_unix_nano, metric.data.is_monotonic),
    }


METRIC_CHANGES = {
    "name": ({"name": ODD}, {"name": FIXED}),
    "unit": ({"unit": ODD}, {"unit": FIXED}),
    "no unit and no description": (
        {"unit": None, "description": None, "name": ODD},
        {"unit": "", "description": "", "name": FIXED},
    ),
    "description": ({"description": ODD}, {"description": FIXED}),
    "point attribute value": ({"attributes": {"a": ODD}}, {"attributes": {"a": FIXED}}),
    "point attribute key": ({"attributes": {ODD: 1}}, {"attributes": {FIXED: 1}}),
    "exemplar attribute": ({"exemplar": {"e": ODD}}, {"exemplar": [{"e": FIXED}]}),
    "value beyond int64": ({"value": 2**64}, {"value": 2**63 - 1}),
    "value below int64": ({"value": -(2**64)}, {"value": -(2**63)}),
    "resource": (
        {"resource": Resource({"service.name": ODD})},
        {"resource": {"service.name": FIXED}},
    ),
    "scope": ({"scope": InstrumentationScope(ODD)}, {"scope": FIXED}),
}


@pytest.mark.parametrize("change", list(METRIC_CHANGES), ids=list(METRIC_CHANGES))
def test_each_part_of_the_metrics_is_bounded_and_nothing_else_changes(change):
    """One part of a collection needs the rule (a metric's name, unit, description, a point's
    attribute keys and values or its int64 value, an exemplar's attributes, the resource, the
    scope): that part is fixed, every other part is as it was, and only an integer beyond
    int64 names its metric as saturated; the clean collection is handed on as itself."""
    clean = _metrics()
    assert limits.bounded_metrics_data(clean) is clean
    given, fixed = METRIC_CHANGES[change]
    saturated: list[str] = []
    bounded = limits.bounded_metrics_data(_metrics(**given), saturated=saturated)
    assert _metric_parts(bounded) == _metric_parts(clean) | fixed
    assert saturated == (["train.tokens"] if "int64" in change else [])
    assert limits.bounded_metrics_data(bounded) is bounded


def test_integers_at_the_ends_of_int64_are_not_saturated():
    """A point exactly at -2**63 or 2**63 - 1 is within int64: kept, not counted saturated."""
    for value in (-(2**63), 2**63 - 1):
        saturated: list[str] = []
        data = _metrics(value=value, description=ODD)  # needs work for its description
        bounded = limits.bounded_metrics_data(data, saturated=saturated)
        assert _metric_parts(bounded)["value"] == value and saturated == []


def test_a_point_over_its_budget_keeps_its_value_and_the_attributes_that_fit():
    """A point whose attributes exceed the record budget: its attributes are cut until its
    worst-case cost fits the budget (the longest values cut alike first), its value and times
    are kept; its exemplars are dropped when they do not fit with the attributes, never the
    attributes (the series) for them."""
    budget = 4_000
    many = {f"key{i}": "v" * 600 for i in range(20)}
    bounded = limits.bounded_metrics_data(
        _metrics(attributes=many), Limits(record_budget_bytes=budget)
    )
    (point,) = bounded.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert limits.metric_point_cost(point) <= budget
    assert point.value == 7 and (point.start_time_unix_nano, point.time_unix_nano) == (1, 2)
    assert list(point.attributes) == list(many)  # all kept, cut alike
    assert len({len(v) for v in point.attributes.values()}) == 1
    assert point.exemplars == []  # the attributes fill the budget: no room for exemplars
    bounded = limits.bounded_metrics_data(
        _metrics(exemplar=many, name=ODD), Limits(record_budget_bytes=budget)
    )
    (point,) = bounded.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert point.exemplars == [] and limits.metric_point_cost(point) <= budget
    assert dict(point.attributes) == {"a": "x", "n": 1}  # the series stays the series
    fits = {"key0": "v" * 600}
    small = limits.bounded_metrics_data(
        _metrics(attributes=dict(fits), exemplar=dict(fits), name=ODD),
        Limits(record_budget_bytes=budget),
    )
    (point,) = small.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert dict(point.attributes) == fits and len(point.exemplars) == 1


EMOJI = "\U0001f600"  # beyond U+FFFF: 12 bytes a character, the most any character costs


def _edge_cases(budget: int):
    """(span fields, log record fields) of records whose worst-case cost sweeps across
    ``budget``: 1-3 long values; a long status description (log body); a long value then a
    number under a 300-character key."""
    for length in range(budget // 12 - 60, budget // 12 + 60, 9):
        for count in (1, 2, 3):
            values = {f"k{i}": EMOJI * (length // count) for i in range(count)}
            yield {"attributes": values}, {"attributes": values}
        yield {"description": EMOJI * length}, {"body": EMOJI * length}
        values = {"s": EMOJI * length, "n" * 300: 1}
        yield {"attributes": values}, {"attributes": values}


@documents("limits.md", "All strings and values of one span or log record together")
@pytest.mark.parametrize("value_length", [None, 4_000])
def test_records_at_the_edge_of_the_budget_fit_it_whatever_their_shape(value_length):
    """Spans and log records of characters beyond U+FFFF (the worst case) swept across the
    record budget, their cost in values, in a description or body, or in a value beside a
    number: each, once bounded, is within the budget by its worst-case cost and by the bytes
    of its real OTLP-JSON line; the shortcuts that hand a record on unchanged never let one
    over it."""
    budget = 20_000
    rules = Limits(value_length=value_length, record_budget_bytes=budget)
    for span_fields, log_fields in _edge_cases(budget):
        record = bounded_span(span("s", **span_fields), rules)
        assert limits.span_cost(record) <= budget, span_fields.keys()
        assert _otlp_json_bytes(FileSpanExporter, record) <= budget + 400
        log = bounded_log_record(
            ReadableLogRecord(LogRecord(**{"body": "b", **log_fields}), resource=Resource({})),
            rules,
        )
        assert limits.log_record_cost(log) <= budget, log_fields.keys()
        assert _otlp_json_bytes(FileLogExporter, log) <= budget + 400


def test_metrics_values_are_cut_at_the_limit_given_and_clean_points_are_kept_as_they_are():
    """With a value-length limit of 40, point, exemplar, resource and scope attribute values
    are cut at 40 characters; a histogram point (no single value) is bounded alike; a point
    without exemplars that needed nothing is the same object in the new collection."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Histogram,
        HistogramDataPoint,
    )

    long, cut = "x" * 100, safe_text("x" * 100, 40)
    assert cut == "x" * 18 + cut_marker(82)  # 18 kept + 82 cut = 100; 18 + 22 = 40
    data = _metrics(
        attributes={"a": long},
        exemplar={"e": long},
        resource=Resource({"r": long}),
        scope=InstrumentationScope("otel_training", "1.0", None, {"s": long}),
    )
    bounded = limits.bounded_metrics_data(data, Limits(value_length=40))
    parts = _metric_parts(bounded)
    assert (parts["attributes"], parts["exemplar"], parts["resource"]) == (
        {"a": cut},
        [{"e": cut}],
        {"r": cut},
    )
    scope = bounded.resource_metrics[0].scope_metrics[0].scope
    assert dict(scope.attributes) == {"s": cut}
    clean = _metrics(name=ODD, exemplar=None)
    (point,) = clean.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    bounded = limits.bounded_metrics_data(clean)
    assert bounded.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0] is point
    histogram = HistogramDataPoint({"a": ODD}, 1, 2, 1, 1.0, [1, 0], [0.5], 1.0, 1.0, [])
    metric = clean.resource_metrics[0].scope_metrics[0].metrics[0]
    data = dataclasses.replace(
        clean,
        resource_metrics=[
            dataclasses.replace(
                clean.resource_metrics[0],
                scope_metrics=[
                    dataclasses.replace(
                        clean.resource_metrics[0].scope_metrics[0],
                        metrics=[
                            dataclasses.replace(
                                metric,
                                name="t",
                                data=Histogram([histogram], AggregationTemporality.DELTA),
                            )
                        ],
                    )
                ],
            )
        ],
    )
    bounded = limits.bounded_metrics_data(data)
    (point,) = bounded.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert dict(point.attributes) == {"a": FIXED} and point.bucket_counts == [1, 0]


def test_one_resource_is_bounded_at_each_signals_own_limit():
    """The pipeline's one resource, bounded for spans at 40 characters and for logs at 60,
    is cut at each limit (not at whichever signal came first), each result kept for reuse."""
    resource = Resource({"r": "x" * 100})
    for limit in (40, 60, 40):
        bounded = limits.bounded_resource(resource, limit)
        assert bounded.attributes["r"] == safe_text("x" * 100, limit)
        assert limits.bounded_resource(resource, limit) is bounded
    scope = InstrumentationScope("s", "1", None, {"a": "y" * 100})
    assert len(limits.bounded_scope(scope, 40).attributes["a"]) == 40
    assert len(limits.bounded_scope(scope, 60).attributes["a"]) == 60


def _points_line(points, kind: str) -> int:
    """Bytes of the OTLP-JSON line of one metric holding ``points``."""
    from opentelemetry.exporter.otlp.json.file import FileMetricExporter
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        ExponentialHistogram,
        Histogram,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
    )

    data = {
        "histogram": lambda: Histogram(points, AggregationTemporality.DELTA),
        "exponential": lambda: ExponentialHistogram(points, AggregationTemporality.DELTA),
    }[kind]()
    metric = Metric("m", "", "", data)
    collection = MetricsData(
        [ResourceMetrics(Resource({}), [ScopeMetrics(InstrumentationScope("s"), [metric], "")], "")]
    )
    stream = io.StringIO()
    FileMetricExporter(stream=stream).export(collection)
    return len(stream.getvalue().encode("utf-8"))


@documents("limits.md", "the structure around them as the OTLP-JSON files write it")
def test_the_estimate_of_a_metric_point_is_at_least_its_real_size_and_close():
    """A histogram point with 200 buckets and an exponential histogram point with 300
    positive and 200 negative buckets, each with exemplars: what one more such point adds to
    the real OTLP-JSON line is at most its worst-case estimate and at least half of it."""
    from opentelemetry.sdk.metrics._internal.exemplar import Exemplar
    from opentelemetry.sdk.metrics._internal.point import Buckets
    from opentelemetry.sdk.metrics.export import (
        ExponentialHistogramDataPoint,
        HistogramDataPoint,
    )

    big = 2**63 - 1
    exemplars = [Exemplar({"e": ""}, SMALL, big, 2**64 - 1, 2**128 - 1)] * 5
    histogram = HistogramDataPoint(
        {"a": ""}, big, big, big, SMALL, [big] * 201, [SMALL] * 200, SMALL, SMALL, exemplars
    )
    exponential = ExponentialHistogramDataPoint(
        {"a": ""}, big, big, big, SMALL, -10, big, Buckets(-(2**31), [big] * 300),
        Buckets(-(2**31), [big] * 200), 1, SMALL, SMALL, exemplars,
    )  # fmt: skip
    for point, kind in ((histogram, "histogram"), (exponential, "exponential")):
        added = _points_line([point, point], kind) - _points_line([point], kind)
        assert added <= limits.metric_point_cost(point) <= 2 * added, kind


@pytest.mark.parametrize(
    "part",
    ["attributes", "exemplar", "resource", "scope", "unit", "description", "histogram"],
)
def test_a_collection_needing_only_one_thing_is_bounded(part):
    """A collection whose only fault is one value over the limit of 40 (a point's, an
    exemplar's, the resource's, the scope's), a unit or description that is no clean name
    (they are names: 1,024 characters), or a histogram point over its budget, is bounded: the
    check that hands clean collections on never misses one."""
    long = "x" * 100
    changes = {
        "attributes": {"attributes": {"a": long}},
        "exemplar": {"exemplar": {"e": long}},
        "resource": {"resource": Resource({"r": long})},
        "scope": {"scope": InstrumentationScope("s", "1", None, {"s": long})},
        "unit": {"unit": ODD},
        "description": {"description": "d" * 1025},
        "histogram": {"attributes": {f"k{i}": "v" for i in range(200)}},
    }[part]
    data = _metrics(**changes)
    rules = Limits(value_length=40, record_budget_bytes=3000 if part == "histogram" else 10**6)
    bounded = limits.bounded_metrics_data(data, rules)
    assert bounded is not data
    (point,) = bounded.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert limits.metric_point_cost(point) <= rules.record_budget_bytes


def test_any_value_keeps_none_bools_floats_and_int64s_and_cuts_bytes_and_text_at_the_limit():
    """bounded_any (log bodies and attributes): None, booleans, floats and integers within
    int64 (its ends included) as they are, beyond it as floats; bytes and text longer than the
    limit cut to it, ending with the marker's bytes when at least 8 bytes of the value stay
    beside it, else cut plain; at or under the limit, or without one, as they are."""
    from otel_training.export.limits import bounded_any

    for value in (None, True, False, 1.5, -(2**63), 2**63 - 1, 0):
        kept = bounded_any(value)
        assert kept == value and type(kept) is type(value)
    assert type(bounded_any(2**63)) is float and type(bounded_any(-(2**63) - 1)) is float
    raw = b"x" * 100
    assert bounded_any(raw, 30) == b"x" * 30  # 22 of marker + 8 = 30: no room
    assert bounded_any(raw, 31) == b"x" * 9 + cut_marker(91).encode()  # 9 + 22 = 31
    assert bounded_any(raw, 40) == b"x" * 18 + cut_marker(82).encode()  # 18 + 22 = 40
    assert [bounded_any(b"x" * n, 40) for n in (40, 10)] == [b"x" * 40, b"x" * 10]
    assert bounded_any(b"x" * 10**6, None) == b"x" * 10**6
    assert bounded_any("x" * 100, 40) == safe_text("x" * 100, 40) == "x" * 18 + cut_marker(82)
    assert bounded_any(["x" * 100, {"k": b"y" * 50}], 40) == (
        safe_text("x" * 100, 40),
        {"k": b"y" * 18 + cut_marker(32).encode()},
    )


def test_a_log_records_severity_text_and_event_name_are_in_its_estimate():
    """A log record whose severity text and event name are 1,024 characters beyond U+FFFF
    (names, cut at 1,024): its real OTLP-JSON line is within its worst-case estimate."""
    record = bounded_log_record(
        ReadableLogRecord(
            LogRecord(body="b", severity_text=EMOJI * 2000, event_name=EMOJI * 2000),
            resource=Resource({}),
        )
    )
    assert len(record.log_record.severity_text) == len(record.log_record.event_name) == 1024
    groups = limits.scope_cost(record.instrumentation_scope) + limits.scope_cost(record.resource)
    assert _otlp_json_bytes(FileLogExporter, record) <= limits.log_record_cost(record) + groups


def test_any_values_maps_and_lists_are_bounded_inside_to_eight_levels():
    """Inside maps and lists every value is bounded at the limit and every map key cut as a
    name (1,024 characters); below 8 levels a value is its bounded str(); a subclass of float
    (numpy.float64) is its Python float."""
    numpy = import_or_unavailable("numpy")
    from otel_training.export.limits import MAX_NAME_LENGTH, bounded_any

    long, key = "x" * 100, "k" * 2000
    assert bounded_any({key: long, "l": [long]}, 40) == {
        safe_text(key, MAX_NAME_LENGTH): safe_text(long, 40),
        "l": (safe_text(long, 40),),
    }
    deep = {"v": long}
    for _ in range(8):
        deep = {"a": deep}  # 9 maps in all
    bounded = bounded_any(deep, 40)
    for _ in range(8):
        bounded = bounded["a"]
    assert bounded == safe_text(str({"v": long}), 40)
    value = bounded_any(numpy.float64(1.5), 40)  # a float subclass: its Python float
    assert value == 1.5 and type(value) is float


@documents(
    "limits.md",
    "A numpy scalar (`float32`, `int64`, `bool_`) or a subclass of a Python number is the number",
)
def test_numeric_scalars_of_other_types_are_their_python_numbers():
    """numpy's scalars (float32, int64, uint64, bool_: not subclasses of Python's numbers), a
    float subclass and an IntEnum are the Python bool, int or float they stand for, as
    attribute values and inside any-values; a uint64 beyond int64 is a float (rule 4); an
    array is no scalar: its text."""
    import enum

    numpy = import_or_unavailable("numpy")
    from otel_training.export.limits import bounded_any

    class Level(enum.IntEnum):
        HIGH = 3

    cases = [
        (numpy.float32(1.5), 1.5, float),
        (numpy.float64(2.5), 2.5, float),
        (numpy.int64(-7), -7, int),
        (numpy.uint64(2**64 - 1), float(2**64 - 1), float),
        (numpy.bool_(True), True, bool),
        (Level.HIGH, 3, int),
    ]
    for value, expected, kind in cases:
        for bounded in (bounded_value(value), bounded_any(value), bounded_any([value])[0]):
            assert bounded == expected and type(bounded) is kind, (value, bounded)
    assert bounded_value(numpy.array([1, 2])) == "[1 2]"


def test_a_log_record_over_its_budget_has_its_longest_strings_cut_alike_to_fit():
    """Unbounded values (no value-length limit) that together exceed the record budget: the
    body and the attribute values are cut to one length (water-filling), the longest the
    budget allows: the record fits by its estimate and its real line, and uses most of it."""
    body, values = "b" * 400_000, {f"k{i}": "\u00e9" * 100_000 for i in range(8)}
    record = bounded_log_record(
        ReadableLogRecord(LogRecord(body=body, attributes=values), resource=Resource({})),
        Limits(value_length=None),
    )
    cost = limits.log_record_cost(record)
    assert 0.97 * limits.RECORD_BUDGET_BYTES < cost <= limits.RECORD_BUDGET_BYTES
    cut = [record.log_record.body, *record.log_record.attributes.values()]
    assert len({len(text) for text in cut}) == 1 and all(t.endswith("characters cut]") for t in cut)
    assert cut[0].startswith("bbb") and cut[1].startswith("\u00e9")
    assert _otlp_json_bytes(FileLogExporter, record) <= cost + 400


def test_a_log_record_with_too_many_values_keeps_those_that_fit_in_order():
    """A log record whose values do not fit even cut to 32 characters (40,000 attributes):
    it keeps the attributes that fit, in order, from the first, and its body; it fits its
    budget by its estimate and its real line."""
    values = {f"key{i:05}": "v" * 40 for i in range(40_000)}
    record = bounded_log_record(
        ReadableLogRecord(LogRecord(body="why", attributes=values), resource=Resource({}))
    )
    kept = dict(record.log_record.attributes)
    assert 0 < len(kept) < len(values) and list(kept) == list(values)[: len(kept)]
    assert all(v.startswith("v") and len(v) <= 40 for v in kept.values())  # cut alike first
    assert record.log_record.body == "why"
    assert limits.log_record_cost(record) <= limits.RECORD_BUDGET_BYTES
    assert _otlp_json_bytes(FileLogExporter, record) <= limits.RECORD_BUDGET_BYTES + 400


# -- the worst-case estimate, exactly as documented (docs/limits.md; limits/cost.py) -----------
# Each figure below is worked out by hand from the unit: 1 byte a printable ASCII character
# (2 for " and \), 6 a UTF-16 code unit otherwise, 2 for the quotes; 32 a number or boolean,
# 28 a sequence item, 40 an attribute entry; 400 a span, 60 an event, 110 a link, 60 a scope,
# 300 a log record, 160 a metric point, 120 a metric, 33 a histogram bucket or bound.


@pytest.mark.parametrize(
    ("value", "cost"),
    [
        ("", 2),
        ("abc", 5),
        ('a"b\\c', 9),
        ("\x01\x7f", 14),
        ("é", 8),
        ("é\U0001f600", 20),  # 3 UTF-16 code units
        ("\U0001f600" * 2, 26),
        (7, 32),
        (True, 32),
        (2.5, 32),
        (None, 32),
        (["ab", 1], 94),  # 2 + (4 + 28) + (32 + 28)
        (("é",), 38),
        ([], 2),
    ],
)
def test_the_worst_case_json_size_of_a_value_is_the_documented_unit(value, cost):
    assert limits.json_cost(value) == cost


def test_the_worst_case_size_of_attributes_scopes_and_spans_is_the_documented_sum():
    """Attributes: 2 + each key and value and 40 an entry; a scope or resource: 60 + its
    attributes, name, version and schema URL; a span: 400 + its name, attributes, status
    description, trace state (twice its header, + 2), events (60 + name + attributes each)
    and links (110 + attributes + trace state each)."""
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    attributes = {"k": "v", "n": 1, "é": "\x01", "t": ("ab",)}
    # 2 + (3 + 40 + 3) + (3 + 40 + 32) + (8 + 40 + 8) + (3 + 40 + 34)
    assert limits._attributes_cost(attributes) == 256
    assert limits._attributes_cost({}) == limits._attributes_cost(None) == 2
    scope = InstrumentationScope("ab", "1.0", "https://x", {"k": "v"})
    assert limits.scope_cost(scope) == 60 + 48 + 4 + 5 + 11
    assert limits.scope_cost(None) == 2
    assert limits.scope_cost(Resource({"k": "v"}, "s")) == 60 + 48 + 3
    state = TraceState([("k", "v")])
    context = SpanContext(1, 2, False, TraceFlags(1), state)
    span = ReadableSpan(
        "sp",
        context=context,
        attributes={"k": "v"},
        events=[Event("e", {"a": 1})],
        links=[Link(context, {"b": "c"})],
        status=Status(StatusCode.ERROR, "bad"),
    )
    # 400 + name 4 + attributes 48 + description 5 + trace state 8
    # + event (60 + 3 + 77) + link (110 + 48 + 8)
    assert limits.span_cost(span) == 400 + 4 + 48 + 5 + 8 + 140 + 166


def test_the_worst_case_size_of_log_records_and_any_values_is_the_documented_sum():
    """An AnyValue: bytes their base64 (4 per 3, rounded up) + 2; a map 2 + each key, value
    and 40; a list 2 + each item and 28. A log record: 300 + its body, its attributes (as a
    map), its severity text and event name."""
    assert limits.any_cost(b"abcd") == 4 * 6 // 3 + 2
    assert limits.any_cost({"k": ["a", b"xyz"]}) == 2 + 3 + 40 + (2 + (3 + 28) + (8 + 28))
    assert limits.any_cost(3) == 32
    record = ReadableLogRecord(
        LogRecord(body="hi", attributes={"k": 1}, severity_text="WARN", event_name="ev"),
        resource=Resource({}),
    )
    assert limits.log_record_cost(record) == 300 + 4 + (2 + 3 + 40 + 32) + 6 + 4
    bare = ReadableLogRecord(LogRecord(body=None), resource=Resource({}))
    assert limits.log_record_cost(bare) == 300 + 32


def test_the_worst_case_size_of_a_metric_point_counts_buckets_and_exemplars():
    """A point: 160 + its attributes, 33 a bucket count or bound (positive and negative
    buckets of an exponential histogram alike), 160 + attributes an exemplar; a metric: 120 +
    its name, unit and description."""
    from types import SimpleNamespace

    point = SimpleNamespace(
        attributes={"k": "v"},
        bucket_counts=[1, 2, 3],
        explicit_bounds=[1.0, 2.0],
        exemplars=[SimpleNamespace(filtered_attributes={"e": 1})],
    )
    assert limits.metric_point_cost(point) == 160 + 48 + 33 * 5 + 160 + (2 + 3 + 40 + 32)
    exponential = SimpleNamespace(
        attributes={},
        positive=SimpleNamespace(bucket_counts=[1, 1]),
        negative=SimpleNamespace(bucket_counts=[4]),
        exemplars=[],
    )
    assert limits.metric_point_cost(exponential) == 160 + 2 + 33 * 3
    metric = SimpleNamespace(name="m", unit=None, description="d")
    assert limits.metric_cost(metric) == 120 + 3 + 2 + 3


def test_the_quick_bound_is_twelve_bytes_a_character_and_128_a_value():
    """_plain_bound, the shortcut before the full estimate: 12 bytes a character of the texts
    and of the keys and string values, 128 an attribute, + 400; anything it cannot count
    cheaply (a text that is no string, a value that is no primitive) is too large."""
    import sys

    attributes = {"key": "value", "n": 3, "b": True, "f": 0.5}
    chars = 1 + 2 + (3 + 5) + 1 + 1 + 1  # the texts, "key" and its value, the numbers' keys
    assert limits._plain_bound(("x", None, "ab"), attributes) == 12 * chars + 128 * 4 + 400
    assert limits._plain_bound((3,), {}) == sys.maxsize
    assert limits._plain_bound((), {"t": ("a",)}) == sys.maxsize
    assert limits._plain_bound((), None) == 400


@given(
    st.lists(st.text(st.sampled_from('ab"\\\x01é\U0001f600'), max_size=12), max_size=6),
    st.integers(min_value=0, max_value=400),
)
@example(["abc", "d"], 0)  # nothing fits: 0 characters
@settings(max_examples=examples(200), deadline=None)
def test_the_water_level_is_the_largest_cap_that_fits(strings, total):
    """_water_level: the largest cap c (characters) with sum(w(s) * min(len(s), c)) <= total,
    w(s) the most bytes a character of s takes (1, 2, 6 or 12): checked against every c."""

    def weight(text: str) -> int:
        if text.isascii() and text.isprintable():
            return 2 if '"' in text or "\\" in text else 1
        return 12 if any(ord(c) > 0xFFFF for c in text) else 6

    assert all(limits._char_cost(s) == weight(s) for s in strings)
    longest = max((len(s) for s in strings), default=0)
    fitting = [
        c
        for c in range(longest + 1)
        if sum(weight(s) * min(len(s), c) for s in strings if s) <= total
    ]
    assert limits._water_level(strings, total) == max(fitting)


@pytest.mark.parametrize(
    ("length", "limit", "kept"),
    [
        (100, 30, 8),  # "...[92 characters cut]" is 22: 8 + 22 = 30
        (110, 31, 8),  # 23 characters once the count has 3 digits: 8 + 23 = 31
        (109, 30, None),  # the marker leaves fewer than 8 characters: a plain cut
        (40, 40, 40),  # at the limit: nothing cut
    ],
)
def test_a_cut_string_ends_with_the_count_of_what_was_cut(length, limit, kept):
    text = "a" * length
    cut = limits._cut(text, limit) if length > limit else text
    if kept is None:
        assert cut == "a" * limit
    elif kept == length:
        assert cut == text
    else:
        assert cut == "a" * kept + limits.cut_marker(length - kept)
        assert len(cut) == limit
    assert limits.cut_marker(7) == "...[7 characters cut]"


def test_any_value_of_no_otlp_type_is_its_bounded_text():
    """bounded_any: an object of no OTLP type (a set, an object of the program) in a log body
    is its str() by the string rule, cut at the limit; a numpy-like number is its Python
    number; a map's keys are names (cut at 1,024)."""

    class Named:
        def __str__(self) -> str:
            return "n" * 100

    from otel_training.export.limits import bounded_any

    assert bounded_any(Named(), 40) == safe_text("n" * 100, 40)
    assert bounded_any({3}, 40) == "{3}"
    assert bounded_any({"k" * 2000: 1}) == {safe_text("k" * 2000, limits.MAX_NAME_LENGTH): 1}
    assert bounded_any("\udc80", 40) == "\\x80"


def test_python_number_is_only_for_numbers_and_numpy_scalars():
    """python_number: a bool as that bool, an int or float subclass as its value; an object
    that only looks like a scalar (an ``item()`` method, a tensor's for one) is no number."""

    class Boxed:
        def item(self) -> int:
            return 3

    assert limits.python_number(True) is True and limits.python_number(False) is False
    assert limits.python_number(Boxed()) is None
    assert limits.python_number("3") is None


def test_the_escaped_length_is_the_length_after_escaping():
    """_escaped_length counts what escaping makes of each lone surrogate of U+DC80..U+DCFF
    (\\xNN: 3 characters more), without escaping; other lone surrogates: not counted (None)."""
    for text in ("a\udc80b", "é\udc80\udcff", "\udcff" * 7 + "z", "plain"):
        assert limits._escaped_length(text) == len(text.translate(limits._ESCAPES)), text
    assert limits._escaped_length("a\ud800") is None


def test_what_an_any_value_needs_is_decided_at_the_limits_exactly():
    """_any_needs_work: int64's ends need nothing, one beyond does; 1,024 items or entries
    need nothing, 1,025 do; a string at the limit needs nothing, inside a list or a map as
    well, one over does; a key of 1,024 characters needs nothing, 1,025 do; containers
    nested to 8 levels need nothing, a 9th does; an object of no OTLP type does."""
    need = limits._any_needs_work
    top, bottom = 2**63 - 1, -(2**63)
    assert not need(top, 10) and not need(bottom, 10)
    assert need(top + 1, 10) and need(bottom - 1, 10)
    assert not need(["x"] * 1024, 10) and need(["x"] * 1025, 10)
    assert not need({str(i): 1 for i in range(1024)}, 10)
    assert need({str(i): 1 for i in range(1025)}, 10)
    assert not need(["x" * 10], 10) and need(["x" * 11], 10)
    assert not need({"k": "x" * 10}, 10) and need({"k": "x" * 11}, 10)
    assert not need({"k" * 1024: 1}, 10) and need({"k" * 1025: 1}, 10)
    for container in (lambda v: [v], lambda v: {"k": v}):
        value = 1
        for _ in range(8):
            value = container(value)
        assert not need(value, 10)
        assert need(container(value), 10)
    assert need(object(), 10) and need({1, 2}, 10)


def test_a_log_records_scope_resource_and_keys_are_bounded_at_its_limits():
    """bounded_log_record: the scope's and the resource's values are cut at the record's
    value limit; an attribute key beyond 1,024 characters is cut there."""
    long = "r" * 100
    record = ReadableLogRecord(
        LogRecord(body="b", attributes={"k" * 1500: 1}),
        resource=Resource({"host.name": long}),
        instrumentation_scope=InstrumentationScope("s", attributes={"a": long}),
    )
    bounded = limits.bounded_log_record(record, Limits(value_length=40))
    assert bounded.resource.attributes["host.name"] == safe_text(long, 40)
    assert bounded.instrumentation_scope.attributes["a"] == safe_text(long, 40)
    assert list(bounded.log_record.attributes) == [safe_text("k" * 1500, limits.MAX_NAME_LENGTH)]


def test_a_log_record_is_fitted_by_its_estimate_to_the_byte():
    """_fit_log_record: a record at its budget is kept; one byte under it, the body loses what
    the water level says (its cost is 300 + the body + 2 for no attributes)."""
    body = "a" * 100
    cost = 300 + 102 + 2
    assert limits._fit_log_record(body, {}, cost) == (body, {})
    cut, _ = limits._fit_log_record(body, {}, cost - 1)
    assert cut == limits._cut(body, 99)
    cut, _ = limits._fit_log_record(body, {}, cost - 10)
    assert cut == limits._cut(body, 90)


def test_a_log_record_of_too_many_values_keeps_half_its_budget_of_attributes_in_order():
    """When even values cut to 32 characters do not fit: the attributes that fit in half the
    budget (with the record's 300), in order, are kept; the body, as its text, is cut to the
    room left at its widest character's bytes, 8 characters spare."""
    attributes = {f"k{i}": "v" * 100 for i in range(50)}
    body = {"m": ("x" * 50,) * 40}  # bounded: a list is a tuple then
    kept_body, kept = limits._fit_log_record(body, attributes, 2000)
    # each value cut to 32 characters: 34 bytes; "k0".."k9" 4 bytes, then 5; + 40 an entry
    # 300 + 8 x 78 = 924 <= 1,000 = 2,000 // 2; a 9th would make 1,002
    assert list(kept) == [f"k{i}" for i in range(8)]
    assert all(value == limits._cut("v" * 100, 32) for value in kept.values())
    text = safe_text({"m": tuple([limits._cut("x" * 50, 32)] * 40)}, None)
    room = (2000 - 924) // 1 - 8
    assert kept_body == limits._cut(text, room) and len(text) > room
    wide_body, _ = limits._fit_log_record({"m": ("é" * 50,) * 40}, attributes, 2000)
    wide = safe_text({"m": tuple([limits._cut("é" * 50, 32)] * 40)}, None)
    assert wide_body == limits._cut(wide, (2000 - 924) // 6 - 8)


def test_a_metric_point_is_bounded_by_its_cost_after_its_values_are_cut():
    """A point whose attribute values only need cutting to the value limit to fit the budget
    keeps its exemplars: its cost is measured after the cut. A metric without a unit or a
    description costs 2 bytes for each."""
    from types import SimpleNamespace

    budget = 4_000
    long = {"key0": "v" * 5_000}  # 5,000 bytes; cut to 600 characters it fits
    bounded = limits.bounded_metrics_data(
        _metrics(attributes=dict(long), exemplar={"e": "x"}, name=ODD),
        Limits(value_length=600, record_budget_bytes=budget),
    )
    (point,) = bounded.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert dict(point.attributes) == {"key0": safe_text("v" * 5_000, 600)}
    assert len(point.exemplars) == 1
    assert limits.metric_cost(SimpleNamespace(name="m", unit=None, description=None)) == 127
    assert limits.metric_point_cost(SimpleNamespace(attributes=None, exemplars=[])) == 162


def test_events_give_way_exceptions_first_then_the_earliest_to_the_byte():
    """_fewer_events keeps, within the budget to the byte, exception events first, then the
    earliest, in their order; an event costs 60 + its name + its attributes (_events_cost)."""
    events = [Event("a", {}), Event("exception", {"x": 1}), Event("b", {}), Event("c", {})]
    costs = [60 + 3 + 2, 60 + 11 + (2 + 3 + 40 + 32), 65, 65]
    assert limits._events_cost(events) == sum(costs)
    budget = costs[1] + costs[0]
    assert limits._fewer_events(events, budget) == events[:2]
    assert limits._fewer_events(events, budget - 1) == [events[1]]
    assert limits._fewer_events(events, budget + 65) == events[:3]


def test_a_long_description_is_cut_alike_with_the_attributes_filling_the_budget():
    """A span whose status description and an attribute value are both too long: both are
    cut to the same length, the highest with which the span fits its budget (less than a
    byte a string left over)."""
    budget = 20_000
    span = ReadableSpan(
        "s",
        context=trace_api.SpanContext(1, 2, False),
        attributes={"k": "v" * 50_000},
        status=Status(StatusCode.ERROR, "d" * 50_000),
    )
    bounded = limits.bounded_span(span, Limits(value_length=None, record_budget_bytes=budget))
    value, description = bounded.attributes["k"], bounded.status.description
    assert len(value) == len(description) and value.startswith("v") and description[0] == "d"
    assert 0 <= budget - limits.span_cost(bounded) < 2


def test_every_string_of_a_span_is_cut_alike_and_nothing_else_is_lost():
    """A span whose attribute, event attribute, link attribute and status description are
    all too long (and whose context carries a trace state): all four are cut to one length,
    the highest with which the span fits its budget (less than a byte a string left over);
    its name, event (name and time) and link (context) stay."""
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    budget = 30_000
    context = SpanContext(1, 2, False, TraceFlags(1), TraceState([("vendor", "x" * 40)]))
    span = ReadableSpan(
        "step",
        context=context,
        attributes={"k": "a" * 50_000},
        events=[Event("checkpoint", {"path": "b" * 50_000}, 1_234)],
        links=[Link(context, {"why": "c" * 50_000})],
        status=Status(StatusCode.ERROR, "d" * 50_000),
    )
    bounded = limits.bounded_span(span, Limits(value_length=None, record_budget_bytes=budget))
    (event,), (link,) = bounded.events, bounded.links
    cut = [
        bounded.attributes["k"],
        event.attributes["path"],
        link.attributes["why"],
        bounded.status.description,
    ]
    assert len({len(text) for text in cut}) == 1 and [t[0] for t in cut] == list("abcd")
    assert 0 <= budget - limits.span_cost(bounded) < 4
    assert bounded.name == "step" and (event.name, event.timestamp) == ("checkpoint", 1_234)
    assert link.context == context and bounded.context == context


def test_a_log_record_of_many_clean_values_is_fitted_all_the_same():
    """A log body of 1,000 map entries, or an attribute of 1,000 items, each within the value
    limit (nothing to escape or cut one by one) but together over the budget: fitted to the
    budget, not passed as they are."""
    budget = 50_000
    for body, attributes in (
        ({f"k{i}": "x" * 100 for i in range(1_000)}, {"n": 1}),
        ("b", {"l": ("x" * 100,) * 1_000}),
    ):
        record = ReadableLogRecord(
            LogRecord(body=body, attributes=attributes), resource=Resource({})
        )
        assert limits.log_record_cost(record) > budget
        bounded = limits.bounded_log_record(
            record, Limits(value_length=100, record_budget_bytes=budget)
        )
        assert limits.log_record_cost(bounded) <= budget


def test_a_fitted_log_record_keeps_its_attributes_uncapped_immutable_and_its_drop_count():
    """A log record fitted by the rule keeps every attribute the SDK kept (no new cap of 128),
    in an immutable mapping, with the SDK's count of the attributes it dropped."""
    from opentelemetry.attributes import BoundedAttributes

    record = ReadableLogRecord(LogRecord(body="b" * 10_000), resource=Resource({}))
    many = BoundedAttributes(maxlen=None, attributes={f"k{i}": i for i in range(200)})
    many.dropped = 3
    record.log_record.attributes = many
    bounded = limits.bounded_log_record(record, Limits(value_length=100))
    attributes = bounded.log_record.attributes
    assert len(attributes) == 200 and attributes.dropped == 3
    assert bounded.log_record.body == safe_text("b" * 10_000, 100)
    with pytest.raises(TypeError):
        attributes["new"] = 1
    plain = ReadableLogRecord(LogRecord(body="b" * 10_000, attributes={"k": 1}), Resource({}))
    assert type(plain.log_record.attributes) is dict  # the API's records: no drop count
    assert (
        limits.bounded_log_record(plain, Limits(value_length=100)).log_record.attributes.dropped
        == 0
    )


def test_long_keys_count_against_the_budget_whatever_the_value_limit():
    """With a small value limit (10 characters), 30 attributes whose keys are 1,000
    characters beyond U+FFFF (12 bytes each) are far over a 10,000-byte budget: a span and a
    log record are still fitted to it (the quick check before the estimate counts names at
    their longest, not only values at the limit)."""
    budget = 10_000
    keys = {f"{i:02d}" + EMOJI * 998: "v" for i in range(30)}
    span = ReadableSpan("s", context=trace_api.SpanContext(1, 2, False), attributes=keys)
    record = ReadableLogRecord(LogRecord(body="b", attributes=keys), resource=Resource({}))
    small = Limits(value_length=10, record_budget_bytes=budget)
    assert limits.span_cost(span) > budget and limits.log_record_cost(record) > budget
    assert limits.span_cost(limits.bounded_span(span, small)) <= budget
    assert limits.log_record_cost(limits.bounded_log_record(record, small)) <= budget


def test_a_long_trace_state_counts_against_the_budget():
    """A span whose values fill its budget to within 1,000 bytes and whose context carries a
    trace state of 1,800 characters (3,602 bytes at worst) is fitted to the budget: the quick
    checks before the estimate leave the trace state's cost aside."""
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    budget = 30_000
    state = TraceState([(f"k{i}", "v" * 100) for i in range(17)])
    assert len(state.to_header()) > 1_700
    context = SpanContext(1, 2, False, TraceFlags(1), state)
    plain = ReadableSpan("s", context=trace_api.SpanContext(1, 2, False))
    fixed = limits.span_cost(plain)  # the span with no value at all
    value = EMOJI * ((budget - fixed - 1_000) // 12)  # one attribute, its key "k"
    span = ReadableSpan("s", context=context, attributes={"k": value})
    assert limits.span_cost(span) > budget
    bounded = limits.bounded_span(span, Limits(value_length=None, record_budget_bytes=budget))
    assert limits.span_cost(bounded) <= budget


def test_the_quick_bound_counts_each_slot_at_its_longest_name_and_value():
    """_quick_bound: 12 bytes a character of a name (1,024 at most) and of a value (the limit),
    and 128 a slot."""
    assert limits._quick_bound(3, 10) == 3 * (12 * (1_024 + 10) + 128)
    assert limits._quick_bound(0, 16_384) == 0


def test_events_then_links_give_way_exactly_as_much_as_the_budget_needs():
    """A span whose 40 events and 40 links hold only numbers (nothing to cut), over a budget
    that its links alone exceed: every event goes (they give way first), then the last links,
    as few as fit the budget; the span's own attributes stay."""
    context = trace_api.SpanContext(1, 2, False)
    numbers = {f"n{j}": j for j in range(20)}
    span = ReadableSpan(
        "s",
        context=context,
        attributes={"a": 1, "b": 2},
        events=[Event(f"e{i}", numbers, i) for i in range(40)],
        links=[Link(context, numbers) for _ in range(40)],
    )
    budget = 50_000
    bounded = limits.bounded_span(span, Limits(record_budget_bytes=budget))
    kept = len(bounded.links)
    assert bounded.events == () or list(bounded.events) == []
    assert 0 < kept < 40 and dict(bounded.attributes) == {"a": 1, "b": 2}
    assert limits.span_cost(bounded) <= budget
    one_more = ReadableSpan(
        "s", context=context, attributes={"a": 1, "b": 2}, links=list(span.links)[: kept + 1]
    )
    assert limits.span_cost(one_more) > budget


@pytest.mark.parametrize("part", ["description", "event name", "event value", "link value"])
def test_one_long_string_alone_is_cut_at_its_limit(part):
    """A span whose only fault is one string over its limit (the status description, an event
    name, an event's or a link's attribute value) has that string cut, whatever else fits."""
    from opentelemetry.trace import SpanKind

    context = trace_api.SpanContext(1, 2, False)
    long = "q" * 200
    fields = {
        "description": {"status": Status(StatusCode.ERROR, long)},
        "event name": {"events": [Event("e" * 2_000, {}, 1)]},
        "event value": {"events": [Event("e", {"v": long}, 1)]},
        "link value": {"links": [Link(context, {"v": long})]},
    }[part]
    span = ReadableSpan("s", context=context, kind=SpanKind.SERVER, **fields)
    bounded = limits.bounded_span(span, Limits(value_length=50))
    if part == "description":
        assert bounded.status.description == safe_text(long, 50)
    elif part == "event name":
        assert bounded.events[0].name == safe_text("e" * 2_000, limits.MAX_NAME_LENGTH)
    elif part == "event value":
        assert bounded.events[0].attributes["v"] == safe_text(long, 50)
    else:
        assert bounded.links[0].attributes["v"] == safe_text(long, 50)
    assert bounded.kind is SpanKind.SERVER  # nothing else changes


def test_a_span_of_many_links_and_no_events_is_fitted():
    """A span whose links alone are over the budget (no events; few attributes) is fitted."""
    context = trace_api.SpanContext(1, 2, False)
    numbers = {f"n{j}": j for j in range(20)}
    span = ReadableSpan("s", context=context, links=[Link(context, numbers)] * 40)
    assert limits.span_cost(span) > 50_000
    bounded = limits.bounded_span(span, Limits(record_budget_bytes=50_000))
    assert limits.span_cost(bounded) <= 50_000 and 0 < len(bounded.links) < 40


def test_a_spans_scope_and_resource_are_bounded_at_its_limit():
    """bounded_span cuts the values of the span's scope and resource at the span's value
    limit, not at the default."""
    long = "r" * 100
    span = ReadableSpan(
        "s",
        context=trace_api.SpanContext(1, 2, False),
        resource=Resource({"host.name": long}),
        instrumentation_scope=InstrumentationScope("s", attributes={"a": long}),
    )
    bounded = limits.bounded_span(span, Limits(value_length=40))
    assert bounded.resource.attributes["host.name"] == safe_text(long, 40)
    assert bounded.instrumentation_scope.attributes["a"] == safe_text(long, 40)


class _SpanReadOnlyByFields(ReadableSpan):
    """An SDK span whose copying properties must not be read (they raise)."""

    def _copied(self):
        raise AssertionError("read through a property")

    name = property(_copied)
    attributes = property(_copied)
    events = property(_copied)
    links = property(_copied)


class _SpanOfProperties:
    """A span of another SDK: the properties of a ReadableSpan, no private fields."""

    def __init__(self, record: ReadableSpan):
        self.name, self.attributes = record.name, record.attributes
        self.events, self.links = record.events, record.links
        self.status, self.context = record.status, record.context


def test_a_spans_parts_are_read_from_the_sdks_fields_else_through_its_properties():
    """An SDK span is measured and bounded from its fields, without the copies its properties
    make (tuples of events and links, a proxy of the attributes) on the exporter's thread; a
    span of another kind, through the properties, to the same cost."""
    fields = {
        "context": CONTEXT,
        "attributes": {"a": "x" * 300, "n": 1},
        "events": [Event("e", {"k": "v" * 20}, 5)],
        "links": [Link(CONTEXT, {"l": "w" * 30})],
        "status": Status(StatusCode.ERROR, "failed"),
    }
    sdk = ReadableSpan("step", **fields)
    by_fields = _SpanReadOnlyByFields("step", **fields)
    expected = 400 + 6 + (2 + 3 + 40 + 302 + 3 + 40 + 32) + (60 + 3 + 2 + 3 + 40 + 22)
    expected += 110 + (2 + 3 + 40 + 32) + 8  # the link; the description "failed"
    assert limits.span_cost(sdk) == limits.span_cost(by_fields) == expected
    assert limits.span_cost(_SpanOfProperties(sdk)) == expected
    bounded = limits.bounded_span(by_fields, Limits(value_length=100))
    assert ReadableSpan.attributes.fget(bounded)["a"] == safe_text("x" * 300, 100)


def _with_items(attributes: dict, k: int) -> dict:
    return {key: value[:k] if type(value) is tuple else value for key, value in attributes.items()}


@settings(max_examples=examples(200), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    item=st.sampled_from(["x", "q" * 9, '"\\', EMOJI * 3]),
    extra=st.integers(0, 2_000),
    spare=st.integers(-400, 3_000),
)
def test_sequences_keep_the_most_items_that_fit(lengths, item, extra, spare):
    """_fewer_items cuts every sequence to the same number of items k, the largest with which
    the record (its attributes and ``extra`` bytes of the rest) fits the budget, or none, and
    returns the record's cost with them: checked against every k in turn."""
    attributes = {f"s{i}": (item,) * n for i, n in enumerate(lengths)}
    attributes["n"] = 7
    total = extra + limits._attributes_cost(attributes)
    budget = total - spare
    fitted, cost = limits._fewer_items(dict(attributes), total, budget)
    fits = [k for k in range(max(lengths) + 1)
            if extra + limits._attributes_cost(_with_items(attributes, k)) <= budget]  # fmt: skip
    best = max(fits, default=0)
    assert fitted == _with_items(attributes, best)
    assert cost == extra + limits._attributes_cost(fitted)


@settings(max_examples=examples(200), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 400), min_size=1, max_size=5),
    budget=st.integers(100, 3_000),
)
def test_attributes_over_their_budget_keep_the_longest_strings_that_fit(lengths, budget):
    """_fit_attributes cuts the longest strings alike to the largest cap (32 characters at
    least) with which the attributes fit: every string at or under that cap is kept whole, and
    a cap one character longer would not fit (checked by cutting them by hand)."""
    attributes = {f"k{i}": "v" * n for i, n in enumerate(lengths)}
    total = limits._attributes_cost(attributes)
    fitted = limits._fit_attributes(dict(attributes), budget)
    assert limits._attributes_cost(fitted) <= budget or total <= budget
    if total <= budget:
        assert fitted == attributes
        return

    def cut_to(cap: int) -> dict:
        return {k: v if len(v) <= cap else limits._cut(v, cap) for k, v in attributes.items()}

    caps = [c for c in range(32, max(lengths) + 1) if limits._attributes_cost(cut_to(c)) <= budget]
    if caps:
        assert fitted == cut_to(max(caps))
    else:  # at 32 characters the last attributes go, as few as fit
        kept = cut_to(32)
        while limits._attributes_cost(kept) > budget:
            kept.pop(list(kept)[-1])
        assert fitted == kept


def test_attributes_whose_strings_are_cut_to_the_shortest_then_lose_items_alike():
    """Attributes still over their budget with every string at 32 characters have their
    sequences cut alike to the most items that fit, before any attribute goes."""
    attributes = {"s": "x" * 500, "a": ("v" * 40,) * 100, "b": (1,) * 100}
    fitted = limits._fit_attributes(dict(attributes), 2_000)
    k = len(fitted["a"])
    assert (
        fitted["s"] == limits._cut("x" * 500, 32)
        and fitted["a"] == (limits._cut("v" * 40, 32),) * k
    )
    assert 0 < k < 100 and fitted["b"] == (1,) * k
    assert limits._attributes_cost(fitted) <= 2_000
    assert (
        limits._attributes_cost(_with_items(dict(fitted, a=fitted["a"] * 2, b=(1,) * 100), k + 1))
        > 2_000
    )


def test_a_span_fitted_at_the_shortest_cut_counts_its_trace_state_and_description():
    """A span of 400 long attributes, a trace state of about 7,000 characters and a status
    description beyond U+FFFF, whose strings cut to 32 characters still do not fit: its last
    attributes go, as many as the budget needs with the trace state (up to 14 KB) and the cut
    description (386 bytes) counted, and no more."""
    from opentelemetry.trace import SpanContext, TraceFlags, TraceState

    state = TraceState([(f"k{i}", "v" * 200) for i in range(32)])
    context = SpanContext(1, 2, False, TraceFlags(1), state)
    attributes = {f"a{i:03}": "x" * 64 for i in range(400)}
    span = ReadableSpan(
        "s", context=context, attributes=attributes, status=Status(StatusCode.ERROR, EMOJI * 500)
    )
    budget = 30_000
    bounded = limits.bounded_span(span, Limits(value_length=None, record_budget_bytes=budget))
    kept = dict(bounded.attributes)
    assert 0 < len(kept) < 400 and list(kept) == list(attributes)[: len(kept)]
    assert bounded.status.description == limits._cut(EMOJI * 500, 32)
    assert limits.span_cost(bounded) <= budget
    one_more = dict(kept, **{f"a{len(kept):03}": limits._cut("x" * 64, 32)})
    assert limits.span_cost(_with_attributes(bounded, one_more)) > budget


def _with_attributes(record: ReadableSpan, attributes: dict) -> ReadableSpan:
    return ReadableSpan(
        record.name,
        context=record.context,
        attributes=attributes,
        events=list(record.events),
        links=list(record.links),
        status=record.status,
    )


def test_events_give_way_before_sequences_and_sequences_to_the_most_items_that_fit():
    """A span whose 30 events (an exception event first) and 3 sequences of 500 items are over
    a budget that the sequences alone exceed: every event goes (events give way first, the
    exception event too when nothing is left for it), then the sequences are cut alike to the
    most items that fit."""
    events = [Event("exception", {"exception.message": "m" * 20}, 1)]
    events += [Event(f"e{i}", {"v": "w" * 200}, i) for i in range(2, 31)]
    sequences = {f"s{i}": ("item",) * 500 for i in range(3)}
    span = ReadableSpan("s", context=CONTEXT, attributes=sequences, events=events)
    budget = 40_000
    assert limits.span_cost(ReadableSpan("s", context=CONTEXT, attributes=sequences)) > budget
    bounded = limits.bounded_span(span, Limits(record_budget_bytes=budget))
    assert list(bounded.events) == []
    lengths = {len(v) for v in bounded.attributes.values()}
    assert len(lengths) == 1 and 0 < lengths.pop() < 500
    assert limits.span_cost(bounded) <= budget
    k = len(bounded.attributes["s0"])
    one_more = {key: ("item",) * (k + 1) for key in sequences}
    assert limits.span_cost(_with_attributes(bounded, one_more)) > budget


def test_an_attribute_values_items_numbers_and_objects_are_bounded_at_the_limit():
    """bounded_value: each string of a sequence is cut at the limit, like a string alone; an
    object's text too; integers are kept to the ends of int64 exactly, beyond them floats."""
    assert bounded_value(("x" * 100, "y"), 40) == (safe_text("x" * 100, 40), "y")
    assert bounded_value(["x" * 100], 40) == (safe_text("x" * 100, 40),)
    assert bounded_value(Exception("e" * 100), 40) == safe_text("e" * 100, 40)
    for kept in (2**63 - 1, -(2**63), 0):
        assert type(bounded_value(kept)) is int and bounded_value(kept) == kept
    for beyond in (2**63, -(2**63) - 1):
        assert type(bounded_value(beyond)) is float and bounded_value(beyond) == float(beyond)


def test_a_cut_of_escaped_surrogates_counts_what_was_cut_of_the_whole_escaped_text():
    """1,000 undecodable bytes (U+DC80, ``\\x80`` once escaped: 4,000 characters) cut at 50
    characters keep the first 26 escaped characters and say that 3,974 were cut, though only
    the head was escaped."""
    whole = "\\x80" * 1_000
    assert safe_text("\udc80" * 1_000, 50) == whole[:26] + "...[3974 characters cut]"


def _cut_all(value, cap: int):
    """Every string in ``value`` (a string, a tuple, a map) cut to ``cap`` characters."""
    if type(value) is str:
        return value if len(value) <= cap else limits._cut(value, cap)
    if type(value) is tuple:
        return tuple(_cut_all(v, cap) for v in value)
    if type(value) is dict:
        return {k: _cut_all(v, cap) for k, v in value.items()}
    return value


def test_a_string_exactly_at_the_water_level_is_kept_whole():
    """Two strings of 100 and 60 characters with a budget that fits them both at 60: the
    first is cut to 60 characters, the second, exactly 60, is kept as it is (no marker)."""
    attributes = {"a": "x" * 100, "b": "y" * 60}
    budget = limits._attributes_cost({"a": "x" * 60, "b": "y" * 60})
    assert limits._fit_attributes(dict(attributes), budget) == {
        "a": limits._cut("x" * 100, 60),
        "b": "y" * 60,
    }


@settings(max_examples=examples(100), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    shape=st.sampled_from(["attributes", "sequences", "map body"]),
    spare=st.integers(0, 4_000),
)
def test_strings_in_sequences_and_maps_are_cut_to_the_largest_level_that_fits(
    lengths, shape, spare
):
    """The water level counts every string of a record, in sequences and in a log body's
    maps too: the strings are cut to the largest cap (32 characters at least) with which the
    record fits, found here by trying every cap."""
    values = {f"k{i}": "v" * n for i, n in enumerate(lengths)}
    if shape == "map body":
        body, attributes = {"m": values, "t": ("w" * 50,)}, {"a": "u" * 40}

        def cost(body, attributes):
            return (
                limits._LOG_RECORD_COST
                + limits.any_cost(body)
                + 2
                + sum(limits.json_cost(k) + 40 + limits.any_cost(v) for k, v in attributes.items())
            )

        budget = max(300, cost(body, attributes) - spare)
        fitted = limits._fit_log_record(body, attributes, budget)
        caps = [
            c for c in range(32, 301) if cost(_cut_all(body, c), _cut_all(attributes, c)) <= budget
        ]
        if cost(body, attributes) <= budget:
            assert fitted == (body, attributes)  # nothing to cut
        elif caps:
            assert fitted == (_cut_all(body, max(caps)), _cut_all(attributes, max(caps)))
        else:  # at 32 characters still over: attributes go, the body is cut as text, to
            # fit, or to 32 characters when the budget is smaller than a record can be
            assert type(fitted[0]) is str
            assert cost(*fitted) <= budget or len(fitted[0]) == 32
        return
    attributes = values if shape == "attributes" else {"s": tuple(values.values()), "n": 1}
    budget = max(100, limits._attributes_cost(attributes) - spare)
    fitted = limits._fit_attributes(dict(attributes), budget)
    caps = [c for c in range(32, 301) if limits._attributes_cost(_cut_all(attributes, c)) <= budget]
    if caps:
        assert fitted == _cut_all(attributes, max(caps))
    else:
        assert limits._attributes_cost(fitted) <= budget


class _LyingText(str):
    """A str subclass whose methods lie: it says it is short, ASCII and encodable."""

    def __len__(self):
        return 0

    def isascii(self):
        return True

    def encode(self, *args, **kwargs):
        return b""


class _GivesLyingText:
    def __str__(self):
        return _LyingText("\udc80" + "z" * 2_000)


def test_an_objects_text_of_a_str_subclass_is_bounded_as_a_plain_str():
    """An object whose ``str()`` is a str subclass with misbehaving methods: its text is
    taken as a plain str and bounded by the rule (escaped, cut at the limit)."""
    text = safe_text(_GivesLyingText(), 100)
    assert type(text) is str
    assert text == safe_text("\udc80" + "z" * 2_000, 100) and len(text) == 100


def test_lone_surrogates_are_escaped_without_a_limit():
    """safe_text with no limit escapes lone surrogates and cuts nothing."""
    assert safe_text("a\udc80b\ud800" + "c" * 5_000, None) == "a\\x80b\\ud800" + "c" * 5_000


def _group_of_cost(cost: int, make):
    """``make(attributes)`` (a scope or a resource) whose :func:`limits.scope_cost` is
    ``cost`` exactly, of one clean attribute."""
    attributes = {"a": ""}
    attributes["a"] = "v" * (cost - limits.scope_cost(make(attributes)))
    group = make(attributes)
    assert limits.scope_cost(group) == cost
    return group


@pytest.mark.parametrize("kind", ["scope", "resource"])
def test_a_scope_or_resource_of_clean_values_is_kept_to_its_budget_exactly(kind):
    """A scope or resource whose values need nothing but whose size is at the group budget
    (48 KiB) exactly is kept as it is; one byte more and its value is cut by one character
    (and ends with the marker)."""
    if kind == "scope":

        def make(attributes):
            return InstrumentationScope("s", "1", "https://s", attributes)

        bound = limits.bounded_scope
    else:

        def make(attributes):
            return Resource(attributes)

        bound = limits.bounded_resource
    budget = limits.GROUP_BUDGET_BYTES
    at_budget = _group_of_cost(budget, make)
    assert bound(at_budget, None) is at_budget
    over = _group_of_cost(budget + 1, make)
    bounded = bound(over, None)
    assert limits.scope_cost(bounded) <= budget
    long = over.attributes["a"]
    assert dict(bounded.attributes) == {"a": limits._cut(long, len(long) - 1)}


class _CountsReads:
    """Counts (on its class) how often the attributes of a scope or resource are read."""

    reads = 0

    @property
    def attributes(self):
        type(self).reads += 1
        return super().attributes


class _CountedScope(_CountsReads, InstrumentationScope):
    pass


class _CountedResource(_CountsReads, Resource):
    pass


@pytest.mark.parametrize("needs_work", [False, True])
def test_a_scope_or_resource_is_checked_once_per_object_and_limit(needs_work):
    """Each span of a batch carries the same scope and resource objects: each is checked once
    per object and value limit, and the same bounded object is given every time after."""
    value = "x" * (50 if needs_work else 10)
    scope = _CountedScope("s", attributes={"a": value})
    resource = _CountedResource({"a": value})
    _CountedScope.reads = _CountedResource.reads = 0
    first = limits.bounded_scope(scope, 20), limits.bounded_resource(resource, 20)
    reads = _CountedScope.reads, _CountedResource.reads
    for _ in range(3):
        assert limits.bounded_scope(scope, 20) is first[0]
        assert limits.bounded_resource(resource, 20) is first[1]
    assert (_CountedScope.reads, _CountedResource.reads) == reads
    assert (first[0] is scope) is (not needs_work) and (first[1] is resource) is (not needs_work)
    limits.bounded_scope(scope, 30)  # another limit: checked again
    assert _CountedScope.reads > reads[0]


_ITEMS = st.one_of(
    st.text(max_size=6),
    st.sampled_from([ODD, "\u2028", "x" * 40]),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", ODD]),
        st.one_of(
            _ITEMS,
            st.tuples(_ITEMS, _ITEMS),
            st.lists(_ITEMS, max_size=3).map(tuple),
            st.lists(_ITEMS, max_size=3),
            st.tuples(st.tuples(_ITEMS)),
        ),
        max_size=3,
    )
)
@example({"t": tuple(range(limits.MAX_SEQUENCE_LENGTH))})
@example({"t": tuple(range(limits.MAX_SEQUENCE_LENGTH + 1))})
def test_attributes_come_back_as_they_are_exactly_when_every_key_and_value_is_its_own_bound(
    attributes,
):
    """The same object comes back exactly when nothing would change: every key is its own
    bounded name and every value its own :func:`bounded_value`, of the same type (a tuple of
    clean items is kept, nested or not; a list becomes a tuple)."""
    unchanged = all(
        limits.safe_text(key, limits.MAX_NAME_LENGTH) == key
        and type(bounded_value(value, 30)) is type(value)
        and bounded_value(value, 30) == value
        for key, value in attributes.items()
    )
    assert (limits.bounded_attributes(attributes, 30) is attributes) is unchanged


def test_attributes_at_the_ends_of_int64_need_nothing():
    """Integers at the ends of int64 and text beyond ASCII that encodes need no change: the
    same attributes are given back."""
    attributes = {"max": 2**63 - 1, "min": -(2**63), "text": "é\u4e2d\U0001f600"}
    assert limits.bounded_attributes(attributes) is attributes
    beyond = {"max": 2**63}
    assert limits.bounded_attributes(beyond) == {"max": float(2**63)}


def test_a_resources_schema_url_is_a_name_by_the_rule_and_kept_when_values_are_cut():
    """A resource's schema URL is bounded as a name (escaped, 1,024 characters) and kept when
    its values are cut; its cost counts against the group budget; a resource that cannot be
    read becomes an empty one."""
    odd = limits.bounded_resource(Resource({"a": "b"}, "https://x/\udc80"))
    assert odd.schema_url == "https://x/\\x80" and dict(odd.attributes) == {"a": "b"}
    url = "https://schema/" + "u" * 1_000
    big = Resource({"a": "v" * 60_000}, url)
    bounded = limits.bounded_resource(big, None)
    assert bounded.schema_url == url
    assert limits.scope_cost(bounded) <= limits.GROUP_BUDGET_BYTES
    cap = len(bounded.attributes["a"])
    assert bounded.attributes["a"] == limits._cut("v" * 60_000, cap)
    assert limits.scope_cost(Resource({"a": "v" * (cap + 1)}, url)) > limits.GROUP_BUDGET_BYTES

    class Unreadable(Resource):
        @property
        def attributes(self):
            raise RuntimeError("gone")

    empty = limits.bounded_resource(Unreadable({}))
    assert type(empty) is Resource and dict(empty.attributes) == {}


def test_plain_reads_the_dict_inside_the_sdks_bounded_attributes():
    """plain: the dict inside a BoundedAttributes (its items() takes a lock per call), any
    other mapping as it is."""
    from types import MappingProxyType

    from opentelemetry.attributes import BoundedAttributes

    bounded = BoundedAttributes(attributes={"a": 1, "b": "x"}, immutable=False)
    inner = limits.plain(bounded)
    assert type(inner) is dict and inner == {"a": 1, "b": "x"}
    bounded["c"] = 2.5
    assert inner == {"a": 1, "b": "x", "c": 2.5}  # the same dict, not a copy
    proxy = MappingProxyType({"a": 1})
    assert limits.plain(proxy) is proxy


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("x" * 100, 100, "x" * 100),  # exactly the limit: nothing cut, no marker
        ("\udc80" * 25, 100, "\\x80" * 25),  # 100 characters once escaped
        ("\ud800" * 1_000, 50, ("\\ud800" * 1_000)[:26] + "...[5974 characters cut]"),
    ],
    ids=["exactly the limit", "escaped to the limit", "other surrogates"],
)
def test_the_limit_counts_characters_after_escaping(text, limit, expected):
    """A string of exactly the limit, after escaping, is kept whole; a longer one of
    surrogates outside U+DC80..U+DCFF (6 characters each once escaped) is cut, its marker
    counting what was cut of the whole escaped text."""
    assert safe_text(text, limit) == expected


def test_a_scope_is_bounded_as_names_keeping_what_it_lacks_and_an_unreadable_one_is_named():
    """A scope whose name must be cut (the SDK's, or another with the same fields) keeps its
    missing version and schema URL missing (not the text "None"); a scope that cannot be
    read becomes one named ``<unreadable scope>``; a missing resource or scope stays
    missing."""
    from types import SimpleNamespace

    long = "n" * 2_000
    for scope in (
        InstrumentationScope(long),
        SimpleNamespace(name=long, version=None, schema_url=None, attributes=None),
    ):
        bounded = limits.bounded_scope(scope)
        assert bounded.name == safe_text(long, limits.MAX_NAME_LENGTH)
        assert bounded.version is None and bounded.schema_url == ""  # the SDK's "none"

    class Unreadable(InstrumentationScope):
        @property
        def attributes(self):
            raise RuntimeError("gone")

    unreadable = limits.bounded_scope(Unreadable("s"))
    assert type(unreadable) is InstrumentationScope and unreadable.name == "<unreadable scope>"
    assert limits.bounded_scope(None) is None and limits.bounded_resource(None) is None


@pytest.mark.parametrize(
    ("text", "cost"),
    [("ab", 1), ('a"', 2), ("a\\", 2), ("a\x01", 6), ("é", 6), ("\u4e2d", 6), (EMOJI, 12)],
)
def test_a_characters_most_bytes_are_by_its_widest_kind(text, cost):
    """_char_cost: the most JSON bytes one character of ``text`` takes: 1 for printable ASCII,
    2 with a quote or a backslash, 6 for controls and other characters, 12 beyond U+FFFF."""
    assert limits._char_cost(text) == cost


def test_another_resource_without_a_schema_url_gets_none_when_bounded():
    """A resource of another kind (its fields, no schema URL) whose value must be cut gets the
    SDK's empty schema URL, not the text "None"."""
    from types import SimpleNamespace

    bounded = limits.bounded_resource(
        SimpleNamespace(attributes={"a": "x" * 50}, schema_url=None), 20
    )
    assert dict(bounded.attributes) == {"a": safe_text("x" * 50, 20)} and bounded.schema_url == ""


def test_the_quick_bound_counts_the_values_of_every_event():
    """A span of 300 events, each with one value at the limit (100 characters), over a budget
    that the quick bound of one event's values would pass: every event's values count, the
    estimate decides, and the span is fitted (its values cut alike)."""
    events = [Event("e", {"v": "x" * 100}, i) for i in range(300)]
    span = ReadableSpan("s", context=CONTEXT, events=events)
    budget = 60_000
    assert limits.span_cost(span) > budget
    assert 400 + limits._quick_bound(4, 100) <= budget  # what one event's count would pass
    bounded = limits.bounded_span(span, Limits(value_length=100, record_budget_bytes=budget))
    assert bounded is not span and limits.span_cost(bounded) <= budget
    assert len(bounded.events) == 300  # their values cut alike, a little
