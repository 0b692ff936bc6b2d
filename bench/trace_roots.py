"""Counts whole traces: forks the ranks of tests/integration/test_trace_shape_ranks.py (16 ranks,
28 iterations, an evaluation and a save every 14, one rank's unbounded loop of phases) under a
span budget, reads the OTLP-JSON files of the embedded default and prints the traces, the
traces with exactly one root span (no parent, or a parent exported in the same trace), the
spans whose parent is in another trace or exported by nobody, and the traces without a root.

    python bench/trace_roots.py [--budget 60] [--world 16]
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _verdict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_training.testing import parse_otlp_json

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]


def spans_of(directory: Path) -> list[tuple[str, str, str]]:
    """(trace id, span id, parent span id or "") of every exported span."""
    spans = []
    for path in sorted(directory.glob("traces-rank*.jsonl")):
        for line in path.read_text().splitlines():
            request = parse_otlp_json(line, ExportTraceServiceRequest())
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        spans.append((s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex()))
    return spans


def counts(spans: list[tuple[str, str, str]]) -> dict[str, int]:
    """traces, traces with exactly one root, spans with a parent in another trace or nowhere."""
    ids = {(trace, span) for trace, span, _ in spans}
    roots = collections.Counter()
    astray = 0
    for trace, _, parent in spans:
        if not parent:
            roots[trace] += 1
        elif (trace, parent) not in ids:
            astray += 1
    traces = {trace for trace, _, _ in spans}
    return {
        "spans": len(spans),
        "traces": len(traces),
        "traces with one root": sum(1 for t in traces if roots[t] == 1),
        "traces without a root": sum(1 for t in traces if roots[t] == 0),
        "parents in another trace or unexported": astray,
    }


def main() -> None:
    parser = _verdict.parser(__doc__, "a few seconds", targets=False)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--world", type=int, default=16)
    args = parser.parse_args()
    from test_trace_shape_ranks import CHATTY_RANK, EVERY, ITERATIONS, RANKS

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        env = {
            **os.environ,
            "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out),
            "OTEL_PYTHON_TRAINING_RUN_ID": "ranks-of-one-run",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
            "OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET": str(args.budget),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OMP_NUM_THREADS": "1",
        }
        argv = [str(args.world), str(ITERATIONS), str(EVERY), str(CHATTY_RANK)]
        argv.append(str(3 * args.budget))
        subprocess.run([sys.executable, "-c", RANKS, *argv], env=env, check=True)
        (directory,) = [p for p in out.iterdir() if p.is_dir() and p.name != "latest"]
        for key, value in counts(spans_of(directory)).items():
            print(f"{key}: {value:,}")


if __name__ == "__main__":
    main()
