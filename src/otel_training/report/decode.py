"""One file of a run directory decoded into the records of each process that wrote it: the
report's metric series, spans and gaps, and run health's ledger samples and ``stacks`` records
(:mod:`otel_training.report.reader` reads the files of a job with it, each once, and assembles
the processes, runs and job). Lines are decoded by :mod:`otel_training.report.otlp`; a line
that cannot be is counted on the file's :class:`~otel_training.report.run.FileStats`, never
raised.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterator
from typing import Any

from opentelemetry.semconv._incubating.metrics.hw_metrics import HW_TEMPERATURE

from otel_training.health import ledger as _ledger
from otel_training.health.evidence import KEPT_PHASES, Sample
from otel_training.metrics.instruments import TRAINING_VALUES
from otel_training.report import otlp
from otel_training.report.attempts import ProcessIdentity, identity_of
from otel_training.report.run import (
    CounterSeries,
    FileStats,
    Gap,
    GaugeSeries,
    HistogramSeries,
    RankTelemetry,
    Span,
)
from otel_training.report.rundir import GAPS, RunFile
from otel_training.semconv.attributes import (
    DL_GPU_CLOCK_DOMAIN,
    DL_RANK,
    DL_TRAINING_PHASE,
    MEGATRON_CHECKPOINT_OPERATION,
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

__all__ = ["PURPOSES", "Key", "Part", "merge_rank", "read_file"]

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
Key = tuple[Any, ...]
"""(run id, ``service.instance.id`` where no creation time, attempt order, creation time,
rank): one process."""


class Part:
    """What the files hold for one process (:data:`Key`; :mod:`otel_training.report.reader`
    says which lines are one process's): its rank's series, its spans, gaps, ledger samples
    and ``stacks`` records, and the file ranks it wrote to."""

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

    def absorb(self, other: Part, signal: str) -> None:
        """Adds ``other`` (the same process, from another file of ``signal``, or lines of it
        without a creation time) to this one."""
        merge_rank(self.telemetry, other.telemetry, signal)
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
    """Decodes one file into a :class:`Part` per process, keeping what ``purpose`` needs
    (:data:`PURPOSES`)."""

    def __init__(self, file: RunFile, purpose: str = "report") -> None:
        self.file = file
        # The report's and the trace's: metric series and every span; run health's: samples.
        self.series = self.every_span = purpose != "health"
        self.health = purpose != "trace"
        self.parts: dict[Key, Part] = {}
        # The part of each resource seen (by its items and rank): identity_of once per writer.
        self._parts_by_resource: dict[Any, Part] = {}
        self._strings: dict[str, str] = {}
        # Previous raw point of each cumulative counter/histogram: (start_ns, raw values).
        self.previous: dict[int, tuple[int, Any]] = {}
        self._time_text = ""
        self._time_ns = 0
        # Per (rank telemetry, gauge): the raw attributes and series of each point position.
        self._gauge_cache: dict[tuple[int, str], list[tuple[Any, GaugeSeries]]] = {}

    def part(self, resource: dict[str, Any], rank: Any) -> Part:
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
                part = self.parts[key] = Part(identity, rank)
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
        if kind == TRAINING_VALUES:  # every value of record_training_metrics (docs/spans.md)
            if self.series:
                _logged_values(telemetry, record)
            return
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


def _logged_values(telemetry: RankTelemetry, record: dict[str, Any]) -> None:
    """Adds a ``training_values`` record's values to ``telemetry.logged``: numbers, and the
    strings strict JSON writes for NaN and the infinities; anything else is skipped.

    Raises:
        ValueError, TypeError: a record of the wrong shape (counted as a bad line).
    """
    time_ns = int(record["time_ns"])
    step = record.get("step")
    if step is not None and (type(step) is not int):
        raise ValueError(f"a step of training values is not a whole number: {step!r}")
    telemetry.see(time_ns)
    logged = telemetry.logged
    for name, value in dict(record["values"]).items():
        if type(value) is int or type(value) is float:
            number = float(value)
        elif value in _NONFINITE:
            number = float(value)
        else:
            continue
        points = logged.get(name)
        if points is None:
            points = logged[name] = []
        points.append((step, time_ns, number))


_NONFINITE = frozenset({"NaN", "Infinity", "-Infinity"})


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


def _add_sample(part: Part, metrics: list[dict[str, Any]]) -> None:
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


def merge_rank(target: RankTelemetry, source: RankTelemetry, signal: str) -> None:
    target.gauges.update(source.gauges)
    for name, points in source.logged.items():
        target.logged.setdefault(name, []).extend(points)
    target.counters.update(source.counters)
    target.histograms.update(source.histograms)
    if source.resource and (signal == "metrics" or not target.resource):
        target.resource = source.resource
    for time_ns in (source.first_ns, source.last_ns):
        if time_ns is not None:
            target.see(time_ns)


# -- reading a file ------------------------------------------------------------------------


def read_file(file: RunFile, purpose: str) -> tuple[FileStats, dict[Key, Part]]:
    """Reads one file for ``purpose`` (:data:`PURPOSES`): its stats and the records of each
    process in it. The unit of work of a worker process; never raises."""
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
