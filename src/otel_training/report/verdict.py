"""The verdict on a job: one word and a sentence per question, said alike by
``otel-training health`` (its first lines) and the report (the block it opens with).

From :class:`otel_training.report.job_health.JobHealth` alone, never a second computation: is the
job healthy now, or how did it end; its goodput; a hang and its culprit; stragglers and their
cause; failed or killed attempts; what the figures estimate. Each answer is a
:class:`Finding` with a level (:data:`LEVELS`), its sentence and the report's anchor of the
section that shows it; the verdict's word is that of the worst level: ``Healthy``,
``Attention`` or ``Problem`` (``Unknown`` when nothing could be judged). Definitions:
``docs/health.md``; the words: ``docs/report.md``, "The verdict". Nothing here raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from otel_training.report.job_health import goodput_unknown
from otel_training.report.wording import duration, plural, ranks_phrase

if TYPE_CHECKING:
    from otel_training.health import goodput as _goodput
    from otel_training.health import straggler as _straggler
    from otel_training.report.job_health import AttemptHealth, JobHealth

__all__ = [
    "GOODPUT_JUDGED_AFTER_S",
    "LEVELS",
    "LOW_GOODPUT",
    "WORDS",
    "Finding",
    "Verdict",
    "goodput_text",
    "goodput_unknown",
    "hang_text",
    "judge",
    "straggler_text",
    "unknown",
    "worst",
]

#: Levels from best to worst; ``unknown`` (a question the files cannot answer) never makes a
#: verdict worse.
LEVELS: Final = ("ok", "attention", "problem")
#: The word of each level, the same in the terminal and the page (readable without colour).
WORDS: Final = {"ok": "Healthy", "attention": "Attention", "problem": "Problem",
                "unknown": "Unknown"}  # fmt: skip
#: Goodput below this share of the job's wall time needs attention.
LOW_GOODPUT: Final = 0.5
#: A job shorter than this (seconds of wall time) is not judged on its goodput: its startup
#: alone weighs too much.
GOODPUT_JUDGED_AFTER_S: Final = 600.0

#: How an attempt ended (:data:`otel_training.health.goodput.ENDINGS`) that is a failure.
_FAILED: Final = ("killed", "failed", "sigterm", "hung")


@dataclass(frozen=True)
class Finding:
    """One question answered.

    Attributes:
        topic: ``state``, ``goodput``, ``hang``, ``stragglers``, ``attempts`` or ``data``.
        level: ``ok``, ``attention``, ``problem`` or ``unknown``.
        text: The answer, a sentence that starts with its topic (``hang: none``).
        anchor: The id of the report's element that shows it (without ``#``).
    """

    topic: str
    level: str
    text: str
    anchor: str

    @property
    def word(self) -> str:
        """:data:`WORDS` of its level."""
        return WORDS[self.level]


@dataclass(frozen=True)
class Verdict:
    """The verdict on a job.

    Attributes:
        level: The worst level of its findings (``unknown`` when every one is unknown).
        headline: The answer that decides it (the state when healthy), a sentence.
        findings: One per question, in the order of the module docstring.
    """

    level: str
    headline: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def word(self) -> str:
        """``Healthy``, ``Attention``, ``Problem`` or ``Unknown``."""
        return WORDS[self.level]

    def lines(self) -> list[str]:
        """The terminal's first lines: ``Problem: <headline>``, then each finding that is not
        healthy, indented."""
        found = [f"{self.word}: {self.headline}"]
        found += [
            f"  {f.word}: {f.text}"
            for f in self.findings
            if f.level != "ok" and f.text != self.headline
        ]
        return found


def unknown(reason: str) -> Verdict:
    """The verdict on a job whose health cannot be judged, and why (a sentence)."""
    text = f"run health unknown: {reason}"
    return Verdict("unknown", text, [Finding("state", "unknown", text, "health")])


def goodput_text(account: _goodput.JobAccount) -> str:
    """``goodput 87.3 % of 10 min 00 s (8 min 44 s productive)``; unknown, with the reason
    (:func:`goodput_unknown`); a lower bound, said, when some attempt's time could not be
    split."""
    why = goodput_unknown(account)
    if why is not None:
        return f"goodput unknown: {why}"
    text = (
        f"goodput {100 * account.goodput:.1f} % of {duration(account.wall_s)} "
        f"({duration(account.productive_s)} productive)"
    )
    blind = [a.label for a in account.attempts if a.reference_rank is None]
    if blind:
        text += (
            f", a lower bound: the time of attempt{'s' if len(blind) != 1 else ''} "
            f"{', '.join(blind)} could not be split"
        )
    return text


def hang_text(item: AttemptHealth) -> str:
    """The hang of ``item`` (an attempt whose ranks were hung), as the terminal says it:
    how long without progress, the stalled ranks, the culprits and the rule that named them
    (or why none is named)."""
    v = item.hang
    assert v is not None
    head = (
        f"hang: attempt {item.account.label} has made no progress for "
        f"{duration(v.since_s)}; stalled: {ranks_phrase(v.stalled_ranks)}; "
    )
    if v.culprits:
        return head + (
            f"culprit{'s' if len(v.culprits) != 1 else ''}: {ranks_phrase(v.culprits)}"
            f" ({(v.rule or '').replace('_', ' ')})"
        )
    return head + (
        "no culprit: every rank waits at the same place (iteration and phase), so nothing "
        "they export tells them apart; their stacks are the evidence"
    )


def straggler_text(label: str, straggler: _straggler.Straggler) -> str:
    """One flagged rank: ``attempt 0, rank 1: score 1.33 in 3 windows, cause compute``."""
    s = straggler
    return (
        f"attempt {label}, rank {s.rank}: score {s.score:.2f} in {s.windows} windows, "
        f"cause {s.cause}"
    )


def judge(health: JobHealth) -> Verdict:
    """The verdict on ``health`` (the module docstring). Never raises."""
    if not health.attempts:
        return unknown("no process of this job was found in the files")
    findings = [
        _state(health),
        _goodput_finding(health),
        _hang(health),
        _stragglers(health),
        _attempts(health),
        _data(health),
    ]
    level = worst([f.level for f in findings])
    first = sorted(findings, key=lambda f: f.topic != "hang")  # a hang names its culprit
    decides = next((f for f in first if f.level == level and level != "ok"), findings[0])
    return Verdict(level, decides.text, findings)


def _state(health: JobHealth) -> Finding:
    last = health.attempts[-1].account
    n = len(health.attempts)
    which = f"attempt {last.label}" + (f", the last of {n}" if n > 1 else "")
    step = "" if last.last_iteration is None else f", last step {last.last_iteration:,}"
    if last.ended == "running":
        return Finding("state", "ok", f"running now ({which}{step})", "health-attempts")
    if last.ended == "hung":
        text = "hung now" if _live(health) else "ended hung"
        return Finding("state", "problem", f"{text} ({which}{step})", "health-hang")
    if last.ended == "completed":
        return Finding("state", "ok", f"completed ({which}{step})", "health-attempts")
    if last.ended == "exited":
        return Finding(
            "state", "attention", f"exited without completing a step ({which})", "health-attempts"
        )
    return Finding("state", "problem", f"ended {last.ended} ({which}{step})", "health-attempts")


def _live(health: JobHealth) -> bool:
    from otel_training.health import goodput as _goodput

    return _goodput.is_live(health.attempts[-1].attempt, health.judged_s)


def _goodput_finding(health: JobHealth) -> Finding:
    account = health.account
    text = goodput_text(account)
    if text.startswith("goodput unknown"):
        return Finding("goodput", "unknown", text, "health-buckets")
    if account.wall_s < GOODPUT_JUDGED_AFTER_S:
        return Finding(
            "goodput", "ok",
            f"{text}; not judged: shorter than {duration(GOODPUT_JUDGED_AFTER_S)}, where "
            "startup weighs too much", "health-buckets",
        )  # fmt: skip
    if account.goodput < LOW_GOODPUT:
        return Finding(
            "goodput", "attention",
            f"{text}, below {100 * LOW_GOODPUT:.0f} %", "health-buckets",
        )  # fmt: skip
    return Finding("goodput", "ok", text, "health-buckets")


def _hang(health: JobHealth) -> Finding:
    item = health.hang
    if item is None:
        return Finding("hang", "ok", "hang: none", "health")
    level = "problem" if item is health.attempts[-1] else "attention"
    text = hang_text(item)
    if level == "attention":
        text += " (a later attempt ran on)"
    return Finding("hang", level, text, "health-hang")


def _stragglers(health: JobHealth) -> Finding:
    flagged = [
        straggler_text(x.account.label, s)
        for x in health.attempts
        if x.stragglers is not None
        for s in x.stragglers.stragglers
    ]
    if flagged:
        return Finding(
            "stragglers", "attention", "stragglers: " + "; ".join(flagged),
            "plot-health-stragglers",
        )  # fmt: skip
    compared = any(
        score is not None
        for x in health.attempts
        if x.stragglers is not None
        for scores in x.stragglers.scores.values()
        for score in scores
    )
    if compared:
        return Finding("stragglers", "ok", "stragglers: none", "health")
    if all(len(x.account.ranks) <= 1 for x in health.attempts):
        why = "one rank, no peer to compare it with"
    else:
        why = (
            f"too few steps for a window of {health.window_steps} after the first "
            "(OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS)"
        )
    return Finding("stragglers", "unknown", f"stragglers: not judged: {why}", "health")


def _attempts(health: JobHealth) -> Finding:
    earlier = health.attempts[:-1]
    failed = [x.account for x in earlier if x.account.ended in _FAILED]
    n = len(health.attempts)
    if not failed:
        text = (
            f"attempts: {n}, none failed or killed"
            if n > 1
            else "attempts: 1" + ("" if health.attempts[0].account.ended in _FAILED else
                                  ", none failed or killed")
        )  # fmt: skip
        return Finding("attempts", "ok", text, "health-attempts")
    parts = []
    for a in failed:
        lost = a.lost_iterations
        part = f"attempt {a.label} {a.ended}"
        if lost is not None:
            part += f" (steps {lost[0]:,}–{lost[1]:,} lost)"
        parts.append(part)
    text = (
        f"attempts: {n}, {plural(len(failed), 'failed or killed', 'failed or killed')} before "
        f"the last: " + "; ".join(parts)
    )
    return Finding("attempts", "attention", text, "health-attempts")


def _data(health: JobHealth) -> Finding:
    estimated = [
        f"attempt {x.account.label}: {why}" for x in health.attempts for why in x.estimated
    ]
    if estimated:
        more = len(estimated) - 1
        text = "estimated: " + estimated[0] + (f" (and {more} more)" if more else "")
        return Finding("data", "attention", text, "health-attempts")
    return Finding("data", "ok", "estimated: nothing, every figure is from the files", "health")


def worst(levels: Sequence[str]) -> str:
    """The worst of ``levels`` (:data:`LEVELS`; ``unknown`` ignored), ``unknown`` if none."""
    judged = [level for level in levels if level in LEVELS]
    return max(judged, key=LEVELS.index) if judged else "unknown"
