"""bench/scale_model.py held to real exports: the data points of one real rank exactly, its
bytes within 10 %; every span of the registry has a rate; the sizing formula; the replicated
and exponential savings. About 3 s (the model imports torch for the tensor schedule)."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from support import load_script

import otel_training
from otel_training import testing
from otel_training.metrics import views
from otel_training.metrics.device import DeviceMetrics, DeviceSample
from otel_training.semconv.metrics import METRICS
from otel_training.semconv.spans import SPANS
from otel_training.trace import shape as trace_shape

ROOT = Path(__file__).resolve().parents[1]


model = load_script("scale_model", "bench")

#: The workload of the real rank below: 4 layers on its stage, the observer's default schedule,
#: one GPU, a checkpoint loaded and saved, the default span groups.
WORKLOAD = model.Workload(ranks=8, tp=2, pp=2, layers=8, ranks_per_node=8)


class _Devices:
    """One GPU that reports every reading (what NVML gives on a datacenter GPU)."""

    def read(self):
        return [
            DeviceSample(
                id="GPU-5f3a2c1e-9b7d-4e8f-a1b2-c3d4e5f60718",
                name="NVIDIA H100 80GB HBM3",
                utilization=0.93,
                memory_used_bytes=61_234_567_890,
                memory_total_bytes=85_899_345_920,
                power_w=612.5,
                energy_j=123_456_789.5,
                temperature_cel=67.0,
                clocks_hz={"graphics": 1.98e9, "sm": 1.98e9, "memory": 2.619e9},
            )
        ]


class _TensorValues:
    """What the tensor observer publishes with the default schedule on a 4-layer stage."""

    families = (
        "megatron.training.tensor.grad_norm",
        "megatron.training.tensor.param_norm",
        "megatron.training.tensor.activation_rms",
    )

    def observe(self, family):
        if family not in self.families:
            return []
        labels = [f"decoder.layers.{i}" for i in range(4, 8)] + ["global"]
        return [({"megatron.training.layer": label}, 0.1 + i) for i, label in enumerate(labels)]


def _last_request(path: Path) -> ExportMetricsServiceRequest:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return testing.parse_otlp_json(lines[-1], ExportMetricsServiceRequest())


@pytest.fixture(scope="module")
def real_rank(tmp_path_factory):
    """One rank of an 8-rank job run for real with the embedded default: it loads a
    checkpoint, trains 30 steps with every training value, saves a checkpoint, publishes
    tensor metrics and reads its GPU; its last metrics export and its spans."""
    out = tmp_path_factory.mktemp("rank")
    telemetry = otel_training.configure(
        environ={
            "RANK": "3",
            "LOCAL_RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "8",
            "OTEL_PYTHON_TRAINING_RUN_ID": "9f1c2e7a4b3d4f2a8e6b0c1d2e3f4a5b",
            "OTEL_PYTHON_TRAINING_RUN_ATTEMPT": "0",
            "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out),
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
            "OTEL_SERVICE_NAME": "llama3-405b-pretrain",
            "OTEL_RESOURCE_ATTRIBUTES": (
                "dl.job.id=4242917,dl.pipeline_parallel.rank=1,dl.tensor_parallel.rank=1,"
                "dl.data_parallel.rank=0"
            ),
        },
        set_global=False,
    )
    devices = DeviceMetrics(telemetry.meter_provider.get_meter("otel_training.devices"), _Devices())
    from otel_training.tensor.gauges import TensorMetricGauges

    source = _TensorValues()
    TensorMetricGauges.for_meter(telemetry.meter).add_source(source)
    with otel_training.checkpoint_load("/ckpt/iter_0001000", iteration=1000):
        pass
    for iteration in range(1001, 1031):
        with otel_training.training_iteration(iteration):
            with otel_training.data_loading(iteration):
                pass
            with otel_training.forward_backward(iteration, num_microbatches=32):
                pass
            with otel_training.optimizer_step(iteration):
                pass
        otel_training.record_training_metrics(
            telemetry.meter,
            step_duration_ms=5000.0 + iteration,
            loss=2.5,
            throughput_tflops=412.0,
            grad_norm=1.1,
            learning_rate=3e-4,
            tokens_per_sec=9876.0,
            memory_allocated_gb=61.2,
        )
    with otel_training.checkpoint_save("/ckpt/iter_0001030", iteration=1030):
        pass
    telemetry.shutdown()
    del devices, source
    (run,) = [p for p in out.iterdir() if p.is_dir() and p.name != "latest"]
    return run


def test_every_span_of_the_registry_has_a_rate():
    """SPAN_RATES covers the registry's spans exactly: a new span needs a rate."""
    assert set(model.SPAN_RATES) == set(SPANS)


def test_the_model_counts_the_real_ranks_points_exactly(real_rank):
    """Data points per metric of the model = those of the real rank's last export (metric by
    metric, so a wrong count cannot hide behind a right total)."""
    request = _last_request(real_rank / "metrics-rank3.jsonl")
    real = Counter()
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                real[metric.name] += len(getattr(metric, metric.WhichOneof("data")).data_points)
    workload = replace(WORKLOAD, span_preset="per_step")
    modelled = Counter(
        {s.name: len(s.points) for s in model.rank_streams(workload, exports_replicated=True)}
    )
    assert real == modelled
    assert sum(real.values()) == model.metrics_load(workload).points_per_rank


def test_the_model_sizes_the_real_ranks_request_within_ten_percent(real_rank):
    """The protobuf size of the model's request for one rank is within 10 % of the real one."""
    request = _last_request(real_rank / "metrics-rank3.jsonl")
    workload = replace(WORKLOAD, span_preset="per_step")
    modelled = model.metrics_request(workload, [3]).ByteSize()
    assert abs(modelled - request.ByteSize()) <= 0.10 * request.ByteSize(), (
        modelled,
        request.ByteSize(),
    )


def test_the_model_sizes_the_real_ranks_spans_within_ten_percent(real_rank):
    """Bytes per span of the model's per-step mix are within 10 % of the real rank's."""
    spans = size = 0
    names = Counter()
    for line in (real_rank / "traces-rank3.jsonl").read_text().splitlines():
        if line.strip():
            request = testing.parse_otlp_json(line, ExportTraceServiceRequest())
            size += request.ByteSize()
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    spans += len(ss.spans)
                    names.update(s.name for s in ss.spans)
    mix = {name: count for name, count in names.items()}
    modelled = model.spans_request(WORKLOAD, mix, spans, [3])
    modelled_spans = sum(len(ss.spans) for rs in modelled.resource_spans for ss in rs.scope_spans)
    real_per_span = size / spans
    modelled_per_span = modelled.ByteSize() / modelled_spans
    assert abs(modelled_per_span - real_per_span) <= 0.10 * real_per_span, (
        modelled_per_span,
        real_per_span,
    )


def test_a_silent_rank_leaves_out_exactly_the_replicated_points():
    """Under pp_first a silent rank's points are the others less the replicated ones, and the
    job's series count one exporting rank per stage."""
    w = model.Workload(4096)
    load = model.metrics_load(w)
    replicated = sum(
        len(s.points) for s in model.rank_streams(w) if METRICS.get(s.name, None) and s.replicated
    )
    assert replicated > 0
    assert load.points_per_silent_rank == load.points_per_rank - replicated
    assert load.exporters_of_replicated == w.pp
    assert load.series == w.pp * load.series_per_rank + (w.ranks - w.pp) * (
        load.series_per_silent_rank
    )


def test_the_exponential_step_histogram_saves_its_buckets_per_rank():
    """Exponential: one series per rank instead of the view's buckets + _sum + _count."""
    w = model.Workload(4096, replicated_policy="all")
    explicit = model.metrics_load(w).series
    exponential = model.metrics_load(replace(w, exponential=True)).series
    assert explicit - exponential == w.ranks * (len(views.STEP_DURATION_BUCKETS_MS) + 3 - 1)


def test_gateways_follow_the_published_rates():
    """N = ceil((spans/s / 15k + points/s / 20k) / (2 x 0.5)) + 1; a lone rank needs N+1 = 2."""
    assert model.gateways(0, 0, model.SPANS_PER_CORE_SPLUNK) == 1
    assert model.gateways(1, 1, model.SPANS_PER_CORE_SPLUNK) == 2
    assert model.gateways(15_000, 20_000, model.SPANS_PER_CORE_SPLUNK) == 3
    assert model.gateways(15_000, 20_000, model.SPANS_PER_CORE_OTEL) == math.ceil(1.5 + 1) + 1


def test_the_traces_stay_within_the_budget_and_one_trace_for_all_ranks_does_not():
    """At every scale and preset the run, job and step traces of the code's shape stay within
    the span budget (and under Tempo's 5 MB); one trace for all ranks of a segment holds every
    rank's steps. The segment length the rates assume is the code's: at the default budget N
    is the limit for every preset."""
    for w in model.SCALES:
        for label, preset, fine in model.PRESETS:
            load = model.spans_load(w, label, preset, fine)
            assert load.shape.segment_iterations == w.segment_iterations == 1000
            assert load.shape == trace_shape.TraceShape.derive(
                model.span_groups(preset, fine), w.ranks, 20_000, 1000
            )
            for spans in (load.run_trace_spans, load.job_trace_spans, load.step_trace_spans):
                assert spans <= model.SPAN_BUDGET, (w.ranks, label)
            largest_bytes = load.largest_trace_spans * load.bytes_per_span
            assert largest_bytes < model.TEMPO_MAX_BYTES_PER_TRACE.value, (w.ranks, label)
    w = model.Workload(4096)
    load = model.spans_load(w, "per_step", "per_step", False)
    assert load.single_trace_spans == w.ranks * load.spans_per_step_per_rank * 1000
    assert load.single_trace_spans > 1000 * model.SPAN_BUDGET
    # 1,000 iterations of 134 spans, and the evaluation steps that had no room in the job
    # trace (a share of 9 spans of the 106 a rank makes per segment), overfill one step trace.
    assert load.step_spans_per_segment > model.SPAN_BUDGET == load.step_trace_spans
    assert (load.shape.job.count, load.shape.job.ranks) == (2, 2048)
    assert load.job_trace_spans == 2048 * 9


def test_the_report_prints_every_scale_preset_and_source():
    """The printed report has a row per scale and preset, and cites every published figure."""
    text = model.report(model.SCALES)
    for w in model.SCALES:
        assert re.search(rf"^\|\s+{w.ranks:,} \|", text, re.M), w.ranks
    for label, _, _ in model.PRESETS:
        assert label in text
    for figure in model.FIGURES:
        assert figure.source in text


def test_the_exponential_step_histogram_measured_from_a_real_export():
    """A real export of 1,000 steps: the exponential step metric is one native-histogram series
    and smaller than the explicit one; the model sizes both within 10 %."""
    w = model.Workload(4096)
    measured = model.measured_step_histograms(w)
    explicit, exponential = measured["explicit"], measured["exponential"]
    assert (explicit["series"], exponential["series"]) == (
        len(views.STEP_DURATION_BUCKETS_MS) + 3,
        1,
    )
    assert exponential["scale"] <= views.STEP_DURATION_EXPONENTIAL_MAX_SCALE
    assert exponential["metric bytes"] < explicit["metric bytes"]
    rng = random.Random(0)
    for kind, flag in (("explicit", False), ("exponential", True)):
        (stream,) = [
            s
            for s in model.rank_streams(replace(w, exponential=flag))
            if s.name == "megatron.training.step_duration_ms"
        ]
        modelled = model._metric(stream, replace(w, exponential=flag), rng).ByteSize()
        real = measured[kind]["metric bytes"]
        assert abs(modelled - real) <= 0.10 * real, (kind, modelled, real)


def _doc_table(heading: str) -> list[list[str]]:
    """The rows of the first table under ``heading`` in docs/scale.md, cells stripped of **."""
    text = (ROOT / "docs" / "scale.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    rows = []
    for line in section.splitlines():
        if line.startswith("|---"):
            continue
        if line.startswith("|"):
            rows.append([c.strip().strip("*") for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[1:]


def test_docs_gateway_table_is_the_models():
    """docs/scale.md's gateways per job and preset are what the model computes (after a change
    of the registry, views or span groups: make bench-scale, then update docs/scale.md)."""
    columns = [("default", False), ("per_step", True), ("per_step", False), ("all", False)]
    rows = {row[0]: row[1:] for row in _doc_table("## How many gateways")}
    for w in model.SCALES:
        metrics = model.metrics_load(w)
        expected = []
        for preset, fine in columns:
            s = model.spans_load(w, preset, preset, fine)
            pair = {
                model.gateways(s.spans_per_s, metrics.points_per_s, figure)
                for figure in (model.SPANS_PER_CORE_SPLUNK, model.SPANS_PER_CORE_OTEL)
            }
            expected.append(" / ".join(str(n) for n in sorted(pair)))
        assert rows[f"{w.ranks:,}"] == expected, w.ranks


def test_docs_backend_table_is_the_models():
    """docs/scale.md's active series per job are the model's (EXPORT_REPLICATED=auto)."""
    rows = {row[0]: row[1] for row in _doc_table("## What the backend holds")}
    for w in model.SCALES:
        assert rows[f"{w.ranks:,}"] == f"{model.metrics_load(w).series:,}", w.ranks


def test_docs_traces_table_is_the_models():
    """docs/scale.md's largest run, job and step traces are the model's (the code's shape)."""
    presets = {label: (preset, fine) for label, preset, fine in model.PRESETS}
    scales = {w.ranks: w for w in model.SCALES}
    rows = _doc_table("## Traces at scale")
    assert len(rows) >= 5
    for ranks, label, run, job, step, largest in rows:
        w = scales[int(ranks.replace(",", ""))]
        s = model.spans_load(w, label, *presets[label])
        assert [run, job, step, largest] == [
            model._si(s.run_trace_spans),
            f"{model._si(s.job_trace_spans)} ({s.shape.job.count})",
            model._si(s.step_trace_spans),
            model._si(s.largest_trace_spans * s.bytes_per_span, "B"),
        ], (ranks, label)
