"""The tensor-metric schedule: the built-in tensor metrics' names, and the one reading of a
schedule (``"grad_norm:10,router:50"``), strict in code and lenient in
``OTEL_PYTHON_TRAINING_TENSOR_METRICS``. Nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final, NamedTuple

from otel_training.config import variables as ev
from otel_training.config._env import EnvReader

#: Built-in tensor metrics that ``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` may schedule, the one list
#: of them: :data:`otel_training.tensor.BUILTIN_METRICS` gives each its definition, in this order
#: (kept here so that parsing the environment does not import torch).
TENSOR_METRIC_NAMES: Final = (
    "grad_norm",
    "param_norm",
    "grad_nonfinite",
    "update_ratio",
    "activation_rms",
    "activation_max_abs",
    "residual_rms",
    "residual_max_abs",
    "logits_norm",
    "router",
    "router_expert_load",
)


class ScheduleEntry(NamedTuple):
    """One entry of a tensor-metric schedule, as :func:`split_tensor_metric_schedule` reads it.

    Attributes:
        text: The entry as written (blanks around it taken off): ``grad_norm:10``.
        name: What stands before the colon, blanks taken off, its case kept.
        interval: The whole number of optimizer steps >= 1 after the colon; ``None`` when the
            entry is not ``NAME:INTERVAL`` with one.
    """

    text: str
    name: str
    interval: int | None


def split_tensor_metric_schedule(text: str) -> tuple[ScheduleEntry, ...] | None:
    """The one reading of a tensor-metric schedule, ``"grad_norm:10,router:50"``: in code
    (:func:`otel_training.tensor.parse_schedule`, strict) and in
    ``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` (:func:`tensor_metric_schedule`, lenient).

    Returns:
        ``None`` for ``none`` or ``off`` (any case): no tensor metric at all; else each
        non-empty comma-separated entry in order (:class:`ScheduleEntry`). Never raises: what a
        malformed entry does is the caller's policy (in code it raises, from the environment it
        warns and is skipped).
    """
    if text.strip().lower() in ("none", "off"):
        return None
    entries = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        name, sep, interval = (s.strip() for s in entry.partition(":"))
        try:
            steps = int(interval) if sep and interval.isdecimal() else 0
        except ValueError:  # more digits than int() converts
            steps = 0
        entries.append(ScheduleEntry(entry, name, steps if steps >= 1 else None))
    return tuple(entries)


def tensor_metric_schedule(
    environ: Mapping[str, str] | None = None,
) -> tuple[tuple[str, int], ...] | None:
    """Parses only ``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` into ``(name, interval)`` pairs.

    Returns:
        ``None`` when the variable is unset or empty, or names no usable entry (the caller's
        default applies); ``()`` for ``none``; else the usable entries in their order. Never
        raises: each bad entry (not ``NAME:INTERVAL``, an unknown name, an interval that is not
        a whole number >= 1, a repeated name) logs one warning naming it and is skipped.
    """
    return read_tensor_metrics(EnvReader(os.environ if environ is None else environ))


def read_tensor_metrics(env: EnvReader) -> tuple[tuple[str, int], ...] | None:
    """``OTEL_PYTHON_TRAINING_TENSOR_METRICS`` read from ``env``, as
    :func:`tensor_metric_schedule` says; :func:`otel_training.config.load` reads it with the
    reader of every other variable."""
    name = ev.OTEL_PYTHON_TRAINING_TENSOR_METRICS
    raw = env.raw(name)
    if raw is None:
        return None
    entries = split_tensor_metric_schedule(raw)
    if entries is None:
        return ()
    schedule: dict[str, int] = {}
    for entry in entries:
        metric = entry.name.lower()
        why = None
        if entry.interval is None:
            why = "is not NAME:INTERVAL with a whole number of steps >= 1"
        elif metric not in TENSOR_METRIC_NAMES:
            why = f"names no tensor metric (known: {', '.join(TENSOR_METRIC_NAMES)})"
        elif metric in schedule:
            why = "repeats a tensor metric already scheduled"
        if why is not None:
            env.warn("%s: ignoring the entry %r, which %s.", name, entry.text, why)
            continue
        schedule[metric] = entry.interval
    if not schedule:
        env.reject(name, raw, "the observer's default", "schedules no tensor metric")
        return None
    return tuple(schedule.items())
