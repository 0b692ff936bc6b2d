"""What one run left on disk, in memory: metric series per rank, spans, files, notes.

Built by :func:`otel_training.report.reader.load_job` (and ``load_run``); read by the report,
the trace and run health.
All times are nanoseconds since the Unix epoch (``*_ns``), as OpenTelemetry writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otel_training.report.attempts import job_of
from otel_training.semconv.attributes import DL_WORLD_SIZE

if TYPE_CHECKING:
    from otel_training.health.evidence import Process

__all__ = [
    "TRUNCATED_ATTRIBUTE",
    "Attributes",
    "ClockOffset",
    "CounterSeries",
    "FileStats",
    "Gap",
    "GaugeSeries",
    "HistogramSeries",
    "Job",
    "RankTelemetry",
    "Run",
    "Span",
]

TRUNCATED_ATTRIBUTE = "otel_training.span.truncated"
"""Boolean span attribute: the span was still open when its process exited (or got SIGTERM)
and was ended then, so its end is not the end of the phase."""

Attributes = tuple[tuple[str, Any], ...]
"""Point attributes as sorted ``(key, value)`` pairs (hashable: a series key)."""


@dataclass
class FileStats:
    """What reading one file found.

    Attributes:
        path: The file.
        signal: ``metrics``, ``traces``, ``spans`` or ``logs``.
        rank: The rank in the file name.
        size_bytes: Its size when read.
        mtime_s: Its modification time, seconds since the Unix epoch.
        lines: Lines read (blank ones not counted).
        torn_last_line: The last line is not a whole JSON document (a killed run, a full disk,
            or a run still writing it); it was skipped.
        bad_lines: Other lines that are not JSON or not of the expected shape; skipped.
        error: Why the file could not be read at all, or ``None``.
        skipped: Why the file was not read (a traces file whose spans the span lines
            already hold completely), or ``None``.
    """

    path: Path
    signal: str
    rank: int
    size_bytes: int = 0
    mtime_s: float = 0.0
    lines: int = 0
    torn_last_line: bool = False
    bad_lines: int = 0
    error: str | None = None
    skipped: str | None = None


@dataclass
class GaugeSeries:
    """Values of one gauge (one attribute set) on one rank, in export order.

    Attributes:
        name: The metric name (``megatron.training.loss``...).
        attributes: The point attributes.
        times_ns: Export time of each value.
        values: The values (as exported: a gauge repeats its last value at every export).
    """

    name: str
    attributes: Attributes
    times_ns: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


@dataclass
class CounterSeries:
    """A monotonic sum (one attribute set) on one rank, as running totals.

    Delta points are added up and cumulative points kept (a restart of the cumulative total,
    seen as a new start time with a smaller value, continues from the previous total), so
    ``totals`` is the count since the first export whatever the temporality.

    Attributes:
        name: The metric name.
        attributes: The point attributes.
        temporality: ``"cumulative"`` or ``"delta"`` as exported.
        times_ns: Export time of each point.
        totals: Running total at each export.
    """

    name: str
    attributes: Attributes
    temporality: str = "cumulative"
    times_ns: list[int] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)

    @property
    def total(self) -> float:
        """The last running total (0 when there is no point)."""
        return self.totals[-1] if self.totals else 0.0


@dataclass
class HistogramSeries:
    """An explicit-bucket histogram (one attribute set, one set of bounds) on one rank.

    Each export is kept both as the counts of its own interval (``delta_*``) and as running
    totals (``cumulative_*``), derived from whichever temporality was exported: cumulative
    points are differenced (a reset, seen as a new start time or a shrinking count, starts a
    new total that is added on), delta points are added up.

    Attributes:
        name: The metric name (``megatron.training.step_duration_ms``).
        attributes: The point attributes.
        bounds: The explicit bucket bounds, ascending (OTLP ``explicitBounds``); bucket ``i``
            holds values in ``(bounds[i-1], bounds[i]]``, the last one ``(bounds[-1], +Inf)``.
        temporality: ``"cumulative"`` or ``"delta"`` as exported.
        times_ns: Export time of each point.
        delta_counts: Observations in each export's interval.
        delta_sums: Sum of the observations in each export's interval.
        delta_buckets: Per export, ``len(bounds) + 1`` bucket counts of its interval.
        cumulative_counts: Observations up to each export.
        cumulative_sums: Sum of the observations up to each export.
        cumulative_buckets: Bucket counts up to the last export.
        min: Smallest observation seen (``None``: not exported).
        max: Largest observation seen (``None``: not exported).
    """

    name: str
    attributes: Attributes
    bounds: tuple[float, ...]
    temporality: str = "cumulative"
    times_ns: list[int] = field(default_factory=list)
    delta_counts: list[int] = field(default_factory=list)
    delta_sums: list[float] = field(default_factory=list)
    delta_buckets: list[list[int]] = field(default_factory=list)
    cumulative_counts: list[int] = field(default_factory=list)
    cumulative_sums: list[float] = field(default_factory=list)
    cumulative_buckets: list[int] = field(default_factory=list)
    min: float | None = None
    max: float | None = None


@dataclass
class Gap:
    """What one rank's writer could not write to one file, and when (``gaps-rank{R}.jsonl``).

    Attributes:
        rank: The rank.
        file: The file's name (``metrics-rank0.jsonl``...).
        from_ns: When writing started to fail (``None``: the file was removed, not failing).
        to_ns: When it worked again (or the process ended).
        lost_lines: Lines that could not be written.
        lost_records: Spans or log records in them (0: not counted, for metrics).
        gone_lines: Lines the file held when its directory was removed.
        reason: Why (``ENOSPC: No space left on device``...).
    """

    rank: int
    file: str
    from_ns: int | None
    to_ns: int | None
    lost_lines: int = 0
    lost_records: int = 0
    gone_lines: int = 0
    reason: str = ""


@dataclass(slots=True)
class Span:
    """One span of one rank, joined from its JSON lines and/or its OTLP-JSON export.

    Attributes:
        rank: The rank that recorded it.
        name: The span name.
        trace_id: 32 lower-case hex digits.
        span_id: 16 lower-case hex digits.
        parent_span_id: 16 hex digits, or ``None`` for a root span.
        start_ns: Start time.
        end_ns: End time; ``None`` when only its start was written (the span never ended:
            the process still runs, hung or was killed).
        status: ``UNSET``, ``OK`` or ``ERROR``.
        status_description: ``Type: message`` of an error, or ``None``.
        attributes: All attributes known (those of the end record when there is one).
        events: ``{"name", "time_ns", "attributes"}`` each.
        source: ``"spans"`` (JSON lines), ``"traces"`` (OTLP-JSON) or ``"spans+traces"``.
    """

    rank: int
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    end_ns: int | None = None
    status: str = "UNSET"
    status_description: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    source: str = "spans"

    @property
    def open(self) -> bool:
        """Only its start is known."""
        return self.end_ns is None

    @property
    def truncated(self) -> bool:
        """It never ended, or it was ended at exit (``otel_training.span.truncated``)."""
        return self.end_ns is None or self.attributes.get(TRUNCATED_ATTRIBUTE) is True

    @property
    def failed(self) -> bool:
        """Its status is ``ERROR``."""
        return self.status == "ERROR"


@dataclass
class RankTelemetry:
    """The metrics of one rank.

    Attributes:
        rank: The rank.
        resource: Resource attributes of its last export (``dl.rank``, ``service.name``...).
        gauges: Gauge series by ``(name, attributes)``.
        counters: Monotonic-sum series by ``(name, attributes)``.
        histograms: Histogram series by ``(name, attributes, bounds)``.
        first_ns: Earliest time in its metrics and spans (``None``: nothing).
        last_ns: Latest time in its metrics and spans (``None``: nothing).
        logged: Every value given to ``record_training_metrics``, by metric name: ``(step,
            time_ns, value)`` per call in the order of the lines, from the ``training_values``
            records of the span lines (``step`` ``None`` where no step was known); empty for
            files written without them (older versions, OTLP only).
    """

    rank: int
    resource: dict[str, Any] = field(default_factory=dict)
    gauges: dict[tuple[str, Attributes], GaugeSeries] = field(default_factory=dict)
    counters: dict[tuple[str, Attributes], CounterSeries] = field(default_factory=dict)
    histograms: dict[tuple[str, Attributes, tuple[float, ...]], HistogramSeries] = field(
        default_factory=dict
    )
    first_ns: int | None = None
    last_ns: int | None = None
    logged: dict[str, list[tuple[int | None, int, float]]] = field(default_factory=dict)

    def see(self, time_ns: int) -> None:
        """Widens ``first_ns``/``last_ns`` to include ``time_ns``."""
        if self.first_ns is None or time_ns < self.first_ns:
            self.first_ns = time_ns
        if self.last_ns is None or time_ns > self.last_ns:
            self.last_ns = time_ns

    def gauge(self, name: str) -> list[GaugeSeries]:
        """The gauge series of metric ``name``, any attributes."""
        return [s for (n, _), s in self.gauges.items() if n == name]

    def counter(self, name: str) -> list[CounterSeries]:
        """The counter series of metric ``name``, any attributes."""
        return [s for (n, _), s in self.counters.items() if n == name]

    def histogram(self, name: str) -> list[HistogramSeries]:
        """The histogram series of metric ``name``, any attributes and bounds."""
        return [s for (n, _, _), s in self.histograms.items() if n == name]


@dataclass(frozen=True)
class ClockOffset:
    """A rank whose clock disagrees with the others', as
    :func:`otel_training.report.clocks.clock_offsets` measures it.

    Attributes:
        rank: The rank.
        offset_ms: By how much, in ms; positive: ahead (its records later than the others').
        span_name: The span whose edge it was measured at.
        edge: ``start`` or ``end``.
        iterations: Iterations the median was taken over.
        reference: ``None`` when measured against the median of three ranks or more, else
            the rank it was measured against (with two ranks, who is off cannot be told).
    """

    rank: int
    offset_ms: float
    span_name: str
    edge: str
    iterations: int
    reference: int | None

    @property
    def note(self) -> str:
        """The sentence the report and the trace show."""
        against = "the other ranks'" if self.reference is None else f"rank {self.reference}'s"
        return (
            f"Rank {self.rank}'s clock seems {abs(self.offset_ms):,.0f} ms "
            f"{'ahead of' if self.offset_ms > 0 else 'behind'} {against} (measured at the "
            f"{self.edge} of {self.span_name}, which all ranks of a synchronous job reach "
            f"together, median over {self.iterations} iterations): its records are shown as "
            "they were stamped, not shifted."
        )


@dataclass
class Run:
    """One run (one attempt of a job): every rank's metrics and spans, the files read and what
    was odd about them.

    Attributes:
        directory: The run directory read.
        files: What reading each file found.
        ranks: Metrics per rank (every rank seen in any file, even without metrics).
        spans: Spans of every rank, by start time.
        notes: Plain sentences for a person: missing files, torn lines, other runs in the same
            files, spans that never ended, a run that seems to be still in progress.
        run_id: ``dl.run.id`` of the resource (``None``: not recorded).
        other_run_ids: Run ids also found in these files (older runs appended to the same
            files in the flat layout), skipped.
        job_id: ``dl.job.id`` (or Megatron-LM's name for it), the same for every attempt of
            the job (``None``: not recorded).
        attempt: The attempt number (``dl.run.attempt``, or Megatron-LM's counters), or
            ``None``.
        attempt_order: What attempts sort by (see
            :class:`otel_training.report.attempts.ProcessIdentity`), or ``None``.
        created_s: The earliest ``process.creation.time`` of its ranks, Unix seconds, or
            ``None``.
        same_id_runs: Other runs in these files under the same run id (processes of the same
            ranks started again), skipped by ``load_run``.
        gaps: What the writers could not write (:class:`Gap`), by time.
        clock_offsets: Ranks whose clock disagrees with the other ranks', by how much,
            measured from the data by :mod:`otel_training.report.clocks` (:class:`ClockOffset`);
            nothing is shifted by it.
        processes: What run health reads of each of its processes, by rank
            (:class:`otel_training.health.evidence.Process`), from the same reading.
    """

    directory: Path
    files: list[FileStats] = field(default_factory=list)
    ranks: dict[int, RankTelemetry] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_id: str | None = None
    other_run_ids: list[str] = field(default_factory=list)
    job_id: str | None = None
    attempt: int | None = None
    attempt_order: tuple[int, ...] | None = None
    created_s: float | None = None
    same_id_runs: int = 0
    gaps: list[Gap] = field(default_factory=list)
    clock_offsets: list[ClockOffset] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)

    @property
    def clock_offsets_ms(self) -> dict[int, float]:
        """``clock_offsets`` as rank -> offset in ms (positive: ahead)."""
        return {o.rank: o.offset_ms for o in self.clock_offsets}

    @property
    def attempt_label(self) -> str:
        """``attempt N`` from the recorded attempt, ``requeue R, restart T`` from Megatron-LM's
        two counters, else ``""`` (see :attr:`Job.labels` for runs without a counter)."""
        if self.attempt is not None:
            return f"attempt {self.attempt}"
        if self.attempt_order is not None and len(self.attempt_order) == 2:
            return f"requeue {self.attempt_order[0]}, restart {self.attempt_order[1]}"
        return ""

    @property
    def resource(self) -> Mapping[str, Any]:
        """The resource of the lowest rank that has one (empty when none has)."""
        for rank in sorted(self.ranks):
            if self.ranks[rank].resource:
                return self.ranks[rank].resource
        return {}

    @property
    def service_name(self) -> str | None:
        """``service.name`` of the resource."""
        value = self.resource.get("service.name")
        return None if value is None else str(value)

    @property
    def world_size(self) -> int | None:
        """``dl.world_size`` of the resource, else the number of ranks seen."""
        value = self.resource.get(DL_WORLD_SIZE)
        if isinstance(value, int):
            return value
        return len(self.ranks) or None

    @property
    def first_ns(self) -> int | None:
        """Earliest time of any rank (``None``: the run holds nothing)."""
        times = [r.first_ns for r in self.ranks.values() if r.first_ns is not None]
        return min(times) if times else None

    @property
    def last_ns(self) -> int | None:
        """Latest time of any rank (``None``: the run holds nothing)."""
        times = [r.last_ns for r in self.ranks.values() if r.last_ns is not None]
        return max(times) if times else None

    def span_end_ns(self, span: Span) -> int:
        """``span.end_ns``, or for a span that never ended the last time seen on its rank."""
        if span.end_ns is not None:
            return span.end_ns
        rank = self.ranks.get(span.rank)
        last = rank.last_ns if rank is not None and rank.last_ns is not None else span.start_ns
        return max(last, span.start_ns)

    @property
    def is_empty(self) -> bool:
        """No metric point and no span was read."""
        return not self.spans and not any(
            r.gauges or r.counters or r.histograms for r in self.ranks.values()
        )


@dataclass
class Job:
    """Every attempt of one training job, in the order they ran, never merged.

    Attributes:
        job_id: ``dl.job.id`` of the attempts (``None``: not recorded; then the job is the
            runs of one run id).
        runs: The attempts, ordered by attempt number, else by when their processes started
            (:func:`otel_training.report.reader.order_runs`).
        directories: The run directories read.
        notes: Plain sentences about the job as a whole (how the attempts were found and
            ordered); each run has its own notes.
        ordered_by: ``"attempt"``, ``"process.creation.time"`` or ``"first record"``.
        key: The job as :func:`otel_training.report.attempts.job_of` names it (``job_id``,
            else the run id less ``-a{N}``); ``None`` when the files name neither.
        other_jobs: The jobs (keys) of other runs in the same files, left out.
    """

    job_id: str | None
    runs: list[Run] = field(default_factory=list)
    directories: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ordered_by: str = "attempt"
    key: str | None = None
    other_jobs: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, source: Run | Job) -> Job:
        """``source`` itself when it is a job, else the job of that one run."""
        if isinstance(source, Job):
            return source
        return cls(
            source.job_id,
            [source],
            [source.directory],
            key=job_of(source.job_id, source.run_id),
        )

    @property
    def labels(self) -> list[str]:
        """A label per run, in order: its attempt (``attempt 1``) when recorded, else its
        position (``run 2 of 3``)."""
        total = len(self.runs)
        return [
            run.attempt_label or f"run {i} of {total}" for i, run in enumerate(self.runs, start=1)
        ]

    @property
    def latest(self) -> Run:
        """The last attempt."""
        return self.runs[-1]
