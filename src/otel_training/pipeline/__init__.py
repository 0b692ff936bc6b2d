"""Building one pipeline from settings: the resource, the readers and exporters of each signal,
the span processors, the logger provider, and where they write.

:func:`build` is what ``otel_training.configure()`` runs; it does not touch any global. Every
exporter is wrapped in an :mod:`otel_training.export.exporters` guard; the embedded default's files
are opened in this run's directory (:mod:`otel_training.export.files`); OTLP exporters get every
setting explicitly, so that the SDK never re-reads the environment behind the settings' back
(``config/``).

- :mod:`~otel_training.pipeline.building`: :func:`build` and what it makes, :class:`Pipeline`;
- :mod:`~otel_training.pipeline.resource`: the Resource the three signals share;
- :mod:`~otel_training.pipeline.metrics`, :mod:`~otel_training.pipeline.traces`,
  :mod:`~otel_training.pipeline.logs`: one module of factories per signal (readers or
  exporters, batch processors, the signal's provider);
- :mod:`~otel_training.pipeline.otlp`: the OTLP exporters' arguments, alike for every signal;
- :mod:`~otel_training.pipeline.network`: how they reach their endpoint (proxies, TLS);
- :mod:`~otel_training.pipeline.outputs`: the embedded default's files and where they open;
- :mod:`~otel_training.pipeline.lifecycle`: process life (atexit, SIGTERM, fork);
- :mod:`~otel_training.pipeline.ids`: trace and span ids distinct across ranks and children;
- :mod:`~otel_training.pipeline.scope`: :data:`INSTRUMENTATION_NAME`, the scope of it all.

This package is in the SDK layer (``tests/test_import_layers.py``): it may import the settings
(:mod:`otel_training.config`), the health definitions, the leaves and the SDK layer's other
packages (:mod:`otel_training.export`, :mod:`otel_training.trace`,
:mod:`otel_training.metrics`, :mod:`otel_training.logs`), never the API (``configuration``,
``spans``, ``phases``) or anything above it. Its modules import each other downwards only:
``building`` the rest, the signals ``otlp``, ``outputs`` and ``scope``.
"""

from otel_training.pipeline.building import Pipeline, build
from otel_training.pipeline.otlp import silence_sdk_header_warnings
from otel_training.pipeline.scope import INSTRUMENTATION_NAME

__all__ = ["INSTRUMENTATION_NAME", "Pipeline", "build", "silence_sdk_header_warnings"]
