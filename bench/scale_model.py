"""The scale model: what otel-training sends at 8 to 16,384 ranks, and what must receive it.

For 8, 512, 4,096 and 16,384 ranks and each span preset it prints series, OTLP points/s,
Prometheus samples/s, spans/s and bytes/s per rank and in total; the largest run, job and step
trace of the trace shape (``otel_training.trace.shape``: the code's own derivation), beside one
trace for all ranks of a segment; how many gateways and what backend the job needs; what the
heartbeat and the exponential step histogram change.

Nothing here is a hand-typed count. The series of a rank are DERIVED from the semconv registry
(``otel_training.semconv``: each metric's instrument, attributes and their enum members, the
``replicated`` and ``heartbeat`` flags), the views (``otel_training.metrics.views``: buckets of each
histogram), the device metrics (``otel_training.metrics.device.DEVICE_METRICS``) and the tensor
metrics of the schedule (``otel_training.tensor.definitions``); spans per step from the span
groups of each preset (``config.SPAN_GROUP_PRESETS``, NVTX-only groups) and a rate rule per
span of the registry (:data:`SPAN_RATES`, which must cover every span: a test checks). Bytes are
those of OTLP protobuf requests built from the same structure and encoded here, gzip as gRPC
sends it. What is assumed (the workload: layout, layers, interval, step time, micro-batches) is
a :class:`Workload` field and printed; what is published (collector throughput, Mimir sizing,
Tempo's trace limit) is a :class:`Figure` with its source, printed under the tables.

``tests/test_scale_model.py`` holds the model to one real rank's export: data points exact,
bytes within 10 %. ``bench/prometheus_scale.py`` measures a real Prometheus.

Usage: python bench/scale_model.py [--interval S] [--step-time S] [--heartbeat S]
(make bench-scale); runs in a few seconds.
"""

from __future__ import annotations

import gzip
import math
import random
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import _verdict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.version import __version__ as SDK_VERSION

from otel_training import config
from otel_training.config.identity import RankIdentity
from otel_training.metrics import device as device_metrics
from otel_training.metrics import replicated, views
from otel_training.pipeline.resource import identity_attributes
from otel_training.semconv import attributes as attribute_names
from otel_training.semconv.attributes import ATTRIBUTES
from otel_training.semconv.metrics import MEGATRON_TRAINING_STEP_DURATION_MS, METRICS
from otel_training.semconv.spans import NVTX_ONLY_CANDIDATE_GROUPS, SPANS
from otel_training.trace import shape as trace_shape

# --- published figures -------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A number the model takes from a published document, with its source."""

    value: float
    unit: str
    source: str


SPANS_PER_CORE_SPLUNK = Figure(
    15_000,
    "spans/s per collector core",
    "Splunk OTel Collector, Sizing and scaling "
    "(docs.splunk.com/observability/gdi/opentelemetry/sizing.html)",
)
SPANS_PER_CORE_OTEL = Figure(
    10_000,
    "spans/s per collector core (recommended)",
    "opentelemetry-collector docs/performance.md (1 CPU / 2 GB: 10 K spans/s recommended)",
)
POINTS_PER_CORE_SPLUNK = Figure(
    20_000,
    "metric data points/s per collector core",
    "Splunk OTel Collector, Sizing and scaling (1 CPU: 20,000 data points/s; 1 CPU : 2 GB; "
    "gateways at least 1 core, N+1)",
)
MIMIR_SAMPLES_PER_DISTRIBUTOR_CORE = Figure(
    25_000,
    "samples/s per distributor core (and 1 GB)",
    "grafana/mimir docs/sources/mimir/manage/run-production-environment/planning-capacity.md",
)
MIMIR_SERIES_PER_INGESTER_CORE = Figure(
    300_000,
    "in-memory series per ingester core (and 2.5 GB, 5 GB disk)",
    "grafana/mimir planning-capacity.md (replication factor 3, +50 % headroom advised)",
)
PROMETHEUS_BYTES_PER_SAMPLE = Figure(
    1.3,
    "bytes per sample on disk",
    "prometheus.io/docs/prometheus/latest/storage (about 1-2 bytes per sample)",
)
TEMPO_MAX_BYTES_PER_TRACE = Figure(
    5_000_000,
    "bytes per trace (max_bytes_per_trace default)",
    "Grafana Tempo, ingestion limits (overrides: max_bytes_per_trace)",
)
FIGURES = (
    SPANS_PER_CORE_SPLUNK,
    SPANS_PER_CORE_OTEL,
    POINTS_PER_CORE_SPLUNK,
    MIMIR_SAMPLES_PER_DISTRIBUTOR_CORE,
    MIMIR_SERIES_PER_INGESTER_CORE,
    PROMETHEUS_BYTES_PER_SAMPLE,
    TEMPO_MAX_BYTES_PER_TRACE,
)
#: Gateways are sized 2 cores each, run at half their capacity, one spare (Splunk's N+1).
GATEWAY_CORES = 2
GATEWAY_UTILISATION = 0.5
MIMIR_REPLICATION = 3
#: The span budget of one trace (OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET's default).
SPAN_BUDGET = config.DEFAULT_TRACE_SPAN_BUDGET


# --- the workload ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What is assumed about a job (everything else is derived).

    Attributes:
        ranks: Processes of the job, one GPU each.
        tp, pp: Tensor- and pipeline-parallel sizes; dp = ranks / (tp * pp).
        layers: Transformer layers of the model, spread over the pipeline stages.
        ranks_per_node: Ranks that share a node's agent.
        export_interval_s: ``OTEL_METRIC_EXPORT_INTERVAL`` in seconds.
        step_time_s: Seconds per optimizer step.
        micro_batches: Micro-batches per step (pipeline schedule).
        tensor_metrics: Schedule names of the tensor observer (its default).
        moe_layers_per_rank: Mixture-of-experts layers per rank (router metrics); 0: dense.
        checkpoint_operations: Checkpoint operations a rank has done (their series exist).
        span_preset: ``OTEL_PYTHON_TRAINING_SPAN_GROUPS`` of the metrics' rank: a checkpoint's
            duration is recorded only from a recorded span (the registry's note).
        skipped: Whether an iteration has been skipped yet (the counter exists after one).
        checkpoint_every_steps, eval_every_steps, eval_steps, steps_per_attempt: How often the
            job-level spans occur.
        segment_iterations: ``OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS``, the most
            iterations of a segment; at the default budget every preset's segments are this
            long (``N = min(L, (B - 1) / 4)``; a test holds the model to it).
        replicated_policy: ``OTEL_PYTHON_TRAINING_EXPORT_REPLICATED``.
        exponential: ``OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM=exponential``.
        heartbeat_s: ``OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL`` in seconds, or None.
        step_spread: Relative spread of step times (for the exponential histogram's buckets).
        first_step_factor: How much longer the first step is than the others.
    """

    ranks: int
    tp: int = 8
    pp: int = 16
    layers: int = 126
    ranks_per_node: int = 8
    export_interval_s: float = 15.0
    step_time_s: float = 5.0
    micro_batches: int = 32
    tensor_metrics: tuple[str, ...] = ("grad_norm", "param_norm", "activation_rms", "router")
    moe_layers_per_rank: int = 0
    checkpoint_operations: tuple[str, ...] = ("save", "load")
    span_preset: str = "default"
    skipped: bool = False
    checkpoint_every_steps: int = 1000
    eval_every_steps: int = 1000
    eval_steps: int = 100
    steps_per_attempt: int = 100_000
    segment_iterations: int = config.DEFAULT_TRACE_SEGMENT_ITERATIONS
    replicated_policy: str = "auto"
    exponential: bool = False
    heartbeat_s: float | None = None
    step_spread: float = 0.03
    first_step_factor: float = 12.0

    @property
    def dp(self) -> int:
        return self.ranks // (self.tp * self.pp)

    @property
    def layers_per_rank(self) -> int:
        return math.ceil(self.layers / self.pp)

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / self.ranks_per_node)

    @property
    def replicated_exporters(self) -> int:
        """Ranks that export the replicated values (one per stage under pp_first)."""
        decision = replicated.decide(
            self.replicated_policy, self.ranks, {k: 0 for k in _LAYOUT_KEYS}
        )
        return self.pp if decision.policy == "pp_first" else self.ranks


_LAYOUT_KEYS = (
    attribute_names.DL_PIPELINE_PARALLEL_RANK,
    attribute_names.DL_TENSOR_PARALLEL_RANK,
    attribute_names.DL_DATA_PARALLEL_RANK,
)

#: The jobs of the table: a node, and jobs of 64, 512 and 2,048 nodes (TP 8, PP 16).
SCALES: tuple[Workload, ...] = (
    Workload(8, tp=8, pp=1, layers=32),
    Workload(512),
    Workload(4096),
    Workload(16384),
)


# --- the series of one rank --------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One metric of a rank as exported: its points' attribute sets and how it is stored.

    Attributes:
        name, unit, description: As the instrument is created.
        data: OTLP data kind: ``gauge``, ``sum``, ``histogram`` or ``exponential_histogram``.
        value_type: ``double`` or ``int``.
        points: One attribute mapping per data point (per series, for gauges and sums).
        bounds: Explicit bucket boundaries of a histogram.
        replicated, heartbeat: The registry's flags.
        monotonic: For sums.
    """

    name: str
    unit: str
    description: str
    data: str
    value_type: str
    points: tuple[Mapping[str, Any], ...]
    bounds: tuple[float, ...] = ()
    replicated: bool = False
    heartbeat: bool = False
    monotonic: bool = True

    @property
    def prometheus_series(self) -> int:
        """Series in Prometheus: one per point, an explicit histogram its buckets, _sum and
        _count (UnderscoreEscapingWithSuffixes), a native histogram one."""
        if self.data == "histogram":
            return len(self.points) * (len(self.bounds) + 3)
        return len(self.points)


#: Prometheus' unit words (UnderscoreEscapingWithSuffixes, the stack's translation strategy);
#: unit "1" is dropped by the collector's transform/unit_one, annotations in braces vanish.
PROMETHEUS_UNITS = {
    "ms": "milliseconds",
    "s": "seconds",
    "By": "bytes",
    "Hz": "hertz",
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
}


def _label(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def prometheus_samples(stream: Stream) -> list[tuple[str, dict[str, str]]]:
    """The series Prometheus stores for ``stream``: (name, point labels) each, named as the
    stack names them (dots to underscores, the unit word appended, ``_total`` on counters,
    ``_bucket``/``_sum``/``_count`` of an explicit histogram, one native histogram)."""
    base = _label(stream.name)
    unit = "".join(part for part in stream.unit.split("{") if "}" not in part)
    word = PROMETHEUS_UNITS.get(unit, "") if unit != "1" else ""
    if word and word not in base.split("_"):
        base += "_" + word
    samples = []
    for attributes in stream.points:
        labels = {_label(k): str(v) for k, v in attributes.items()}
        if stream.data == "histogram":
            for bound in (*stream.bounds, "+Inf"):
                # As Prometheus' OTLP translator writes a bound: shortest decimal, no exponent.
                le = bound if isinstance(bound, str) else f"{bound:f}".rstrip("0").rstrip(".")
                samples.append((f"{base}_bucket", {**labels, "le": le}))
            samples.extend([(f"{base}_sum", labels), (f"{base}_count", labels)])
        elif stream.data == "sum" and stream.monotonic:
            samples.append((f"{base}_total", labels))
        else:
            samples.append((base, labels))
    return samples


def _layer_labels(count: int) -> list[str]:
    return [f"decoder.layers.{i}" for i in range(count)] + ["global"]


def _attribute_values(key: str, w: Workload, metric: str = "") -> list[Any]:
    """The values attribute ``key`` of ``metric`` takes on one rank: an enum's members
    (registry), a layer per layer of the rank and ``global``, one GPU."""
    spec = ATTRIBUTES.get(key)
    if key == attribute_names.MEGATRON_TRAINING_LAYER:
        return _layer_labels(w.layers_per_rank)
    if key == attribute_names.MEGATRON_CHECKPOINT_OPERATION:
        done = [op for op in spec.members if op in w.checkpoint_operations]
        if metric == "megatron.checkpoint.duration":  # from recorded checkpoint spans only
            groups = config.SPAN_GROUP_PRESETS[w.span_preset]
            done = [op for op in done if SPANS[f"megatron.checkpoint.{op}"].group in groups]
        return done
    if key == "hw.id":
        return ["GPU-5f3a2c1e-9b7d-4e8f-a1b2-c3d4e5f60718"]
    if key == attribute_names.MEGATRON_TRAINING_METRIC:
        return []  # non-finite values: none in a healthy run
    if key == attribute_names.MEGATRON_TRAINING_ROUTER_EXPERT:
        return []  # opt-in (router_expert_load)
    if spec is not None and spec.members:
        return list(spec.members)
    raise ValueError(f"the model does not know the values of attribute {key!r}")


def _tensor_families(w: Workload) -> set[str]:
    """The families the tensor observer's schedule publishes (its definitions say which)."""
    from otel_training.tensor.definitions import build_metric  # imports torch: only here

    return {family for name in w.tensor_metrics for family in build_metric(name).families}


def _attribute_sets(name: str, w: Workload) -> list[dict[str, Any]]:
    """Every attribute set of registry metric ``name`` on one rank: the product of its
    attributes' values, with the presence rules of the registry notes."""
    spec = METRICS[name]
    sets: list[dict[str, Any]] = [{}]
    for key in spec.attributes:
        values = _attribute_values(key, w, name)
        if name.startswith("megatron.training.tensor.router"):
            layers = _layer_labels(w.moe_layers_per_rank)[:-1] if w.moe_layers_per_rank else []
            values = layers if key == attribute_names.MEGATRON_TRAINING_LAYER else values
        sets = [{**s, key: v} for s in sets for v in values]
    return sets


def rank_streams(w: Workload, *, exports_replicated: bool = True) -> list[Stream]:
    """The metrics one rank exports, with their points. Derived from the registry, the views,
    the device metrics and the tensor schedule; ``exports_replicated`` False drops the
    replicated metrics (a silent rank under pp_first)."""
    tensor = _tensor_families(w)
    streams = []
    for name, spec in METRICS.items():
        if name in device_metrics.DEVICE_METRICS:
            continue  # with the other device metrics, below
        if name.startswith("megatron.training.tensor.") and name not in tensor:
            continue
        if name == "megatron.training.skipped_iters" and not w.skipped:
            continue  # added only when > 0
        if spec.replicated and not exports_replicated:
            continue
        points = _attribute_sets(name, w)
        if not points:
            continue
        data = {"gauge": "gauge", "counter": "sum", "updowncounter": "sum"}.get(spec.instrument)
        bounds: tuple[float, ...] = ()
        if spec.instrument == "histogram":
            data, bounds = _histogram_shape(name, w)
        streams.append(
            Stream(
                name=name,
                unit=spec.unit,
                description=spec.description,
                data=data,
                value_type=spec.value_type,
                points=tuple(points),
                bounds=bounds,
                replicated=spec.replicated,
                heartbeat=spec.heartbeat,
                monotonic=spec.instrument == "counter",
            )
        )
    streams.extend(_device_streams(w))
    return streams


def _histogram_shape(name: str, w: Workload) -> tuple[str, tuple[float, ...]]:
    """The OTLP kind and explicit bounds of a histogram, from the default views."""
    if name == MEGATRON_TRAINING_STEP_DURATION_MS:
        if w.exponential:
            return "exponential_histogram", ()
        return "histogram", tuple(float(b) for b in views.STEP_DURATION_BUCKETS_MS)
    for view in views.default_views():
        if getattr(view, "_instrument_name", None) == name:
            return "histogram", tuple(view._aggregation._boundaries)
    raise ValueError(f"no view gives {name} its buckets")


def _device_streams(w: Workload) -> list[Stream]:
    """The device metrics of one GPU (OpenTelemetry's hw.* and the registry's clock speed),
    from otel_training.metrics.device: one series each, the clock one per domain."""
    gpu = _attribute_values("hw.id", w)[0]
    base = {
        "hw.id": gpu,
        "hw.type": "gpu",
        "hw.name": "NVIDIA H100 80GB HBM3",
        "hw.vendor": "NVIDIA",
    }
    streams = []
    for name in device_metrics.DEVICE_METRICS:
        kind, unit, description = device_metrics._INSTRUMENTS[name]
        if name in METRICS:  # dl.gpu.clock.speed: its attributes are the registry's
            points = _attribute_sets(name, w)
        elif name == "hw.temperature":
            points = [
                {
                    "hw.id": f"{gpu}/temperature",
                    "hw.type": "temperature",
                    "hw.parent": gpu,
                    "hw.sensor_location": "gpu",
                    "hw.name": "NVIDIA H100 80GB HBM3 die",
                }
            ]
        elif name == "hw.gpu.utilization":
            points = [{**base, "hw.gpu.task": "general"}]
        else:
            points = [base]
        data = "gauge" if "gauge" in kind else "sum"
        streams.append(
            Stream(
                name=name,
                unit=unit,
                description=description,
                data=data,
                value_type="double" if data == "gauge" else "int",
                points=tuple(points),
                monotonic="up_down" not in kind,
            )
        )
    return streams


# --- encoding ------------------------------------------------------------------------------------


def _any(value: Any) -> common_pb2.AnyValue:
    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    return common_pb2.AnyValue(string_value=str(value))


def _key_values(attributes: Mapping[str, Any]) -> list[common_pb2.KeyValue]:
    return [common_pb2.KeyValue(key=k, value=_any(v)) for k, v in attributes.items()]


def rank_resource(w: Workload, rank: int) -> dict[str, Any]:
    """The Resource of rank ``rank``, built by otel_training.pipeline.resource as a run builds it,
    with the parallel layout the training code adds and a node name of a cluster."""
    identity = RankIdentity(
        rank=rank,
        local_rank=rank % w.ranks_per_node,
        world_size=w.ranks,
        local_world_size=w.ranks_per_node,
        node_rank=rank // w.ranks_per_node,
        launcher="torchrun",
        job_id="4242917",
        run_id="9f1c2e7a4b3d4f2a8e6b0c1d2e3f4a5b",
        attempt=0,
    )
    attributes: dict[str, Any] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": SDK_VERSION,
        "service.name": "llama3-405b-pretrain",
        **identity_attributes(identity),
        "host.name": f"gpu-node-{rank // w.ranks_per_node:04d}",
    }
    tp, rest = rank % w.tp, rank // w.tp
    attributes[attribute_names.DL_TENSOR_PARALLEL_RANK] = tp
    attributes[attribute_names.DL_DATA_PARALLEL_RANK] = rest % w.dp if w.dp else 0
    attributes[attribute_names.DL_PIPELINE_PARALLEL_RANK] = rest // max(w.dp, 1)
    return attributes


_NOW_NS = 1_796_000_000_000_000_000
_START_NS = _NOW_NS - 3_600_000_000_000


def _number_point(stream: Stream, attributes: Mapping[str, Any], rng: random.Random):
    """A gauge or sum point with a value of a run: an iteration number, or a double whose
    bits are as random as a loss or a norm (they do not compress)."""
    point = metrics_pb2.NumberDataPoint(attributes=_key_values(attributes), time_unix_nano=_NOW_NS)
    if stream.data == "sum":
        point.start_time_unix_nano = _START_NS
    if stream.value_type == "int":
        point.as_int = rng.randrange(1, 500_000)
    else:
        point.as_double = rng.uniform(0.0, 10.0)
    return point


@cache
def exponential_step_point(w: Workload) -> metrics_pb2.ExponentialHistogramDataPoint:
    """The step histogram as the SDK's exponential aggregation (the view of
    OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM=exponential) makes it of a run's step times:
    one first step ``first_step_factor`` long, the rest spread by ``step_spread``."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], views=[views.step_duration_view(exponential=True)]
    )
    histogram = provider.get_meter("model").create_histogram(MEGATRON_TRAINING_STEP_DURATION_MS)
    rng = random.Random(4096)
    step_ms = w.step_time_s * 1000
    histogram.record(step_ms * w.first_step_factor)
    for _ in range(999):
        histogram.record(rng.lognormvariate(math.log(step_ms), w.step_spread))
    (point,) = (
        reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    )
    provider.shutdown()
    return metrics_pb2.ExponentialHistogramDataPoint(
        start_time_unix_nano=_START_NS,
        time_unix_nano=_NOW_NS,
        count=point.count,
        sum=point.sum,
        scale=point.scale,
        zero_count=point.zero_count,
        positive=metrics_pb2.ExponentialHistogramDataPoint.Buckets(
            offset=point.positive.offset, bucket_counts=list(point.positive.bucket_counts)
        ),
        min=point.min,
        max=point.max,
    )


def _metric(stream: Stream, w: Workload, rng: random.Random) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=stream.name, unit=stream.unit, description=stream.description)
    cumulative = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    if stream.data == "gauge":
        metric.gauge.data_points.extend(_number_point(stream, a, rng) for a in stream.points)
    elif stream.data == "sum":
        metric.sum.aggregation_temporality = cumulative
        metric.sum.is_monotonic = stream.monotonic
        metric.sum.data_points.extend(_number_point(stream, a, rng) for a in stream.points)
    elif stream.data == "histogram":
        metric.histogram.aggregation_temporality = cumulative
        for attributes in stream.points:
            counts = [0] * (len(stream.bounds) + 1)
            counts[len(counts) // 2] = 997
            metric.histogram.data_points.append(
                metrics_pb2.HistogramDataPoint(
                    attributes=_key_values(attributes),
                    start_time_unix_nano=_START_NS,
                    time_unix_nano=_NOW_NS,
                    count=997,
                    sum=rng.uniform(4e6, 6e6),
                    bucket_counts=counts,
                    explicit_bounds=list(stream.bounds),
                    min=4_700.25,
                    max=60_000.5,
                )
            )
    else:
        metric.exponential_histogram.aggregation_temporality = cumulative
        for attributes in stream.points:
            point = metrics_pb2.ExponentialHistogramDataPoint()
            point.CopyFrom(exponential_step_point(w))
            point.attributes.extend(_key_values(attributes))
            metric.exponential_histogram.data_points.append(point)
    return metric


def metrics_request(w: Workload, ranks: Iterable[int], *, exports_replicated: bool = True):
    """The OTLP request of ``ranks``' exports together (one resource each), as a rank or an
    agent's batch sends it."""
    streams = rank_streams(w, exports_replicated=exports_replicated)
    rng = random.Random(29)
    request = ExportMetricsServiceRequest()
    for rank in ranks:
        resource_metrics = request.resource_metrics.add()
        resource_metrics.resource.CopyFrom(
            resource_pb2.Resource(attributes=_key_values(rank_resource(w, rank)))
        )
        scope = resource_metrics.scope_metrics.add()
        scope.scope.name = "otel_training"
        scope.metrics.extend(_metric(s, w, rng) for s in streams)
    return request


def gzip_bytes(payload: bytes) -> int:
    """Bytes of ``payload`` gzip-compressed as gRPC's gzip does (level 6)."""
    return len(gzip.compress(payload, compresslevel=6, mtime=0))


# --- spans ---------------------------------------------------------------------------------------


def _per_step(value: float):
    return lambda w: value


#: Spans per optimizer step per rank of every span of the registry, in workload terms. A span
#: that runs once per attempt, checkpoint or evaluation counts as its share of a step.
SPAN_RATES: Mapping[str, Any] = {
    "megatron.train": lambda w: 1 / w.steps_per_attempt,
    "megatron.startup": lambda w: 1 / w.steps_per_attempt,
    "megatron.startup.model_init": lambda w: 1 / w.steps_per_attempt,
    "megatron.startup.dataloader": lambda w: 1 / w.steps_per_attempt,
    "megatron.train.first_iteration": lambda w: 1 / w.steps_per_attempt,
    "megatron.train.segment": lambda w: 1 / w.segment_iterations,
    "megatron.train.iteration": _per_step(1),
    "megatron.train.iteration.data_loading": _per_step(1),
    "megatron.train.iteration.forward_backward": _per_step(1),
    "megatron.train.iteration.optimizer": _per_step(1),
    "megatron.microbatch.forward": lambda w: w.micro_batches,
    "megatron.microbatch.backward": lambda w: w.micro_batches,
    # Layer spans wrap the forward functions: once per layer and micro-batch (no recompute).
    "megatron.layer.forward": lambda w: w.layers_per_rank * w.micro_batches,
    "megatron.layer.self_attention": lambda w: w.layers_per_rank * w.micro_batches,
    "megatron.layer.mlp": lambda w: w.layers_per_rank * w.micro_batches,
    # 1F1B: each micro-batch is received and sent forward and backward once (no pipeline: none).
    "megatron.p2p.send_forward": lambda w: w.micro_batches if w.pp > 1 else 0,
    "megatron.p2p.recv_forward": lambda w: w.micro_batches if w.pp > 1 else 0,
    "megatron.p2p.send_backward": lambda w: w.micro_batches if w.pp > 1 else 0,
    "megatron.p2p.recv_backward": lambda w: w.micro_batches if w.pp > 1 else 0,
    "megatron.grad_sync.start": _per_step(1),
    "megatron.grad_sync.finish": _per_step(1),
    "megatron.activation.offload": _per_step(0),  # off unless the model offloads activations
    "megatron.activation.reload": _per_step(0),
    "megatron.checkpoint.save": lambda w: 1 / w.checkpoint_every_steps,
    "megatron.checkpoint.save.state_dict": lambda w: 1 / w.checkpoint_every_steps,
    "megatron.checkpoint.save.io_write": lambda w: 1 / w.checkpoint_every_steps,
    "megatron.checkpoint.save.finalize": lambda w: 1 / w.checkpoint_every_steps,
    "megatron.checkpoint.load": lambda w: 1 / w.steps_per_attempt,
    "megatron.checkpoint.load.io_read": lambda w: 1 / w.steps_per_attempt,
    "megatron.evaluate": lambda w: 1 / w.eval_every_steps,
    "megatron.evaluate.step": lambda w: w.eval_steps / w.eval_every_steps,
}
#: The spans of a segment's job trace (each rank's segment span, saves and evaluations) and of
#: the run trace: the code's own tables; everything else goes to the rank's step traces.
JOB_LEVEL = trace_shape.JOB_LEVEL_SPANS
RUN_LEVEL = trace_shape.ONCE_PER_RUN

#: The presets of the table: OTEL_PYTHON_TRAINING_SPAN_GROUPS, and whether the fine groups are
#: NVTX-only (OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS=fine).
PRESETS: tuple[tuple[str, str, bool], ...] = (
    ("default", "default", False),
    ("per_step, fine NVTX-only", "per_step", True),
    ("per_step", "per_step", False),
    ("all, fine NVTX-only", "all", True),
    ("all", "all", False),
)


def span_groups(preset: str, fine_nvtx_only: bool) -> frozenset[str]:
    """The groups that record spans under a preset (NVTX-only groups make NVTX ranges)."""
    groups = config.SPAN_GROUP_PRESETS[preset]
    return groups - NVTX_ONLY_CANDIDATE_GROUPS if fine_nvtx_only else groups


def spans_per_step(w: Workload, preset: str, fine_nvtx_only: bool) -> dict[str, float]:
    """OpenTelemetry spans per step of one rank, by name, under a preset (NVTX-only groups
    make NVTX ranges, no span)."""
    groups = span_groups(preset, fine_nvtx_only)
    return {
        name: SPAN_RATES[name](w)
        for name, spec in SPANS.items()
        if spec.group in groups and SPAN_RATES[name](w) > 0
    }


#: Span attributes set only when something happens (a skip, a failed update, a measured size,
#: an error, a truncation at shutdown): left out of the model's spans.
_EVENT_ATTRIBUTES = frozenset(
    {
        "megatron.skipped",
        "megatron.update_successful",
        "megatron.checkpoint.size",
        "error.type",
        "otel_training.span.truncated",
    }
)


def _span(name: str, index: int, rng: random.Random) -> trace_pb2.Span:
    """A span as the SDK exports it: ids, parent, times, kind, and the registry's attributes
    that the phase API sets from its arguments (sample values; not the event ones)."""
    spec = SPANS[name]
    attributes: dict[str, Any] = {}
    for key in spec.attributes:
        attribute = ATTRIBUTES.get(key)
        if key in _EVENT_ATTRIBUTES or attribute is None:
            continue
        if attribute.members:
            attributes[key] = attribute.members[0]
        elif key == "num_microbatches":
            attributes[key] = 32
        elif attribute.type == "int":
            attributes[key] = 123_456
        elif attribute.type == "boolean":
            attributes[key] = True
        elif key == attribute_names.MEGATRON_CHECKPOINT_PATH:
            attributes[key] = "/lustre/checkpoints/llama3-405b/iter_0123000"
        else:
            attributes[key] = "x" * 16
    start = _NOW_NS - 5_000_000_000 + index * 1000
    return trace_pb2.Span(
        trace_id=rng.randbytes(16),
        span_id=rng.randbytes(8),
        parent_span_id=rng.randbytes(8),
        name=name,
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=start,
        end_time_unix_nano=start + 4_321_987,
        attributes=_key_values(attributes),
        flags=0x100,
    )


def spans_request(w: Workload, mix: Mapping[str, float], count: int, ranks: Iterable[int]):
    """A request of ``count`` spans per rank drawn in proportion to ``mix`` (spans per step by
    name), one resource per rank."""
    total = sum(mix.values())
    rng = random.Random(17)
    request = ExportTraceServiceRequest()
    for rank in ranks:
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(
            resource_pb2.Resource(attributes=_key_values(rank_resource(w, rank)))
        )
        scope = resource_spans.scope_spans.add()
        scope.scope.name = "otel_training"
        index = 0
        for name, rate in mix.items():
            for _ in range(max(1, round(count * rate / total))):
                scope.spans.append(_span(name, index, rng))
                index += 1
    return request


# --- the job -------------------------------------------------------------------------------------


@dataclass
class MetricsLoad:
    """The metrics of a job at one export interval."""

    workload: Workload
    points_per_rank: int
    points_per_silent_rank: int
    series_per_rank: int  # Prometheus, target_info included
    series_per_silent_rank: int
    replicated_series_per_rank: int
    exporters_of_replicated: int
    bytes_per_rank: int
    gzip_bytes_per_rank: float
    bytes_per_silent_rank: int
    gzip_bytes_per_silent_rank: float
    heartbeat_points_per_rank: int
    heartbeat_bytes_per_rank: int
    heartbeat_gzip_bytes_per_rank: float

    @property
    def series(self) -> int:
        w = self.workload
        silent = w.ranks - self.exporters_of_replicated
        return self.exporters_of_replicated * self.series_per_rank + silent * (
            self.series_per_silent_rank
        )

    def _per_export(self, loud: float, quiet: float) -> float:
        silent = self.workload.ranks - self.exporters_of_replicated
        return self.exporters_of_replicated * loud + silent * quiet

    @property
    def points_per_s(self) -> float:
        """OTLP data points per second into the gateways (heartbeat included)."""
        w = self.workload
        base = self._per_export(self.points_per_rank, self.points_per_silent_rank)
        return base / w.export_interval_s + self._heartbeat_extra(self.heartbeat_points_per_rank)

    @property
    def samples_per_s(self) -> float:
        """Samples per second into Prometheus: each series once per export (target_info is
        written once per export too), the heartbeat's series once per heartbeat."""
        w = self.workload
        return self.series / w.export_interval_s + self._heartbeat_extra(
            self.heartbeat_points_per_rank
        )

    @property
    def bytes_per_s(self) -> float:
        w = self.workload
        base = self._per_export(self.bytes_per_rank, self.bytes_per_silent_rank)
        return base / w.export_interval_s + self._heartbeat_extra(self.heartbeat_bytes_per_rank)

    @property
    def gzip_bytes_per_s(self) -> float:
        w = self.workload
        base = self._per_export(self.gzip_bytes_per_rank, self.gzip_bytes_per_silent_rank)
        return base / w.export_interval_s + self._heartbeat_extra(
            self.heartbeat_gzip_bytes_per_rank
        )

    def _heartbeat_extra(self, per_beat: float) -> float:
        """What the heartbeat adds per second over all ranks: its own exports, less the hang
        signals' share of the main ones (its requests carry a Resource of their own)."""
        w = self.workload
        if w.heartbeat_s is None:
            return 0.0
        return w.ranks * per_beat * (1 / w.heartbeat_s - 1 / w.export_interval_s)


def metrics_load(w: Workload) -> MetricsLoad:
    """The metrics of job ``w``, derived (see the module docstring)."""
    loud = rank_streams(w, exports_replicated=True)
    quiet = rank_streams(w, exports_replicated=False)
    node = range(min(w.ranks_per_node, w.ranks))
    loud_request = metrics_request(w, node, exports_replicated=True)
    quiet_request = metrics_request(w, node, exports_replicated=False)
    beat = [s for s in loud if s.heartbeat]
    rng = random.Random(31)
    beat_request = ExportMetricsServiceRequest()
    for rank in node:
        resource_metrics = beat_request.resource_metrics.add()
        resource_metrics.resource.CopyFrom(
            resource_pb2.Resource(attributes=_key_values(rank_resource(w, rank)))
        )
        scope = resource_metrics.scope_metrics.add()
        scope.scope.name = "otel_training"
        scope.metrics.extend(_metric(s, w, rng) for s in beat)
    n = len(node)
    one = metrics_request(w, [0]).ByteSize()
    one_quiet = metrics_request(w, [0], exports_replicated=False).ByteSize()
    return MetricsLoad(
        workload=w,
        points_per_rank=sum(len(s.points) for s in loud),
        points_per_silent_rank=sum(len(s.points) for s in quiet),
        series_per_rank=sum(s.prometheus_series for s in loud) + 1,
        series_per_silent_rank=sum(s.prometheus_series for s in quiet) + 1,
        replicated_series_per_rank=sum(s.prometheus_series for s in loud if s.replicated),
        exporters_of_replicated=w.replicated_exporters,
        bytes_per_rank=one,
        gzip_bytes_per_rank=gzip_bytes(loud_request.SerializeToString()) / n,
        bytes_per_silent_rank=one_quiet,
        gzip_bytes_per_silent_rank=gzip_bytes(quiet_request.SerializeToString()) / n,
        heartbeat_points_per_rank=sum(len(s.points) for s in beat),
        heartbeat_bytes_per_rank=beat_request.ByteSize() // n,
        heartbeat_gzip_bytes_per_rank=gzip_bytes(beat_request.SerializeToString()) / n,
    )


@dataclass
class SpansLoad:
    """The spans of a job under one preset, and the traces they make (the trace shape of
    ``otel_training.trace.shape`` for the preset's groups, the job's world size and the
    default budget)."""

    workload: Workload
    preset: str
    per_step: dict[str, float] = field(default_factory=dict)
    bytes_per_span: float = 0.0
    gzip_bytes_per_span: float = 0.0
    groups: frozenset[str] = frozenset()

    @property
    def spans_per_step_per_rank(self) -> float:
        return sum(self.per_step.values())

    @property
    def spans_per_s(self) -> float:
        w = self.workload
        return w.ranks * self.spans_per_step_per_rank / w.step_time_s

    @property
    def single_trace_spans(self) -> float:
        """Spans of a segment if all ranks shared one trace (the shape before issue 17): every
        rank's spans of N iterations."""
        w = self.workload
        return w.ranks * self.spans_per_step_per_rank * w.segment_iterations

    @property
    def shape(self) -> trace_shape.TraceShape:
        """The code's derivation for this preset and job."""
        w = self.workload
        return trace_shape.TraceShape.derive(
            self.groups, w.ranks, SPAN_BUDGET, w.segment_iterations
        )

    def _per_segment(self, names: frozenset[str] | None) -> float:
        """Spans of a rank per segment among ``names`` (``None``: the step traces' names)."""
        iterations = self.shape.segment_iterations
        return iterations * sum(
            rate
            for name, rate in self.per_step.items()
            if (name in names if names is not None else name not in JOB_LEVEL | RUN_LEVEL)
        )

    @property
    def job_spans_per_rank(self) -> float:
        """Job-level spans a rank makes per segment: its segment span, saves and evaluations."""
        return self._per_segment(JOB_LEVEL)

    @property
    def run_spans_per_rank(self) -> float:
        """Run-level spans a rank makes per attempt."""
        w = self.workload
        return w.steps_per_attempt * sum(r for n, r in self.per_step.items() if n in RUN_LEVEL)

    @property
    def job_trace_spans(self) -> float:
        """Spans of the largest job trace: a shard's ranks, each up to its share."""
        shape = self.shape
        share = shape.job.allowance(shape.budget)
        return shape.job.ranks * min(share, self.job_spans_per_rank)

    @property
    def run_trace_spans(self) -> float:
        """Spans of the largest run trace: a shard's ranks, each up to its share."""
        shape = self.shape
        share = shape.run.allowance(shape.budget)
        return shape.run.ranks * min(share, self.run_spans_per_rank)

    @property
    def step_spans_per_segment(self) -> float:
        """Spans of one rank's step traces per segment: its iterations and their phases, and
        the job-level spans its share of the job trace had no room for."""
        shape = self.shape
        overflow = max(0.0, self.job_spans_per_rank - shape.job.allowance(shape.budget))
        return self._per_segment(None) + overflow

    @property
    def step_trace_spans(self) -> float:
        """Spans of the largest step trace: a rank's segment, at most the budget (a rank starts
        its next step trace when one is full)."""
        return min(self.shape.budget, self.step_spans_per_segment)

    @property
    def largest_trace_spans(self) -> float:
        return max(self.job_trace_spans, self.run_trace_spans, self.step_trace_spans)


def spans_load(w: Workload, label: str, preset: str, fine_nvtx_only: bool) -> SpansLoad:
    """The spans of job ``w`` under ``preset``; bytes from encoded requests of 512 spans per
    rank (one batch of the SDK), gzip over a node's agent batch."""
    load = SpansLoad(
        w,
        label,
        spans_per_step(w, preset, fine_nvtx_only),
        groups=span_groups(preset, fine_nvtx_only),
    )
    if load.per_step:
        one = spans_request(w, load.per_step, 512, [0])
        spans = sum(len(ss.spans) for rs in one.resource_spans for ss in rs.scope_spans)
        load.bytes_per_span = one.ByteSize() / spans
        node = spans_request(w, load.per_step, 512, range(min(w.ranks_per_node, w.ranks)))
        node_spans = sum(len(ss.spans) for rs in node.resource_spans for ss in rs.scope_spans)
        load.gzip_bytes_per_span = gzip_bytes(node.SerializeToString()) / node_spans
    return load


def gateways(spans_per_s: float, points_per_s: float, spans_per_core: Figure) -> int:
    """Gateways of GATEWAY_CORES cores at GATEWAY_UTILISATION, plus one:
    N = ceil((spans/s / C_s + points/s / C_p) / (cores x utilisation)) + 1."""
    cores = spans_per_s / spans_per_core.value + points_per_s / POINTS_PER_CORE_SPLUNK.value
    return math.ceil(cores / (GATEWAY_CORES * GATEWAY_UTILISATION)) + 1


def measured_step_histograms(w: Workload, steps: int = 1000) -> dict[str, dict[str, Any]]:
    """The step histogram of a real export, explicit and exponential: ``steps`` step times of
    ``w`` recorded through ``configure()`` with the embedded default, read back from its file.
    Per kind: the metric's OTLP bytes, the whole request's, its bucket count and the series
    Prometheus stores of it (the stack's translation: buckets + _sum + _count, or one native
    histogram)."""
    import tempfile
    from pathlib import Path

    import otel_training
    from otel_training.testing import parse_otlp_json

    found: dict[str, dict[str, Any]] = {}
    for kind in config.STEP_DURATION_HISTOGRAMS:
        with tempfile.TemporaryDirectory() as directory:
            telemetry = otel_training.configure(
                environ={
                    "OTEL_PYTHON_TRAINING_OUTPUT_DIR": directory,
                    "OTEL_PYTHON_TRAINING_RUN_ID": "step-histogram",
                    "OTEL_PYTHON_TRAINING_STEP_DURATION_HISTOGRAM": kind,
                    "OTEL_TRACES_EXPORTER": "none",
                    "OTEL_LOGS_EXPORTER": "none",
                    "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
                },
                set_global=False,
            )
            rng = random.Random(4096)
            step_ms = w.step_time_s * 1000
            times = [step_ms * w.first_step_factor] + [
                rng.lognormvariate(math.log(step_ms), w.step_spread) for _ in range(steps - 1)
            ]
            for value in times:
                otel_training.record_training_metrics(telemetry.meter, step_duration_ms=value)
            telemetry.shutdown()
            (path,) = Path(directory).glob("step-histogram/metrics-rank*.jsonl")
            last = [line for line in path.read_text().splitlines() if line.strip()][-1]
        request = parse_otlp_json(last, ExportMetricsServiceRequest())
        (metric,) = [
            m
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == MEGATRON_TRAINING_STEP_DURATION_MS
        ]
        (point,) = getattr(metric, metric.WhichOneof("data")).data_points
        if kind == "exponential":
            buckets, series = len(point.positive.bucket_counts), 1
        else:
            buckets, series = len(point.bucket_counts), len(point.bucket_counts) + 2
        found[kind] = {
            "metric bytes": metric.ByteSize(),
            "request bytes": request.ByteSize(),
            "buckets": buckets,
            "series": series,
            "scale": getattr(point, "scale", None),
        }
    return found


# --- output ------------------------------------------------------------------------------------


def _si(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, rule, *body])


def report(scales: Iterable[Workload]) -> str:
    """Every table of the model for ``scales``, with the assumptions and sources."""
    scales = list(scales)
    out = []
    w0 = scales[-1]
    out.append(
        f"Workload: export interval {w0.export_interval_s:g} s, step {w0.step_time_s:g} s, "
        f"{w0.micro_batches} micro-batches, {w0.ranks_per_node} ranks (GPUs) per node, tensor "
        f"metrics {','.join(w0.tensor_metrics)} (dense model), checkpoints saved and loaded; "
        f"layouts: "
        + "; ".join(f"{w.ranks}: TP {w.tp} PP {w.pp} DP {w.dp}, {w.layers} layers" for w in scales)
    )
    out.append("\n## Metrics per rank (derived from the registry, the views and the schedule)\n")
    rows = []
    for w in scales:
        m = metrics_load(w)
        rows.append(
            [
                f"{w.ranks:,}",
                str(m.points_per_rank),
                str(m.series_per_rank),
                str(m.replicated_series_per_rank),
                f"{m.points_per_rank / w.export_interval_s:.2f}",
                f"{m.bytes_per_rank / w.export_interval_s:,.0f}",
                f"{m.gzip_bytes_per_rank / w.export_interval_s:,.0f}",
                f"{m.bytes_per_rank / m.points_per_rank:.0f}",
            ]
        )
    out.append(
        _table(
            [
                "ranks",
                "OTLP points/export",
                "Prometheus series",
                "of them replicated",
                "points/s",
                "B/s raw",
                "B/s gzip",
                "B/point",
            ],
            rows,
        )
    )
    out.append("\n## Metrics of the job\n")
    rows = []
    for w in scales:
        for policy in ("all", "auto"):
            m = metrics_load(replace(w, replicated_policy=policy))
            effective = "all" if m.exporters_of_replicated == w.ranks else "pp_first"
            rows.append(
                [
                    f"{w.ranks:,}",
                    f"{policy} ({effective})",
                    f"{m.series:,}",
                    _si(m.points_per_s),
                    _si(m.samples_per_s),
                    _si(m.bytes_per_s, "B/s"),
                    _si(m.gzip_bytes_per_s, "B/s"),
                ]
            )
    out.append(
        _table(
            [
                "ranks",
                "EXPORT_REPLICATED",
                "active series",
                "OTLP points/s",
                "samples/s",
                "into gateways raw",
                "gzip",
            ],
            rows,
        )
    )
    out.append("\n## Spans (derived from the span groups of each preset)\n")
    rows = []
    for w in scales:
        metrics = metrics_load(w)
        for label, preset, fine in PRESETS:
            s = spans_load(w, label, preset, fine)
            single_bytes = s.single_trace_spans * s.bytes_per_span
            largest = s.largest_trace_spans
            rows.append(
                [
                    f"{w.ranks:,}",
                    label,
                    f"{s.spans_per_step_per_rank:.3g}",
                    _si(s.spans_per_s),
                    _si(s.spans_per_s * s.bytes_per_span, "B/s"),
                    _si(s.spans_per_s * s.gzip_bytes_per_span, "B/s"),
                    f"{_si(s.single_trace_spans)} / {_si(single_bytes, 'B')}"
                    f" ({single_bytes / TEMPO_MAX_BYTES_PER_TRACE.value:.3g}x)",
                    f"{_si(s.run_trace_spans)} / {_si(s.job_trace_spans)} / "
                    f"{_si(s.step_trace_spans)} ({s.shape.job.count})",
                    f"{_si(largest * s.bytes_per_span, 'B')}",
                    f"{gateways(s.spans_per_s, metrics.points_per_s, SPANS_PER_CORE_SPLUNK)}"
                    f" / {gateways(s.spans_per_s, metrics.points_per_s, SPANS_PER_CORE_OTEL)}",
                ]
            )
    out.append(
        _table(
            [
                "ranks",
                "span preset",
                "spans/step/rank",
                "spans/s",
                "raw",
                "gzip",
                "all ranks in one trace (x Tempo limit)",
                "spans: run / job / step trace (job shards)",
                "largest trace",
                "gateways (Splunk / OTel doc)",
            ],
            rows,
        )
    )
    out.append(
        "\nGateways: N = ceil((spans/s / C_s + points/s / C_p) / "
        f"({GATEWAY_CORES} cores x {GATEWAY_UTILISATION:g})) + 1, with the metrics of the job "
        "(EXPORT_REPLICATED=auto). Traces (otel_training.trace.shape, budget "
        f"{SPAN_BUDGET:,} spans): the run trace and a segment's job trace hold each rank's "
        "run-level or job-level spans, in shards of ranks where the world is large; each rank's "
        "iterations are in step traces of its own. All ranks in one trace, as before, is shown "
        "for comparison: routed by trace id (the load-balancing exporter's default), it sent "
        "all spans/s to one gateway."
    )
    out.append("\n## Backend for the metrics (EXPORT_REPLICATED=auto)\n")
    rows = []
    for w in scales:
        m = metrics_load(w)
        ingesters = m.series * MIMIR_REPLICATION / MIMIR_SERIES_PER_INGESTER_CORE.value
        rows.append(
            [
                f"{w.ranks:,}",
                f"{m.series:,}",
                _si(m.samples_per_s),
                f"{m.samples_per_s * 86400 * PROMETHEUS_BYTES_PER_SAMPLE.value / 1e9:.3g} GB",
                f"{m.samples_per_s / MIMIR_SAMPLES_PER_DISTRIBUTOR_CORE.value:.2g}",
                f"{ingesters:.2g} / {ingesters * 2.5:.2g} GB",
                f"{math.ceil(w.nodes)} x {m.points_per_s / w.nodes:.3g} points/s",
            ]
        )
    out.append(
        _table(
            [
                "ranks",
                "active series",
                "samples/s",
                "Prometheus disk/day",
                "Mimir distributor cores",
                "Mimir ingester cores / memory (RF 3)",
                "agents",
            ],
            rows,
        )
    )
    out.append("\n## Heartbeat and exponential step histogram at 4,096 ranks\n")
    w = next((s for s in scales if s.ranks == 4096), scales[-1])
    base = metrics_load(w)
    rows = [
        [
            "none",
            _si(base.points_per_s),
            _si(base.bytes_per_s, "B/s"),
            _si(base.gzip_bytes_per_s, "B/s"),
            f"{base.series:,}",
        ]
    ]
    for beat in (5.0, 2.0):
        hb = metrics_load(replace(w, heartbeat_s=beat))
        rows.append(
            [
                f"heartbeat {beat:g} s",
                _si(hb.points_per_s),
                _si(hb.bytes_per_s, "B/s"),
                _si(hb.gzip_bytes_per_s, "B/s"),
                f"{hb.series:,}",
            ]
        )
    ex = metrics_load(replace(w, exponential=True))
    rows.append(
        [
            "exponential step histogram",
            _si(ex.points_per_s),
            _si(ex.bytes_per_s, "B/s"),
            _si(ex.gzip_bytes_per_s, "B/s"),
            f"{ex.series:,} ({ex.series - base.series:+,})",
        ]
    )
    out.append(_table(["at 4,096 ranks", "OTLP points/s", "raw", "gzip", "active series"], rows))
    measured = measured_step_histograms(w)
    explicit, exponential = measured["explicit"], measured["exponential"]
    out.append(
        f"\n[measured] The step histogram of 1,000 steps ({w.step_time_s:g} s, spread "
        f"{w.step_spread:.0%}, a first step {w.first_step_factor:g}x longer), from a real export "
        f"(configure(), the embedded default): explicit {explicit['metric bytes']:,} B, "
        f"{explicit['buckets']} buckets, {explicit['series']} Prometheus series per rank; "
        f"exponential {exponential['metric bytes']:,} B, {exponential['buckets']} buckets at "
        f"scale {exponential['scale']}, {exponential['series']} native-histogram series per rank."
    )
    out.append(
        f"\nThe heartbeat sends {base.heartbeat_points_per_rank} points per rank "
        "(progress timestamp and age, phase elapsed per phase) on its own interval."
    )
    out.append("\n## Published figures used\n")
    out.extend(f"- {f.value:,g} {f.unit}: {f.source}" for f in FIGURES)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(__doc__, "a few seconds", targets=False)
    parser.add_argument("--interval", type=float, default=15.0, help="export interval, s")
    parser.add_argument("--step-time", type=float, default=5.0, help="seconds per step")
    args = parser.parse_args(argv)
    scales = [
        replace(w, export_interval_s=args.interval, step_time_s=args.step_time) for w in SCALES
    ]
    print(report(scales))
    return 0


if __name__ == "__main__":
    sys.exit(main())
