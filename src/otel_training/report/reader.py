"""Reads a run directory of the embedded default into a :class:`~otel_training.report.run.Run`.

Metrics and traces files hold one OTLP/JSON document per line (an
``ExportMetricsServiceRequest`` or ``ExportTraceServiceRequest``, as the collector's
``otlpjsonfile`` receiver reads them: ids in hex, 64-bit integers as strings); span files hold
the start and end lines of ``docs/spans.md``. The reader is tolerant: a missing file, a torn
last line (a killed run, a full disk, a run still writing), a line of the wrong shape, a run
still in progress, lines of older runs appended to the same files (the flat layout) each give a
note on the run, never an exception. The documents are decoded with :mod:`json` directly (the
OTLP/JSON mapping of ``opentelemetry-proto``), which is several times faster than parsing them
into protobuf messages.
"""

from __future__ import annotations

import json
import math
import operator
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from otel_training.limits import safe_text
from otel_training.report import attempts, clocks
from otel_training.report._nogc import no_gc
from otel_training.report.run import (
    Attributes,
    CounterSeries,
    FileStats,
    Gap,
    GaugeSeries,
    HistogramSeries,
    Job,
    RankTelemetry,
    Run,
    Span,
)
from otel_training.report.rundir import GAPS, RunFile, job_directories, run_files
from otel_training.report.wording import plural as _plural
from otel_training.report.wording import rank_list as _rank_list
from otel_training.report.wording import ranks_phrase
from otel_training.semconv.attributes import DL_RANK, DL_RUN_ID, DL_WORLD_SIZE

__all__ = ["load_job", "load_run", "load_runs", "order_runs", "safe_strings"]

IN_PROGRESS_S = 60.0
"""Files modified less than this many seconds ago, with spans still open, mean a run that is
probably still in progress."""

_STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}
_STATUS_NAMES = {"STATUS_CODE_UNSET": "UNSET", "STATUS_CODE_OK": "OK", "STATUS_CODE_ERROR": "ERROR"}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: Records of the span JSON lines that are not spans: a rank's thread stacks (docs/health.md).
_OTHER_RECORDS = frozenset({"stacks"})


class _Torn(Exception):
    """A line that is not a whole JSON document."""


def _loads(raw: bytes) -> Any:
    """One JSON document; raises :class:`_Torn` when ``raw`` is not one. orjson parses these
    lines about twice as fast as json; json reads what it refuses (bare NaN and Infinity, and
    lone surrogates such as ``"\\ud800"``, which no UTF-8 text can hold: each becomes a
    backslash escape, as the string rule of :func:`otel_training.limits.safe_text` writes
    it, so that the report and the trace can always be written)."""
    try:
        return orjson.loads(raw)
    except ValueError:
        pass
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise _Torn from error
    if b"\\ud" in raw or b"\\uD" in raw:
        document = safe_strings(document)
    return document


def safe_strings(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string, keys too,
    through :func:`otel_training.limits.safe_text` without a length limit: lone surrogates
    as backslash escapes, the rest as it is. Never raises."""
    if isinstance(value, str):
        return safe_text(value, None)
    if isinstance(value, list):
        return [safe_strings(v) for v in value]
    if isinstance(value, dict):
        return {safe_text(k, None): safe_strings(v) for k, v in value.items()}
    return value


def _any_value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON ``AnyValue`` as a Python value."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return _double(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_any_value(v) for v in value["arrayValue"].get("values", ())]
    if "kvlistValue" in value:
        return _attributes(value["kvlistValue"].get("values", ()))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv["key"]: _any_value(kv.get("value", {})) for kv in pairs or ()}


def _point_attributes(pairs: Any) -> Attributes:
    if not pairs:
        return ()
    return tuple(sorted((kv["key"], _hashable(_any_value(kv.get("value", {})))) for kv in pairs))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _double(value: Any) -> float:
    if isinstance(value, str):
        return _NON_FINITE[value] if value in _NON_FINITE else float(value)
    return float(value)


def _number(point: dict[str, Any]) -> float | None:
    if "asDouble" in point:
        return _double(point["asDouble"])
    if "asInt" in point:
        return float(int(point["asInt"]))
    return None


def _temporality(value: Any) -> str:
    return "delta" if value in (1, "AGGREGATION_TEMPORALITY_DELTA") else "cumulative"


def _status(status: Any) -> tuple[str, str | None]:
    if not isinstance(status, dict):
        return "UNSET", None
    code = status.get("code", 0)
    name = _STATUS_CODES.get(code) if isinstance(code, int) else _STATUS_NAMES.get(code)
    return name or "UNSET", status.get("message") or None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _hex_id(value: Any) -> str | None:
    return value.lower() if isinstance(value, str) and value else None


_Key = tuple[str | None, str | None]
"""(run id, ``service.instance.id``): the records of one process of one run."""


def _part_key(resource: Mapping[str, Any]) -> _Key:
    run = resource.get(DL_RUN_ID)
    if run is None:
        run = resource.get(attempts.NEMO_LENS_RUN_UUID) or resource.get(attempts.NEMO_RUN_ID)
    instance = resource.get("service.instance.id")
    return (
        None if run is None else str(run),
        None if instance is None else str(instance),
    )


class _Part:
    """What one file holds for one process of one run."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankTelemetry] = {}
        self.spans: dict[tuple[str, str], Span] = {}
        self.gaps: list[Gap] = []

    def rank(self, rank: int) -> RankTelemetry:
        telemetry = self.ranks.get(rank)
        if telemetry is None:
            telemetry = self.ranks[rank] = RankTelemetry(rank)
        return telemetry


class _FileReader:
    """Decodes one file into a :class:`_Part` per run id (a process of its own may run it)."""

    def __init__(self, file: RunFile) -> None:
        self.file = file
        self.parts: dict[_Key, _Part] = {}
        # Previous raw point of each cumulative counter/histogram: (start_ns, raw values).
        self.previous: dict[int, tuple[int, Any]] = {}
        self._time_text = ""
        self._time_ns = 0
        # Per (rank telemetry, gauge): the raw attributes and series of each point position.
        self._gauge_cache: dict[tuple[int, str], list[tuple[Any, GaugeSeries]]] = {}

    def part(self, resource: Mapping[str, Any]) -> _Part:
        key = _part_key(resource)
        part = self.parts.get(key)
        if part is None:
            part = self.parts[key] = _Part()
        return part

    def time_ns(self, text: Any) -> int:
        # The points of one export share one time: convert it once.
        if text != self._time_text:
            self._time_text, self._time_ns = text, int(text)
        return self._time_ns

    def read(self) -> FileStats:
        file = self.file
        stats = FileStats(file.path, file.signal, file.rank)
        decode = {
            "metrics": self.metrics_line,
            "traces": self.traces_line,
            "spans": self.spans_line,
            GAPS: self.gaps_line,
        }.get(file.signal)
        try:
            status = file.path.stat()
            stats.size_bytes, stats.mtime_s = status.st_size, status.st_mtime
            with open(file.path, "rb") as handle:
                for raw, last in _lines_with_last(handle):
                    if not raw.strip():
                        continue
                    stats.lines += 1
                    if decode is None:  # logs: counted, not read (yet)
                        continue
                    try:
                        decode(_loads(raw), file.rank)
                    except _Torn:
                        if last:
                            stats.torn_last_line = True
                        else:
                            stats.bad_lines += 1
                    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
                        stats.bad_lines += 1
        except OSError as error:
            stats.error = f"{type(error).__name__}: {error.strerror or error}"
        return stats

    # -- gaps -------------------------------------------------------------------------------

    def gaps_line(self, record: dict[str, Any], file_rank: int) -> None:
        if record["record"] != "gap":
            raise ValueError(f"unknown record {record['record']!r}")
        resource = record.get("resource") or {}
        rank_value = resource.get(DL_RANK)
        rank = rank_value if isinstance(rank_value, int) else file_rank
        part = self.part(resource)
        part.rank(rank)
        part.gaps.append(
            Gap(
                rank=rank,
                file=str(record["file"]),
                from_ns=_optional_int(record.get("from_unix_ns")),
                to_ns=_optional_int(record.get("to_unix_ns")),
                lost_lines=int(record.get("lost_lines") or 0),
                lost_records=int(record.get("lost_records") or 0),
                gone_lines=int(record.get("gone_lines") or 0),
                reason=str(record.get("reason") or ""),
            )
        )

    # -- metrics ----------------------------------------------------------------------------

    def metrics_line(self, document: dict[str, Any], file_rank: int) -> None:
        for resource_metrics in document["resourceMetrics"]:
            resource = _attributes(resource_metrics.get("resource", {}).get("attributes"))
            part = self.part(resource)
            rank_value = resource.get(DL_RANK)
            telemetry = part.rank(rank_value if isinstance(rank_value, int) else file_rank)
            telemetry.resource = resource
            for scope_metrics in resource_metrics.get("scopeMetrics", ()):
                for metric in scope_metrics.get("metrics", ()):
                    self.metric(telemetry, metric)

    def metric(self, telemetry: RankTelemetry, metric: dict) -> None:
        name = metric["name"]
        if "gauge" in metric:
            self.gauge_points(telemetry, name, metric["gauge"].get("dataPoints", ()))
        elif "sum" in metric:
            data = metric["sum"]
            points = data.get("dataPoints", ())
            if data.get("isMonotonic"):
                temporality = _temporality(data.get("aggregationTemporality"))
                self.counter_points(telemetry, name, temporality, points)
            else:  # an up-down counter reads like a gauge
                self.gauge_points(telemetry, name, points)
        elif "histogram" in metric:
            data = metric["histogram"]
            temporality = _temporality(data.get("aggregationTemporality"))
            for point in data.get("dataPoints", ()):
                self.histogram_point(telemetry, name, temporality, point)

    def gauge_points(self, telemetry: RankTelemetry, name: str, points: Any) -> None:
        # The hot loop of a long run (every layer's tensor gauges at every export). Exports
        # repeat the same attribute sets in the same order, so the raw attribute list of each
        # position is compared (in C) with the previous export's before any key is built.
        gauges = telemetry.gauges
        cache = self._gauge_cache.get((id(telemetry), name))
        if cache is None:
            cache = self._gauge_cache[(id(telemetry), name)] = []
        time_text, time_ns = None, 0
        low = high = None
        for i, point in enumerate(points):
            value = point.get("asDouble")
            if value is None or value.__class__ is str:
                value = _number(point)
                if value is None:
                    continue
            pairs = point.get("attributes")
            if i < len(cache) and cache[i][0] == pairs:
                series = cache[i][1]
            else:
                attributes = _point_attributes(pairs)
                series = gauges.get((name, attributes))
                if series is None:
                    series = gauges[(name, attributes)] = GaugeSeries(name, attributes)
                if i < len(cache):
                    cache[i] = (pairs, series)
                else:
                    cache.append((pairs, series))
            text = point["timeUnixNano"]
            if text != time_text:
                time_text, time_ns = text, int(text)
                if low is None or time_ns < low:
                    low = time_ns
                if high is None or time_ns > high:
                    high = time_ns
            series.times_ns.append(time_ns)
            series.values.append(value)
        if low is not None:
            telemetry.see(low)
            telemetry.see(high)

    def counter_points(
        self, telemetry: RankTelemetry, name: str, temporality: str, points: Any
    ) -> None:
        for point in points:
            value = _number(point)
            if value is None:
                continue
            attributes = _point_attributes(point.get("attributes"))
            series = telemetry.counters.get((name, attributes))
            if series is None:
                series = CounterSeries(name, attributes, temporality)
                telemetry.counters[(name, attributes)] = series
            time_ns = self.time_ns(point["timeUnixNano"])
            start_ns = int(point.get("startTimeUnixNano", 0))
            delta = value
            if temporality == "cumulative":
                previous = self.previous.get(id(series))
                if previous is not None and previous[0] == start_ns and value >= previous[1]:
                    delta = value - previous[1]
                self.previous[id(series)] = (start_ns, value)
            series.times_ns.append(time_ns)
            series.totals.append(series.total + delta)
            telemetry.see(time_ns)

    def histogram_point(
        self, telemetry: RankTelemetry, name: str, temporality: str, point: dict
    ) -> None:
        bounds = tuple(float(b) for b in point.get("explicitBounds", ()))
        buckets = [int(c) for c in point.get("bucketCounts", ())]
        if len(buckets) != len(bounds) + 1:
            if buckets or bounds:
                raise ValueError("bucketCounts must have len(explicitBounds) + 1 entries")
            buckets = [0]
        count = int(point.get("count", sum(buckets)))
        total = _double(point.get("sum", 0.0))
        attributes = _point_attributes(point.get("attributes"))
        key = (name, attributes, bounds)
        series = telemetry.histograms.get(key)
        if series is None:
            series = telemetry.histograms[key] = HistogramSeries(
                name, attributes, bounds, temporality, cumulative_buckets=[0] * len(buckets)
            )
        time_ns = self.time_ns(point["timeUnixNano"])
        start_ns = int(point.get("startTimeUnixNano", 0))
        delta_buckets, delta_count, delta_sum = buckets, count, total
        if temporality == "cumulative":
            previous = self.previous.get(id(series))
            if previous is not None and previous[0] == start_ns:
                _, (p_buckets, p_count, p_sum) = previous
                if count >= p_count and all(b >= p for b, p in zip(buckets, p_buckets)):
                    delta_buckets = [b - p for b, p in zip(buckets, p_buckets)]
                    delta_count, delta_sum = count - p_count, total - p_sum
            self.previous[id(series)] = (start_ns, (buckets, count, total))
        series.times_ns.append(time_ns)
        series.delta_counts.append(delta_count)
        series.delta_sums.append(delta_sum)
        series.delta_buckets.append(delta_buckets)
        previous_count = series.cumulative_counts[-1] if series.cumulative_counts else 0
        previous_sum = series.cumulative_sums[-1] if series.cumulative_sums else 0.0
        series.cumulative_counts.append(previous_count + delta_count)
        series.cumulative_sums.append(previous_sum + delta_sum)
        series.cumulative_buckets = [
            a + b for a, b in zip(series.cumulative_buckets, delta_buckets)
        ]
        if delta_count:
            low, high = point.get("min"), point.get("max")
            if low is not None:
                series.min = _double(low) if series.min is None else min(series.min, _double(low))
            if high is not None:
                series.max = _double(high) if series.max is None else max(series.max, _double(high))
        telemetry.see(time_ns)

    # -- spans ------------------------------------------------------------------------------

    def traces_line(self, document: dict[str, Any], file_rank: int) -> None:
        for resource_spans in document["resourceSpans"]:
            resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
            part = self.part(resource)
            rank_value = resource.get(DL_RANK)
            rank = rank_value if isinstance(rank_value, int) else file_rank
            telemetry = part.rank(rank)
            if not telemetry.resource:
                telemetry.resource = resource
            for scope_spans in resource_spans.get("scopeSpans", ()):
                for item in scope_spans.get("spans", ()):
                    span = _otlp_span(rank, item)
                    telemetry.see(span.start_ns)
                    if span.end_ns is not None:
                        telemetry.see(span.end_ns)
                    _merge_span(part.spans, span)

    def spans_line(self, record: dict[str, Any], file_rank: int) -> None:
        kind = record["record"]
        if kind not in ("span_start", "span_end"):
            if kind in _OTHER_RECORDS:  # read by otel_training.report.jobfiles
                return
            raise ValueError(f"unknown record {kind!r}")
        resource = record.get("resource") or {}
        part = self.part(resource)
        rank_value = record.get("rank")
        rank = rank_value if isinstance(rank_value, int) else file_rank
        telemetry = part.rank(rank)
        if not telemetry.resource and resource:
            telemetry.resource = dict(resource)
        trace_id, span_id = _hex_id(record["trace_id"]), _hex_id(record["span_id"])
        start_ns = int(record["start_time_ns"])
        telemetry.see(start_ns)
        key = (trace_id or "", span_id or "")
        span = part.spans.get(key)
        if span is None:
            span = part.spans[key] = Span(
                rank=rank,
                name=record["name"],
                trace_id=key[0],
                span_id=key[1],
                parent_span_id=_hex_id(record.get("parent_span_id")),
                start_ns=start_ns,
                attributes=dict(record.get("attributes") or {}),
            )
        if kind == "span_end":
            span.end_ns = int(record["end_time_ns"])
            span.status = str(record.get("status") or "UNSET")
            span.status_description = record.get("status_description")
            span.attributes = dict(record.get("attributes") or {})
            span.events = list(record.get("events") or ())
            telemetry.see(span.end_ns)


def _otlp_span(rank: int, item: dict) -> Span:
    start_ns = int(item["startTimeUnixNano"])
    status, description = _status(item.get("status"))
    return Span(
        rank=rank,
        name=item["name"],
        trace_id=_hex_id(item["traceId"]) or "",
        span_id=_hex_id(item["spanId"]) or "",
        parent_span_id=_hex_id(item.get("parentSpanId")),
        start_ns=start_ns,
        end_ns=int(item["endTimeUnixNano"]) if item.get("endTimeUnixNano") else None,
        status=status,
        status_description=description,
        attributes=_attributes(item.get("attributes")),
        events=[
            {
                "name": event.get("name", ""),
                "time_ns": int(event.get("timeUnixNano", start_ns)),
                "attributes": _attributes(event.get("attributes")),
            }
            for event in item.get("events", ())
        ],
        source="traces",
    )


def _merge_span(spans: dict[tuple[str, str], Span], span: Span) -> None:
    """Adds an OTLP-exported span to the spans known from the JSON lines."""
    key = (span.trace_id, span.span_id)
    known = spans.get(key)
    if known is None:
        spans[key] = span
    elif known.end_ns is None and span.end_ns is not None:
        # The JSON lines have its start only (their end line was lost): complete it.
        known.end_ns, known.status = span.end_ns, span.status
        known.status_description = span.status_description
        known.attributes = {**known.attributes, **span.attributes}
        known.events = span.events
        known.source = "spans+traces"
    elif known.source == "spans":
        known.source = "spans+traces"


def _read_file(file: RunFile) -> tuple[FileStats, dict[_Key, _Part]]:
    """Reads one file; the unit of work of a worker process."""
    reader = _FileReader(file)
    return reader.read(), reader.parts


def _lines_with_last(handle) -> Iterator[tuple[bytes, bool]]:
    """Each line of a binary file with whether it is the last one (one line of look-ahead)."""
    previous = None
    for line in handle:
        if previous is not None:
            yield previous, False
        previous = line
    if previous is not None:
        # A last line without its newline was cut while it was written.
        yield previous, True


PARALLEL_BYTES = 64 * 2**20
"""From this many bytes of files, :func:`load_run` reads files in worker processes."""


def _read_all(files: list[RunFile], workers: int) -> list[tuple[FileStats, dict]]:
    if workers <= 1 or len(files) <= 1:
        return [_read_file(file) for file in files]
    import concurrent.futures
    import multiprocessing
    import threading

    # fork is quick and safe while this process has no other thread; spawn otherwise.
    single = threading.active_count() == 1
    method = "fork" if single and "fork" in multiprocessing.get_all_start_methods() else "spawn"

    # Largest first, so that the longest file does not start last.
    order = sorted(range(len(files)), key=lambda i: -_size_of(files[i].path))
    results: list[Any] = [None] * len(files)
    try:
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=min(workers, len(files)),
            mp_context=multiprocessing.get_context(method),
        ) as pool:
            futures = {pool.submit(_read_file, files[i]): i for i in order}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
    except (OSError, RuntimeError, concurrent.futures.process.BrokenProcessPool):
        # No processes here (a sandbox, a broken pool): read them in this one.
        return [_read_file(file) for file in files]
    return results


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _needs_traces(rank: int, spans_stats: dict[int, FileStats], open_ranks: set[int]) -> bool:
    """The OTLP-JSON traces of ``rank`` are read when its span lines are absent or
    incomplete (unreadable, cut, or with spans that never ended)."""
    stats = spans_stats.get(rank)
    if stats is None or stats.error or stats.torn_last_line or stats.bad_lines or not stats.lines:
        return True
    return rank in open_ranks


def load_run(
    directory: str | os.PathLike, *, now_s: float | None = None, workers: int | None = None
) -> Run:
    """Reads every rank file of a run directory: the run seen last in it.

    Span JSON lines are preferred; a rank's OTLP-JSON traces file is read where its span lines
    are absent or incomplete, and completes them (an end that the lines lack) or stands in for
    them. Lines of several runs in the same files (older versions appended every run to one
    set of files; two processes given the same run id append to one directory) are told apart
    by the resource's ``dl.run.id`` and ``service.instance.id``: the run seen last is kept and
    the others are named in a note (:func:`load_job` shows each of them).

    Args:
        directory: A run directory (see :func:`otel_training.report.find_run_directory`).
        now_s: The time to judge "still in progress" against, seconds since the Unix epoch
            (default: now).
        workers: Processes that read files side by side; default: the CPU count when the
            files hold more than :data:`PARALLEL_BYTES`, else 1 (this process).

    Returns:
        The run, with a note for each thing that was missing or odd. Never raises: an unreadable
        file or directory is a note (``Run.is_empty`` tells when nothing at all was read).
    """
    runs = load_runs(directory, now_s=now_s, workers=workers)
    chosen = max(runs, key=_last_seen)
    others = [r for r in runs if r is not chosen]
    chosen.other_run_ids = sorted(
        {r.run_id for r in others if r.run_id is not None and r.run_id != chosen.run_id}
    )
    chosen.same_id_runs = sum(1 for r in others if r.run_id == chosen.run_id)
    chosen.notes = _notes(chosen, _now(now_s), shown_alone=True)
    return chosen


def load_job(
    run_directory: str | os.PathLike, *, now_s: float | None = None, workers: int | None = None
) -> Job:
    """Reads every attempt of the job that the run seen last in ``run_directory`` belongs to.

    The attempts are the runs with its ``dl.job.id`` (or Megatron-LM's name for it) in
    ``run_directory`` and in its sibling run directories
    (:func:`otel_training.report.rundir.job_directories`), and the runs of its run id when no
    job id was recorded. Each attempt stays a :class:`Run` of its own, labelled and ordered
    (:func:`order_runs`), never merged with another.

    Returns:
        The job. Never raises (an unreadable directory gives an empty run with a note).
    """
    base = Path(run_directory)
    directories = job_directories(base)
    now = _now(now_s)
    found = {d: load_runs(d, now_s=now, workers=workers) for d in directories}
    chosen = max(found[directories[0]], key=_last_seen)
    key = _job_key(chosen)
    runs = [r for d in directories for r in found[d] if _job_key(r) == key]
    others = sorted(
        {r.run_id for r in found[directories[0]] if _job_key(r) != key and r.run_id is not None}
    )
    runs = order_runs(runs)
    job = Job(job_id=chosen.job_id, runs=runs, directories=directories)
    if all(r.attempt_order is not None for r in runs):
        job.ordered_by = "attempt"
    elif all(r.created_s is not None for r in runs):
        job.ordered_by = "process.creation.time"
    else:
        job.ordered_by = "first record"
    if len(runs) > 1:
        how = {
            "attempt": "by attempt number",
            "process.creation.time": "by when their processes started "
            "(process.creation.time; no attempt counter was recorded)",
            "first record": "by their first record (no attempt counter or process start time "
            "was recorded)",
        }[job.ordered_by]
        job.notes.append(
            f"Job {job.job_id or chosen.run_id}: {len(runs)} attempts, ordered {how}, each "
            f"shown on its own: {', '.join(job.labels)}."
        )
        numbers = [r.attempt_order for r in runs if r.attempt_order is not None]
        if len(numbers) != len(set(numbers)):
            job.notes.append(
                "Several runs of this job recorded the same attempt number (a rerun under the "
                "same counters, or torchrun agents on different nodes that counted restarts "
                "differently); they are ordered by when their processes started."
            )
    if others:
        job.notes.append(
            f"{directories[0]} also holds {_plural(len(others), 'run')} of another job "
            f"({', '.join(others[:5])}{'...' if len(others) > 5 else ''}), not shown."
        )
    return job


def _job_key(run: Run) -> tuple[str, str | None]:
    return ("job", run.job_id) if run.job_id is not None else ("run", run.run_id)


def load_runs(
    directory: str | os.PathLike, *, now_s: float | None = None, workers: int | None = None
) -> list[Run]:
    """Every run (attempt, or process group given one run id) whose records are in the rank
    files of ``directory``, each a :class:`Run` with its identity (``job_id``, ``attempt``,
    ``created_s``) and notes, ordered as :func:`order_runs` orders them. At least one
    (empty when nothing was read). Never raises."""
    directory = Path(directory)
    files = run_files(directory)
    if workers is None:
        total = sum(_size_of(f.path) for f in files)
        workers = (os.cpu_count() or 1) if total > PARALLEL_BYTES else 1
    with no_gc():
        runs = _load(directory, files, workers)
    now = _now(now_s)
    for run in runs:
        run.clock_offsets = clocks.clock_offsets(run)
        run.notes = _notes(run, now, shown_alone=False)
    return order_runs(runs)


def _now(now_s: float | None) -> float:
    return time.time() if now_s is None else now_s


def _last_seen(run: Run) -> tuple[bool, int]:
    """The run seen last: the latest time of any rank (runs without a run id come last)."""
    return (run.run_id is not None, run.last_ns or 0)


def order_runs(runs: list[Run]) -> list[Run]:
    """``runs`` in the order they ran: by attempt when every run has one (``dl.run.attempt``,
    or Megatron-LM's counters), else by the earliest ``process.creation.time`` of their ranks,
    else by their first record; ties by their first record."""
    by_attempt = all(run.attempt_order is not None for run in runs)

    def key(run: Run) -> tuple:
        start = run.created_s if run.created_s is not None else (run.first_ns or 0) / 1e9
        if by_attempt:
            return (run.attempt_order, start, run.first_ns or 0)
        return ((), start, run.first_ns or 0)

    return sorted(runs, key=key)


def _load(directory: Path, files: list[RunFile], workers: int) -> list[Run]:
    first = [f for f in files if f.signal != "traces"]
    results = dict(zip(first, _read_all(first, workers)))
    spans_stats = {f.rank: results[f][0] for f in first if f.signal == "spans"}
    open_ranks = {
        span.rank
        for f in first
        if f.signal == "spans"
        for part in results[f][1].values()
        for span in part.spans.values()
        if span.end_ns is None
    }
    traces = [
        f for f in files if f.signal == "traces" and _needs_traces(f.rank, spans_stats, open_ranks)
    ]
    results.update(zip(traces, _read_all(traces, workers)))
    merged: dict[_Key, _Part] = {}
    stats = []
    for file in files:  # sorted by signal: metrics, spans before traces
        if file not in results:
            skipped = FileStats(file.path, file.signal, file.rank)
            try:
                status = file.path.stat()
                skipped.size_bytes, skipped.mtime_s = status.st_size, status.st_mtime
            except OSError:
                pass
            skipped.skipped = "not needed: the span lines of this rank are complete"
            stats.append(skipped)
            continue
        file_stats, parts = results[file]
        stats.append(file_stats)
        for key, part in parts.items():
            target = merged.setdefault(key, _Part())
            for rank, telemetry in part.ranks.items():
                _merge_rank(target.rank(rank), telemetry, file.signal)
            if file.signal == "traces":
                for span in part.spans.values():
                    _merge_span(target.spans, span)
            else:
                target.spans.update(part.spans)
            target.gaps.extend(part.gaps)
    groups = _group_processes(merged)
    runs = []
    for run_id, parts in groups:
        run = Run(directory=directory, files=stats, run_id=run_id)
        spans: dict[tuple[str, str], Span] = {}
        for part in parts:
            for rank, telemetry in part.ranks.items():
                _merge_rank(run.ranks.setdefault(rank, RankTelemetry(rank)), telemetry, "metrics")
            spans.update(part.spans)
            run.gaps.extend(part.gaps)
        run.gaps.sort(key=lambda g: (g.to_ns or 0, g.rank, g.file))
        run.spans = sorted(spans.values(), key=operator.attrgetter("start_ns", "rank"))
        _identify(run)
        runs.append(run)
    if not runs:
        runs.append(Run(directory=directory, files=stats))
    if len(runs) == 1:
        for file in stats:  # a rank with files but nothing readable still counts as a rank
            runs[0].ranks.setdefault(file.rank, RankTelemetry(file.rank))
    for run in runs:
        run.ranks = dict(sorted(run.ranks.items()))
    return runs


def _group_processes(merged: dict[_Key, _Part]) -> list[tuple[str | None, list[_Part]]]:
    """The processes' records grouped into runs: by run id, and where one run id holds two
    processes of the same rank (a rerun under a run id given by hand), split into one run per
    start, in the order of ``process.creation.time``: a process starts a new run when its rank
    is already in the current one."""
    by_run: dict[str | None, list[tuple[str | None, _Part]]] = {}
    for (run_id, instance), part in merged.items():
        by_run.setdefault(run_id, []).append((instance, part))
    groups: list[tuple[str | None, list[_Part]]] = []
    for run_id, processes in by_run.items():
        ranks = [rank for _, part in processes for rank in part.ranks]
        if len(ranks) == len(set(ranks)) or any(i is None for i, _ in processes):
            groups.append((run_id, [part for _, part in processes]))
            continue
        processes.sort(key=lambda item: _part_start(item[1]))
        current: list[_Part] = []
        seen: set[int] = set()
        for _, part in processes:
            if seen & set(part.ranks):
                groups.append((run_id, current))
                current, seen = [], set()
            current.append(part)
            seen.update(part.ranks)
        groups.append((run_id, current))
    return groups


def _part_start(part: _Part) -> float:
    """When the process of ``part`` started (its creation time, else its first record)."""
    for telemetry in part.ranks.values():
        created = attempts.creation_unix_s(telemetry.resource.get("process.creation.time"))
        if created is not None:
            return created
    firsts = [t.first_ns for t in part.ranks.values() if t.first_ns is not None]
    return min(firsts) / 1e9 if firsts else math.inf


def _identify(run: Run) -> None:
    """Fills ``run``'s job id, attempt, start and processes from its ranks' resources."""
    created = []
    for telemetry in run.ranks.values():
        if not telemetry.resource:
            continue
        identity = attempts.identity_of(telemetry.resource)
        if run.job_id is None:
            run.job_id = identity.job_id
        if run.attempt_order is None and identity.order is not None:
            run.attempt, run.attempt_order = identity.attempt, identity.order
        if identity.created_s is not None:
            created.append(identity.created_s)
        if run.run_id is None:
            run.run_id = identity.run_id
    run.created_s = min(created) if created else None


def _merge_rank(target: RankTelemetry, source: RankTelemetry, signal: str) -> None:
    target.gauges.update(source.gauges)
    target.counters.update(source.counters)
    target.histograms.update(source.histograms)
    if source.resource and (signal == "metrics" or not target.resource):
        target.resource = source.resource
    for time_ns in (source.first_ns, source.last_ns):
        if time_ns is not None:
            target.see(time_ns)


def _clock(ns: int | None) -> str:
    if ns is None:
        return "?"
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns // 1_000_000 % 1000:03d}"


def _gap_notes(run: Run) -> list[str]:
    """One note per gap the writers recorded (``gaps-rank*.jsonl``)."""
    notes = []
    for gap in run.gaps:
        if gap.gone_lines and not gap.lost_lines:
            notes.append(
                f"{gap.file} (rank {gap.rank}): its run directory was removed at "
                f"{_clock(gap.to_ns)} UTC and recreated; the {_plural(gap.gone_lines, 'line')} "
                "it held before went with it, so this shows what was written after."
            )
            continue
        records = f", {gap.lost_records:,} records" if gap.lost_records else ""
        gone = (
            f"; the {_plural(gap.gone_lines, 'line')} written before went with the removed "
            "directory"
            if gap.gone_lines
            else ""
        )
        notes.append(
            f"{gap.file} (rank {gap.rank}): {_plural(gap.lost_lines, 'line')}{records} could "
            f"not be written between {_clock(gap.from_ns)} and {_clock(gap.to_ns)} UTC "
            f"({gap.reason}){gone}: a gap in what this shows."
        )
    return notes


def _notes(run: Run, now_s: float, *, shown_alone: bool) -> list[str]:
    """Plain sentences on what was missing or odd in ``run``'s files; ``shown_alone``: the
    run is shown without the other runs of its files (which are then named)."""
    notes: list[str] = []
    if not run.files:
        notes.append(f"{run.directory} holds no *-rank*.jsonl file.")
        return notes
    by_signal: dict[str, set[int]] = {}
    for file in run.files:
        by_signal.setdefault(file.signal, set()).add(file.rank)
        name = file.path.name
        if file.error:
            notes.append(f"{name} could not be read ({file.error}).")
        if file.torn_last_line:
            notes.append(
                f"{name}: the last line is cut (a killed run, a full disk, or a run still "
                "writing it) and was skipped."
            )
        if file.bad_lines:
            notes.append(f"{name}: {_plural(file.bad_lines, 'line')} not readable, skipped.")
    ranks = sorted(run.ranks)
    for signal, what in (("metrics", "curves"), ("spans", "timeline")):
        have = by_signal.get(signal, set())
        if signal == "spans":
            have = have | by_signal.get("traces", set())
        missing = [r for r in ranks if r not in have]
        if not have:
            notes.append(
                f"No {signal} file ({signal}-rank*.jsonl"
                + (" or traces-rank*.jsonl" if signal == "spans" else "")
                + f"): the {what} are empty."
            )
        elif missing:
            notes.append(f"No {signal} file for {ranks_phrase(missing)}.")
    world_size = run.resource.get(DL_WORLD_SIZE)
    if isinstance(world_size, int) and world_size > len(ranks) and ranks:
        notes.append(
            f"World size {world_size}, files of {_plural(len(ranks), 'rank')} only "
            f"({_rank_list(ranks)}): the other ranks wrote elsewhere or did not export "
            "(OTEL_PYTHON_TRAINING_EXPORT_RANKS)."
        )
    if shown_alone and run.other_run_ids:
        notes.append(
            f"These files also hold {_plural(len(run.other_run_ids), 'other run')} "
            f"({', '.join(run.other_run_ids[:5])}{'...' if len(run.other_run_ids) > 5 else ''}), "
            f"appended to the same files; only run {run.run_id} (the latest) is shown."
        )
    if shown_alone and run.same_id_runs:
        notes.append(
            f"These files also hold {_plural(run.same_id_runs, 'earlier run')} under the same "
            f"run id {run.run_id} (other processes of the same ranks, told apart by "
            "service.instance.id); only the latest is shown here, `otel-training report` shows "
            "each."
        )
    notes.extend(_gap_notes(run))
    notes.extend(offset.note for offset in run.clock_offsets)
    open_spans = [s for s in run.spans if s.open]
    if open_spans:
        names = sorted({s.name for s in open_spans})
        notes.append(
            f"{_plural(len(open_spans), 'span')} never ended ({', '.join(names[:4])}"
            f"{'...' if len(names) > 4 else ''}; "
            f"{ranks_phrase({s.rank for s in open_spans})}): shown open until the last "
            "time seen on their rank."
        )
    ended_at_exit = [s for s in run.spans if s.truncated and not s.open]
    if ended_at_exit:
        notes.append(
            f"{_plural(len(ended_at_exit), 'span')} "
            f"{'was' if len(ended_at_exit) == 1 else 'were'} still open at exit or SIGTERM and "
            f"{'was' if len(ended_at_exit) == 1 else 'were'} ended then (truncated)."
        )
    newest = max((f.mtime_s for f in run.files), default=0.0)
    if open_spans and now_s - newest < IN_PROGRESS_S:
        notes.append(
            f"The files were written {max(now_s - newest, 0.0):.0f} s ago and spans are still "
            "open: the run is probably still in progress; this shows what is on disk now."
        )
    if run.is_empty:
        notes.append("No metric point and no span could be read: the run is empty.")
    return notes
