"""The tensor-metric interface: the public surface, sites and placements, layer labels."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import numpy as np  # noqa: E402

import otel_training.tensor as tensor  # noqa: E402
from otel_training.tensor import (  # noqa: E402
    GLOBAL,
    LabelPlan,
    Owned,
    Replicate,
    Shard,
    Site,
    SiteKind,
    layer_sort_key,
)


def test_every_public_name_is_importable_and_listed_once():
    """otel_training.tensor re-exports exactly its __all__, each name once."""
    assert len(tensor.__all__) == len(set(tensor.__all__))
    for name in tensor.__all__:
        assert getattr(tensor, name) is not None, name


def test_importing_the_package_does_not_import_torch():
    """The top-level facade stays free of torch; only otel_training.tensor needs it."""
    import subprocess
    import sys

    code = "import sys, otel_training; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_site_reduces_over_its_sharded_and_owned_axes_only():
    """Replicated axes need no reduction; shard and owned axes do, in sorted order."""
    site = Site(
        "decoder.layers.0.mlp.weight",
        SiteKind.GRAD,
        "decoder.layers.0",
        (("tp", Shard(1)), ("dp", Replicate()), ("ep", Owned(3))),
    )
    assert site.reduce_axes == ("ep", "tp")
    assert site.placement("dp") == Replicate() and site.placement("pp") == Replicate()
    assert site.placement("tp") == Shard(1)
    assert SiteKind.GRAD.at_commit and not SiteKind.ROUTER.at_commit


def test_sites_compare_by_identity():
    """Two sites with the same fields are different sites (each is made once)."""
    a = Site("x", SiteKind.GRAD)
    assert a != Site("x", SiteKind.GRAD) and a == a


def test_layer_labels_sort_by_number():
    """decoder.layers.2 sorts before decoder.layers.10."""
    labels = ["decoder.layers.10", "decoder.layers.2", "encoder.layers.1", "decoder.layers.0"]
    assert sorted(labels, key=layer_sort_key) == [
        "decoder.layers.0",
        "decoder.layers.2",
        "decoder.layers.10",
        "encoder.layers.1",
    ]


def test_label_plan_sums_and_maxima_per_layer_then_global():
    """Rows outside layers count toward global only."""
    sites = [
        Site("a", SiteKind.GRAD, "decoder.layers.1"),
        Site("b", SiteKind.GRAD, None),
        Site("c", SiteKind.GRAD, "decoder.layers.0"),
        Site("d", SiteKind.GRAD, "decoder.layers.1"),
    ]
    plan = LabelPlan(sites)
    assert plan.labels == ["decoder.layers.0", "decoder.layers.1"]
    assert [dict(a)["megatron.training.layer"] for a in plan.attributes][-1] == GLOBAL
    values = np.array([1.0, 10.0, 2.0, 3.0])
    assert plan.sums(values).tolist() == [2.0, 4.0, 16.0]
    assert plan.maxima(values).tolist() == [2.0, 3.0, 10.0]
    empty = LabelPlan([])
    assert empty.maxima(np.array([])).tolist() == [-math.inf]
