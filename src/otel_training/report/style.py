"""How the report draws: its colours, its axes and the text it hands to plotly.

One place for every colour of the page, so that a thing has the same colour wherever it is
drawn and in every report: a rank's line (:data:`PALETTE`), a span group of the registry in the
timeline (:data:`GROUP_COLORS`), a phase of the health ledger (:data:`PHASE_COLORS`; a span
group and a ledger phase of one name, such as ``data_loading``, share a colour), a goodput
bucket (:data:`BUCKET_COLORS`). Red is kept for errors.

Plotly reads the text of legends, tick labels, titles and hover boxes as a little HTML
(``<b>``, ``<br>``, ``<a href>``); whatever comes from the files goes through :func:`label`
first, which escapes it and cuts it to a length that fits a label. Imported only when a report
is built (it needs nothing but the standard library).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from html import escape
from typing import Any

__all__ = [
    "BUCKET_COLORS",
    "ERROR_COLOR",
    "GROUP_COLORS",
    "LABEL_LENGTH",
    "PALETTE",
    "PHASE_COLORS",
    "group_color",
    "label",
    "layout",
]

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
"""Line colours by rank (``PALETTE[rank % 10]``; red is kept for errors)."""

ERROR_COLOR = "#d62728"
"""Failed spans, lost progress, the p99."""

PHASE_COLORS: Mapping[str, str] = {
    "startup": "#9edae5",
    "checkpoint_load": "#c5b0d5",
    "warmup": "#ffbb78",
    "data_loading": "#ff7f0e",
    "forward_backward": "#2ca02c",
    "optimizer": "#98df8a",
    "communication": "#1f77b4",
    "checkpoint_save": "#9467bd",
    "evaluate": "#17becf",
    "other": "#c7c7c7",
}
"""A colour per phase of the health ledger (``dl.training.phase``)."""

GROUP_COLORS: Mapping[str, str] = {
    # The span groups that are phases of the ledger take the phase's colour.
    "data_loading": PHASE_COLORS["data_loading"],
    "forward_backward": PHASE_COLORS["forward_backward"],
    "optimizer": PHASE_COLORS["optimizer"],
    "communication": PHASE_COLORS["communication"],
    "checkpoint": PHASE_COLORS["checkpoint_save"],
    "load_checkpoint": PHASE_COLORS["checkpoint_load"],
    "evaluate": PHASE_COLORS["evaluate"],
    "first_iteration": PHASE_COLORS["warmup"],
    "model_init": PHASE_COLORS["startup"],
    # Containers pale, so that what they hold stands out on them.
    "job": "#c6d2de",
    "step": "#dbdb8d",
    "microbatch": "#bcbd22",
    "layer": "#e377c2",
    "activation_offload": "#f7b6d2",
    "inference": "#8c564b",
    "trace_region": "#c49c94",
    "custom": "#7f7f7f",
}
"""A colour per span group of the registry (``semconv/registry/spans.yaml``) and ``custom``,
each its own; a test holds them distinct and complete."""

_SPARE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252", "#bd9e39")
"""Colours for a span group this version does not know (a newer registry's), by its name."""

BUCKET_COLORS: Mapping[str, str] = {
    "productive": "#2ca02c",
    "startup": PHASE_COLORS["startup"],
    "checkpoint_load": PHASE_COLORS["checkpoint_load"],
    "warmup_excess": PHASE_COLORS["warmup"],
    "checkpoint_save": PHASE_COLORS["checkpoint_save"],
    "evaluate": PHASE_COLORS["evaluate"],
    "data_wait": PHASE_COLORS["data_loading"],
    "lost_progress": ERROR_COLOR,
    "hang": "#8c564b",
    "downtime": "#7f7f7f",
    "other": PHASE_COLORS["other"],
}
"""A colour per goodput bucket (``otel_training.health.goodput``): productive green, each
badput bucket the colour of the phase it comes from."""


def group_color(group: str) -> str:
    """The colour of span group ``group``: its own from :data:`GROUP_COLORS`, else one of
    eight spare colours chosen by its name (the same in every report)."""
    color = GROUP_COLORS.get(group)
    if color is not None:
        return color
    digest = hashlib.blake2b(group.encode("utf-8", "replace"), digest_size=2).digest()
    return _SPARE[int.from_bytes(digest, "big") % len(_SPARE)]


LABEL_LENGTH = 48
"""Characters of a name from the files kept in a label (the hover box shows more)."""


def label(text: Any, limit: int | None = LABEL_LENGTH) -> str:
    """``text`` for plotly's text (a legend entry, a tick label, a hover line): cut to
    ``limit`` characters (``…`` ends a cut one), with ``<``, ``>``, ``&`` and quotes escaped
    so that plotly shows them instead of reading them as markup. Never raises."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return escape(text)


_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}
_NESTED = ("xaxis", "yaxis", "legend", "margin")


def layout(x_title: str, y_title: str, **more: Any) -> dict[str, Any]:
    """A figure's layout: the report's template and font, both axis titles (quantity and
    unit: every plot of the report has both), the legend under the plot. ``more`` is merged
    in, key by key for ``xaxis``, ``yaxis``, ``legend`` and ``margin``."""
    base: dict[str, Any] = {
        "template": "plotly_white",
        "font": _FONT,
        "margin": {"l": 64, "r": 20, "t": 28, "b": 45},
        "height": 300,
        "xaxis": {"title": {"text": x_title}, "zeroline": False, "automargin": True},
        "yaxis": {
            "title": {"text": y_title},
            "zeroline": False,
            "exponentformat": "SI",
            "automargin": True,
        },
        "legend": {"orientation": "h", "y": -0.25, "yanchor": "top", "font": {"size": 11}},
    }
    for key, value in more.items():
        if key in _NESTED and isinstance(value, dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base
