"""The numbers at the top of a report: who ran, how long, how far, the last values.

The eight Megatron-LM training metrics (``megatron/core/telemetry/training_metrics.py``) with
their last value per rank; the non-finite values counted by ``megatron.training.nonfinite_values``
(by the metric they were passed for) and the skipped iterations of
``megatron.training.skipped_iters``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otel_training.report.quantiles import histogram_quantile
from otel_training.report.run import Run
from otel_training.report.steps import ITERATION_SPANS, StepClock, step_clocks
from otel_training.report.wording import steps_phrase
from otel_training.semconv.attributes import MEGATRON_ITERATION, MEGATRON_TRAINING_METRIC
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_NONFINITE_VALUES,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)
from otel_training.semconv.spans import MEGATRON_TRAIN_FIRST_ITERATION

__all__ = ["MEGATRON_METRICS", "MetricRow", "Summary", "summarize"]

MEGATRON_METRICS: tuple[tuple[str, str], ...] = (
    (MEGATRON_TRAINING_LOSS, ""),
    (MEGATRON_TRAINING_LEARNING_RATE, ""),
    (MEGATRON_TRAINING_GRAD_NORM, ""),
    (MEGATRON_TRAINING_TOKENS_PER_SEC, "tokens/s"),
    (MEGATRON_TRAINING_THROUGHPUT_TFLOPS, "TFLOP/s per GPU"),
    (MEGATRON_TRAINING_MEMORY_ALLOCATED_GB, "GiB"),
    (MEGATRON_TRAINING_STEP_DURATION_MS, "ms"),
    (MEGATRON_TRAINING_SKIPPED_ITERS, "iterations"),
)
"""The eight metrics of Megatron-LM with the unit their values really have."""


@dataclass
class MetricRow:
    """One metric's last values.

    Attributes:
        name: The metric name.
        unit: The unit of the values (empty: none).
        what: What the value is (``last value``, ``mean of the last interval``, ``total``).
        by_rank: The value per rank (ranks without the metric are absent).
    """

    name: str
    unit: str
    what: str
    by_rank: dict[int, float] = field(default_factory=dict)

    @property
    def values(self) -> list[float]:
        """The values of all ranks, by rank."""
        return [self.by_rank[r] for r in sorted(self.by_rank)]


@dataclass
class Summary:
    """The report's summary.

    Attributes:
        run_id: ``dl.run.id``, else the run directory's name.
        service_name: ``service.name``.
        ranks: The ranks that wrote files.
        world_size: ``dl.world_size`` (else the number of ranks).
        hosts: ``host.name`` of the ranks, sorted, unique.
        steps: The last optimizer step reached (``None``: unknown), and where it comes from.
        steps_source: Where ``steps`` comes from.
        first_step: The first optimizer step this run ran (the smallest ``megatron.iteration``
            of its iteration and first-iteration spans; a resumed run starts after step 0),
            ``None``: unknown.
        start_ns: First time in the run.
        duration_s: From the first to the last time in the run, seconds.
        metrics: The eight Megatron-LM metrics, those recorded.
        nonfinite: Non-finite values by metric name, summed over ranks.
        skipped_iters: Skipped iterations, the most any rank counted (ranks skip together).
        step_duration_quantiles_ms: p50, p90, p99 of all steps of all ranks, ms.
    """

    run_id: str
    service_name: str | None
    ranks: list[int]
    world_size: int | None
    hosts: list[str]
    steps: int | None
    steps_source: str | None
    start_ns: int | None
    duration_s: float | None
    metrics: list[MetricRow]
    nonfinite: dict[str, float]
    skipped_iters: float
    step_duration_quantiles_ms: dict[float, float]
    first_step: int | None = None

    @property
    def steps_text(self) -> str:
        """The steps it ran, said one way everywhere (:func:`~otel_training.report.wording.
        steps_phrase`): ``400 steps (201–600)``, or ``steps up to 600``."""
        return steps_phrase(self.first_step, self.steps)


def _first_step(run: Run) -> int | None:
    iterations = [
        s.attributes.get(MEGATRON_ITERATION)
        for s in run.spans
        if s.name in ITERATION_SPANS or s.name == MEGATRON_TRAIN_FIRST_ITERATION
    ]
    found = [i for i in iterations if isinstance(i, int) and not isinstance(i, bool) and i > 0]
    return min(found, default=None)


def _steps(run: Run, clocks) -> tuple[int | None, str | None]:
    if clocks:
        source = next(iter(clocks.values())).source
        return max(c.last_step for c in clocks.values()), source
    iterations = [
        s.attributes.get(MEGATRON_ITERATION)
        for s in run.spans
        if isinstance(s.attributes.get(MEGATRON_ITERATION), int)
    ]
    if iterations:
        return max(iterations), f"spans ({MEGATRON_ITERATION})"
    return None, None


def summarize(run: Run, clocks: dict[int, StepClock] | None | bool = False) -> Summary:
    """The summary of ``run``. Never raises.

    Args:
        clocks: The run's :func:`~otel_training.report.steps.step_clocks` when already
            computed (they take one pass over every span); computed here when left out.
    """
    if clocks is False:
        clocks = step_clocks(run)
    metrics = []
    for name, unit in MEGATRON_METRICS:
        if name == MEGATRON_TRAINING_STEP_DURATION_MS:
            row = MetricRow(name, unit, "mean of the last export interval")
            for rank, telemetry in run.ranks.items():
                for series in telemetry.histogram(name):
                    for count, total in zip(
                        reversed(series.delta_counts), reversed(series.delta_sums)
                    ):
                        if count:
                            row.by_rank[rank] = total / count
                            break
        elif name == MEGATRON_TRAINING_SKIPPED_ITERS:
            row = MetricRow(name, unit, "total")
            for rank, telemetry in run.ranks.items():
                series = telemetry.counter(name)
                if series:
                    row.by_rank[rank] = sum(s.total for s in series)
        else:
            row = MetricRow(name, unit, "last value")
            for rank, telemetry in run.ranks.items():
                series = [s for s in telemetry.gauge(name) if s.values]
                if series:
                    last = max(series, key=lambda s: s.times_ns[-1])
                    row.by_rank[rank] = last.values[-1]
        if row.by_rank:
            metrics.append(row)
    nonfinite: dict[str, float] = {}
    for telemetry in run.ranks.values():
        for series in telemetry.counter(MEGATRON_TRAINING_NONFINITE_VALUES):
            metric = dict(series.attributes).get(MEGATRON_TRAINING_METRIC, "(unnamed)")
            nonfinite[str(metric)] = nonfinite.get(str(metric), 0.0) + series.total
    skipped = max(
        (
            sum(s.total for s in t.counter(MEGATRON_TRAINING_SKIPPED_ITERS))
            for t in run.ranks.values()
        ),
        default=0.0,
    )
    quantiles: dict[float, float] = {}
    histograms = [
        s for t in run.ranks.values() for s in t.histogram(MEGATRON_TRAINING_STEP_DURATION_MS)
    ]
    if histograms:
        bounds = histograms[0].bounds
        buckets = [0] * (len(bounds) + 1)
        for series in histograms:
            if series.bounds == bounds:
                buckets = [a + b for a, b in zip(buckets, series.cumulative_buckets)]
        for q in (0.5, 0.9, 0.99):
            value = histogram_quantile(q, bounds, buckets)
            if not math.isnan(value):
                quantiles[q] = value
    steps, source = _steps(run, clocks)
    first, last = run.first_ns, run.last_ns
    hosts = sorted(
        {str(t.resource["host.name"]) for t in run.ranks.values() if "host.name" in t.resource}
    )
    return Summary(
        run_id=run.run_id or run.directory.name,
        service_name=run.service_name,
        ranks=sorted(run.ranks),
        world_size=run.world_size,
        hosts=hosts,
        steps=steps,
        steps_source=source,
        start_ns=first,
        duration_s=None if first is None or last is None else (last - first) / 1e9,
        metrics=metrics,
        nonfinite=nonfinite,
        skipped_iters=skipped,
        step_duration_quantiles_ms=quantiles,
        first_step=_first_step(run) if steps is not None else None,
    )
