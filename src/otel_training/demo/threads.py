"""How many threads torch uses in each process of the demo, chosen for the machine it runs on.

torch starts one intra-op thread per CPU of the machine. When several processes share the CPUs
(``torchrun --nproc_per_node=N``, or other jobs keeping them busy), those threads wait for each
other at every operator: on a loaded 2-core machine the demo ran 4.7 times faster with one
thread per process than with torch's default. So, in this order:

1. ``--threads N`` when given;
2. ``OMP_NUM_THREADS`` when set (torch already takes it; torchrun sets it to 1 when it starts
   several processes on a node and it was not set);
3. else the CPUs this process may run on (``os.sched_getaffinity``, which a container's or
   SLURM's CPU set limits; else ``os.cpu_count()``), shared among the processes of the node
   (``LOCAL_WORLD_SIZE``), and no more than the CPUs the 1-minute load average leaves idle,
   shared alike; at least one.

The choice is said in a sentence (:attr:`ThreadChoice.why`), which the demo prints.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from otel_training import config

__all__ = ["ThreadChoice", "apply_threads", "choose_threads", "machine_cpus"]


@dataclass(frozen=True)
class ThreadChoice:
    """The threads torch uses per process, and why.

    Attributes:
        threads: Intra-op threads per process (``torch.set_num_threads``), at least 1.
        why: What decided it, for a person (``OMP_NUM_THREADS=1``; ``2 CPUs shared by 2
            processes on this node``...).
    """

    threads: int
    why: str

    @property
    def sentence(self) -> str:
        """``1 torch thread per process (OMP_NUM_THREADS=1)``."""
        return (
            f"{self.threads} torch thread{'s' if self.threads != 1 else ''} per process "
            f"({self.why})"
        )


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not available here
        return None


def choose_threads(
    cpus: int,
    processes: int = 1,
    load_1min: float | None = None,
    omp_num_threads: int | None = None,
    asked: int | None = None,
) -> ThreadChoice:
    """The threads per process (see the module docstring for the rule).

    Args:
        cpus: CPUs this process may run on.
        processes: Processes of this job on the node (``LOCAL_WORLD_SIZE``), at least 1.
        load_1min: The 1-minute load average (runnable processes), ``None`` when unknown.
        omp_num_threads: ``OMP_NUM_THREADS`` when set.
        asked: ``--threads`` when given.

    Returns:
        The choice. Never raises.
    """
    if asked is not None:
        return ThreadChoice(max(1, asked), f"--threads {asked}")
    if omp_num_threads is not None:
        return ThreadChoice(max(1, omp_num_threads), f"OMP_NUM_THREADS={omp_num_threads}")
    cpus, processes = max(1, cpus), max(1, processes)
    share = max(1, cpus // processes)
    who = f"{cpus} CPU{'s' if cpus != 1 else ''}" + (
        f" shared by {processes} processes on this node" if processes > 1 else ""
    )
    if load_1min is None or not math.isfinite(load_1min):
        return ThreadChoice(share, who)
    idle = max(1, math.floor((cpus - load_1min) / processes))
    if idle < share:
        return ThreadChoice(idle, f"{who}, load average {load_1min:.1f}")
    return ThreadChoice(share, f"{who}, load average {load_1min:.1f}")


def apply_threads(asked: int | None = None) -> ThreadChoice:
    """Chooses the threads for this process (:func:`choose_threads` on this machine, its
    ``LOCAL_WORLD_SIZE`` and ``OMP_NUM_THREADS``) and sets them with
    ``torch.set_num_threads``. Call it once, before training, on the main thread."""
    import torch

    choice = choose_threads(
        machine_cpus(),
        config.load_identity().local_world_size,
        _load_average(),
        config.load_omp_num_threads(),
        asked,
    )
    torch.set_num_threads(choice.threads)
    return choice
