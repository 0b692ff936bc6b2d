"""Which optimizer step a value describes, and which step a rank had reached at a given time:
the x axis of the curves, heatmaps and step times.

Metric points carry their export time only (an iteration number as a metric attribute would
make cardinality unbounded), so steps come from series exported beside them.

**The step a training value describes** (:func:`logged_steps`): the health ledger's
``dl.training.progress.logged_iteration``, set when the values of a log interval are recorded
and exported in the same collection as them (every point of one export shares its time). A
loss logged at step 40 is at step 40 on every rank, whenever each rank exported it.

**The step reached at a time** (:func:`step_clocks`), per rank, in this order:

1. iteration spans (those of the registry's span group ``iteration``, such as
   ``megatron.train.iteration``, with ``megatron.iteration``): at each span's end, the rank has
   done that iteration;
2. the health ledger's ``dl.training.progress.iteration`` at each export (the global step, so
   a resumed attempt continues from its checkpoint's step);
3. the count of ``megatron.training.step_duration_ms``, one observation per optimizer step
   (``record_training_metrics(step_duration_ms=...)`` each step, or
   ``training_iteration(record_step_duration=True)``): at each export, the count so far.

A value exported at time t, without a logged step, belongs to the last step reached at or
before t (up to an export interval after the step it describes).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from otel_training.report.run import Run
from otel_training.semconv.attributes import MEGATRON_ITERATION
from otel_training.semconv.metrics import (
    DL_TRAINING_PROGRESS_ITERATION,
    DL_TRAINING_PROGRESS_LOGGED_ITERATION,
    MEGATRON_TRAINING_STEP_DURATION_MS,
)
from otel_training.semconv.spans import MEGATRON_TRAIN_ITERATION, SPANS

__all__ = [
    "SOURCE_HISTOGRAM",
    "SOURCE_PROGRESS",
    "SOURCE_SPANS",
    "StepClock",
    "logged_steps",
    "step_clocks",
]

#: The span group of the iteration span (Megatron-LM's ``step``).
ITERATION_GROUP = SPANS[MEGATRON_TRAIN_ITERATION].group
#: The spans of :data:`ITERATION_GROUP` (an iteration, the first one): each is one step.
ITERATION_SPANS = frozenset(name for name, spec in SPANS.items() if spec.group == ITERATION_GROUP)
"""The span group whose spans are optimizer steps."""

SOURCE_SPANS = f"iteration spans ({MEGATRON_ITERATION})"
SOURCE_PROGRESS = f"the health ledger's {DL_TRAINING_PROGRESS_ITERATION}"
SOURCE_HISTOGRAM = f"the count of {MEGATRON_TRAINING_STEP_DURATION_MS}"


@dataclass
class StepClock:
    """Steps reached over time on one rank.

    Attributes:
        source: Where the steps come from (:data:`SOURCE_SPANS` or :data:`SOURCE_HISTOGRAM`).
        times_ns: Ascending times, ns since the Unix epoch.
        steps: The step reached at each time (non-decreasing).
    """

    source: str
    times_ns: list[int]
    steps: list[int]

    def step_at(self, time_ns: int) -> int:
        """The last step reached at or before ``time_ns`` (0 before the first). Never raises."""
        i = bisect.bisect_right(self.times_ns, time_ns)
        return self.steps[i - 1] if i else 0

    def steps_at(self, times_ns: list[int]) -> list[int]:
        """:meth:`step_at` of each time; one merge pass when ``times_ns`` is ascending."""
        if any(b < a for a, b in zip(times_ns, times_ns[1:])):
            return [self.step_at(t) for t in times_ns]
        steps, clock_times, clock_steps = [], self.times_ns, self.steps
        i, n, current = 0, len(clock_times), 0
        for t in times_ns:
            while i < n and clock_times[i] <= t:
                current = clock_steps[i]
                i += 1
            steps.append(current)
        return steps

    @property
    def last_step(self) -> int:
        """The last step reached."""
        return self.steps[-1] if self.steps else 0


def _monotone(pairs: list[tuple[int, int]], source: str) -> StepClock:
    pairs.sort()
    times, steps, reached = [], [], 0
    for time_ns, step in pairs:
        reached = max(reached, step)
        times.append(time_ns)
        steps.append(reached)
    return StepClock(source, times, steps)


def _iteration_ends(run: Run) -> dict[int, list[tuple[int, int]]]:
    """(end, iteration) of the ended iteration spans, by rank."""
    names = ITERATION_SPANS
    ends: dict[int, list[tuple[int, int]]] = {}
    for span in run.spans:
        if span.name not in names or span.end_ns is None:
            continue
        iteration = span.attributes.get(MEGATRON_ITERATION)
        if isinstance(iteration, int) and not isinstance(iteration, bool):
            ends.setdefault(span.rank, []).append((span.end_ns, iteration))
    return ends


def _from_histogram(run: Run, rank: int) -> StepClock | None:
    telemetry = run.ranks.get(rank)
    if telemetry is None:
        return None
    counts: dict[int, int] = {}
    for series in telemetry.histogram(MEGATRON_TRAINING_STEP_DURATION_MS):
        for time_ns, count in zip(series.times_ns, series.cumulative_counts):
            counts[time_ns] = counts.get(time_ns, 0) + count
    if not counts or max(counts.values()) < 2:
        return None
    return _monotone(sorted(counts.items()), SOURCE_HISTOGRAM)


def _from_progress(run: Run, rank: int) -> StepClock | None:
    telemetry = run.ranks.get(rank)
    if telemetry is None:
        return None
    pairs = [
        (t, int(v))
        for series in telemetry.gauge(DL_TRAINING_PROGRESS_ITERATION)
        for t, v in zip(series.times_ns, series.values)
        if v == v  # not NaN
    ]
    if len(pairs) < 2:
        return None
    return _monotone(pairs, SOURCE_PROGRESS)


def logged_steps(run: Run) -> dict[int, dict[int, int]]:
    """Per rank that exported ``dl.training.progress.logged_iteration``: export time (ns) ->
    the step that the training values of that export describe. Never raises."""
    found: dict[int, dict[int, int]] = {}
    for rank, telemetry in run.ranks.items():
        steps = {
            t: int(v)
            for series in telemetry.gauge(DL_TRAINING_PROGRESS_LOGGED_ITERATION)
            for t, v in zip(series.times_ns, series.values)
            if v == v  # not NaN
        }
        if steps:
            found[rank] = steps
    return found


def step_clocks(run: Run) -> dict[int, StepClock] | None:
    """One clock per rank that has metrics, or ``None`` when one of them has none (then all
    curves are drawn over time, so that ranks stay comparable). Never raises."""
    clocks = {}
    ends = _iteration_ends(run)
    for rank, telemetry in run.ranks.items():
        if not (telemetry.gauges or telemetry.counters or telemetry.histograms):
            continue
        pairs = ends.get(rank, [])
        clock = _monotone(pairs, SOURCE_SPANS) if len(pairs) >= 2 else None
        clock = clock or _from_progress(run, rank) or _from_histogram(run, rank)
        if clock is None:
            return None
        clocks[rank] = clock
    return clocks or None
