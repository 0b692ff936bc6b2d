"""Replicated values sent once: which ranks export the values every peer of a stage holds alike.

Loss, learning rate, gradient norm, skipped iterations and the norms of replicated parameters
are the same on every data- and tensor-parallel peer of a pipeline stage (Megatron-LM reduces
them over those groups before anyone reads them). The registry marks them ``replicated``
(:data:`REPLICATED_METRICS`). Exported by every rank, a 4,096-rank job (TP 8, PP 16, DP 32)
sends each of them 256 times per stage. :func:`decide` says whether this rank exports them:

- ``all``: every rank (the behaviour before this policy, and the default up to 64 ranks);
- ``pp_first``: one rank per pipeline stage, the one whose tensor- and data-parallel ranks are
  0; the other ranks keep every other series (step time, throughput, memory, health, device),
  so each rank's straggler and hang signals survive (NeMo Lens' ``single_rank`` default loses
  them: docs/scale.md compares the strategies);
- ``auto`` (default): ``pp_first`` above :data:`AUTO_WORLD_SIZE` ranks, else ``all``.

The parallel layout is read from the Resource the training code builds
(``dl.pipeline_parallel.rank``, ``dl.tensor_parallel.rank``, ``dl.data_parallel.rank``); it is
never detected and never communicated. Without it every rank exports, and the note says so.
A silent rank drops the replicated instruments with views (``DropAggregation``,
:func:`otel_training.metrics.views.drop_views`): the SDK's own mechanism, nothing on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from otel_training.config import variables as ev
from otel_training.semconv.attributes import (
    DL_DATA_PARALLEL_RANK,
    DL_PIPELINE_PARALLEL_RANK,
    DL_TENSOR_PARALLEL_RANK,
)
from otel_training.semconv.metrics import METRICS

__all__ = [
    "AUTO_WORLD_SIZE",
    "REPLICATED_METRICS",
    "ParallelLayout",
    "ReplicatedExport",
    "decide",
]

#: The metrics of the registry marked ``replicated``, sorted.
REPLICATED_METRICS: Final[tuple[str, ...]] = tuple(
    sorted(name for name, spec in METRICS.items() if spec.replicated)
)
#: Above this many ranks, ``auto`` exports replicated values from one rank per stage.
AUTO_WORLD_SIZE: Final = 64

_LAYOUT_KEYS: Final = (DL_PIPELINE_PARALLEL_RANK, DL_TENSOR_PARALLEL_RANK, DL_DATA_PARALLEL_RANK)


@dataclass(frozen=True)
class ParallelLayout:
    """Where a rank sits in Megatron-LM's parallel groups (all ranks from 0).

    Attributes:
        pipeline: ``dl.pipeline_parallel.rank``, the pipeline stage.
        tensor: ``dl.tensor_parallel.rank``.
        data: ``dl.data_parallel.rank``.
    """

    pipeline: int
    tensor: int
    data: int

    @classmethod
    def from_attributes(
        cls, attributes: Mapping[str, object]
    ) -> tuple[ParallelLayout | None, tuple[str, ...]]:
        """The layout in resource ``attributes`` and the keys that are missing or not whole
        numbers >= 0 (then the layout is ``None``). Ints and decimal strings (as
        ``OTEL_RESOURCE_ATTRIBUTES`` gives them) are accepted. Never raises."""
        values: list[int] = []
        bad: list[str] = []
        for key in _LAYOUT_KEYS:
            value = attributes.get(key)
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value.strip())
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                values.append(value)
            else:
                bad.append(key)
        if bad:
            return None, tuple(bad)
        return cls(*values), ()

    @property
    def exports_replicated(self) -> bool:
        """True for the one rank per stage that exports replicated values under ``pp_first``."""
        return self.tensor == 0 and self.data == 0


@dataclass(frozen=True)
class ReplicatedExport:
    """What this rank does with the replicated values.

    Attributes:
        policy: The policy in effect: ``all`` or ``pp_first``.
        exports: Whether this rank exports the replicated metrics.
        note: The one line ``configure()`` adds to what it announces, or ``None`` when every
            rank exports by default; it names what this rank leaves out and who sends it, or
            why the policy could not be applied.
    """

    policy: str
    exports: bool
    note: str | None = None

    @property
    def silent_metrics(self) -> tuple[str, ...]:
        """The metrics this rank does not export."""
        return () if self.exports else REPLICATED_METRICS


def decide(setting: str, world_size: int, attributes: Mapping[str, object]) -> ReplicatedExport:
    """Applies ``OTEL_PYTHON_TRAINING_EXPORT_REPLICATED`` to this rank.

    Args:
        setting: ``auto``, ``all`` or ``pp_first`` (``config.Settings.export_replicated``).
        world_size: The number of ranks of the job.
        attributes: The rank's resource attributes (the parallel layout is read there).

    Returns:
        The decision; every rank exports when the layout is absent. Never raises.
    """
    name = ev.OTEL_PYTHON_TRAINING_EXPORT_REPLICATED
    if setting == "all" or (setting == "auto" and world_size <= AUTO_WORLD_SIZE):
        return ReplicatedExport("all", True)
    why = f"{name}={setting}" + (
        f" ({world_size} ranks > {AUTO_WORLD_SIZE})" if setting == "auto" else ""
    )
    layout, missing = ParallelLayout.from_attributes(attributes)
    if layout is None:
        note = (
            f"replicated values from every rank: {why} needs the parallel layout on the "
            f"Resource (configure(resource_attributes=...) or OTEL_RESOURCE_ATTRIBUTES); "
            f"missing or not a whole number: {', '.join(missing)}"
        )
        return ReplicatedExport("all", True, note)
    if layout.exports_replicated:
        note = f"replicated values from this rank for pipeline stage {layout.pipeline} ({why})"
        return ReplicatedExport("pp_first", True, note)
    note = (
        f"replicated values ({', '.join(REPLICATED_METRICS)}) not from this rank: the rank of "
        f"pipeline stage {layout.pipeline} with tensor- and data-parallel rank 0 sends them "
        f"({why})"
    )
    return ReplicatedExport("pp_first", False, note)
