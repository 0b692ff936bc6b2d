"""otel_training.pipeline.network: which endpoints go through a proxy, and what each library is
given."""

from __future__ import annotations

import pytest
from doc_rules import documents

from otel_training import config
from otel_training.pipeline import network


@documents("limits.md", "an entry matches a host that ends with it")
@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "direct"),
    [
        ("otel.example.com", 4317, "example.com", True),
        ("otel.example.com", 4317, ".example.com", True),
        ("otel.example.com", 4317, "*.example.com", True),
        ("OTEL.Example.COM", 4317, "example.com", True),
        ("example.org", 4317, "example.com", False),
        ("collector", 4317, "collector:4317", True),
        ("collector", 4318, "collector:4317", False),
        ("10.1.2.3", 4317, "10.0.0.0/8", True),
        ("11.1.2.3", 4317, "10.0.0.0/8", False),
        ("::1", 4317, "::1/128", True),
        ("anything", 1, "*", True),
        ("collector", 4317, " , ,", False),
        ("collector", 4317, "other, collector", True),
    ],
)
def test_no_proxy_entries_match_hosts_ports_and_ranges(host, port, no_proxy, direct):
    """Suffixes (with or without a leading dot or *), host:port, CIDR ranges and * match as
    docs/limits.md says; blanks are ignored."""
    assert network.bypasses(host, port, no_proxy) is direct


def _warnings() -> tuple[list[str], network.Warn]:
    said: list[str] = []
    return said, lambda message, *args: said.append(message % args)


@documents("limits.md", "gRPC cannot reach a proxy over TLS")
def test_a_proxy_reached_over_tls_is_one_line_and_grpc_goes_direct():
    """An https:// proxy URL: gRPC cannot use it; one warning names the variable, and the
    channel gets an empty proxy (so that gRPC reads no variable itself). HTTP uses it."""
    proxies = config.ProxySettings(https=("HTTPS_PROXY", "https://user:secret@proxy:3128"))
    otlp = config.OtlpSettings("https://collector:4317", "grpc", {}, 10.0, "none")
    said, warn = _warnings()
    connection = network.grpc_connection("https://collector:4317", otlp, proxies, warn)
    assert connection.channel_options == (("grpc.http_proxy", ""),) and connection.proxy is None
    assert len(said) == 1 and "HTTPS_PROXY" in said[0] and "secret" not in said[0]
    http = network.http_connection("https://collector:4318/v1/traces", otlp, proxies, warn)
    assert http.session.proxies == {"https": "https://user:secret@proxy:3128"}
    assert http.session.trust_env is False and http.proxy[0] == "HTTPS_PROXY"


@documents("limits.md", "client certificate is sent when both")
def test_a_client_key_without_its_certificate_is_one_line_and_none_is_sent():
    """Only OTEL_EXPORTER_OTLP_CLIENT_KEY set: one warning, no client certificate."""
    otlp = config.OtlpSettings(
        "https://collector:4318/v1/logs",
        "http/protobuf",
        {},
        10.0,
        "none",
        client_key=("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/keys/client.key"),
    )
    said, warn = _warnings()
    connection = network.http_connection(otlp.endpoint, otlp, config.ProxySettings(), warn)
    assert connection.cert is None and len(said) == 1
    assert "OTEL_EXPORTER_OTLP_CLIENT_KEY" in said[0] and "CLIENT_CERTIFICATE" in said[0]


@documents("limits.md", "the lower-case name first")
def test_lower_case_proxy_variables_come_first_and_upper_case_ones_are_read_too():
    """http_proxy wins over HTTP_PROXY when both are set; HTTPS_PROXY and NO_PROXY alone are
    read; grpc_proxy is read in lower case only (gRPC's own)."""
    proxies = config.load(
        environ={
            "http_proxy": "http://lower:1",
            "HTTP_PROXY": "http://upper:1",
            "HTTPS_PROXY": "http://secure:1",
            "NO_PROXY": "internal",
            "GRPC_PROXY": "http://ignored:1",
        }
    ).proxies
    assert proxies.http == ("http_proxy", "http://lower:1")
    assert proxies.https == ("HTTPS_PROXY", "http://secure:1")
    assert proxies.no_proxy == ("NO_PROXY", "internal") and proxies.grpc is None


@documents("limits.md", "gRPC endpoint without a scheme plaintext")
@pytest.mark.parametrize(
    ("endpoint", "insecure", "plaintext"),
    [
        ("http://collector:4317", None, True),
        ("https://collector:4317", None, False),
        ("https://collector:4317", True, False),
        ("collector:4317", None, False),
        ("collector:4317", True, True),
        ("http://collector:4317", False, False),
    ],
)
def test_grpc_is_plaintext_for_http_or_insecure_and_tls_otherwise(endpoint, insecure, plaintext):
    """http:// is plaintext and https:// TLS; without a scheme, TLS unless INSECURE=true;
    TLS comes with channel credentials."""
    otlp = config.OtlpSettings(endpoint, "grpc", {}, 10.0, "none", insecure=insecure)
    connection = network.grpc_connection(endpoint, otlp, config.ProxySettings(), print)
    assert connection.insecure is plaintext
    assert (connection.credentials is None) is plaintext
