"""Training text that ships with every Python install: the standard library's own sources.

The corpus is the bytes of the ``.py`` files under ``sysconfig.get_paths()["stdlib"]``, walked in
sorted order (``site-packages``, ``dist-packages`` and ``__pycache__`` left out), so a given Python
install always yields the same bytes. Every ``eval_every``-th file goes to the held-out split.
Batches are random contiguous windows of ``seq_len + 1`` bytes drawn with a seeded generator.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["ByteCorpus", "load_stdlib_corpus", "stdlib_source_files"]

VOCAB_SIZE = 256
"""Byte-level vocabulary: one token per byte value."""

_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_FILE_SEPARATOR = b"\n\n"


def stdlib_source_files(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Lists the standard library's ``.py`` files in a deterministic (sorted) order.

    Args:
        root: directory to walk; defaults to ``sysconfig.get_paths()["stdlib"]``.

    Returns:
        Paths sorted by their path relative to ``root``; installed third-party packages
        (``site-packages``, ``dist-packages``) and byte-code caches are left out.
    """
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        found.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())


@dataclass
class ByteCorpus:
    """Train and held-out byte streams.

    Attributes:
        train: ``train[N_train]`` uint8 on the CPU.
        eval: ``eval[N_eval]`` uint8 on the CPU.
        n_files: number of source files read.
    """

    train: torch.Tensor
    eval: torch.Tensor
    n_files: int

    def batch(
        self,
        split: str,
        batch_size: int,
        seq_len: int,
        generator: torch.Generator,
        device: torch.device | str = "cpu",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws random contiguous windows of ``seq_len + 1`` bytes.

        Args:
            split: ``"train"`` or ``"eval"``.
            batch_size: windows per batch, ``B``.
            seq_len: tokens per window, ``S``.
            generator: CPU generator that picks the window starts (seed it for determinism).
            device: where the returned tensors live.

        Returns:
            ``(inputs[B, S], targets[B, S])`` int64 on ``device``; ``targets`` is ``inputs``
            shifted left by one byte.

        Raises:
            ValueError: if ``split`` is unknown or shorter than ``seq_len + 1`` bytes.
        """
        data = {"train": self.train, "eval": self.eval}.get(split)
        if data is None:
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'eval'")
        if data.numel() < seq_len + 1:
            raise ValueError(f"{split} split has {data.numel()} bytes, need >= {seq_len + 1}")
        starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=generator)
        windows = data[starts[:, None] + torch.arange(seq_len + 1)].long()
        windows = windows.to(device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]

    def shard(self, index: int, count: int) -> ByteCorpus:
        """This data-parallel rank's part: the ``index``-th of ``count`` contiguous, disjoint,
        near-equal slices of each split (views, no copy), so that ranks train on different bytes.

        Raises:
            ValueError: if not ``0 <= index < count``.
        """
        if not 0 <= index < count:
            raise ValueError(f"shard {index} of {count} does not exist")
        if count == 1:
            return self

        def part(data: torch.Tensor) -> torch.Tensor:
            n = data.numel()
            return data[index * n // count : (index + 1) * n // count]

        return ByteCorpus(train=part(self.train), eval=part(self.eval), n_files=self.n_files)


def load_stdlib_corpus(
    *,
    root: str | os.PathLike[str] | None = None,
    eval_every: int = 10,
    max_bytes: int | None = None,
) -> ByteCorpus:
    """Reads the standard library's sources into train and held-out byte streams.

    Args:
        root: directory to read; defaults to the running interpreter's standard library.
        eval_every: every ``eval_every``-th file (in sorted order) is held out for evaluation.
        max_bytes: stop after about this many bytes in total (whole files); ``None`` reads all
            (about 30 MiB on CPython 3.11 with its test suite).

    Returns:
        The `ByteCorpus`; files are joined with a blank line between them.

    Raises:
        ValueError: if fewer than two files are found or ``eval_every < 2``.
    """
    if eval_every < 2:
        raise ValueError(f"eval_every must be >= 2, got {eval_every}")
    files = stdlib_source_files(root)
    if len(files) < 2:
        raise ValueError(f"found {len(files)} .py files under {root!r}; need at least 2")
    parts: dict[str, list[bytes]] = {"train": [], "eval": []}
    total = 0
    n_files = 0
    for index, path in enumerate(files):
        try:
            content = path.read_bytes()
        except OSError:
            continue
        n_files += 1
        split = "eval" if index % eval_every == eval_every - 1 else "train"
        parts[split].append(content)
        total += len(content)
        if max_bytes is not None and total >= max_bytes:
            break

    def to_tensor(chunks: list[bytes]) -> torch.Tensor:
        joined = bytearray(_FILE_SEPARATOR.join(chunks))
        if not joined:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(joined, dtype=torch.uint8)

    return ByteCorpus(
        train=to_tensor(parts["train"]), eval=to_tensor(parts["eval"]), n_files=n_files
    )
