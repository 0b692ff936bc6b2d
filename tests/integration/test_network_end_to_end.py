"""Network settings behave the same over OTLP/gRPC and OTLP/HTTP, against a real receiver with
TLS (certificates made by the test) and a real HTTP proxy on loopback that counts what it
relays: proxy variables in either case, no_proxy, the OpenTelemetry certificate and client-key
variables over the libraries' own, and a certificate file that cannot be read (one line)."""

from __future__ import annotations

import base64
import logging

import pytest
from connect_proxy import ConnectProxy
from doc_rules import documents
from opentelemetry._logs import LogRecord
from otlp_receiver import OtlpReceiver, ReceiverTls
from tls_files import TlsFiles, make_tls_files

from otel_training import configuration as setup

PROTOCOLS = ("grpc", "http/protobuf")


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _export(environ: dict[str, str]) -> str:
    """Configures from ``environ`` alone, records a span, a metric point and a log record,
    shuts down; returns the destination line."""
    telemetry = setup.configure(
        environ={
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "5",
            **environ,
        },
        set_global=False,
    )
    with telemetry.tracer.start_as_current_span("through"):
        pass
    telemetry.meter.create_counter("through.count").add(1)
    telemetry.logger_provider.get_logger("through").emit(LogRecord(body="through"))
    telemetry.shutdown()
    return telemetry.destination


def _arrived(receiver: OtlpReceiver) -> bool:
    return (
        len(receiver.spans("through")) == 1
        and [p.value for p in receiver.metrics("through.count")] == [1]
        and [r.body for r in receiver.logs()] == ["through"]
    )


@pytest.fixture
def no_process_proxies(monkeypatch):
    """The test process's own proxy variables unset: gRPC reads no_proxy from the process."""
    for name in ("no_proxy", "NO_PROXY", "no_grpc_proxy", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "HTTP_PROXY", "grpc_proxy"):
        monkeypatch.delenv(name, raising=False)


@documents("limits.md", "reach their endpoint by one rule")
@documents("limits.md", "Each proxy variable is read in either case")
@documents("limits.md", "for an endpoint with TLS")
@documents("limits.md", "The destination line names the proxy")
@pytest.mark.parametrize("variable", ["https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_proxy_variables_in_either_case_take_both_protocols_through_the_proxy(
    tls, protocol, variable, no_process_proxies
):
    """https_proxy/HTTPS_PROXY for an endpoint with TLS, http_proxy/HTTP_PROXY for a
    plaintext one: spans, metrics and logs arrive through the proxy over gRPC and HTTP alike,
    and the destination line says so."""
    secure = variable.lower() == "https_proxy"
    server = ReceiverTls(tls.server_certificate, tls.server_key) if secure else None
    with OtlpReceiver(tls=server) as receiver, ConnectProxy() as proxy:
        environ = {**receiver.env(protocol), variable: proxy.url}
        if secure:
            environ["OTEL_EXPORTER_OTLP_CERTIFICATE"] = tls.ca
        destination = _export(environ)
        assert _arrived(receiver)
    port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
    assert {(r.host, r.port) for r in proxy.relayed()} == {("127.0.0.1", port)}
    assert f"via proxy {proxy.url} ({variable})" in destination


@documents("limits.md", "own `grpc_proxy` comes first")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_grpc_proxy_is_grpcs_own(tls, protocol, no_process_proxies):
    """grpc_proxy (gRPC's own variable) takes OTLP/gRPC through the proxy, and only it."""
    with OtlpReceiver() as receiver, ConnectProxy() as proxy:
        _export({**receiver.env(protocol), "grpc_proxy": proxy.url})
        assert _arrived(receiver)
    assert bool(proxy.relayed()) is (protocol == "grpc")


@documents("limits.md", "A host in `no_proxy`/`NO_PROXY`")
@pytest.mark.parametrize("variable", ["no_proxy", "NO_PROXY"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_proxy_in_either_case_reaches_the_endpoint_directly(
    protocol, variable, no_process_proxies
):
    """A host in no_proxy/NO_PROXY is reached directly over gRPC and HTTP alike: nothing
    goes through the proxy, everything arrives."""
    with OtlpReceiver() as receiver, ConnectProxy() as proxy:
        environ = {
            **receiver.env(protocol),
            "HTTP_PROXY": proxy.url,
            "grpc_proxy": proxy.url,
            variable: "example.com, 127.0.0.0/8",
        }
        destination = _export(environ)
        assert _arrived(receiver)
    assert proxy.relayed() == [] and "via proxy" not in destination


@documents("limits.md", "The endpoint's certificate is verified with")
@documents("limits.md", "so neither library reads")
@pytest.mark.parametrize(
    "chosen",
    ["OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_{SIGNAL}_CERTIFICATE"],
)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_opentelemetry_certificate_variables_win_over_the_libraries_own(
    tls, protocol, chosen, monkeypatch
):
    """Against a receiver that requires a client certificate: with the right CA in the
    OpenTelemetry variable (or the per-signal one, over a wrong generic one) and the wrong CA
    in REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (given and in
    the process's environment), and the client certificate and key, everything arrives."""
    wrong = {
        name: tls.other_ca
        for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
    }
    for name, value in wrong.items():
        monkeypatch.setenv(name, value)
    server = ReceiverTls(tls.server_certificate, tls.server_key, client_ca=tls.ca)
    with OtlpReceiver(tls=server) as receiver:
        environ = {
            **receiver.env(protocol),
            **wrong,
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": tls.client_certificate,
            "OTEL_EXPORTER_OTLP_CLIENT_KEY": tls.client_key,
        }
        if chosen == "OTEL_EXPORTER_OTLP_CERTIFICATE":
            environ[chosen] = tls.ca
        else:
            environ["OTEL_EXPORTER_OTLP_CERTIFICATE"] = tls.other_ca
            for signal in ("TRACES", "METRICS", "LOGS"):
                environ[chosen.format(SIGNAL=signal)] = tls.ca
        _export(environ)
        assert _arrived(receiver)


@documents("limits.md", "A file that cannot be read")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_certificate_file_that_cannot_be_read_is_one_line(tls, protocol, tmp_path, caplog):
    """OTEL_EXPORTER_OTLP_CERTIFICATE naming a missing file: one warning naming the variable
    and the path and saying what is used instead, for the three signals together; no
    traceback from otel-training."""
    missing = str(tmp_path / "missing-ca.pem")
    server = ReceiverTls(tls.server_certificate, tls.server_key)
    with OtlpReceiver(tls=server) as receiver, caplog.at_level(logging.WARNING):
        environ = {
            **receiver.env(protocol),
            "OTEL_EXPORTER_OTLP_CERTIFICATE": missing,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        }
        _export(environ)
    ours = [r for r in caplog.records if r.name.startswith("otel_training")]
    lines = [r.getMessage() for r in ours if missing in r.getMessage()]
    assert len(lines) == 1, lines
    assert "OTEL_EXPORTER_OTLP_CERTIFICATE" in lines[0]
    assert "the system's trusted certificates" in lines[0]
    assert not [r for r in ours if r.exc_info]


@documents("limits.md", "Credentials in a proxy URL are sent as")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_credentials_in_a_proxy_url_reach_the_proxy(protocol, no_process_proxies):
    """http://user:secret@proxy: the proxy gets Proxy-Authorization: Basic user:secret over
    gRPC and HTTP alike, and the destination line does not show the secret."""
    with OtlpReceiver() as receiver, ConnectProxy() as proxy:
        url = proxy.url.replace("http://", "http://user:s%40cret@")
        destination = _export({**receiver.env(protocol), "http_proxy": url})
        assert _arrived(receiver)
    (relayed,) = {r.authorization for r in proxy.relayed()}
    assert relayed == "Basic " + base64.b64encode(b"user:s@cret").decode()
    assert "cret" not in destination


@documents("limits.md", "gRPC itself also reads the process's lower-case")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_grpc_alone_reads_the_processs_own_no_proxy(protocol, no_process_proxies, monkeypatch):
    """The library's limit, pinned: with no_proxy set in the process but not in the variables
    given to configure(), OTLP/gRPC goes direct and OTLP/HTTP through the proxy."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with OtlpReceiver() as receiver, ConnectProxy() as proxy:
        _export({**receiver.env(protocol), "http_proxy": proxy.url})
        assert _arrived(receiver)
    assert bool(proxy.relayed()) is (protocol != "grpc")
