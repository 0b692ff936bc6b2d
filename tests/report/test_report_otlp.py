"""report.otlp: one line of a run file as one JSON document (a cut line is Torn; NaN and lone
surrogates read), OTLP/JSON values and resources as Python values."""

from __future__ import annotations

import json
import math

import pytest
from report_files import gauge, metrics_line, resource_attributes, span_record

from otel_training.report import otlp


def test_a_cut_line_is_torn_and_a_whole_one_reads():
    """The first half of a line raises Torn; the whole line is the document."""
    line = span_record("span_end", "megatron.train", "1" * 16, None, 10, 20).encode()
    assert otlp.loads(line)["name"] == "megatron.train"
    with pytest.raises(otlp.Torn):
        otlp.loads(line[: len(line) // 2])


def test_bare_non_finite_numbers_and_lone_surrogates_read():
    """json's NaN and Infinity (orjson refuses them) read; a lone surrogate becomes a
    backslash escape, so the document can be written as UTF-8 again."""
    document = otlp.loads(b'{"loss": NaN, "top": Infinity, "name": "a\\ud800b"}')
    assert math.isnan(document["loss"]) and document["top"] == math.inf
    assert document["name"] == "a\\ud800b"
    document["name"].encode("utf-8")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"stringValue": "x"}, "x"),
        ({"intValue": "9007199254740993"}, 9007199254740993),
        ({"doubleValue": "NaN"}, "nan"),
        ({"doubleValue": "-Infinity"}, -math.inf),
        ({"boolValue": True}, True),
        ({"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "b"}]}}, [1, "b"]),
        ({"kvlistValue": {"values": [{"key": "k", "value": {"intValue": "2"}}]}}, {"k": 2}),
        ({}, None),
    ],
)
def test_any_value_reads_every_kind(value, expected):
    """Each AnyValue kind of the OTLP/JSON mapping as its Python value (64-bit ints exact)."""
    found = otlp.any_value(value)
    if expected == "nan":
        assert math.isnan(found)
    else:
        assert found == expected


def test_the_resource_of_a_span_line_and_of_an_otlp_document_is_the_same():
    """A span line's ``resource`` and a metrics document's first resource read alike; a line
    of another shape has none."""
    span = json.loads(span_record("span_start", "megatron.train", "1" * 16, None, 10, rank=1))
    document = json.loads(metrics_line(1, [gauge("megatron.training.loss", [(10, 1.0, {})])]))
    assert otlp.resource_of(span) == otlp.resource_of(document) == resource_attributes(1)
    assert otlp.resource_of([1, 2]) == {} and otlp.resource_of({"resourceMetrics": []}) == {}
