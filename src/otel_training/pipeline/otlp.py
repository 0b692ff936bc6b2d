"""The OTLP exporters' arguments, the same for every signal and both protocols: each setting
given explicitly (endpoint, headers, timeout, compression, and the proxy and TLS of
:mod:`otel_training.pipeline.network`), so that the SDK never re-reads the environment behind
the settings' back (``config/``); and the destination a message names.

Which exporter class, and what wraps it, is each signal's own module's.
"""

from __future__ import annotations

import logging
from typing import Any

from otel_training import config
from otel_training.pipeline import network

__all__ = ["otlp_exporter", "silence_sdk_header_warnings"]


def _otlp_target(
    otlp: config.OtlpSettings, signal_name: str, proxy: tuple[str, str] | None = None
) -> str:
    protocol = "OTLP/gRPC" if otlp.protocol == "grpc" else "OTLP/HTTP"
    target = f"{protocol} {otlp.shown_endpoint or _default_endpoint(otlp, signal_name)}"
    return target if proxy is None else f"{target} via proxy {proxy[1]} ({proxy[0]})"


def otlp_exporter(
    exporter_class: type, otlp: config.OtlpSettings, signal_name: str, settings, warn, **extra
) -> tuple[Any, str]:
    """An OTLP exporter of ``signal_name`` with every setting given explicitly (endpoint,
    headers, timeout, compression, and the proxy and TLS of :mod:`otel_training.pipeline.network`),
    and its destination."""
    kwargs = _otlp_kwargs(otlp, signal_name)
    endpoint = kwargs["endpoint"]
    if otlp.protocol == "grpc":
        grpc = network.grpc_connection(endpoint, otlp, settings.proxies, warn)
        exporter = exporter_class(**kwargs, **grpc.kwargs(), **extra)
        proxy = grpc.proxy
    else:
        http = network.http_connection(endpoint, otlp, settings.proxies, warn)
        exporter = exporter_class(**kwargs, session=http.session, **extra)
        http.pin()
        _pin_http_headers(exporter, otlp)
        proxy = http.proxy
    return exporter, _otlp_target(otlp, signal_name, proxy)


def _otlp_kwargs(otlp: config.OtlpSettings, signal_name: str) -> dict:
    """Constructor arguments shared by the OTLP exporters of both protocols and signals."""
    if otlp.protocol == "grpc":
        from grpc import Compression

        compression = Compression.Gzip if otlp.compression == "gzip" else Compression.NoCompression
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression

        compression = Compression(otlp.compression)
    # Explicit values throughout: given None, the SDK's exporters would read the raw
    # environment again and undo what the settings (config/) rejected.
    return {
        "endpoint": otlp.endpoint or _default_endpoint(otlp, signal_name),
        "headers": dict(otlp.headers) or (_NO_HEADERS if otlp.protocol == "grpc" else None),
        "timeout": otlp.timeout_s,
        "compression": compression,
    }


class _NoHeaders(tuple):
    """An empty header sequence that is truthy, so the gRPC exporter does not fall back to
    reading OTEL_EXPORTER_OTLP_HEADERS itself."""

    def __bool__(self) -> bool:
        return True


_NO_HEADERS = _NoHeaders()


def _pin_http_headers(exporter: Any, otlp: config.OtlpSettings) -> None:
    """The OTLP/HTTP exporter always merges ``OTEL_EXPORTER_OTLP_*HEADERS`` from
    ``os.environ`` into its headers; keep only its own protocol headers and ours, so that
    ``configure(environ=...)`` governs them and an entry the settings refused stays refused."""
    client = getattr(exporter, "_client", None)
    headers = getattr(client, "_headers", None)
    if not isinstance(headers, dict):
        return
    kept = {
        key: value
        for key, value in headers.items()
        if key.lower() in ("user-agent", "content-type", "content-encoding")
    }
    kept.update(otlp.headers)
    client._headers = kept


class _SdkHeaderWarningFilter(logging.Filter):
    """Drops the SDK's own warning about a malformed header entry: it shows the entry, which
    may hold a secret, and repeats the warning the settings gave already."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Header format invalid")


_header_filter = _SdkHeaderWarningFilter()


def silence_sdk_header_warnings() -> None:
    """Installs the filter of :class:`_SdkHeaderWarningFilter` once."""
    logger = logging.getLogger("opentelemetry.util.re")
    if _header_filter not in logger.filters:
        logger.addFilter(_header_filter)


def _default_endpoint(otlp: config.OtlpSettings, signal_name: str) -> str:
    if otlp.protocol == "grpc":
        return "http://localhost:4317"
    return f"http://localhost:4318/v1/{signal_name}"
