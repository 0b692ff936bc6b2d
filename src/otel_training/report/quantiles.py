"""Quantiles of explicit-bucket histograms, as Prometheus' ``histogram_quantile`` computes them.

Source of the definition: Prometheus ``promql/quantile.go`` (``bucketQuantile``). The rank
``q * count`` is located in the first bucket whose cumulative count reaches it, and the quantile
is interpolated linearly within that bucket, assuming its observations are spread evenly
between its lower and upper bound. The lowest bucket starts at 0 (when its upper bound is
positive); a rank that falls in the +Inf bucket returns the highest finite bound. Where
Prometheus would divide 0 by 0 (a rank of 0 in an empty first bucket) the lower bound of the
first non-empty bucket is returned instead. Quantiles over
time are computed, as ``histogram_quantile(q, sum by (le) (increase(...)))`` does, from the
bucket counts of each interval added up over the ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from otel_training.report.run import HistogramSeries

__all__ = ["QuantilesOverTime", "histogram_quantile", "quantiles_over_time"]


def histogram_quantile(q: float, bounds: Sequence[float], bucket_counts: Sequence[int]) -> float:
    """The ``q``-quantile of one explicit-bucket histogram.

    Args:
        q: The quantile, 0 to 1 (0.99 for p99).
        bounds: Ascending upper bounds of the finite buckets (OTLP ``explicitBounds``).
        bucket_counts: ``len(bounds) + 1`` counts, the last one the +Inf bucket (OTLP layout;
            not cumulative).

    Returns:
        The quantile in the unit of the bounds; NaN when the histogram is empty; ``-inf`` for
        ``q < 0`` and ``+inf`` for ``q > 1`` (as Prometheus). Never raises for well-formed
        input.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    total = sum(bucket_counts)
    if total == 0 or not bounds:
        return math.nan
    rank = q * total
    cumulative = 0
    for i, count in enumerate(bucket_counts):
        if cumulative + count >= rank and count > 0:
            if i == len(bounds):  # the +Inf bucket
                return float(bounds[-1])
            upper = float(bounds[i])
            if i == 0:
                if upper <= 0:
                    return upper
                lower = 0.0
            else:
                lower = float(bounds[i - 1])
            return lower + (upper - lower) * (rank - cumulative) / count
        cumulative += count
    return float(bounds[-1])


@dataclass
class QuantilesOverTime:
    """Quantiles of each time bin.

    Attributes:
        quantiles: The quantiles computed, for example ``(0.5, 0.9, 0.99)``.
        times_ns: End of each bin that had observations.
        values: ``values[j][i]``: quantile ``quantiles[j]`` of bin ``i``.
        counts: Observations in each bin (all ranks).
        means: Mean observation of each bin (sum / count).
    """

    quantiles: tuple[float, ...]
    times_ns: list[int]
    values: list[list[float]]
    counts: list[int]
    means: list[float]


def _bin_width_ns(series: Sequence[HistogramSeries]) -> int:
    gaps = sorted(b - a for s in series for a, b in zip(s.times_ns, s.times_ns[1:]) if b > a)
    return gaps[len(gaps) // 2] if gaps else 1


def quantiles_over_time(
    series: Iterable[HistogramSeries],
    quantiles: Sequence[float] = (0.5, 0.9, 0.99),
    *,
    max_bins: int = 2_000,
) -> QuantilesOverTime:
    """Quantiles per export interval, the ranks' interval buckets added up.

    The exports of all ranks are put in bins one export interval wide (the median gap between
    exports; wider when that would give more than ``max_bins`` bins), centred on the first
    rank's exports so that the ranks' nearly simultaneous exports share a bin; each bin's interval
    bucket counts (``HistogramSeries.delta_buckets``, derived from cumulative or delta points)
    are added up by bucket, and :func:`histogram_quantile` runs on each bin. Series with other
    bounds than the first one are left out.

    Returns:
        One entry per bin that holds observations, in time order. Never raises.
    """
    series = [s for s in series if s.times_ns]
    result = QuantilesOverTime(tuple(quantiles), [], [[] for _ in quantiles], [], [])
    if not series:
        return result
    bounds = series[0].bounds
    series = [s for s in series if s.bounds == bounds]
    first = min(s.times_ns[0] for s in series)
    last = max(s.times_ns[-1] for s in series)
    width = max(_bin_width_ns(series), -(-(last - first + 1) // max_bins), 1)
    bins: dict[int, tuple[list[int], list[float], list[int]]] = {}
    for s in series:
        for time_ns, buckets, count, total in zip(
            s.times_ns, s.delta_buckets, s.delta_counts, s.delta_sums
        ):
            if not count:
                continue
            # Bin k holds the exports nearest to first + k * width: the ranks export at about
            # the same times, each a little apart.
            index = (time_ns - first + width // 2) // width
            entry = bins.get(index)
            if entry is None:
                bins[index] = ([*buckets], [total], [count, time_ns])
            else:
                entry[0][:] = [a + b for a, b in zip(entry[0], buckets)]
                entry[1][0] += total
                entry[2][0] += count
                entry[2][1] = max(entry[2][1], time_ns)
    for index in sorted(bins):
        buckets, (total,), (count, time_ns) = bins[index]
        result.times_ns.append(time_ns)
        result.counts.append(count)
        result.means.append(total / count)
        for j, q in enumerate(quantiles):
            result.values[j].append(histogram_quantile(q, bounds, buckets))
    return result
