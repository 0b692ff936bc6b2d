"""The loopback OTLP receiver, proven with the official OpenTelemetry SDK exporters.

Providers are used directly (never installed as globals) and shut down in each test.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
    OTLPLogExporter as GrpcLogExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http._log_exporter import (
    OTLPLogExporter as HttpLogExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from otlp_receiver import BlackHole, OtlpReceiver

RESOURCE = Resource.create({"service.name": "otlp-receiver-test", "test.run": 7})
EXPORT_TIMEOUT_S = 1.0

pytestmark = pytest.mark.timeout(30)


def _metric_exporter(receiver: OtlpReceiver, protocol: str, **kwargs: Any) -> MetricExporter:
    if protocol == "grpc":
        return GrpcMetricExporter(endpoint=receiver.grpc_endpoint, insecure=True, **kwargs)
    return HttpMetricExporter(endpoint=receiver.http_url("metrics"), **kwargs)


def _span_exporter(receiver: OtlpReceiver, protocol: str) -> SpanExporter:
    if protocol == "grpc":
        return GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True)
    return HttpSpanExporter(endpoint=receiver.http_url("traces"))


def _record_metrics(exporter: MetricExporter) -> None:
    """Records a counter, a histogram and a gauge, flushes once, shuts the provider down."""
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader], resource=RESOURCE)
    try:
        meter = provider.get_meter("otel_training.tests", "0.1")
        counter = meter.create_counter("test.tokens", unit="{token}", description="Tokens seen")
        histogram = meter.create_histogram("test.step.duration", unit="s")
        gauge = meter.create_gauge("test.loss", unit="1")
        counter.add(3, {"phase": "train"})
        counter.add(4, {"phase": "train"})
        for seconds in (0.5, 1.5, 2.5):
            histogram.record(seconds)
        gauge.set(0.25, {"rank": 0})
        assert provider.force_flush(timeout_millis=10_000)
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("protocol", "kwargs"),
    [
        ("grpc", {}),
        ("http", {}),
        ("http", {"compression": HttpCompression.Gzip}),
    ],
    ids=["grpc", "http", "http-gzip"],
)
def test_sdk_metrics_arrive_with_names_kinds_units_and_values(
    otlp_receiver: OtlpReceiver, protocol: str, kwargs: dict[str, Any]
) -> None:
    """Counter, histogram and gauge points exported by the SDK arrive decoded and flattened."""
    # force_flush and shutdown each export once; cumulative points repeat the same values.
    _record_metrics(_metric_exporter(otlp_receiver, protocol, **kwargs))
    otlp_receiver.wait_for(
        lambda r: {"test.tokens", "test.step.duration", "test.loss"} <= r.metric_names(), 5
    )

    tokens = otlp_receiver.metrics("test.tokens")[-1]
    assert {p.value for p in otlp_receiver.metrics("test.tokens")} == {7}
    assert (tokens.kind, tokens.unit, tokens.description) == ("sum", "{token}", "Tokens seen")
    assert tokens.value == 7 and isinstance(tokens.value, int)
    assert tokens.is_monotonic is True and tokens.temporality == "cumulative"
    assert tokens.attributes == {"phase": "train"}
    assert tokens.resource_attributes["service.name"] == "otlp-receiver-test"
    assert tokens.resource_attributes["test.run"] == 7
    assert (tokens.scope_name, tokens.scope_version) == ("otel_training.tests", "0.1")
    assert tokens.protocol == protocol

    duration = otlp_receiver.metrics("test.step.duration")[-1]
    assert (duration.kind, duration.unit, duration.value) == ("histogram", "s", None)
    assert (duration.count, duration.sum) == (3, pytest.approx(4.5))
    assert (duration.min, duration.max) == (0.5, 2.5)
    assert len(duration.bucket_counts) == len(duration.explicit_bounds) + 1
    assert sum(duration.bucket_counts) == 3

    loss = otlp_receiver.metrics("test.loss")[-1]
    assert (loss.kind, loss.unit, loss.value) == ("gauge", "1", 0.25)
    assert loss.temporality is None and loss.attributes == {"rank": 0}

    assert len(otlp_receiver.metric_requests()) >= 1
    signal, seen_protocol, headers = otlp_receiver.request_headers()[0]
    assert (signal, seen_protocol) == ("metrics", protocol)
    if kwargs.get("compression") is HttpCompression.Gzip:
        assert headers.get("Content-Encoding") == "gzip"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_spans_arrive_with_parent_link_events_and_status(
    otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    """A parent and child span exported by the SDK arrive with ids, parent link and details."""
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(_span_exporter(otlp_receiver, protocol)))
    try:
        tracer = provider.get_tracer("otel_training.tests")
        with tracer.start_as_current_span("train.step", kind=SpanKind.INTERNAL) as parent:
            parent.set_attribute("step", 12)
            with tracer.start_as_current_span("train.forward", kind=SpanKind.CLIENT) as child:
                child.set_attribute("layers", [1, 2, 3])
                child.add_event("oom.retry", {"bytes": 1024, "ok": False})
                child.set_status(StatusCode.ERROR, "boom")
    finally:
        provider.shutdown()

    otlp_receiver.wait_for(lambda r: len(r.spans()) == 2, 5)
    (step,) = otlp_receiver.spans("train.step")
    (forward,) = otlp_receiver.spans("train.forward")
    assert step.parent_span_id == ""
    assert forward.parent_span_id == step.span_id
    assert forward.trace_id == step.trace_id and len(step.trace_id) == 32
    assert len(step.span_id) == 16
    assert step.span_id == format(parent.get_span_context().span_id, "016x")
    assert (step.kind, forward.kind) == ("internal", "client")
    assert step.attributes == {"step": 12}
    assert forward.attributes == {"layers": [1, 2, 3]}
    assert forward.events == [("oom.retry", {"bytes": 1024, "ok": False})]
    assert (forward.status_code, forward.status_message) == ("error", "boom")
    assert forward.start_time_unix_nano <= forward.end_time_unix_nano
    assert step.start_time_unix_nano <= forward.start_time_unix_nano
    assert step.resource_attributes["service.name"] == "otlp-receiver-test"
    assert {step.protocol, forward.protocol} == {protocol}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_logs_arrive_with_body_severity_and_trace_context(
    otlp_receiver: OtlpReceiver, protocol: str
) -> None:
    """A log record exported by the SDK arrives with its body, severity and attributes."""
    exporter = (
        GrpcLogExporter(endpoint=otlp_receiver.grpc_endpoint, insecure=True)
        if protocol == "grpc"
        else HttpLogExporter(endpoint=otlp_receiver.http_url("logs"))
    )
    provider = LoggerProvider(resource=RESOURCE)
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    try:
        provider.get_logger("otel_training.tests").emit(
            body={"event": "checkpoint", "step": 3},
            severity_number=SeverityNumber.WARN,
            severity_text="WARN",
            attributes={"path": "/tmp/ckpt"},
        )
    finally:
        provider.shutdown()

    (record,) = otlp_receiver.wait_for(lambda r: r.logs(), 5)
    assert record.body == {"event": "checkpoint", "step": 3}
    assert (record.severity_text, record.severity_number) == ("WARN", SeverityNumber.WARN.value)
    assert record.attributes == {"path": "/tmp/ckpt"}
    assert record.scope_name == "otel_training.tests"
    assert record.protocol == protocol
    assert len(otlp_receiver.log_requests()) == 1


def test_http_json_body_with_hex_ids_is_parsed(otlp_receiver: OtlpReceiver) -> None:
    """An OTLP/JSON trace body (hex ids, gzip) is decoded; the reply is 200 with `{}`."""
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "k", "value": {"boolValue": True}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "json.scope"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "eee19b7ec3c1b173",
                                "name": "json.span",
                                "kind": 2,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "5"}},
                                    {"key": "b", "value": {"bytesValue": "AAE="}},
                                    {
                                        "key": "kv",
                                        "value": {
                                            "kvlistValue": {
                                                "values": [
                                                    {"key": "x", "value": {"doubleValue": 1.5}}
                                                ]
                                            }
                                        },
                                    },
                                ],
                                "status": {"code": 1},
                            }
                        ],
                    }
                ],
            }
        ]
    }
    request = urllib.request.Request(
        otlp_receiver.http_url("traces"),
        data=gzip.compress(json.dumps(document).encode()),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
        assert json.loads(response.read()) == {}

    (span,) = otlp_receiver.spans()
    assert (span.name, span.kind, span.status_code) == ("json.span", "server", "ok")
    assert span.trace_id == "5b8efff798038103d269b633813fc60c"
    assert (span.span_id, span.parent_span_id) == ("eee19b7ec3c1b174", "eee19b7ec3c1b173")
    assert span.attributes == {"n": 5, "b": b"\x00\x01", "kv": {"x": 1.5}}
    assert span.resource_attributes == {"k": True}
    assert span.start_time_unix_nano == 1544712660000000000


def test_http_protobuf_reply_is_empty_response_and_unknown_path_is_404(
    otlp_receiver: OtlpReceiver,
) -> None:
    """A protobuf POST gets 200 with an empty response body; an unknown path gets 404."""
    body = metrics_service_pb2.ExportMetricsServiceRequest().SerializeToString()
    headers = {"Content-Type": "application/x-protobuf"}
    ok = urllib.request.Request(otlp_receiver.http_url("metrics"), body, headers, method="POST")
    with urllib.request.urlopen(ok, timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/x-protobuf"
        assert response.read() == b""
    assert len(otlp_receiver.metric_requests()) == 1

    bad = urllib.request.Request(
        f"{otlp_receiver.http_endpoint}/v1/profiles", body, headers, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(bad, timeout=5)
    assert excinfo.value.code == 404
    excinfo.value.close()


def test_env_points_exporters_at_the_receiver(otlp_receiver: OtlpReceiver) -> None:
    """`env()` gives the endpoint, protocol and insecure flag for each protocol."""
    assert otlp_receiver.env("grpc") == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.grpc_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    assert otlp_receiver.env("http/protobuf") == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.http_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    }
    assert otlp_receiver.grpc_endpoint.startswith("http://127.0.0.1:")
    assert otlp_receiver.http_endpoint.startswith("http://127.0.0.1:")
    with pytest.raises(ValueError):
        otlp_receiver.env("http/json")


def test_env_drives_a_subprocess_sdk(otlp_receiver: OtlpReceiver, run_python) -> None:
    """A subprocess configured only through `env()` exports over HTTP to the receiver."""
    code = (
        "from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader\n"
        "reader = PeriodicExportingMetricReader(OTLPMetricExporter())\n"
        "provider = MeterProvider(metric_readers=[reader])\n"
        "provider.get_meter('child').create_counter('child.count').add(2)\n"
        "provider.shutdown()\n"
    )
    result = run_python(code, env=otlp_receiver.env("http/protobuf"), timeout_s=20)
    assert result.returncode == 0, result.stderr
    (point,) = otlp_receiver.wait_for(lambda r: r.metrics("child.count"), 5)
    assert (point.value, point.protocol) == (2, "http")


def test_wait_for_times_out_with_a_summary_of_what_was_seen(otlp_receiver: OtlpReceiver) -> None:
    """`wait_for` raises AssertionError naming the metrics seen when the predicate stays false."""
    _record_metrics(_metric_exporter(otlp_receiver, "grpc"))
    with pytest.raises(AssertionError) as excinfo:
        otlp_receiver.wait_for(lambda r: r.metrics("never.sent")[0], 0.2)
    message = str(excinfo.value)
    assert "test.tokens" in message and "IndexError" in message


def test_close_stops_both_servers(otlp_receiver: OtlpReceiver) -> None:
    """After `close()` both ports refuse connections and the data stays readable."""
    _record_metrics(_metric_exporter(otlp_receiver, "grpc"))
    otlp_receiver.close()
    for port in (otlp_receiver.grpc_port, otlp_receiver.http_port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert "test.tokens" in otlp_receiver.metric_names()
    otlp_receiver.close()  # idempotent


def _export_in_thread(export: Callable[[], Any], join_s: float) -> Any:
    """Runs `export()` on a daemon thread; fails the test if it has not returned in `join_s`."""
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(export()), daemon=True)
    thread.start()
    thread.join(join_s)
    assert not thread.is_alive(), f"export still blocked after {join_s:g} s"
    return outcome[0]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_metric_export_to_a_black_hole_fails_within_its_timeout(
    black_hole: BlackHole, protocol: str
) -> None:
    """An exporter whose endpoint never answers returns FAILURE after its timeout, not a hang."""
    if protocol == "grpc":
        exporter: MetricExporter = GrpcMetricExporter(
            endpoint=black_hole.endpoint, insecure=True, timeout=EXPORT_TIMEOUT_S
        )
    else:
        exporter = HttpMetricExporter(
            endpoint=f"{black_hole.endpoint}/v1/metrics", timeout=EXPORT_TIMEOUT_S
        )
    memory = InMemoryMetricReader()
    source = MeterProvider(metric_readers=[memory], resource=RESOURCE)
    source.get_meter("t").create_counter("test.hole").add(1)
    metrics_data = memory.get_metrics_data()
    source.shutdown()

    result = _export_in_thread(
        lambda: exporter.export(metrics_data, timeout_millis=EXPORT_TIMEOUT_S * 1000),
        join_s=EXPORT_TIMEOUT_S + 5,
    )
    exporter.shutdown()
    assert result is MetricExportResult.FAILURE
    assert black_hole.accepted >= 1


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_span_export_to_a_refused_port_fails_without_hanging(
    refused_endpoint: str, protocol: str
) -> None:
    """A span exporter pointed at a port with no listener returns FAILURE within its timeout."""
    exporter: SpanExporter
    if protocol == "grpc":
        exporter = GrpcSpanExporter(
            endpoint=refused_endpoint, insecure=True, timeout=EXPORT_TIMEOUT_S
        )
    else:
        exporter = HttpSpanExporter(
            endpoint=f"{refused_endpoint}/v1/traces", timeout=EXPORT_TIMEOUT_S
        )
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("refused"):
        pass
    provider.shutdown()

    result = _export_in_thread(
        lambda: exporter.export(memory.get_finished_spans()), join_s=EXPORT_TIMEOUT_S + 5
    )
    exporter.shutdown()
    assert result is SpanExportResult.FAILURE
