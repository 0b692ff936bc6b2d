"""One figure of the report: its plotly figure, heading, caption and size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Plot"]


@dataclass
class Plot:
    """One figure of the report.

    Attributes:
        id: The HTML id of its ``div`` (made safe by :func:`otel_training.report.html.dom_id`).
        title: Its heading (text: escaped by the page).
        caption: One or two sentences under it (what is drawn, how it was reduced); HTML, so
            whatever in it comes from the files is escaped where it is made.
        figure: The plotly figure (``plotly.graph_objects.Figure``).
        points: Data points given to plotly (after downsampling).
        downsampled: Whether some series were cut to the point budget.
        smoothed: Whether it has smoothed traces (``meta.smooth_of``: the index of the raw
            trace each smooths), which the page's smoothing control redraws.
    """

    id: str
    title: str
    caption: str
    figure: Any
    points: int
    downsampled: bool = False
    smoothed: bool = False
