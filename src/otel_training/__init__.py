"""otel-training: OpenTelemetry-native telemetry for model training.

Usage::

    import otel_training

    meter = otel_training.get_meter()          # configures from OTEL_* on first use
    otel_training.record_training_metrics(meter, loss=2.31, step_duration_ms=412.0)

Importing this package has no side effects: nothing is configured, no thread is started.
"""

from otel_training.instruments import flush_deferred, record_training_metrics
from otel_training.resource import TrainingResourceDetector
from otel_training.setup import (
    Telemetry,
    configure,
    force_flush,
    get_logger,
    get_meter,
    get_tracer,
    logging_handler,
    shutdown,
)
from otel_training.spans import (
    Phase,
    SpanRecorder,
    checkpoint_load,
    checkpoint_save,
    data_loading,
    evaluation,
    forward_backward,
    optimizer_step,
    phase,
    startup,
    training_iteration,
    training_run,
)
from otel_training.throughput import StepAccumulator, gpt_flops_per_token
from otel_training.views import STEP_DURATION_BUCKETS_MS, default_views, step_duration_view

__version__ = "0.1.0"

__all__ = [
    "Phase",
    "STEP_DURATION_BUCKETS_MS",
    "SpanRecorder",
    "StepAccumulator",
    "Telemetry",
    "TrainingResourceDetector",
    "checkpoint_load",
    "checkpoint_save",
    "configure",
    "data_loading",
    "default_views",
    "evaluation",
    "flush_deferred",
    "force_flush",
    "forward_backward",
    "get_logger",
    "get_meter",
    "get_tracer",
    "gpt_flops_per_token",
    "logging_handler",
    "optimizer_step",
    "phase",
    "record_training_metrics",
    "shutdown",
    "startup",
    "step_duration_view",
    "training_iteration",
    "training_run",
]
