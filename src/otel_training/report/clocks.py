"""Ranks whose clocks disagree, measured from the data of a run.

Every rank stamps its records with its own host's clock (otel-training's per-process clock:
``otel_training.clock``). Ranks on different hosts are only as aligned as those clocks are, and a
host whose clock is off by 400 ms draws its rank 400 ms late in the trace and the timeline.

**What is measured.** All ranks of a synchronous data-parallel job leave each collective
together: the gradient all-reduce ends the forward-backward of every rank within milliseconds,
and so do the iteration's boundaries. Each span that carries ``megatron.iteration`` gives two
events per rank and iteration, its start and its end. For every event seen on two ranks or more,
each rank's deviation is its time minus the reference time of the event: the median over the
ranks (with three ranks or more), else the lowest rank's time (with two, who is off cannot be
told; the offset is then relative to that rank). Per rank and kind of event (span name and
edge), the median deviation over iterations is the candidate offset, and its median absolute
deviation the noise.

**When a rank is named.** A rank that is really slower at something (a straggler's optimizer
step ends late; it still leaves the all-reduce with the others) is late at some events only; a
clock offset moves every event alike. So the offset of a rank is the candidate of smallest
magnitude, over every kind of event seen in at least :data:`MIN_ITERATIONS` iterations, and it
is reported only when every candidate has the same sign and it exceeds both
:data:`MIN_OFFSET_MS` and :data:`NOISE_FACTOR` times its noise. It is an estimate, and a lower
bound of the disagreement: nothing is shifted by it, the report and the trace say it.

At most :data:`MAX_ITERATIONS` iterations, evenly spaced, are used per span name. Never raises.
"""

from __future__ import annotations

import statistics

from otel_training.report.run import ClockOffset, Run
from otel_training.semconv.attributes import MEGATRON_ITERATION

__all__ = ["MIN_OFFSET_MS", "ClockOffset", "clock_offsets"]

MIN_OFFSET_MS = 10.0
"""Smallest offset reported, in ms: synchronised ranks leave a collective well within it."""
NOISE_FACTOR = 5.0
"""An offset is reported only when it is this many times its noise (median absolute
deviation over iterations)."""
MIN_ITERATIONS = 3
"""Iterations a kind of event must be seen in, on the rank and another, to count."""
MAX_ITERATIONS = 200
"""Iterations used per span name at most (evenly spaced), so a long run is measured fast."""

_Kind = tuple[str, str]  # (span name, "start" | "end")


def _events(run: Run) -> dict[tuple[str, int, str], dict[int, int]]:
    """Time of each (span name, iteration, edge) per rank, from finished spans."""
    by_name: dict[str, dict[int, list]] = {}
    for span in run.spans:
        iteration = span.attributes.get(MEGATRON_ITERATION)
        if type(iteration) is not int or span.truncated or span.end_ns is None:
            continue
        by_name.setdefault(span.name, {}).setdefault(iteration, []).append(span)
    events: dict[tuple[str, int, str], dict[int, int]] = {}
    for name, iterations in by_name.items():
        chosen = sorted(iterations)
        if len(chosen) > MAX_ITERATIONS:
            step = len(chosen) / MAX_ITERATIONS
            chosen = [chosen[int(i * step)] for i in range(MAX_ITERATIONS)]
        for iteration in chosen:
            for span in iterations[iteration]:
                assert span.end_ns is not None
                events.setdefault((name, iteration, "start"), {})[span.rank] = span.start_ns
                events.setdefault((name, iteration, "end"), {})[span.rank] = span.end_ns
    return events


def _candidates(run: Run) -> dict[int, dict[_Kind, tuple[float, float, int]]]:
    """Per rank and kind of event: (median deviation ms, its noise ms, iterations)."""
    deviations: dict[int, dict[_Kind, list[float]]] = {}
    for (name, _, edge), times in _events(run).items():
        if len(times) < 2:
            continue
        if len(times) >= 3:
            reference = statistics.median(times.values())
        else:
            reference = times[min(times)]
        for rank, time_ns in times.items():
            deviations.setdefault(rank, {}).setdefault((name, edge), []).append(
                (time_ns - reference) / 1e6
            )
    found: dict[int, dict[_Kind, tuple[float, float, int]]] = {}
    for rank, kinds in deviations.items():
        for kind, values in kinds.items():
            if len(values) < MIN_ITERATIONS:
                continue
            middle = statistics.median(values)
            noise = statistics.median(abs(v - middle) for v in values)
            found.setdefault(rank, {})[kind] = (middle, noise, len(values))
    return found


def clock_offsets(run: Run) -> list[ClockOffset]:
    """The ranks of ``run`` whose clock disagrees with the others', measured as the module
    docstring says, by rank; empty when all agree or nothing could be measured. Never
    raises."""
    try:
        candidates = _candidates(run)
    except (ValueError, TypeError, statistics.StatisticsError):
        return []
    ranks = sorted({s.rank for s in run.spans})
    reference = ranks[0] if len(ranks) == 2 else None
    found = []
    for rank, kinds in sorted(candidates.items()):
        middles = [m for m, _, _ in kinds.values()]
        if not (all(m > 0 for m in middles) or all(m < 0 for m in middles)):
            continue
        (name, edge), (middle, noise, count) = min(kinds.items(), key=lambda item: abs(item[1][0]))
        if abs(middle) > max(MIN_OFFSET_MS, NOISE_FACTOR * noise):
            found.append(ClockOffset(rank, round(middle, 1), name, edge, count, reference))
    return found
