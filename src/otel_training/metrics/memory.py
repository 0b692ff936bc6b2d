"""Device memory in the unit ``megatron.training.memory_allocated_gb`` really carries: GiB.

The metric keeps Megatron-LM's name (``_gb``) and its empty unit string for wire compatibility,
but its value is GiB (2^30 bytes): an 80 GiB card reads at most 80, never 85.9 "GB" (case A8).
It is the memory allocated now by PyTorch's caching allocator (``torch.cuda.memory_allocated``),
not the peak (``max_memory_allocated``) nor the reserved pool (``memory_reserved``).
"""

from __future__ import annotations

import sys
from typing import Any, Final

BYTES_PER_GIB: Final = 2**30


def bytes_to_gib(n_bytes: float) -> float:
    """``n_bytes`` in GiB (bytes / 2^30). Never raises for numbers."""
    return n_bytes / BYTES_PER_GIB


def memory_allocated_gib(device: Any = None, *, torch_module: Any = None) -> float | None:
    """Current allocated CUDA memory of ``device`` in GiB, or ``None`` without CUDA.

    Args:
        device: A CUDA device (index, string or ``torch.device``); ``None`` for the current one.
        torch_module: The ``torch`` module to ask (tests pass a stand-in); defaults to the
            imported ``torch``, which is not imported here if the caller has not.

    Returns:
        ``torch.cuda.memory_allocated(device) / 2**30``; ``None`` when torch is not imported or
        CUDA is unavailable. Reads an allocator counter: no device synchronisation. Never raises.
    """
    torch = torch_module if torch_module is not None else sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available():
            return None
        return bytes_to_gib(torch.cuda.memory_allocated(device))
    except Exception:
        return None
