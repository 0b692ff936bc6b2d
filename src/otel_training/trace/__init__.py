"""The traces signal below the API: where a phase's span goes and what becomes of it.

- :mod:`~otel_training.trace.shape`: which trace a span goes to, the span budget, the trace ids
  (the formulas, alike on every rank);
- :mod:`~otel_training.trace.segments`: the phases' spans routed to run, job and step traces;
- :mod:`~otel_training.trace.open_spans`: the spans still open at shutdown, ended and marked;
- :mod:`~otel_training.trace.span_values`: span attribute values as the phases take them;
- :mod:`~otel_training.trace.processors`: NVTX ranges, JSON lines and checkpoint durations.

The phases themselves (``otel_training.spans``, ``otel_training.phases``) are the API layer
above this package, as OpenTelemetry keeps its API apart from its SDK. This package is in the
SDK layer (``tests/test_import_layers.py``): it may import the settings, the health definitions,
the leaves and the SDK layer's other packages, never the API or anything above it.
"""
