"""Norms of many tensors at once: one multi-tensor kernel per run of one device and dtype."""

from __future__ import annotations

import math

import pytest
from support import import_or_unavailable

torch = import_or_unavailable("torch")

from otel_training.tensor.norms import batched_norms, norm_list  # noqa: E402


def test_batched_norms_match_torch_and_treat_none_and_empty_as_zero():
    """L2 and inf norms of mixed tensors; None and empty tensors give 0."""
    tensors = [torch.randn(3, 4), None, torch.zeros(0, 5), torch.randn(7, dtype=torch.float64)]
    l2 = batched_norms(tensors, 2.0)
    assert l2.dtype == torch.float32 and l2.shape == (4,)
    assert l2.tolist() == pytest.approx(
        [float(tensors[0].norm()), 0.0, 0.0, float(tensors[3].norm())], rel=1e-6
    )
    inf = batched_norms(tensors, math.inf)
    assert inf.tolist() == pytest.approx(
        [float(tensors[0].abs().max()), 0.0, 0.0, float(tensors[3].abs().max())], rel=1e-6
    )
    assert batched_norms([None, None]).tolist() == [0.0, 0.0]
    assert batched_norms([]).shape == (0,)


def test_norm_list_gives_one_fp32_norm_per_tensor_in_order():
    """The list form: 0-d fp32 norms in the order of the tensors, across dtypes; [] for only
    Nones; a caller that vouches for no None gets the same norms."""
    tensors = [torch.randn(5), torch.randn(2, 2, dtype=torch.bfloat16), torch.randn(3).double()]
    found = norm_list(tensors)
    assert [n.dtype for n in found] == [torch.float32] * 3 and all(n.dim() == 0 for n in found)
    expected = [float(t.double().norm()) for t in tensors]
    assert [float(n) for n in found] == pytest.approx(expected, rel=1e-2)
    assert [float(n) for n in norm_list(tensors, has_none=False)] == pytest.approx(
        expected, rel=1e-2
    )
    assert norm_list([None, None]) == []
    assert [float(n) for n in norm_list([None, tensors[0]])] == pytest.approx(
        [0.0, expected[0]], rel=1e-5
    )
