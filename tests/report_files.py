"""Writers of run files for the report tests: real ones (the SDK's OTLP-JSON file exporter, the
real span pipeline) and hand-written lines for the odd cases (torn lines, other runs), each
hand-written OTLP document checked against opentelemetry-proto so that it is the real format."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.json.file import FileMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from otel_training import testing
from otel_training.metrics.instruments import record_training_metrics
from otel_training.metrics.views import default_views

RUN_ID = "0123456789abcdef0123456789abcdef"


def resource_attributes(rank: int, world_size: int = 2, run_id: str = RUN_ID) -> dict[str, Any]:
    """The rank identity of the embedded default's resource."""
    return {
        "service.name": "report-test",
        "service.instance.id": f"{run_id}-rank{rank}",
        "host.name": f"node-{rank}",
        "dl.rank": rank,
        "dl.local_rank": rank,
        "dl.world_size": world_size,
        "dl.node_rank": 0,
        "dl.run.id": run_id,
    }


def write_real_metrics(
    path: Path,
    batches: Sequence[Mapping[str, Any]],
    *,
    temporality: str = "cumulative",
    rank: int = 0,
    world_size: int = 1,
    run_id: str = RUN_ID,
) -> None:
    """Records each batch with the real ``record_training_metrics`` (a batch: its keyword
    arguments, ``step_duration_ms`` may be a list of steps) and exports it with the SDK's
    OTLP-JSON file exporter, one line per batch, as the embedded default does."""
    kind = (
        AggregationTemporality.DELTA
        if temporality == "delta"
        else AggregationTemporality.CUMULATIVE
    )
    exporter = FileMetricExporter(path, preferred_temporality={Counter: kind, Histogram: kind})
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10**9)
    provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource.create(resource_attributes(rank, world_size, run_id)),
        views=default_views(),
    )
    meter = provider.get_meter("otel_training")
    try:
        for batch in batches:
            batch = dict(batch)
            steps = batch.pop("step_duration_ms", None)
            for duration in steps if isinstance(steps, list) else [steps]:
                record_training_metrics(meter, step_duration_ms=duration)
            record_training_metrics(meter, **batch)
            provider.force_flush()
    finally:
        provider.shutdown()


def write_ledger_metrics(
    path: Path,
    *,
    steps: int,
    log_every: int,
    export_at: Iterable[int],
    values: Callable[[int], Mapping[str, Any]],
    rank: int = 0,
    world_size: int = 1,
    run_id: str = RUN_ID,
) -> None:
    """A rank's metrics file as the embedded default writes it, with the real health ledger
    and its instruments: every step completes an iteration in the ledger and records its step
    duration; every ``log_every`` steps ``values(step)`` are recorded with the real
    ``record_training_metrics``; an export (one line) after each step of ``export_at`` and at
    the end. Uses (and resets) this process's ledger."""
    from otel_training.health.ledger import ITERATION, LEDGER
    from otel_training.health.metrics import observe_ledger

    exporter = FileMetricExporter(path)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10**9)
    provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource.create(resource_attributes(rank, world_size, run_id)),
        views=default_views(),
    )
    meter = provider.get_meter("otel_training")
    LEDGER.reset()
    observe_ledger(meter)
    exports = set(export_at)
    try:
        for step in range(1, steps + 1):
            LEDGER.exit(LEDGER.enter(ITERATION), ITERATION, iteration=step)
            record_training_metrics(meter, step_duration_ms=10.0 + step % 3)
            if step % log_every == 0:
                record_training_metrics(meter, **values(step))
            if step in exports:
                provider.force_flush()
    finally:
        provider.shutdown()
        LEDGER.reset()


def key_value(key: str, value: Any) -> dict[str, Any]:
    """One OTLP/JSON ``KeyValue`` (bool, int as a decimal string, float, else a string)."""
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def metrics_line(
    rank: int, metrics: list[dict], *, run_id: str = RUN_ID, world_size: int = 2
) -> str:
    """One ExportMetricsServiceRequest in OTLP/JSON (checked against opentelemetry-proto)."""
    document = {
        "resourceMetrics": [
            {
                "resource": {
                    "attributes": [
                        key_value(k, v)
                        for k, v in resource_attributes(rank, world_size, run_id).items()
                    ]
                },
                "scopeMetrics": [{"scope": {"name": "otel_training"}, "metrics": metrics}],
            }
        ]
    }
    text = json.dumps(document)
    testing.parse_otlp_json(text, ExportMetricsServiceRequest())
    return text


def gauge(name: str, points: Iterable[tuple[int, float, dict]]) -> dict:
    """A gauge metric with points ``(time_ns, value, attributes)``."""
    return {
        "name": name,
        "gauge": {
            "dataPoints": [
                {
                    "timeUnixNano": str(t),
                    "asDouble": v,
                    "attributes": [key_value(k, a) for k, a in attrs.items()],
                }
                for t, v, attrs in points
            ]
        },
    }


def counter(name: str, points: Iterable[tuple[int, int, int, dict]], temporality: str) -> dict:
    """A monotonic sum with points ``(start_ns, time_ns, value, attributes)``."""
    return {
        "name": name,
        "sum": {
            "aggregationTemporality": 1 if temporality == "delta" else 2,
            "isMonotonic": True,
            "dataPoints": [
                {
                    "startTimeUnixNano": str(s),
                    "timeUnixNano": str(t),
                    "asInt": str(v),
                    "attributes": [key_value(k, a) for k, a in attrs.items()],
                }
                for s, t, v, attrs in points
            ],
        },
    }


def histogram(
    name: str,
    points: Iterable[tuple[int, int, list[int], float]],
    bounds: Sequence[float],
    temporality: str,
) -> dict:
    """An explicit-bucket histogram with points ``(start_ns, time_ns, bucket_counts, sum)``."""
    return {
        "name": name,
        "unit": "ms",
        "histogram": {
            "aggregationTemporality": 1 if temporality == "delta" else 2,
            "dataPoints": [
                {
                    "startTimeUnixNano": str(s),
                    "timeUnixNano": str(t),
                    "count": str(sum(buckets)),
                    "sum": total,
                    "bucketCounts": [str(c) for c in buckets],
                    "explicitBounds": list(bounds),
                }
                for s, t, buckets, total in points
            ],
        },
    }


def span_record(
    record: str,
    name: str,
    span_id: str,
    parent: str | None,
    start_ns: int,
    end_ns: int | None = None,
    *,
    rank: int = 0,
    status: str = "UNSET",
    attributes: dict | None = None,
    run_id: str = RUN_ID,
    world_size: int = 2,
    trace_id: str = "ab" * 16,
) -> str:
    """One line of ``spans-rank{R}.jsonl`` (docs/spans.md)."""
    line: dict[str, Any] = {
        "record": record,
        "name": name,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "start_time_ns": start_ns,
        "attributes": attributes or {},
        "rank": rank,
        "resource": resource_attributes(rank, world_size, run_id),
    }
    if record == "span_end":
        line.update(
            end_time_ns=end_ns,
            duration_ms=(end_ns - start_ns) / 1e6,
            status=status,
            status_description="RuntimeError: boom" if status == "ERROR" else None,
            events=[],
        )
    return json.dumps(line)


def span_lines(
    name: str, span_id: str, parent: str | None, start_ns: int, end_ns: int, **kw
) -> list[str]:
    """The start and end lines of one span."""
    return [
        span_record("span_start", name, span_id, parent, start_ns, **kw),
        span_record("span_end", name, span_id, parent, start_ns, end_ns, **kw),
    ]


def traces_line(rank: int, spans: list[dict], *, run_id: str = RUN_ID, world_size: int = 2) -> str:
    """One ExportTraceServiceRequest in OTLP/JSON with ``spans`` given as
    ``{"name", "span_id", "parent", "start_ns", "end_ns", "attributes", "status"}``."""
    items = []
    for s in spans:
        item = {
            "traceId": "ab" * 16,
            "spanId": s["span_id"],
            "name": s["name"],
            "kind": 1,
            "startTimeUnixNano": str(s["start_ns"]),
            "endTimeUnixNano": str(s["end_ns"]),
            "attributes": [key_value(k, v) for k, v in (s.get("attributes") or {}).items()],
            "status": {"code": 2, "message": "boom"} if s.get("status") == "ERROR" else {},
        }
        if s.get("parent"):
            item["parentSpanId"] = s["parent"]
        items.append(item)
    document = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        key_value(k, v)
                        for k, v in resource_attributes(rank, world_size, run_id).items()
                    ]
                },
                "scopeSpans": [{"scope": {"name": "otel_training"}, "spans": items}],
            }
        ]
    }
    text = json.dumps(document)
    testing.parse_otlp_json(text, ExportTraceServiceRequest())
    return text


def write_lines(path: Path, lines: Iterable[str], *, torn_tail: str | None = None) -> None:
    """Writes one line each, then optionally a cut-off last line without its newline."""
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line + "\n")
        if torn_tail is not None:
            handle.write(torn_tail)
