"""Incidents: a hang or a straggler, with when it began, was detected, localised and recovered
(``docs/health.md``, "Incidents").

The one place an incident and its times are defined. ``otel-training health`` (its ``incidents``
in the JSON and the terminal), the report's "Run health" section and the bench read them from
the verdicts of :mod:`otel_training.health.hang` and :mod:`otel_training.health.straggler`;
a rank's watchdog states the first two of them live, in the log record it writes when it
finds its stall (:mod:`otel_training.health.watchdog`). Pure arithmetic on the moments and
verdicts given by the caller: no clock, no I/O; nothing raises.

Every time is Unix seconds, every duration seconds.

**A hang** is one episode of the job's hang verdict (:func:`otel_training.health.hang.judge`:
every exporting rank of an attempt stalled):

- ``began_s``: when the job's time without progress began: the latest of any rank's last
  progress before it (its last completed step, else its last checkpoint load, else its process
  start) and the end of the attempt's last pause that ended before it (a checkpoint save or
  load, an evaluation, startup or warm-up: the waiting peers' hang age counts from it,
  :func:`otel_training.health.hang.hang_age_s`);
- ``detected_s``: the earliest moment at which the verdict, judged with the evidence that
  existed then (nothing written later), is hung (:func:`first_moment`, to
  :data:`TOLERANCE_S`). A rank's watchdog detects its own stall independently, from its
  ledger; the first of those moments is ``watchdog_s``;
- ``localised_s``: the earliest moment from ``detected_s`` on at which the verdict names the
  incident's culprits (those it names at the last moment judged); ``None`` when it names none
  (every rank waits at the same place);
- ``recovered_s``: when training progressed again: for a hang that ended within its attempt,
  the first step completed after it; for a hang that lasted until its attempt ended, the
  first step completed by the first later attempt that completed one (Meta's "productive
  again"), however many attempts failed in between (``restarts`` counts the attempts started
  after the hung one, the recovering one included); ``None`` otherwise, ``unrecovered`` saying
  why (:data:`UNRECOVERED`).

**A straggler** is one run of consecutive windows that flag one rank
(:func:`otel_training.health.straggler.assess`; the windows are ranges of steps, dated by the
rank's own steps):

- ``began_s``: the start of the run's first window (when its first step began);
- ``detected_s``: the end of the window that made it a straggler (the run's
  :data:`~otel_training.health.straggler.CONSECUTIVE_WINDOWS`-th);
- ``localised_s``: ``detected_s``: the score names the rank, and its cause, when it flags it;
- ``recovered_s``: the end of the run's last window, when a later window of the attempt did not
  flag the rank; ``None`` (``still_flagged``) when the attempt's last window still flagged it.

**Durations** all count from ``began_s``: ``time_to_detect_s = detected_s - began_s``,
``time_to_localise_s = localised_s - began_s``, ``time_to_recover_s = recovered_s -
began_s``; ``None`` where the moment is ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from otel_training.health import hang as _hang
from otel_training.health import straggler as _straggler

__all__ = [
    "KINDS",
    "TOLERANCE_S",
    "UNRECOVERED",
    "Incident",
    "Restart",
    "first_moment",
    "hang_incident",
    "recovery",
    "straggler_incidents",
    "to_json",
]

#: The kinds of incident.
KINDS: Final = ("hang", "straggler")
#: Why an incident has no ``recovered_s``: ``running`` (its attempt runs and is still hung at
#: the moment judged), ``not_restarted`` (no later attempt of the job), ``no_step_after``
#: (later attempts, none of which completed a step), ``still_flagged`` (a straggler flagged in
#: its attempt's last window).
UNRECOVERED: Final = ("running", "not_restarted", "no_step_after", "still_flagged")
#: The precision of ``detected_s`` and ``localised_s``, seconds: well under an export interval
#: and any hang threshold, in few verdicts (each judges every rank of the attempt).
TOLERANCE_S: Final = 0.01


@dataclass(frozen=True)
class Incident:
    """One hang or straggler and its moments (the module docstring).

    Attributes:
        kind: One of :data:`KINDS`.
        attempt: The attempt it began in (``dl.run.attempt``, else its position).
        cohort: That attempt's cohort (an elastic membership change; 0 first).
        began_s: When it began, Unix seconds.
        detected_s: When it was detected, Unix seconds.
        localised_s: When its culprits were named, Unix seconds, or ``None``.
        recovered_s: When training progressed again (a straggler: stopped being flagged),
            Unix seconds, or ``None``.
        culprits: A hang's culprits; a straggler's rank.
        rule: The culprit rule (:data:`otel_training.health.hang.CULPRIT_RULES`) of a hang,
            or ``None``.
        cause: A straggler's cause (:data:`otel_training.health.straggler.CAUSES`), or
            ``None``.
        score: A straggler's median score over its windows, or ``None``.
        stalled: How many ranks of a hang were stalled at the last moment judged.
        watchdog_s: The first moment a rank's watchdog wrote its stacks for it, or ``None``.
        recovered_in: ``(attempt, cohort)`` of the attempt whose step recovered it, or ``None``.
        restarts: Attempts started after its own until the one that recovered it (or until
            the last, when none did).
        unrecovered: Why ``recovered_s`` is ``None`` (:data:`UNRECOVERED`), else ``None``.
        estimated: Sentences saying which of its moments the files give only approximately.
    """

    kind: str
    attempt: int
    cohort: int
    began_s: float
    detected_s: float
    localised_s: float | None = None
    recovered_s: float | None = None
    culprits: tuple[int, ...] = ()
    rule: str | None = None
    cause: str | None = None
    score: float | None = None
    stalled: int = 0
    watchdog_s: float | None = None
    recovered_in: tuple[int, int] | None = None
    restarts: int = 0
    unrecovered: str | None = None
    estimated: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        """Its attempt as a person reads it: ``3``, or ``3.1`` for a second cohort."""
        return f"{self.attempt}.{self.cohort}" if self.cohort else str(self.attempt)

    @property
    def time_to_detect_s(self) -> float:
        """``detected_s - began_s``, seconds."""
        return self.detected_s - self.began_s

    @property
    def time_to_localise_s(self) -> float | None:
        """``localised_s - began_s``, seconds, or ``None``."""
        return None if self.localised_s is None else self.localised_s - self.began_s

    @property
    def time_to_recover_s(self) -> float | None:
        """``recovered_s - began_s``, seconds, or ``None``."""
        return None if self.recovered_s is None else self.recovered_s - self.began_s


@dataclass(frozen=True)
class Restart:
    """An attempt after the one an incident began in, as :func:`recovery` needs it.

    Attributes:
        attempt: Its number.
        cohort: Its cohort.
        first_step_end_s: When its first step completed, Unix seconds, or ``None``
            (:attr:`otel_training.health.goodput.AttemptAccount.first_step_end_s`).
    """

    attempt: int
    cohort: int
    first_step_end_s: float | None


def first_moment(
    predicate: Callable[[float], bool],
    low_s: float,
    high_s: float,
    tolerance_s: float = TOLERANCE_S,
    guess_s: float | None = None,
) -> float:
    """The earliest moment in ``(low_s, high_s]`` at which ``predicate`` holds, to
    ``tolerance_s``: a moment at which it holds, at most ``tolerance_s`` after the first one
    (``low_s`` when it holds there). The predicate is taken to hold from that moment on, as a
    verdict does while no progress comes, and must hold at ``high_s``. ``guess_s``, where the
    moment probably is (a threshold crossing), is tried first: when the predicate holds there
    and not ``tolerance_s`` before, it is the answer, in two calls; else bisection, about
    ``log2((high_s - low_s) / tolerance_s)`` calls."""
    if predicate(low_s):
        return low_s
    low, high = low_s, high_s
    if guess_s is not None and low < guess_s - tolerance_s and guess_s < high:
        if predicate(guess_s):
            if not predicate(guess_s - tolerance_s):
                return guess_s
            high = guess_s - tolerance_s
        else:
            low = guess_s
    while high - low > tolerance_s:
        middle = (low + high) / 2
        if predicate(middle):
            high = middle
        else:
            low = middle
    return high


def hang_incident(
    verdict_at: Callable[[float], _hang.HangVerdict],
    began_s: float,
    judged_s: float,
    *,
    attempt: int,
    cohort: int = 0,
    watchdog_s: float | None = None,
    recovered_s: float | None = None,
    recovered_in: tuple[int, int] | None = None,
    restarts: int = 0,
    unrecovered: str | None = None,
    estimated: Sequence[str] = (),
    threshold_s: float | None = None,
) -> Incident | None:
    """The hang incident whose verdict at ``judged_s`` is ``verdict_at(judged_s)``, or
    ``None`` when that verdict is not hung.

    Args:
        verdict_at: The job's hang verdict at a moment, from the evidence that existed then
            (called :func:`first_moment`'s number of times, twice over at most).
        began_s: When the job's time without progress began (the module docstring).
        judged_s: The last moment of the incident that the verdict judges: its attempt's end,
            now while it runs, or the last evidence of the stall before progress resumed.
        attempt: Its attempt's number.
        cohort: Its attempt's cohort.
        watchdog_s: When a rank's watchdog first wrote its stacks for it, or ``None``.
        recovered_s: When training progressed again (:func:`recovery` for a hang that
            lasted until its attempt ended), or ``None``.
        recovered_in: ``(attempt, cohort)`` that progressed again, or ``None``.
        restarts: Attempts started until that one.
        unrecovered: Why ``recovered_s`` is ``None``.
        estimated: Sentences saying which moments are approximate.
        threshold_s: The probable hang threshold (H in a step phase), to find
            ``detected_s`` in fewer verdicts (the result does not depend on it).
    """
    final = verdict_at(judged_s)
    if not final.hung:
        return None
    began = min(began_s, judged_s)
    guess = None if threshold_s is None else began + threshold_s + TOLERANCE_S / 2
    detected = first_moment(lambda t: verdict_at(t).hung, began, judged_s, guess_s=guess)
    localised = None
    if final.culprits:
        culprits = set(final.culprits)

        def named(t: float) -> bool:
            verdict = verdict_at(t)
            return verdict.hung and set(verdict.culprits) == culprits

        localised = first_moment(named, detected, judged_s)
    return Incident(
        "hang",
        attempt,
        cohort,
        began,
        detected,
        localised,
        recovered_s,
        tuple(final.culprits),
        final.rule,
        stalled=len(final.stalled_ranks),
        watchdog_s=watchdog_s,
        recovered_in=recovered_in,
        restarts=restarts,
        unrecovered=None if recovered_s is not None else unrecovered,
        estimated=tuple(estimated),
    )


def recovery(
    later: Sequence[Restart],
) -> tuple[float | None, tuple[int, int] | None, int, str | None]:
    """When a hang that lasted until its attempt ended was recovered, from the attempts
    after it, in order: ``(recovered_s, (attempt, cohort), restarts, unrecovered)``, the first
    of them that completed a step (``restarts``: its place among them, from 1); without one,
    ``(None, None, len(later), "not_restarted" | "no_step_after")``."""
    for n, restart in enumerate(later, start=1):
        if restart.first_step_end_s is not None:
            return restart.first_step_end_s, (restart.attempt, restart.cohort), n, None
    return None, None, len(later), "no_step_after" if later else "not_restarted"


def straggler_incidents(
    report: _straggler.StragglerReport,
    time_of: Callable[[int, float], float | None],
    *,
    attempt: int,
    cohort: int = 0,
) -> list[Incident]:
    """The straggler incidents of one attempt, one per run of consecutive windows that flag a
    rank (the module docstring), by rank and time.

    Args:
        report: :func:`otel_training.health.straggler.assess` of the attempt.
        time_of: When a rank completed an iteration (a window's edge), Unix seconds, or
            ``None`` when its files do not tell.
        attempt: The attempt's number.
        cohort: Its cohort.
    """
    causes = {s.rank: s.cause for s in report.stragglers}
    found = []
    last_window = len(report.windows) - 1
    for rank in sorted(causes):
        row = report.scores.get(rank, [])
        flagged = _straggler._flagged_windows(row)
        for run in _runs(flagged):
            first, detecting, end = run[0], run[_straggler.CONSECUTIVE_WINDOWS - 1], run[-1]
            began = time_of(rank, report.windows[first][0])
            detected = time_of(rank, report.windows[detecting][1])
            if began is None or detected is None:
                continue
            recovered = time_of(rank, report.windows[end][1]) if end < last_window else None
            scores = sorted(row[w] for w in run if row[w] is not None)  # type: ignore[misc]
            found.append(
                Incident(
                    "straggler",
                    attempt,
                    cohort,
                    began,
                    detected,
                    detected,
                    recovered,
                    (rank,),
                    cause=causes[rank],
                    score=_median(scores),
                    unrecovered=None if recovered is not None else "still_flagged",
                )
            )
    return found


def _runs(windows: Sequence[int]) -> list[list[int]]:
    """``windows`` (ascending) split into runs of consecutive ones."""
    runs: list[list[int]] = []
    for w in windows:
        if runs and w == runs[-1][-1] + 1:
            runs[-1].append(w)
        else:
            runs.append([w])
    return runs


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def to_json(incident: Incident) -> Mapping[str, object]:
    """``incident`` as one entry of ``incidents`` in ``otel-training health --json``
    (``docs/health.md``): moments in Unix seconds, durations in seconds."""
    return {
        "kind": incident.kind,
        "attempt": incident.attempt,
        "cohort": incident.cohort,
        "began": incident.began_s,
        "detected": incident.detected_s,
        "localised": incident.localised_s,
        "recovered": incident.recovered_s,
        "time_to_detect_s": incident.time_to_detect_s,
        "time_to_localise_s": incident.time_to_localise_s,
        "time_to_recover_s": incident.time_to_recover_s,
        "culprits": list(incident.culprits),
        "rule": incident.rule,
        "cause": incident.cause,
        "score": incident.score,
        "stalled": incident.stalled,
        "watchdog": incident.watchdog_s,
        "recovered_in": None
        if incident.recovered_in is None
        else {"attempt": incident.recovered_in[0], "cohort": incident.recovered_in[1]},
        "restarts": incident.restarts,
        "unrecovered": incident.unrecovered,
        "estimated": list(incident.estimated),
    }
