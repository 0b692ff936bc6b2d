"""The string rule of otel_training.limits: any string encodes, values are bounded, cut values
say so, records fit their budget."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Status, StatusCode

from otel_training import limits
from otel_training.limits import Limits, bounded_span, bounded_value, cut_marker, safe_text

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


def test_undecodable_file_name_bytes_become_backslash_escapes():
    """Case A12: os.fsdecode's lone surrogates become \\xNN; the rest is kept intact."""
    path = os.fsdecode(b"/ckpt/run-\xff\xfe/step-000100.pt")
    assert safe_text(path) == "/ckpt/run-\\xff\\xfe/step-000100.pt"
    assert safe_text("a\ud800b") == "a\\ud800b"
    assert safe_text("caf\u00e9 \U0001f600 \x00\x07") == "caf\u00e9 \U0001f600 \x00\x07"


def test_non_strings_and_broken_str_become_text():
    """A name that is not a str is its str(); one whose __str__ raises is <TypeName>."""

    class Broken:
        def __str__(self):
            raise RuntimeError("no")

    assert safe_text(42) == "42"
    assert safe_text(Broken()) == "<Broken>"


def test_a_cut_value_says_so_and_keeps_the_limit():
    """A string over the limit keeps its head, ends with the marker, and is exactly the limit."""
    text = "x" * 5_000_000
    cut = safe_text(text, 4096)
    assert len(cut) == 4096
    assert cut.endswith(cut_marker(5_000_000 - 4096 + len(cut_marker(5_000_000 - 4096))))
    assert cut.startswith("x" * 4000)
    assert safe_text("short", 4096) == "short"


@settings(max_examples=300, deadline=None)
@given(text=ANY_TEXT, limit=st.integers(min_value=0, max_value=400))
def test_any_string_encodes_and_is_bounded(text, limit):
    """Property: whatever the string, the result encodes as UTF-8 and is within the limit."""
    result = safe_text(text, limit)
    result.encode("utf-8")
    assert len(result) <= limit
    json.loads(json.dumps(result, ensure_ascii=False))


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


@settings(max_examples=150, deadline=None)
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
