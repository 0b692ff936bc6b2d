"""What a job left on disk, per process: the data that goodput, hangs and stragglers are
computed from (``docs/health.md``).

:mod:`otel_training.report.reader` fills these from the embedded default's files, in the same
pass that reads them for the report: per process (one rank of one attempt), the ledger's
``dl.training.*`` at each metric export (:class:`Sample`), its phase spans (:class:`PhaseSpan`),
the ``stacks`` records of a rank that suspected a hang, and its last evidence of life.

**Processes** are told apart by their Resource (run id, ``service.instance.id``, attempt,
``process.creation.time``, rank; :mod:`otel_training.report.reader` says how), whether the
attempts of a job wrote separate run directories (``{run}-a{attempt}``) or appended to the same
files.

**Attempts** (:func:`attempts`): the processes with the same ``dl.run.attempt`` (without it,
of one run id), split into the cohorts that trained together (:func:`cohorts`: a rank seen
twice, another world size, or a start after all had ended begins a new one); ordered by their
first ``process.creation.time``.

**The job**: the processes whose job id is the same, else whose run id is the same without
its ``-a{attempt}`` suffix (:func:`otel_training.report.attempts.job_key`, which also reads
each process's identity and creation time). Nothing here raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_training.health import ledger as _ledger
from otel_training.health.record import ProgressRecord

__all__ = [
    "DEFAULT_EXPORT_INTERVAL_S",
    "KEPT_PHASES",
    "Attempt",
    "Job",
    "PhaseSpan",
    "Process",
    "Sample",
    "absorb_record",
    "attempts",
    "process_of_record",
]

PHASES = _ledger.PHASES
#: The phases whose spans a process's :attr:`Process.spans` holds (those of the step's inner
#: phases are left out: the ledger has their time).
KEPT_PHASES = frozenset(
    {
        _ledger.STARTUP,
        _ledger.CHECKPOINT_LOAD,
        _ledger.CHECKPOINT_SAVE,
        _ledger.EVALUATE,
        _ledger.WARMUP,
        _ledger.ITERATION,
    }
)
#: Default export interval of the embedded default's metrics, seconds.
DEFAULT_EXPORT_INTERVAL_S = 5.0


@dataclass(slots=True)
class Sample:
    """The ledger of one process at one metric export.

    Attributes:
        time_s: Export time, Unix seconds.
        phase_s: Cumulative seconds per phase (:data:`PHASES` order), or ``None`` when the
            export has no ``dl.training.phase.time`` (an older version).
        open_phase: The innermost phase then (``dl.training.phase.elapsed > 0``), or ``None``.
        open_s: How long it had been open, seconds.
        iteration: ``dl.training.progress.iteration``, or ``None``.
        progress_s: ``dl.training.progress.timestamp``, or ``None``.
        saved_iteration: ``dl.training.checkpoint.iteration{operation=save}``, or ``None``.
        loaded_iteration: ``dl.training.checkpoint.iteration{operation=load}``, or ``None``.
        checkpoint_age_s: ``dl.training.checkpoint.age``, or ``None``.
        sm_clock_hz: Mean ``dl.gpu.clock.speed{dl.gpu.clock.domain=sm}`` of its devices.
        temperature_c: Mean ``hw.temperature`` of its devices.
    """

    time_s: float
    phase_s: tuple[float, ...] | None = None
    open_phase: str | None = None
    open_s: float = 0.0
    iteration: int | None = None
    progress_s: float | None = None
    saved_iteration: int | None = None
    loaded_iteration: int | None = None
    checkpoint_age_s: float | None = None
    sm_clock_hz: float | None = None
    temperature_c: float | None = None


@dataclass(slots=True)
class PhaseSpan:
    """A span of one of the ledger's phases (:data:`otel_training.health.ledger.PHASE_OF_SPAN`).

    Attributes:
        name: The span name.
        phase: Its ledger code (``ledger.ITERATION`` for an iteration).
        start_s: Start, Unix seconds.
        end_s: End, or ``None`` when only its start line was written (never ended).
        iteration: ``megatron.iteration``, or ``None``.
        failed: Status ERROR not from truncation (the phase raised).
        truncated: Ended at exit or on a signal (``otel_training.span.truncated``).
    """

    name: str
    phase: int
    start_s: float
    end_s: float | None = None
    iteration: int | None = None
    failed: bool = False
    truncated: bool = False


@dataclass
class Process:
    """What one process (one rank of one attempt) left in the files.

    Attributes:
        rank: ``dl.rank``.
        run_id: ``dl.run.id``.
        job_id: ``dl.job.id``, or ``None``.
        attempt: ``dl.run.attempt``, or ``None``.
        created_s: ``process.creation.time``, Unix seconds, or ``None``.
        resource: Its resource attributes (the last seen).
        samples: Its ledger at each export, by time.
        spans: Its phase spans, by start.
        stacks: Its ``stacks`` records (thread stacks written when it suspected a hang).
        first_s: Its earliest record, Unix seconds.
        last_s: Its latest record (an export, a span start or end).
        alive_s: The last evidence of life: ``last_s``, or the modification time of its files
            when that is later by at most one export interval plus a second.
        open_spans: Spans with a start line and no end line.
        signal: ``SIGTERM`` (or another reason) when spans were truncated on a signal.
        directories: The run directories its lines are in.
        record: Its progress record (the ledger at its last transition), or ``None``
            (an older version, no run directory, or a record that could not be created).
        run_raised_s: When its training run (the span ``megatron.train``) last ended by
            raising (status ERROR, not truncated), Unix seconds: an exception, a
            ``KeyboardInterrupt``, left the run, between steps as well as inside one; ``None``
            when none did or no run span was exported.
    """

    rank: int
    run_id: str | None = None
    job_id: str | None = None
    attempt: int | None = None
    created_s: float | None = None
    resource: dict[str, Any] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    spans: list[PhaseSpan] = field(default_factory=list)
    stacks: list[dict[str, Any]] = field(default_factory=list)
    first_s: float | None = None
    last_s: float | None = None
    alive_s: float | None = None
    open_spans: int = 0
    signal: str | None = None
    directories: set[Path] = field(default_factory=set)
    record: ProgressRecord | None = None
    run_raised_s: float | None = None

    @property
    def pipeline_rank(self) -> int | None:
        """``dl.pipeline_parallel.rank``, or ``None``."""
        value = self.resource.get("dl.pipeline_parallel.rank")
        return value if isinstance(value, int) else None

    @property
    def start_s(self) -> float | None:
        """``created_s``, else the first record."""
        return self.created_s if self.created_s is not None else self.first_s

    @property
    def export_interval_s(self) -> float:
        """The median time between its exports (the default, 5 s, with fewer than 3)."""
        times = [s.time_s for s in self.samples]
        gaps = sorted(b - a for a, b in zip(times, times[1:]) if b > a)
        return gaps[len(gaps) // 2] if len(gaps) >= 2 else DEFAULT_EXPORT_INTERVAL_S

    @property
    def ledger(self) -> list[Sample]:
        """The samples that carry the ledger's phase times."""
        return [s for s in self.samples if s.phase_s is not None]

    def see(self, time_s: float) -> None:
        """Widens ``first_s``/``last_s`` to include ``time_s``."""
        if self.first_s is None or time_s < self.first_s:
            self.first_s = time_s
        if self.last_s is None or time_s > self.last_s:
            self.last_s = time_s


@dataclass
class Attempt:
    """The processes of one attempt (incarnation) of the job.

    Attributes:
        number: ``dl.run.attempt``, else its position among the job's attempts (from 0).
        numbered: ``number`` is ``dl.run.attempt`` (not a position).
        processes: One per rank as a rule, by rank.
        cohort: Its place among the cohorts of one ``dl.run.attempt`` (0 for the first): an
            elastic membership change starts a new cohort without a new attempt number.
    """

    number: int
    numbered: bool
    processes: list[Process]
    cohort: int = 0

    @property
    def label(self) -> str:
        """How a person reads it: ``3``, or ``3.1`` for the second cohort of attempt 3."""
        return f"{self.number}.{self.cohort}" if self.cohort else str(self.number)

    @property
    def start_s(self) -> float:
        """The first process start (``process.creation.time``)."""
        return min(p.start_s for p in self.processes if p.start_s is not None)

    @property
    def end_s(self) -> float:
        """The last evidence of life of any of its processes."""
        return max(p.alive_s or p.last_s or p.start_s or 0.0 for p in self.processes)

    @property
    def run_ids(self) -> list[str]:
        """Its run ids (one as a rule)."""
        return sorted({p.run_id for p in self.processes if p.run_id is not None})


@dataclass
class Job:
    """All processes of one job, and what was odd about its files.

    Attributes:
        job_id: ``dl.job.id``, else the run id without its attempt suffix; ``None`` when no
            file named either.
        directories: The run directories read.
        processes: Every process found.
        notes: Plain sentences for a person.
        bytes_read: Bytes of files read.
    """

    job_id: str | None
    directories: list[Path]
    processes: list[Process] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0


def attempts(processes: Iterable[Process]) -> list[Attempt]:
    """The job's attempts (the module docstring), ordered by their first process start: the
    processes of one ``dl.run.attempt`` (else of one run id), split into their cohorts
    (:func:`cohorts`)."""
    numbered: dict[int, list[Process]] = {}
    unnumbered: dict[str | None, list[Process]] = {}
    for process in processes:
        if process.start_s is None:
            continue
        if process.attempt is not None:
            numbered.setdefault(process.attempt, []).append(process)
        else:
            unnumbered.setdefault(process.run_id, []).append(process)
    groups: list[tuple[int | None, int, list[Process]]] = [
        (number, k, cohort)
        for number, group in numbered.items()
        for k, cohort in enumerate(cohorts(group))
    ] + [(None, 0, cohort) for group in unnumbered.values() for cohort in cohorts(group)]
    groups.sort(key=lambda g: min(p.start_s or 0.0 for p in g[2]))
    result = []
    for position, (number, k, group) in enumerate(groups):
        group.sort(key=lambda p: (p.rank, p.start_s or 0.0))
        numbered_ = number is not None
        result.append(Attempt(number if numbered_ else position, numbered_, group, k))
    return result


def cohorts(processes: Iterable[Process]) -> list[list[Process]]:
    """``processes`` (of one attempt number, or of one run id without one) split into the
    cohorts that trained together, in the order of their starts: a process begins a new cohort
    when its rank is already in the current one (a restart, or an elastic rendezvous that kept
    the restart count), when its ``dl.world_size`` differs from the cohort's (an elastic shrink
    or grow), or when it started after every process of the cohort had ended."""
    found: list[list[Process]] = []
    ranks: set[int] = set()
    world: object = None
    end = 0.0
    for process in sorted(processes, key=lambda p: (p.start_s or 0.0, p.rank)):
        size = process.resource.get("dl.world_size")
        start = process.start_s or 0.0
        if (
            not found
            or process.rank in ranks
            or (size is not None and world is not None and size != world)
            or start > end
        ):
            found.append([])
            ranks, world, end = set(), None, 0.0
        found[-1].append(process)
        ranks.add(process.rank)
        world = size if size is not None else world
        end = max(end, process.alive_s or process.last_s or start)
    return found


def absorb_record(process: Process, record: ProgressRecord) -> None:
    """Adds ``record`` (``process``'s progress record) to what ``process`` left: a sample of
    its ledger at the record's last transition when that is later than its last export, and
    evidence of life until then (``docs/health.md``, "The progress record")."""
    process.record = record
    if process.signal is None and record.signal is not None:  # no truncated span said it
        process.signal = record.signal
    sample = Sample(
        time_s=record.time_s,
        phase_s=record.phase_s,
        open_phase=PHASES[record.open_phase],
        open_s=record.open_s,
        iteration=record.iteration,
        progress_s=record.progress_s,
        saved_iteration=record.saved_iteration,
        loaded_iteration=record.loaded_iteration,
        checkpoint_age_s=None if record.safe_s is None else max(0.0, record.time_s - record.safe_s),
    )
    ledger = process.ledger
    if not ledger or record.time_s > ledger[-1].time_s:
        process.samples.append(sample)
        process.samples.sort(key=lambda s: s.time_s)
    process.see(record.time_s)
    process.alive_s = max(process.alive_s or 0.0, record.time_s)


def process_of_record(record: ProgressRecord) -> Process:
    """A process known only by its progress record (killed before its first export or span
    line): its identity from the record, its ledger's one sample, alive from its creation to
    the record's last transition."""
    identity = record.identity

    def text(key: str) -> str | None:
        value = identity.get(key)
        return value if isinstance(value, str) and value else None

    rank, attempt = identity.get("dl.rank"), identity.get("dl.run.attempt")
    resource = {k: v for k, v in identity.items() if k != "created_s" and v is not None}
    process = Process(
        rank=rank if isinstance(rank, int) else 0,
        run_id=text("dl.run.id"),
        job_id=text("dl.job.id"),
        attempt=attempt if isinstance(attempt, int) else None,
        created_s=record.created_s,
        resource=resource,
    )
    process.see(record.created_s)
    absorb_record(process, record)
    return process
