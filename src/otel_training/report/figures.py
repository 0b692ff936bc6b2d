"""The plots of a report, as plotly figures: training curves and step durations here, per-layer
heatmaps in :mod:`otel_training.report.heatmaps`, the timeline in
:mod:`otel_training.report.timeline`, colours and axes in :mod:`otel_training.report.style`.

Conventions of the tools people already read: TensorBoard's scalars (one line per rank, the raw
values faint under a smoothed line), Perfetto's timeline (one band per rank, nested slices).
Every plot has both axis titles, with the unit of its quantity where it has one. Every figure is
built from lists already cut to a budget of points (see :mod:`otel_training.report.series`), so
the page stays small however long the run. Needs the ``report`` extra (plotly); imported only
when a report is built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from otel_training.report.heatmaps import natural_key, tensor_heatmaps
from otel_training.report.plot import Plot
from otel_training.report.quantiles import histogram_quantile, quantiles_over_time
from otel_training.report.run import Run
from otel_training.report.series import (
    drop_repeats,
    ema_smooth,
    minmax_downsample,
    round_significant,
)
from otel_training.report.steps import logged_steps, step_clocks
from otel_training.report.style import ERROR_COLOR, PALETTE, layout
from otel_training.report.timeline import timeline_plot
from otel_training.report.wording import plural, rank_list, ranks_phrase
from otel_training.semconv.metrics import (
    DL_TRAINING_PROGRESS_LOGGED_ITERATION,
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)

__all__ = [
    "CURVES",
    "ERROR_COLOR",
    "MAX_RANK_LINES",
    "PALETTE",
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
"""TensorBoard's default smoothing weight, applied to the noisy curves (the page's control
changes it: :data:`otel_training.report.series.SMOOTH_JS`)."""

MARKED_POINTS = 300
"""Up to this many points a raw series is drawn with a marker at each point."""

CURVES: tuple[tuple[str, str, str, bool], ...] = (
    (MEGATRON_TRAINING_LOSS, "Loss", "loss", True),
    (MEGATRON_TRAINING_LEARNING_RATE, "Learning rate", "learning rate", False),
    (MEGATRON_TRAINING_GRAD_NORM, "Grad norm", "grad norm (L2)", True),
    (MEGATRON_TRAINING_TOKENS_PER_SEC, "Tokens/s", "tokens/s", True),
    (MEGATRON_TRAINING_THROUGHPUT_TFLOPS, "TFLOP/s per GPU", "TFLOP/s per GPU", True),
    (MEGATRON_TRAINING_MEMORY_ALLOCATED_GB, "Memory allocated", "allocated (GiB)", False),
)
"""The training curves: metric, title, y axis title (the quantity, and its unit where it has
one: Megatron-LM's loss, learning rate and grad norm have none), smoothed."""

STEP_AXIS = "optimizer step"
TIME_AXIS = "seconds since the run's first record"


class XAxis:
    """The x axis of the curves, heatmaps and step times of one run: optimizer steps when
    every rank with metrics has a step clock (:func:`otel_training.report.steps.step_clocks`),
    else seconds since the run's first time. Training values are placed at the step they
    describe where the ranks exported it (:func:`otel_training.report.steps.logged_steps`)."""

    def __init__(self, run: Run) -> None:
        self.clocks = step_clocks(run)
        self.t0 = run.first_ns or 0
        if self.clocks:
            self.title = STEP_AXIS
            self.source = next(iter(self.clocks.values())).source
            self.logged = logged_steps(run)
        else:
            self.title = TIME_AXIS
            self.source = None
            self.logged = {}

    @property
    def is_steps(self) -> bool:
        """The axis counts steps."""
        return bool(self.clocks)

    def x(self, rank: int, time_ns: int) -> float:
        """The x value of a point exported by ``rank`` at ``time_ns``."""
        return self.xs(rank, [time_ns])[0]

    def xs(self, rank: int, times_ns: list[int]) -> list[float]:
        """The x values of points exported by ``rank`` at ``times_ns``: the step reached then
        (or the seconds since the start)."""
        if self.clocks:
            clock = self.clocks.get(rank) or next(iter(self.clocks.values()))
            return clock.steps_at(times_ns)
        t0 = self.t0
        return [round((t - t0) / 1e9, 3) for t in times_ns]

    def value_points(
        self, rank: int, times_ns: Sequence[int], values: Sequence[float]
    ) -> tuple[list, list, bool]:
        """Where the values of a training gauge exported by ``rank`` at ``times_ns`` (ascending)
        are drawn.

        Returns:
            ``(xs, ys, exact)``: with the step each value describes recorded beside it (``exact``),
            one point per step, the value last exported with it; else a point per new value at
            the step (or second) reached at its export (:func:`drop_repeats`).
        """
        logged = self.logged.get(rank)
        if logged is not None and all(t in logged for t in times_ns):
            by_step: dict[int, float] = {}
            for t, v in zip(times_ns, values):
                by_step[logged[t]] = v  # the last export of a step wins (a deferred value)
            steps = sorted(by_step)
            return steps, [by_step[s] for s in steps], True
        xs, ys = drop_repeats(self.xs(rank, list(times_ns)), list(values))
        return xs, ys, False

    def lead(self, exact: bool, every: bool = False) -> str:
        """The sentences that say what the x axis of the curves is and, with ``every``, that
        each logged value is drawn."""
        told = self._lead(exact)
        if every:
            told += (
                " Every value logged is drawn (the <code>training_values</code> lines of "
                "<code>spans-rank*.jsonl</code>)."
            )
        return told

    def _lead(self, exact: bool) -> str:
        if not self.is_steps:
            return (
                f"x axis: {TIME_AXIS} (no step count was recorded: record "
                "<code>step_duration_ms</code> each step, or turn on iteration spans)."
            )
        if exact:
            return (
                f"x axis: {STEP_AXIS}. Each training value is drawn at the step it describes "
                f"(<code>{DL_TRAINING_PROGRESS_LOGGED_ITERATION}</code>, recorded with the "
                "values), so ranks that logged alike draw alike; the step durations and "
                f"tensor metrics at the step reached when they were exported (from "
                f"{self.source})."
            )
        return (
            f"x axis: {STEP_AXIS}, from {self.source} (a value is placed at the step reached "
            "when it was exported: up to an export interval after the step it describes)."
        )


def _rounded(values: Sequence[float | None], digits: int = 6) -> list[float | None]:
    return [round_significant(v, digits) for v in values]


def _rank_points(run: Run, axis: XAxis, name: str) -> tuple[dict[int, tuple[list, list]], bool]:
    """Per rank the points of gauge ``name``, and whether all were placed at their step: every
    logged value where the rank wrote ``training_values`` records (:func:`_logged_points`),
    else the exported points."""
    per_rank = {}
    exact = True
    for rank, telemetry in run.ranks.items():
        points = sorted((t, v) for s in telemetry.gauge(name) for t, v in zip(s.times_ns, s.values))
        logged = telemetry.logged.get(name)
        if logged:
            xs, ys, placed = _logged_points(axis, rank, logged, points)
        elif points:
            xs, ys, placed = axis.value_points(rank, [t for t, _ in points], [v for _, v in points])
        else:
            continue
        exact = exact and placed
        per_rank[rank] = (xs, ys)
    return per_rank, exact and bool(per_rank)


def _logged_points(
    axis: XAxis,
    rank: int,
    logged: Sequence[tuple[int | None, int, float]],
    exported: Sequence[tuple[int, float]],
) -> tuple[list, list, bool]:
    """Where a rank's logged values (``(step, time_ns, value)`` per call) are drawn: each at
    the step it describes on a step axis (the later of two values of one step wins), else at
    the second it was logged. Exported points fill the steps that no record holds (lines lost
    to a full disk or a full queue) where they are placed at their step too.

    Returns:
        ``(xs, ys, exact)``, ``exact`` when every point is at the step it describes.
    """
    if axis.is_steps and all(step is not None for step, _, _ in logged):
        by_step: dict[float, float] = {}
        if exported:
            xs, ys, placed = axis.value_points(
                rank, [t for t, _ in exported], [v for _, v in exported]
            )
            if placed:
                by_step.update(zip(xs, ys))
        for step, _, value in logged:
            by_step[step] = value
        steps = sorted(by_step)
        return steps, [by_step[s] for s in steps], True
    ordered = sorted(logged, key=lambda point: point[1])
    xs = axis.xs(rank, [t for _, t, _ in ordered])
    return xs, [v for _, _, v in ordered], False


def _equal(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN equals NaN here


def _identical(per_rank: dict[int, tuple[list, list]]) -> tuple[list, list] | None:
    """The points of every rank when they are all the same, else ``None``."""
    series = list(per_rank.values())
    first = series[0]
    same = len(series) > 1 and all(
        len(xs) == len(first[0])
        and xs == first[0]
        and all(_equal(a, b) for a, b in zip(ys, first[1]))
        for xs, ys in series[1:]
    )
    return first if same else None


def agreeing(per_rank: dict[int, tuple[list, list]]) -> tuple[list, list] | None:
    """One series for ranks that recorded the same values (a loss averaged over the ranks, a
    learning rate): their points merged, when at every step that two of them share they agree
    and each shares a step with another; else ``None``. A rank may lack a step that another
    has: a gauge exported every few seconds keeps only the last of two values logged within
    one export interval, a different one on each rank."""
    if len(per_rank) < 2:
        return None
    merged: dict[float, float] = {}
    for xs, ys in per_rank.values():
        shared = 0
        for x, y in zip(xs, ys):
            known = merged.get(x)
            if known is None:
                continue
            if not _equal(known, y):
                return None
            shared += 1
        if merged and not shared:
            return None
        for x, y in zip(xs, ys):
            merged.setdefault(x, y)
    steps = sorted(merged)
    return steps, [merged[x] for x in steps]


def constant_axis(values: Sequence[float | None]) -> tuple[dict, float | None]:
    """For values that are all one finite number: a y axis that shows that constant as one
    (from 0 to past it, the value ticked), and the constant; else ``({}, None)``."""
    finite = {v for v in values if v is not None and math.isfinite(v)}
    if len(finite) != 1:
        return {}, None
    value = next(iter(finite))
    if value == 0:
        return {"range": [0, 1], "tickvals": [0], "ticktext": ["0"]}, 0.0
    low, high = sorted((0.0, value * 1.5))
    return {"range": [low, high], "rangemode": "tozero"}, value


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


def _rank_traces(
    per_rank: dict[int, tuple[list, list]], smooth: bool, max_points: int, exact: bool
) -> tuple[list, int, bool, str]:
    """One line per rank, one for ranks that recorded the same values (at the steps they
    describe: :func:`agreeing`; else only when their points are the same): traces, points,
    downsampled, caption."""
    merged = agreeing(per_rank) if exact else _identical(per_rank)
    identical = merged is not None
    lines = {min(per_rank): merged} if merged is not None else per_rank
    traces, points, downsampled = [], 0, False
    per_trace = max(200, max_points // (len(lines) * (2 if smooth else 1)))
    legend = len(lines) > 1 or identical
    for rank, (xs, ys) in lines.items():
        color = PALETTE[rank % len(PALETTE)]
        name = f"ranks {rank_list(per_rank)}" if identical else f"rank {rank}"
        xs_raw, ys_raw, cut = minmax_downsample(xs, ys, per_trace)
        downsampled |= cut
        ys_raw = _rounded(ys_raw)
        mode = "lines+markers" if len(xs_raw) <= MARKED_POINTS else "lines"
        traces.append(
            go.Scatter(
                x=xs_raw,
                y=ys_raw,
                mode=mode,
                name=name + (" (raw)" if smooth else ""),
                legendgroup=name,
                showlegend=legend and not smooth,
                line={"color": color, "width": 1 if smooth else 1.8},
                marker={"size": 4},
                opacity=0.3 if smooth else 1.0,
            )
        )
        points += len(xs_raw)
        if smooth:
            # Smoothed over the points drawn, as TensorBoard smooths its sampled points: the
            # page's weight control smooths the raw trace again (SMOOTH_JS, the same formula).
            traces.append(
                go.Scatter(
                    x=xs_raw,
                    y=_rounded(ema_smooth(ys_raw, SMOOTHING)),
                    mode="lines",
                    name=name,
                    legendgroup=name,
                    showlegend=legend,
                    line={"color": color, "width": 2},
                    meta={"smooth_of": len(traces) - 1},
                )
            )
            points += len(xs_raw)
    caption = "One line per rank"
    if identical:
        caption = f"Ranks {rank_list(per_rank)} recorded the same values: one line"
    caption += (
        "; faint: raw values, solid: smoothed (TensorBoard's debiased exponential moving "
        f"average, weight {SMOOTHING} unless set above)."
        if smooth
        else "."
    )
    return traces, points, downsampled, caption


def _band_traces(per_rank: dict[int, tuple[list, list]], max_points: int):
    bins = max(100, max_points // 3)
    centers, mins, medians, maxes = _spread(per_rank, bins)
    downsampled = any(len(xs) > bins for xs, _ in per_rank.values())
    band = {"width": 0, "color": PALETTE[0]}
    traces = [
        go.Scatter(x=centers, y=_rounded(maxes), mode="lines", line=band, name="max",
                   showlegend=False),
        go.Scatter(x=centers, y=_rounded(mins), mode="lines", line=band, fill="tonexty",
                   fillcolor="rgba(31,119,180,0.2)", name="min to max"),
        go.Scatter(x=centers, y=_rounded(medians), mode="lines",
                   line={"color": PALETTE[0], "width": 2}, name="median"),
    ]  # fmt: skip
    caption = (
        f"{len(per_rank)} ranks: the median over ranks and the band from the lowest to the "
        "highest rank."
    )
    return traces, 3 * len(centers), downsampled, caption


def curve_plots(run: Run, axis: XAxis, *, max_points: int = 8_000) -> tuple[list[Plot], list[str]]:
    """The training curves of :data:`CURVES` that have values.

    Args:
        max_points: Budget of points per figure, shared by its traces.

    Returns:
        The plots, and the titles of the curves without any value. Never raises.
    """
    plots, missing = [], []
    for name, title, y_title, smooth in CURVES:
        per_rank, exact = _rank_points(run, axis, name)
        if not per_rank:
            missing.append(title)
            continue
        if len(per_rank) <= MAX_RANK_LINES:
            traces, points, downsampled, caption = _rank_traces(per_rank, smooth, max_points, exact)
        else:
            traces, points, downsampled, caption = _band_traces(per_rank, max_points)
        if downsampled:
            caption += " Long series were downsampled (per bucket its lowest and highest point)."
        yaxis, constant = constant_axis([y for _, ys in per_rank.values() for y in ys])
        if constant is not None:
            caption += f" Constant: {constant:.6g} throughout."
        figure = go.Figure(
            data=traces,
            layout=layout(
                axis.title,
                y_title,
                yaxis=yaxis,
                hovermode="x unified" if len(traces) <= 8 else "closest",
            ),
        )
        plots.append(
            Plot(
                f"plot-curve-{name}", title, f"{caption} <code>{name}</code>", figure, points,
                downsampled, smoothed=any(t.meta for t in traces),
            )
        )  # fmt: skip
    return plots, missing


def curves_every_value(run: Run) -> bool:
    """Whether the curves of ``run`` draw every logged value: some rank wrote
    ``training_values`` records (files of older versions, or of OTLP-only runs, have none:
    their curves have the last value of each export)."""
    return any(telemetry.logged for telemetry in run.ranks.values())


def curves_exact(run: Run, axis: XAxis) -> bool:
    """Whether the curves of ``run`` are drawn at the steps their values describe: every rank
    with a training gauge recorded its logged step."""
    ranks = {
        rank
        for rank, telemetry in run.ranks.items()
        if any(telemetry.gauge(name) for name, *_ in CURVES)
    }
    stepped = {
        rank
        for rank, telemetry in run.ranks.items()
        if telemetry.logged and all(s is not None for p in telemetry.logged.values() for s, *_ in p)
    }
    return bool(ranks) and axis.is_steps and ranks <= set(axis.logged) | stepped


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
            go.Figure(traces, layout(axis.title, "step duration (ms)", hovermode="x unified")),
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
            f"{plural(total, 'step duration')} of {ranks_phrase(run.ranks)} by bucket (ms), "
            f"each rank's steps once. Over the run: {quantiles}.",
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
                layout(
                    "step duration (ms), by bucket",
                    "steps (count)",
                    bargap=0.05,
                    xaxis={"type": "category"},
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
                        layout("rank", "step duration (ms)", barmode="group"),
                    ),
                    2 * len(ranks),
                )
            )
    return plots
