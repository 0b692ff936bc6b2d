"""otel-training report, trace and health on a long multi-rank job: time, memory, output size.

Writes, into a temporary directory, the files that the embedded default would leave after a
10,000-step job on 8 ranks in 3 attempts (the defaults; see the flags): attempt k is killed
inside a step, the next one starts a minute later in its own run directory
(``bench-a{k}``, one ``dl.job.id``), loads the last checkpoint and goes on; synthetically but
in the real formats and at realistic rates:

- ``metrics-rank{R}.jsonl``: one OTLP-JSON ``ExportMetricsServiceRequest`` per 5 s export
  (cumulative temporality): the Megatron-LM gauges (loss, learning rate, grad norm, tokens/s,
  TFLOP/s, memory; logged every 10 steps), the step-duration histogram (one observation per
  step, the default buckets), skipped iterations and non-finite values, and the tensor gauges
  of 24 layers (grad norm, param norm, activation RMS, router balance x 3 statistics, router
  entropy; computed every 50 steps, exported at every collection like any observable gauge), and
  the health ledger (``dl.training.phase.time`` and ``.elapsed`` per phase, progress and the
  step of the last log, checkpoint iteration and age; rank 5 computes 25 % longer and waits as
  much less, a straggler);
- ``spans-rank{R}.jsonl``: start and end lines (docs/spans.md) of the run, startup with a
  checkpoint load, every iteration with its forward/backward and optimizer step, an evaluation
  every 500 steps and a checkpoint save every 1,000;
- ``traces-rank{R}.jsonl``: the same spans as OTLP-JSON in batches of 512.

Then runs the three commands on it as a person would, each in a process of its own:
``otel-training report``, ``otel-training trace`` and ``otel-training health --json`` (every
attempt of the job; files of more than 64 MiB in a run directory are read in worker processes,
one per CPU), and prints per command the wall time, the CPU time of all its processes (worker
processes included: steadier than the wall time on a loaded machine) and the peak resident
memory of its largest process; then the input size, the HTML and trace sizes, the spans, and
the job's goodput and stragglers.

``--against REV`` runs the same commands on the same files with the source tree of git
revision ``REV`` too (``git archive``), alternating the two trees command by command
(``--rounds`` times each), and prints them side by side with the ratio after/before: the
measure of a change to the reader.

Run: ``make bench-report`` or ``.venv/bin/python bench/report.py [--steps N --ranks N]
[--against REV] [--rounds N]`` (writes about 1.3 GB to the temporary directory, removed at the
end unless ``--keep``; ``--reuse DIR`` reads a kept one again).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # report_files

import _verdict
from report_files import key_value

from otel_training.health.ledger import PHASES
from otel_training.metrics.throughput import tflops_per_device
from otel_training.metrics.views import STEP_DURATION_BUCKETS_MS
from otel_training.pipeline.resource import iso8601
from otel_training.semconv.attributes import (
    MEGATRON_CHECKPOINT_PATH,
    MEGATRON_CHECKPOINT_SIZE,
    MEGATRON_CHECKPOINT_STRATEGY,
    MEGATRON_CHECKPOINT_TYPE,
    MEGATRON_ITERATION,
    MEGATRON_TRAINING_LAYER,
    MEGATRON_TRAINING_METRIC,
    MEGATRON_TRAINING_ROUTER_STATISTIC,
)
from otel_training.semconv.metrics import (
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_NONFINITE_VALUES,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS,
    MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    MEGATRON_TRAINING_TENSOR_PARAM_NORM,
    MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
    MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)
from otel_training.semconv.spans import (
    MEGATRON_CHECKPOINT_LOAD,
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_EVALUATE,
    MEGATRON_STARTUP,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_ITERATION,
    SPANS,
)


def _span_of_group(group: str) -> str:
    """The registry's span of ``group`` (the iteration's children are named by group)."""
    return min(name for name, spec in SPANS.items() if spec.group == group)


FORWARD_BACKWARD = _span_of_group("forward_backward")
OPTIMIZER = _span_of_group("optimizer")
EXPORT_INTERVAL_S = 5.0
LOG_INTERVAL = 10
TENSOR_INTERVAL = 50
EVAL_INTERVAL = 500
CHECKPOINT_INTERVAL = 1_000
ROUTER_STATISTICS = ("max_over_mean", "coefficient_of_variation", "dead_fraction")


class _Rank:
    """Writes one rank's three files as the run goes."""

    def __init__(
        self,
        directory: Path,
        rank: int,
        world_size: int,
        run_id: str,
        layers: int,
        attempt: int = 0,
        created_ns: int = 0,
    ):
        self.rank, self.layers = rank, layers
        self.random = random.Random(rank + 1000 * attempt)
        self.resource = {
            "service.name": "llama-pretrain",
            "service.instance.id": f"{run_id}-rank{rank}",
            "host.name": f"node-{rank // 4:03d}",
            "dl.rank": rank,
            "dl.local_rank": rank % 4,
            "dl.world_size": world_size,
            "dl.node_rank": rank // 4,
            "dl.run.id": run_id,
            "dl.job.id": "bench-job",
            "dl.run.attempt": attempt,
            "process.creation.time": iso8601(created_ns / 1e9),
        }
        self.resource_otlp = {"attributes": [key_value(k, v) for k, v in self.resource.items()]}
        self.resource_json = json.dumps(self.resource)
        self.metrics = open(directory / f"metrics-rank{rank}.jsonl", "w")
        self.spans = open(directory / f"spans-rank{rank}.jsonl", "w")
        self.traces = open(directory / f"traces-rank{rank}.jsonl", "w")
        self.trace_id = f"{self.random.getrandbits(128):032x}"
        self.pending: list[dict] = []
        self.buckets = [0] * (len(STEP_DURATION_BUCKETS_MS) + 1)
        self.count, self.sum = 0, 0.0
        self.start_ns = 0
        self.gauges: dict[str, float] = {}
        self.tensors: dict[tuple, float] = {}
        self.skipped = 0
        self.nonfinite = 0
        # the health ledger, as the process's observable instruments would read it
        self.created_ns = created_ns
        self.phase_s = dict.fromkeys(PHASES, 0.0)
        self.accounted_ns = created_ns
        self.open_phase = "startup"
        self.open_since_ns = created_ns
        self.iteration: int | None = None
        self.logged: int | None = None  # the step of the last training log
        self.progress_ns: int | None = None
        self.saved: int | None = None
        self.loaded: int | None = None
        self.safe_ns: int | None = None
        self.completed: dict[int, int] = {}

    def spend(self, phase: str, until_ns: int) -> None:
        """The ledger: the time up to ``until_ns`` goes to ``phase``."""
        if until_ns > self.accounted_ns:
            self.phase_s[phase] += (until_ns - self.accounted_ns) / 1e9
            self.accounted_ns = until_ns
        if phase != self.open_phase:
            self.open_phase, self.open_since_ns = phase, until_ns

    def ledger_metrics(self, time_ns: int) -> list[dict]:
        """The ledger's eight instruments at ``time_ns`` (the time since the last accounting
        goes to the phase open then)."""
        totals = dict(self.phase_s)
        totals[self.open_phase] += max(0, time_ns - self.accounted_ns) / 1e9
        phase_points = [
            {
                "startTimeUnixNano": str(self.created_ns),
                "timeUnixNano": str(time_ns),
                "asDouble": value,
                "attributes": [key_value("dl.training.phase", phase)],
            }
            for phase, value in totals.items()
        ]
        elapsed = [
            {
                "timeUnixNano": str(time_ns),
                "asDouble": (time_ns - self.open_since_ns) / 1e9
                if phase == self.open_phase
                else 0.0,
                "attributes": [key_value("dl.training.phase", phase)],
            }
            for phase in PHASES
        ]

        def gauge(name: str, value: float, attributes=()) -> dict:
            point = {"timeUnixNano": str(time_ns), "asDouble": value}
            if attributes:
                point["attributes"] = [key_value(k, v) for k, v in attributes]
            return {"name": name, "gauge": {"dataPoints": [point]}}

        metrics = [
            {
                "name": "dl.training.phase.time",
                "unit": "s",
                "sum": {
                    "dataPoints": phase_points,
                    "aggregationTemporality": 2,
                    "isMonotonic": True,
                },
            },
            {"name": "dl.training.phase.elapsed", "unit": "s", "gauge": {"dataPoints": elapsed}},
        ]
        progress = self.progress_ns if self.progress_ns is not None else self.created_ns
        metrics.append(gauge("dl.training.progress.age", (time_ns - progress) / 1e9))
        if self.iteration is not None:
            metrics.append(gauge("dl.training.progress.iteration", float(self.iteration)))
            metrics.append(gauge("dl.training.progress.timestamp", progress / 1e9))
        if self.logged is not None:
            metrics.append(gauge("dl.training.progress.logged_iteration", float(self.logged)))
        operation = "megatron.checkpoint.operation"
        if self.saved is not None:
            metrics.append(gauge("dl.training.checkpoint.iteration", float(self.saved),
                                 [(operation, "save")]))  # fmt: skip
        if self.loaded is not None:
            metrics.append(gauge("dl.training.checkpoint.iteration", float(self.loaded),
                                 [(operation, "load")]))  # fmt: skip
        if self.safe_ns is not None:
            metrics.append(gauge("dl.training.checkpoint.age", (time_ns - self.safe_ns) / 1e9))
        return metrics

    def span_id(self) -> str:
        return f"{self.random.getrandbits(64):016x}"

    def span(self, name, start_ns, end_ns, parent, attributes=None, span_id=None) -> str:
        span_id = span_id or self.span_id()
        attributes = attributes or {}
        common = (
            f'"name": "{name}", "trace_id": "{self.trace_id}", "span_id": "{span_id}", '
            f'"parent_span_id": {json.dumps(parent)}, "start_time_ns": {start_ns}'
        )
        attrs = json.dumps(attributes)
        tail = f', "rank": {self.rank}, "resource": {self.resource_json}}}\n'
        self.spans.write(f'{{"record": "span_start", {common}, "attributes": {attrs}{tail}')
        self.spans.write(
            f'{{"record": "span_end", {common}, "end_time_ns": {end_ns}, '
            f'"duration_ms": {(end_ns - start_ns) / 1e6}, "status": "UNSET", '
            f'"status_description": null, "events": [], "attributes": {attrs}{tail}'
        )
        item = {
            "traceId": self.trace_id,
            "spanId": span_id,
            "name": name,
            "kind": 1,
            "startTimeUnixNano": str(start_ns),
            "endTimeUnixNano": str(end_ns),
            "attributes": [key_value(k, v) for k, v in attributes.items()],
            "status": {},
        }
        if parent:
            item["parentSpanId"] = parent
        self.pending.append(item)
        if len(self.pending) >= 512:
            self.flush_traces()
        return span_id

    def span_start(self, name, start_ns, parent, attributes=None, span_id=None) -> str:
        """A start line only: the span never ended (its process was killed inside it)."""
        span_id = span_id or self.span_id()
        line = {
            "record": "span_start", "name": name, "trace_id": self.trace_id, "span_id": span_id,
            "parent_span_id": parent, "start_time_ns": start_ns, "attributes": attributes or {},
            "rank": self.rank, "resource": self.resource,
        }  # fmt: skip
        self.spans.write(json.dumps(line) + "\n")
        return span_id

    def flush_traces(self) -> None:
        if not self.pending:
            return
        document = {
            "resourceSpans": [
                {
                    "resource": self.resource_otlp,
                    "scopeSpans": [{"scope": {"name": "otel_training"}, "spans": self.pending}],
                }
            ]
        }
        self.traces.write(json.dumps(document, separators=(",", ":")) + "\n")
        self.pending = []

    def observe_step(self, duration_ms: float) -> None:
        for i, bound in enumerate(STEP_DURATION_BUCKETS_MS):
            if duration_ms <= bound:
                self.buckets[i] += 1
                break
        else:
            self.buckets[-1] += 1
        self.count += 1
        self.sum += duration_ms

    def export(self, time_ns: int) -> None:
        def gauge(name, points):
            return {"name": name, "unit": "", "gauge": {"dataPoints": points}}

        def point(value, attributes=()):
            p = {"timeUnixNano": str(time_ns), "asDouble": value}
            if attributes:
                p["attributes"] = [key_value(k, v) for k, v in attributes]
            return p

        metrics = [
            {
                "name": MEGATRON_TRAINING_STEP_DURATION_MS,
                "unit": "ms",
                "histogram": {
                    "dataPoints": [
                        {
                            "startTimeUnixNano": str(self.start_ns),
                            "timeUnixNano": str(time_ns),
                            "count": str(self.count),
                            "sum": self.sum,
                            "bucketCounts": [str(c) for c in self.buckets],
                            "explicitBounds": list(STEP_DURATION_BUCKETS_MS),
                        }
                    ],
                    "aggregationTemporality": 2,
                },
            }
        ]
        metrics += [gauge(name, [point(value)]) for name, value in self.gauges.items()]
        for name in (
            MEGATRON_TRAINING_SKIPPED_ITERS,
            MEGATRON_TRAINING_NONFINITE_VALUES,
        ):
            total = self.skipped if name == MEGATRON_TRAINING_SKIPPED_ITERS else self.nonfinite
            if total:
                attrs = (
                    [key_value(MEGATRON_TRAINING_METRIC, MEGATRON_TRAINING_LOSS)]
                    if name == MEGATRON_TRAINING_NONFINITE_VALUES
                    else []
                )
                metrics.append(
                    {
                        "name": name,
                        "sum": {
                            "dataPoints": [
                                {
                                    "startTimeUnixNano": str(self.start_ns),
                                    "timeUnixNano": str(time_ns),
                                    "asInt": str(total),
                                    "attributes": attrs,
                                }
                            ],
                            "aggregationTemporality": 2,
                            "isMonotonic": True,
                        },
                    }
                )
        by_family: dict[str, list] = {}
        for (family, attributes), value in self.tensors.items():
            by_family.setdefault(family, []).append(point(value, attributes))
        metrics += [gauge(family, points) for family, points in by_family.items()]
        metrics += self.ledger_metrics(time_ns)
        document = {
            "resourceMetrics": [
                {
                    "resource": self.resource_otlp,
                    "scopeMetrics": [{"scope": {"name": "otel_training"}, "metrics": metrics}],
                }
            ]
        }
        self.metrics.write(json.dumps(document, separators=(",", ":")) + "\n")

    def log(self, step: int, steps: int, duration_s: float) -> None:
        r = self.random
        self.logged = step
        progress = step / steps
        warmup = min(1.0, step / 200)
        lr = 3e-4 * warmup * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        loss = 2.0 + 8.0 * math.exp(-step / 800) + 0.05 * r.gauss(0, 1)
        if 7_000 <= step < 7_030:
            loss += 1.5 * math.exp(-(step - 7_000) / 10)  # a loss spike
        tokens_per_s = 4 * 8192 / duration_s * (1 + 0.01 * r.gauss(0, 1))
        self.gauges = {
            MEGATRON_TRAINING_LOSS: loss,
            MEGATRON_TRAINING_LEARNING_RATE: lr,
            MEGATRON_TRAINING_GRAD_NORM: abs(
                0.3 + 2.0 * math.exp(-step / 500) + 0.05 * r.gauss(0, 1)
            ),
            MEGATRON_TRAINING_TOKENS_PER_SEC: tokens_per_s,
            MEGATRON_TRAINING_THROUGHPUT_TFLOPS: tflops_per_device(6 * 7e9, tokens_per_s),
            MEGATRON_TRAINING_MEMORY_ALLOCATED_GB: 61.5
            + 0.3 * math.sin(step / 300)
            + 0.1 * self.rank,
        }

    def tensor_metrics(self, step: int) -> None:
        r = self.random
        decay = math.exp(-step / 2_000)
        for layer in range(self.layers):
            name = f"decoder.layers.{layer}"
            depth = layer / max(self.layers - 1, 1)
            key = ((MEGATRON_TRAINING_LAYER, name),)
            self.tensors[(MEGATRON_TRAINING_TENSOR_GRAD_NORM, key)] = (
                (0.05 + 0.4 * decay) * (1.5 - depth) * (1 + 0.1 * r.gauss(0, 1))
            )
            self.tensors[(MEGATRON_TRAINING_TENSOR_PARAM_NORM, key)] = (
                40 + 10 * depth + step / 1_000
            )
            self.tensors[(MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS, key)] = 1 + 2 * depth * (
                1 - decay
            )
            for statistic in ROUTER_STATISTICS:
                attrs = (
                    (MEGATRON_TRAINING_LAYER, name),
                    (MEGATRON_TRAINING_ROUTER_STATISTIC, statistic),
                )
                base = {"max_over_mean": 1.2, "coefficient_of_variation": 0.2, "dead_fraction": 0.0}
                self.tensors[(MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE, attrs)] = (
                    base[statistic] + 0.5 * decay * depth + 0.02 * abs(r.gauss(0, 1))
                )
            self.tensors[(MEGATRON_TRAINING_TENSOR_ROUTER_ENTROPY, key)] = (
                0.95 - 0.2 * decay * depth
            )
        for family in (MEGATRON_TRAINING_TENSOR_GRAD_NORM, MEGATRON_TRAINING_TENSOR_PARAM_NORM):
            self.tensors[(family, ((MEGATRON_TRAINING_LAYER, "global"),))] = sum(
                v for (f, a), v in self.tensors.items() if f == family and a[0][1] != "global"
            )

    def close(self) -> None:
        self.flush_traces()
        for handle in (self.metrics, self.spans, self.traces):
            handle.close()


#: Seconds between an attempt's death and the next one's first process.
DOWNTIME_S = 60.0
#: Shares of a step: data loading, forward/backward, communication (waiting), optimizer.
STEP_SHARES = {"data_loading": 0.03, "forward_backward": 0.60, "communication": 0.22,
               "optimizer": 0.15}  # fmt: skip
#: Rank 5's forward/backward is this much longer (and it waits as much less): a straggler.
STRAGGLER_RANK, STRAGGLER_COMPUTE = 5, 1.3


def generate(
    directory: Path, steps: int, ranks: int, layers: int, step_s: float, attempts: int = 3
) -> list[Path]:
    """Writes the files of the job (see the module docstring): one run directory per attempt,
    returned in order."""
    t0 = 1_796_000_000 * 10**9
    common = random.Random(1234)
    created, first_step, resumed = t0, 1, 0
    directories = []
    for attempt in range(attempts):
        final = attempt == attempts - 1
        # killed 437 steps after its share of the job (not at a checkpoint)
        last = steps if final else min(steps, round(steps * (attempt + 1) / attempts) + 437)
        run_dir = directory / f"bench-a{attempt}"
        run_dir.mkdir(parents=True)
        directories.append(run_dir)
        ended = _attempt(
            run_dir, attempt, created, first_step, last, resumed, steps, ranks, layers, step_s,
            common, killed=not final,
        )  # fmt: skip
        resumed = (last - 1) // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL
        first_step = resumed + 1
        created = ended + int(DOWNTIME_S * 1e9)
    return directories


def _attempt(
    directory: Path,
    attempt: int,
    t0: int,
    first_step: int,
    last: int,
    resumed: int,
    steps: int,
    ranks: int,
    layers: int,
    step_s: float,
    common: random.Random,
    *,
    killed: bool,
) -> int:
    """One attempt: startup with a checkpoint load of ``resumed``, steps ``first_step`` to
    ``last`` (the last one cut by the kill when ``killed``). Returns when it ended (ns)."""
    run_id = f"bench-a{attempt}"
    writers = [_Rank(directory, r, ranks, run_id, layers, attempt, t0) for r in range(ranks)]
    startup_ns = int(45e9)
    for w in writers:
        w.start_ns = t0
        w.root = w.span_id()
        skew = int(w.random.uniform(-2e6, 2e6))  # clocks of the hosts a few ms apart
        w.skew = skew
        startup = w.span(MEGATRON_STARTUP, t0 + skew, t0 + startup_ns + skew, w.root)
        w.span(
            MEGATRON_CHECKPOINT_LOAD,
            t0 + int(20e9) + skew,
            t0 + int(40e9) + skew,
            startup,
            {MEGATRON_CHECKPOINT_TYPE: "global", MEGATRON_ITERATION: resumed},
        )
        w.spend("startup", t0 + int(20e9) + skew)
        w.spend("checkpoint_load", t0 + int(40e9) + skew)
        w.loaded = w.iteration = resumed
        w.progress_ns = w.safe_ns = t0 + int(40e9) + skew
        w.spend("startup", t0 + startup_ns + skew)
    now = t0 + startup_ns
    next_export = t0 + int(EXPORT_INTERVAL_S * 1e9)
    for step in range(first_step, last + 1):
        base = step_s * math.exp(0.05 * common.gauss(0, 1))
        end = now + int(base * 1e9)
        if killed and step == last:  # killed half-way through this step: its start only
            for w in writers:
                w.span_start(
                    MEGATRON_TRAIN_ITERATION, now + w.skew, w.root, {MEGATRON_ITERATION: step}
                )
            now += int(base * 0.5e9)
            while next_export <= now:
                for w in writers:
                    w.export(next_export + w.skew)
                next_export += int(EXPORT_INTERVAL_S * 1e9)
            break
        for w in writers:
            duration = base * (1.03 if w.rank == 5 else 1.0)  # rank 5 a bit slower inside
            start_ns, end_ns = now + w.skew, end + w.skew
            iteration = w.span(
                MEGATRON_TRAIN_ITERATION, start_ns, end_ns, w.root, {MEGATRON_ITERATION: step}
            )
            split = start_ns + int((end_ns - start_ns) * 0.82)
            w.span(FORWARD_BACKWARD, start_ns, split, iteration, {MEGATRON_ITERATION: step})
            w.span(OPTIMIZER, split, end_ns - 1000, iteration, {MEGATRON_ITERATION: step})
            if step == first_step:  # the first iteration of a process: warm-up, all of it
                w.spend("warmup", end_ns)
            else:
                at = start_ns
                for phase, share in STEP_SHARES.items():
                    if w.rank == STRAGGLER_RANK and phase in ("forward_backward", "communication"):
                        extra = STEP_SHARES["forward_backward"] * (STRAGGLER_COMPUTE - 1)
                        share += extra if phase == "forward_backward" else -extra
                    at += int((end_ns - start_ns) * share)
                    w.spend(phase, min(at, end_ns) if phase != "optimizer" else end_ns)
            w.iteration, w.progress_ns = step, end_ns
            w.completed[step] = end_ns
            w.observe_step(duration * 1e3)
            if step % LOG_INTERVAL == 0:
                w.log(step, steps, duration)
            if step % TENSOR_INTERVAL == 0:
                w.tensor_metrics(step)
            if step in (3_000, 3_001):
                w.skipped += 1
            if step == 7_000:
                w.nonfinite += 1
        now = end
        for interval, name, length_s, phase in (
            (EVAL_INTERVAL, MEGATRON_EVALUATE, 20.0, "evaluate"),
            (CHECKPOINT_INTERVAL, MEGATRON_CHECKPOINT_SAVE, 30.0, "checkpoint_save"),
        ):
            if step % interval == 0:
                stop = now + int(length_s * 1e9)
                for w in writers:
                    attributes = {MEGATRON_ITERATION: step}
                    if name == MEGATRON_CHECKPOINT_SAVE:
                        attributes.update(
                            {
                                MEGATRON_CHECKPOINT_TYPE: "global",
                                MEGATRON_CHECKPOINT_STRATEGY: "sync",
                                MEGATRON_CHECKPOINT_PATH: f"/ckpt/iter_{step:07d}",
                                MEGATRON_CHECKPOINT_SIZE: 14 * 2**30 // len(writers),
                            }
                        )
                        w.saved, w.safe_ns = step, w.completed.get(step, now + w.skew)
                    w.span(name, now + w.skew, stop + w.skew, w.root, attributes)
                    w.spend(phase, stop + w.skew)
                now = stop
        while next_export <= now:
            for w in writers:
                w.export(next_export + w.skew)
            next_export += int(EXPORT_INTERVAL_S * 1e9)
    for w in writers:
        if killed:  # no end of the run span, no final export: a SIGKILL
            w.span_start(MEGATRON_TRAIN, t0 + w.skew, None, {}, span_id=w.root)
        else:
            w.span(MEGATRON_TRAIN, t0 + w.skew, now + w.skew, None, span_id=w.root)
            w.export(now + w.skew)
        w.close()
    return now


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


COMMANDS = ("report", "trace", "health")


@dataclass
class Measured:
    """One command's run: wall and CPU seconds (all its processes), peak memory (its largest
    process), exit status, what it printed."""

    wall_s: float
    cpu_s: float
    peak_mib: float
    status: int
    stdout: str


def run_command(command: str, run_dir: Path, out: Path, source: Path | None) -> Measured:
    """Runs ``otel-training COMMAND`` on ``run_dir`` in a process of its own (with the source
    tree ``source`` first on the path when given) and measures it (``os.wait4``: the CPU time
    of the process and of the worker processes it waited for, the largest one's peak RSS)."""
    argv = [sys.executable, "-m", "otel_training.cli", command, str(run_dir)]
    argv += ["--json"] if command == "health" else ["-o", str(out / f"{command}.out")]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), env.get("PYTHONPATH", "")])
    started = time.perf_counter()
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    stdout = child.stdout.read() if child.stdout is not None else b""
    _, status, usage = os.wait4(child.pid, 0)
    wall_s = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    return Measured(
        wall_s,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        child.returncode,
        stdout.decode(errors="replace"),
    )


def _source_of(revision: str, into: Path) -> Path:
    """The ``src`` tree of git revision ``revision``, written under ``into``."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", revision, "src"], check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def _row(name: str, m: Measured) -> str:
    return f"{name:8s} {m.wall_s:7.1f} s {m.cpu_s:9.1f} s {m.peak_mib:9.0f} MiB"


def _best(runs: list[Measured]) -> Measured:
    """The round with the least CPU time (the one least disturbed by other work)."""
    return min(runs, key=lambda m: m.cpu_s)


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(
        __doc__,
        "about 5 min on 2 cores (10,000 steps, 8 ranks); twice that with --against",
        targets=False,
    )
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--step-s", type=float, default=1.2, help="mean step time, seconds")
    parser.add_argument("--attempts", type=int, default=3, help="attempts of the job")
    parser.add_argument("--keep", action="store_true", help="keep the generated directory")
    parser.add_argument("--reuse", type=Path, help="a directory kept by --keep: read it again")
    parser.add_argument("--against", metavar="REV", help="also measure git revision REV's src")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each command and tree")
    args = parser.parse_args(argv)
    directory = args.reuse or Path(tempfile.mkdtemp(prefix="otel-training-bench-report-"))
    keep = args.keep or args.reuse is not None
    scratch = Path(tempfile.mkdtemp(prefix="otel-training-bench-report-out-"))
    try:
        started = time.perf_counter()
        if args.reuse is None:
            generate(directory, args.steps, args.ranks, args.layers, args.step_s, args.attempts)
        generated_s = time.perf_counter() - started
        runs = sorted(p for p in directory.iterdir() if p.is_dir())
        input_bytes = sum(_size(r) for r in runs)
        print(
            f"job: {args.steps:,} steps, {args.ranks} ranks, {len(runs)} attempts, {args.layers} "
            f"layers, exports every {EXPORT_INTERVAL_S:g} s; {input_bytes / 2**20:,.0f} MiB of "
            f"files in {sum(len(list(r.iterdir())) for r in runs)} files (generated in "
            f"{generated_s:.1f} s); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        trees: dict[str, Path | None] = {"this tree": None}
        if args.against:
            trees = {args.against: _source_of(args.against, scratch / "before"), **trees}
        measured: dict[tuple[str, str], list[Measured]] = {}
        for command in COMMANDS:
            for _ in range(args.rounds):
                for name, source in trees.items():
                    found = run_command(command, runs[-1], scratch, source)
                    if found.status != 0:
                        print(f"{name}: otel-training {command} exited {found.status}")
                        return 1
                    measured.setdefault((name, command), []).append(found)
        print(f"{'command':8s} {'wall':>9s} {'CPU':>11s} {'peak RSS':>13s}")
        for command in COMMANDS:
            rows = {name: _best(measured[(name, command)]) for name in trees}
            for name, m in rows.items():
                print(_row(command, m) + f"  ({name})")
            if args.against:
                before, after = rows[args.against], rows["this tree"]
                ratios = (after.wall_s / before.wall_s, after.cpu_s / before.cpu_s,
                          after.peak_mib / before.peak_mib)  # fmt: skip
                print(f"{'':8s} after/before: wall %.2f, CPU %.2f, peak RSS %.2f" % ratios)
        health = json.loads(_best(measured[("this tree", "health")]).stdout)
        html_bytes = (scratch / "report.out").stat().st_size
        trace = json.loads((scratch / "trace.out").read_bytes())
        spans = sum(1 for event in trace["traceEvents"] if event.get("ph") == "X")
        stragglers = [f"rank {s['rank']} (attempt {s['attempt']}, {s['cause']}, score "
                      f"{s['score']:.2f})" for s in health["stragglers"]]  # fmt: skip
        print(
            f"report: HTML {html_bytes / 2**20:.1f} MiB ({html_bytes / input_bytes:.4f} of the "
            f"input); trace: {(scratch / 'trace.out').stat().st_size / 2**20:.1f} MiB, "
            f"{spans:,} spans; health: {len(health['attempts'])} attempts, "
            f"{health['wall_s'] / 3600:.1f} h of wall time, goodput "
            f"{100 * health['goodput']:.1f} %, lost progress "
            f"{health['badput_s']['lost_progress'] / 60:.0f} min, downtime "
            f"{health['badput_s']['downtime'] / 60:.0f} min; stragglers: "
            f"{', '.join(stragglers) or 'none'}"
        )
        if keep:
            print(f"kept: {directory}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
