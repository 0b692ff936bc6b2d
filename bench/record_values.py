"""Added cost of the ``training_values`` record: record_training_metrics with it on vs off.

Each call of ``record_training_metrics`` with a value of a log interval also queues one
``training_values`` line where the embedded default writes span JSON lines (docs/spans.md). This
bench measures, in one run, the cost per call on the calling thread of:

- ``record_off``: ``record_training_metrics(meter, <eight values>)`` with no record (OTLP only);
- ``record_on``: the same call, its record queued to a real ``JsonLogSpanProcessor`` writing
  to a temporary file (the writer thread serialises and writes it in the background);

and prints the ratio record_on / record_off (target <= 1.25: the record is one dict and one
queue append against eight SDK writes). Rounds alternate between the variants so drift hits
both alike; the figure per variant is the median over rounds, in wall time and in the calling
thread's CPU time (the writer thread's work is not the training thread's); the target is judged
on the calling thread's CPU time. A log interval is one call per tens of steps: this is a cost
per log interval, not per step.

Usage: python bench/record_values.py [--calls N] [--rounds R] [--quick]  (about 10 s on 2
cores; --quick about 1 s). Exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from otel_training.metrics import instruments
from otel_training.trace.processors.jsonlog import JsonLogSpanProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_metrics import VALUES  # noqa: E402  the values bench-record-metrics records

TARGET = 1.25


def _calls(meter, count: int) -> tuple[float, float]:
    """Wall and calling-thread CPU seconds of ``count`` calls."""
    record = instruments.record_training_metrics
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(count):
        record(meter, **VALUES)
    return time.perf_counter() - wall, time.thread_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and variant")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="200 calls, 5 rounds (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.rounds = 200, 5

    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    meter = provider.get_meter("bench")
    resource = Resource.create({"dl.rank": 0, "service.name": "bench"})
    with tempfile.TemporaryDirectory() as directory:
        lines = JsonLogSpanProcessor(Path(directory) / "spans-rank0.jsonl")

        def sink(record: dict) -> None:  # what configure() installs (setup._values_sink)
            lines.write_record(record, resource, wake=False)

        sinks = {"record_off": None, "record_on": sink}
        for chosen in sinks.values():  # warm-up: caches, instruments, the writer
            instruments.write_values_to(chosen)
            _calls(meter, args.calls)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in sinks}
        try:
            for _ in range(args.rounds):
                for name, chosen in sinks.items():
                    instruments.write_values_to(chosen)
                    wall, cpu = _calls(meter, args.calls)
                    samples[name].append((wall / args.calls, cpu / args.calls))
        finally:
            instruments.write_values_to(None)
            lines.shutdown()
        written = sum(1 for _ in open(lines.path, encoding="utf-8"))
    print(f"{args.rounds} rounds of {args.calls} calls interleaved (medians); "
          f"{written} training_values lines written, {lines.dropped} dropped")  # fmt: skip
    medians = {}
    for name, times in samples.items():
        wall = statistics.median(t[0] for t in times)
        cpu = statistics.median(t[1] for t in times)
        medians[name] = (wall, cpu)
        print(f"{name:>11}: {wall * 1e6:7.2f} us wall, {cpu * 1e6:7.2f} us CPU per call (8 values)")
    ratios = [on[1] / off[1] for on, off in zip(samples["record_on"], samples["record_off"])]
    ratio = statistics.median(ratios)
    spread = (min(ratios), max(ratios))
    added = (medians["record_on"][1] - medians["record_off"][1]) * 1e6
    wall_ratio = medians["record_on"][0] / medians["record_off"][0]
    print(
        f"ratio record_on / record_off = {ratio:.3f} (CPU of the calling thread, paired rounds "
        f"{spread[0]:.2f}-{spread[1]:.2f}; wall {wall_ratio:.3f}); added {added:.2f} us per "
        f"call; target <= {TARGET}"
    )
    if ratio > TARGET:
        print(f"MISSED: record_on / record_off {ratio:.3f} > {TARGET}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
