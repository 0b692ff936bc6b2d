"""Replicated values sent once, in a real multi-process job: 8 ranks of a 128-rank layout
(TP 4, PP 4, DP 8; Megatron-LM's rank order tp, dp, pp) as separate processes with their own
RANK, WORLD_SIZE and parallel ranks, no collectives, each writing the embedded default's files.
About 5 s (eight interpreters side by side on two cores)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from rank_jobs import metric_files
from support import child_env

from otel_training.metrics.replicated import REPLICATED_METRICS

TP, PP, DP = 4, 4, 8
WORLD = TP * PP * DP
#: (pp, tp, dp) of the ranks started: per stage, the one that sends and three that do not.
LAUNCHED = [(pp, tp, dp) for pp in (0, 3) for tp, dp in ((0, 0), (1, 0), (0, 1), (3, 7))]

RANK = textwrap.dedent(
    """
    import otel_training
    from opentelemetry.metrics import Observation
    from otel_training.semconv.metrics import METRICS

    def layers(options):  # what a tensor observer publishes for the stage's two layers
        return [Observation(1.5, {"megatron.training.layer": n}) for n in ("4", "5", "global")]

    t = otel_training.configure()
    # The tensor-metric families as otel_training.tensor.gauges creates them (without torch).
    for family, spec in METRICS.items():
        if family.startswith("megatron.training.tensor."):
            t.meter.create_observable_gauge(family, [layers], unit=spec.unit)
    for step in range(3):
        otel_training.record_training_metrics(
            t.meter, step_duration_ms=900.0, loss=2.5, throughput_tflops=300.0, grad_norm=1.2,
            skipped_iters=1, learning_rate=3e-4, tokens_per_sec=9000.0, memory_allocated_gb=60.0,
        )
    t.shutdown()
    """
)


def _rank(pp: int, tp: int, dp: int) -> int:
    return tp + TP * (dp + DP * pp)


def _metric_names(path: Path) -> set[str]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from otel_training.testing import parse_otlp_json

    lines = [line for line in path.read_text().splitlines() if line.strip()]
    request = parse_otlp_json(lines[-1], ExportMetricsServiceRequest())
    return {
        metric.name
        for resource_metrics in request.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    }


def test_one_rank_per_stage_sends_replicated_values_and_every_rank_its_own(tmp_path):
    """Default policy (auto, 128 ranks > 64): only tp=0, dp=0 of each stage exports loss, lr,
    grad norm, skipped iterations and parameter norms; every rank exports its step time,
    throughput, memory and health series; each silent rank says so once, naming its stage."""
    processes = {}
    for pp, tp, dp in LAUNCHED:
        rank = _rank(pp, tp, dp)
        env = child_env(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % 8),
                "WORLD_SIZE": str(WORLD),
                "OTEL_PYTHON_TRAINING_RUN_ID": "replicated",
                "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path),
                "OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS": "true",  # each silent rank's line
                "OTEL_RESOURCE_ATTRIBUTES": (
                    f"dl.pipeline_parallel.rank={pp},dl.tensor_parallel.rank={tp},"
                    f"dl.data_parallel.rank={dp}"
                ),
            }
        )
        processes[rank] = subprocess.Popen(
            [sys.executable, "-c", RANK],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    stderr = {}
    for rank, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        stderr[rank] = err
    files = {int(p.name[len("metrics-rank") : -len(".jsonl")]): p for p in metric_files(tmp_path)}
    assert set(files) == set(processes)
    rank_own = {
        "megatron.training.step_duration_ms",
        "megatron.training.throughput_tflops",
        "megatron.training.tokens_per_sec",
        "megatron.training.memory_allocated_gb",
        "dl.training.phase.time",
        "dl.training.progress.age",
    }
    for pp, tp, dp in LAUNCHED:
        rank = _rank(pp, tp, dp)
        names = _metric_names(files[rank])
        assert names >= rank_own, (rank, rank_own - names)
        sends = tp == 0 and dp == 0
        replicated = names & set(REPLICATED_METRICS)
        if sends:
            assert replicated == {
                "megatron.training.loss",
                "megatron.training.grad_norm",
                "megatron.training.learning_rate",
                "megatron.training.skipped_iters",
                "megatron.training.tensor.grad_norm",
                "megatron.training.tensor.param_norm",
                "megatron.training.tensor.grad_nonfinite",
                "megatron.training.tensor.update_ratio",
            }, rank
        else:
            assert not replicated, (rank, replicated)
            said = [line for line in stderr[rank].splitlines() if "not from this rank" in line]
            assert len(said) == 1 and f"pipeline stage {pp} " in said[0], stderr[rank]
