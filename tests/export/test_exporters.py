"""The exporters' guards measured on real encoded output: the size rules of docs/limits.md
against the OTLP-JSON file exporters, the protobuf encoders and the span JSON lines, fed the
worst content there is (characters beyond U+FFFF, controls, quotes, backslashes, surrogate
escapes) at the SDK's largest counts; and the exporters' own guards (int64, splitting)."""

from __future__ import annotations

import http.server
import io
import json
import logging
import threading
import time

import pytest
from doc_rules import documents
from opentelemetry import trace as trace_api
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.json.file import FileMetricExporter, FileSpanExporter
from opentelemetry.exporter.otlp.json.file._log_exporter import FileLogExporter
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, Status, StatusCode

from otel_training.export import exporters, files, limits
from otel_training.export.exporters import (
    DEFAULT_MAX_REQUEST_BYTES,
    SafeLogRecordExporter,
    SafeMetricExporter,
    SafeSpanExporter,
    split_metrics,
)
from otel_training.trace.processors import JsonLogSpanProcessor

MIB = 1024 * 1024
#: Characters whose encodings are the longest there are, one per kind: in Python's json (the
#: OTLP-JSON files) 12, 6, 6, 2, 2 and 5 bytes; in UTF-8 4, 1, 2, 1, 1 and 4.
WORST = {
    "beyond U+FFFF": "\U0001f600",
    "control": "\x01",
    "BMP": "\u00e9",
    "quote": '"',
    "backslash": "\\",
    "surrogate escape": "\udc80",  # \x80 after the rule: 4 characters, 5 bytes
}
#: The SDK's default largest counts (OTEL_*_COUNT_LIMIT): attributes per span, events and
#: links per span, attributes per event and link.
COUNT = 128
CONTEXT = trace_api.SpanContext(2**128 - 1, 2**64 - 1, False, trace_api.TraceFlags(1))


def _scope(char: str) -> InstrumentationScope:
    """A scope past every bound: names past 1,024 characters, attributes far past 48 KiB."""
    long = char * 4000
    return InstrumentationScope(
        char * 5000, char * 5000, char * 5000, {f"{i}{char * 2000}": long for i in range(COUNT)}
    )


def _resource(char: str) -> Resource:
    """A resource past every bound: attributes far past 48 KiB."""
    long = char * 4000
    return Resource({f"{i}{char * 2000}": long for i in range(COUNT)}, char * 5000)


def _worst_spans(char: str) -> list[ReadableSpan]:
    """One span per shape that can be largest: long values, long keys, many events, many
    links, long sequences; each with the largest scope and resource."""
    long = char * (limits.DEFAULT_VALUE_LENGTH + 10)
    scope, resource = _scope(char), _resource(char)
    many = {f"k{i}": char * 300 for i in range(32)}

    def span(**kwargs) -> ReadableSpan:
        return ReadableSpan(
            char * 5000,
            context=CONTEXT,
            parent=CONTEXT,
            resource=resource,
            instrumentation_scope=scope,
            status=Status(StatusCode.ERROR, long),
            start_time=1,
            end_time=2,
            **kwargs,
        )

    return [
        span(attributes={f"k{i}": long for i in range(64)}),
        span(attributes={f"{i}{char * 5000}": "v" for i in range(COUNT)}),
        span(events=[Event(char * 5000, many, 1) for _ in range(COUNT)]),
        span(links=[Link(CONTEXT, many) for _ in range(COUNT)]),
        # 16 of the longest sequences: over the budget for every character (items of quotes
        # cost the least, 62 bytes each: 16 x 1,024 x 62 > 900,000), so items must go
        span(attributes={f"k{i}": (char * 16,) * limits.MAX_SEQUENCE_LENGTH for i in range(16)}),
    ]


class ProtobufSpanExporter(SpanExporter):
    """Encodes every request as the OTLP exporters do and keeps its size in bytes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.spans = 0

    def export(self, spans) -> SpanExportResult:
        self.sizes.append(len(encode_spans(spans).SerializeToString()))
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


class ProtobufLogExporter(LogRecordExporter):
    """Encodes every request as the OTLP exporters do and keeps its size in bytes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def export(self, batch) -> LogRecordExportResult:
        self.sizes.append(len(encode_logs(batch).SerializeToString()))
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _line_sizes(text: str) -> list[int]:
    text.encode("utf-8")
    lines = text.splitlines()
    for line in lines:
        json.loads(line)
    return [len(line.encode("utf-8")) for line in lines]


def _count(text: str, kind: str) -> int:
    """Records in OTLP-JSON lines of ``kind`` (``resourceSpans`` or ``resourceLogs``)."""
    leaf = {"resourceSpans": ("scopeSpans", "spans"), "resourceLogs": ("scopeLogs", "logRecords")}
    scopes, records = leaf[kind]
    return sum(
        len(group[records])
        for line in text.splitlines()
        for resource in json.loads(line)[kind]
        for group in resource[scopes]
    )


@pytest.mark.slow
@documents("limits.md", "stays under 48 KiB")
@documents("limits.md", "So every span JSON line and every OTLP-JSON line is under 1 MiB")
@documents("limits.md", "6 bytes a UTF-16 code unit outside printable")
@documents("limits.md", "Exporters keep each request under 3 MiB of")
@pytest.mark.parametrize("char", WORST.values(), ids=WORST.keys())
def test_the_worst_spans_fit_a_line_a_request_and_a_json_line(char):
    """The worst spans there are (each shape at the SDK's largest counts, with the largest
    scope and resource) become OTLP-JSON lines and span JSON lines under 1 MiB and protobuf
    requests under 3 MiB, every span in them."""
    spans = _worst_spans(char)
    for bounded in map(limits.bounded_span, spans):
        assert limits.scope_cost(bounded.instrumentation_scope) <= limits.GROUP_BUDGET_BYTES
        assert limits.scope_cost(bounded.resource) <= limits.GROUP_BUDGET_BYTES
    stream = io.StringIO()
    file = SafeSpanExporter(
        FileSpanExporter(stream=stream), max_request_bytes=files.LINE_BUDGET_BYTES
    )
    assert file.export(spans) is SpanExportResult.SUCCESS
    sizes = _line_sizes(stream.getvalue())
    assert max(sizes) < MIB and _count(stream.getvalue(), "resourceSpans") == len(spans)
    protobuf = ProtobufSpanExporter()
    assert SafeSpanExporter(protobuf).export(spans) is SpanExportResult.SUCCESS
    assert protobuf.spans == len(spans) and max(protobuf.sizes) < DEFAULT_MAX_REQUEST_BYTES
    lines = io.StringIO()
    processor = JsonLogSpanProcessor(stream=lines, path="worst")
    for span in spans:
        processor.on_end(span)
    assert processor.force_flush()
    sizes = _line_sizes(lines.getvalue())
    processor.shutdown()
    assert len(sizes) == len(spans) and max(sizes) < MIB


@pytest.mark.slow
@documents("limits.md", "All strings and values of one span or log record together stay under")
@pytest.mark.parametrize("char", WORST.values(), ids=WORST.keys())
def test_the_worst_log_records_fit_a_line(char):
    """Log records with the longest body, nested maps and the most long attributes, the
    largest scope and resource, become OTLP-JSON lines under 1 MiB, every record in them."""
    long = char * (limits.DEFAULT_VALUE_LENGTH + 10)
    scope, resource = _scope(char), _resource(char)
    bodies = [
        long,
        {f"k{i}": [long, {"deeper": long}] for i in range(32)},
        [long] * 2000,
        long.encode("utf-8", "surrogatepass") * 4,
    ]
    records = [
        ReadableLogRecord(
            LogRecord(
                body=body,
                attributes={f"{i}{char * 2000}": long for i in range(64)},
                severity_text=char * 5000,
                event_name=char * 5000,
            ),
            resource=resource,
            instrumentation_scope=scope,
        )
        for body in bodies
    ]
    stream = io.StringIO()
    file = SafeLogRecordExporter(
        FileLogExporter(stream=stream), max_request_bytes=files.LINE_BUDGET_BYTES
    )
    assert file.export(records) is LogRecordExportResult.SUCCESS
    sizes = _line_sizes(stream.getvalue())
    assert max(sizes) < MIB and _count(stream.getvalue(), "resourceLogs") == len(records)
    protobuf = ProtobufLogExporter()
    assert SafeLogRecordExporter(protobuf).export(records) is LogRecordExportResult.SUCCESS
    assert max(protobuf.sizes) < DEFAULT_MAX_REQUEST_BYTES


def _collection(char: str, points: int, attributes: int, length: int):
    """A real collection: ``points`` points of a gauge with ``attributes`` attributes of
    ``length`` characters each, on a meter with the largest scope, the largest resource and
    a description far past 1,024 characters."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], resource=_resource(char))
    scope = _scope(char)
    meter = provider.get_meter(scope.name, scope.version, scope.schema_url, scope.attributes)
    gauge = meter.create_gauge("worst", description=char * 20_000)
    for p in range(points):
        gauge.set(p, {f"{p}.{a}": char * length for a in range(attributes)})
    data = reader.get_metrics_data()
    provider.shutdown()
    return data


@pytest.mark.slow
@documents("limits.md", "One metric point is bounded alike: its attributes (the series) fit the")
@documents("limits.md", "A collection of metrics is split the same way")
@pytest.mark.parametrize("char", WORST.values(), ids=WORST.keys())
def test_the_worst_metrics_fit_lines_every_point_in_one(char):
    """A collection of 2,000 points (the SDK's cardinality limit) with long attributes,
    and one point with the most attributes of the longest values, become OTLP-JSON lines
    under 1 MiB with every point in one of them."""
    for data, expected in (
        (_collection(char, 2000, 3, 100), 2000),
        (_collection(char, 1, 64, limits.DEFAULT_VALUE_LENGTH + 10), 1),
    ):
        stream = io.StringIO()
        file = SafeMetricExporter(
            FileMetricExporter(stream=stream), max_request_bytes=files.LINE_BUDGET_BYTES
        )
        assert file.export(data) is MetricExportResult.SUCCESS
        sizes = _line_sizes(stream.getvalue())
        assert max(sizes) < MIB
        points = [
            point
            for line in stream.getvalue().splitlines()
            for r in json.loads(line)["resourceMetrics"]
            for s in r["scopeMetrics"]
            for m in s["metrics"]
            for point in m["gauge"]["dataPoints"]
        ]
        assert len(points) == expected
        request = encode_metrics(limits.bounded_metrics_data(data)).SerializeToString()
        assert len(request) < DEFAULT_MAX_REQUEST_BYTES * expected  # protobuf: split alike


class RecordingMetricExporter(MetricExporter):
    """Encodes each request as OTLP protobuf and keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        self.requests.append(encode_metrics(metrics_data))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        return None


@documents("limits.md", "is saturated at 2^63−1 with one warning")
def test_the_exporters_own_int64_guard_saturates_with_one_warning(caplog):
    """A counter sum beyond int64 (the SDK adds Python ints without bound) is exported
    saturated at 2^63-1, by the exporter itself, with one warning for all exports."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("m").create_counter("megatron.training.skipped_iters")
    counter.add(2**63 - 1)
    counter.add(10)
    recording = RecordingMetricExporter()
    safe = SafeMetricExporter(recording)
    with caplog.at_level(logging.WARNING, logger="otel_training.export.exporters"):
        for _ in range(2):
            assert safe.export(reader.get_metrics_data()) is MetricExportResult.SUCCESS
    values = [
        point.as_int
        for request in recording.requests
        for r in request.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        for point in m.sum.data_points
    ]
    assert values == [2**63 - 1, 2**63 - 1]
    warnings = [r for r in caplog.records if "beyond int64" in r.getMessage()]
    assert len(warnings) == 1 and "megatron.training.skipped_iters" in warnings[0].getMessage()
    provider.shutdown()


class RefusingSpanExporter(SpanExporter):
    """Refuses any request of more than ``most`` spans, as a receiver with a lower size
    limit does; with ``slow``, it is a slow endpoint (its clock says each refusal took 2 s)."""

    def __init__(self, most: int, clock: list[float] | None = None) -> None:
        self.most = most
        self.clock = clock
        self.requests: list[int] = []

    def export(self, spans) -> SpanExportResult:
        self.requests.append(len(spans))
        if self.clock is not None:
            self.clock[0] += 2.0
        return SpanExportResult.SUCCESS if len(spans) <= self.most else SpanExportResult.FAILURE


def _spans(count: int, value_chars: int) -> list[ReadableSpan]:
    return [
        ReadableSpan(f"s{i}", context=CONTEXT, attributes={"v": "x" * value_chars})
        for i in range(count)
    ]


@documents("limits.md", "it is sent again in halves, up to 16 pieces")
def test_a_request_refused_quickly_is_sent_again_in_halves():
    """Refused at once, 16 spans of 70,000 characters go again as 2, 4, 8 and 16 pieces,
    depth first, until the receiver takes them: every span once, in order."""
    refusing = RefusingSpanExporter(most=1)
    safe = SafeSpanExporter(refusing, limits=limits.Limits(value_length=None))
    assert safe.export(_spans(16, 70_000)) is SpanExportResult.SUCCESS
    assert refusing.requests[0] == 16 and refusing.requests.count(1) == 16
    assert len(refusing.requests) == 31  # 1 + 2 + 4 + 8 + 16 requests, the last 16 taken


@documents("limits.md", "a request that failed after more than 1 s (a dead or slow endpoint")
def test_a_slow_failure_is_not_split(monkeypatch):
    """A refusal that took more than 1 s (a slow or dead endpoint, not a size limit) is not
    sent again in pieces: one request, reported failed."""
    clock = [1000.0]
    monkeypatch.setattr(exporters.time, "monotonic", lambda: clock[0])
    refusing = RefusingSpanExporter(most=1, clock=clock)
    safe = SafeSpanExporter(refusing, limits=limits.Limits(value_length=None), timeout_s=60.0)
    assert safe.export(_spans(16, 70_000)) is SpanExportResult.FAILURE
    assert refusing.requests == [16]


@documents("limits.md", "nor one under 128 KiB")
def test_a_small_refused_request_is_not_split():
    """A refused request under 128 KiB of worst-case size is not split: no receiver's limit
    is that low, so the refusal has another cause."""
    refusing = RefusingSpanExporter(most=1)
    assert SafeSpanExporter(refusing).export(_spans(16, 100)) is SpanExportResult.FAILURE
    assert refusing.requests == [16]


def _tree(shape: list[list[list[int]]]):
    """MetricsData of resources x scopes x metrics with the given numbers of points, each
    name and value distinct; and the flat list of (resource, scope, metric name, point)."""
    from opentelemetry.sdk.metrics.export import (
        Gauge,
        Metric,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
    )

    resources = []
    for r, scopes in enumerate(shape):
        scope_metrics = []
        for s, metrics in enumerate(scopes):
            items = []
            for m, count in enumerate(metrics):
                points = [NumberDataPoint({"p": f"{r}.{s}.{m}.{i}"}, 1, 2, i) for i in range(count)]
                items.append(Metric(f"m{m}", "d" * 50, "1", Gauge(points)))
            scope_metrics.append(ScopeMetrics(InstrumentationScope(f"s{s}", "1"), items, ""))
        resources.append(ResourceMetrics(Resource({"r": str(r) * 80}), scope_metrics, ""))
    return MetricsData(resources)


def _flat(data) -> list[tuple]:
    return [
        (rm.resource, sm.scope, m.name, m.unit, m.description, p)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    ]


def _estimate(items: list[tuple]) -> int:
    """The worst-case size of one request of ``items`` (each resource, scope and metric once
    per run of points that share it), from limits' definitions of each part's cost."""
    total, last = 0, (None, None, None)
    for resource, scope, name, unit, description, point in items:
        if resource is not last[0]:
            total += limits.scope_cost(resource)
        if resource is not last[0] or scope is not last[1]:
            total += limits.scope_cost(scope)
        if (resource, scope, name) != last:
            total += limits._METRIC_COST + sum(map(limits.json_cost, (name, unit, description)))
        total += limits.metric_point_cost(point)
        last = (resource, scope, name)
    return total


def test_a_collection_is_split_in_order_into_the_fewest_requests_under_the_limit():
    """split_metrics keeps every point in order, each under its resource, scope and metric;
    each request is under the limit by worst-case size and the next point would not have
    fitted it (so there are no more requests than needed); a collection at the limit exactly
    is one request, itself."""
    data = _tree([[[3, 1], [2]], [[1, 4, 2]], [[5]]])
    items = _flat(data)
    (whole,) = split_metrics(data, _estimate(items))
    assert whole is data
    for k in range(1, len(items)):  # a request that fits exactly is not cut short
        first = split_metrics(data, _estimate(items[:k]))[0]
        assert len(_flat(first)) == k
    runs = {_estimate(items[i:j]) for i in range(len(items)) for j in range(i + 1, len(items))}
    for limit in sorted(runs | {_estimate(items) - 1, 600}):  # exact fits, many places
        parts = split_metrics(data, limit)
        flats = [_flat(part) for part in parts]
        assert [item[1:] for f in flats for item in f] == [item[1:] for item in items]
        assert [dict(item[0].attributes) for f in flats for item in f] == [
            dict(item[0].attributes) for item in items
        ]
        for i, flat in enumerate(flats):
            assert len(flat) == 1 or _estimate(flat) <= limit, (limit, i)
            if i + 1 < len(flats):
                assert _estimate(flat + flats[i + 1][:1]) > limit, (limit, i)


class CallRecorder:
    """An exporter of any signal that records how it was called and answers ``results``."""

    def __init__(self, results=(), *, shutdown_takes_timeout: bool = True) -> None:
        self.calls: list[tuple] = []
        self.results = list(results)
        if not shutdown_takes_timeout:
            self.shutdown = self._plain_shutdown
        from opentelemetry.sdk.metrics import Counter
        from opentelemetry.sdk.metrics.export import AggregationTemporality
        from opentelemetry.sdk.metrics.view import LastValueAggregation

        self._preferred_temporality = {Counter: AggregationTemporality.DELTA}
        self._preferred_aggregation = {Counter: LastValueAggregation()}

    def export(self, batch, **kwargs):
        self.calls.append(("export", batch, kwargs))
        return self.results.pop(0)

    def force_flush(self, timeout_millis=None):
        self.calls.append(("force_flush", timeout_millis))
        return True

    def shutdown(self, timeout_millis=None, **kwargs):
        self.calls.append(("shutdown", timeout_millis, kwargs))

    def _plain_shutdown(self):
        self.calls.append(("shutdown",))


def test_the_safe_exporters_hand_their_calls_on_and_in_a_forked_child_do_nothing():
    """Each safe exporter calls the wrapped one's export, force_flush and shutdown with the
    timeouts and arguments given (shutdown's timeout only where it takes one), takes its
    metric temporality and aggregation preferences, fails an export when any request failed
    (after sending them all); in a forked child (another pid) it calls nothing and says
    success."""
    from opentelemetry.sdk.metrics import Counter
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    wrapped = CallRecorder([MetricExportResult.SUCCESS, MetricExportResult.FAILURE])
    metrics = SafeMetricExporter(wrapped, max_request_bytes=1500)
    assert metrics._preferred_temporality[Counter] is AggregationTemporality.DELTA
    assert metrics._preferred_aggregation[Counter] is wrapped._preferred_aggregation[Counter]
    data = _tree([[[3]], [[3]]])
    assert len(split_metrics(data, 1500)) == 2
    assert metrics.export(data, timeout_millis=1234, extra=1) is MetricExportResult.FAILURE
    assert [(c[0], c[2]) for c in wrapped.calls] == [
        ("export", {"timeout_millis": 1234, "extra": 1})
    ] * 2
    wrapped.results.append(MetricExportResult.SUCCESS)
    assert metrics.export(_tree([[[1]]])) is MetricExportResult.SUCCESS
    assert wrapped.calls.pop()[2] == {"timeout_millis": 10_000}  # the SDK's default
    assert metrics.force_flush(77) is True
    metrics.shutdown(timeout_millis=88, extra=2)
    assert wrapped.calls[2:] == [("force_flush", 77), ("shutdown", 88, {"extra": 2})]
    spans, logs = CallRecorder(), CallRecorder(shutdown_takes_timeout=False)
    span_exporter, log_exporter = SafeSpanExporter(spans), SafeLogRecordExporter(logs)
    timed_logs = CallRecorder()
    SafeLogRecordExporter(timed_logs).shutdown(timeout_millis=99)
    for safe in (span_exporter, log_exporter):
        assert safe.force_flush(55) is True
        safe.shutdown()
    assert spans.calls == [("force_flush", 55), ("shutdown", None, {})]
    assert logs.calls == [("force_flush", 55), ("shutdown",)]
    assert timed_logs.calls == [("shutdown", 99, {})]
    child = CallRecorder()
    for safe in (SafeMetricExporter(child), SafeSpanExporter(child), SafeLogRecordExporter(child)):
        safe._pid = -1  # as in a forked child
        assert safe.force_flush(1) is True
        safe.shutdown()
        if isinstance(safe, SafeMetricExporter):
            assert safe.export(data) is MetricExportResult.SUCCESS
    assert child.calls == []


def _span_batch_estimate(batch) -> int:
    """Worst-case size of one request of spans: each span, each resource once, each scope
    once per resource (OTLP groups scopes by resource)."""
    resources = {id(s.resource): s.resource for s in batch}
    scopes = {(id(s.resource), id(s.instrumentation_scope)): s.instrumentation_scope for s in batch}
    return (
        sum(map(limits.span_cost, batch))
        + sum(map(limits.scope_cost, resources.values()))
        + sum(map(limits.scope_cost, scopes.values()))
    )


def test_a_batch_of_spans_is_sent_in_order_in_the_fewest_requests_under_the_limit():
    """Spans of two resources and two scopes: each request is under the limit by worst-case
    size (its resources and scopes counted once), the next span would not have fitted it, and
    the spans go in order; a batch that fits exactly is one request."""
    resources = [Resource({"r": str(i) * 300}) for i in range(2)]
    scopes = [InstrumentationScope(f"scope{i}" * 20, "1") for i in range(2)]
    batch = [
        ReadableSpan(
            f"span{i}",
            context=trace_api.SpanContext(1, i + 1, False),
            attributes={"k": "v" * (10 * i)},
            resource=resources[(i // 3) % 2],
            instrumentation_scope=scopes[(i // 2) % 2],
        )
        for i in range(12)
    ]
    runs = {_span_batch_estimate(batch[i:j]) for i in range(12) for j in range(i + 1, 13)}
    for limit in sorted(runs):
        recorder = CallRecorder([SpanExportResult.SUCCESS] * len(batch))
        SafeSpanExporter(recorder, max_request_bytes=limit).export(batch)
        requests = [list(call[1]) for call in recorder.calls]
        assert [s for request in requests for s in request] == batch
        assert all(requests)  # never an empty request
        for i, request in enumerate(requests):
            assert len(request) == 1 or _span_batch_estimate(request) <= limit, limit
            if i + 1 < len(requests):
                assert _span_batch_estimate(request + requests[i + 1][:1]) > limit, limit


def test_the_prometheus_reader_applies_the_string_rule_before_a_scrape():
    """A label value with a lone surrogate and 100 characters, read by safe_prometheus_reader
    with a limit of 40: the scrape (UTF-8 text) carries it escaped and cut at 40, and an
    integer sum beyond int64 saturated."""
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, generate_latest

    reader = exporters.safe_prometheus_reader(limits.Limits(value_length=40))
    provider = MeterProvider(metric_readers=[reader])
    try:
        counter = provider.get_meter("t").create_counter("prom_rule_test")
        value = "bad\udcff" + "x" * 96
        counter.add(2**64, {"label": value})
        text = generate_latest(REGISTRY).decode("utf-8")
    finally:
        provider.shutdown()
    (line,) = [x for x in text.splitlines() if x.startswith("prom_rule_test_total{")]
    escaped = limits.safe_text(value, 40).replace("\\", "\\\\")  # the text format's escape
    assert f'label="{escaped}"' in line
    assert line.endswith(" 9.223372036854776e+18")  # 2**63 - 1 as the text format writes it


def test_a_batch_is_split_into_16_pieces_at_most_and_fails_if_any_piece_fails():
    """32 spans refused in any piece of more than one: split down to 16 pieces of 2 (1 + 2 +
    4 + 8 + 16 requests), no further, and the export fails; a receiver that takes every piece
    but one fails the export too, and one that raises fails it without raising."""
    refusing = RefusingSpanExporter(most=1)
    safe = SafeSpanExporter(refusing, limits=limits.Limits(value_length=None))
    assert safe.export(_spans(32, 70_000)) is SpanExportResult.FAILURE
    assert len(refusing.requests) == 31 and min(refusing.requests) == 2

    class OnePoisoned(RefusingSpanExporter):
        def export(self, spans):
            self.requests.append(len(spans))
            poisoned = any(s.name == "s5" for s in spans)
            return SpanExportResult.FAILURE if poisoned else SpanExportResult.SUCCESS

    poisoned = OnePoisoned(most=0)
    safe = SafeSpanExporter(poisoned, limits=limits.Limits(value_length=None))
    assert safe.export(_spans(16, 70_000)) is SpanExportResult.FAILURE
    assert sum(poisoned.requests) > 16  # the halves without s5 went

    class Raising(RefusingSpanExporter):
        def export(self, spans):
            raise ConnectionError("gone")

    assert SafeSpanExporter(Raising(most=0)).export(_spans(2, 10)) is SpanExportResult.FAILURE


def test_the_grpc_exporters_retry_codes_lose_resource_exhausted():
    """Wrapping an exporter with gRPC retry codes (the OTLP/gRPC ones) removes
    RESOURCE_EXHAUSTED from them, so that an oversized request is split instead of retried
    unchanged; the other codes stay. Default timeouts are handed on as the SDK's."""
    from grpc import StatusCode

    expected = {  # force_flush's and shutdown's timeouts handed on (the span one has none)
        SafeSpanExporter: [("force_flush", 30_000), ("shutdown", None, {})],
        SafeLogRecordExporter: [("force_flush", 30_000), ("shutdown", 30_000, {})],
        SafeMetricExporter: [("force_flush", 10_000), ("shutdown", 30_000, {})],
    }
    for safe, calls in expected.items():
        wrapped = CallRecorder()
        wrapped._retryable_error_codes = frozenset(
            {StatusCode.RESOURCE_EXHAUSTED, StatusCode.UNAVAILABLE}
        )
        exporter = safe(wrapped)
        assert wrapped._retryable_error_codes == frozenset({StatusCode.UNAVAILABLE})
        exporter.force_flush()
        exporter.shutdown()
        assert wrapped.calls == calls, safe


# -- PeriodicMetricReader: a collection that times out ------------------------------------------


def _slow_reader(slow_calls: int = 0, sleep_s: float = 0.0, sleeps: tuple[float, ...] = ()):
    """A PeriodicMetricReader (interval 60 s) on a provider with a counter at 3, an observable
    gauge whose first ``slow_calls`` callbacks take ``sleep_s`` seconds (or whose callbacks
    take ``sleeps`` seconds, one after the other), and a fast one."""
    sleeps = sleeps or (sleep_s,) * slow_calls
    from opentelemetry.metrics import Observation

    from otel_training.testing import RecordingMetricExporter

    exporter = RecordingMetricExporter()
    reader = exporters.PeriodicMetricReader(exporter, export_interval_millis=60_000)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    meter = provider.get_meter("test")
    calls = []

    def slow(options):
        calls.append(1)
        if len(calls) <= len(sleeps):
            time.sleep(sleeps[len(calls) - 1])
        yield Observation(1.0)

    meter.create_observable_gauge("slow", callbacks=[slow])
    # The SDK checks the deadline before each callback: the slow one's time shows at the next.
    meter.create_observable_gauge("fast", callbacks=[lambda options: [Observation(2.0)]])
    meter.create_counter("steps").add(3)
    return provider, reader, exporter


@documents("limits.md", "is tried once more within what")
def test_a_final_collection_that_times_out_is_tried_again_within_the_bound(caplog):
    """The first try of the final collection has half the shutdown's timeout; a callback
    slower than that fails it, the second try exports the values, and nothing is logged."""
    provider, _, exporter = _slow_reader(slow_calls=1, sleep_s=0.6)
    with caplog.at_level(logging.WARNING):
        provider.shutdown(timeout_millis=1000)
    assert [e["steps"][0].value for e in exporter.exports] == [3]
    assert not caplog.records


@documents("limits.md", "one that does")
def test_a_final_collection_that_times_out_twice_is_said_without_a_traceback(caplog):
    """Both tries time out: one warning says what was not exported; no exception, no SDK
    traceback. (A callback cannot be interrupted: the second try ends after the shutdown's
    bound, on the reader's thread, which is waited for here.)"""
    provider, reader, exporter = _slow_reader(slow_calls=2, sleep_s=0.3)
    with caplog.at_level(logging.WARNING):
        provider.shutdown(timeout_millis=400)
        reader._daemon_thread.join(10)
    assert exporter.exports == []
    (record,) = caplog.records
    assert "did not finish within the shutdown's timeout" in record.getMessage()
    assert not record.exc_info


@documents("limits.md", "within what is left of the bound")
def test_the_second_try_of_a_final_collection_has_only_what_is_left_of_the_bound(caplog):
    """Shutdown's bound 1 s: the first try has 0.5 s and its callback takes 0.6 s; the second
    has the 0.4 s left, not more, so its 0.6 s callback fails it too and it is said. The
    shutdown returns at its bound, the second try still running on the reader's thread."""
    provider, reader, exporter = _slow_reader(sleeps=(0.6, 0.6))
    with caplog.at_level(logging.WARNING):
        provider.shutdown(timeout_millis=1000)
        still_running = reader._daemon_thread.is_alive()
        reader._daemon_thread.join(10)
    assert still_running  # the shutdown did not wait past its bound
    assert exporter.exports == []
    (record,) = caplog.records
    assert "did not finish within the shutdown's timeout" in record.getMessage()


def test_a_final_collection_whose_first_try_spends_the_whole_bound_is_said(caplog):
    """The first try's callback outlasts the whole bound: no time is left for a second one,
    and the loss is said all the same."""
    provider, reader, exporter = _slow_reader(sleeps=(0.6,))
    with caplog.at_level(logging.WARNING):
        provider.shutdown(timeout_millis=400)
        reader._daemon_thread.join(10)
    assert exporter.exports == []
    (record,) = caplog.records
    assert "did not finish within the shutdown's timeout" in record.getMessage()


def test_the_reader_takes_the_sdk_readers_arguments():
    """Its arguments are the SDK reader's: an export interval of 50 ms exports without a
    shutdown or a flush."""
    from otel_training.testing import RecordingMetricExporter

    exporter = RecordingMetricExporter()
    reader = exporters.PeriodicMetricReader(exporter, export_interval_millis=50)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    provider.get_meter("test").create_counter("steps").add(3)
    deadline = time.monotonic() + 10
    while not exporter.exports and time.monotonic() < deadline:
        time.sleep(0.01)
    exported = [e["steps"][0].value for e in exporter.exports[:1]]
    provider.shutdown(timeout_millis=1000)
    assert exported == [3]


def test_a_periodic_collection_that_times_out_is_said_once_and_loses_nothing(caplog):
    """A periodic collection past its timeout: one warning line per process, no traceback;
    the next collection exports what the first one held."""
    provider, reader, exporter = _slow_reader(slow_calls=2, sleep_s=0.1)
    with caplog.at_level(logging.WARNING):
        reader.collect(timeout_millis=10)
        reader.collect(timeout_millis=10)
    assert exporter.exports == []
    (record,) = caplog.records
    assert "timed out" in record.getMessage() and not record.exc_info
    reader.collect(timeout_millis=10_000)
    assert [e["steps"][0].value for e in exporter.exports] == [3]
    provider.shutdown(timeout_millis=1000)


# -- OTLP outages: one line each, over every signal -----------------------------------------


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint on loopback that takes every request while ``up`` and refuses
    each with 400 (which the SDK's exporters do not retry) while not."""

    up = True

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200 if _Collector.up else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def collector():
    """The base URL of a :class:`_Collector`, up; the outage state of the process cleared
    before and after (it is the process's, as the SDK's loggers are)."""
    from otel_training.export import _outage

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _outage._failing.clear()
    _outage._said.clear()
    _Collector.up = True
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        _outage._failing.clear()
        _outage._said.clear()


@documents("collector.md", "one warning line per outage")
def test_an_otlp_outage_is_one_line_until_every_failing_signal_exported_again(collector, caplog):
    """Real OTLP/HTTP exporters of spans and metrics to an endpoint that goes down and up:
    the SDK's own error line of each refused batch is not shown; the first failure of an
    outage is one warning of ours; the outage lasts until every signal that failed has
    exported again (spans back alone do not end it), and the next failure is said again."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    spans = SafeSpanExporter(OTLPSpanExporter(endpoint=f"{collector}/v1/traces", timeout=5))
    metrics = SafeMetricExporter(OTLPMetricExporter(endpoint=f"{collector}/v1/metrics", timeout=5))
    batch, data = _spans(2, 10), _tree([[[2]]])
    ok, failed = SpanExportResult.SUCCESS, SpanExportResult.FAILURE

    def said() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        caplog.clear()
        return lines

    with caplog.at_level(logging.INFO):
        assert spans.export(batch) is ok and said() == []
        _Collector.up = False
        assert spans.export(batch) is failed
        (line,) = said()
        assert line.startswith("otel-training: OTLP export failed (Failed to export")
        assert metrics.export(data) is MetricExportResult.FAILURE and said() == []
        assert spans.export(batch) is failed and said() == []
        _Collector.up = True
        assert spans.export(batch) is ok and said() == []
        _Collector.up = False  # metrics never came back: the same outage
        assert spans.export(batch) is failed and said() == []
        _Collector.up = True
        assert spans.export(batch) is ok and said() == []
        assert metrics.export(data) is MetricExportResult.SUCCESS and said() == []
        _Collector.up = False  # a new outage: said again, whichever signal fails first
        assert metrics.export(data) is MetricExportResult.FAILURE
        (line,) = said()
        assert line.startswith("otel-training: OTLP export failed (Failed to export")
    spans.shutdown()
    metrics.shutdown()


def test_an_exporter_that_is_not_otlp_takes_no_part_in_an_outage(collector, caplog):
    """A failing exporter of another kind neither starts nor prolongs an OTLP outage: the
    OTLP spans' next failure after they came back is said again."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    spans = SafeSpanExporter(OTLPSpanExporter(endpoint=f"{collector}/v1/traces", timeout=5))
    other = SafeSpanExporter(RefusingSpanExporter(most=0))
    batch = _spans(1, 10)
    with caplog.at_level(logging.WARNING):
        _Collector.up = False
        assert spans.export(batch) is SpanExportResult.FAILURE
        _Collector.up = True
        assert other.export(batch) is SpanExportResult.FAILURE  # not OTLP: no outage of its own
        assert spans.export(batch) is SpanExportResult.SUCCESS
        _Collector.up = False
        assert spans.export(batch) is SpanExportResult.FAILURE
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("OTLP export failed" in line for line in lines)
    spans.shutdown()
