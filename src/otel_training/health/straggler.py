"""Stragglers: busy time per step, the leave-one-out score, and the cause (``docs/health.md``).

The one place these are defined; ``otel-training health`` and the report apply them to the
embedded default's files, the Prometheus rules of ``collector-config/rules/training.yaml`` to
the same counters. Pure arithmetic, nothing raises.

A synchronous collective makes every rank's *wall* step time equal (the fast ranks wait for the
slow one), so a straggler is invisible in step time. It shows in **busy time**: what a rank
spends per step outside the waiting, ``busy(r) = data_loading + forward_backward + optimizer``
per optimizer step, from the ledger's cumulative ``dl.training.phase.time`` (the
``communication`` phase, the blocking part of synchronisation, is left out).

**Windows.** The counters are sampled at each metric export. Windows are ranges of optimizer
steps, the same for every rank of an attempt: ``w = max(OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW
_STEPS (20), the median number of steps between two exports)`` steps each, from the highest
first sampled iteration of the ranks to the lowest last one. A rank's phase times at a window's
edges are interpolated linearly in the iteration between its two samples around the edge (busy
time grows only while steps run, so it is linear in the iteration within an export interval);
per-step values are the differences over the window divided by ``w``. (Per-step spans are not
needed and not used: the counters exist whatever the span groups.)

**Score.** ``score(r) = busy(r) / reference(r)``, the reference taken over the peer group of
r: the ranks with the same ``dl.pipeline_parallel.rank`` (all ranks when it is not set;
pipeline stages do different work). In a group of 2 or 3 ranks the reference is the median of
the others (leave-one-out: with r in it a slow rank of two would score 1.0 + half its
excess). In a group of 4 or more it is the group's **lower quartile**, r included: the 0.25
quantile interpolated linearly between the sorted values (rank ``0.25 x (n - 1)``, PromQL's
``quantile``), which slow ranks cannot move while fewer than about three quarters of the group
are slow (with 2 of 4 slow, the median would sit between the fast and the slow ones and hide
both). :func:`peer_reference` is the one place this is computed.

**Straggler.** ``score > 1.15`` in at least 3 consecutive windows, the first window of the
attempt left out (the steps right after a start or a restart are not a straggler window). A
single slow step (a spike) lands in one export interval, which spreads over at most two
windows (a window is at least one export interval): it cannot flag a rank. A rank 15 % busier
than its peers does, in 3 windows.

**Cause,** over the windows that flagged it: the excess of each part over the peers' reference
of that part (:func:`peer_reference`), ``data`` (``data_loading``) and ``compute``
(``forward_backward + optimizer``), negative excesses counted as 0. ``gpu_throttle`` when the
excess is not mostly data and the rank's device shows throttling against its peers (mean SM
clock below 0.95 x their median, or temperature above their median + 10 °C); else ``data`` or
``compute`` when that part explains at least 80 % of the excess; else ``mixed``.
``unattributed`` when no rank of the peer group ever recorded ``communication``: then waiting
hides inside ``forward_backward`` (a DDP all-reduce runs in the backward pass) and busy time
cannot be told from waiting.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "BUSY_PHASES",
    "CAUSES",
    "DEFAULT_WINDOW_STEPS",
    "RankCounters",
    "Straggler",
    "StragglerReport",
    "assess",
    "peer_reference",
    "quantile",
    "score",
]

#: Optimizer steps per window (``OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS``).
DEFAULT_WINDOW_STEPS: Final = 20
#: A window flags a rank whose score exceeds this.
SCORE_THRESHOLD: Final = 1.15
#: A straggler is flagged in at least this many consecutive windows (a single spike spreads
#: over at most 2).
CONSECUTIVE_WINDOWS: Final = 3
#: Windows at the start of each attempt that never flag (the steps right after a start).
SKIPPED_WINDOWS: Final = 1
#: Peer groups of at most this many ranks take the median of the others as the reference;
#: larger groups their lower quartile (:func:`peer_reference`).
LEAVE_ONE_OUT_MAX: Final = 3
#: The quantile of the reference of a large group.
REFERENCE_QUANTILE: Final = 0.25
#: A part that explains at least this share of the excess is the cause.
CAUSE_SHARE: Final = 0.8
#: The phases of busy time.
BUSY_PHASES: Final = ("data_loading", "forward_backward", "optimizer")
#: The parts of busy time a cause names: data loading and compute.
PARTS: Final = {"data": ("data_loading",), "compute": ("forward_backward", "optimizer")}
#: The phases read per rank: busy and communication.
PHASES: Final = (*BUSY_PHASES, "communication")
#: GPU throttling: a mean SM clock below this share of the peers' median...
THROTTLE_CLOCK_RATIO: Final = 0.95
#: ... or a temperature this many degrees Celsius above their median.
THROTTLE_TEMPERATURE_C: Final = 10.0
#: The causes, in the order of the module docstring.
CAUSES: Final = ("gpu_throttle", "data", "compute", "mixed", "unattributed")


@dataclass(frozen=True)
class RankCounters:
    """One rank's ledger counters at its exports, within one attempt.

    Attributes:
        rank: ``dl.rank``.
        iterations: Progress iteration at each sample, non-decreasing (samples before the first
            completed step left out).
        phase_s: Cumulative seconds of each phase of :data:`PHASES` at each sample.
        peer_group: ``dl.pipeline_parallel.rank``, or ``None`` (one group for all).
        sm_clock_hz: Mean SM clock of its device, or ``None``.
        temperature_c: Mean temperature of its device, or ``None``.
    """

    rank: int
    iterations: Sequence[float]
    phase_s: Mapping[str, Sequence[float]]
    peer_group: int | None = None
    sm_clock_hz: float | None = None
    temperature_c: float | None = None


@dataclass(frozen=True)
class Straggler:
    """A rank flagged in at least :data:`CONSECUTIVE_WINDOWS` consecutive windows.

    Attributes:
        rank: ``dl.rank``.
        score: The median score of the windows that flagged it.
        cause: One of :data:`CAUSES`.
        windows: How many windows flagged it.
        excess_s: Busy seconds per step above its peers (median over those windows), by part.
    """

    rank: int
    score: float
    cause: str
    windows: int
    excess_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StragglerReport:
    """The windows and their scores, and the stragglers.

    Attributes:
        window_steps: Steps per window (``w`` of the module docstring).
        windows: ``(first, last)`` iteration of each window (``last - first = w``).
        scores: Per rank, its score in each window (``None``: no peer to compare with).
        busy_s: Per rank, its busy seconds per step in each window.
        stragglers: The flagged ranks, by rank.
        attributed: False when no rank recorded ``communication`` (causes are then
            ``unattributed``).
    """

    window_steps: int
    windows: list[tuple[float, float]]
    scores: dict[int, list[float | None]]
    busy_s: dict[int, list[float]]
    stragglers: list[Straggler]
    attributed: bool


def quantile(phi: float, values: Sequence[float]) -> float:
    """The ``phi`` quantile of ``values`` (not empty) as PromQL's ``quantile`` computes it:
    sorted, rank ``phi x (n - 1)``, linear interpolation between the two values around it."""
    ordered = sorted(values)
    rank = phi * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def peer_reference(value: float, peers: Sequence[float]) -> float | None:
    """The reference a rank's ``value`` is scored against, from its peers' values ``peers``
    (the rank itself left out): with 1 or 2 peers their median; with 3 or more, the lower
    quartile (:data:`REFERENCE_QUANTILE`, :func:`quantile`) of the group, ``value`` included.
    ``None`` without peers. Never raises."""
    if not peers:
        return None
    if len(peers) + 1 <= LEAVE_ONE_OUT_MAX:
        return statistics.median(peers)
    return quantile(REFERENCE_QUANTILE, [value, *peers])


def score(value: float, peers: Sequence[float]) -> float | None:
    """``value / peer_reference(value, peers)``; ``None`` without peers or when the reference
    is not positive. Never raises."""
    reference = peer_reference(value, peers)
    if reference is None or not reference > 0:
        return None
    return value / reference


def _at(iterations: Sequence[float], values: Sequence[float], x: float) -> float:
    """``values`` interpolated linearly in ``iterations`` at ``x`` (clamped to the ends)."""
    i = bisect.bisect_left(iterations, x)
    if i < len(iterations) and iterations[i] == x:
        # several samples at one iteration (no step between exports): the last one
        j = bisect.bisect_right(iterations, x) - 1
        return values[j]
    if i == 0:
        return values[0]
    if i >= len(iterations):
        return values[-1]
    x0, x1 = iterations[i - 1], iterations[i]
    v0, v1 = values[i - 1], values[i]
    return v0 + (v1 - v0) * (x - x0) / (x1 - x0)


def _steps_per_export(ranks: Sequence[RankCounters]) -> float:
    gaps = []
    for r in ranks:
        its = r.iterations
        gaps.extend(b - a for a, b in zip(its, its[1:]) if b > a)
    return statistics.median(gaps) if gaps else 0.0


def assess(
    ranks: Sequence[RankCounters], window_steps: int = DEFAULT_WINDOW_STEPS
) -> StragglerReport:
    """Windows, scores and stragglers of one attempt's ranks (the module docstring)."""
    usable = [r for r in ranks if len(r.iterations) >= 2 and r.iterations[-1] > r.iterations[0]]
    width = max(int(window_steps), int(math.ceil(_steps_per_export(usable))), 1)
    attributed = any(any(v > 0 for v in r.phase_s.get("communication", ())) for r in ranks)
    if len(usable) < 2:
        return StragglerReport(width, [], {}, {}, [], attributed)
    first = max(r.iterations[0] for r in usable)
    last = min(r.iterations[-1] for r in usable)
    edges = []
    edge = first
    while edge + width <= last:
        edges.append((edge, edge + width))
        edge += width
    per_step: dict[int, list[dict[str, float]]] = {}
    for r in usable:
        rows = []
        for a, b in edges:
            rows.append(
                {
                    phase: (_at(r.iterations, r.phase_s[phase], b)
                            - _at(r.iterations, r.phase_s[phase], a)) / width
                    for phase in PHASES
                    if phase in r.phase_s
                }
            )  # fmt: skip
        per_step[r.rank] = rows
    busy = {
        rank: [sum(row.get(p, 0.0) for p in BUSY_PHASES) for row in rows]
        for rank, rows in per_step.items()
    }
    groups: dict[int | None, list[RankCounters]] = {}
    for r in usable:
        groups.setdefault(r.peer_group, []).append(r)
    scores: dict[int, list[float | None]] = {}
    stragglers = []
    for members in groups.values():
        group_attributed = any(
            any(v > 0 for v in m.phase_s.get("communication", ())) for m in members
        )
        for r in members:
            peers = [m for m in members if m.rank != r.rank]
            row = [
                score(busy[r.rank][w], [busy[p.rank][w] for p in peers]) for w in range(len(edges))
            ]
            scores[r.rank] = row
            flagged = _flagged_windows(row)
            if not flagged:
                continue
            excess = _excess(r.rank, peers, per_step, flagged)
            cause = _cause(excess, r, peers) if group_attributed else "unattributed"
            stragglers.append(
                Straggler(
                    r.rank,
                    statistics.median(row[w] for w in flagged),  # type: ignore[misc]
                    cause,
                    len(flagged),
                    excess,
                )
            )
    stragglers.sort(key=lambda s: s.rank)
    return StragglerReport(width, edges, scores, busy, stragglers, attributed)


def _flagged_windows(row: Sequence[float | None]) -> list[int]:
    """The windows of runs of at least :data:`CONSECUTIVE_WINDOWS` flagged windows, the first
    :data:`SKIPPED_WINDOWS` never flagged."""
    flagged: list[int] = []
    run: list[int] = []
    for w, value in enumerate([*row, None]):
        if w >= SKIPPED_WINDOWS and value is not None and value > SCORE_THRESHOLD:
            run.append(w)
            continue
        if len(run) >= CONSECUTIVE_WINDOWS:
            flagged.extend(run)
        run = []
    return flagged


def _excess(
    rank: int,
    peers: Sequence[RankCounters],
    per_step: Mapping[int, list[dict[str, float]]],
    windows: Sequence[int],
) -> dict[str, float]:
    """Per part, the median over ``windows`` of the rank's per-step seconds minus the peers'
    reference of that part (:func:`peer_reference`), floored at 0."""
    excess = {}
    for part, phases in PARTS.items():
        values = []
        for w in windows:
            own = sum(per_step[rank][w].get(p, 0.0) for p in phases)
            others = [sum(per_step[q.rank][w].get(p, 0.0) for p in phases) for q in peers]
            reference = peer_reference(own, others)
            values.append(own - reference if reference is not None else 0.0)
        excess[part] = max(statistics.median(values), 0.0) if values else 0.0
    return excess


def _throttled(rank: RankCounters, peers: Sequence[RankCounters]) -> bool:
    clocks = [p.sm_clock_hz for p in peers if p.sm_clock_hz]
    if rank.sm_clock_hz and clocks:
        if rank.sm_clock_hz < THROTTLE_CLOCK_RATIO * statistics.median(clocks):
            return True
    temperatures = [p.temperature_c for p in peers if p.temperature_c is not None]
    if rank.temperature_c is not None and temperatures:
        if rank.temperature_c > statistics.median(temperatures) + THROTTLE_TEMPERATURE_C:
            return True
    return False


def _cause(excess: Mapping[str, float], rank: RankCounters, peers: Sequence[RankCounters]) -> str:
    total = sum(excess.values())
    shares = {part: (value / total if total > 0 else 0.0) for part, value in excess.items()}
    if shares.get("data", 0.0) < CAUSE_SHARE and _throttled(rank, peers):
        return "gpu_throttle"
    for part in ("data", "compute"):
        if shares.get(part, 0.0) >= CAUSE_SHARE:
            return part
    return "mixed"
