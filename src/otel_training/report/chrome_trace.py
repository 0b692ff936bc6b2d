"""The spans of all ranks of a run, or of every attempt of a job, as one Chrome trace-event file
(Perfetto, chrome://tracing).

The JSON Object Format of the Trace Event Format (``{"traceEvents": [...],
"displayTimeUnit": "ms"}``): one process per rank and attempt (``pid`` = attempt index * (highest
rank + 1) + rank + 1, named ``rank R``, or ``attempt A · rank R`` when the job had several
attempts, by ``process_name`` metadata and ordered attempt by attempt, rank by rank, by
``process_sort_index``), one thread per track of :mod:`otel_training.report.tracks` (``tid`` =
pid * 1000 + track, so thread ids are unique across processes), each span a complete event
(``ph: "X"``) with ``ts`` and ``dur`` in microseconds, span events (an ``exception``...) as
thread-scoped instant events (``ph: "i"``). All ranks and attempts share the Unix-epoch clock,
rebased to the first span of the job (``otherData`` keeps the epoch of ``ts = 0``), so attempts
follow each other on one time axis; ranks on different hosts are as aligned as their clocks
are, and a rank whose clock disagrees with the others' (measured by the reader) is labelled
with the offset, never shifted. A span that never ended lasts until the last time seen on its
rank and is marked ``truncated``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import orjson

from otel_training.report._nogc import no_gc
from otel_training.report.otlp import safe_strings
from otel_training.report.run import TRUNCATED_ATTRIBUTE, Job, Run, Span
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


def build_chrome_trace(source: Run | Job) -> dict[str, Any]:
    """The trace-event document of a run, or of every attempt of a job (see the module
    docstring).

    Returns:
        A JSON-ready dict: ``traceEvents`` (metadata first, then per attempt and rank its
        slices in start order, parents before children), ``displayTimeUnit`` and
        ``otherData`` (run id of the last attempt, job id, the attempts, service, directory,
        ``ts0_unix_ns``, the notes on the runs' clocks). Never raises.
    """
    job = Job.of(source)
    runs = job.runs
    several = len(runs) > 1
    labels = job.labels
    stride = 1 + max(
        (r for run in runs for r in (*run.ranks, *(s.rank for s in run.spans))), default=0
    )
    starts = [s.start_ns for run in runs for s in run.spans]
    firsts = [run.first_ns for run in runs if run.first_ns is not None]
    t0 = min(starts) if starts else (min(firsts) if firsts else 0)
    events: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    attempts = []
    for index, run in enumerate(runs):
        base = index * stride
        prefix = f"{labels[index]} · " if several else ""
        attempts.append(
            {
                "label": labels[index],
                "run_id": run.run_id,
                "attempt": run.attempt,
                "directory": str(run.directory),
                "first_pid": base + 1,
                "clock_offsets_ms": {str(k): v for k, v in run.clock_offsets_ms.items()},
            }
        )
        _run_events(run, base, prefix, t0, events, slices)
    events.extend(slices)
    latest = job.latest
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_id": latest.run_id,
            "job_id": job.job_id,
            "attempts": attempts,
            "service.name": latest.service_name,
            "directory": str(latest.directory),
            "ts0_unix_ns": t0,
            "ranks": sorted({r for run in runs for r in run.ranks}),
            "spans": sum(len(run.spans) for run in runs),
            "notes": [*job.notes, *(o.note for run in runs for o in run.clock_offsets)],
        },
    }


def _run_events(
    run: Run,
    base: int,
    prefix: str,
    t0: int,
    events: list[dict[str, Any]],
    slices: list[dict[str, Any]],
) -> None:
    """Appends the metadata (to ``events``) and slices (to ``slices``) of one run's ranks,
    process ids from ``base + 1``, process names prefixed with ``prefix``."""
    spans_by_rank: dict[int, list[Span]] = {}
    for span in run.spans:
        spans_by_rank.setdefault(span.rank, []).append(span)
    ranks = sorted(set(run.ranks) | set(spans_by_rank))
    for rank in ranks:
        pid = base + _pid(rank)
        resource = run.ranks[rank].resource if rank in run.ranks else {}
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "args": {"name": f"{prefix}rank {rank}"},
            }
        )
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid - 1}}
        )
        labels = [str(resource["host.name"])] if resource.get("host.name") else []
        offset = run.clock_offsets_ms.get(rank)
        if offset is not None:
            labels.append(f"clock {offset:+.0f} ms vs the other ranks (not shifted)")
        if labels:
            events.append(
                {
                    "ph": "M",
                    "name": "process_labels",
                    "pid": pid,
                    "args": {"labels": ", ".join(labels)},
                }
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
            args: dict[str, Any] = dict(span.attributes)  # the span's own fields win
            args.update(
                span_id=span.span_id,
                trace_id=span.trace_id,
                parent_span_id=span.parent_span_id,
                status=span.status,
            )
            if span.status_description:
                args["status_description"] = span.status_description
            if span.open:
                args["open"] = True
                args[TRUNCATED_ATTRIBUTE] = True
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


def write_chrome_trace(source: Run | Job, path: str | os.PathLike) -> Path:
    """Writes :func:`build_chrome_trace` of ``source`` (a run, or a job's attempts) to
    ``path`` as strict JSON.

    Returns:
        The absolute path written.

    Raises:
        OSError: when the file cannot be written.
    """
    path = Path(path).absolute()
    with no_gc():
        document = build_chrome_trace(source)
        try:
            data = orjson.dumps(document)  # several times faster than json
        except TypeError:  # a lone surrogate (a directory name's undecodable byte)
            data = orjson.dumps(safe_strings(document))
        path.write_bytes(data)
    return path
