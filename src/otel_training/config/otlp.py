"""The exporter variables of each signal: which exporters (``OTEL_{SIGNAL}_EXPORTER``), and the
OTLP settings (``OTEL_EXPORTER_OTLP_[SIGNAL_]*``: endpoint, protocol, headers, timeout,
compression, TLS), with the proxy variables that apply to them.

:class:`OtlpReader` reads them with the policy of :class:`~otel_training.config._env.EnvReader`;
the parser of every variable (:mod:`otel_training.config.parser`) builds on it. Warnings never
show a header's value or a URL's userinfo: either may be a secret.
"""

from __future__ import annotations

import base64
import re
import urllib.parse

from otel_training.config._env import EnvReader, redact_url
from otel_training.config.defaults import (
    COMPRESSIONS,
    DEFAULT_OTLP_TIMEOUT_S,
    EXPORTER_NAMES,
    MAX_OTLP_TIMEOUT_S,
    PROTOCOLS,
)
from otel_training.config.settings import OtlpSettings, ProxySettings

_HEADER_KEY = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_GRPC_METADATA_KEY = re.compile(r"^[0-9a-z_.\-]+$")


class OtlpReader(EnvReader):
    """Reads a signal's exporter and OTLP variables, and the proxy variables."""

    def _exporters(self, name: str, has_endpoint: bool, extra: frozenset[str]) -> tuple[str, ...]:
        raw = self.raw(name)
        fallback = ("otlp",) if has_endpoint else ("otlp_json_file",)
        if raw is None:
            return fallback
        names = [part.strip().lower() for part in raw.split(",") if part.strip()]
        known = EXPORTER_NAMES | extra
        unknown = [n for n in names if n not in known]
        kept = tuple(dict.fromkeys(n for n in names if n in known))
        if not kept:  # one warning, as for any unusable value
            self.reject(
                name,
                raw,
                ",".join(fallback),
                f"names no known exporter (known: {', '.join(sorted(known))})",
            )
            return fallback
        if unknown:
            self.warn(
                "%s names unknown exporter(s) %s; known: %s.",
                name,
                ", ".join(unknown),
                ", ".join(sorted(known)),
            )
        if "none" in kept:
            return ("none",)
        return kept

    def _headers(self, name: str, raw: str, protocol: str) -> dict[str, str]:
        """``k=v`` entries, URL-decoded. A malformed entry is named by its position only:
        what it holds may be a secret (``x-api-key:SECRET``)."""
        headers: dict[str, str] = {}
        position = 0
        for entry in raw.split(","):
            if not entry.strip():
                continue
            position += 1
            key, sep, value = entry.partition("=")
            key = urllib.parse.unquote(key).strip().lower()
            pattern = _GRPC_METADATA_KEY if protocol == "grpc" else _HEADER_KEY
            if not sep or not pattern.match(key):
                self.warn(
                    "%s: ignoring entry %d, which is not key=value with a valid %s key (its "
                    "content is not shown: it may hold a secret); the other entries are kept.",
                    name,
                    position,
                    "gRPC metadata" if protocol == "grpc" else "HTTP header",
                )
                continue
            headers[key] = urllib.parse.unquote(value).strip()
        return headers

    def _otlp(self, signal: str) -> OtlpSettings:
        upper = signal.upper()
        protocol_name, protocol_raw = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"
        )
        protocol = "grpc"
        if protocol_raw is not None:
            lowered = protocol_raw.lower()
            if lowered in PROTOCOLS:
                protocol = lowered
            elif lowered == "http/json":
                self.reject(
                    protocol_name,
                    protocol_raw,
                    "http/protobuf",
                    "is not available in the Python SDK",
                )
                protocol = "http/protobuf"
            else:
                self.reject(protocol_name, protocol_raw, protocol, "is not grpc or http/protobuf")

        headers: dict[str, str] = {}
        for name in ("OTEL_EXPORTER_OTLP_HEADERS", f"OTEL_EXPORTER_OTLP_{upper}_HEADERS"):
            raw = self.raw(name)
            if raw is not None:
                headers.update(self._headers(name, raw, protocol))

        endpoint = self.raw(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
        endpoint_name = f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"
        generic = endpoint is None
        if generic:
            endpoint = self.raw("OTEL_EXPORTER_OTLP_ENDPOINT")
            endpoint_name = "OTEL_EXPORTER_OTLP_ENDPOINT"
        if endpoint is not None:
            endpoint = self._endpoint(endpoint_name, endpoint, protocol, generic, signal, headers)

        timeout_name, _ = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"
        )
        timeout_s = self.positive(
            timeout_name,
            DEFAULT_OTLP_TIMEOUT_S,
            maximum=MAX_OTLP_TIMEOUT_S,
            why_maximum=" seconds (the Python SDK reads this timeout in seconds, not ms)",
        )

        compression_name, _ = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"
        )
        compression = self.choice(compression_name, COMPRESSIONS, "none")
        if compression == "deflate" and protocol == "grpc":
            self.reject(compression_name, "deflate", "gzip", "is not supported over gRPC")
            compression = "gzip"
        insecure_name, insecure_raw = self.first(
            f"OTEL_EXPORTER_OTLP_{upper}_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"
        )
        insecure = None if insecure_raw is None else self.boolean(insecure_name, False)
        library = (
            ("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",)
            if protocol == "grpc"
            else ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
        )
        return OtlpSettings(
            endpoint,
            protocol,
            headers,
            timeout_s,
            compression,
            insecure=insecure,
            certificate=self._sourced(
                f"OTEL_EXPORTER_OTLP_{upper}_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                *library,
            ),
            client_key=self._sourced(
                f"OTEL_EXPORTER_OTLP_{upper}_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY"
            ),
            client_certificate=self._sourced(
                f"OTEL_EXPORTER_OTLP_{upper}_CLIENT_CERTIFICATE",
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            ),
        )

    def _sourced(self, *names: str) -> tuple[str, str] | None:
        """``(variable, value)`` of the first of ``names`` that is set, else None."""
        name, raw = self.first(*names)
        return None if raw is None else (name, raw)

    def _proxies(self) -> ProxySettings:
        """The proxy variables (:class:`ProxySettings`)."""
        return ProxySettings(
            https=self._sourced("https_proxy", "HTTPS_PROXY"),
            http=self._sourced("http_proxy", "HTTP_PROXY"),
            no_proxy=self._sourced("no_proxy", "NO_PROXY"),
            grpc=self._sourced("grpc_proxy"),
            no_grpc_proxy=self._sourced("no_grpc_proxy"),
        )

    def _endpoint(
        self,
        name: str,
        endpoint: str,
        protocol: str,
        generic: bool,
        signal: str,
        headers: dict[str, str],
    ) -> str | None:
        """A usable endpoint URL, or None after one warning. Userinfo in the URL
        (``http://user:secret@host``) becomes an ``authorization: Basic`` header (unless one
        is given) and leaves the URL, so that no log line or destination shows it."""
        shown = redact_url(endpoint)
        try:
            parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
            hostname = parsed.hostname
            parsed.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            parsed, hostname = None, None
        if parsed is None or parsed.scheme not in ("http", "https") or not hostname:
            self.warn("%s=%r is not an http(s) URL; ignoring it.", name, shown)
            return None
        if parsed.username is not None or parsed.password is not None:
            if "authorization" not in headers:
                user = urllib.parse.unquote(parsed.username or "")
                password = urllib.parse.unquote(parsed.password or "")
                token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
                headers["authorization"] = f"Basic {token}"
            self.warn(
                "%s has credentials in its URL: they are sent as an authorization header and "
                "never shown; the endpoint is %s.",
                name,
                shown,
            )
            endpoint = shown
        if protocol == "http/protobuf" and generic:
            return endpoint.rstrip("/") + f"/v1/{signal}"
        if (
            protocol == "grpc"
            and "://" not in endpoint
            and self.first(
                f"OTEL_EXPORTER_OTLP_{signal.upper()}_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"
            )[1]
            is None
        ):
            self.warn(
                "%s=%r has no scheme: gRPC will use TLS. Write http://%s for a plaintext "
                "collector, or set OTEL_EXPORTER_OTLP_INSECURE.",
                name,
                shown,
                shown,
            )
        return endpoint
