"""Per-call cost of record_training_metrics with all eight values, side by side.

Prints, from one run, the cost per call of:

- ``otel_training``: ``record_training_metrics(meter, <eight values>)``;
- ``direct``: the same eight writes on SDK instruments created beforehand;
- ``megatron_ref``: Megatron-LM's reference behaviour as DESIGN.md section 2 describes it
  (a WeakKeyDictionary lookup of the meter's instruments, then eight synchronous SDK calls,
  ``float()`` on the grad norm, the counter added only when > 0), written anew here;

and the ratios otel_training/direct (target <= 1.2) and otel_training/megatron_ref
(target <= 1.1). Rounds alternate between the variants so drift hits all alike; the figure
per variant is the median over rounds, in wall and CPU time; the targets are judged on CPU time.

Usage: python bench/record_metrics.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import statistics
import sys
import weakref

import _verdict
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_training import record_training_metrics
from otel_training.semconv import metrics as names

VALUES = dict(
    step_duration_ms=412.5,
    loss=2.31,
    throughput_tflops=187.0,
    grad_norm=0.93,
    skipped_iters=0,
    learning_rate=3e-4,
    tokens_per_sec=81920.0,
    memory_allocated_gb=61.2,
)


def new_meter():
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return provider, provider.get_meter("bench")


def create_eight(meter) -> dict:
    return {
        "step_duration_ms": meter.create_histogram(names.MEGATRON_TRAINING_STEP_DURATION_MS, "ms"),
        "loss": meter.create_gauge(names.MEGATRON_TRAINING_LOSS),
        "throughput_tflops": meter.create_gauge(names.MEGATRON_TRAINING_THROUGHPUT_TFLOPS),
        "grad_norm": meter.create_gauge(names.MEGATRON_TRAINING_GRAD_NORM),
        "skipped_iters": meter.create_counter(names.MEGATRON_TRAINING_SKIPPED_ITERS),
        "learning_rate": meter.create_gauge(names.MEGATRON_TRAINING_LEARNING_RATE),
        "tokens_per_sec": meter.create_gauge(names.MEGATRON_TRAINING_TOKENS_PER_SEC),
        "memory_allocated_gb": meter.create_gauge(names.MEGATRON_TRAINING_MEMORY_ALLOCATED_GB),
    }


_REFERENCE_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def megatron_reference(
    meter,
    step_duration_ms=None,
    loss=None,
    throughput_tflops=None,
    grad_norm=None,
    skipped_iters=None,
    learning_rate=None,
    tokens_per_sec=None,
    memory_allocated_gb=None,
) -> None:
    """DESIGN.md section 2's description of Megatron-LM's function, nothing more."""
    found = _REFERENCE_CACHE.get(meter)
    if found is None:
        found = _REFERENCE_CACHE[meter] = create_eight(meter)
    if step_duration_ms is not None:
        found["step_duration_ms"].record(step_duration_ms)
    if loss is not None:
        found["loss"].set(loss)
    if throughput_tflops is not None:
        found["throughput_tflops"].set(throughput_tflops)
    if grad_norm is not None:
        found["grad_norm"].set(float(grad_norm))
    if skipped_iters is not None and skipped_iters > 0:
        found["skipped_iters"].add(skipped_iters)
    if learning_rate is not None:
        found["learning_rate"].set(learning_rate)
    if tokens_per_sec is not None:
        found["tokens_per_sec"].set(tokens_per_sec)
    if memory_allocated_gb is not None:
        found["memory_allocated_gb"].set(memory_allocated_gb)


def run_ours(meter, calls: int) -> None:
    for _ in range(calls):
        record_training_metrics(meter, **VALUES)


def run_reference(meter, calls: int) -> None:
    for _ in range(calls):
        megatron_reference(meter, **VALUES)


def run_direct(found: dict, calls: int) -> None:
    v = VALUES
    for _ in range(calls):
        found["step_duration_ms"].record(v["step_duration_ms"])
        found["loss"].set(v["loss"])
        found["throughput_tflops"].set(v["throughput_tflops"])
        found["grad_norm"].set(v["grad_norm"])
        found["learning_rate"].set(v["learning_rate"])
        found["tokens_per_sec"].set(v["tokens_per_sec"])
        found["memory_allocated_gb"].set(v["memory_allocated_gb"])
        # skipped_iters is 0 in VALUES: every variant skips the counter.


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(__doc__, "about 10 s on 2 cores; --quick: about 1 s")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and variant")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="200 calls, 5 rounds (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.rounds = 200, 5

    _p1, ours_meter = new_meter()
    _p2, ref_meter = new_meter()
    _p3, direct_meter = new_meter()
    direct = create_eight(direct_meter)
    variants = {
        "otel_training": lambda: run_ours(ours_meter, args.calls),
        "megatron_ref": lambda: run_reference(ref_meter, args.calls),
        "direct": lambda: run_direct(direct, args.calls),
    }
    for run in variants.values():  # warm-up: caches, instruments, aggregations
        run()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            wall, cpu = _verdict.timed(run)
            samples[name].append((wall / args.calls, cpu / args.calls))
    print(f"load: {_verdict.machine_load()}; {args.rounds} rounds interleaved (medians)")
    for name, times in samples.items():
        wall = statistics.median(t[0] for t in times)
        cpu = statistics.median(t[1] for t in times)
        print(f"{name:>14}: {wall * 1e6:7.2f} us wall, {cpu * 1e6:7.2f} us CPU per call (8 values)")

    def paired(a: str, b: str) -> dict[str, list[float]]:
        return {
            clock: _verdict.ratios([t[i] for t in samples[a]], [t[i] for t in samples[b]])
            for i, clock in enumerate(("wall", "cpu"))
        }

    verdict = _verdict.Verdict("bench")
    verdict.at_most("otel_training / direct", 1.2, unit="x", judge="cpu",
                    **paired("otel_training", "direct"))  # fmt: skip
    verdict.at_most("otel_training / megatron_ref", 1.1, unit="x", judge="cpu",
                    **paired("otel_training", "megatron_ref"))  # fmt: skip
    return verdict.exit_status()


if __name__ == "__main__":
    sys.exit(main())
