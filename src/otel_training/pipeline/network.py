"""How the OTLP exporters reach their endpoint: proxies and TLS, alike over gRPC and HTTP.

One rule for both protocols (docs/limits.md, "Network"), from the variables
:mod:`otel_training.config` read (:class:`~otel_training.config.ProxySettings`,
:class:`~otel_training.config.OtlpSettings`):

- **Proxy.** An endpoint with TLS (``https://``; over gRPC, also one without a scheme unless
  insecure) goes through ``https_proxy``, a plaintext one (``http://``) through
  ``http_proxy``; over gRPC, gRPC's own ``grpc_proxy`` comes first. A host matched by
  ``no_proxy`` (over gRPC ``no_grpc_proxy`` when set) is reached directly: an entry matches a
  host that ends with it (``example.com`` and ``.example.com`` both match
  ``otel.example.com``), ``host:port`` matches that port only, an address in a CIDR range
  (``10.0.0.0/8``) matches, and ``*`` matches every host. Credentials in a proxy URL are sent
  as ``Proxy-Authorization``. gRPC cannot reach a proxy over TLS (an ``https://`` proxy URL):
  one warning says so and gRPC goes direct.
- **TLS.** The endpoint's certificate is verified with ``OTEL_EXPORTER_OTLP_[SIGNAL_]CERTIFICATE``,
  else the library's variable (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` over HTTP,
  ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` over gRPC), else the system's trusted certificates; a
  client certificate is sent when ``..._CLIENT_CERTIFICATE`` and ``..._CLIENT_KEY`` are both
  set. A file that cannot be read is one warning naming the variable and the path, and the
  default is used: the warning is given when the pipeline is built, never once per export.

The exporters get all of it explicitly: gRPC its channel credentials and the
``grpc.http_proxy`` channel argument (an empty one when no proxy applies, so that gRPC does
not read the environment itself), HTTP a ``requests.Session`` that reads no environment
(``trust_env`` off) with its proxies, CA bundle and client certificate set. Runs when a
pipeline is built (``configure()``), on the caller's thread.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from otel_training import config
from otel_training.config._env import redact_url

__all__ = ["GrpcConnection", "HttpConnection", "bypasses", "grpc_connection", "http_connection"]

#: ``warn(message, *args)``: logs one warning, once per pipeline for the same text.
Warn = Callable[..., None]


def bypasses(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``no_proxy`` (comma-separated entries) says to reach ``host`` directly.

    An entry matches a host that ends with it, case-insensitively (``example.com`` and
    ``.example.com`` match ``otel.example.com``; the same test gRPC applies, which makes
    every host gRPC would reach directly one reached directly here too), ``host:port`` only
    on that port, a CIDR range every address in it, ``*`` every host. Never raises.
    """
    host = host.lower().strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if _has_port(entry) else (entry, "", "")
        if entry_port and str(port) != entry_port:
            continue
        name = name.strip("[]")
        if "/" in name and address is not None:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if host.endswith(name.lstrip("*")):
            return True
    return False


def _has_port(entry: str) -> bool:
    """Whether a no_proxy entry ends with ``:port`` (and is not a bare IPv6 address)."""
    head, sep, tail = entry.rpartition(":")
    return bool(sep) and tail.isdigit() and (head.endswith("]") or ":" not in head)


def _proxy(
    url_scheme: str, host: str, port: int | None, proxies: config.ProxySettings, grpc: bool
) -> tuple[str, str] | None:
    """``(variable, proxy URL)`` that applies to an endpoint, or None."""
    candidates = [proxies.grpc] if grpc else []
    candidates.append(proxies.https if url_scheme == "https" else proxies.http)
    chosen = next((c for c in candidates if c is not None), None)
    if chosen is None:
        return None
    skip = proxies.no_grpc_proxy if grpc and proxies.no_grpc_proxy else proxies.no_proxy
    if skip is not None and bypasses(host, port, skip[1]):
        return None
    variable, url = chosen
    return variable, url if "://" in url else "http://" + url


def _split(endpoint: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an endpoint URL (``http`` when it has no scheme)."""
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
    try:
        port = parsed.port
    except ValueError:
        port = None
    return parsed.scheme, parsed.hostname or "", port


def _readable(source: tuple[str, str] | None, what: str, warn: Warn) -> str | None:
    """The path of ``source`` when the file can be read, else None after one warning that
    names the variable and the path, and says what is used instead."""
    if source is None:
        return None
    variable, path = source
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as error:
        warn(
            "otel-training: %s=%s cannot be read (%s); OTLP exporters use %s instead.",
            variable,
            path,
            error.strerror or error,
            what,
        )
        return None
    return path


def _client_pair(otlp: config.OtlpSettings, warn: Warn) -> tuple[str, str] | None:
    """(certificate path, key path) of the client certificate, when both are given and
    readable; else None (one warning when only one is given or one cannot be read)."""
    certificate, key = otlp.client_certificate, otlp.client_key
    if certificate is None and key is None:
        return None
    if certificate is None or key is None:
        given = key if certificate is None else certificate
        missing = "CLIENT_CERTIFICATE" if certificate is None else "CLIENT_KEY"
        warn(
            "otel-training: %s is set without OTEL_EXPORTER_OTLP_[SIGNAL_]%s; no client "
            "certificate is sent.",
            given[0],
            missing,
        )
        return None
    certificate_path = _readable(certificate, "no client certificate", warn)
    key_path = _readable(key, "no client certificate", warn)
    if certificate_path is None or key_path is None:
        return None
    return certificate_path, key_path


@dataclass(frozen=True)
class GrpcConnection:
    """What an OTLP/gRPC exporter is given: ``insecure``, ``credentials`` and
    ``channel_options`` (its keyword arguments), and the proxy chosen (for the destination
    line), as ``(variable, URL without credentials)`` or None."""

    insecure: bool
    credentials: Any
    channel_options: tuple[tuple[str, Any], ...]
    proxy: tuple[str, str] | None

    def kwargs(self) -> dict[str, Any]:
        """The exporter's keyword arguments."""
        return {
            "insecure": self.insecure,
            "credentials": self.credentials,
            "channel_options": self.channel_options,
        }


def grpc_connection(
    endpoint: str, otlp: config.OtlpSettings, proxies: config.ProxySettings, warn: Warn
) -> GrpcConnection:
    """The TLS and proxy settings of an OTLP/gRPC exporter of ``endpoint`` (module
    docstring). Never raises."""
    import grpc

    scheme = endpoint.split("://", 1)[0].lower() if "://" in endpoint else ""
    if scheme == "https":
        insecure = False
    elif otlp.insecure is not None:
        insecure = otlp.insecure
    else:
        insecure = scheme == "http"
    credentials = None
    if not insecure:
        roots = _read_bytes(_readable(otlp.certificate, "the system's trusted certificates", warn))
        pair = _client_pair(otlp, warn)
        chain, key = (_read_bytes(pair[0]), _read_bytes(pair[1])) if pair else (None, None)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=roots, private_key=key, certificate_chain=chain
        )
    _, host, port = _split(endpoint)
    chosen = _proxy("http" if insecure else "https", host, port, proxies, grpc=True)
    proxy_url = ""
    if chosen is not None:
        variable, url = chosen
        if url.lower().startswith("https://"):
            warn(
                "otel-training: %s=%s is a proxy reached over TLS, which gRPC cannot use; "
                "OTLP/gRPC exporters connect to %s directly.",
                variable,
                redact_url(url),
                redact_url(endpoint),
            )
            chosen = None
        else:
            proxy_url = url
    # An empty grpc.http_proxy means "no proxy": gRPC then reads no variable of its own.
    return GrpcConnection(
        insecure,
        credentials,
        (("grpc.http_proxy", proxy_url),),
        None if chosen is None else (chosen[0], redact_url(chosen[1])),
    )


def _read_bytes(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:  # removed between the check and now: the default
        return None


@dataclass(frozen=True)
class HttpConnection:
    """What an OTLP/HTTP exporter is given: a ``requests.Session`` that reads no environment,
    and what to set on it once the exporter is built (the exporter sets its own
    ``verify``/``cert`` from the environment): :meth:`pin`. ``proxy`` as in
    :class:`GrpcConnection`."""

    session: Any
    verify: bool | str
    cert: tuple[str, str] | None
    proxy: tuple[str, str] | None

    def pin(self) -> None:
        """Sets the session's CA bundle and client certificate (after the exporter is
        built, which sets its own)."""
        self.session.verify = self.verify
        self.session.cert = self.cert


def http_connection(
    endpoint: str, otlp: config.OtlpSettings, proxies: config.ProxySettings, warn: Warn
) -> HttpConnection:
    """The TLS and proxy settings of an OTLP/HTTP exporter of ``endpoint`` (module
    docstring). Never raises."""
    import requests

    session = requests.Session()
    session.trust_env = False  # no proxy, CA bundle or .netrc from the environment: ours
    scheme, host, port = _split(endpoint)
    chosen = _proxy(scheme, host, port, proxies, grpc=False)
    session.proxies = {} if chosen is None else {scheme: chosen[1]}
    verify: bool | str = True
    cert = None
    if scheme == "https":
        verify = _readable(otlp.certificate, "the system's trusted certificates", warn) or True
        cert = _client_pair(otlp, warn)
    return HttpConnection(
        session, verify, cert, None if chosen is None else (chosen[0], redact_url(chosen[1]))
    )
