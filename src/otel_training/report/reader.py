"""Reads the files of a job, each once, into the runs that the report and the trace draw and
the processes that run health judges.

A run directory of the embedded default holds, per rank R, ``metrics-rank{R}.jsonl`` and
``traces-rank{R}.jsonl`` (OTLP-JSON lines), ``spans-rank{R}.jsonl`` (span and ``stacks``
records, ``docs/spans.md``), ``logs-rank{R}.jsonl`` and, after a write failed,
``gaps-rank{R}.jsonl``. Each file is opened and decoded once (:mod:`otel_training.report.otlp`
decodes a line); what one pass finds per process serves every command: the report's series,
spans and gaps (:class:`~otel_training.report.run.Run`) and run health's ledger samples, phase
spans and stacks (:class:`otel_training.health.evidence.Process`, in ``Run.processes``).

**A process** is one rank of one attempt, told by its resource
(:func:`otel_training.report.attempts.identity_of`: run id, attempt counters,
``process.creation.time``, else ``service.instance.id``) and its rank (``dl.rank``, else the
line's ``rank``, else the file name's). Lines without a creation time (span lines of older
versions, hand-written files) belong to the process of the same run, rank, attempt and instance
that had started by their first record (the latest such), else to a process of their own.

**A run** is the processes of one run id; where one run id holds two processes of the same rank
(a rerun under a run id given by hand) it is split into one run per start, in the order of the
processes' starts. **The job** of a run directory is the job of the run seen last in it
(:func:`otel_training.report.attempts.job_of`); its attempts are its runs in its run directories
(:func:`otel_training.report.rundir.job_directories`).

The reader is tolerant: a missing file, a torn last line (a killed run, a full disk, a run still
writing), a line of the wrong shape, a run still in progress, lines of older runs appended to the
same files (the flat layout) each give a note, never an exception.
"""

from __future__ import annotations

import collections
import math
import operator
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry.semconv._incubating.metrics.hw_metrics import HW_TEMPERATURE

from otel_training.health import ledger as _ledger
from otel_training.health.evidence import KEPT_PHASES, PhaseSpan, Process, Sample
from otel_training.report import clocks, otlp
from otel_training.report._nogc import no_gc
from otel_training.report.attempts import ProcessIdentity, identity_of, job_of
from otel_training.report.run import (
    TRUNCATED_ATTRIBUTE,
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
from otel_training.semconv.attributes import (
    DL_GPU_CLOCK_DOMAIN,
    DL_RANK,
    DL_TRAINING_PHASE,
    DL_WORLD_SIZE,
    MEGATRON_CHECKPOINT_OPERATION,
    MEGATRON_ITERATION,
)
from otel_training.semconv.metrics import (
    DL_GPU_CLOCK_SPEED,
    DL_TRAINING_CHECKPOINT_AGE,
    DL_TRAINING_CHECKPOINT_ITERATION,
    DL_TRAINING_PHASE_ELAPSED,
    DL_TRAINING_PHASE_TIME,
    DL_TRAINING_PROGRESS_ITERATION,
    DL_TRAINING_PROGRESS_TIMESTAMP,
)
from otel_training.semconv.spans import MEGATRON_TRAIN, MEGATRON_TRAIN_SEGMENT

__all__ = [
    "PARALLEL_BYTES",
    "PURPOSES",
    "file_notes",
    "load_job",
    "load_run",
    "load_runs",
    "order_runs",
    "other_jobs_note",
]

IN_PROGRESS_S = 60.0
"""Files modified less than this many seconds ago, with spans still open, mean a run that is
probably still in progress."""

PARALLEL_BYTES = 64 * 2**20
"""From this many bytes of files in a run directory, its files are read in worker processes."""

PURPOSES = ("report", "trace", "health")
"""What a reading keeps of the files, each read once whatever it keeps: ``report``
everything (the metric series, every span, run health's processes and the notes), ``trace``
all but run health's processes (``Run.processes`` empty), ``health`` only run health's
(``Run.processes``, ``Run.files`` and the runs' identities: no metric series, no spans, no
notes; the span lines of other spans than :data:`_HEALTH_SPANS` are skipped undecoded, but for
the last :data:`_TAIL_LINES` of each file, and logs files are not opened)."""

_PHASES = _ledger.PHASES
_PHASE_INDEX = {name: i for i, name in enumerate(_PHASES)}
_DELTA = (1, "AGGREGATION_TEMPORALITY_DELTA")
#: The span names run health reads: those of the phases it keeps, and the run's and its
#: segments' (whose start lines without an end tell a process that never shut down).
_HEALTH_SPANS = frozenset(
    name for name, phase in _ledger.PHASE_OF_SPAN.items() if phase in KEPT_PHASES
) | {MEGATRON_TRAIN, MEGATRON_TRAIN_SEGMENT}
_HEALTH_SPAN_BYTES = frozenset(name.encode() for name in _HEALTH_SPANS)
#: A span line's name, read without decoding the line (a ``stacks`` record has none).
_NAME = re.compile(rb'"name":\s*"([^"\\]*)"')
#: The last lines of a span file are decoded whatever their span (the last evidence of life).
_TAIL_LINES = 64
#: The prefix of the status description of a span ended on a signal.
_TRUNCATED_PREFIX = "truncated: "

_Key = tuple[Any, ...]
"""(run id, ``service.instance.id`` where no creation time, attempt order, creation time,
rank): one process."""


class _Part:
    """What the files hold for one process (the module docstring): its rank's series, its
    spans, gaps, ledger samples and ``stacks`` records, and the file ranks it wrote to."""

    def __init__(self, identity: ProcessIdentity, rank: int) -> None:
        self.identity = identity
        self.telemetry = RankTelemetry(rank)
        self.spans: dict[tuple[str, str], Span] = {}
        self.gaps: list[Gap] = []
        self.samples: list[Sample] = []
        self.stacks: list[dict[str, Any]] = []
        self.file_ranks: set[int] = set()
        # The running totals of dl.training.phase.time exported with delta temporality.
        self.phase_totals: list[float] | None = None

    @property
    def start_s(self) -> float:
        """When the process started: its creation time, else its first record."""
        if self.identity.created_s is not None:
            return self.identity.created_s
        first = self.telemetry.first_ns
        return math.inf if first is None else first / 1e9

    def absorb(self, other: _Part, signal: str) -> None:
        """Adds ``other`` (the same process, from another file of ``signal``, or lines of it
        without a creation time) to this one."""
        _merge_rank(self.telemetry, other.telemetry, signal)
        if signal == "traces":
            for span in other.spans.values():
                _merge_span(self.spans, span)
        else:
            self.spans.update(other.spans)
        self.gaps += other.gaps
        self.samples += other.samples
        self.stacks += other.stacks
        self.file_ranks |= other.file_ranks


class _FileReader:
    """Decodes one file into a :class:`_Part` per process, keeping what ``purpose`` needs
    (:data:`PURPOSES`)."""

    def __init__(self, file: RunFile, purpose: str = "report") -> None:
        self.file = file
        # The report's and the trace's: metric series and every span; run health's: samples.
        self.series = self.every_span = purpose != "health"
        self.health = purpose != "trace"
        self.parts: dict[_Key, _Part] = {}
        # The part of each resource seen (by its items and rank): identity_of once per writer.
        self._parts_by_resource: dict[Any, _Part] = {}
        self._strings: dict[str, str] = {}
        # Previous raw point of each cumulative counter/histogram: (start_ns, raw values).
        self.previous: dict[int, tuple[int, Any]] = {}
        self._time_text = ""
        self._time_ns = 0
        # Per (rank telemetry, gauge): the raw attributes and series of each point position.
        self._gauge_cache: dict[tuple[int, str], list[tuple[Any, GaugeSeries]]] = {}

    def part(self, resource: dict[str, Any], rank: Any) -> _Part:
        """The process of a line with ``resource``; ``rank``: the line's rank when its
        resource has no ``dl.rank`` (else the file name's)."""
        value = resource.get(DL_RANK)
        if isinstance(value, int):
            rank = value
        elif not isinstance(rank, int):
            rank = self.file.rank
        try:
            cache_key: Any = (rank, *resource.items())
            part = self._parts_by_resource.get(cache_key)
        except TypeError:  # a list among the values
            cache_key, part = None, None
        if part is None:
            identity = identity_of(resource)
            # With a creation time, the instance id tells nothing more (and one signal's
            # resource may lack it: the SDK adds its own to the metrics').
            instance = identity.instance if identity.created_s is None else None
            key = (identity.run_id, instance, identity.order, identity.created_s, rank)
            part = self.parts.get(key)
            if part is None:
                part = self.parts[key] = _Part(identity, rank)
                part.file_ranks.add(self.file.rank)
            if cache_key is not None:
                self._parts_by_resource[cache_key] = part
        return part

    def shared(self, text: str) -> str:
        """``text`` as one string object however many lines repeat it (span names, trace
        ids, statuses: a long run holds hundreds of thousands of spans)."""
        return self._strings.setdefault(text, text)

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
        # Run health skips the span lines of the steps' inner phases (the ledger has them).
        window = collections.deque() if not self.every_span and file.signal == "spans" else None
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
                    if window is not None:
                        window.append((raw, last))
                        if len(window) <= _TAIL_LINES:
                            continue
                        raw, last = window.popleft()
                        if not _health_reads(raw):
                            continue
                    self.decode(decode, raw, last, stats)
                for raw, last in window or ():
                    self.decode(decode, raw, last, stats)
        except OSError as error:
            stats.error = f"{type(error).__name__}: {error.strerror or error}"
        return stats

    def decode(self, decode: Any, raw: bytes, last: bool, stats: FileStats) -> None:
        """Decodes one line, counting it on ``stats`` when it cannot be read."""
        try:
            decode(otlp.loads(raw))
        except otlp.Torn:
            if last:
                stats.torn_last_line = True
            else:
                stats.bad_lines += 1
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            stats.bad_lines += 1

    # -- gaps -------------------------------------------------------------------------------

    def gaps_line(self, record: dict[str, Any]) -> None:
        if record["record"] != "gap":
            raise ValueError(f"unknown record {record['record']!r}")
        part = self.part(record.get("resource") or {}, None)
        part.gaps.append(
            Gap(
                rank=part.telemetry.rank,
                file=str(record["file"]),
                from_ns=otlp.optional_int(record.get("from_unix_ns")),
                to_ns=otlp.optional_int(record.get("to_unix_ns")),
                lost_lines=int(record.get("lost_lines") or 0),
                lost_records=int(record.get("lost_records") or 0),
                gone_lines=int(record.get("gone_lines") or 0),
                reason=str(record.get("reason") or ""),
            )
        )

    # -- metrics ----------------------------------------------------------------------------

    def metrics_line(self, document: dict[str, Any]) -> None:
        series, health = self.series, self.health
        for resource_metrics in document["resourceMetrics"]:
            resource = otlp.attributes(resource_metrics.get("resource", {}).get("attributes"))
            part = self.part(resource, None)
            telemetry = part.telemetry
            telemetry.resource = resource
            ledger: list[dict[str, Any]] = []
            for scope_metrics in resource_metrics.get("scopeMetrics", ()):
                for metric in scope_metrics.get("metrics", ()):
                    name = metric["name"]
                    if health and (name.startswith("dl.") or name == HW_TEMPERATURE):
                        ledger.append(metric)
                    if series:
                        self.metric(telemetry, metric)
            if ledger:
                _add_sample(part, ledger)

    def metric(self, telemetry: RankTelemetry, metric: dict) -> None:
        name = metric["name"]
        if "gauge" in metric:
            self.gauge_points(telemetry, name, metric["gauge"].get("dataPoints", ()))
        elif "sum" in metric:
            data = metric["sum"]
            points = data.get("dataPoints", ())
            if data.get("isMonotonic"):
                temporality = otlp.temporality(data.get("aggregationTemporality"))
                self.counter_points(telemetry, name, temporality, points)
            else:  # an up-down counter reads like a gauge
                self.gauge_points(telemetry, name, points)
        elif "histogram" in metric:
            data = metric["histogram"]
            temporality = otlp.temporality(data.get("aggregationTemporality"))
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
                value = otlp.number(point)
                if value is None:
                    continue
            pairs = point.get("attributes")
            if i < len(cache) and cache[i][0] == pairs:
                series = cache[i][1]
            else:
                attributes = otlp.point_attributes(pairs)
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
            value = otlp.number(point)
            if value is None:
                continue
            attributes = otlp.point_attributes(point.get("attributes"))
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
        total = otlp.double(point.get("sum", 0.0))
        attributes = otlp.point_attributes(point.get("attributes"))
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
                low = otlp.double(low)
                series.min = low if series.min is None else min(series.min, low)
            if high is not None:
                high = otlp.double(high)
                series.max = high if series.max is None else max(series.max, high)
        telemetry.see(time_ns)

    # -- spans ------------------------------------------------------------------------------

    def traces_line(self, document: dict[str, Any]) -> None:
        for resource_spans in document["resourceSpans"]:
            resource = otlp.attributes(resource_spans.get("resource", {}).get("attributes"))
            part = self.part(resource, None)
            telemetry = part.telemetry
            if not telemetry.resource:
                telemetry.resource = resource
            for scope_spans in resource_spans.get("scopeSpans", ()):
                for item in scope_spans.get("spans", ()):
                    if not self.every_span and item["name"] not in _HEALTH_SPANS:
                        telemetry.see(int(item["startTimeUnixNano"]))
                        continue
                    span = _otlp_span(telemetry.rank, item)
                    telemetry.see(span.start_ns)
                    if span.end_ns is not None:
                        telemetry.see(span.end_ns)
                    _merge_span(part.spans, span)

    def spans_line(self, record: dict[str, Any]) -> None:
        kind = record["record"]
        resource = record.get("resource") or {}
        part = self.part(resource, record.get("rank"))
        telemetry = part.telemetry
        if not telemetry.resource and resource:
            telemetry.resource = dict(resource)
        if kind == "stacks":  # a rank's thread stacks (docs/health.md)
            time_ns = record.get("time_ns")
            if time_ns:
                telemetry.see(int(time_ns))
            if self.health:
                part.stacks.append(record)
            return
        if kind not in ("span_start", "span_end"):
            raise ValueError(f"unknown record {kind!r}")
        trace_id, span_id = otlp.hex_id(record["trace_id"]), otlp.hex_id(record["span_id"])
        start_ns = int(record["start_time_ns"])
        telemetry.see(start_ns)
        key = (self.shared(trace_id or ""), span_id or "")
        span = part.spans.get(key)
        if span is None:
            span = part.spans[key] = Span(
                rank=telemetry.rank,
                name=self.shared(record["name"]),
                trace_id=key[0],
                span_id=key[1],
                parent_span_id=otlp.hex_id(record.get("parent_span_id")),
                start_ns=start_ns,
                attributes=dict(record.get("attributes") or {}),
            )
        if kind == "span_end":
            span.end_ns = int(record["end_time_ns"])
            span.status = self.shared(str(record.get("status") or "UNSET"))
            span.status_description = record.get("status_description")
            span.attributes = dict(record.get("attributes") or {})
            span.events = list(record.get("events") or ())
            telemetry.see(span.end_ns)


def _health_reads(raw: bytes) -> bool:
    """Whether run health reads a span file's line that is not among its last ones: every
    line but the span records of spans other than :data:`_HEALTH_SPANS`."""
    if b'"span_' not in raw[:40]:
        return True
    found = _NAME.search(raw, 0, 400)
    return found is None or found[1] in _HEALTH_SPAN_BYTES


def _point_phase(point: dict[str, Any]) -> int | None:
    for kv in point.get("attributes") or ():
        if kv.get("key") == DL_TRAINING_PHASE:
            return _PHASE_INDEX.get((kv.get("value") or {}).get("stringValue"))
    return None


def _add_sample(part: _Part, metrics: list[dict[str, Any]]) -> None:
    """Adds the health ledger of one export (its ``dl.*`` and ``hw.temperature`` metrics) to
    ``part`` as a :class:`~otel_training.health.evidence.Sample`."""
    time_ns = None
    phase_s: list[float] | None = None
    delta = False
    sample = Sample(0.0)
    clocks_hz: list[float] = []
    temperatures: list[float] = []
    for metric in metrics:
        name = metric["name"]
        data = metric.get("gauge") or metric.get("sum")
        if data is None:
            continue
        points = data.get("dataPoints", ())
        if not points:
            continue
        if time_ns is None:
            time_ns = int(points[0]["timeUnixNano"])
        if name == DL_TRAINING_PHASE_TIME:
            phase_s = [0.0] * len(_PHASES)
            delta = data.get("aggregationTemporality") in _DELTA
            for point in points:
                phase = _point_phase(point)
                value = otlp.number(point)
                if phase is not None and value is not None:
                    phase_s[phase] = value
        elif name == DL_TRAINING_PHASE_ELAPSED:
            for point in points:
                value = otlp.number(point) or 0.0
                if value > sample.open_s or sample.open_phase is None and value >= 0:
                    phase = _point_phase(point)
                    if phase is not None and (value > 0 or sample.open_phase is None):
                        sample.open_phase, sample.open_s = _PHASES[phase], value
        elif name == DL_TRAINING_PROGRESS_ITERATION:
            value = otlp.number(points[0])
            sample.iteration = None if value is None else int(value)
        elif name == DL_TRAINING_PROGRESS_TIMESTAMP:
            sample.progress_s = otlp.number(points[0])
        elif name == DL_TRAINING_CHECKPOINT_ITERATION:
            for point in points:
                operation = otlp.attributes(point.get("attributes")).get(
                    MEGATRON_CHECKPOINT_OPERATION
                )
                value = otlp.number(point)
                if value is None:
                    continue
                if operation == "save":
                    sample.saved_iteration = int(value)
                elif operation == "load":
                    sample.loaded_iteration = int(value)
        elif name == DL_TRAINING_CHECKPOINT_AGE:
            sample.checkpoint_age_s = otlp.number(points[0])
        elif name == DL_GPU_CLOCK_SPEED:
            for point in points:
                if otlp.attributes(point.get("attributes")).get(DL_GPU_CLOCK_DOMAIN) == "sm":
                    value = otlp.number(point)
                    if value is not None:
                        clocks_hz.append(value)
        elif name == HW_TEMPERATURE:
            temperatures.extend(v for v in map(otlp.number, points) if v is not None)
    if time_ns is None:
        return
    sample.time_s = time_ns / 1e9
    if phase_s is not None:
        if delta:
            totals = part.phase_totals = part.phase_totals or [0.0] * len(_PHASES)
            for i, value in enumerate(phase_s):
                totals[i] += value
            phase_s = list(totals)
        sample.phase_s = tuple(phase_s)
    if clocks_hz:
        sample.sm_clock_hz = sum(clocks_hz) / len(clocks_hz)
    if temperatures:
        sample.temperature_c = sum(temperatures) / len(temperatures)
    part.samples.append(sample)
    part.telemetry.see(time_ns)


def _otlp_span(rank: int, item: dict) -> Span:
    start_ns = int(item["startTimeUnixNano"])
    status, description = otlp.status(item.get("status"))
    return Span(
        rank=rank,
        name=item["name"],
        trace_id=otlp.hex_id(item["traceId"]) or "",
        span_id=otlp.hex_id(item["spanId"]) or "",
        parent_span_id=otlp.hex_id(item.get("parentSpanId")),
        start_ns=start_ns,
        end_ns=int(item["endTimeUnixNano"]) if item.get("endTimeUnixNano") else None,
        status=status,
        status_description=description,
        attributes=otlp.attributes(item.get("attributes")),
        events=[
            {
                "name": event.get("name", ""),
                "time_ns": int(event.get("timeUnixNano", start_ns)),
                "attributes": otlp.attributes(event.get("attributes")),
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


def _merge_rank(target: RankTelemetry, source: RankTelemetry, signal: str) -> None:
    target.gauges.update(source.gauges)
    target.counters.update(source.counters)
    target.histograms.update(source.histograms)
    if source.resource and (signal == "metrics" or not target.resource):
        target.resource = source.resource
    for time_ns in (source.first_ns, source.last_ns):
        if time_ns is not None:
            target.see(time_ns)


# -- reading files --------------------------------------------------------------------------


def _read_file(file: RunFile, purpose: str) -> tuple[FileStats, dict[_Key, _Part]]:
    """Reads one file; the unit of work of a worker process."""
    reader = _FileReader(file, purpose)
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


def _read_all(
    files: list[RunFile], workers: int, purpose: str
) -> list[tuple[FileStats, dict[_Key, _Part]]]:
    if workers <= 1 or len(files) <= 1:
        return [_read_file(file, purpose) for file in files]
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
            futures = {pool.submit(_read_file, files[i], purpose): i for i in order}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
    except (OSError, RuntimeError, concurrent.futures.process.BrokenProcessPool):
        # No processes here (a sandbox, a broken pool): read them in this one.
        return [_read_file(file, purpose) for file in files]
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


def _not_read(file: RunFile, why: str) -> FileStats:
    """The stats of a file left unread: its size and modification time."""
    stats = FileStats(file.path, file.signal, file.rank, skipped=why)
    try:
        status = file.path.stat()
        stats.size_bytes, stats.mtime_s = status.st_size, status.st_mtime
    except OSError:
        pass
    return stats


def _load(directory: Path, files: list[RunFile], workers: int, purpose: str) -> list[Run]:
    """The runs of ``directory``'s ``files``, each file read once."""
    health_only = purpose == "health"
    wanted = [f for f in files if f.signal != "traces" and not (health_only and f.signal == "logs")]
    results = dict(zip(wanted, _read_all(wanted, workers, purpose)))
    spans_stats = {f.rank: results[f][0] for f in wanted if f.signal == "spans"}
    open_ranks = {
        span.rank
        for f in wanted
        if f.signal == "spans"
        for part in results[f][1].values()
        for span in part.spans.values()
        if span.end_ns is None
    }
    traces = [
        f for f in files if f.signal == "traces" and _needs_traces(f.rank, spans_stats, open_ranks)
    ]
    results.update(zip(traces, _read_all(traces, workers, purpose)))
    merged: dict[_Key, _Part] = {}
    stats = []
    for file in files:  # sorted by signal: metrics, spans before traces
        if file not in results:
            why = (
                "not needed: the span lines of this rank are complete"
                if file.signal == "traces"
                else "not needed by run health"
            )
            stats.append(_not_read(file, why))
            continue
        file_stats, parts = results.pop(file)
        stats.append(file_stats)
        for key, part in parts.items():
            known = merged.get(key)
            if known is None:
                merged[key] = part
            else:
                known.absorb(part, file.signal)
    parts = _place(list(merged.values()))
    processes = _evidence(directory, parts, stats) if purpose != "trace" else {}
    runs = []
    for run_id, group in _group_processes(parts):
        run = Run(directory=directory, files=stats, run_id=run_id)
        spans: dict[tuple[str, str], Span] = {}
        for part in group:
            telemetry = part.telemetry
            _merge_rank(run.ranks.setdefault(telemetry.rank, RankTelemetry(telemetry.rank)),
                        telemetry, "metrics")  # fmt: skip
            spans.update(part.spans)
            run.gaps.extend(part.gaps)
            if processes:
                run.processes.append(processes[id(part)])
        run.gaps.sort(key=lambda g: (g.to_ns or 0, g.rank, g.file))
        if not health_only:  # run health has what it reads of them in the processes
            run.spans = sorted(spans.values(), key=operator.attrgetter("start_ns", "rank"))
        run.processes.sort(key=lambda p: (p.rank, p.start_s or 0.0))
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


def _place(parts: list[_Part]) -> list[_Part]:
    """The processes: each part with a creation time, and each without one given to the process
    of its run, rank, attempt and instance that had started by its first record (the module
    docstring)."""
    processes = [p for p in parts if p.identity.created_s is not None]
    for loose in sorted(
        (p for p in parts if p.identity.created_s is None), key=operator.attrgetter("start_s")
    ):
        home = _home(loose, processes)
        if home is None:
            processes.append(loose)
        else:
            home.absorb(loose, "spans")
    return processes


def _home(loose: _Part, processes: list[_Part]) -> _Part | None:
    """The process of ``loose``'s run and rank (and attempt and instance, where ``loose``
    names them) that had started by its first record, the latest such; else the first to
    start; ``None`` when there is none."""
    identity = loose.identity
    candidates = [
        p
        for p in processes
        if p.telemetry.rank == loose.telemetry.rank
        and p.identity.run_id == identity.run_id
        and (identity.order is None or p.identity.order == identity.order)
        and (identity.instance is None or p.identity.instance in (None, identity.instance))
    ]
    if not candidates:
        return None
    at = loose.start_s
    started = [p for p in candidates if p.start_s <= at]
    return max(started or candidates, key=operator.attrgetter("start_s"))


def _evidence(directory: Path, parts: list[_Part], files: list[FileStats]) -> dict[int, Process]:
    """What run health reads of each process (by ``id`` of its part): its ledger samples, phase
    spans and stacks by time, and its last evidence of life: its latest record, or the
    modification time of its rank's files when that is later by at most one export interval
    plus one second (a file copied later does not move it further); the files of a rank are
    the evidence of their newest writer only."""
    processes = {}
    for part in parts:
        identity, telemetry = part.identity, part.telemetry
        process = Process(
            rank=telemetry.rank,
            run_id=identity.run_id,
            job_id=identity.job_id,
            attempt=identity.attempt,
            created_s=identity.created_s,
            resource=telemetry.resource,
            samples=sorted(part.samples, key=operator.attrgetter("time_s")),
            stacks=sorted(part.stacks, key=lambda r: r.get("time_ns") or 0),
            first_s=None if telemetry.first_ns is None else telemetry.first_ns / 1e9,
            last_s=None if telemetry.last_ns is None else telemetry.last_ns / 1e9,
            directories={directory},
        )
        for span in part.spans.values():
            truncated = span.attributes.get(TRUNCATED_ATTRIBUTE) is True
            if span.end_ns is None:
                process.open_spans += 1
            elif truncated:
                description = span.status_description
                if isinstance(description, str) and description.startswith(_TRUNCATED_PREFIX):
                    process.signal = description[len(_TRUNCATED_PREFIX) :]
            phase = _ledger.PHASE_OF_SPAN.get(span.name, _ledger.NO_PHASE)
            if phase not in KEPT_PHASES:
                continue
            iteration = span.attributes.get(MEGATRON_ITERATION)
            ended = span.end_ns is not None
            process.spans.append(
                PhaseSpan(
                    name=span.name,
                    phase=phase,
                    start_s=span.start_ns / 1e9,
                    end_s=span.end_ns / 1e9 if ended else None,
                    iteration=iteration if isinstance(iteration, int) else None,
                    failed=ended and span.status == "ERROR" and not truncated,
                    truncated=ended and truncated,
                )
            )
        process.spans.sort(key=operator.attrgetter("start_s"))
        process.alive_s = process.last_s
        processes[id(part)] = process
    mtimes: dict[int, float] = {}
    for stats in files:
        mtimes[stats.rank] = max(mtimes.get(stats.rank, 0.0), stats.mtime_s)
    for rank, mtime in mtimes.items():
        writers = [processes[id(p)] for p in parts if rank in p.file_ranks]
        if not writers:
            continue
        newest = max(writers, key=lambda p: (p.start_s or 0.0, p.last_s or 0.0))
        if newest.last_s is None:
            continue
        if 0 < mtime - newest.last_s <= newest.export_interval_s + 1.0:
            newest.alive_s = max(newest.alive_s or 0.0, mtime)
    return processes


def _group_processes(parts: list[_Part]) -> list[tuple[str | None, list[_Part]]]:
    """The processes grouped into runs: by run id, and where one run id holds two processes of
    the same rank, split into one run per start, in the order of their starts: a process starts
    a new run when its rank is already in the current one."""
    by_run: dict[str | None, list[_Part]] = {}
    for part in parts:
        by_run.setdefault(part.identity.run_id, []).append(part)
    groups: list[tuple[str | None, list[_Part]]] = []
    for run_id, processes in by_run.items():
        ranks = [part.telemetry.rank for part in processes]
        if len(ranks) == len(set(ranks)):
            groups.append((run_id, processes))
            continue
        processes.sort(key=operator.attrgetter("start_s"))
        current: list[_Part] = []
        seen: set[int] = set()
        for part in processes:
            if part.telemetry.rank in seen:
                groups.append((run_id, current))
                current, seen = [], set()
            current.append(part)
            seen.add(part.telemetry.rank)
        groups.append((run_id, current))
    return groups


def _identify(run: Run) -> None:
    """Fills ``run``'s job id, attempt, start and processes from its ranks' resources."""
    created = []
    for telemetry in run.ranks.values():
        if not telemetry.resource:
            continue
        identity = identity_of(telemetry.resource)
        if run.job_id is None:
            run.job_id = identity.job_id
        if run.attempt_order is None and identity.order is not None:
            run.attempt, run.attempt_order = identity.attempt, identity.order
        if identity.created_s is not None:
            created.append(identity.created_s)
        if run.run_id is None:
            run.run_id = identity.run_id
    run.created_s = min(created) if created else None


# -- runs and jobs --------------------------------------------------------------------------


def load_runs(
    directory: str | os.PathLike,
    *,
    now_s: float | None = None,
    workers: int | None = None,
    purpose: str = "report",
) -> list[Run]:
    """Every run (attempt, or process group given one run id) whose records are in the rank
    files of ``directory``, each a :class:`Run` with its identity (``job_id``, ``attempt``,
    ``created_s``), processes and notes, ordered as :func:`order_runs` orders them. At least
    one (empty when nothing was read). Each file is read once, for ``purpose``
    (:data:`PURPOSES`). Never raises on the files.

    Raises:
        ValueError: when ``purpose`` is none of :data:`PURPOSES`.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r} is none of {', '.join(PURPOSES)}")
    directory = Path(directory)
    files = run_files(directory)
    if workers is None:
        total = sum(_size_of(f.path) for f in files)
        workers = (os.cpu_count() or 1) if total > PARALLEL_BYTES else 1
    with no_gc():
        runs = _load(directory, files, workers, purpose)
    if purpose != "health":
        now = _now(now_s)
        for run in runs:
            run.clock_offsets = clocks.clock_offsets(run)
            run.notes = _notes(run, now, shown_alone=False)
    return order_runs(runs)


def load_run(
    directory: str | os.PathLike, *, now_s: float | None = None, workers: int | None = None
) -> Run:
    """Reads every rank file of a run directory: the run seen last in it.

    Span JSON lines are preferred; a rank's OTLP-JSON traces file is read where its span lines
    are absent or incomplete, and completes them (an end that the lines lack) or stands in for
    them. Lines of several runs in the same files (older versions appended every run to one
    set of files; two processes given the same run id append to one directory) are told apart
    by their processes (the module docstring): the run seen last is kept and the others are
    named in a note (:func:`load_job` shows each of them).

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
    run_directory: str | os.PathLike,
    *,
    now_s: float | None = None,
    workers: int | None = None,
    purpose: str = "report",
) -> Job:
    """Reads every attempt of the job that the run seen last in ``run_directory`` belongs to,
    each file once.

    The attempts are the runs of its job (:func:`otel_training.report.attempts.job_of`: its
    ``dl.job.id`` or Megatron-LM's name for it, else its run id less ``-a{N}``) in
    ``run_directory`` and in the sibling run directories of the same job
    (:func:`otel_training.report.rundir.job_directories`). Each attempt stays a :class:`Run`
    of its own, labelled and ordered (:func:`order_runs`), never merged with another.

    Args:
        run_directory: A run directory (see :func:`otel_training.report.find_run_directory`).
        now_s: The time to judge "still in progress" against, Unix seconds (default: now).
        workers: As for :func:`load_run`.
        purpose: What the reading is for (:data:`PURPOSES`): ``"report"`` keeps everything,
            ``"trace"`` all but run health's, ``"health"`` only run health's.

    Returns:
        The job. Never raises on the files (an unreadable directory gives an empty run with a
        note).

    Raises:
        ValueError: when ``purpose`` is none of :data:`PURPOSES`.
    """
    base = Path(run_directory).absolute()
    now = _now(now_s)
    found = {base: load_runs(base, now_s=now, workers=workers, purpose=purpose)}
    chosen = max(found[base], key=_last_seen)
    key = job_of(chosen.job_id, chosen.run_id)
    directories = job_directories(base, job=key, run_id=chosen.run_id)
    for directory in directories:
        if directory not in found:
            found[directory] = load_runs(directory, now_s=now, workers=workers, purpose=purpose)
    runs = [r for d in directories for r in found[d] if job_of(r.job_id, r.run_id) == key]
    jobs = {job_of(r.job_id, r.run_id) for d in directories for r in found[d]}
    others = sorted(other for other in jobs - {key} if other is not None)
    runs = order_runs(runs)
    job = Job(job_id=chosen.job_id, runs=runs, directories=directories, key=key)
    job.other_jobs = others
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
        job.notes.append(other_jobs_note(others))
    return job


def other_jobs_note(jobs: list[str]) -> str:
    """The note on runs of other jobs in a job's files, left out (named by their jobs)."""
    return (
        f"The files also hold runs of {_plural(len(jobs), 'other job')} "
        f"({', '.join(jobs[:5])}{'...' if len(jobs) > 5 else ''}), left out."
    )


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


# -- notes ----------------------------------------------------------------------------------


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


def file_notes(files: list[FileStats], *, torn: bool = False) -> list[str]:
    """A note per file that could not be read, per file with lines that could not be, and
    with ``torn`` per file whose last line is cut (normal for a killed run)."""
    notes = []
    for file in files:
        name = file.path.name
        if file.error:
            notes.append(f"{name} could not be read ({file.error}).")
        if torn and file.torn_last_line:
            notes.append(
                f"{name}: the last line is cut (a killed run, a full disk, or a run still "
                "writing it) and was skipped."
            )
        if file.bad_lines:
            notes.append(f"{name}: {_plural(file.bad_lines, 'line')} not readable, skipped.")
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
    notes.extend(file_notes(run.files, torn=True))
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
