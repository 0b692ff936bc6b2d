"""The logs signal: Python ``logging`` into OpenTelemetry log records, and logs for people.

- :mod:`~otel_training.logs.bridge`: :class:`~otel_training.logs.bridge.LoggingHandler`, each
  ``logging`` record as a log record of the pipeline;
- :mod:`~otel_training.logs.formatting`: ``KeyValueFormatter`` (one line of ``key=value``
  pairs) and ``LogSpanProcessor`` (spans as log lines).

This package is in the SDK layer (``tests/test_import_layers.py``): it may import the settings,
the health definitions, the leaves and the SDK layer's other packages, never the API
(``configuration``, ``spans``, ``phases``) or anything above it.
"""
