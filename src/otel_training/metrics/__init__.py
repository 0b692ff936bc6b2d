"""The metrics signal: Megatron-LM's training metrics as instruments, and what feeds and shapes
them.

- :mod:`~otel_training.metrics.instruments`: the instruments and ``record_training_metrics``
  (the drop-in for Megatron-LM's ``training_metrics`` module);
- :mod:`~otel_training.metrics.throughput`: tokens/s and TFLOP/s, defined once;
- :mod:`~otel_training.metrics.memory`: device memory in GiB;
- :mod:`~otel_training.metrics.views`: the default views (step-time and checkpoint buckets);
- :mod:`~otel_training.metrics.replicated`: which ranks export values every peer holds alike;
- :mod:`~otel_training.metrics.heartbeat`: the hang signals on their own short interval;
- :mod:`~otel_training.metrics.device`: GPU metrics read with NVML;
- :mod:`~otel_training.metrics.device_reads`: device scalars read without stalling training.

This package is in the SDK layer (``tests/test_import_layers.py``): it may import the settings
(:mod:`otel_training.config`), the health definitions, the leaves and the SDK layer's other
packages, never the API (``configuration``, ``spans``, ``phases``) or anything above it.
"""
