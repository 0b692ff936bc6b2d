"""report.series: repeats dropped, TensorBoard smoothing, min/max downsampling."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_training.report.series import (
    drop_repeats,
    ema_smooth,
    minmax_downsample,
    round_significant,
)


def test_drop_repeats_keeps_new_values_and_the_last_point():
    """A gauge re-exported unchanged keeps its first appearance; the series' end stays."""
    xs, ys = drop_repeats([1, 2, 3, 4, 5, 6], [5.0, 5.0, 4.0, 4.0, 4.0, 4.0])
    assert (xs, ys) == ([1, 3, 6], [5.0, 4.0, 4.0])
    assert drop_repeats([], []) == ([], [])
    nan_x, _ = drop_repeats([1, 2], [math.nan, math.nan])
    assert nan_x == [1, 2]  # NaN never equals itself: each one is a new value


def test_ema_smooth_is_tensorboards_debiased_average():
    """s_t = w s_(t-1) + (1 - w) y_t from 0, divided by 1 - w^t; non-finite values pass."""
    w = 0.6
    ys = [2.0, 4.0, math.nan, 1.0]
    s1 = (1 - w) * 2.0
    s2 = w * s1 + (1 - w) * 4.0
    s3 = w * s2 + (1 - w) * 1.0
    expected = [s1 / (1 - w), s2 / (1 - w**2), None, s3 / (1 - w**3)]
    got = ema_smooth(ys, w)
    assert got[0] == pytest.approx(expected[0]) == 2.0  # the first value is itself
    assert got[1] == pytest.approx(expected[1])
    assert math.isnan(got[2])
    assert got[3] == pytest.approx(expected[3])
    assert ema_smooth([3.0, 1.0], 0.0) == [3.0, 1.0]


def test_minmax_downsample_keeps_spikes_and_ends():
    """Cut to the budget, each bucket's lowest and highest point survive: a spike stays."""
    n = 10_000
    xs = list(range(n))
    ys = [1.0] * n
    ys[4321] = 50.0
    ys[777] = -3.0
    out_x, out_y, cut = minmax_downsample(xs, ys, 200)
    assert cut and len(out_x) <= 202
    assert out_x[0] == 0 and out_x[-1] == n - 1
    assert 50.0 in out_y and -3.0 in out_y
    assert out_x == sorted(out_x)
    assert minmax_downsample([1, 2], [3.0, 4.0], 200) == ([1, 2], [3.0, 4.0], False)


def test_round_significant():
    """Six significant digits by default; non-finite values become None (a gap)."""
    assert round_significant(3.14159265) == 3.14159
    assert round_significant(123456789.0) == 123457000.0
    assert round_significant(0.000123456789, 3) == 0.000123
    assert round_significant(0.0) == 0.0
    assert round_significant(math.inf) is None and round_significant(None) is None


def test_ema_smooth_matches_numbers_worked_by_hand():
    """w = 0.5 over 4, 2, 1: sums 2, 2, 1.5 over debias 0.5, 0.75, 0.875 give 4, 8/3, 12/7."""
    assert ema_smooth([4.0, 2.0, 1.0], 0.5) == pytest.approx([4.0, 8 / 3, 12 / 7])


@settings(max_examples=200, deadline=None)
@given(
    value=st.floats(-1e6, 1e6, allow_nan=False),
    count=st.integers(1, 50),
    weight=st.floats(0.0, 0.99),
)
def test_ema_smooth_of_a_constant_is_that_constant(value, count, weight):
    """A constant series smooths to itself at any weight (the debiasing removes the pull
    towards the zero it starts from)."""
    assert ema_smooth([value] * count, weight) == pytest.approx([value] * count, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    ys=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30),
    weight=st.floats(0.0, 0.99),
)
def test_ema_smooth_starts_at_the_first_raw_value(ys, weight):
    """The first smoothed value is the first raw value, at any weight."""
    assert ema_smooth(ys, weight)[0] == pytest.approx(ys[0], abs=1e-6)
