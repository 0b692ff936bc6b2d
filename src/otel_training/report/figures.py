"""The plots of a report, as plotly figures: curves, step-duration quantiles, per-layer
heatmaps and the phase timeline.

Conventions of the tools people already read: TensorBoard's scalars (one line per rank, the raw
values faint under a smoothed line), Perfetto's timeline (one band per rank, nested slices).
Every figure is built from lists already cut to a budget of points (see
:mod:`otel_training.report.series`), so the page stays small however long the run. Needs the
``report`` extra (plotly); imported only when a report is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

import plotly.graph_objects as go

from otel_training.report.quantiles import histogram_quantile, quantiles_over_time
from otel_training.report.run import TRUNCATED_ATTRIBUTE, Run, Span
from otel_training.report.series import (
    drop_repeats,
    ema_smooth,
    minmax_downsample,
    round_significant,
)
from otel_training.report.steps import step_clocks
from otel_training.report.tracks import place_spans
from otel_training.semconv.attributes import (
    MEGATRON_ITERATION,
    MEGATRON_TRAINING_LAYER,
    MEGATRON_TRAINING_ROUTER_EXPERT,
    MEGATRON_TRAINING_ROUTER_STATISTIC,
)
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS,
    MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    MEGATRON_TRAINING_TENSOR_PARAM_NORM,
    MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
    MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
    METRICS,
)
from otel_training.semconv.spans import SPAN_GROUP_LEVELS, SPANS

__all__ = [
    "CURVES",
    "MAX_RANK_LINES",
    "Plot",
    "XAxis",
    "curve_plots",
    "natural_key",
    "step_duration_plots",
    "tensor_heatmaps",
    "timeline_plot",
]

MAX_RANK_LINES = 8
"""Up to this many ranks, one line per rank; beyond, the median and the min-max band."""

SMOOTHING = 0.6
"""TensorBoard's default smoothing weight, applied to the noisy curves."""

CURVES: tuple[tuple[str, str, str, bool], ...] = (
    (MEGATRON_TRAINING_LOSS, "Loss", "", True),
    (MEGATRON_TRAINING_LEARNING_RATE, "Learning rate", "", False),
    (MEGATRON_TRAINING_GRAD_NORM, "Grad norm", "", True),
    (MEGATRON_TRAINING_TOKENS_PER_SEC, "Tokens/s", "tokens/s", True),
    (MEGATRON_TRAINING_THROUGHPUT_TFLOPS, "TFLOP/s per GPU", "TFLOP/s", True),
    (MEGATRON_TRAINING_MEMORY_ALLOCATED_GB, "Memory allocated", "GiB", False),
)
"""The training curves: metric, title, unit of the y axis, smoothed."""

ROUTER_STATISTICS_ORDER = ("max_over_mean", "coefficient_of_variation", "dead_fraction")
"""The values of ``megatron.training.router.statistic`` in the order the registry defines them."""

HEATMAP_FAMILIES: tuple[tuple[str, str], ...] = (
    (MEGATRON_TRAINING_TENSOR_GRAD_NORM, "Grad norm per layer"),
    (MEGATRON_TRAINING_TENSOR_PARAM_NORM, "Param norm per layer"),
    (MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS, "Activation RMS per layer"),
    (MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE, "Router balance per layer"),
    (MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY, "Router entropy per layer"),
)
"""The tensor families shown first; the other per-layer families of the registry follow."""

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#aec7e8",
)
"""Line colours by rank (red is kept for errors)."""

ERROR_COLOR = "#d62728"

_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


@dataclass
class Plot:
    """One figure of the report.

    Attributes:
        id: The HTML id of its ``div``.
        title: Its heading.
        caption: One or two sentences under it (what is drawn, how it was reduced).
        figure: The plotly figure.
        points: Data points given to plotly (after downsampling).
        downsampled: Whether some series were cut to the point budget.
    """

    id: str
    title: str
    caption: str
    figure: go.Figure
    points: int
    downsampled: bool = False


class XAxis:
    """The x axis of the curves and heatmaps: optimizer steps when every rank with metrics
    has a step clock (:mod:`otel_training.report.steps`), else seconds since the run's
    first time."""

    def __init__(self, run: Run) -> None:
        self.clocks = step_clocks(run)
        self.t0 = run.first_ns or 0
        if self.clocks:
            self.title = "step"
            self.source = next(iter(self.clocks.values())).source
        else:
            self.title = "time since start (s)"
            self.source = None

    @property
    def is_steps(self) -> bool:
        """The axis counts steps."""
        return bool(self.clocks)

    def x(self, rank: int, time_ns: int) -> float:
        """The x value of a point exported by ``rank`` at ``time_ns``."""
        return self.xs(rank, [time_ns])[0]

    def xs(self, rank: int, times_ns: list[int]) -> list[float]:
        """The x values of points exported by ``rank`` at ``times_ns``."""
        if self.clocks:
            clock = self.clocks.get(rank) or next(iter(self.clocks.values()))
            return clock.steps_at(times_ns)
        t0 = self.t0
        return [round((t - t0) / 1e9, 3) for t in times_ns]


def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside names by value (``decoder.layers.2`` before
    ``decoder.layers.10``)."""
    return tuple(
        (1, int(part), "") if part.isdigit() else (0, 0, part)
        for part in re.split(r"(\d+)", text)
        if part
    )


def _layout(title_x: str, title_y: str = "", **more) -> dict:
    layout = {
        "template": "plotly_white",
        "font": _FONT,
        "margin": {"l": 60, "r": 20, "t": 28, "b": 45},
        "height": 300,
        "xaxis": {"title": {"text": title_x}, "zeroline": False},
        "yaxis": {"title": {"text": title_y}, "zeroline": False, "exponentformat": "SI"},
        "legend": {"orientation": "h", "y": -0.25, "font": {"size": 11}},
    }
    layout.update(more)
    return layout


def _rounded(values: Sequence[float | None], digits: int = 6) -> list[float | None]:
    return [round_significant(v, digits) for v in values]


def _rank_points(run: Run, axis: XAxis, name: str) -> dict[int, tuple[list, list]]:
    per_rank = {}
    for rank, telemetry in run.ranks.items():
        points = sorted((t, v) for s in telemetry.gauge(name) for t, v in zip(s.times_ns, s.values))
        if not points:
            continue
        xs = axis.xs(rank, [t for t, _ in points])
        ys = [v for _, v in points]
        per_rank[rank] = drop_repeats(xs, ys)
    return per_rank


def _spread(per_rank: dict[int, tuple[list, list]], bins: int) -> tuple[list, list, list, list]:
    xs_all = [x for xs, _ in per_rank.values() for x in xs]
    low, high = min(xs_all), max(xs_all)
    width = (high - low) / bins if high > low else 1.0
    buckets: dict[int, list[tuple[float, float]]] = {}
    for xs, ys in per_rank.values():
        for x, y in zip(xs, ys):
            if y is None or not math.isfinite(y):
                continue
            buckets.setdefault(min(int((x - low) / width), bins - 1), []).append((x, y))
    centers, mins, medians, maxes = [], [], [], []
    for index in sorted(buckets):
        entries = buckets[index]
        values = sorted(y for _, y in entries)
        centers.append(max(x for x, _ in entries))
        mins.append(values[0])
        maxes.append(values[-1])
        middle = len(values) // 2
        medians.append(
            values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
        )
    return centers, mins, medians, maxes


def curve_plots(run: Run, axis: XAxis, *, max_points: int = 8_000) -> tuple[list[Plot], list[str]]:
    """The training curves of :data:`CURVES` that have values.

    Args:
        max_points: Budget of points per figure, shared by its traces.

    Returns:
        The plots, and the titles of the curves without any value. Never raises.
    """
    plots, missing = [], []
    for name, title, unit, smooth in CURVES:
        per_rank = _rank_points(run, axis, name)
        if not per_rank:
            missing.append(title)
            continue
        traces, points, downsampled = [], 0, False
        if len(per_rank) <= MAX_RANK_LINES:
            per_trace = max(200, max_points // (len(per_rank) * (2 if smooth else 1)))
            for rank, (xs, ys) in per_rank.items():
                color = PALETTE[rank % len(PALETTE)]
                smoothed = ema_smooth(ys, SMOOTHING) if smooth else None
                xs_raw, ys_raw, cut = minmax_downsample(xs, ys, per_trace)
                downsampled |= cut
                mode = "lines+markers" if len(xs_raw) <= 30 else "lines"
                label = f"rank {rank}"
                traces.append(
                    go.Scatter(
                        x=xs_raw,
                        y=_rounded(ys_raw),
                        mode=mode,
                        name=label + (" (raw)" if smooth else ""),
                        legendgroup=label,
                        showlegend=not smooth and len(per_rank) > 1,
                        line={"color": color, "width": 1 if smooth else 1.8},
                        marker={"size": 4},
                        opacity=0.3 if smooth else 1.0,
                    )
                )
                points += len(xs_raw)
                if smoothed is not None:
                    xs_s, ys_s, _ = minmax_downsample(xs, smoothed, per_trace)
                    traces.append(
                        go.Scatter(
                            x=xs_s,
                            y=_rounded(ys_s),
                            mode="lines",
                            name=label,
                            legendgroup=label,
                            showlegend=len(per_rank) > 1,
                            line={"color": color, "width": 2},
                        )
                    )
                    points += len(xs_s)
            caption = (
                f"One line per rank; faint: raw values, solid: smoothed (TensorBoard's EMA, "
                f"weight {SMOOTHING})."
                if smooth
                else "One line per rank."
            )
        else:
            bins = max(100, max_points // 3)
            centers, mins, medians, maxes = _spread(per_rank, bins)
            downsampled = any(len(xs) > bins for xs, _ in per_rank.values())
            band = {"width": 0, "color": PALETTE[0]}
            traces = [
                go.Scatter(
                    x=centers,
                    y=_rounded(maxes),
                    mode="lines",
                    line=band,
                    name="max",
                    showlegend=False,
                ),
                go.Scatter(
                    x=centers,
                    y=_rounded(mins),
                    mode="lines",
                    line=band,
                    fill="tonexty",
                    fillcolor="rgba(31,119,180,0.2)",
                    name="min to max",
                ),
                go.Scatter(
                    x=centers,
                    y=_rounded(medians),
                    mode="lines",
                    line={"color": PALETTE[0], "width": 2},
                    name="median",
                ),
            ]
            points = 3 * len(centers)
            caption = (
                f"{len(per_rank)} ranks: the median over ranks and the band from the lowest to "
                "the highest rank."
            )
        if downsampled:
            caption += " Long series were downsampled (per bucket its lowest and highest point)."
        layout = _layout(axis.title, unit)
        layout["hovermode"] = "x unified" if len(traces) <= 8 else "closest"
        figure = go.Figure(data=traces, layout=layout)
        plots.append(
            Plot(
                f"plot-curve-{name}",
                f"{title}",
                f"{caption} <code>{name}</code>",
                figure,
                points,
                downsampled,
            )
        )
    return plots, missing


def _bucket_label(bounds: Sequence[float], i: int) -> str:
    if i == 0:
        return f"≤ {bounds[0]:g}"
    if i == len(bounds):
        return f"> {bounds[-1]:g}"
    return f"{bounds[i - 1]:g}–{bounds[i]:g}"


def step_duration_plots(run: Run, axis: XAxis) -> list[Plot]:
    """p50/p90/p99 of ``megatron.training.step_duration_ms`` over time (Prometheus
    ``histogram_quantile`` per export interval, the ranks' buckets added up), the histogram of
    all steps, and, for several ranks, the mean step duration per rank. Never raises."""
    series = [
        s
        for t in run.ranks.values()
        for s in t.histogram(MEGATRON_TRAINING_STEP_DURATION_MS)
        if s.times_ns
    ]
    if not series or not any(s.cumulative_counts and s.cumulative_counts[-1] for s in series):
        return []
    plots = []
    over_time = quantiles_over_time(series, max_bins=600)
    first_rank = min(run.ranks)
    xs = axis.xs(first_rank, over_time.times_ns)
    traces = []
    colors = ("#1f77b4", "#ff7f0e", ERROR_COLOR)
    for (q, values), color in zip(zip(over_time.quantiles, over_time.values), colors):
        traces.append(
            go.Scatter(
                x=xs,
                y=_rounded(values, 5),
                mode="lines+markers" if len(xs) <= 30 else "lines",
                name=f"p{q * 100:g}",
                line={"color": color, "width": 1.8},
                marker={"size": 4},
            )
        )
    traces.append(
        go.Scatter(
            x=xs,
            y=_rounded(over_time.means, 5),
            mode="lines",
            name="mean",
            line={"color": "#7f7f7f", "width": 1, "dash": "dot"},
        )
    )
    plots.append(
        Plot(
            "plot-step-duration-quantiles",
            "Step duration p50 / p90 / p99",
            "Per export interval, from the histogram buckets of all ranks added up, interpolated "
            "within a bucket as Prometheus <code>histogram_quantile</code> does (so a quantile "
            "is only as fine as the buckets). <code>megatron.training.step_duration_ms</code>",
            go.Figure(traces, _layout(axis.title, "ms", hovermode="x unified")),
            4 * len(xs),
        )
    )
    bounds = series[0].bounds
    buckets = [0] * (len(bounds) + 1)
    for s in series:
        if s.bounds == bounds:
            buckets = [a + b for a, b in zip(buckets, s.cumulative_buckets)]
    nonzero = [i for i, c in enumerate(buckets) if c]
    lo, hi = nonzero[0], nonzero[-1]
    labels = [_bucket_label(bounds, i) for i in range(lo, hi + 1)]
    total = sum(buckets)
    quantiles = ", ".join(
        f"p{q * 100:g} {histogram_quantile(q, bounds, buckets):.4g} ms" for q in (0.5, 0.9, 0.99)
    )
    plots.append(
        Plot(
            "plot-step-duration-histogram",
            "Step duration histogram",
            f"All {total:,} steps of all ranks by bucket (ms). Over the run: {quantiles}.",
            go.Figure(
                [
                    go.Bar(
                        x=labels,
                        y=buckets[lo : hi + 1],
                        marker={"color": PALETTE[0]},
                        name="steps",
                        hovertemplate="%{x} ms: %{y} steps<extra></extra>",
                    )
                ],
                _layout(
                    "step duration (ms)",
                    "steps",
                    bargap=0.05,
                    xaxis={"type": "category", "title": {"text": "step duration (ms)"}},
                ),
            ),
            len(labels),
        )
    )
    if len(run.ranks) > 1:
        ranks, means, p99s = [], [], []
        for rank, telemetry in run.ranks.items():
            counts = sum(
                s.cumulative_counts[-1]
                for s in telemetry.histogram(MEGATRON_TRAINING_STEP_DURATION_MS)
                if s.cumulative_counts
            )
            sums = sum(
                s.cumulative_sums[-1]
                for s in telemetry.histogram(MEGATRON_TRAINING_STEP_DURATION_MS)
                if s.cumulative_sums
            )
            if counts:
                rank_buckets = [0] * (len(bounds) + 1)
                for s in telemetry.histogram(MEGATRON_TRAINING_STEP_DURATION_MS):
                    if s.bounds == bounds:
                        rank_buckets = [a + b for a, b in zip(rank_buckets, s.cumulative_buckets)]
                ranks.append(f"rank {rank}")
                means.append(round_significant(sums / counts, 5))
                p99s.append(round_significant(histogram_quantile(0.99, bounds, rank_buckets), 5))
        if ranks:
            plots.append(
                Plot(
                    "plot-step-duration-by-rank",
                    "Step duration by rank",
                    "Mean and p99 of each rank's steps over the run: a slow rank (a straggler) "
                    "stands out.",
                    go.Figure(
                        [
                            go.Bar(x=ranks, y=means, name="mean", marker={"color": PALETTE[0]}),
                            go.Bar(x=ranks, y=p99s, name="p99", marker={"color": "#ff7f0e"}),
                        ],
                        _layout("", "ms", barmode="group"),
                    ),
                    2 * len(ranks),
                )
            )
    return plots


def _heatmap_families() -> list[tuple[str, str]]:
    families = list(HEATMAP_FAMILIES)
    known = {name for name, _ in families}
    for name, spec in sorted(METRICS.items()):
        if (
            name not in known
            and MEGATRON_TRAINING_LAYER in spec.attributes
            and MEGATRON_TRAINING_ROUTER_EXPERT not in spec.attributes
        ):
            short = name.rsplit(".", 1)[-1].replace("_", " ")
            families.append((name, f"{short[:1].upper()}{short[1:]} per layer"))
    return families


def tensor_heatmaps(run: Run, axis: XAxis, *, max_columns: int = 240) -> list[Plot]:
    """One heatmap (layer x step or time) per per-layer tensor family present, one per router
    statistic for ``router_balance``. A layer's values come from the lowest rank that reports
    it (data-parallel replicas agree; pipeline stages report their own layers); the ``global``
    value is left out. Never raises."""
    plots = []
    for name, title in _heatmap_families():
        groups: dict[tuple, dict[str, tuple[int, list, list]]] = {}
        for rank in sorted(run.ranks):
            for series in run.ranks[rank].gauge(name):
                attributes = dict(series.attributes)
                layer = attributes.pop(MEGATRON_TRAINING_LAYER, None)
                if layer is None or layer == "global" or not series.values:
                    continue
                extra = tuple(sorted(attributes.items()))
                layers = groups.setdefault(extra, {})
                if str(layer) not in layers:
                    xs = axis.xs(rank, series.times_ns)
                    layers[str(layer)] = (rank, xs, series.values)
        for extra, layers in sorted(groups.items(), key=lambda item: _extra_key(item[0])):
            plot = _heatmap(name, title, extra, layers, axis, max_columns)
            if plot is not None:
                plots.append(plot)
    return plots


def _extra_key(extra: tuple) -> tuple:
    statistic = dict(extra).get(MEGATRON_TRAINING_ROUTER_STATISTIC)
    if statistic in ROUTER_STATISTICS_ORDER:
        return (0, ROUTER_STATISTICS_ORDER.index(statistic), "")
    return (1, 0, str(extra))


def _heatmap(name, title, extra, layers, axis: XAxis, max_columns: int) -> Plot | None:
    all_x = sorted({x for _, xs, _ in layers.values() for x in xs})
    if not all_x:
        return None
    binned = len(all_x) > max_columns
    if binned:
        low, high = all_x[0], all_x[-1]
        width = (high - low) / max_columns or 1.0
        columns = [low + (i + 1) * width for i in range(max_columns)]

        def column(x: float) -> int:
            return min(int((x - low) / width), max_columns - 1)
    else:
        columns = all_x
        index = {x: i for i, x in enumerate(all_x)}

        def column(x: float) -> int:
            return index[x]

    names = sorted(layers, key=natural_key)
    z = []
    for layer in names:
        row: list[float | None] = [None] * len(columns)
        _, xs, values = layers[layer]
        for x, v in zip(xs, values):
            row[column(x)] = v  # the last value in the column
        z.append(_rounded(row, 4))
    if axis.is_steps and binned:
        columns = [round(c) for c in columns]
    suffix = ", ".join(f"{v}" for _, v in extra)
    statistic = dict(extra).get(MEGATRON_TRAINING_ROUTER_STATISTIC)
    heading = f"{title}: {statistic}" if statistic else (f"{title} ({suffix})" if suffix else title)
    figure = go.Figure(
        [
            go.Heatmap(
                x=columns,
                y=names,
                z=z,
                colorscale="Viridis",
                colorbar={"thickness": 12},
                hovertemplate=f"%{{y}}<br>{axis.title} %{{x}}<br>%{{z}}<extra></extra>",
            )
        ],
        _layout(
            axis.title,
            "",
            height=max(220, 60 + 16 * len(names)),
            yaxis={"type": "category", "autorange": "reversed", "automargin": True},
        ),
    )
    caption = f"<code>{name}</code>, one row per layer (as <code>{MEGATRON_TRAINING_LAYER}</code>)."
    if binned:
        caption += f" Downsampled to {max_columns} columns (the last value in each)."
    return Plot(
        f"plot-heatmap-{name}-{suffix}".replace(" ", "_"),
        heading,
        caption,
        figure,
        sum(1 for row in z for v in row if v is not None),
        binned,
    )


# -- timeline ---------------------------------------------------------------------------------


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
    lines = [f"<b>{escape(span.name)}</b>" + (f" × {item.count:,}" if item.count > 1 else "")]
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
            lines.append(f"{escape(str(key))}: {escape(str(value)[:80])}")
    if span.failed:
        lines.append(f"<b>ERROR</b> {escape(span.status_description or '')}".strip())
    if span.open:
        lines.append("<b>never ended</b> (shown until the rank's last time)")
    elif span.truncated:
        lines.append("<b>truncated</b>: ended at exit")
    return "<br>".join(lines)


def timeline_plot(run: Run, *, max_bars: int = 3_000) -> tuple[Plot | None, str | None]:
    """The phases of every rank on one time axis, nested as in Perfetto: per rank one row per
    nesting level (and per concurrent track), coloured by span group; failed spans (status
    ERROR) outlined in red, truncated ones hatched.

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
    groups = sorted(SPAN_GROUP_LEVELS)
    colors = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
    bars: dict[str, dict[str, list]] = {}
    tickvals, ticktext, shapes = [], [], []
    row_base, reductions = 0, set()
    for band, rank in enumerate(sorted(by_rank)):
        items, note = _reduce(run, by_rank[rank], budget)
        if note:
            reductions.add(note)
        merged_of = {it.span.span_id: it for it in items}
        placements = place_spans(run, [it.span for it in items])
        rows = sorted({(p.track, p.depth) for p in placements})
        row_of = {key: row_base + i for i, key in enumerate(rows)}
        tickvals.append(row_base)
        ticktext.append(f"rank {rank}")
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
            entry = bars.setdefault(
                group,
                {"base": [], "x": [], "y": [], "text": [], "line": [], "width": [], "pattern": []},
            )
            entry["base"].append(round((p.start_ns - t0) / 1e9, 6))
            entry["x"].append(round((p.end_ns - p.start_ns) / 1e9, 6))
            entry["y"].append(row_of[(p.track, p.depth)])
            entry["text"].append(_hover(run, item, t0))
            entry["line"].append(ERROR_COLOR if span.failed else "rgba(0,0,0,0.25)")
            entry["width"].append(2.5 if span.failed else 0.5)
            entry["pattern"].append("/" if span.truncated else "")
        row_base += len(rows)
    traces = []
    for group in groups:
        entry = bars.get(group)
        if not entry:
            continue
        traces.append(
            go.Bar(
                base=entry["base"],
                x=entry["x"],
                y=entry["y"],
                orientation="h",
                name=group,
                hovertext=entry["text"],
                hoverinfo="text",
                width=0.8,
                marker={
                    "color": colors[group],
                    "line": {"color": entry["line"], "width": entry["width"]},
                    "pattern": {
                        "shape": entry["pattern"],
                        "fgcolor": "rgba(0,0,0,0.55)",
                        "size": 6,
                    },
                },
            )
        )
    layout = _layout(
        "time since the first span (s)",
        "",
        height=min(900, max(220, 90 + 26 * row_base)),
        barmode="overlay",
        hovermode="closest",
        shapes=shapes,
        yaxis={
            "tickvals": tickvals,
            "ticktext": ticktext,
            "autorange": "reversed",
            "showgrid": False,
            "zeroline": False,
            "range": None,
        },
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        margin={"l": 70, "r": 20, "t": 30, "b": 45},
    )
    points = sum(len(e["x"]) for e in bars.values())
    caption = (
        "Each rank's spans on one time axis (Unix-epoch clocks of the hosts), one row per "
        "nesting level, coloured by span group. Red outline: failed (status ERROR); hatched: "
        "truncated (never ended, or ended at exit). Hover a bar for its attributes; "
        "<code>otel-training trace</code> gives the full timeline for Perfetto."
    )
    reduction = "; ".join(sorted(reductions)) or None
    if reduction:
        caption += f" Reduced to fit: {reduction}."
    return Plot(
        "plot-timeline",
        "Phases per rank",
        caption,
        go.Figure(traces, layout),
        points,
        bool(reduction),
    ), reduction
