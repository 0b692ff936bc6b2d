"""The report's "Run health" section: figures and tables of a job's health.

From :class:`otel_training.report.health.JobHealth` (every attempt of the job the run belongs
to): goodput and badput of each attempt as a bar over wall time, where each rank's time went
(its ledger's phases), the progress at risk over time (``dl.training.checkpoint.age``),
straggler scores per window, and a hang's culprits with their threads' stacks. Needs the
``report`` extra (plotly); imported only when a report is built.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from otel_training.health import goodput as _goodput
from otel_training.health import straggler as _straggler
from otel_training.health.ledger import PHASES
from otel_training.health.risk import progress_at_risk_s
from otel_training.report.job_health import JobHealth
from otel_training.report.plot import Plot
from otel_training.report.series import round_significant
from otel_training.report.style import BUCKET_COLORS, PALETTE, PHASE_COLORS, layout
from otel_training.report.verdict import goodput_text
from otel_training.report.wording import UNRECOVERED_TEXT, cut, ranks_phrase

__all__ = ["health_plots", "health_tables"]


def _r(value: float) -> float:
    return round_significant(value, 6)  # type: ignore[return-value]


#: The goodput bars' blocks in the order they happen in an attempt: its startup, loads and
#: first step; then its steps and what interrupts them (data waits, saves, evaluations, the
#: rest); then what its end costs (progress a later attempt redid, a hang); the downtime after.
TIME_ORDER: tuple[str, ...] = (
    "startup", "checkpoint_load", "warmup_excess", "productive", "data_wait", "checkpoint_save",
    "evaluate", "other", "lost_progress", "hang", "downtime",
)  # fmt: skip


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def goodput_plot(health: JobHealth) -> Plot | None:
    """Each attempt's wall time as one bar from 0, cut into productive time and the badput
    buckets in the order they happen in an attempt (:data:`TIME_ORDER`, each block as long as
    its total, seconds), the downtime after it last. Not a timeline: the blocks of steps and
    of what interrupts them are totals."""
    account = health.account
    if not account.attempts or account.wall_s <= 0:
        return None
    names = list(TIME_ORDER)
    bars: dict[str, dict[str, list]] = {
        n: {"base": [], "x": [], "y": [], "text": []} for n in names
    }
    rows = []
    for item in account.attempts:
        row = f"attempt {item.label}"
        rows.append(row)
        at = 0.0
        total = item.end_s - item.start_s
        for name in names:
            seconds = item.productive_s if name == "productive" else item.buckets[name]
            if seconds <= 0:
                continue
            bar = bars[name]
            bar["base"].append(_r(at))
            bar["x"].append(_r(seconds))
            bar["y"].append(row)
            share = seconds / total if name != "downtime" and total > 0 else None
            bar["text"].append(
                f"attempt {item.label}: {name} {seconds:.1f} s"
                + (f" ({100 * share:.1f} % of the attempt)" if share is not None else "")
            )
            at += seconds
    traces = [
        go.Bar(
            base=bar["base"], x=bar["x"], y=bar["y"], orientation="h", name=name,
            hovertext=bar["text"], hoverinfo="text", marker={"color": BUCKET_COLORS[name]},
            width=0.6,
        )
        for name, bar in bars.items()
        if bar["x"]
    ]  # fmt: skip
    height = min(600, 170 + 40 * len(rows))
    figure_layout = layout(
        "seconds of the attempt, each bucket's total (not a timeline)",
        "attempt",
        height=height,
        barmode="overlay",
        yaxis={"autorange": "reversed", "categoryorder": "array", "categoryarray": rows},
        legend=_legend_below(height),
        margin={"l": 80, "r": 20, "t": 20, "b": 45},
    )
    points = sum(len(b["x"]) for b in bars.values())
    caption = (
        f"{_sentence(goodput_text(account))}. Each attempt is one bar of its wall time, its "
        "buckets in the order they happen in an attempt: startup, checkpoint load, the first "
        "step's excess, then the steps (productive) with the data waits, saves, evaluations "
        "and other time between them added up, then progress lost and a hang at its end; "
        "grey at the end: downtime before the next attempt. Lengths are totals in seconds, "
        "not a timeline. Definitions: docs/health.md."
    )
    return Plot("plot-health-goodput", "Goodput and badput by attempt", caption,
                go.Figure(traces, figure_layout), points)  # fmt: skip


def phases_plot(health: JobHealth) -> Plot | None:
    """Where each rank's time went: its ledger's phase times at its last export, per attempt."""
    rows: list[str] = []
    values: dict[str, list[float]] = {p: [] for p in PHASES}
    several = len(health.attempts) > 1
    for item in health.attempts:
        for process in sorted(item.attempt.processes, key=lambda p: p.rank):
            ledger = process.ledger
            if not ledger:
                continue
            rows.append(
                f"attempt {item.account.label}, rank {process.rank}"
                if several
                else f"rank {process.rank}"
            )
            last = ledger[-1].phase_s
            for i, phase in enumerate(PHASES):
                values[phase].append(_r(last[i]))  # type: ignore[index]
    if not rows:
        return None
    traces = [
        go.Bar(x=values[p], y=rows, orientation="h", name=p, marker={"color": PHASE_COLORS[p]},
               hovertemplate=f"%{{y}}: {p} %{{x:.3g}} s<extra></extra>")
        for p in PHASES
        if any(values[p])
    ]  # fmt: skip
    height = min(900, 170 + 24 * len(rows))
    figure_layout = layout(
        "seconds with the phase innermost, up to the process's last export",
        "process",
        height=height,
        barmode="stack",
        yaxis={"autorange": "reversed"},
        legend=_legend_below(height),
        margin={"l": 100, "r": 20, "t": 20, "b": 45},
    )
    points = sum(1 for p in PHASES for v in values[p] if v)
    caption = (
        "Each process's <code>dl.training.phase.time</code>: the seconds it spent with each "
        "phase innermost, from its start to its last export. Busy time (data loading + "
        "forward/backward + optimizer) that is longer on one rank while its communication is "
        "shorter is a straggler; the others wait for it in communication."
    )
    return Plot("plot-health-phases", "Where each rank's time goes", caption,
                go.Figure(traces, figure_layout), points)  # fmt: skip


def risk_plot(health: JobHealth) -> Plot | None:
    """The job's progress at risk over time, one line per attempt
    (:func:`otel_training.health.risk.progress_at_risk_s`, at every export of its ranks)."""
    t0 = health.account.start_s
    traces = []
    points = 0
    for item in health.attempts:
        processes = item.attempt.processes
        times = sorted({s.time_s for p in processes for s in p.ledger})
        pairs = [(t, progress_at_risk_s(processes, t)) for t in times]
        pairs = [(t, risk) for t, risk in pairs if risk is not None]
        if not pairs:
            continue
        points += len(pairs)
        attempt = item.account
        traces.append(
            go.Scatter(
                x=[_r(t - t0) for t, _ in pairs], y=[_r(risk) for _, risk in pairs],
                mode="lines+markers", marker={"size": 4}, name=f"attempt {attempt.label}",
                line={"color": PALETTE[len(traces) % len(PALETTE)], "width": 1.5},
            )
        )  # fmt: skip
    if not traces:
        return None
    figure_layout = layout("seconds since the job's first process started", "progress at risk (s)")
    caption = (
        "The job's progress at risk at each export: the seconds of training a crash would lose "
        "then, since the step its last good checkpoint holds completed (the oldest last save "
        "of the ranks that save, <code>dl.training.checkpoint.age</code>; a rank that never "
        "saves plays no part), or since training began before the first save. It drops at "
        "each good save; a line that keeps climbing means saves fail or stopped."
    )
    return Plot(
        "plot-health-risk", "Progress at risk", caption, go.Figure(traces, figure_layout), points
    )


def straggler_plot(health: JobHealth) -> Plot | None:
    """The straggler score of each rank in each window, per attempt."""
    columns: list[str] = []
    ranks = sorted(
        {r for item in health.attempts if item.stragglers for r in item.stragglers.scores}
    )
    if not ranks:
        return None
    z: dict[int, list[float | None]] = {r: [] for r in ranks}
    for item in health.attempts:
        report = item.stragglers
        if report is None or not report.windows:
            continue
        for w, (first, last) in enumerate(report.windows):
            columns.append(f"a{item.account.label} {first:.0f}–{last:.0f}")
            for r in ranks:
                row = report.scores.get(r)
                value = row[w] if row is not None and w < len(row) else None
                z[r].append(None if value is None else _r(value))
    if not columns:
        return None
    step = max(1, len(columns) // 240)
    kept = list(range(0, len(columns), step))
    figure = go.Figure(
        go.Heatmap(
            z=[[z[r][i] for i in kept] for r in ranks],
            x=[columns[i] for i in kept],
            y=[f"rank {r}" for r in ranks],
            zmin=0.8, zmax=1.6, zmid=1.0, colorscale="RdBu", reversescale=True,
            colorbar={"title": {"text": "score (× peers)"}},
            hovertemplate="%{y}, steps %{x}: score %{z:.3f}<extra></extra>",
        ),
        layout("window (attempt, steps)", "rank", height=min(700, 160 + 22 * len(ranks)),
               xaxis={"type": "category"}),
    )  # fmt: skip
    flagged = [
        f"rank {s.rank} (attempt {item.account.label}: score {s.score:.2f} in {s.windows} "
        f"windows, cause {s.cause})"
        for item in health.attempts
        if item.stragglers
        for s in item.stragglers.stragglers
    ]
    caption = (
        "Busy time per step (data loading + forward/backward + optimizer) over its peers' "
        "reference (same pipeline stage: the others' median in groups of 2-3, the lower "
        f"quartile of larger groups). Above {_straggler.SCORE_THRESHOLD:g} in "
        f"{_straggler.CONSECUTIVE_WINDOWS} consecutive windows, the first of an attempt left "
        "out, a rank is a straggler: "
        + ("; ".join(flagged) if flagged else "none")
        + "."
        + (f" Every {step}th window shown." if step > 1 else "")
    )
    return Plot("plot-health-stragglers", "Stragglers by window", caption, figure,
                len(kept) * len(ranks), step > 1)  # fmt: skip


def _legend_below(height: int) -> dict:
    """A legend under the x axis title of a figure ``height`` pixels tall (clear of the
    tool bar at the top right)."""
    return {"orientation": "h", "x": 0, "y": -62 / max(1, height - 65), "yanchor": "top"}


def health_plots(health: JobHealth) -> list[Plot]:
    """The section's figures (those with data). Never raises for missing data."""
    return [
        p
        for p in (
            goodput_plot(health),
            phases_plot(health),
            risk_plot(health),
            straggler_plot(health),
        )  # fmt: skip
        if p is not None
    ]


def incident_rows(health: JobHealth) -> list[dict[str, str]]:
    """The section's incidents table (:mod:`otel_training.health.incidents`): one row per
    incident, its moments as durations from when it began (which is given from the job's
    start)."""
    rows = []
    start = health.account.start_s

    def seconds(value: float | None) -> str:
        return "–" if value is None else f"{value:,.1f} s"

    for x in health.incidents:
        if x.recovered_s is not None:
            recovery = "stopped being flagged" if x.kind == "straggler" else "recovered"
            if x.recovered_in is not None and x.recovered_in != (x.attempt, x.cohort):
                attempt, cohort = x.recovered_in
                label = f"{attempt}.{cohort}" if cohort else str(attempt)
                recovery += (
                    f" in attempt {label} ({x.restarts} restart{'s' if x.restarts != 1 else ''})"
                )
        else:
            recovery = "not recovered: " + UNRECOVERED_TEXT.get(x.unrecovered or "", "–")
        if x.estimated:
            recovery += " (estimated: " + "; ".join(x.estimated) + ")"
        if x.kind == "hang":
            why = (x.rule or "no culprit named").replace("_", " ")
        else:
            why = f"{x.cause}" + ("" if x.score is None else f", score {x.score:.2f}")
        rows.append(
            {
                "kind": x.kind,
                "attempt": x.label,
                "culprits": cut(ranks_phrase(x.culprits), 240) if x.culprits else "–",
                "why": why,
                "began": seconds(x.began_s - start),
                "detect": seconds(x.time_to_detect_s),
                "localise": seconds(x.time_to_localise_s),
                "recover": seconds(x.time_to_recover_s),
                "recovery": recovery,
            }
        )
    return rows


def health_tables(health: JobHealth) -> dict[str, Any]:
    """The section's tables: buckets by attempt, the attempts, the incidents, the hang and its
    stacks."""
    a = health.account
    headers = ["total", *[f"attempt {x.account.label}" for x in health.attempts]]
    rows = []

    def cell(seconds: float, whole: float) -> str:
        return f"{seconds:,.1f} s ({100 * seconds / whole:.1f} %)" if whole > 0 else "–"

    per_attempt = [x.account for x in health.attempts]
    rows.append(
        ["productive", cell(a.productive_s, a.wall_s)]
        + [cell(x.productive_s, x.wall_s) for x in per_attempt]
    )
    for name in _goodput.BUCKETS:
        rows.append(
            [name, cell(a.buckets[name], a.wall_s)]
            + [cell(x.buckets[name], x.wall_s) for x in per_attempt]
        )

    def seconds(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f} s"

    def text(value: Any) -> str:
        return "–" if value is None else str(value)

    attempts = []
    estimated = {id(x.account): x.estimated for x in health.attempts}
    for acc in per_attempt:
        lost = acc.lost_iterations
        attempts.append(
            {
                "attempt": acc.label,
                "run_id": cut(text(acc.run_id), 240),
                "ranks": len(acc.ranks),
                "resumed_from": text(acc.resumed_from),
                "last_iteration": text(acc.last_iteration),
                "lost": "–" if lost is None else f"{lost[0]}–{lost[1]}",
                "ended": acc.ended,
                "time_to_start": seconds(acc.time_to_start_s),
                "time_to_recover": seconds(acc.time_to_recover_s),
                "estimated": "; ".join(estimated.get(id(acc), ())),
            }
        )
    hang = None
    item = health.hang
    if item is not None and item.hang is not None:
        verdict = item.hang
        stacks = []
        for rank, records in sorted(item.stacks.items()):
            for record in records:
                for thread in record.get("threads", ()):
                    stacks.append(
                        {
                            "rank": rank,
                            "culprit": rank in verdict.culprits,
                            "thread": f"{thread.get('name')}"
                            + (" (training thread)" if thread.get("training") else ""),
                            "stack": str(thread.get("stack", "")),
                        }
                    )
        hang = {
            "attempt": item.account.attempt,
            "since_s": f"{verdict.since_s:.1f} s",
            "stalled": ranks_phrase(verdict.stalled_ranks),
            "culprits": ranks_phrase(verdict.culprits) if verdict.culprits else "none named",
            "culprit_count": len(verdict.culprits),
            "rule": (verdict.rule or "").replace("_", " "),
            "phases": [(r, p, r in verdict.culprits) for r, p in sorted(verdict.phases.items())],
            "stacks": stacks,
        }
    return {
        "goodput": goodput_text(a),
        "wall": f"{a.wall_s:,.1f} s",
        "headers": headers,
        "rows": rows,
        "attempts": attempts,
        "incidents": incident_rows(health),
        "hang": hang,
        "job": cut(health.job or "–", 120),
        "directories": [str(d) for d in health.directories],
        "notes": list(health.notes),
    }
