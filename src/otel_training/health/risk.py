"""The job's progress at risk: what a crash would lose now (``docs/health.md``, "Checkpoints
and progress at risk").

The one place it is defined for the files; ``collector-config/rules/training.yaml`` records the
same (``run:dl_training_checkpoint_age:seconds``). At a time t, over the processes of one
attempt, each read at its last sample at or before t:

- the largest ``dl.training.checkpoint.age`` of the ranks that have saved (each carried forward
  to t): the oldest last save among the writers, since every writer must have written the job's
  last good checkpoint; a rank that never saves (DDP's rank > 0) has no age and plays no part;
- before any rank of the attempt has saved, the time since training began: the largest phase
  time outside ``startup`` and ``checkpoint_load``.

``None`` before any process has a sample. Nothing here raises.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from otel_training.health import ledger as _ledger
from otel_training.health.evidence import Process, Sample

__all__ = ["progress_at_risk_s"]

_NOT_TRAINING = (_ledger.STARTUP, _ledger.CHECKPOINT_LOAD)


def _last_sample(process: Process, t: float) -> Sample | None:
    samples = process.ledger
    i = bisect.bisect_right([s.time_s for s in samples], t)
    return samples[i - 1] if i else None


def progress_at_risk_s(processes: Sequence[Process], t: float) -> float | None:
    """The job's progress at risk at ``t`` (Unix seconds) over ``processes`` (one attempt),
    seconds, or ``None`` (the module docstring)."""
    ages, training = [], []
    for process in processes:
        sample = _last_sample(process, t)
        if sample is None or sample.phase_s is None:
            continue
        if sample.checkpoint_age_s is not None:
            ages.append(sample.checkpoint_age_s + (t - sample.time_s))
        began = sum(v for i, v in enumerate(sample.phase_s) if i not in _NOT_TRAINING)
        training.append(began + (t - sample.time_s if sample.open_phase not in ("startup",
                                                                                 "checkpoint_load")
                                 else 0.0))  # fmt: skip
    if ages:
        return max(ages)
    return max(training) if training else None
