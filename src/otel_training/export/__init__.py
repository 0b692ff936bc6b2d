"""What leaves the process: bounded, always encodable, and written wherever it can be.

- :mod:`~otel_training.export.limits`: the one string rule, the cost model of an export, and
  the bounding of spans, log records and metrics within it;
- :mod:`~otel_training.export.exporters`: the guards around every exporter and the Prometheus
  reader (what they hand on is bounded; a failing exporter never reaches training);
- :mod:`~otel_training.export.files`: the embedded default's run directory and its files;
- :mod:`~otel_training.export._outage`: one log line per outage of an OTLP endpoint.

The limits are a leaf (every layer may use the string rule); the rest of this package is in the
SDK layer (``tests/test_import_layers.py``): it may import the settings, the health
definitions, the leaves and the SDK layer's other packages, never the API or anything above it.
"""
