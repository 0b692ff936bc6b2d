"""Default views: histogram buckets that fit real training step times and checkpoint durations.

The SDK's default explicit buckets end at 10,000: every step longer than 10 s would land in
+Inf and Grafana's percentiles would read 10,000 ms whatever the true step time (case A10). For
a histogram in seconds they would also waste most buckets below one second.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

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


def step_duration_view(boundaries_ms: Sequence[float] | None = None) -> View:
    """The view giving ``megatron.training.step_duration_ms`` explicit buckets.

    Args:
        boundaries_ms: Strictly increasing boundaries in milliseconds; ``None`` for
            :data:`STEP_DURATION_BUCKETS_MS`.

    Raises:
        ValueError: when ``boundaries_ms`` is empty or not strictly increasing.
    """
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


def default_views(
    step_duration_buckets_ms: Sequence[float] | None = None,
    user_views: Iterable[View] = (),
) -> list[View]:
    """The views ``configure()`` installs: the user's, then the defaults they do not replace.

    A user view that selects ``megatron.training.step_duration_ms`` (or
    ``megatron.checkpoint.duration``) by name replaces the default view of that metric (two
    matching views would export the metric twice).

    Raises:
        ValueError: when ``step_duration_buckets_ms`` is not strictly increasing.
    """
    views = list(user_views)
    # View keeps the selector in a private attribute; it is the only way to see it.
    selected = {getattr(v, "_instrument_name", None) for v in views}
    if MEGATRON_TRAINING_STEP_DURATION_MS not in selected:
        views.append(step_duration_view(step_duration_buckets_ms))
    if MEGATRON_CHECKPOINT_DURATION not in selected:
        views.append(checkpoint_duration_view())
    return views
