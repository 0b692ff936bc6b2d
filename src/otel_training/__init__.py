"""otel-training: OpenTelemetry-native telemetry for model training.

Usage::

    import otel_training

    meter = otel_training.get_meter()          # configures from OTEL_* on first use
    otel_training.record_training_metrics(meter, loss=2.31, step_duration_ms=412.0)

Importing this package configures nothing and starts no thread; it only lets the package's
former module paths be imported (:mod:`otel_training._moved`).
"""

from otel_training import _moved
from otel_training.configuration import (
    Telemetry,
    configure,
    force_flush,
    get_logger,
    get_meter,
    get_tracer,
    logging_handler,
    shutdown,
)
from otel_training.metrics.instruments import flush_deferred, record_training_metrics
from otel_training.metrics.throughput import StepAccumulator, gpt_flops_per_token
from otel_training.metrics.views import STEP_DURATION_BUCKETS_MS, default_views, step_duration_view
from otel_training.pipeline.resource import TrainingResourceDetector
from otel_training.spans import (
    Phase,
    SpanRecorder,
    activation_offload,
    checkpoint_load,
    checkpoint_load_stage,
    checkpoint_save,
    checkpoint_save_completed,
    checkpoint_save_stage,
    data_loading,
    dataloader_init,
    evaluation,
    evaluation_step,
    first_iteration,
    forward_backward,
    grad_sync,
    layer,
    microbatch,
    model_init,
    optimizer_step,
    p2p,
    phase,
    startup,
    training_iteration,
    training_run,
)

__version__ = "0.1.0"

_moved.install()

__all__ = [
    "STEP_DURATION_BUCKETS_MS",
    "Phase",
    "SpanRecorder",
    "StepAccumulator",
    "Telemetry",
    "TrainingResourceDetector",
    "activation_offload",
    "checkpoint_load",
    "checkpoint_load_stage",
    "checkpoint_save",
    "checkpoint_save_completed",
    "checkpoint_save_stage",
    "configure",
    "data_loading",
    "dataloader_init",
    "default_views",
    "evaluation",
    "evaluation_step",
    "first_iteration",
    "flush_deferred",
    "force_flush",
    "forward_backward",
    "get_logger",
    "get_meter",
    "get_tracer",
    "gpt_flops_per_token",
    "grad_sync",
    "layer",
    "microbatch",
    "logging_handler",
    "model_init",
    "optimizer_step",
    "p2p",
    "phase",
    "record_training_metrics",
    "shutdown",
    "startup",
    "step_duration_view",
    "training_iteration",
    "training_run",
]
