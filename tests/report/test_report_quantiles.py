"""report.quantiles: Prometheus histogram_quantile, checked against values derived by hand and
against exact quantiles of samples that fill their buckets evenly, and against a transcription
of Prometheus' bucketQuantile."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import examples

from otel_training.report import histogram_quantile, quantiles_over_time
from otel_training.report.run import HistogramSeries

BOUNDS = (100.0, 140.0, 200.0)


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        # 10 observations in (100, 140]: the median is at rank 5 of 10, halfway: 120.
        (0.5, [0, 10, 0, 0], 120.0),
        # 4 in (0, 100] and 4 in (100, 140]: p75 is rank 6, 2 of 4 into the second: 120.
        (0.75, [4, 4, 0, 0], 120.0),
        # The lowest bucket starts at 0: rank 1 of 4 in (0, 100] is 25.
        (0.25, [4, 0, 0, 0], 25.0),
        # p90 of 10 is rank 9; the first 8 fill (0, 140]; 1 of 2 in (140, 200]: 170.
        (0.9, [4, 4, 2, 0], 170.0),
        # A rank in the +Inf bucket returns the highest finite bound.
        (0.99, [1, 0, 0, 9], 200.0),
        # Empty buckets before the first observation do not count: rank 0 is 140.
        (0.0, [0, 0, 3, 0], 140.0),
    ],
)
def test_hand_derived_quantiles(q, buckets, expected):
    """Quantiles worked out by hand from Prometheus' linear interpolation."""
    assert histogram_quantile(q, BOUNDS, buckets) == pytest.approx(expected)


def test_evenly_filled_buckets_give_the_exact_quantile():
    """Observations spread evenly in their buckets: interpolation gives the samples' quantile."""
    bounds = (10.0, 20.0, 50.0, 100.0, 400.0)
    counts = [7, 30, 120, 45, 18, 0]
    samples = []
    for i, count in enumerate(counts[:-1]):
        low = 0.0 if i == 0 else bounds[i - 1]
        # count samples at the right end of count equal sub-intervals of (low, bound]
        samples += [low + (bounds[i] - low) * (k + 1) / count for k in range(count)]
    samples.sort()
    n = len(samples)
    for q in (0.1, 0.25, 0.5, 0.9, 0.99):
        rank = q * n
        k = math.ceil(rank) - 1  # the sample at which the cumulative count reaches the rank
        within = samples[k] if rank == k + 1 else None
        got = histogram_quantile(q, bounds, counts)
        if within is not None:
            assert got == pytest.approx(within)
        else:  # between two samples of one bucket: linear between them
            assert samples[k - 1] - 1e-9 <= got <= samples[k] + 1e-9 if k else got <= samples[0]


def _series(times, deltas, bounds=BOUNDS):
    series = HistogramSeries("h", (), bounds, "delta")
    total = [0] * (len(bounds) + 1)
    for t, buckets in zip(times, deltas):
        series.times_ns.append(t)
        series.delta_buckets.append(buckets)
        series.delta_counts.append(sum(buckets))
        series.delta_sums.append(float(sum(buckets)))
        total = [a + b for a, b in zip(total, buckets)]
    series.cumulative_buckets = total
    return series


def test_quantiles_over_time_add_the_ranks_buckets_by_bound():
    """An interval's quantile is over all ranks' buckets added up by bound (sum by le)."""
    s = 10**9
    rank0 = _series([5 * s, 10 * s], [[0, 10, 0, 0], [0, 0, 0, 0]])
    rank1 = _series([5 * s + 1000, 10 * s + 1000], [[0, 0, 10, 0], [10, 0, 0, 0]])
    result = quantiles_over_time([rank0, rank1], (0.5, 0.9))
    assert result.counts == [20, 10]
    # Interval 1: 10 in (100, 140] and 10 in (140, 200]: median at rank 10 is 140, p90 at 18 is 188.
    assert result.values[0] == pytest.approx([140.0, 50.0])
    assert result.values[1] == pytest.approx([188.0, 90.0])
    assert result.times_ns == [5 * s + 1000, 10 * s + 1000]


def test_quantiles_over_time_of_random_steps_match_the_whole_histogram():
    """One interval holding every observation gives the quantile of the whole histogram."""
    rng = random.Random(0)
    buckets = [0] * (len(BOUNDS) + 1)
    for _ in range(500):
        value = rng.lognormvariate(4.8, 0.3)
        buckets[sum(value > b for b in BOUNDS)] += 1
    result = quantiles_over_time([_series([10**9], [buckets])], (0.5, 0.99))
    assert result.values[0][0] == pytest.approx(histogram_quantile(0.5, BOUNDS, buckets))
    assert result.values[1][0] == pytest.approx(histogram_quantile(0.99, BOUNDS, buckets))


def _prometheus_bucket_quantile(q: float, bounds, counts) -> float:
    """Prometheus' ``bucketQuantile`` (promql/quantile.go) transcribed on cumulative buckets,
    +Inf last, as an independent reference."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    uppers = [*bounds, math.inf]
    cumulative = list(itertools.accumulate(counts))
    if len(uppers) < 2 or cumulative[-1] == 0:
        return math.nan
    rank = q * cumulative[-1]
    b = next(i for i, c in enumerate(cumulative[:-1] + [math.inf]) if c >= rank)
    if b == len(uppers) - 1:
        return uppers[-2]
    if b == 0 and uppers[0] <= 0:
        return uppers[0]
    start, count = 0.0, cumulative[b]
    if b > 0:
        start = uppers[b - 1]
        count -= cumulative[b - 1]
        rank -= cumulative[b - 1]
    return start + (uppers[b] - start) * (rank / count)


@pytest.mark.parametrize(
    ("q", "bounds", "buckets", "expected"),
    [
        (math.nan, BOUNDS, [1, 2, 3, 4], math.nan),  # NaN quantile: NaN
        (-0.1, BOUNDS, [1, 0, 0, 0], -math.inf),  # below 0: -Inf
        (1.5, BOUNDS, [1, 0, 0, 0], math.inf),  # above 1: +Inf
        (0.5, BOUNDS, [0, 0, 0, 0], math.nan),  # no observation: NaN
        (0.5, (), [5], math.nan),  # the +Inf bucket alone (fewer than two buckets): NaN
        (0.5, (-1.0, 5.0), [3, 0, 0], -1.0),  # a first bound <= 0 is returned as is
        (0.5, (0.0, 5.0), [3, 0, 0], 0.0),
        (0.5, (-1.0, 5.0), [0, 4, 0], 2.0),  # above the first bucket: interpolated as usual
        (1.0, BOUNDS, [4, 4, 2, 0], 200.0),  # q = 1: the top of the last non-empty bucket
        (1.0, BOUNDS, [4, 4, 2, 1], 200.0),  # in +Inf: the highest finite bound
    ],
)
def test_edge_cases_are_prometheus(q, bounds, buckets, expected):
    """The edges as Prometheus documents histogram_quantile: NaN, q outside [0, 1], an empty
    histogram, no finite bucket, a first bound <= 0."""
    got = histogram_quantile(q, bounds, buckets)
    assert got == expected or (math.isnan(got) and math.isnan(expected))
    reference = _prometheus_bucket_quantile(q, bounds, buckets)
    assert got == reference or (math.isnan(got) and math.isnan(reference))


@settings(max_examples=examples(300), deadline=None)
@given(
    q=st.floats(0.0, 1.0, exclude_min=True),
    first=st.floats(-100.0, 100.0),
    widths=st.lists(st.floats(0.5, 1_000.0), max_size=6),
    data=st.data(),
)
def test_any_histogram_agrees_with_prometheus(q, first, widths, data):
    """For any quantile in (0, 1] and any bounds and counts, the value is the one Prometheus'
    bucketQuantile gives (rank 0, where Prometheus divides 0 by 0, is the documented
    exception: q = 0 is left out here)."""
    bounds = tuple(itertools.accumulate([first, *widths]))
    counts = data.draw(st.lists(st.integers(0, 50), min_size=len(bounds) + 1,
                                max_size=len(bounds) + 1))  # fmt: skip
    got = histogram_quantile(q, bounds, counts)
    reference = _prometheus_bucket_quantile(q, bounds, counts)
    if math.isnan(reference):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(reference, rel=1e-12, abs=1e-9)


def test_the_testing_module_has_the_same_function():
    """otel_training.testing.histogram_quantile is this one, not a copy (issue 28)."""
    from otel_training import testing

    assert testing.histogram_quantile is histogram_quantile
    assert "histogram_quantile" in testing.__all__
