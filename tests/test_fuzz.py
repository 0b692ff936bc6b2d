"""Property-based tests of the public surface: any value, string, name, attribute or exception
thrown at record_training_metrics, the phases and the processors never raises into training,
and every export (OTLP protobuf, OTLP/JSON) and every JSON line decodes."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.json.file import FileMetricExporter, FileSpanExporter
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from support import strict_json_lines

import otel_training as ot
from otel_training import configuration as setup
from otel_training import testing
from otel_training.export.exporters import SafeMetricExporter, SafeSpanExporter
from otel_training.trace.processors import JsonLogSpanProcessor

pytestmark = pytest.mark.slow  # hypothesis with 120 examples a test

SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

ANY_TEXT = st.lists(
    st.one_of(
        st.characters(),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
        st.sampled_from(["\x00", "\n", "\u2028", '"', "\\", "\U0001f600"]),
    ),
    max_size=60,
).map("".join)


class Hostile:
    """A value whose conversions raise (its repr works, for hypothesis' reports)."""

    def __float__(self):
        raise RuntimeError("no float")

    def __str__(self):
        raise RuntimeError("no str")

    def __repr__(self):
        return "Hostile()"


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**100), max_value=2**100),
    st.floats(allow_nan=True, allow_infinity=True),
    ANY_TEXT,
    st.builds(lambda x: np.float32(x), st.floats(width=32)),
    st.builds(lambda x: np.array([x]), st.floats()),
    st.builds(lambda x: torch.tensor(x), st.floats()),
    st.builds(lambda n: torch.zeros(n), st.integers(0, 3)),
    st.lists(st.integers(), max_size=3),
    st.just(Hostile()),
    st.just(object()),
)
METRIC_KEYWORDS = (
    "step_duration_ms",
    "loss",
    "throughput_tflops",
    "grad_norm",
    "skipped_iters",
    "learning_rate",
    "tokens_per_sec",
    "memory_allocated_gb",
)


class EncodingSpanExporter(SpanExporter):
    """Encodes every batch as OTLP protobuf and OTLP/JSON, as the real exporters do."""

    def __init__(self) -> None:
        self.json_lines = io.StringIO()
        self._json = FileSpanExporter(stream=self.json_lines)
        self.spans = 0

    def export(self, spans) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        assert self._json.export(spans) is SpanExportResult.SUCCESS
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


class EncodingMetricExporter(MetricExporter):
    """Encodes every collection as OTLP protobuf and OTLP/JSON."""

    def __init__(self) -> None:
        super().__init__()
        self.json_lines = io.StringIO()
        self._json = FileMetricExporter(stream=self.json_lines)

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        encode_metrics(metrics_data).SerializeToString()
        assert self._json.export(metrics_data) is MetricExportResult.SUCCESS
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        return None


@SETTINGS
@given(values=st.dictionaries(st.sampled_from(METRIC_KEYWORDS), ANY_VALUE, min_size=1))
def test_record_training_metrics_takes_any_value_and_every_export_decodes(values):
    """Any values at the eight keywords: nothing raises; the collection encodes."""
    memory = testing.configure_in_memory()
    ot.record_training_metrics(memory.meter, **values)
    ot.flush_deferred(5.0)
    data = memory.reader.get_metrics_data()
    testing.reset()
    if data is None:  # every value was dropped (not a number): nothing to export
        return
    exporter = EncodingMetricExporter()
    assert SafeMetricExporter(exporter).export(data) is MetricExportResult.SUCCESS
    strict_json_lines(exporter.json_lines.getvalue())
    for _, point in testing.points(data):
        value = getattr(point, "value", None)
        if value is not None:
            assert not (isinstance(value, float) and math.isnan(value))
            assert not isinstance(value, int) or -(2**63) <= value < 2**63


class Boom(Exception):
    pass


PHASES = st.sampled_from(
    [
        lambda name, attrs: ot.phase(name, **attrs),
        lambda name, attrs: ot.checkpoint_save(name, **attrs),
        lambda name, attrs: ot.evaluation(**attrs),
        lambda name, attrs: ot.training_iteration(**attrs),
    ]
)


@SETTINGS
@given(
    make=PHASES,
    name=ANY_TEXT,
    attributes=st.dictionaries(
        ANY_TEXT.filter(lambda k: k.isidentifier() is False or k), ANY_VALUE, max_size=4
    ),
    later=st.dictionaries(ANY_TEXT, ANY_VALUE, max_size=3),
    event=st.tuples(ANY_TEXT, st.dictionaries(ANY_TEXT, ANY_VALUE, max_size=3)),
    message=st.one_of(ANY_TEXT, st.just(Hostile())),
    fail=st.booleans(),
)
def test_phases_take_anything_and_every_span_and_line_decodes(
    make, name, attributes, later, event, message, fail
):
    """Any name, attributes, event and exception message: the phase never raises anything
    but the user's own exception; spans encode in protobuf and OTLP/JSON; JSON lines are
    strict UTF-8 JSON."""
    exporter = EncodingSpanExporter()
    lines = io.StringIO()
    jsonlog = JsonLogSpanProcessor(stream=lines, path="fuzz")
    setup.configure(
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
        span_groups="custom,checkpoint,evaluate,step",  # one span per phase: no wrapper
        span_processors=[jsonlog, SimpleSpanProcessor(SafeSpanExporter(exporter))],
    )
    try:
        with make(name, dict(attributes)) as phase:
            jsonlog.force_flush()  # the start line is written while the span is open
            phase.set_attributes(later)
            phase.add_event(event[0], event[1])
            if fail:
                raise Boom(message)
    except Boom:
        assert fail
    jsonlog.force_flush()
    assert exporter.spans == 1
    strict_json_lines(exporter.json_lines.getvalue())
    records = strict_json_lines(lines.getvalue())
    assert [r["record"] for r in records] == ["span_start", "span_end"]
    if fail:
        assert records[1]["status"] == "ERROR"
    testing.reset()
