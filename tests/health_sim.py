"""A scripted rank for the run-health tests: the real ledger on a fake clock, read at exact
export times into the samples that the metrics files would hold, and the phase spans that the
default (or per-step) span groups would write. Every duration is given by the script, so the
tests compute what goodput must be by hand; and the files such a process leaves (the real SDK's
OTLP-JSON metrics, span lines as docs/spans.md writes them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from otel_training.health import ledger as L
from otel_training.health.evidence import PhaseSpan, Process, Sample

PHASE_SPAN_NAMES = {
    L.CHECKPOINT_LOAD: "megatron.checkpoint.load",
    L.CHECKPOINT_SAVE: "megatron.checkpoint.save",
    L.EVALUATE: "megatron.evaluate",
}


class FakeClock:
    """Wall and monotonic time that move only when told (the monotonic one 1e6 s behind)."""

    def __init__(self, unix_s: float) -> None:
        self.t = unix_s

    def unix(self) -> float:
        return self.t

    def perf(self) -> float:
        return self.t - 1e6


class SimRank:
    """One process of one rank: ``phase()`` and ``step()`` move its clock, exporting a sample
    whenever an export time passes (every ``export_s`` from its creation).

    Args:
        created_s: Its process creation time, Unix seconds.
        rank: ``dl.rank``.
        attempt: ``dl.run.attempt`` (``None``: not known).
        export_s: Seconds between metric exports.
        step_spans: Write an iteration span per step (the per_step groups), besides the
            first-iteration, checkpoint and evaluate spans of the default groups.
        run_id: ``dl.run.id``.
    """

    def __init__(
        self,
        created_s: float,
        rank: int = 0,
        attempt: int | None = 0,
        *,
        export_s: float = 5.0,
        step_spans: bool = True,
        run_id: str = "run",
        pipeline_rank: int | None = None,
    ) -> None:
        self.clock = FakeClock(created_s)
        self.ledger = L.Ledger(created_s, perf=self.clock.perf, unix=self.clock.unix)
        resource = {"dl.rank": rank, "dl.run.id": run_id}
        if pipeline_rank is not None:
            resource["dl.pipeline_parallel.rank"] = pipeline_rank
        self.process = Process(
            rank=rank, run_id=run_id, attempt=attempt, created_s=created_s, resource=resource
        )
        self.export_s = export_s
        self.next_export = created_s + export_s
        self.step_spans = step_spans
        self.first = True
        self.iteration = 0
        self.process.see(created_s)

    @property
    def now(self) -> float:
        return self.clock.t

    def sample(self) -> Sample:
        r = self.ledger.read()
        sample = Sample(
            time_s=self.clock.t,
            phase_s=tuple(r.phase_time_s[p] for p in L.PHASES),
            open_phase=r.open_phase,
            open_s=r.open_s,
            iteration=r.iteration,
            progress_s=r.progress_unix_s,
            saved_iteration=r.saved_iteration,
            loaded_iteration=r.loaded_iteration,
            checkpoint_age_s=r.checkpoint_age_s,
        )
        self.process.samples.append(sample)
        self.process.see(sample.time_s)
        return sample

    def advance(self, seconds: float) -> None:
        """Moves the clock, exporting at each export time passed."""
        end = self.clock.t + seconds
        while self.next_export <= end:
            self.clock.t = self.next_export
            self.sample()
            self.next_export += self.export_s
        self.clock.t = end

    def phase(self, code: int, seconds: float, iteration: int | None = None) -> None:
        """A phase of ``seconds`` (a checkpoint save/load or an evaluation also as a span)."""
        start = self.clock.t
        token = self.ledger.enter(code)
        self.advance(seconds)
        self.ledger.exit(token, code, iteration)
        if code in PHASE_SPAN_NAMES:
            self.span(PHASE_SPAN_NAMES[code], code, start, self.clock.t, iteration)

    def span(self, name: str, code: int, start: float, end: float | None, iteration=None) -> None:
        self.process.spans.append(PhaseSpan(name, code, start, end, iteration))
        self.process.see(start if end is None else end)

    def step(
        self,
        data: float = 0.02,
        compute: float = 0.06,
        communication: float = 0.005,
        optimizer: float = 0.01,
        extra_first: float = 0.505,
    ) -> None:
        """One optimizer step (the first of the process ``extra_first`` longer in compute)."""
        self.iteration += 1
        start = self.clock.t
        token = self.ledger.enter(L.ITERATION)
        self.phase(L.DATA_LOADING, data)
        fb = self.ledger.enter(L.FORWARD_BACKWARD)
        self.advance(compute + (extra_first if self.first else 0.0))
        self.phase(L.COMMUNICATION, communication)
        self.ledger.exit(fb, L.FORWARD_BACKWARD)
        self.phase(L.OPTIMIZER, optimizer)
        self.ledger.exit(token, L.ITERATION, self.iteration)
        end, iteration = self.clock.t, self.iteration
        if self.first:
            self.span("megatron.train.first_iteration", L.WARMUP, start, end, iteration)
        elif self.step_spans:
            self.span("megatron.train.iteration", L.ITERATION, start, end, iteration)
        self.first = False

    def begin_step(self, seconds: float) -> None:
        """A step that is cut after ``seconds`` (the process dies inside it)."""
        self.iteration += 1
        self.ledger.enter(L.ITERATION)
        self.ledger.enter(L.FORWARD_BACKWARD)
        if self.step_spans:
            self.span("megatron.train.iteration", L.ITERATION, self.clock.t, None, self.iteration)
            self.process.open_spans += 1
        self.advance(seconds)

    def end(self, *, evidence: bool = True) -> Process:
        """The process ends now: its last evidence of life is now (``evidence``) or its last
        record."""
        self.process.alive_s = self.clock.t if evidence else self.process.last_s
        if evidence:
            self.process.see(self.clock.t)
        return self.process


def job_resource(
    rank: int, attempt: int | None, created: str | None, run: str, job: str
) -> dict[str, Any]:
    """The resource of one process of job ``job`` (``created``: ISO 8601, or ``None`` as
    older versions wrote span lines)."""
    found: dict[str, Any] = {"dl.rank": rank, "dl.run.id": run, "dl.job.id": job}
    found["dl.world_size"] = 2
    if attempt is not None:
        found["dl.run.attempt"] = attempt
    if created is not None:
        found["process.creation.time"] = created
    return found


def simulated(created: float, steps: int = 5) -> SimRank:
    """A process that starts, runs ``steps`` steps and saves a checkpoint."""
    sim = SimRank(created)
    sim.advance(1.0)
    for _ in range(steps):
        sim.step()
    sim.phase(L.CHECKPOINT_SAVE, 0.2, sim.iteration)
    return sim


def write_process(
    directory: Path,
    sim: SimRank,
    attrs: dict,
    *,
    exports: int = 3,
    before_export: Callable[[int], None] | None = None,
) -> None:
    """The sim's ledger exported ``exports`` times by the real SDK into metrics-rank{R}.jsonl,
    its phase spans as span lines into spans-rank{R}.jsonl (both appended).
    ``before_export(i)`` runs before export ``i`` (to move the sim on between exports: the
    samples then differ, as a straggler's windows need)."""
    from opentelemetry.exporter.otlp.json.file import FileMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    from otel_training.health.metrics import observe_ledger

    directory.mkdir(parents=True, exist_ok=True)
    rank = attrs["dl.rank"]
    exporter = FileMetricExporter(directory / f"metrics-rank{rank}.jsonl")
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=10**9)
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create(attrs))
    observe_ledger(provider.get_meter("otel_training"), source=lambda: sim.ledger)
    try:
        for i in range(exports):
            if before_export is not None:
                before_export(i)
            provider.force_flush()
    finally:
        provider.shutdown()
    span_resource = {k: v for k, v in attrs.items() if not k.startswith("telemetry.")}
    with open(directory / f"spans-rank{rank}.jsonl", "a") as handle:
        for i, span in enumerate(sim.process.spans):
            line = {
                "record": "span_end" if span.end_s is not None else "span_start",
                "name": span.name,
                "trace_id": "ab" * 16,
                "span_id": f"{rank:04x}{attrs.get('dl.run.attempt') or 0:04x}{i:08x}",
                "parent_span_id": None,
                "start_time_ns": int(span.start_s * 1e9),
                "attributes": {"megatron.iteration": span.iteration},
                "rank": rank,
                "resource": span_resource,
            }
            if span.end_s is not None:
                line.update(end_time_ns=int(span.end_s * 1e9), status="UNSET", events=[])
            handle.write(json.dumps(line) + "\n")
