"""The logs factories of a pipeline: one exporter per ``OTEL_LOGS_EXPORTER`` entry (OTLP, the
embedded default's OTLP JSON file, the console) wrapped in the guard of
:mod:`otel_training.export.exporters`, its batch processor, and the ``LoggerProvider`` with the
limits of ``OTEL_LOGRECORD_*``.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import metrics as metrics_api
from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits, LogRecordProcessor
from opentelemetry.sdk._logs.export import (
    ConsoleLogRecordExporter,
    LogRecordExporter,
)
from opentelemetry.sdk.resources import Resource

from otel_training import config
from otel_training.export import files
from otel_training.export.exporters import SafeLogRecordExporter
from otel_training.pipeline import network
from otel_training.pipeline.otlp import otlp_exporter
from otel_training.pipeline.outputs import Outputs, counted
from otel_training.trace.processors.batch import CountingBatchLogRecordProcessor

__all__ = ["log_batch_processor", "log_exporter", "logger_provider"]


def log_exporter(
    name: str, settings: config.Settings, outputs: Outputs, warn: network.Warn
) -> tuple[LogRecordExporter | None, str]:
    """(exporter of ``OTEL_LOGS_EXPORTER`` entry ``name`` wrapped in SafeLogRecordExporter, or
    None; target)."""
    otlp = settings.logs.otlp
    limits = settings.log_limits
    if name == "none":
        return None, "nowhere"
    if name == "otlp":
        if otlp.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        else:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        exporter, target = otlp_exporter(OTLPLogExporter, otlp, "logs", settings, warn)
        safe = SafeLogRecordExporter(exporter, limits=limits, timeout_s=otlp.timeout_s)
        return safe, target
    if name == "console":
        return SafeLogRecordExporter(ConsoleLogRecordExporter(), limits=limits), "the console"
    from opentelemetry.exporter.otlp.json.file._log_exporter import FileLogExporter

    stream, path = outputs.open("logs")
    if stream is None:
        return None, "nowhere"
    safe = SafeLogRecordExporter(
        counted(FileLogExporter(stream=stream), stream),
        limits=limits,
        max_request_bytes=files.LINE_BUDGET_BYTES,  # one line per request: under 1 MiB
    )
    return safe, f"OTLP-JSON file {path}"


def log_batch_processor(
    exporter: LogRecordExporter, settings: config.Settings, local: bool, target: str
) -> CountingBatchLogRecordProcessor:
    """A ``BatchLogRecordProcessor`` with ``OTEL_BLRP_*`` where given, else the SDK's
    defaults over OTLP and, for a local file, a queue that takes bursts; the records its
    full queue drops are counted and reported (processors/batch.py)."""
    logs = settings.logs
    queue = logs.max_queue_size or (
        config.DEFAULT_FILE_BLRP_MAX_QUEUE_SIZE if local else config.DEFAULT_BLRP_MAX_QUEUE_SIZE
    )
    batch = logs.max_export_batch_size or (
        config.DEFAULT_FILE_BLRP_MAX_EXPORT_BATCH_SIZE
        if local
        else config.DEFAULT_BLRP_MAX_EXPORT_BATCH_SIZE
    )
    return CountingBatchLogRecordProcessor(
        exporter,
        where=target,
        schedule_delay_millis=logs.schedule_delay_ms,
        max_export_batch_size=min(batch, queue),
        export_timeout_millis=logs.export_timeout_ms,
        max_queue_size=queue,
    )


def logger_provider(
    settings: config.Settings,
    resource: Resource,
    meter_provider: metrics_api.MeterProvider,
    processors: Sequence[LogRecordProcessor],
) -> LoggerProvider:
    """The pipeline's ``LoggerProvider``: the same resource as the other signals, the
    attribute count of ``OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT``, no value-length cut of its
    own (values are cut at export, where the cut can say so: otel_training.export.limits), every
    limit given explicitly so that the SDK does not read the environment (it raises on a bad
    value there)."""
    count = settings.logs.attribute_count
    provider = LoggerProvider(
        resource=resource,
        shutdown_on_exit=False,
        meter_provider=meter_provider,
        log_record_limits=LogRecordLimits(
            max_attributes=count,
            max_attribute_length=LogRecordLimits.UNSET,
            max_log_record_attributes=count,
            max_log_record_attribute_length=LogRecordLimits.UNSET,
        ),
    )
    for processor in processors:
        provider.add_log_record_processor(processor)
    return provider
