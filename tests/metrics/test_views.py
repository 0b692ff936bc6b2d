"""Step-duration and checkpoint-duration buckets that fit real times (case A10), and their
overrides."""

from __future__ import annotations

import math
import random

import pytest
from doc_rules import documents
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

import otel_training
from otel_training import testing
from otel_training.metrics import views

NAME = "megatron.training.step_duration_ms"
A10_STEPS_MS = [7613, 7845, 7624, 12000, 15000, 18000, 21000, 24000, 45000, 61000]


def _histogram(memory):
    ((_, point),) = memory.points(NAME)
    return point


def test_case_a10_real_step_times_resolve():
    """Case A10: no sample in +Inf, top bound >= 120 s, p50 in (15 s, 20 s]."""
    memory = testing.configure_in_memory()
    for step in A10_STEPS_MS:
        otel_training.record_training_metrics(memory.meter, step_duration_ms=step)
    point = _histogram(memory)
    assert point.explicit_bounds[-1] >= 120_000
    assert point.bucket_counts[-1] == 0
    p50 = testing.histogram_quantile(0.5, point.explicit_bounds, point.bucket_counts)
    assert 15_000 < p50 <= 20_000
    # no two samples of distinct 1-60 s magnitude share a bucket wider than half its start
    for low, high in zip(point.explicit_bounds, point.explicit_bounds[1:]):
        if 1_000 <= low < 60_000:
            assert high - low <= low


def test_case_a10_sdk_defaults_are_the_bug(in_memory_meter):
    """With the SDK's default buckets 7 of 10 samples land in +Inf and p50 reads 10,000."""
    for step in A10_STEPS_MS:
        otel_training.record_training_metrics(in_memory_meter.meter, step_duration_ms=step)
    ((_, point),) = in_memory_meter.points(NAME)
    assert point.bucket_counts[-1] == 7
    assert testing.histogram_quantile(0.5, point.explicit_bounds, point.bucket_counts) == 10_000


@documents("README.md", "one point per step; buckets 1 ms … 30 min")
def test_buckets_span_one_ms_to_thirty_minutes():
    """The built-in bounds start at 1 ms, end at 30 min and increase strictly."""
    bounds = views.STEP_DURATION_BUCKETS_MS
    assert bounds[0] == 1 and bounds[-1] == 30 * 60 * 1000
    assert all(a < b for a, b in zip(bounds, bounds[1:]))


def test_override_by_argument():
    """configure(step_duration_buckets_ms=...) replaces the bounds."""
    memory = testing.configure_in_memory(step_duration_buckets_ms=[100, 1000])
    otel_training.record_training_metrics(memory.meter, step_duration_ms=500)
    assert tuple(_histogram(memory).explicit_bounds) == (100, 1000)


def test_override_by_environment():
    """OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS replaces the bounds."""
    memory = testing.configure_in_memory(
        {"OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS": "5,50,500"}
    )
    otel_training.record_training_metrics(memory.meter, step_duration_ms=7)
    assert tuple(_histogram(memory).explicit_bounds) == (5, 50, 500)


def test_override_by_user_view():
    """A user view for the metric replaces the default view instead of doubling the stream."""
    user = View(
        instrument_name=NAME, aggregation=ExplicitBucketHistogramAggregation(boundaries=(1, 2))
    )
    memory = testing.configure_in_memory(views=[user])
    otel_training.record_training_metrics(memory.meter, step_duration_ms=1.5)
    assert tuple(_histogram(memory).explicit_bounds) == (1, 2)


def test_bad_boundaries_raise_in_the_constructor():
    """Explicit configuration raises on unsorted bounds (constructors raise, hot paths don't)."""
    with pytest.raises(ValueError):
        views.step_duration_view([10, 5])


@documents("README.md", "recorded from the spans whatever the traces exporter; buckets 1 s … 1 h")
def test_checkpoint_buckets_span_one_second_to_one_hour():
    """The checkpoint-duration bounds start at 1 s, end at 1 h and increase strictly."""
    bounds = views.CHECKPOINT_DURATION_BUCKETS_S
    assert bounds[0] == 1 and bounds[-1] == 3600
    assert all(a < b for a, b in zip(bounds, bounds[1:]))


def test_checkpoint_view_replaced_by_a_user_view():
    """A user view for megatron.checkpoint.duration replaces its default view, not the step one."""
    name = "megatron.checkpoint.duration"
    user = View(
        instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(boundaries=(10,))
    )
    installed = views.default_views(user_views=[user])
    assert [getattr(v, "_instrument_name", None) for v in installed] == [name, NAME]
    memory = testing.configure_in_memory(views=[user])
    with otel_training.checkpoint_save("/ckpt"):
        pass
    ((_, point),) = memory.points(name)
    assert tuple(point.explicit_bounds) == (10,)


def _step_times_ms(count: int = 2000) -> list[float]:
    """Step times of a run: about 5 s with 3 % spread, and a first step of 60 s."""
    rng = random.Random(17)
    return [60_000.0] + [rng.lognormvariate(math.log(5_000), 0.03) for _ in range(count - 1)]


def test_exponential_step_histogram_is_one_point_at_prometheus_resolution():
    """OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM=exponential: an exponential histogram of at
    most 160 buckets at scale <= 8 (Prometheus' finest), whose median is within one bucket
    (2^(2^-scale)) of the true one."""
    memory = testing.configure_in_memory(
        {"OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM": "exponential"}
    )
    steps = _step_times_ms()
    for step in steps:
        otel_training.record_training_metrics(memory.meter, step_duration_ms=step)
    ((_, point),) = memory.points(NAME)
    assert isinstance(point, ExponentialHistogramDataPoint)
    assert point.count == len(steps) and point.max == 60_000.0
    assert point.scale <= views.STEP_DURATION_EXPONENTIAL_MAX_SCALE
    counts = point.positive.bucket_counts
    assert len(counts) <= views.STEP_DURATION_EXPONENTIAL_MAX_SIZE and sum(counts) == len(steps)
    base = 2 ** (2**-point.scale)
    half, seen = len(steps) / 2, 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= half:
            upper = base ** (point.positive.offset + index + 1)
            break
    true_median = sorted(steps)[len(steps) // 2]
    assert upper / base <= true_median * base and true_median <= upper * base


def test_explicit_is_the_default_and_a_user_view_wins_over_exponential():
    """Without the variable the step histogram is explicit; a user view replaces either."""
    memory = testing.configure_in_memory()
    otel_training.record_training_metrics(memory.meter, step_duration_ms=5.0)
    assert isinstance(_histogram(memory), HistogramDataPoint)
    user = View(instrument_name=NAME, aggregation=ExplicitBucketHistogramAggregation((1, 10)))
    memory = testing.configure_in_memory(
        {"OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM": "exponential"}, views=[user]
    )
    otel_training.record_training_metrics(memory.meter, step_duration_ms=5.0)
    assert tuple(_histogram(memory).explicit_bounds) == (1, 10)


def test_drop_views_silence_the_named_metrics_only():
    """drop_views: the named instruments export nothing, the others are untouched."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], views=views.drop_views(["megatron.training.loss"])
    )
    meter = provider.get_meter("t")
    otel_training.record_training_metrics(meter, loss=1.0, tokens_per_sec=2.0)
    names = {name for name, _ in testing.points(reader.get_metrics_data())}
    assert names == {"megatron.training.tokens_per_sec"}
