"""The spans of all ranks of a run as one Chrome trace-event file (Perfetto, chrome://tracing).

The JSON Object Format of the Trace Event Format (``{"traceEvents": [...],
"displayTimeUnit": "ms"}``): one process per rank (``pid`` = rank + 1, named ``rank R`` by
``process_name`` metadata and ordered by ``process_sort_index``), one thread per track of
:mod:`otel_training.report.tracks` (``tid`` = pid * 1000 + track, so thread ids are unique
across processes), each span a complete event (``ph: "X"``) with ``ts`` and ``dur`` in
microseconds, span events (an ``exception``...) as thread-scoped instant events (``ph: "i"``).
All ranks share the Unix-epoch clock, rebased to the first span of the run (``otherData``
keeps the epoch of ``ts = 0``); ranks on different hosts are as aligned as their clocks are.
A span that never ended lasts until the last time seen on its rank and is marked
``truncated``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import orjson

from otel_training.report._nogc import no_gc
from otel_training.report.run import TRUNCATED_ATTRIBUTE, Run, Span
from otel_training.report.tracks import place_spans
from otel_training.semconv.spans import SPANS

__all__ = ["build_chrome_trace", "span_category", "write_chrome_trace"]

THREADS_PER_RANK = 1000
"""``tid`` = pid * THREADS_PER_RANK + track."""


def span_category(span: Span) -> str:
    """The span group of the registry (``iteration``, ``checkpoint``...), ``custom`` for a name
    outside it."""
    spec = SPANS.get(span.name)
    return spec.group if spec is not None else "custom"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return value


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _pid(rank: int) -> int:
    return rank + 1


def build_chrome_trace(run: Run) -> dict[str, Any]:
    """The trace-event document of ``run`` (see the module docstring).

    Returns:
        A JSON-ready dict: ``traceEvents`` (metadata first, then per rank its slices in start
        order, parents before children), ``displayTimeUnit`` and ``otherData`` (run id,
        service, directory, ``ts0_unix_ns``). Never raises.
    """
    spans_by_rank: dict[int, list[Span]] = {}
    for span in run.spans:
        spans_by_rank.setdefault(span.rank, []).append(span)
    ranks = sorted(set(run.ranks) | set(spans_by_rank))
    t0 = min((s.start_ns for s in run.spans), default=run.first_ns or 0)
    events: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    for rank in ranks:
        pid = _pid(rank)
        resource = run.ranks[rank].resource if rank in run.ranks else {}
        events.append(
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {rank}"}}
        )
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": rank}}
        )
        host = resource.get("host.name")
        if host:
            events.append(
                {"ph": "M", "name": "process_labels", "pid": pid, "args": {"labels": str(host)}}
            )
        placements = place_spans(run, spans_by_rank.get(rank, ()))
        tracks = sorted({p.track for p in placements}) or [0]
        for track in tracks:
            tid = pid * THREADS_PER_RANK + track
            name = "spans" if track == 0 else f"spans (concurrent {track})"
            events.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": track},
                }
            )
        for placement in placements:
            span = placement.span
            tid = pid * THREADS_PER_RANK + placement.track
            categories = [span_category(span)]
            if span.failed:
                categories.append("error")
            if span.truncated:
                categories.append("truncated")
            args: dict[str, Any] = {
                "span_id": span.span_id,
                "trace_id": span.trace_id,
                "parent_span_id": span.parent_span_id,
                "status": span.status,
            }
            if span.status_description:
                args["status_description"] = span.status_description
            if span.open:
                args["open"] = True
                args[TRUNCATED_ATTRIBUTE] = True
            args.update(span.attributes)
            args["source"] = span.source
            slices.append(
                {
                    "ph": "X",
                    "name": span.name,
                    "cat": ",".join(categories),
                    "pid": pid,
                    "tid": tid,
                    "ts": _us(placement.start_ns - t0),
                    "dur": _us(placement.end_ns - placement.start_ns),
                    "args": _json_safe(args),
                }
            )
            for event in span.events:
                time_ns = event.get("time_ns")
                if not isinstance(time_ns, int):
                    continue
                slices.append(
                    {
                        "ph": "i",
                        "s": "t",
                        "name": str(event.get("name", "")),
                        "cat": categories[0],
                        "pid": pid,
                        "tid": tid,
                        "ts": _us(time_ns - t0),
                        "args": _json_safe(
                            {"span_id": span.span_id, **(event.get("attributes") or {})}
                        ),
                    }
                )
    events.extend(slices)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_id": run.run_id,
            "service.name": run.service_name,
            "directory": str(run.directory),
            "ts0_unix_ns": t0,
            "ranks": ranks,
            "spans": len(run.spans),
        },
    }


def write_chrome_trace(run: Run, path: str | os.PathLike) -> Path:
    """Writes :func:`build_chrome_trace` of ``run`` to ``path`` as strict JSON.

    Returns:
        The absolute path written.

    Raises:
        OSError: when the file cannot be written.
    """
    path = Path(path).absolute()
    with no_gc():
        document = build_chrome_trace(run)
        path.write_bytes(orjson.dumps(document))  # several times faster than json
    return path
