"""The report's timeline: every rank's spans on one time axis, nested as Perfetto nests slices.

Per rank one row per nesting level (and per concurrent track, :mod:`otel_training.report.tracks`),
each row labelled with the rank and the spans it holds (``rank 0 · train``, ``train.iteration``),
as Perfetto names a process's tracks; bars coloured by span group, each group its own colour in
every report (:data:`otel_training.report.style.GROUP_COLORS`); failed spans (status ERROR)
outlined in red, truncated ones hatched. Over a budget of bars, deep spans are left out, then
runs of spans of one name are merged into one bar (the trace file has every span).

Needs the ``report`` extra (plotly); imported only when a report is built.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from html import escape

import plotly.graph_objects as go

from otel_training.report.plot import Plot
from otel_training.report.run import TRUNCATED_ATTRIBUTE, Run, Span
from otel_training.report.style import ERROR_COLOR, group_color, label, layout
from otel_training.report.tracks import place_spans
from otel_training.semconv.attributes import MEGATRON_ITERATION
from otel_training.semconv.spans import SPAN_GROUP_LEVELS, SPANS

__all__ = ["row_label", "timeline_plot"]

#: Rows up to which every row is labelled; beyond, the first row of each rank only.
MAX_LABELLED_ROWS = 120
#: Span names named in one row's label at most.
NAMES_PER_ROW = 3


@dataclass
class _Item:
    span: Span
    count: int = 1
    iterations: tuple[int, int] | None = None
    merged: list[Span] = field(default_factory=list)


def _depths(spans: list[Span]) -> dict[str, int]:
    """Nesting depth of each span among ``spans`` (0: no parent among them)."""
    by_id = {s.span_id: s for s in spans}
    depth: dict[str, int] = {}
    for span in spans:
        chain, seen, current = [], set(), span
        while current is not None and current.span_id not in depth:
            if current.span_id in seen:  # a cycle of ids: stop climbing
                break
            seen.add(current.span_id)
            chain.append(current)
            current = by_id.get(current.parent_span_id) if current.parent_span_id else None
        base = depth[current.span_id] if current is not None and current.span_id in depth else -1
        for s in reversed(chain):
            base += 1
            depth[s.span_id] = base
    return depth


def _merge_siblings(run: Run, spans: list[Span]) -> list[_Item]:
    """Runs of consecutive siblings of one name become one item (their children dropped)."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        parent = span.parent_span_id if span.parent_span_id in ids else None
        children.setdefault(parent, []).append(span)
    items: list[_Item] = []
    stack: list[list[Span]] = [children.get(None, [])]
    while stack:
        siblings = stack.pop()
        i = 0
        while i < len(siblings):
            j = i
            while j + 1 < len(siblings) and siblings[j + 1].name == siblings[i].name:
                j += 1
            group = siblings[i : j + 1]
            if len(group) == 1:
                items.append(_Item(group[0]))
                stack.append(children.get(group[0].span_id, []))
            else:
                first = group[0]
                iterations = [
                    s.attributes.get(MEGATRON_ITERATION)
                    for s in group
                    if isinstance(s.attributes.get(MEGATRON_ITERATION), int)
                ]
                attributes = {}
                if any(s.truncated for s in group):
                    attributes[TRUNCATED_ATTRIBUTE] = True
                merged = Span(
                    rank=first.rank,
                    name=first.name,
                    trace_id=first.trace_id,
                    span_id=f"merged-{first.span_id}",
                    parent_span_id=first.parent_span_id,
                    start_ns=first.start_ns,
                    end_ns=max(run.span_end_ns(s) for s in group),
                    status="ERROR" if any(s.failed for s in group) else "UNSET",
                    attributes=attributes,
                )
                items.append(
                    _Item(
                        merged,
                        len(group),
                        (min(iterations), max(iterations)) if iterations else None,
                        group,
                    )
                )
            i = j + 1
    return items


def _reduce(run: Run, spans: list[Span], budget: int) -> tuple[list[_Item], str | None]:
    if len(spans) <= budget:
        return [_Item(s) for s in spans], None
    depth = _depths(spans)
    deepest = max(depth.values(), default=0)
    for limit in range(deepest, 0, -1):
        kept = [s for s in spans if depth.get(s.span_id, 0) <= limit]
        if len(kept) <= budget:
            return [_Item(s) for s in kept], f"spans nested deeper than {limit} levels left out"
    items = _merge_siblings(run, spans)
    note = "consecutive spans of one name merged into one bar"
    if len(items) > budget:
        items.sort(key=lambda it: run.span_end_ns(it.span) - it.span.start_ns, reverse=True)
        items = items[:budget]
        note += f"; only the {budget} longest bars kept"
    return items, note


def _duration(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e3:.3g} µs"


def _hover(run: Run, item: _Item, t0: int) -> str:
    span = item.span
    end = run.span_end_ns(span)
    # plotly reads hover text as a little HTML: what comes from the files is escaped.
    lines = [f"<b>{label(span.name, 200)}</b>" + (f" × {item.count:,}" if item.count > 1 else "")]
    lines.append(
        f"rank {span.rank}, {(span.start_ns - t0) / 1e9:.3f} s to {(end - t0) / 1e9:.3f} s"
    )
    lines.append(f"duration {_duration(end - span.start_ns)}")
    if item.count > 1:
        total = sum(run.span_end_ns(s) - s.start_ns for s in item.merged)
        lines.append(f"mean {_duration(total / item.count)} each")
        if item.iterations:
            lines.append(f"iterations {item.iterations[0]:,}–{item.iterations[1]:,}")
    else:
        for key, value in list(span.attributes.items())[:8]:
            lines.append(f"{label(key, 80)}: {label(value, 80)}")
    if span.failed:
        lines.append(f"<b>ERROR</b> {label(span.status_description or '', 200)}".strip())
    if span.open:
        lines.append("<b>never ended</b> (shown until the rank's last time)")
    elif span.truncated:
        lines.append("<b>truncated</b>: ended at exit")
    return "<br>".join(lines)


def _short(name: str) -> str:
    return name.removeprefix("megatron.")


def row_label(names: Counter, rank: int | None = None) -> str:
    """A row's tick label: the rank (on a rank's first row) and the span names the row holds,
    the most frequent first, without ``megatron.`` and with a dotted prefix they share said
    by its last part (``rank 0 · train``, ``iteration: data_loading, forward_backward, …``);
    escaped for plotly."""
    ordered = [_short(name) for name, _ in names.most_common()]
    shown = ordered[:NAMES_PER_ROW]
    parts = [name.split(".") for name in shown]
    common = 0
    if len(parts) > 1:
        while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
            common += 1
    text = ", ".join(".".join(p[common:]) for p in parts)
    if common:
        text = parts[0][common - 1] + ": " + text
    if len(ordered) > NAMES_PER_ROW:
        text += ", …"
    text = label(text, 56)
    return f"rank {rank} · {text}" if rank is not None else text


def timeline_plot(run: Run, *, max_bars: int = 3_000):
    """The phases of every rank on one time axis (see the module docstring).

    Args:
        max_bars: Budget of bars; over it, deep spans are left out, then runs of spans of one
            name are merged into one bar (the trace file has every span).

    Returns:
        The plot (``None`` without spans) and what was reduced, if anything. Never raises.
    """
    if not run.spans:
        return None, None
    t0 = min(s.start_ns for s in run.spans)
    by_rank: dict[int, list[Span]] = {}
    for span in run.spans:
        by_rank.setdefault(span.rank, []).append(span)
    budget = max(100, max_bars // len(by_rank))
    bars: dict[str, dict[str, list]] = {}
    rows_of_rank: list[tuple[int, int, list[Counter]]] = []  # rank, first row, names per row
    shapes = []
    row_base, reductions = 0, set()
    for band, rank in enumerate(sorted(by_rank)):
        items, note = _reduce(run, by_rank[rank], budget)
        if note:
            reductions.add(note)
        merged_of = {it.span.span_id: it for it in items}
        placements = place_spans(run, [it.span for it in items])
        rows = sorted({(p.track, p.depth) for p in placements})
        row_of = {key: row_base + i for i, key in enumerate(rows)}
        names: list[Counter] = [Counter() for _ in rows]
        rows_of_rank.append((rank, row_base, names))
        if band % 2 == 0:
            shapes.append(
                {
                    "type": "rect",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": row_base - 0.5,
                    "y1": row_base + len(rows) - 0.5,
                    "fillcolor": "#f3f5f8",
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
        for p in placements:
            item = merged_of[p.span.span_id]
            span = item.span
            spec = SPANS.get(span.name)
            group = spec.group if spec is not None else "custom"
            row = row_of[(p.track, p.depth)]
            names[row - row_base][span.name] += item.count
            entry = bars.setdefault(
                group,
                {"base": [], "x": [], "y": [], "text": [], "line": [], "width": [], "pattern": []},
            )
            entry["base"].append(round((p.start_ns - t0) / 1e9, 6))
            entry["x"].append(round((p.end_ns - p.start_ns) / 1e9, 6))
            entry["y"].append(row)
            entry["text"].append(_hover(run, item, t0))
            entry["line"].append(ERROR_COLOR if span.failed else "rgba(0,0,0,0.25)")
            entry["width"].append(2.5 if span.failed else 0.5)
            entry["pattern"].append("/" if span.truncated else "")
        row_base += len(rows)
    tickvals, ticktext = [], []
    every_row = row_base <= MAX_LABELLED_ROWS
    for rank, first, names in rows_of_rank:
        for i, counter in enumerate(names):
            if i and not every_row:
                break
            tickvals.append(first + i)
            ticktext.append(row_label(counter, rank if i == 0 else None))
    traces = []
    for group in [*sorted(SPAN_GROUP_LEVELS), *sorted(set(bars) - set(SPAN_GROUP_LEVELS))]:
        entry = bars.get(group)
        if not entry:
            continue
        traces.append(
            go.Bar(
                base=entry["base"],
                x=entry["x"],
                y=entry["y"],
                orientation="h",
                name=label(group),
                hovertext=entry["text"],
                hoverinfo="text",
                width=0.8,
                marker={
                    "color": group_color(group),
                    "line": {"color": entry["line"], "width": entry["width"]},
                    "pattern": {
                        "shape": entry["pattern"],
                        "fgcolor": "rgba(0,0,0,0.55)",
                        "size": 6,
                    },
                },
            )
        )
    height = min(900, max(240, 110 + 24 * row_base))
    layout_ = layout(
        "seconds since the first span",
        "rank · spans of the row",
        height=height,
        barmode="overlay",
        hovermode="closest",
        shapes=shapes,
        yaxis={
            "tickvals": tickvals,
            "ticktext": ticktext,
            "autorange": "reversed",
            "showgrid": False,
            "range": None,
            "tickfont": {"size": 11},
        },
        legend={"title": {"text": "span group"}},
        margin={"l": 70, "r": 20, "t": 34, "b": 50},
    )
    layout_["legend"]["y"] = -60 / max(1, height - 70)
    points = sum(len(e["x"]) for e in bars.values())
    caption = (
        "Each rank's spans on one time axis (Unix-epoch clocks of the hosts), one row per "
        "nesting level, labelled with the spans it holds; coloured by span group, each its own "
        "colour. Red outline: failed (status ERROR); hatched: truncated (never ended, or ended "
        "at exit). Hover a bar for its attributes; <code>otel-training trace</code> gives the "
        "full timeline for Perfetto."
    )
    if not every_row:
        caption += " Only each rank's first row is labelled (too many rows)."
    reduction = "; ".join(sorted(reductions)) or None
    if reduction:
        caption += f" Reduced to fit: {escape(reduction)}."
    return Plot(
        "plot-timeline",
        "Phases per rank",
        caption,
        go.Figure(traces, layout_),
        points,
        bool(reduction),
    ), reduction
