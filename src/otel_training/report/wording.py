"""Words for counts and ranks, said alike everywhere: ``1 rank``, ``2 ranks``, ``rank 0``,
``ranks 0–7``. Used by the report, the trace's notes and ``otel-training health``."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "UNRECOVERED_TEXT",
    "cut",
    "duration",
    "plural",
    "rank_list",
    "ranks_phrase",
    "steps_phrase",
]


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 rank``, ``2 ranks`` (``words``: the plural when it is not ``word + "s"``)."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {words or word + 's'}"


def rank_list(ranks: Iterable[int]) -> str:
    """The ranks in order, runs of three or more consecutive ranks as ranges: ``0–3, 5, 7``;
    ``none`` when there is none."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "none"
    parts: list[str] = []
    start = previous = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        if previous - start >= 2:
            parts.append(f"{start}–{previous}")
        else:
            parts.extend(str(r) for r in range(start, previous + 1))
        if rank is not None:
            start = previous = rank
    return ", ".join(parts)


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``rank 0`` for one rank, ``ranks 0, 1`` or ``ranks 0–7`` for several, ``no rank``."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "no rank"
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {rank_list(ordered)}"


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were
    (``…[9,880 more characters]``): a name of 10,000 characters from the files would bury a
    page or a table; the files have all of it."""
    if len(text) <= limit:
        return text
    keep = max(1, limit - len(f"…[{len(text) - limit:,} more characters]"))
    return text[:keep] + f"…[{len(text) - keep:,} more characters]"


def duration(seconds: float | None) -> str:
    """A duration in seconds for a person: ``4.5 s`` under two minutes, ``3 min 07 s``,
    ``2 h 05 min``; ``–`` when unknown (``None``)."""
    if seconds is None:
        return "–"
    if abs(seconds) < 120:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {s:02d} s"


def steps_phrase(first: int | None, last: int | None) -> str:
    """The optimizer steps an attempt ran, counted one way everywhere: ``400 steps (201–600)``,
    ``1 step (7)``; ``steps up to 600`` when its first step is not known; ``steps unknown``.
    ``first`` and ``last`` are step numbers (inclusive)."""
    if last is None:
        return "steps unknown"
    if first is None or first > last:
        return f"steps up to {last:,}"
    if first == last:
        return f"1 step ({last:,})"
    return f"{plural(last - first + 1, 'step')} ({first:,}–{last:,})"


#: What an incident without a recovery says (:data:`otel_training.health.incidents.UNRECOVERED`).
UNRECOVERED_TEXT = {
    "running": "still hung now",
    "not_restarted": "the job was not restarted after it",
    "no_step_after": "no later attempt completed a step",
    "still_flagged": "still flagged in the last window of its attempt",
}
