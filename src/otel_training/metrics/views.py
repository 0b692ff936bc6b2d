"""Default views: histogram buckets that fit real training step times and checkpoint durations,
an exponential step histogram as an option, and the views that silence replicated values.

The SDK's default explicit buckets end at 10,000: every step longer than 10 s would land in
+Inf and Grafana's percentiles would read 10,000 ms whatever the true step time (case A10). For
a histogram in seconds they would also waste most buckets below one second.

The explicit step histogram costs 40 Prometheus series per rank (38 buckets, sum, count);
``OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM=exponential`` makes it one native histogram
(:func:`step_duration_view`). A rank that does not export the replicated values
(:mod:`otel_training.metrics.replicated`) drops them with :func:`drop_views`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from opentelemetry.sdk.metrics.view import (
    DropAggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)

from otel_training.semconv.metrics import (
    MEGATRON_CHECKPOINT_DURATION,
    MEGATRON_TRAINING_STEP_DURATION_MS,
)

#: Boundaries in milliseconds for ``megatron.training.step_duration_ms``: a 1-2-3-5-7 series
#: (about x1.4 per bucket) from 1 ms to 30 min, so that any realistic optimizer step, from a
#: toy model's milliseconds to a pipeline-parallel step of minutes, falls in a finite bucket
#: whose width is at most half its lower bound. 37 boundaries, 38 buckets.
STEP_DURATION_BUCKETS_MS: Final[tuple[float, ...]] = (
    1, 2, 3, 5, 7,
    10, 14, 20, 30, 50, 70,
    100, 140, 200, 300, 500, 700,
    1_000, 1_400, 2_000, 3_000, 5_000, 7_000,
    10_000, 14_000, 20_000, 30_000, 45_000, 60_000, 90_000,
    120_000, 180_000, 300_000, 600_000, 900_000, 1_200_000, 1_800_000,
)  # fmt: skip

#: Boundaries in seconds for ``megatron.checkpoint.duration``: a 1-2-5 series from 1 s to 1 min,
#: then minutes up to 1 h, so that a save to node-local storage (seconds) and a save of a large
#: model to shared storage (minutes) both fall in a finite bucket. A sub-second checkpoint (a toy
#: model) lands in the first bucket, (0, 1 s]. 16 boundaries, 17 buckets.
CHECKPOINT_DURATION_BUCKETS_S: Final[tuple[float, ...]] = (
    1, 2, 5, 10, 20, 30,
    60, 120, 180, 300, 600, 900, 1_200, 1_800, 2_700, 3_600,
)  # fmt: skip


#: Buckets of the exponential step histogram, at most, on each side of zero (the SDK's default).
#: At scale 8 they span a factor 2^(160/256) = 1.54; steps that vary more (a first iteration, a
#: checkpoint) lower the scale, one halving of resolution per doubling of range.
STEP_DURATION_EXPONENTIAL_MAX_SIZE: Final = 160
#: The finest scale of the exponential step histogram: 8, the finest schema of Prometheus' native
#: histograms (a finer scale is cut to 8 on ingestion); buckets grow by 2^(1/256), 0.27 %.
STEP_DURATION_EXPONENTIAL_MAX_SCALE: Final = 8


def step_duration_view(
    boundaries_ms: Sequence[float] | None = None, *, exponential: bool = False
) -> View:
    """The view of ``megatron.training.step_duration_ms``: explicit buckets, or a base-2
    exponential histogram (``exponential``: at most
    :data:`STEP_DURATION_EXPONENTIAL_MAX_SIZE` buckets, scale at most
    :data:`STEP_DURATION_EXPONENTIAL_MAX_SCALE`; ``boundaries_ms`` is then not used).

    Args:
        boundaries_ms: Strictly increasing boundaries in milliseconds; ``None`` for
            :data:`STEP_DURATION_BUCKETS_MS`.
        exponential: Aggregate into an exponential histogram instead.

    Raises:
        ValueError: when ``boundaries_ms`` is empty or not strictly increasing.
    """
    if exponential:
        return View(
            instrument_name=MEGATRON_TRAINING_STEP_DURATION_MS,
            aggregation=ExponentialBucketHistogramAggregation(
                max_size=STEP_DURATION_EXPONENTIAL_MAX_SIZE,
                max_scale=STEP_DURATION_EXPONENTIAL_MAX_SCALE,
            ),
        )
    bounds = tuple(float(b) for b in (boundaries_ms or STEP_DURATION_BUCKETS_MS))
    if not bounds or any(b >= c for b, c in zip(bounds, bounds[1:])):
        raise ValueError(f"step-duration boundaries must be strictly increasing: {bounds!r}")
    return View(
        instrument_name=MEGATRON_TRAINING_STEP_DURATION_MS,
        aggregation=ExplicitBucketHistogramAggregation(boundaries=bounds),
    )


def checkpoint_duration_view() -> View:
    """The view giving ``megatron.checkpoint.duration`` the explicit buckets
    :data:`CHECKPOINT_DURATION_BUCKETS_S` (seconds). Raises nothing."""
    return View(
        instrument_name=MEGATRON_CHECKPOINT_DURATION,
        aggregation=ExplicitBucketHistogramAggregation(boundaries=CHECKPOINT_DURATION_BUCKETS_S),
    )


def drop_views(names: Iterable[str]) -> list[View]:
    """One view per metric name that drops it (``DropAggregation``): the instrument still takes
    measurements, at the cost of a dictionary lookup, and nothing is exported. Raises nothing.

    A user's view that selects the same instrument still exports it: the SDK applies every
    matching view.
    """
    return [View(instrument_name=name, aggregation=DropAggregation()) for name in names]


def default_views(
    step_duration_buckets_ms: Sequence[float] | None = None,
    user_views: Iterable[View] = (),
    *,
    exponential_step_duration: bool = False,
    silent: Iterable[str] = (),
) -> list[View]:
    """The views ``configure()`` installs: the user's, then the defaults they do not replace,
    then the views that drop what this rank does not export.

    A user view that selects ``megatron.training.step_duration_ms`` (or
    ``megatron.checkpoint.duration``) by name replaces the default view of that metric (two
    matching views would export the metric twice).

    Args:
        step_duration_buckets_ms: Boundaries of the explicit step histogram, in ms.
        user_views: The user's views, first.
        exponential_step_duration: An exponential step histogram (:func:`step_duration_view`).
        silent: Metric names this rank does not export (:func:`drop_views`).

    Raises:
        ValueError: when ``step_duration_buckets_ms`` is not strictly increasing.
    """
    views = list(user_views)
    # View keeps the selector in a private attribute; it is the only way to see it.
    selected = {getattr(v, "_instrument_name", None) for v in views}
    if MEGATRON_TRAINING_STEP_DURATION_MS not in selected:
        views.append(
            step_duration_view(step_duration_buckets_ms, exponential=exponential_step_duration)
        )
    if MEGATRON_CHECKPOINT_DURATION not in selected:
        views.append(checkpoint_duration_view())
    views.extend(drop_views(silent))
    return views
