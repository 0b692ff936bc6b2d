"""Norms of many tensors at once: one multi-tensor kernel (``torch._foreach_norm``) per run of one
device and dtype, fp32 results, no host read."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Sequence

import torch

__all__ = ["batched_norms", "norm_list"]

_IS_NONE = functools.partial(operator.is_, None)
_DTYPE = operator.attrgetter("dtype")


def batched_norms(tensors: Sequence[torch.Tensor | None], ord: float = 2.0) -> torch.Tensor:
    """Vector norms of many tensors with one multi-tensor kernel per (device, dtype).

    Args:
        tensors: The tensors; ``None`` and empty tensors give 0 (the norm of nothing; for
            ``ord=inf``, the largest absolute value of nothing, as abs values are >= 0).
        ord: 2 for the L2 norm, ``math.inf`` for the largest absolute value.

    Returns:
        ``norms[len(tensors)]`` fp32 on the device of the first tensor (empty when there is no
        tensor). Queues device work only: never reads a value. Never raises for the cases above.
    """
    found = norm_list(tensors, ord)
    if not found:
        return torch.zeros(len(tensors), dtype=torch.float32)
    try:
        return torch.stack(found)
    except RuntimeError:  # the fast path's norms lie on several devices
        return torch.stack(_grouped(tensors, ord))


def norm_list(
    tensors: Sequence[torch.Tensor | None], ord: float = 2.0, *, has_none: bool | None = None
) -> list[torch.Tensor]:
    """The norms of :func:`batched_norms` as a list of 0-d fp32 tensors, for callers that gather
    the norms of several metrics into one tensor themselves (one ``torch.stack`` per step).
    The norms of tensors on several devices may lie on their own devices; ``[]`` when every
    tensor is ``None``. ``has_none``: whether some tensor is ``None``, when the caller knows
    (``None``: look)."""
    n = len(tensors)
    if has_none is None:
        has_none = any(map(_IS_NONE, tensors))
    if n and not has_none:
        # Fast path: one multi-tensor call per run of one dtype, fp32 results. It raises for an
        # empty tensor with ord=inf; the grouped path below handles that.
        try:
            if not tensors[0].is_cuda:  # on CPU foreach loops over the tensors anyway
                return torch._foreach_norm(tensors, ord, dtype=torch.float32)
            dtypes = list(map(_DTYPE, tensors))
            if dtypes.count(dtypes[0]) == n:  # one fused kernel needs one dtype
                return _foreach_norm_fp32(tensors, dtypes[0], ord)
            norms: list[torch.Tensor] = []
            begin = 0
            for dtype, run in itertools.groupby(dtypes):  # callers order tensors by dtype
                end = begin + sum(1 for _ in run)
                norms += _foreach_norm_fp32(tensors[begin:end], dtype, ord)
                begin = end
            return norms
        except RuntimeError:
            pass
    return _grouped(tensors, ord)


def _grouped(tensors: Sequence[torch.Tensor | None], ord: float) -> list[torch.Tensor]:
    """One call per (device, dtype); ``None`` and (for ``ord=inf``) empty tensors give 0; every
    norm on the device of the first tensor."""
    first = next((t for t in tensors if t is not None), None)
    if first is None:
        return []
    device = first.device
    inf = ord == float("inf")
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        if t is not None and not (inf and t.numel() == 0):
            groups.setdefault((t.device, t.dtype), []).append(i)
    zero = torch.zeros((), dtype=torch.float32, device=device)
    rows: list[torch.Tensor] = [zero] * len(tensors)
    for (group_device, group_dtype), indices in groups.items():
        group = [tensors[i] for i in indices]
        for i, norm in zip(indices, _foreach_norm_fp32(group, group_dtype, ord)):
            rows[i] = norm if group_device == device else norm.to(device, non_blocking=True)
    return rows


def _foreach_norm_fp32(
    tensors: Sequence[torch.Tensor], dtype: torch.dtype, ord: float
) -> list[torch.Tensor]:
    """``torch._foreach_norm`` of tensors of one ``dtype``, accumulated and returned in fp32
    (float64 reduces natively, then narrows)."""
    if dtype.itemsize > 4:
        return [norm.float() for norm in torch._foreach_norm(tensors, ord)]
    return torch._foreach_norm(tensors, ord, dtype=torch.float32)
