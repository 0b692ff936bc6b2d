"""Tensor metrics: per-layer gradient and parameter norms, activation statistics and MoE router
balance, reduced on the device in batched kernels and exposed as observable gauges.

Needs PyTorch (the ``torch`` extra). See ``docs/tensor-metrics.md``::

    from otel_training.tensor import TensorObserver

    observer = TensorObserver(model, "grad_norm:10,param_norm:10,router:10")
    ...
    observer.begin_step(step)   # before the step's first forward pass
    ...                         # forward/backward of every micro-batch
    observer.commit()           # before clipping and optimizer.step()

This package is in the instrumentation layer (``tests/test_import_layers.py``): it may import
the API (``otel_training.configuration``, ``spans``, ``phases``) and everything below it; never
the report or the tools.
"""

from otel_training.tensor.definitions import (
    BUILTIN_METRICS,
    DEFAULT_SCHEDULE,
    ROUTER_STATISTICS,
    L2NormMetric,
    MaxAbsMetric,
    NonFiniteCountMetric,
    RmsMetric,
    RouterMetric,
    UpdateRatioMetric,
    build_metric,
)
from otel_training.tensor.executor import (
    ExecutorStats,
    ProcessGroupAxes,
    PublishedValues,
    TensorMetricExecutor,
)
from otel_training.tensor.gauges import TENSOR_FAMILIES, TensorMetricGauges, ValueSource
from otel_training.tensor.metric import (
    GLOBAL,
    PIPELINE_AXIS,
    Axes,
    CollectiveRequest,
    FamilyValues,
    Final,
    FlatShard,
    LabelPlan,
    Owned,
    Placement,
    ReduceOpName,
    Replicate,
    Rows,
    Shard,
    ShardedReductionMetric,
    Site,
    SiteKind,
    Stage,
    TensorMetric,
    layer_attributes,
    layer_sort_key,
    to_device,
)
from otel_training.tensor.norms import batched_norms
from otel_training.tensor.observer import Schedule, TensorObserver, parse_schedule
from otel_training.tensor.sites import canonical_name, default_layer_of

__all__ = [
    "BUILTIN_METRICS",
    "DEFAULT_SCHEDULE",
    "GLOBAL",
    "PIPELINE_AXIS",
    "ROUTER_STATISTICS",
    "TENSOR_FAMILIES",
    "Axes",
    "CollectiveRequest",
    "ExecutorStats",
    "FamilyValues",
    "Final",
    "FlatShard",
    "L2NormMetric",
    "LabelPlan",
    "MaxAbsMetric",
    "NonFiniteCountMetric",
    "Owned",
    "Placement",
    "ProcessGroupAxes",
    "PublishedValues",
    "ReduceOpName",
    "Replicate",
    "RmsMetric",
    "RouterMetric",
    "Rows",
    "Schedule",
    "Shard",
    "ShardedReductionMetric",
    "Site",
    "SiteKind",
    "Stage",
    "TensorMetric",
    "TensorMetricExecutor",
    "TensorMetricGauges",
    "TensorObserver",
    "UpdateRatioMetric",
    "ValueSource",
    "batched_norms",
    "build_metric",
    "canonical_name",
    "default_layer_of",
    "layer_attributes",
    "layer_sort_key",
    "parse_schedule",
    "to_device",
]
