"""The report's per-layer tensor heatmaps: one per tensor family (layer x step), one per router
statistic for ``router_balance``.

**One colour scale per family.** Every heatmap of one family (a metric, and for
``router_balance`` one statistic) uses the same colours for the same values, across its layers
and across every attempt of the job: the scale runs from the family's lowest to its highest
value over the whole job (:func:`colour_ranges`), and the colour bar says which family and
unit it is. A family whose values are all one number is drawn as that constant, a colour bar
with that one tick, never on an invented range around it.

Needs the ``report`` extra (plotly); imported only when a report is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import plotly.graph_objects as go

from otel_training.report.plot import Plot
from otel_training.report.run import Run
from otel_training.report.series import round_significant
from otel_training.report.style import label, layout
from otel_training.semconv.attributes import (
    MEGATRON_TRAINING_LAYER,
    MEGATRON_TRAINING_ROUTER_EXPERT,
    MEGATRON_TRAINING_ROUTER_STATISTIC,
)
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS,
    MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    MEGATRON_TRAINING_TENSOR_PARAM_NORM,
    MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
    MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY,
    METRICS,
)

__all__ = [
    "HEATMAP_FAMILIES",
    "HeatmapData",
    "colour_ranges",
    "heatmap_data",
    "heatmap_plots",
    "natural_key",
    "tensor_heatmaps",
]

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

COLORSCALE = "Viridis"

_Range = tuple[float, float]


def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside names by value (``decoder.layers.2`` before
    ``decoder.layers.10``)."""
    return tuple(
        (1, int(part), "") if part.isdigit() else (0, 0, part)
        for part in re.split(r"(\d+)", text)
        if part
    )


@dataclass
class HeatmapData:
    """The values of one heatmap, before drawing.

    Attributes:
        name: The metric.
        title: Its heading (``Grad norm per layer``).
        extra: The point attributes beside the layer, as sorted pairs.
        layers: Per layer: the rank its values come from, their x values and the values.
    """

    name: str
    title: str
    extra: tuple
    layers: dict[str, tuple[int, list, list]] = field(default_factory=dict)

    @property
    def family(self) -> tuple[str, str]:
        """What shares one colour scale: the metric and its other attributes (for
        ``router_balance``, the statistic)."""
        return self.name, ", ".join(str(v) for _, v in self.extra)


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


def _extra_key(extra: tuple) -> tuple:
    statistic = dict(extra).get(MEGATRON_TRAINING_ROUTER_STATISTIC)
    if statistic in ROUTER_STATISTICS_ORDER:
        return (0, ROUTER_STATISTICS_ORDER.index(statistic), "")
    return (1, 0, str(extra))


def heatmap_data(run: Run, axis) -> list[HeatmapData]:
    """The heatmaps of ``run`` that have values, in the order they are shown. A layer's values
    come from the lowest rank that reports it (data-parallel replicas agree; pipeline stages
    report their own layers); the ``global`` value is left out. ``axis`` places a rank's
    export times (:class:`otel_training.report.figures.XAxis`). Never raises."""
    found = []
    for name, title in _heatmap_families():
        groups: dict[tuple, HeatmapData] = {}
        for rank in sorted(run.ranks):
            for series in run.ranks[rank].gauge(name):
                attributes = dict(series.attributes)
                layer = attributes.pop(MEGATRON_TRAINING_LAYER, None)
                if layer is None or layer == "global" or not series.values:
                    continue
                extra = tuple(sorted(attributes.items()))
                data = groups.get(extra)
                if data is None:
                    data = groups[extra] = HeatmapData(name, title, extra)
                if str(layer) not in data.layers:
                    data.layers[str(layer)] = (rank, axis.xs(rank, series.times_ns), series.values)
        found += [groups[extra] for extra in sorted(groups, key=_extra_key)]
    return found


def colour_ranges(heatmaps: Iterable[HeatmapData]) -> dict[tuple[str, str], _Range]:
    """The lowest and highest finite value of each family over ``heatmaps`` (all attempts of
    a job): the one colour scale of that family. Never raises."""
    ranges: dict[tuple[str, str], _Range] = {}
    for data in heatmaps:
        values = [
            v for _, _, vs in data.layers.values() for v in vs if v is not None and math.isfinite(v)
        ]
        if not values:
            continue
        low, high = min(values), max(values)
        known = ranges.get(data.family)
        if known is not None:
            low, high = min(low, known[0]), max(high, known[1])
        ranges[data.family] = (low, high)
    return ranges


def colorbar_title(data: HeatmapData) -> str:
    """The title of a heatmap's colour bar: its family (the router statistic for
    ``router_balance``, else the metric's last name), with the unit where it has one."""
    statistic = dict(data.extra).get(MEGATRON_TRAINING_ROUTER_STATISTIC)
    short = str(statistic) if statistic else data.name.rsplit(".", 1)[-1]
    short = short.replace("_", " ")
    unit = METRICS[data.name].unit if data.name in METRICS else ""
    return short if unit in ("", "1") else f"{short} ({unit})"


def heatmap_plots(
    heatmaps: Iterable[HeatmapData],
    axis,
    ranges: Mapping[tuple[str, str], _Range] | None = None,
    *,
    max_columns: int = 240,
) -> list:
    """The plots of ``heatmaps``, each family on its colour scale of ``ranges`` (default: the
    scale of these heatmaps alone). Never raises."""
    heatmaps = list(heatmaps)
    if ranges is None:
        ranges = colour_ranges(heatmaps)
    plots = []
    for data in heatmaps:
        plot = _heatmap(data, axis, ranges.get(data.family), max_columns)
        if plot is not None:
            plots.append(plot)
    return plots


def tensor_heatmaps(run: Run, axis, *, max_columns: int = 240) -> list:
    """:func:`heatmap_plots` of :func:`heatmap_data` of one run, on its own colour scales."""
    return heatmap_plots(heatmap_data(run, axis), axis, max_columns=max_columns)


def _colour_axis(family_range: _Range | None, title: str) -> dict:
    """The heatmap's colour settings: the family's range, a titled colour bar; a constant
    family as that constant (one tick, the cells at the scale's low end)."""
    colorbar: dict = {"thickness": 12, "title": {"text": label(title, 40)}}
    settings: dict = {"colorscale": COLORSCALE, "colorbar": colorbar}
    if family_range is None:
        return settings
    low, high = family_range
    if low == high:
        settings.update(zmin=low, zmax=low + (abs(low) or 1.0))
        colorbar.update(tickvals=[low], ticktext=[f"{low:.4g} (every value)"])
    else:
        settings.update(zmin=low, zmax=high)
    return settings


def _heatmap(data: HeatmapData, axis, family_range: _Range | None, max_columns: int):
    layers = data.layers
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
        z.append([round_significant(v, 4) for v in row])
    if axis.is_steps and binned:
        columns = [round(c) for c in columns]
    suffix = ", ".join(f"{v}" for _, v in data.extra)
    statistic = dict(data.extra).get(MEGATRON_TRAINING_ROUTER_STATISTIC)
    heading = (
        f"{data.title}: {statistic}"
        if statistic
        else (f"{data.title} ({suffix})" if suffix else data.title)
    )
    figure = go.Figure(
        [
            go.Heatmap(
                x=columns,
                y=[label(n) for n in names],
                z=z,
                hovertemplate=f"%{{y}}<br>{axis.title} %{{x}}<br>%{{z}}<extra></extra>",
                **_colour_axis(family_range, colorbar_title(data)),
            )
        ],
        layout(
            axis.title,
            "layer",
            height=max(220, 60 + 16 * len(names)),
            yaxis={"type": "category", "autorange": "reversed"},
        ),
    )
    caption = (
        f"<code>{data.name}</code>, one row per layer (as "
        f"<code>{MEGATRON_TRAINING_LAYER}</code>); one colour scale for this family in every "
        "attempt."
    )
    if family_range is not None and family_range[0] == family_range[1]:
        caption += f" Every value is {family_range[0]:.4g}."
    if binned:
        caption += f" Downsampled to {max_columns} columns (the last value in each)."
    return Plot(
        f"plot-heatmap-{data.name}-{suffix}".replace(" ", "_"),
        heading,
        caption,
        figure,
        sum(1 for row in z for v in row if v is not None),
        binned,
    )
