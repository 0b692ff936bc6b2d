"""A real OTLP receiver and a black-hole listener on loopback, for integration tests.

`OtlpReceiver` serves OTLP/gRPC (grpcio, the official service stubs) and OTLP/HTTP (stdlib
`http.server`, protobuf or JSON bodies, optionally gzip/deflate-encoded; origin- or
absolute-form paths), optionally with TLS and client certificates (`ReceiverTls`), on
127.0.0.1 with OS-chosen ports, keeps every decoded `Export*ServiceRequest`, and flattens them
into small frozen records (`ReceivedMetricPoint`, `ReceivedSpan`, `ReceivedLogRecord`) that tests
can assert on.

`BlackHole` accepts TCP connections and never answers, to test exporters against an endpoint
that hangs; `free_port()` gives a port with nothing listening, for "connection refused" tests.

Only loopback addresses are used. Not a test module: fixtures live in `conftest.py`.
"""

from __future__ import annotations

import gzip
import json
import selectors
import socket
import ssl
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_training.testing import hex_ids_to_base64

__all__ = [
    "BlackHole",
    "OtlpReceiver",
    "ReceiverTls",
    "ReceivedLogRecord",
    "ReceivedMetricPoint",
    "ReceivedSpan",
    "any_value_to_python",
    "attributes_to_dict",
    "free_port",
]

LOOPBACK = "127.0.0.1"
_POLL_INTERVAL_S = 0.05

_T = TypeVar("_T")

# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedMetricPoint:
    """One data point of one metric, as received.

    Attributes:
        name: Metric name.
        kind: One of "gauge", "sum", "histogram", "exponential_histogram", "summary".
        unit: UCUM unit string, "" when unset.
        description: Metric description, "" when unset.
        value: The number for gauge/sum points (int for `as_int`, float for `as_double`);
            None for histogram, exponential_histogram and summary points.
        count: Number of measurements (histogram, exponential_histogram, summary); else None.
        sum: Sum of measurements, in the metric's unit (histogram kinds, summary); else None.
        bucket_counts: Histogram bucket counts, `len(explicit_bounds) + 1` of them; for
            exponential histograms the positive-range bucket counts; else ().
        explicit_bounds: Histogram bucket upper bounds, in the metric's unit; else ().
        min: Histogram minimum when present; else None.
        max: Histogram maximum when present; else None.
        is_monotonic: For sums, whether the sum is monotonic; else None.
        temporality: "delta", "cumulative" or "unspecified" for sum and histogram kinds;
            None for gauge and summary.
        attributes: Data-point attributes.
        resource_attributes: Attributes of the enclosing resource.
        scope_name: Instrumentation scope name.
        scope_version: Instrumentation scope version, "" when unset.
        start_time_unix_nano: Start of the aggregation window, ns since the Unix epoch (0 if unset).
        time_unix_nano: Time of the point, ns since the Unix epoch.
        protocol: "grpc" or "http".
    """

    name: str
    kind: str
    unit: str
    description: str
    value: int | float | None
    count: int | None
    sum: float | None
    bucket_counts: tuple[int, ...]
    explicit_bounds: tuple[float, ...]
    min: float | None
    max: float | None
    is_monotonic: bool | None
    temporality: str | None
    attributes: dict[str, Any]
    resource_attributes: dict[str, Any]
    scope_name: str
    scope_version: str
    start_time_unix_nano: int
    time_unix_nano: int
    protocol: str


@dataclass(frozen=True)
class ReceivedSpan:
    """One span, as received.

    Attributes:
        name: Span name.
        trace_id: 32 lower-case hex digits.
        span_id: 16 lower-case hex digits.
        parent_span_id: 16 lower-case hex digits, or "" for a root span.
        kind: "unspecified", "internal", "server", "client", "producer" or "consumer".
        start_time_unix_nano: Start, ns since the Unix epoch.
        end_time_unix_nano: End, ns since the Unix epoch.
        status_code: "unset", "ok" or "error".
        status_message: Status description, "" when unset.
        attributes: Span attributes.
        events: `(name, attributes)` per event, in order.
        links: `(trace_id hex, span_id hex, attributes)` per link, in order.
        resource_attributes: Attributes of the enclosing resource.
        scope_name: Instrumentation scope name.
        protocol: "grpc" or "http".
    """

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: str
    start_time_unix_nano: int
    end_time_unix_nano: int
    status_code: str
    status_message: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    resource_attributes: dict[str, Any] = field(default_factory=dict)
    scope_name: str = ""
    protocol: str = ""


@dataclass(frozen=True)
class ReceivedLogRecord:
    """One log record, as received.

    Attributes:
        body: The body converted with `any_value_to_python` (None when unset).
        severity_text: e.g. "INFO", "" when unset.
        severity_number: OTLP severity number (0 when unset).
        attributes: Log record attributes.
        trace_id: 32 hex digits, or "" when the record is not in a span.
        span_id: 16 hex digits, or "".
        time_unix_nano: ns since the Unix epoch (0 if unset).
        resource_attributes: Attributes of the enclosing resource.
        scope_name: Instrumentation scope name.
        protocol: "grpc" or "http".
    """

    body: Any
    severity_text: str
    severity_number: int
    attributes: dict[str, Any]
    trace_id: str
    span_id: str
    time_unix_nano: int
    resource_attributes: dict[str, Any]
    scope_name: str
    protocol: str


# ---------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------


def any_value_to_python(value: common_pb2.AnyValue) -> Any:
    """Converts an OTLP `AnyValue` to a plain Python value.

    string -> str, bool -> bool, int -> int, double -> float, bytes -> bytes,
    array -> list (recursively), kvlist -> dict (recursively), unset -> None. Never raises.
    """
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value_to_python(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return attributes_to_dict(value.kvlist_value.values)
    return getattr(value, which)


def attributes_to_dict(key_values: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    """Converts repeated OTLP `KeyValue`s to a dict; a repeated key keeps its last value."""
    return {kv.key: any_value_to_python(kv.value) for kv in key_values}


def _hex(id_bytes: bytes) -> str:
    return id_bytes.hex()


_AGGREGATION_TEMPORALITY = {
    metrics_pb2.AGGREGATION_TEMPORALITY_UNSPECIFIED: "unspecified",
    metrics_pb2.AGGREGATION_TEMPORALITY_DELTA: "delta",
    metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
}

_SPAN_KIND = {
    trace_pb2.Span.SPAN_KIND_UNSPECIFIED: "unspecified",
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}

_STATUS_CODE = {
    trace_pb2.Status.STATUS_CODE_UNSET: "unset",
    trace_pb2.Status.STATUS_CODE_OK: "ok",
    trace_pb2.Status.STATUS_CODE_ERROR: "error",
}


def _number_value(point: metrics_pb2.NumberDataPoint) -> int | float | None:
    which = point.WhichOneof("value")
    return None if which is None else getattr(point, which)


def _optional(message: Message, field_name: str) -> Any:
    return getattr(message, field_name) if message.HasField(field_name) else None


def _flatten_metrics(
    protocol: str, request: metrics_service_pb2.ExportMetricsServiceRequest
) -> list[ReceivedMetricPoint]:
    out: list[ReceivedMetricPoint] = []
    for resource_metrics in request.resource_metrics:
        resource_attributes = attributes_to_dict(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                data = getattr(metric, kind)
                temporality = None
                if kind in ("sum", "histogram", "exponential_histogram"):
                    temporality = _AGGREGATION_TEMPORALITY.get(
                        data.aggregation_temporality, "unspecified"
                    )
                is_monotonic = data.is_monotonic if kind == "sum" else None
                for point in data.data_points:
                    common: dict[str, Any] = dict(
                        name=metric.name,
                        kind=kind,
                        unit=metric.unit,
                        description=metric.description,
                        value=None,
                        count=None,
                        sum=None,
                        bucket_counts=(),
                        explicit_bounds=(),
                        min=None,
                        max=None,
                        is_monotonic=is_monotonic,
                        temporality=temporality,
                        attributes=attributes_to_dict(point.attributes),
                        resource_attributes=dict(resource_attributes),
                        scope_name=scope.name,
                        scope_version=scope.version,
                        start_time_unix_nano=point.start_time_unix_nano,
                        time_unix_nano=point.time_unix_nano,
                        protocol=protocol,
                    )
                    if kind in ("gauge", "sum"):
                        common["value"] = _number_value(point)
                    elif kind == "histogram":
                        common.update(
                            count=point.count,
                            sum=_optional(point, "sum"),
                            bucket_counts=tuple(point.bucket_counts),
                            explicit_bounds=tuple(point.explicit_bounds),
                            min=_optional(point, "min"),
                            max=_optional(point, "max"),
                        )
                    elif kind == "exponential_histogram":
                        common.update(
                            count=point.count,
                            sum=_optional(point, "sum"),
                            bucket_counts=tuple(point.positive.bucket_counts),
                            min=_optional(point, "min"),
                            max=_optional(point, "max"),
                        )
                    elif kind == "summary":
                        common.update(count=point.count, sum=point.sum)
                    out.append(ReceivedMetricPoint(**common))
    return out


def _flatten_spans(
    protocol: str, request: trace_service_pb2.ExportTraceServiceRequest
) -> list[ReceivedSpan]:
    out: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource_attributes = attributes_to_dict(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=_hex(span.trace_id),
                        span_id=_hex(span.span_id),
                        parent_span_id=_hex(span.parent_span_id),
                        kind=_SPAN_KIND.get(span.kind, str(span.kind)),
                        start_time_unix_nano=span.start_time_unix_nano,
                        end_time_unix_nano=span.end_time_unix_nano,
                        status_code=_STATUS_CODE.get(span.status.code, str(span.status.code)),
                        status_message=span.status.message,
                        attributes=attributes_to_dict(span.attributes),
                        events=[(e.name, attributes_to_dict(e.attributes)) for e in span.events],
                        links=[
                            (
                                _hex(link.trace_id),
                                _hex(link.span_id),
                                attributes_to_dict(link.attributes),
                            )
                            for link in span.links
                        ],
                        resource_attributes=dict(resource_attributes),
                        scope_name=scope_spans.scope.name,
                        protocol=protocol,
                    )
                )
    return out


def _flatten_logs(
    protocol: str, request: logs_service_pb2.ExportLogsServiceRequest
) -> list[ReceivedLogRecord]:
    out: list[ReceivedLogRecord] = []
    for resource_logs in request.resource_logs:
        resource_attributes = attributes_to_dict(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                out.append(
                    ReceivedLogRecord(
                        body=any_value_to_python(record.body),
                        severity_text=record.severity_text,
                        severity_number=int(record.severity_number),
                        attributes=attributes_to_dict(record.attributes),
                        trace_id=_hex(record.trace_id),
                        span_id=_hex(record.span_id),
                        time_unix_nano=record.time_unix_nano,
                        resource_attributes=dict(resource_attributes),
                        scope_name=scope_logs.scope.name,
                        protocol=protocol,
                    )
                )
    return out


# ---------------------------------------------------------------------------------------------
# gRPC services
# ---------------------------------------------------------------------------------------------


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request, context):  # noqa: N802 - name fixed by the generated stub
        self._receiver._delay()
        self._receiver._store("metrics", "grpc", request, _grpc_metadata(context))
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request, context):  # noqa: N802 - name fixed by the generated stub
        self._receiver._delay()
        self._receiver._store("traces", "grpc", request, _grpc_metadata(context))
        return trace_service_pb2.ExportTraceServiceResponse()


class _LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(self, request, context):  # noqa: N802 - name fixed by the generated stub
        self._receiver._delay()
        self._receiver._store("logs", "grpc", request, _grpc_metadata(context))
        return logs_service_pb2.ExportLogsServiceResponse()


def _grpc_metadata(context: grpc.ServicerContext) -> dict[str, str]:
    return {k: (v if isinstance(v, str) else repr(v)) for k, v in context.invocation_metadata()}


# ---------------------------------------------------------------------------------------------
# HTTP server
# ---------------------------------------------------------------------------------------------

# path -> (signal, request type, response type)
_HTTP_ROUTES: dict[str, tuple[str, type[Message], type[Message]]] = {
    "/v1/metrics": (
        "metrics",
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
    "/v1/traces": (
        "traces",
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "/v1/logs": (
        "logs",
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
    ),
}


class _QuietHTTPServer(ThreadingHTTPServer):
    """Takes a client that hung up before the reply (an exporter past its timeout) in silence."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _make_http_handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class _OtlpHttpHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 5.0  # s; an idle keep-alive connection is dropped after this long

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            pass

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_POST(self) -> None:  # noqa: N802 - name fixed by http.server
            # The absolute form (http://host:port/v1/traces) is what a client sends through
            # a forwarding proxy; HTTP/1.1 servers must accept it.
            path = urlsplit(self.path).path if "://" in self.path else self.path.split("?", 1)[0]
            route = _HTTP_ROUTES.get(path)
            body = self._read_body()
            if route is None:
                self._reply(404, b"unknown OTLP path", "text/plain")
                return
            signal, request_type, response_type = route
            if len(body) > receiver.max_request_bytes:
                receiver._refused(len(body))
                self._reply(413, b"request larger than the receiver's limit", "text/plain")
                return
            receiver._delay()
            encoding = self.headers.get("Content-Encoding", "").strip().lower()
            content_type = self.headers.get("Content-Type", "application/x-protobuf")
            is_json = content_type.split(";", 1)[0].strip().lower() == "application/json"
            try:
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                elif encoding not in ("", "identity"):
                    self._reply(415, f"unsupported encoding {encoding}".encode(), "text/plain")
                    return
                request = request_type()
                if is_json:
                    document = hex_ids_to_base64(json.loads(body or b"{}"))
                    json_format.ParseDict(document, request, ignore_unknown_fields=True)
                else:
                    request.ParseFromString(body)
            except (OSError, zlib.error, ValueError, DecodeError, json_format.ParseError) as exc:
                self._reply(400, f"bad OTLP request: {exc}".encode(), "text/plain")
                return
            receiver._store(signal, "http", request, dict(self.headers.items()))
            if is_json:
                self._reply(200, b"{}", "application/json")
            else:
                self._reply(200, response_type().SerializeToString(), "application/x-protobuf")

    return _OtlpHttpHandler


@dataclass(frozen=True)
class ReceiverTls:
    """The files of a receiver with TLS (paths to PEM files).

    Attributes:
        certificate: The server's certificate (valid for 127.0.0.1).
        key: Its private key.
        client_ca: When given, clients must present a certificate signed by this CA.
    """

    certificate: str
    key: str
    client_ca: str | None = None


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


class _TlsListener:
    """A listening socket whose accepted connections are wrapped in TLS; the handshake runs
    in the connection's own thread (at its first read), so one client that never completes
    it stalls nobody else. A failed handshake closes that connection only."""

    def __init__(self, listener: socket.socket, context: ssl.SSLContext) -> None:
        self._listener = listener
        self._context = context

    def accept(self):
        connection, address = self._listener.accept()
        wrapped = self._context.wrap_socket(
            connection, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, address

    def __getattr__(self, name: str) -> Any:
        return getattr(self._listener, name)


# ---------------------------------------------------------------------------------------------
# Receiver
# ---------------------------------------------------------------------------------------------


class OtlpReceiver:
    """An OTLP/gRPC plus OTLP/HTTP receiver on 127.0.0.1 that records every export request.

    Both servers start in the constructor on OS-chosen free ports and answer every valid
    export with the empty response (gRPC OK, HTTP 200). Requests are stored decoded, in
    arrival order; all accessors are thread-safe and return copies. gRPC handlers run on the
    receiver's thread pool, HTTP handlers on one thread per connection.

    Args:
        max_workers: Size of the gRPC server's thread pool.
        max_request_bytes: Largest request accepted, in bytes (the collector's default,
            4 MiB, as gRPC's own default); a larger one is refused (gRPC RESOURCE_EXHAUSTED,
            HTTP 413; those over HTTP are counted in :attr:`refused`).
        delay_s: Seconds every export waits before it is answered (a slow collector).
        tls: Serve both protocols with TLS (endpoints ``https://``), and with
            ``tls.client_ca`` require client certificates.

    Raises:
        RuntimeError: If a server cannot bind on 127.0.0.1.
    """

    def __init__(
        self,
        *,
        max_workers: int = 4,
        max_request_bytes: int = 4 * 1024 * 1024,
        delay_s: float = 0.0,
        tls: ReceiverTls | None = None,
    ) -> None:
        self.max_request_bytes = max_request_bytes
        self.tls = tls
        self.delay_s = delay_s
        self.refused: list[int] = []
        self._lock = threading.Lock()
        self._requests: dict[str, list[tuple[str, Message]]] = {
            "metrics": [],
            "traces": [],
            "logs": [],
        }
        self._headers: list[tuple[str, str, dict[str, str]]] = []
        self._closed = False

        self._grpc_server = grpc.server(
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="otlp-receiver-grpc"),
            options=[("grpc.max_receive_message_length", max_request_bytes)],
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _MetricsService(self), self._grpc_server
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            _TraceService(self), self._grpc_server
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            _LogsService(self), self._grpc_server
        )
        if tls is None:
            self.grpc_port = self._grpc_server.add_insecure_port(f"{LOOPBACK}:0")
        else:
            client_ca = None if tls.client_ca is None else _read(tls.client_ca)
            credentials = grpc.ssl_server_credentials(
                [(_read(tls.key), _read(tls.certificate))],
                root_certificates=client_ca,
                require_client_auth=client_ca is not None,
            )
            self.grpc_port = self._grpc_server.add_secure_port(f"{LOOPBACK}:0", credentials)
        if not self.grpc_port:
            raise RuntimeError("OtlpReceiver: could not bind the gRPC server on 127.0.0.1")
        self._grpc_server.start()

        try:
            self._http_server = _QuietHTTPServer((LOOPBACK, 0), _make_http_handler(self))
        except OSError as exc:
            self._grpc_server.stop(grace=0)
            raise RuntimeError("OtlpReceiver: could not bind the HTTP server") from exc
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.certificate, tls.key)
            if tls.client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(tls.client_ca)
            self._http_server.socket = _TlsListener(self._http_server.socket, context)
        self._http_server.daemon_threads = True
        self._http_server.block_on_close = False
        self.http_port: int = self._http_server.server_address[1]
        self._http_thread = threading.Thread(
            target=self._http_server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL_S},
            name="otlp-receiver-http",
            daemon=True,
        )
        self._http_thread.start()

    # -- endpoints ------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        """``https`` for a receiver with TLS, else ``http``."""
        return "http" if self.tls is None else "https"

    @property
    def grpc_endpoint(self) -> str:
        """The OTLP/gRPC endpoint, "http://127.0.0.1:PORT" (https with TLS)."""
        return f"{self.scheme}://{LOOPBACK}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """The OTLP/HTTP base endpoint, "http://127.0.0.1:PORT" (https with TLS; signal paths
        are /v1/...)."""
        return f"{self.scheme}://{LOOPBACK}:{self.http_port}"

    def http_url(self, signal: str) -> str:
        """The full OTLP/HTTP URL for "metrics", "traces" or "logs" (for exporter `endpoint=`)."""
        if signal not in self._requests:
            raise ValueError(f"unknown signal {signal!r}; expected metrics, traces or logs")
        return f"{self.http_endpoint}/v1/{signal}"

    def env(self, protocol: str = "grpc") -> dict[str, str]:
        """OTEL_* variables that point a subprocess's SDK exporters at this receiver.

        Args:
            protocol: "grpc" or "http/protobuf".

        Raises:
            ValueError: For any other protocol.
        """
        if protocol == "grpc":
            return {
                "OTEL_EXPORTER_OTLP_ENDPOINT": self.grpc_endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_INSECURE": "true" if self.tls is None else "false",
            }
        if protocol == "http/protobuf":
            return {
                "OTEL_EXPORTER_OTLP_ENDPOINT": self.http_endpoint,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            }
        raise ValueError(f"unsupported protocol {protocol!r}; expected 'grpc' or 'http/protobuf'")

    # -- storage --------------------------------------------------------------------------------

    def _delay(self) -> None:
        if self.delay_s > 0:
            time.sleep(self.delay_s)

    def _refused(self, size: int) -> None:
        with self._lock:
            self.refused.append(size)

    def request_sizes(self, signal: str) -> list[int]:
        """The serialized size, in bytes, of each accepted request of ``signal``."""
        return [request.ByteSize() for _, request in self._tagged(signal)]

    def _store(self, signal: str, protocol: str, request: Message, headers: dict[str, str]) -> None:
        with self._lock:
            self._requests[signal].append((protocol, request))
            self._headers.append((signal, protocol, headers))

    def _tagged(self, signal: str) -> list[tuple[str, Message]]:
        with self._lock:
            return list(self._requests[signal])

    def metric_requests(self) -> list[metrics_service_pb2.ExportMetricsServiceRequest]:
        """Every `ExportMetricsServiceRequest` received so far, both protocols, arrival order."""
        return [request for _, request in self._tagged("metrics")]

    def trace_requests(self) -> list[trace_service_pb2.ExportTraceServiceRequest]:
        """Every `ExportTraceServiceRequest` received so far, both protocols, arrival order."""
        return [request for _, request in self._tagged("traces")]

    def log_requests(self) -> list[logs_service_pb2.ExportLogsServiceRequest]:
        """Every `ExportLogsServiceRequest` received so far, both protocols, arrival order."""
        return [request for _, request in self._tagged("logs")]

    def request_headers(self) -> list[tuple[str, str, dict[str, str]]]:
        """`(signal, protocol, headers)` per request: HTTP headers or gRPC invocation metadata."""
        with self._lock:
            return [(s, p, dict(h)) for s, p, h in self._headers]

    def clear(self) -> None:
        """Forgets everything received so far."""
        with self._lock:
            for requests in self._requests.values():
                requests.clear()
            self._headers.clear()

    # -- flattened views ------------------------------------------------------------------------

    def metrics(self, name: str | None = None) -> list[ReceivedMetricPoint]:
        """One record per data point received so far, optionally only those of metric `name`."""
        points = [
            point
            for protocol, request in self._tagged("metrics")
            for point in _flatten_metrics(protocol, request)
        ]
        return points if name is None else [p for p in points if p.name == name]

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        """One record per span received so far, optionally only those named `name`."""
        spans = [
            span
            for protocol, request in self._tagged("traces")
            for span in _flatten_spans(protocol, request)
        ]
        return spans if name is None else [s for s in spans if s.name == name]

    def logs(self) -> list[ReceivedLogRecord]:
        """One record per log record received so far."""
        return [
            record
            for protocol, request in self._tagged("logs")
            for record in _flatten_logs(protocol, request)
        ]

    def metric_names(self) -> set[str]:
        """Names of all metrics received so far."""
        return {p.name for p in self.metrics()}

    def span_names(self) -> set[str]:
        """Names of all spans received so far."""
        return {s.name for s in self.spans()}

    # -- waiting --------------------------------------------------------------------------------

    def wait_for(
        self,
        predicate: Callable[[OtlpReceiver], _T],
        timeout_s: float = 10.0,
        *,
        interval_s: float = _POLL_INTERVAL_S,
    ) -> _T:
        """Polls `predicate(self)` every `interval_s` seconds until it returns a truthy value.

        An exception raised by the predicate counts as "not yet" (so `r.metrics("x")[0]` may be
        used before anything arrived) and is shown in the failure message.

        Returns:
            The predicate's first truthy value.

        Raises:
            AssertionError: After `timeout_s` seconds, with the request counts and the metric,
                span and log names seen so far.
        """
        deadline = time.monotonic() + timeout_s
        last_error: BaseException | None = None
        while True:
            try:
                result = predicate(self)
                if result:
                    return result
                last_error = None
            except Exception as exc:  # noqa: BLE001 - reported below
                last_error = exc
            if time.monotonic() >= deadline:
                break
            time.sleep(interval_s)
        raise AssertionError(self._timeout_summary(predicate, timeout_s, last_error))

    def _timeout_summary(
        self, predicate: Callable[..., Any], timeout_s: float, last_error: BaseException | None
    ) -> str:
        name = getattr(predicate, "__qualname__", repr(predicate))
        lines = [
            f"OtlpReceiver.wait_for({name}) still false after {timeout_s:g} s.",
            f"  requests: metrics={len(self.metric_requests())} "
            f"traces={len(self.trace_requests())} logs={len(self.log_requests())}",
            f"  metric names: {sorted(self.metric_names())}",
            f"  span names: {sorted(self.span_names())}",
            f"  log bodies: {[r.body for r in self.logs()][:20]}",
        ]
        if last_error is not None:
            lines.append(f"  last predicate error: {last_error!r}")
        return "\n".join(lines)

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops both servers without grace; idempotent. Stored requests stay readable."""
        if self._closed:
            return
        self._closed = True
        self._grpc_server.stop(grace=0).wait(timeout=5)
        self._http_server.shutdown()
        self._http_server.server_close()
        self._http_thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OtlpReceiver(grpc={self.grpc_endpoint}, http={self.http_endpoint})"


# ---------------------------------------------------------------------------------------------
# Black hole and refused port
# ---------------------------------------------------------------------------------------------


class BlackHole:
    """A TCP listener on 127.0.0.1 that accepts connections and never answers.

    Accepted sockets stay open; whatever arrives is read and discarded, so clients block
    waiting for a response (TLS/HTTP2 handshakes never complete, HTTP reads time out). One
    daemon thread runs the selector loop. Closing the listener closes every accepted socket.

    Raises:
        OSError: If it cannot bind on 127.0.0.1.
    """

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._connections: list[socket.socket] = []
        self._accepted = 0
        self._bytes_received = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="black-hole", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """The endpoint, "http://127.0.0.1:PORT"."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def accepted(self) -> int:
        """Number of connections accepted so far."""
        with self._lock:
            return self._accepted

    @property
    def bytes_received(self) -> int:
        """Bytes read (and discarded) so far, over all connections."""
        with self._lock:
            return self._bytes_received

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=_POLL_INTERVAL_S):
                sock = key.fileobj
                if sock is self._listener:
                    try:
                        conn, _ = self._listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    self._selector.register(conn, selectors.EVENT_READ)
                    with self._lock:
                        self._connections.append(conn)
                        self._accepted += 1
                    continue
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    with self._lock:
                        self._bytes_received += len(data)
                else:  # peer closed: forget it
                    self._selector.unregister(sock)
                    with self._lock:
                        self._connections.remove(sock)
                    sock.close()

    def close(self) -> None:
        """Stops the loop and closes the listener and every accepted socket; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._selector.close()
        self._listener.close()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BlackHole({self.endpoint})"


def free_port() -> int:
    """A TCP port on 127.0.0.1 with nothing listening (bound to 0, then closed).

    Connecting to it is refused unless another process grabs the port in between, which the OS
    makes unlikely by not reusing ephemeral ports at once.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]
