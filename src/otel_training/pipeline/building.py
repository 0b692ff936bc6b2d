"""Building one pipeline from settings: :func:`build` puts the resource and each signal's
factories together into the providers of :class:`Pipeline`, and says in one line where
telemetry goes.

It is what ``otel_training.configure()`` runs; it does not touch any global.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from opentelemetry import _logs as logs_api
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk._logs import LogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.semconv.attributes.service_attributes import SERVICE_INSTANCE_ID

from otel_training import config
from otel_training._log_once import LogOnce
from otel_training.health.metrics import observe_ledger
from otel_training.metrics import device as device_metrics
from otel_training.metrics import heartbeat, replicated
from otel_training.metrics import views as _views
from otel_training.pipeline import logs, metrics, network, traces
from otel_training.pipeline.outputs import Outputs
from otel_training.pipeline.resource import build_resource
from otel_training.pipeline.scope import INSTRUMENTATION_NAME
from otel_training.semconv.attributes import DL_RANK, DL_RUN_ID
from otel_training.trace.open_spans import OpenSpans
from otel_training.trace.processors import CheckpointMetricsSpanProcessor, span_mirrors
from otel_training.trace.processors.batch import observe_drops
from otel_training.trace.processors.exception_logs import ExceptionLogSpanProcessor
from otel_training.trace.processors.jsonlog import JsonLogSpanProcessor
from otel_training.trace.processors.nvtx import NvtxSpanProcessor

__all__ = ["Pipeline", "build"]

_logger = logging.getLogger("otel_training")


@dataclass
class Pipeline:
    """What :func:`build` made: the providers, where they export, and what to close.

    Attributes:
        meter_provider: The SDK ``MeterProvider``, or a no-op one.
        tracer_provider: The SDK ``TracerProvider``, or a no-op one.
        destination: One line saying where telemetry goes (never a secret).
        output_dir: Absolute path of this run's directory of the embedded default, or None.
        nvtx: The NVTX processor when a tool is attached (NVTX-only phases use its domain).
        open_spans: The spans its phases hold open, ended as truncated at shutdown.
        files: Streams opened for the exporters, to close after shutdown.
        logger_provider: The SDK ``LoggerProvider``, or a no-op one when no log exporter
            and no extra log processor is configured.
        span_lines: The processor writing the span JSON lines, or None (the hang watchdog
            writes its ``stacks`` records there too).
    """

    meter_provider: metrics_api.MeterProvider
    tracer_provider: trace_api.TracerProvider
    destination: str
    output_dir: str | None = None
    nvtx: NvtxSpanProcessor | None = None
    open_spans: OpenSpans | None = None
    files: list[TextIO] = field(default_factory=list)
    logger_provider: logs_api.LoggerProvider = field(default_factory=logs_api.NoOpLoggerProvider)
    span_lines: JsonLogSpanProcessor | None = None


def build(
    settings: config.Settings,
    *,
    service_name: str | None,
    resource_attributes: Mapping[str, object],
    user_views: list[View],
    step_duration_buckets_ms: Sequence[float] | None,
    extra_readers: list[MetricReader],
    extra_processors: list[SpanProcessor],
    extra_log_processors: Sequence[LogRecordProcessor] = (),
) -> Pipeline:
    """The pipeline of ``settings``, on the caller's thread, touching no global.

    Its providers are no-op ones when ``OTEL_SDK_DISABLED`` is set or the export-rank policy
    leaves this rank out. Otherwise they share one resource: the meter provider has
    ``extra_readers`` and one reader per metrics exporter; the tracer provider has the span
    mirrors (NVTX ranges, span JSON lines), the checkpoint durations, ``extra_processors``
    and one batch processor per traces exporter; the logger provider, made only when there
    is a log exporter or an extra log processor, has ``extra_log_processors`` and one batch
    processor per logs exporter.
    """
    identity = settings.identity
    policy = settings.export_ranks
    if settings.sdk_disabled or not policy.exports(identity):
        if settings.sdk_disabled:
            why = "disabled by OTEL_SDK_DISABLED"
        elif policy.exports_nowhere(identity.world_size):
            why = f"none from any rank ({policy.setting} selects no rank of {identity.world_size})"
            _say_no_rank_exports(policy, identity.world_size)
        else:
            why = f"none from rank {identity.rank} ({policy.setting}: {policy})"
        return Pipeline(
            metrics_api.NoOpMeterProvider(), trace_api.NoOpTracerProvider(), f"telemetry: {why}"
        )

    resource = build_resource(settings, service_name, resource_attributes)
    # Values every data- and tensor-parallel peer holds alike: one rank per stage may send them.
    replication = replicated.decide(
        settings.export_replicated, identity.world_size, resource.attributes
    )
    notes = [replication.note] if replication.note else []
    outputs = Outputs(
        settings,
        {
            key: resource.attributes[key]
            for key in (DL_RUN_ID, SERVICE_INSTANCE_ID, DL_RANK, "process.creation.time")
            if key in resource.attributes
        },
    )
    warn = _once_per_build()
    readers: list[MetricReader] = list(extra_readers)
    metric_targets: list[str] = []
    for name in settings.metrics_exporters:
        reader, target = metrics.metric_reader(name, settings, outputs, warn)
        if reader is not None:
            readers.append(reader)
            metric_targets.append(target)
    provider_arguments: dict[str, Any] = {
        "metric_readers": readers,
        "resource": resource,
        "views": _views.default_views(
            step_duration_buckets_ms or settings.step_duration_buckets_ms,
            user_views,
            exponential_step_duration=settings.step_duration_histogram == "exponential",
            silent=replication.silent_metrics,
        ),
        "shutdown_on_exit": False,
    }
    # Before the span processors: checkpoint spans record their durations on its meter.
    beat = metrics.heartbeat_provider(settings, resource, warn)
    if beat is None:
        meter_provider = MeterProvider(**provider_arguments)
    else:
        meter_provider = heartbeat.MeterProviderWithHeartbeat(beat, **provider_arguments)
        interval_s = (settings.heartbeat_interval_ms or 0) / 1000
        notes.append(f"hang signals over OTLP every {interval_s:g} s")
    # hw.gpu.* of this process's GPUs where NVML is; read on the reader's thread, never here.
    device_metrics.observe_devices(meter_provider.get_meter(INSTRUMENTATION_NAME), identity)
    # Where this rank's time goes and how far it got (docs/health.md); read there too.
    observe_ledger(meter_provider.get_meter(INSTRUMENTATION_NAME))
    # NVTX ranges and span JSON lines come before the batches.
    mirrors, mirror_targets = span_mirrors(settings, outputs.open)
    checkpoint_metrics = CheckpointMetricsSpanProcessor(
        meter_provider.get_meter(INSTRUMENTATION_NAME)
    )
    processors: list[SpanProcessor] = [*mirrors, checkpoint_metrics, *extra_processors]
    trace_targets: list[str] = []
    for name in settings.traces_exporters:
        exporter, target, local = traces.span_exporter(name, settings, outputs, warn)
        if exporter is not None:
            processors.append(traces.batch_processor(exporter, settings, local, target))
            trace_targets.append(target)

    log_processors: list[LogRecordProcessor] = list(extra_log_processors)
    log_targets: list[str] = []
    for name in settings.logs.exporters:
        log_exporter, target = logs.log_exporter(name, settings, outputs, warn)
        if log_exporter is not None:
            local = name in ("otlp_json_file", "console")
            log_processors.append(logs.log_batch_processor(log_exporter, settings, local, target))
            log_targets.append(target)

    tracer_provider = traces.tracer_provider(settings, resource)
    logger_provider: logs_api.LoggerProvider = logs_api.NoOpLoggerProvider()
    if log_processors:
        logger_provider = logs.logger_provider(settings, resource, meter_provider, log_processors)
        # Exceptions recorded on spans also as ERROR log records (docs/logs.md).
        processors.append(
            ExceptionLogSpanProcessor(logger_provider.get_logger(INSTRUMENTATION_NAME))
        )
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    # What a full batch queue drops, counted (docs/logs.md); read on the reader's thread.
    observe_drops(meter_provider.get_meter(INSTRUMENTATION_NAME), log_processors, processors)
    return Pipeline(
        meter_provider,
        tracer_provider,
        "; ".join([_describe(metric_targets, trace_targets + mirror_targets, log_targets), *notes]),
        output_dir=outputs.run_dir,
        nvtx=next((p for p in mirrors if isinstance(p, NvtxSpanProcessor)), None),
        open_spans=OpenSpans(),
        files=outputs.files,
        logger_provider=logger_provider,
        span_lines=next((p for p in mirrors if isinstance(p, JsonLogSpanProcessor)), None),
    )


_said_no_rank = LogOnce(_logger)


def _say_no_rank_exports(policy: config.ExportRanks, world_size: int) -> None:
    """The one warning, on every rank, of a policy under which no rank of the job exports."""
    _said_no_rank(
        (policy.setting, world_size),
        "otel-training: no rank of this job exports telemetry: %s selects no rank of the %d "
        "(ranks 0 to %d); telemetry is off on every rank. Name a rank below %d, or unset it "
        "to export from every rank.",
        policy.setting,
        world_size,
        world_size - 1,
        world_size,
    )


def _once_per_build() -> network.Warn:
    """A warning function that says each text once (the three signals share variables)."""
    return LogOnce(_logger).say


def _describe(
    metric_targets: list[str], trace_targets: list[str], log_targets: Sequence[str] = ()
) -> str:
    metrics_part = ", ".join(metric_targets) or "nowhere"
    traces_part = ", ".join(trace_targets) or "nowhere"
    logs_part = ", ".join(log_targets) or "nowhere"
    return f"telemetry: metrics to {metrics_part}; traces to {traces_part}; logs to {logs_part}"
