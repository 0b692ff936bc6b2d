"""The traces factories of a pipeline: one exporter per ``OTEL_TRACES_EXPORTER`` entry (OTLP,
the embedded default's OTLP JSON file, the console) wrapped in the guard of
:mod:`otel_training.export.exporters`, its batch processor, and the ``TracerProvider`` with the
sampler of ``OTEL_TRACES_SAMPLER``.

The span processors that mirror spans elsewhere (NVTX ranges, span JSON lines) are
:mod:`otel_training.trace.processors`'.
"""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace import sampling as sampling_sdk
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from otel_training import config
from otel_training.export import files
from otel_training.export.exporters import SafeSpanExporter
from otel_training.pipeline import network
from otel_training.pipeline.ids import ProcessLocalIdGenerator
from otel_training.pipeline.otlp import otlp_exporter
from otel_training.pipeline.outputs import Outputs, counted
from otel_training.trace.processors.batch import CountingBatchSpanProcessor

__all__ = ["batch_processor", "span_exporter", "tracer_provider"]


def tracer_provider(settings: config.Settings, resource: Resource) -> TracerProvider:
    """The pipeline's ``TracerProvider``: ``resource``, the sampler of ``settings``, ids of
    :class:`otel_training.pipeline.ids.ProcessLocalIdGenerator`, no value-length cut of its own, no
    span processor yet."""
    return TracerProvider(
        resource=resource,
        sampler=_sampler(settings),
        id_generator=ProcessLocalIdGenerator(),
        # Values are cut at export, where the cut can say so (otel_training.export.limits); the
        # other limits are the SDK's, from the environment.
        span_limits=SpanLimits(
            max_attribute_length=SpanLimits.UNSET, max_span_attribute_length=SpanLimits.UNSET
        ),
        shutdown_on_exit=False,
    )


def span_exporter(
    name: str, settings: config.Settings, outputs: Outputs, warn: network.Warn
) -> tuple[SpanExporter | None, str, bool]:
    """(exporter wrapped in SafeSpanExporter or None, target, whether it is a local file)."""
    otlp = settings.traces_otlp
    if name == "none":
        return None, "nowhere", False
    if name == "otlp":
        if otlp.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter, target = otlp_exporter(OTLPSpanExporter, otlp, "traces", settings, warn)
        safe = SafeSpanExporter(exporter, limits=settings.span_limits, timeout_s=otlp.timeout_s)
        return safe, target, False
    if name == "console":
        console = SafeSpanExporter(ConsoleSpanExporter(), limits=settings.span_limits)
        return console, "the console", True
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter

    stream, path = outputs.open("traces")
    if stream is None:
        return None, "nowhere", True
    safe = SafeSpanExporter(
        counted(FileSpanExporter(stream=stream), stream),
        limits=settings.span_limits,
        max_request_bytes=files.LINE_BUDGET_BYTES,  # one line per request: under 1 MiB
    )
    return safe, f"OTLP-JSON file {path}", True


def batch_processor(
    exporter: SpanExporter, settings: config.Settings, local: bool, target: str
) -> CountingBatchSpanProcessor:
    """A ``BatchSpanProcessor`` with ``OTEL_BSP_*`` where given, else the SDK's defaults over
    OTLP and, for a local file, a queue that takes bursts and a delay of one second; the
    spans its full queue drops are counted and reported (processors/batch.py)."""
    queue = settings.bsp_max_queue_size or (
        config.DEFAULT_FILE_BSP_MAX_QUEUE_SIZE if local else config.DEFAULT_BSP_MAX_QUEUE_SIZE
    )
    batch = settings.bsp_max_export_batch_size or (
        config.DEFAULT_FILE_BSP_MAX_EXPORT_BATCH_SIZE
        if local
        else config.DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE
    )
    delay = settings.bsp_schedule_delay_ms or (
        config.DEFAULT_FILE_BSP_SCHEDULE_DELAY_MS if local else config.DEFAULT_BSP_SCHEDULE_DELAY_MS
    )
    return CountingBatchSpanProcessor(
        exporter,
        where=target,
        max_queue_size=queue,
        schedule_delay_millis=delay,
        max_export_batch_size=min(batch, queue),
        export_timeout_millis=settings.bsp_export_timeout_ms,
    )


def _sampler(settings: config.Settings) -> sampling_sdk.Sampler:
    ratio = sampling_sdk.TraceIdRatioBased(settings.sampler_arg)
    return {
        "always_on": sampling_sdk.ALWAYS_ON,
        "always_off": sampling_sdk.ALWAYS_OFF,
        "traceidratio": ratio,
        "parentbased_always_on": sampling_sdk.ParentBased(sampling_sdk.ALWAYS_ON),
        "parentbased_always_off": sampling_sdk.ParentBased(sampling_sdk.ALWAYS_OFF),
        "parentbased_traceidratio": sampling_sdk.ParentBased(ratio),
    }[settings.sampler]
