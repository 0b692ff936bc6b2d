"""The tensor-metric interface: the public surface, sites and placements, layer labels."""

from __future__ import annotations

import math

import pytest
from support import import_or_unavailable

import_or_unavailable("torch")

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


def test_a_flat_shard_reads_its_range_of_a_whole_tensor_or_the_range_itself():
    """FlatShard(start, end) views [start, end) of the flattened tensor, takes a tensor of
    end - start elements as it is, and refuses anything else."""
    import torch

    from otel_training.tensor import FlatShard

    whole = torch.arange(12.0).reshape(3, 4)
    shard = FlatShard(5, 9)
    assert shard.local(whole).tolist() == [5.0, 6.0, 7.0, 8.0]
    assert shard.local(whole).data_ptr() == whole[1, 1].data_ptr()  # a view, not a copy
    assert shard.local(torch.ones(4)).tolist() == [1.0] * 4
    assert shard.local(torch.ones(6)) is None
    assert FlatShard(0, 0).local(whole).numel() == 0
    with pytest.raises(ValueError):
        FlatShard(3, 2)
    site = Site("w", SiteKind.GRAD, None, (("dp", FlatShard(0, 4)), ("pp", Owned(0))))
    assert site.reduce_axes == ("dp",) and site.flat_shard == FlatShard(0, 4)


def test_an_observer_reads_only_the_flat_shard_of_parameters_and_main_grads():
    """Without a process group a FlatShard site reports the norm of its range alone; the view
    of a persistent main_grad is built once and follows writes into the buffer."""
    import torch
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from torch import nn

    from otel_training.tensor import FlatShard, TensorObserver

    layer = nn.Linear(3, 4, bias=False)  # weight [4, 3]
    buffer = torch.arange(12.0)
    layer.weight.main_grad = buffer.view(4, 3)
    observer = TensorObserver(
        layer,
        "grad_norm:1,param_norm:1",
        meter=MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("flat"),
        placements_of=lambda name, param: {"dp": FlatShard(2, 7)},
    )
    store = observer.executor.published
    for scale in (1.0, 3.0):
        buffer.mul_(scale)
        observer.commit()
        (grad,) = [v for _, v in store.observe("megatron.training.tensor.grad_norm")]
        (weight,) = [v for _, v in store.observe("megatron.training.tensor.param_norm")]
        assert grad == pytest.approx(float(buffer[2:7].norm()))
        assert weight == pytest.approx(float(layer.weight.detach().reshape(-1)[2:7].norm()))
