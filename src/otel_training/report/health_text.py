"""The terminal summary of ``otel-training health``: :func:`format_text` of a
:class:`~otel_training.report.job_health.JobHealth`, the verdict first, then goodput, hangs,
stragglers and each attempt, fitted to the terminal's width. Never raises.
"""

from __future__ import annotations

from collections.abc import Sequence

from otel_training.health import goodput as _goodput
from otel_training.health import incidents as _incidents
from otel_training.report import verdict as _verdict
from otel_training.report.job_health import JobHealth
from otel_training.report.wording import UNRECOVERED_TEXT, duration, ranks_phrase

_duration = duration


def _table(rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)]
        lines.append("  " + "  ".join(cells).rstrip())
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return lines


def _records(records: Sequence[tuple[str, Sequence[tuple[str, str]]]], width: int) -> list[str]:
    """Each record as its title, then its ``key: value`` pairs wrapped to ``width`` columns:
    what a table too wide for the terminal becomes (one record per attempt, a few lines)."""
    lines = []
    for title, pairs in records:
        lines += _wrapped("  " + title, width)
        line = ""
        for pair in (f"{k}: {v}" for k, v in pairs):
            if line and len(line) + 2 + len(pair) > width:
                lines += _wrapped(line, width, "      ")
                line = ""
            line = f"{line}  {pair}" if line else "    " + pair
        lines += _wrapped(line, width, "      ")
    return lines


def _fitted(
    rows: Sequence[Sequence[str]], right: Sequence[bool], width: int | None, *, by_column: bool
) -> list[str]:
    """``rows`` (a header row first) as a table when it fits in ``width`` columns (``None``:
    any width), else as records: one per row, or one per column (``by_column``: the columns
    are the attempts), titled by the first column's header and the row's first cell, or by
    the column's header."""
    table = _table(rows, right)
    if width is None or max(map(len, table)) <= width:
        return table
    header, body = rows[0], rows[1:]
    if by_column:
        records = [(header[j], [(row[0], row[j]) for row in body]) for j in range(1, len(header))]
    else:
        records = [(f"{header[0]} {row[0]}", list(zip(header[1:], row[1:]))) for row in body]
    return _records(records, width)


def _wrapped(line: str, width: int | None, indent: str | None = None) -> list[str]:
    """``line`` cut into lines of at most ``width`` columns at spaces (a word longer than a
    line, a path or a run id, is cut too); the lines after the first are indented like it
    plus two spaces, or by ``indent``."""
    if width is None or len(line) <= width:
        return [line]
    import textwrap

    lead = line[: len(line) - len(line.lstrip(" "))]
    rest = lead + "  " if indent is None else indent
    if len(rest) >= width // 2:  # a deep stack line: cut it, keep its place
        rest = lead[: width // 4] + "  "
    return textwrap.wrap(
        line.strip(),
        width,
        initial_indent=lead[: width // 2],
        subsequent_indent=rest,
        break_on_hyphens=False,
    ) or [line[:width]]


def format_text(health: JobHealth, width: int | None = None) -> str:
    """The terminal summary of ``otel-training health`` (plain text).

    Args:
        health: The job's health.
        width: The most columns (characters) of a line, or ``None`` for lines of any length.
            A table wider than that becomes records (``key: value``, a few lines per attempt),
            and a longer line continues on the next, indented by two more spaces.
    """
    a = health.account
    lines = _verdict.judge(health).lines() + [
        f"job {health.job or '(unnamed)'}: {len(health.attempts)} attempt"
        f"{'s' if len(health.attempts) != 1 else ''}, " + _verdict.goodput_text(a),
        "",
    ]
    header = ["", "total", *[f"attempt {x.account.label}" for x in health.attempts]]
    rows = [header, ["productive", _duration(a.productive_s),
                     *[_duration(x.account.productive_s) for x in health.attempts]]]  # fmt: skip
    for name in _goodput.BUCKETS:
        rows.append(
            [name, _duration(a.buckets[name]),
             *[_duration(x.account.buckets[name]) for x in health.attempts]]
        )  # fmt: skip
    lines += _fitted(rows, [False] + [True] * (len(header) - 1), width, by_column=True)
    lines.append("")
    rows = [["attempt", "run", "ranks", "resumed from", "last step", "lost steps", "ended",
             "time to start", "time to recover"]]  # fmt: skip
    for x in health.attempts:
        acc = x.account
        lost = acc.lost_iterations
        rows.append(
            [
                acc.label + ("" if acc.numbered else " (by start time)"),
                acc.run_id or "–",
                str(len(acc.ranks)),
                "–" if acc.resumed_from is None else str(acc.resumed_from),
                "–" if acc.last_iteration is None else str(acc.last_iteration),
                "–" if lost is None else f"{lost[0]}–{lost[1]}",
                acc.ended,
                _duration(acc.time_to_start_s),
                _duration(acc.time_to_recover_s),
            ]
        )
    lines += _fitted(
        rows, [False, False, True, True, True, True, False, True, True], width, by_column=False
    )
    for x in health.attempts:
        for why in x.estimated:
            lines.append(f"  estimated, attempt {x.account.label}: {why}")
    hang = health.hang
    lines.append("")
    if hang is None:
        lines.append("hang: none")
    else:
        v = hang.hang
        assert v is not None
        lines.append(_verdict.hang_text(hang))
        for rank, phase in sorted(v.phases.items()):
            lines.append(
                f"  rank {rank}: in {phase}" + ("  <- culprit" if rank in v.culprits else "")
            )
        for rank, records in sorted(hang.stacks.items()):
            if v.culprits and rank not in v.culprits:
                continue
            for record in records:
                for thread in record.get("threads", ())[:1]:
                    lines.append(f"  rank {rank}, thread {thread.get('name')}:")
                    lines += [
                        "    " + s for s in str(thread.get("stack", "")).rstrip().splitlines()
                    ]
    flagged = [(x.account.label, s) for x in health.attempts if x.stragglers
               for s in x.stragglers.stragglers]  # fmt: skip
    if flagged:
        lines.append("stragglers:")
        for attempt, s in flagged:
            lines.append("  " + _verdict.straggler_text(attempt, s))
    else:
        lines.append("stragglers: none")
    lines += incident_lines(health)
    for note in health.notes:
        lines.append(f"note: {note}")
    return "\n".join(part for line in lines for part in _wrapped(line, width))


def incident_text(incident: _incidents.Incident, job_start_s: float) -> str:
    """One incident in a sentence: what, where, and its moments as durations from when it
    began (which is given from the job's start)."""
    x = incident
    if x.kind == "hang":
        what = f"hang in attempt {x.label}"
        if x.culprits:
            who = (
                f"culprit{'s' if len(x.culprits) != 1 else ''} {ranks_phrase(x.culprits)}"
                f" ({(x.rule or '').replace('_', ' ')})"
            )
        else:
            who = "no culprit named"
    else:
        what = f"straggler in attempt {x.label}"
        score = "" if x.score is None else f", score {x.score:.2f}"
        who = f"{ranks_phrase(x.culprits)} (cause {x.cause}{score})"
    parts = [
        f"{what}: began {_duration(x.began_s - job_start_s)} into the job",
        f"detected after {_duration(x.time_to_detect_s)}",
    ]
    if x.time_to_localise_s is not None:
        parts.append(f"localised after {_duration(x.time_to_localise_s)}: {who}")
    else:
        parts.append(who)
    if x.time_to_recover_s is not None:
        where = ""
        if x.recovered_in is not None and x.recovered_in != (x.attempt, x.cohort):
            attempt, cohort = x.recovered_in
            label = f"{attempt}.{cohort}" if cohort else str(attempt)
            where = (
                f" (in attempt {label}, after {x.restarts} restart{'s' if x.restarts != 1 else ''})"
            )
        verb = "stopped being flagged" if x.kind == "straggler" else "recovered"
        parts.append(f"{verb} after {_duration(x.time_to_recover_s)}{where}")
    else:
        why = UNRECOVERED_TEXT.get(x.unrecovered or "", "not recovered")
        if x.unrecovered == "no_step_after":
            why += f" ({x.restarts} restart{'s' if x.restarts != 1 else ''})"
        parts.append(f"not recovered: {why}")
    text = "; ".join(parts)
    if x.estimated:
        text += " (estimated: " + "; ".join(x.estimated) + ")"
    return text


def incident_lines(health: JobHealth) -> list[str]:
    """The terminal summary's incidents: one line each, or ``incidents: none``."""
    if not health.incidents:
        return ["incidents: none"]
    start = health.account.start_s
    return ["incidents:"] + ["  " + incident_text(x, start) for x in health.incidents]
