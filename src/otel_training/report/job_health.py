"""What run health found for one job (:class:`JobHealth`), and the document
``otel-training health --json`` writes of it.

Built by :mod:`otel_training.report.health` (``assess_job``, ``assess_read``) from the definitions
of :mod:`otel_training.health`; judged in words by :mod:`otel_training.report.verdict`, drawn by
:mod:`otel_training.report.health_figures`. It sits below all three, so that the verdict reads
it without importing ``report.health``, which prints the verdict. Nothing here raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_training.health import goodput as _goodput
from otel_training.health import hang as _hang
from otel_training.health import incidents as _incidents
from otel_training.health import straggler as _straggler
from otel_training.health.evidence import Attempt, Process
from otel_training.report.wording import duration

__all__ = ["AttemptHealth", "JobHealth", "goodput_unknown"]


@dataclass
class AttemptHealth:
    """One attempt: its account, and its hang and stragglers."""

    account: _goodput.AttemptAccount
    attempt: Attempt
    hang: _hang.HangVerdict | None = None
    stacks: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    stragglers: _straggler.StragglerReport | None = None
    estimated: list[str] = field(default_factory=list)


@dataclass
class JobHealth:
    """The health of one job (:mod:`otel_training.report.health`).

    Attributes:
        job: ``dl.job.id`` (else the run id without its attempt suffix).
        directories: The run directories read.
        judged_s: The moment judged, Unix seconds.
        account: Goodput and badput (:mod:`otel_training.health.goodput`).
        attempts: Per attempt, with its hang verdict and stragglers.
        policy: The hang thresholds used.
        window_steps: Steps per straggler window asked for.
        notes: What was odd about the files, or limited the figures.
        processes: Every process read.
        incidents: Its hangs and stragglers with their moments
            (:mod:`otel_training.health.incidents`), by when they began.
    """

    job: str | None
    directories: list[Path]
    judged_s: float
    account: _goodput.JobAccount
    attempts: list[AttemptHealth]
    policy: _hang.HangPolicy
    window_steps: int
    notes: list[str] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    incidents: list[_incidents.Incident] = field(default_factory=list)

    @property
    def hang(self) -> AttemptHealth | None:
        """The last attempt whose ranks were hung (at its end, or now while running)."""
        for item in reversed(self.attempts):
            if item.hang is not None and item.hang.hung:
                return item
        return None

    def to_json(self) -> dict[str, Any]:
        """The document of ``otel-training health --json`` (``docs/health.md``): times in Unix
        seconds, durations in seconds; a value that is not a finite number is ``null`` (strict
        JSON)."""
        return _finite(self._document())

    def _document(self) -> dict[str, Any]:
        account = self.account
        hang = self.hang
        stragglers = [
            {
                "rank": s.rank,
                "score": round(s.score, 4),
                "cause": s.cause,
                "windows": s.windows,
                "attempt": item.account.attempt,
                "excess_s": {k: round(v, 6) for k, v in s.excess_s.items()},
            }
            for item in self.attempts
            if item.stragglers is not None
            for s in item.stragglers.stragglers
        ]
        unknown = goodput_unknown(account)
        return {
            "job": self.job,
            "wall_s": account.wall_s,
            "goodput": None if unknown else account.goodput,
            "productive_s": None if unknown else account.productive_s,
            "goodput_unknown": unknown,
            "badput_s": dict(account.buckets),
            "attempts": [_attempt_json(item) for item in self.attempts],
            "hang": None if hang is None else _hang_json(hang),
            "stragglers": stragglers,
            "incidents": [_incidents.to_json(x) for x in self.incidents],
            "start": account.start_s,
            "end": account.end_s,
            "judged_at": self.judged_s,
            "thresholds": {
                "hang_floor_s": self.policy.floor_s,
                "hang_phase_budget_s": self.policy.phase_budget_s,
                "hang_startup_s": self.policy.startup_s,
                "straggler_window_steps": self.window_steps,
            },
            "directories": [str(d) for d in self.directories],
            "notes": list(self.notes),
        }


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, infinities) as ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _attempt_json(item: AttemptHealth) -> dict[str, Any]:
    a = item.account
    return {
        "attempt": a.attempt,
        "run_id": a.run_id,
        "start": a.start_s,
        "end": a.end_s,
        "resumed_from": a.resumed_from,
        "last_iteration": a.last_iteration,
        "ended": a.ended,
        "numbered": a.numbered,
        "cohort": a.cohort,
        "world_size": a.world_size,
        "ranks": a.ranks,
        "reference_rank": a.reference_rank,
        # unknown (null) when no rank's time could be split: all of it would read ``other``
        "productive_s": None if a.reference_rank is None else a.productive_s,
        "goodput": None if a.reference_rank is None or a.wall_s <= 0 else a.productive_s / a.wall_s,
        "badput_s": dict(a.buckets),
        "lost_iterations": list(a.lost_iterations) if a.lost_iterations else None,
        "median_step_s": a.median_step_s,
        "hang_threshold_s": a.hang_threshold_s,
        "time_to_start_s": a.time_to_start_s,
        "time_to_recover_s": a.time_to_recover_s,
        "hang": None if item.hang is None or not item.hang.hung else _hang_json(item),
        "estimated": list(item.estimated),
    }


def _hang_json(item: AttemptHealth) -> dict[str, Any]:
    verdict = item.hang
    assert verdict is not None
    return {
        "stalled_ranks": list(verdict.stalled_ranks),
        "culprits": list(verdict.culprits),
        "since_s": verdict.since_s,
        "phases": {str(rank): phase for rank, phase in verdict.phases.items()},
        "rule": verdict.rule,
        "silent_ranks": list(verdict.silent_ranks),
        "attempt": item.account.attempt,
        "stacks": {str(rank): records for rank, records in item.stacks.items()},
    }


def goodput_unknown(account: _goodput.JobAccount) -> str | None:
    """Why the goodput of ``account`` cannot be known (a clause: ``goodput unknown: <it>``),
    or ``None`` when it can: no attempt was seen, or none could have its time split (no rank
    exported the health ledger and none wrote a phase span: all of it would read ``other``).
    ``otel-training health --json`` then gives ``null`` for it, with this reason."""
    if not account.attempts or account.wall_s <= 0:
        return "no attempt of this job was seen"
    if all(a.reference_rank is None for a in account.attempts):
        return (
            f"no rank exported the health ledger (dl.training.phase.time) to these files nor "
            f"wrote a phase span in {duration(account.wall_s)} (metrics sent only to "
            "Prometheus or a collector are not in them)"
        )
    return None
