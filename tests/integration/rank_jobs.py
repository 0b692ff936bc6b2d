"""Helpers for tests that start real ``torchrun`` jobs (``python -m torch.distributed.run``) of
two CPU processes on gloo, bound to 127.0.0.1, and read what each rank wrote to the embedded
default's files; and ranks started without torchrun (:func:`gloo_ranks`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otlp_receiver import free_port
from support import REPO_ROOT, child_env


def gloo_ranks(
    command: Sequence[str], world: int, out: Path, *, timeout_s: float = 240.0
) -> list[Any]:
    """Runs ``python COMMAND RANK WORLD PORT OUT/rank{RANK}.json`` for every rank of ``world``
    (the ranks meet at 127.0.0.1:PORT, without torchrun), each with :func:`support.child_env`
    from the repository root, and returns what each rank wrote to its JSON file, by rank.

    Raises:
        AssertionError: when a rank fails (its exit status and the end of its output).
        subprocess.TimeoutExpired: when a rank runs past ``timeout_s`` seconds (all are
            killed).
    """
    port = free_port()
    children = [
        subprocess.Popen(
            [sys.executable, *command, str(rank), str(world), str(port),
             str(out / f"rank{rank}.json")],
            env=child_env(),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]  # fmt: skip
    outputs = []
    try:
        for child in children:
            outputs.append(child.communicate(timeout=timeout_s)[0])
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    for rank, (child, output) in enumerate(zip(children, outputs)):
        assert child.returncode == 0, f"rank {rank}:\n{output[-6000:]}"
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


def torchrun_args(
    log_dir: Path, *command: str, nproc: int = 2, module: bool = False
) -> Sequence[str]:
    """Arguments of ``python -m torch.distributed.run`` for ``nproc`` ranks on this machine
    (a free port on 127.0.0.1, as a user types ``torchrun --nproc_per_node=N``), each rank's
    stdout written to ``log_dir`` (read it with `rank_stdout`). ``module``: ``command`` starts
    with a module name (``torchrun -m``) rather than a script path."""
    return [
        f"--nproc_per_node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        f"--log-dir={log_dir}",
        "--redirects=1",
        *(["-m"] if module else []),
        *command,
    ]


def rank_stdout(log_dir: Path, local_rank: int) -> str:
    """What ``local_rank`` printed to stdout in the one job that wrote ``log_dir``."""
    (path,) = log_dir.glob(f"*/attempt_*/{local_rank}/stdout.log")
    return path.read_text()


@dataclass(frozen=True)
class RankMetrics:
    """The last metrics snapshot one rank wrote: its Resource and its points by metric name.

    Attributes:
        resource: resource attributes (``dl.rank``, ``dl.run.id``, ...).
        gauges: last value of each gauge or sum, by metric name.
        histograms: ``(count, sum)`` of each histogram, by metric name.
    """

    resource: dict[str, Any]
    gauges: dict[str, float]
    histograms: dict[str, tuple[int, float]]


def metric_files(root: Path) -> list[Path]:
    """Every ``metrics-rank*.jsonl`` under ``root`` once (a ``latest`` link is not counted
    twice), sorted."""
    return sorted({p.resolve() for p in root.rglob("metrics-rank*.jsonl")})


def last_metrics(path: Path) -> RankMetrics:
    """Reads the last line of an embedded-default metrics file (cumulative: it holds the run)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from otel_training.testing import parse_otlp_json

    lines = [line for line in path.read_text().splitlines() if line.strip()]
    request = parse_otlp_json(lines[-1], ExportMetricsServiceRequest())
    resource: dict[str, Any] = {}
    gauges: dict[str, float] = {}
    histograms: dict[str, tuple[int, float]] = {}
    for rm in request.resource_metrics:
        for kv in rm.resource.attributes:
            kind = kv.value.WhichOneof("value")
            resource[kv.key] = getattr(kv.value, kind)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                data = metric.WhichOneof("data")
                points = getattr(metric, data).data_points
                if data == "histogram":
                    histograms[metric.name] = (points[0].count, points[0].sum)
                elif data in ("gauge", "sum") and len(points) == 1 and not points[0].attributes:
                    point = points[0]
                    kind = point.WhichOneof("value")
                    gauges[metric.name] = float(getattr(point, kind))
    return RankMetrics(resource, gauges, histograms)
