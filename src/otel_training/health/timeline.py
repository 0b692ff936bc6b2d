"""One process's phase times at any moment, and the facts of an attempt, read from the evidence
its ranks left: what :mod:`otel_training.health.goodput` accounts with (its docstring defines
the account; ``docs/health.md``, "Goodput").

- :class:`Timeline`: a process's cumulative seconds per phase of ``dl.training.phase`` at any
  moment up to its last evidence of life, from its ledger samples, its phase spans placing the
  saves, loads, evaluations and warm-up in time between them;
- an attempt's facts: when a step completed (:func:`completion_s`), its progress
  (:func:`progress_events`, :func:`last_progress`), its median step (:func:`median_step_s`),
  the rank its account is taken from (:func:`reference_process`), its longest phase of a kind
  (:func:`longest_phase_s`), what was open at its end (:func:`open_at_end`).

Nothing here raises.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

from otel_training.health import hang as _hang
from otel_training.health import ledger as _ledger
from otel_training.health.evidence import Attempt, PhaseSpan, Process, Sample

__all__ = [
    "Timeline",
    "attempt_longest_phase_s",
    "completion_s",
    "first_iteration",
    "first_step_end_s",
    "last_progress",
    "loaded_iteration",
    "longest_phase_s",
    "median_step_s",
    "open_at_end",
    "phase_at_end",
    "progress_events",
    "raised",
    "reference_process",
]

N_PHASES = len(_ledger.PHASES)
STARTUP, CHECKPOINT_LOAD, WARMUP, DATA, FB, OPT, COMM, SAVE, EVALUATE, OTHER = range(N_PHASES)
#: Phases placed in time by their spans.
PLACED = (CHECKPOINT_LOAD, SAVE, EVALUATE, WARMUP)
#: The phases of the training loop: kept or lost with the steps.
LOOP = (WARMUP, DATA, FB, OPT, COMM, OTHER)
#: The phases of a step after the first, that fill the time no span places.
STEP = (DATA, FB, OPT, COMM, OTHER)
#: The phases of a step's own time (the median step).
STEP_TIME = (DATA, FB, OPT, COMM)


# -- one process's phase times at any moment -----------------------------------------------


def _merge(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _overlap(intervals: Sequence[tuple[float, float]], a: float, b: float) -> float:
    total = 0.0
    for start, end in intervals:
        if end <= a:
            continue
        if start >= b:
            break
        total += min(end, b) - max(start, a)
    return max(total, 0.0)


class Timeline:
    """One process's phase times (cumulative seconds per phase since its creation) at any
    moment up to its last evidence of life, from its ledger samples and phase spans (see the
    module docstring). ``at(t)[p]`` sums to ``t - created`` over the phases."""

    def __init__(self, process: Process) -> None:
        self.process = process
        created = process.start_s or 0.0
        self.created = created
        self.end = max(process.alive_s or process.last_s or created, created)
        samples = [s for s in process.ledger if s.time_s > created]
        self.samples: list[Sample] = samples
        self.times = [created] + [s.time_s for s in samples]
        self.totals: list[tuple[float, ...]] = [(0.0,) * N_PHASES] + [s.phase_s for s in samples]  # type: ignore[misc]
        spans: dict[int, list[tuple[float, float]]] = {p: [] for p in PLACED}
        iterations = []
        for span in process.spans:
            end = span.end_s if span.end_s is not None else self.end
            if span.phase in spans:
                spans[span.phase].append((span.start_s, end))
            elif span.phase == _ledger.ITERATION:
                iterations.append((span.start_s, end))
        if not spans[WARMUP] and iterations:  # the first iteration of a process is its warm-up
            spans[WARMUP].append(min(iterations))
            iterations.remove(min(iterations))
        self.intervals = {p: _merge(v) for p, v in spans.items()}
        #: The steps after the warm-up (per-step spans): a step's own time, the rest is other.
        self.steps = _merge(
            [i for i in iterations if not spans[WARMUP] or i[0] >= spans[WARMUP][0][1]]
        )
        warmup = self.intervals[WARMUP]
        self.first_iteration_s: float | None = warmup[0][0] if warmup else None
        if self.first_iteration_s is None:
            # the first sample with warm-up time: startup and loads came before it
            for t, totals in zip(self.times, self.totals):
                if totals[WARMUP] > 0:
                    self.first_iteration_s = t - totals[WARMUP]
                    break
        self.shares = self._step_shares()

    def _step_shares(self) -> tuple[float, ...]:
        """Each step phase's share of the step phases' time in the last samples where steps
        ran (the proportions the time after the last export is split in)."""
        found = [0.0] * N_PHASES
        for i in range(len(self.samples) - 1, 0, -1):
            a, b = self.samples[i - 1], self.samples[i]
            if (a.iteration or 0) >= (b.iteration or 0):
                continue
            for p in STEP:
                found[p] += b.phase_s[p] - a.phase_s[p]  # type: ignore[index]
            if sum(found) > 0 and i < len(self.samples) - 3:
                break
        if sum(found) <= 0 and self.totals:
            found = [self.totals[-1][p] if p in STEP else 0.0 for p in range(N_PHASES)]
        total = sum(found)
        if total <= 0:
            return tuple(1.0 if p == OTHER else 0.0 for p in range(N_PHASES))
        return tuple(v / total for v in found)

    def at(self, t: float) -> list[float]:
        """Cumulative seconds per phase at Unix time ``t`` (clamped to the process's life)."""
        t = min(max(t, self.created), self.end)
        k = bisect.bisect_right(self.times, t) - 1
        base = list(self.totals[k])
        if k + 1 < len(self.times):
            portion = self._within(k, t)
        else:
            portion = self._after(t)
        return [b + p for b, p in zip(base, portion)]

    def _within(self, k: int, t: float) -> list[float]:
        """The phase time between sample k and ``t``, before sample k + 1."""
        a, c = self.times[k], self.times[k + 1]
        delta = [y - x for x, y in zip(self.totals[k], self.totals[k + 1])]
        if c <= a:
            return [0.0] * N_PHASES
        result = [0.0] * N_PHASES
        fraction = (t - a) / (c - a)
        for p in PLACED:
            if delta[p] <= 0:
                continue
            whole = _overlap(self.intervals[p], a, c)
            result[p] = delta[p] * (
                _overlap(self.intervals[p], a, t) / whole if whole > 0 else fraction
            )
        if delta[STARTUP] > 0:
            first = self.first_iteration_s
            if first is not None and first > a:
                result[STARTUP] = min(
                    delta[STARTUP], max(0.0, min(t, first) - a - result[CHECKPOINT_LOAD])
                )
            else:
                result[STARTUP] = delta[STARTUP] * fraction
        step_total = sum(delta[p] for p in STEP)
        if step_total > 0:
            room = min(max((t - a) - sum(result), 0.0), step_total)
            self._split(result, delta, room, a, t, _overlap(self.steps, a, c))
        return result

    def _split(
        self, result: list[float], delta: Sequence[float], room: float, a: float, t: float,
        whole: float,
    ) -> None:  # fmt: skip
        """Adds ``room`` seconds of step phases to ``result`` in the proportions of ``delta``;
        with per-step spans, their overlap with ``[a, t]`` (scaled to the steps' own time in
        ``delta``, ``whole`` their overlap with the interval) is the steps' own time and the
        rest ``other``."""
        own = sum(delta[p] for p in STEP_TIME)
        if self.steps and own > 0 and whole > 0:
            part = min(own * _overlap(self.steps, a, t) / whole, room)
            for p in STEP_TIME:
                result[p] += delta[p] * part / own
            result[OTHER] += room - part
            return
        total = sum(delta[p] for p in STEP)
        for p in STEP:
            result[p] += delta[p] * room / total

    def _after(self, t: float) -> list[float]:
        """The phase time between the last sample and ``t``: placed by the spans, the rest
        startup before the first iteration, else the step phases in the attempt's
        proportions (or the phase open at the last sample, when it had been open longer than
        the time since)."""
        a = self.times[-1]
        result = [0.0] * N_PHASES
        if t <= a:
            return result
        for p in PLACED:
            result[p] = _overlap(self.intervals[p], a, t)
        rest = max((t - a) - sum(result), 0.0)
        first = self.first_iteration_s
        begun = first is not None and first <= t
        if not begun:
            open_phase = self.samples[-1].open_phase if self.samples else "startup"
            result[CHECKPOINT_LOAD if open_phase == "checkpoint_load" else STARTUP] += rest
            return result
        if first is not None and first > a:
            before = max(0.0, first - a - _overlap(self.intervals[CHECKPOINT_LOAD], a, first))
            before = min(before, rest)
            result[STARTUP] += before
            rest -= before
        last = self.samples[-1] if self.samples else None
        if last is not None and last.open_phase in _hang.STEP_PHASES:
            stuck = _ledger.PHASES.index(last.open_phase)
            if last.open_s > 0 and last.open_s >= (t - a):  # it had been open longer
                result[stuck] += rest
                return result
        shares = self.shares
        own_share = sum(shares[p] for p in STEP_TIME)
        if self.steps and own_share > 0:  # per-step spans: their time is the steps' own
            own = min(_overlap(self.steps, a, t), rest)
            for p in STEP_TIME:
                result[p] += own * shares[p] / own_share
            result[OTHER] += rest - own
            return result
        for p in STEP:
            result[p] += rest * shares[p]
        return result

    def step_samples(self) -> list[tuple[float, float]]:
        """``(iteration, step time)`` after the first completed step, for the median step:
        the samples taken after the warm-up step, and before them the warm-up step's own
        iteration with no step time (the step phases count from its end)."""
        found = [
            (s.iteration, sum(s.phase_s[p] for p in STEP_TIME))  # type: ignore[index]
            for s in self.samples
            if s.iteration is not None and s.phase_s is not None and s.open_phase != "warmup"
            and s.phase_s[WARMUP] > 0
        ]  # fmt: skip
        first = self.warmup_iteration()
        if first is not None and (not found or found[0][0] > first):
            found.insert(0, (first, 0.0))
        return found

    def warmup_iteration(self) -> int | None:
        """The iteration of the process's first step (its warm-up), or ``None``."""
        for span in self.process.spans:
            if span.phase == WARMUP and span.iteration is not None:
                return span.iteration
        iterations = [s for s in self.process.spans if s.phase == _ledger.ITERATION]
        if iterations and iterations[0].iteration is not None:
            return iterations[0].iteration
        loaded = loaded_iteration(self.process)
        return None if loaded is None else loaded + 1


# -- an attempt's facts ------------------------------------------------------------------------


def _iteration_spans(process: Process) -> list[PhaseSpan]:
    return [
        s
        for s in process.spans
        if s.phase == _ledger.ITERATION and s.end_s is not None and not s.failed and not s.truncated
    ]


def _completes_step(span: PhaseSpan) -> bool:
    """An iteration or warm-up span that ended by itself without raising: a completed step."""
    return (
        span.phase in (_ledger.ITERATION, WARMUP)
        and span.end_s is not None
        and not span.failed
        and not span.truncated
    )


def first_step_end_s(process: Process) -> float | None:
    """When ``process`` completed its first step: the end of its first completed iteration or
    warm-up span; else, from the first sample of its ledger after its warm-up, its creation
    plus its startup, load and warm-up time; else the best evidence of when its first step
    completed (:func:`completion_s`); ``None`` when it completed none."""
    ends = [s.end_s for s in process.spans if _completes_step(s) and s.end_s is not None]
    if ends:
        return min(ends)
    created = process.start_s
    for sample in process.ledger:  # the ledger's warm-up closed: startup + load + warm-up
        phase_s = sample.phase_s
        if phase_s and phase_s[WARMUP] > 0 and sample.open_phase != "warmup" and created:
            return created + phase_s[STARTUP] + phase_s[CHECKPOINT_LOAD] + phase_s[WARMUP]
    first = first_iteration(process)
    return None if first is None else completion_s(process, first)


def raised(process: Process) -> bool:
    """What ``process`` did last failed: a phase raised (a span ended with status ERROR, not
    truncated) and no step completed after it began; or its training run raised and no step
    completed after that (an exception between steps, a ``KeyboardInterrupt``); or, from its
    progress record (with or without spans), a phase of the ledger or the run raised an error
    after its last completed step."""
    last_done = last_step_end_s(process)
    record = process.record
    for when in (process.run_raised_s, None if record is None else record.raised_s):
        if when is not None and (last_done is None or when > last_done):
            return True
    return any(s.failed and (last_done is None or s.start_s > last_done) for s in process.spans)


def last_step_end_s(process: Process) -> float | None:
    """When ``process`` last completed a step (Unix seconds), from every source that knows:
    its iteration spans, and the ledger's exports and progress record (which know with the
    per-step spans off); ``None`` when it completed none (a load's restored step counts as
    progress from the load on)."""
    done = [s.end_s for s in process.spans if _completes_step(s) and s.end_s is not None]
    done += [s.progress_s for s in process.samples if s.progress_s is not None]
    return max(done, default=None)


def completion_s(process: Process, iteration: int) -> float | None:
    """When ``process`` completed step ``iteration`` (Unix seconds), from the best evidence
    its files hold, in order: the iteration span's end; a sample whose progress is that step
    (its timestamp); a sample whose last save holds it (export time minus checkpoint age); the
    start of the save of that step; the progress timestamps of the samples around it,
    interpolated. ``None`` when none tells."""
    for span in _iteration_spans(process):
        if span.iteration == iteration:
            return span.end_s
    for sample in process.samples:
        if sample.iteration == iteration and sample.progress_s is not None:
            return sample.progress_s
    for sample in process.samples:
        if sample.saved_iteration == iteration and sample.checkpoint_age_s is not None:
            return sample.time_s - sample.checkpoint_age_s
    for span in process.spans:
        if span.phase == _ledger.CHECKPOINT_SAVE and span.iteration == iteration:
            return span.start_s
    points = sorted(
        (s.iteration, s.progress_s)
        for s in process.samples
        if s.iteration is not None and s.progress_s is not None
    )
    below = [p for p in points if p[0] < iteration]
    above = [p for p in points if p[0] > iteration]
    if below and above:
        (i0, t0), (i1, t1) = below[-1], above[0]
        return t0 + (t1 - t0) * (iteration - i0) / (i1 - i0)
    return None


def progress_events(process: Process) -> list[tuple[float, int | None]]:
    """Every moment the files show ``process`` progressed, ``(Unix seconds, the step then)``,
    unordered: each sample's progress timestamp (with its iteration), the ends of its
    iteration spans and warm-up span that completed (neither raised nor truncated), and the
    starts of its checkpoint saves and evaluations (the step they hold had completed). After
    a load and before any step, the sample's timestamp is the load's."""
    events: list[tuple[float, int | None]] = [
        (s.progress_s, s.iteration) for s in process.samples if s.progress_s is not None
    ]
    for span in process.spans:
        if span.failed or span.truncated:
            continue
        if span.phase in (_ledger.ITERATION, WARMUP) and span.end_s is not None:
            events.append((span.end_s, span.iteration))
        elif span.phase in (SAVE, EVALUATE) and span.iteration is not None:
            events.append((span.start_s, span.iteration))
    return events


def last_progress(
    process: Process, before_s: float | None = None
) -> tuple[int | None, float | None]:
    """The last completed step of ``process`` (the highest iteration seen) and when it last
    progressed (Unix seconds; up to ``before_s`` when given), from its
    :func:`progress_events`."""
    iteration: int | None = None
    when: float | None = None
    for t, i in progress_events(process):
        if before_s is not None and t > before_s:
            continue
        if i is not None and (iteration is None or i > iteration):
            iteration = i
        if when is None or t > when:
            when = t
    return iteration, when


def loaded_iteration(process: Process) -> int | None:
    """The iteration the attempt's load restored."""
    for sample in process.samples:
        if sample.loaded_iteration is not None:
            return sample.loaded_iteration
    for span in process.spans:
        if span.phase == _ledger.CHECKPOINT_LOAD and span.iteration is not None and not span.failed:
            return span.iteration
    return None


def first_iteration(process: Process) -> int | None:
    """The first step the process completed, or ``None``."""
    found = [s.iteration for s in _iteration_spans(process) if s.iteration is not None]
    found += [
        s.iteration
        for s in process.spans
        if s.phase == WARMUP and s.iteration is not None and _completes_step(s)
    ]
    found += [s.iteration for s in process.samples if s.iteration is not None]
    loaded = loaded_iteration(process)
    if loaded is not None:
        found = [i for i in found if i > loaded]
    return min(found) if found else None


def median_step_s(process: Process, timeline: Timeline | None = None) -> float | None:
    """The median step of ``process``, seconds: of its iteration spans after the first (each
    step exactly) when it has two or more, else :func:`otel_training.health.hang.median_step_s`
    of its export samples (``None`` when neither tells)."""
    durations = [
        s.end_s - s.start_s
        for s in _iteration_spans(process)
        if s.end_s is not None and s.phase == _ledger.ITERATION
    ]
    if len(durations) >= 2:
        return statistics.median(durations)
    timeline = timeline or Timeline(process)
    return _hang.median_step_s(timeline.step_samples())


def reference_process(attempt: Attempt, end_s: float, *, by_spans: bool = False) -> Process | None:
    """The lowest rank of ``attempt`` that exported the ledger (``by_spans``: that wrote phase
    spans, where no rank exported it) until within one export interval (plus a second) of
    ``end_s``; else the one of them seen last; ``None`` when none did."""
    candidates = [p for p in attempt.processes if (p.spans if by_spans else p.ledger)]
    if not candidates:
        return None
    complete = [
        p for p in candidates if (p.alive_s or p.last_s or 0.0) >= end_s - p.export_interval_s - 1.0
    ]
    if complete:
        return min(complete, key=lambda p: (p.rank, -(p.alive_s or 0.0)))
    return max(candidates, key=lambda p: p.alive_s or p.last_s or 0.0)


def longest_phase_s(process: Process, phase: str, before_s: float) -> float | None:
    """The longest completed occurrence of ``phase`` on ``process`` that ended before
    ``before_s``, seconds (spans, else the open times of its samples)."""
    code = _ledger.PHASES.index(phase) if phase in _ledger.PHASES else -1
    spans = [
        s.end_s - s.start_s
        for s in process.spans
        if s.phase == code and s.end_s is not None and s.end_s < before_s
    ]
    if spans:
        return max(spans)
    runs, current = [], 0.0
    for sample in process.samples:
        if sample.time_s >= before_s:
            break
        if sample.open_phase == phase:
            current = max(current, sample.open_s)
        elif current:
            runs.append(current)
            current = 0.0
    return max(runs) if runs else None


def attempt_longest_phase_s(attempt: Attempt, phase: str, before_s: float) -> float | None:
    """The longest completed occurrence of ``phase`` on any rank of ``attempt`` that ended
    before ``before_s``, seconds (:func:`longest_phase_s` of each): a pause's budget is
    the attempt's, as the Prometheus rules take it (``docs/health.md``, "Hangs")."""
    found = [longest_phase_s(p, phase, before_s) for p in attempt.processes]
    known = [x for x in found if x is not None]
    return max(known) if known else None


def phase_at_end(process: Process, timeline: Timeline, end_s: float) -> str:
    """The innermost phase of ``process`` at ``end_s`` (:func:`open_at_end`). Never raises."""
    return open_at_end(process, timeline, end_s)[0]


def open_at_end(process: Process, timeline: Timeline, end_s: float) -> tuple[str, float | None]:
    """The innermost phase of ``process`` at ``end_s`` and when it opened (Unix seconds,
    ``None`` when not known): its last export's open phase (opened ``open_s`` before that
    export), or a phase span that started after that export and had not ended by ``end_s``
    (opened at its start); before any export and any iteration, ``startup`` (opened at the
    process's creation). Never raises."""
    last = timeline.samples[-1] if timeline.samples else None
    phase = last.open_phase if last is not None and last.open_phase else "other"
    opened = last.time_s - last.open_s if last is not None and last.open_phase else None
    if last is None and (timeline.first_iteration_s is None or timeline.first_iteration_s > end_s):
        phase, opened = "startup", timeline.created  # before its first iteration: startup
    after = last.time_s if last is not None else timeline.created
    for span in process.spans:
        if span.start_s > after and (span.end_s is None or span.end_s >= end_s):
            name = {
                _ledger.ITERATION: "forward_backward",
            }.get(span.phase)
            phase = name or _ledger.PHASES[span.phase]
            after = opened = span.start_s
    return phase, opened
