"""Shim: ``megatron.core.telemetry.training_metrics`` is otel-training's instruments module."""

import sys

from otel_training.metrics import instruments as training_metrics

sys.modules[__name__ + ".training_metrics"] = training_metrics
