"""What the string rule costs an exporter's thread per span, side by side with encoding it.

Prints, from one run, the cost per span of:

- ``bounded_span``: :func:`otel_training.export.limits.bounded_span` of a clean span (12 attributes,
  one event: what most spans are), which the safe exporters and the span JSON lines apply to
  every span;
- ``span_cost``: its worst-case size estimate alone;
- ``encode``: the OTLP exporters' own protobuf encoding of the same span
  (``encode_spans``, what the gRPC and HTTP exporters do with it next);
- ``fit``: ``bounded_span`` of a span of 100 values of 3,000 characters over a 200 KB
  budget (the rare span that must be cut);

and the ratio bounded_span/encode (what the rule adds to an export). Rounds alternate between
the variants; the figure per variant is the median over rounds. Nothing here runs on the
training thread.

Usage: python bench/limits.py [--spans N] [--rounds R]
"""

from __future__ import annotations

import statistics
import time

import _verdict
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_training.export import limits

CONTEXT = trace_api.SpanContext(0x1234, 0x5678, is_remote=False)


def _span(attributes: dict, events=()) -> ReadableSpan:
    return ReadableSpan(
        "forward-backward",
        context=CONTEXT,
        attributes=attributes,
        events=list(events),
        start_time=1,
        end_time=2,
        resource=Resource({"service.name": "train"}),
        instrumentation_scope=InstrumentationScope("otel_training", "1.0"),
    )


def _per_call_us(call, count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - started) / count * 1e6


def main() -> None:
    parser = _verdict.parser(__doc__, "about 5 s", targets=False)
    parser.add_argument("--spans", type=int, default=5_000, help="spans per round")
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    clean = _span(
        {f"megatron.attr.{i}": (f"value-{i}" * 3 if i % 2 else i) for i in range(12)},
        [Event("checkpoint", {"path": "/ckpt/iter_0001000"}, 5)],
    )
    big = _span({f"k{i}": "x" * 3_000 for i in range(100)})
    budget = limits.Limits(record_budget_bytes=200_000)
    assert limits.bounded_span(clean) is clean  # nothing to change: the common case
    assert limits.span_cost(limits.bounded_span(big, budget)) <= 200_000
    variants = {
        "bounded_span": (lambda: limits.bounded_span(clean), options.spans),
        "span_cost": (lambda: limits.span_cost(clean), options.spans),
        "encode": (lambda: encode_spans([clean]), options.spans),
        "fit": (lambda: limits.bounded_span(big, budget), max(1, options.spans // 100)),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(options.rounds):
        for name, (call, count) in variants.items():
            samples[name].append(_per_call_us(call, count))
    median = {name: statistics.median(values) for name, values in samples.items()}
    for name, value in median.items():
        print(f"{name:<14} {value:10.2f} us per span")
    print(f"bounded_span / encode: {median['bounded_span'] / median['encode']:.2f}")


if __name__ == "__main__":
    main()
