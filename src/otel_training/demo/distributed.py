"""Data parallelism for the demo: the process group under torchrun, the device, the averages.

Under ``torchrun --nproc_per_node=N`` every process is one data-parallel rank: `DataParallel.setup`
initialises ``torch.distributed`` from the launcher's variables (NCCL when the rank trains on a
CUDA device, gloo otherwise), and `DataParallel.close` destroys the process group it created.
Without a launcher (or with a world of one) nothing is initialised and every collective below is
the identity, so the single-process demo runs the same code.

What the demo reports across ranks follows Megatron-LM (``megatron/training/training.py``,
``train_step`` and ``training_log``): the loss is averaged over the data-parallel ranks before it
is logged, tokens/s counts the tokens of every data-parallel rank (the global batch), and TFLOP/s
is divided by the world size (per GPU).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from otel_training import config

__all__ = ["DataParallel", "parameter_digest", "resolve_device"]


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """The device one rank trains on.

    Args:
        name: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        local_rank: this process's rank on its node; ``auto`` and ``cuda`` without an index
            pick ``cuda:{local_rank}``, as torchrun's one-process-per-GPU layout wants.

    Returns:
        The device.

    Raises:
        ValueError: for a name torch does not know, or a CUDA device this machine lacks.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"--device {name!r}: {exc}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= count:
            raise ValueError(f"--device {name!r}: this machine has {count} CUDA device(s)")
    elif device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"--device {name!r}: there is one CPU device")
    return device


@dataclass
class DataParallel:
    """This process's place among the data-parallel ranks, and the collectives the demo needs.

    Attributes:
        rank: data-parallel rank, ``0 <= rank < world_size``.
        world_size: number of data-parallel ranks (here also the number of devices).
        local_rank: rank on this node.
        device: the device this rank trains on.
        backend: ``"gloo"`` or ``"nccl"`` when ranks talk through ``torch.distributed``;
            ``None`` for a single process.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None
    _owns_group: bool = False

    @classmethod
    def setup(cls, device_name: str = "auto") -> DataParallel:
        """Joins the job that launched this process, initialising ``torch.distributed`` when it
        has more than one rank and nothing initialised it yet.

        The rank identity comes from the launcher's variables (``otel_training.config``); the
        process group uses ``env://`` (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
        ``WORLD_SIZE``, as torchrun sets them). Runs on the calling (training) thread.

        Args:
            device_name: as for `resolve_device`.

        Returns:
            The `DataParallel` of this process.

        Raises:
            ValueError: for an unusable device, a multi-rank job without torchrun's variables
                (for example ``srun`` without torchrun), a torch without ``torch.distributed``,
                or a rendezvous that cannot start.
        """
        identity = config.load_identity()
        device = resolve_device(device_name, identity.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if identity.world_size <= 1:
            return cls(device=device)
        if identity.launcher == "slurm":
            raise ValueError(
                f"{identity.world_size} SLURM tasks without torchrun: start each node with "
                "torchrun (srun torchrun --nproc_per_node=GPUS ...) so the ranks can meet"
            )
        dist = torch.distributed
        if not dist.is_available():
            raise ValueError("this torch build has no torch.distributed; run one process")
        if dist.is_initialized():
            return cls(
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                local_rank=identity.local_rank,
                device=device,
                backend=str(dist.get_backend()),
            )
        backend = "nccl" if device.type == "cuda" else "gloo"
        try:
            dist.init_process_group(backend, init_method="env://")
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"torch.distributed ({backend}) could not start: {exc}") from None
        return cls(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            local_rank=identity.local_rank,
            device=device,
            backend=backend,
            _owns_group=True,
        )

    @property
    def is_distributed(self) -> bool:
        """True when there are other ranks to talk to."""
        return self.backend is not None and self.world_size > 1

    def average(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over the data-parallel ranks (``all_reduce`` of the sum, divided
        by ``world_size``; gloo has no average), as Megatron-LM averages the logged loss.

        Every rank must call it, in the same order. No host synchronisation: on CUDA the
        collective is enqueued on the device.

        Args:
            value: a 0-d (or any-shape) floating tensor on this rank's device; not modified.

        Returns:
            A new tensor of ``value``'s shape, identical on every rank; ``value`` itself for a
            single process.
        """
        if not self.is_distributed:
            return value
        total = value.detach().clone()
        torch.distributed.all_reduce(total)
        return total / self.world_size

    def gather(self, item: Any) -> list[Any]:
        """``[item of rank 0, item of rank 1, ...]`` on every rank (picklable ``item``); every
        rank must call it. ``[item]`` for a single process."""
        if not self.is_distributed:
            return [item]
        gathered: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, item)
        return gathered

    def close(self) -> None:
        """Destroys the process group if `setup` created it; idempotent, never raises."""
        if self._owns_group and torch.distributed.is_initialized():
            try:
                torch.distributed.destroy_process_group()
            except Exception:  # best effort at the end of a run
                pass
        self._owns_group = False


def parameter_digest(parameters: Iterable[torch.Tensor]) -> str:
    """SHA-256 over the bytes of every tensor in order (host copies), as 64 hex digits: equal on
    two ranks exactly when their parameters are bitwise equal. Synchronises with the device;
    call it once, at the end."""
    digest = hashlib.sha256()
    for tensor in parameters:
        host = tensor.detach().to("cpu").contiguous()
        digest.update(host.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
