"""A series made fit to draw: repeats dropped, smoothed as TensorBoard does, downsampled.

A gauge is exported at every collection with its last value, so a value logged every 20 steps
appears once per export; only its first appearance (and the series' last point) is a new value.
Long series are cut to a budget of points by keeping, per bucket of consecutive points, the
lowest and the highest (a loss spike survives downsampling, which a mean or a stride would
hide).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["SMOOTH_JS", "drop_repeats", "ema_smooth", "minmax_downsample", "round_significant"]


def drop_repeats(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """Points whose value differs from the previous point's, plus the last point.

    Args:
        xs: Ascending x values (steps or seconds).
        ys: The values, as long as ``xs``.

    Returns:
        The kept ``(xs, ys)``. Never raises.
    """
    kept_x: list[float] = []
    kept_y: list[float] = []
    previous = object()
    for x, y in zip(xs, ys):
        if y != previous or (isinstance(y, float) and math.isnan(y)):
            kept_x.append(x)
            kept_y.append(y)
        previous = y
    if xs and (not kept_x or kept_x[-1] != xs[-1]):
        kept_x.append(xs[-1])
        kept_y.append(ys[-1])
    return kept_x, kept_y


def ema_smooth(ys: Sequence[float | None], weight: float = 0.6) -> list[float | None]:
    """TensorBoard's scalar smoothing: a debiased exponential moving average.

    ``s_t = w * s_{t-1} + (1 - w) * y_t`` from ``s_0 = 0``, divided by ``1 - w**n`` after ``n``
    finite values (TensorBoard ``vz_line_chart2``). Non-finite values and ``None`` pass
    through unsmoothed and do not enter the average.

    Args:
        ys: The values.
        weight: ``w``, from 0 (no smoothing) to below 1; TensorBoard's default is 0.6.
    """
    smoothed: list[float | None] = []
    last, count = 0.0, 0
    for y in ys:
        if y is None or not math.isfinite(y):
            smoothed.append(y)
            continue
        last = last * weight + (1.0 - weight) * y
        count += 1
        debias = 1.0 - weight**count if weight < 1.0 else 1.0
        smoothed.append(last / debias if debias else y)
    return smoothed


SMOOTH_JS = """\
function otelTrainingSmooth(ys, weight) {
  var smoothed = [], last = 0, count = 0;
  for (var i = 0; i < ys.length; i++) {
    var y = ys[i];
    if (y === null || y === undefined || !isFinite(y)) { smoothed.push(y); continue; }
    last = last * weight + (1 - weight) * y;
    count += 1;
    var debias = weight < 1 ? 1 - Math.pow(weight, count) : 1;
    smoothed.push(debias ? last / debias : y);
  }
  return smoothed;
}
"""
""":func:`ema_smooth` in JavaScript, for the report's smoothing control (the page smooths the
raw trace again when the weight changes); a test in headless Chromium holds the two equal."""


def minmax_downsample(
    xs: Sequence[float], ys: Sequence[float | None], max_points: int
) -> tuple[list[float], list[float | None], bool]:
    """At most about ``max_points`` points: per bucket of consecutive points, its lowest and
    highest value in x order; the first and last points are always kept.

    Returns:
        ``(xs, ys, downsampled)``; ``downsampled`` is False when the series already fit.
        Never raises.
    """
    n = len(xs)
    if n <= max_points or max_points < 4:
        return list(xs), list(ys), False
    buckets = max_points // 2
    keep = {0, n - 1}
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        best_low = best_high = None
        for i in range(lo, hi):
            y = ys[i]
            if y is None or not math.isfinite(y):
                keep.add(i)  # a gap or a non-finite value stays visible
                continue
            if best_low is None or y < ys[best_low]:
                best_low = i
            if best_high is None or y > ys[best_high]:
                best_high = i
        if best_low is not None:
            keep.update((best_low, best_high))
    order = sorted(keep)
    return [xs[i] for i in order], [ys[i] for i in order], True


def round_significant(value: float | None, digits: int = 6) -> float | None:
    """``value`` with ``digits`` significant digits (smaller HTML); ``None`` for ``None``
    and non-finite values (a gap in a plotly line)."""
    if value is None or not math.isfinite(value):
        return None
    if value == 0:
        return 0.0
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))
