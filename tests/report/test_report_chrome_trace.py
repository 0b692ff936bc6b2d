"""report.chrome_trace: the trace file checked event by event against the span JSON lines that
the real span pipeline wrote for two ranks."""

from __future__ import annotations

import json
import time

import pytest
from support import strict_json

import otel_training as ot
from otel_training import configuration as setup
from otel_training import testing
from otel_training.report import (
    build_chrome_trace,
    find_run_directory,
    load_run,
    write_chrome_trace,
)
from otel_training.semconv.attributes import (
    MEGATRON_CHECKPOINT_STRATEGY,
    MEGATRON_CHECKPOINT_TYPE,
    OTEL_TRAINING_SPAN_TRUNCATED,
)
from otel_training.semconv.spans import MEGATRON_CHECKPOINT_SAVE, MEGATRON_EVALUATE


def _record_rank(output_dir, rank: int) -> None:
    """One rank of a run through the real pipeline: span JSON lines and OTLP-JSON traces."""
    environ = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "OTEL_PYTHON_TRAINING_RUN_ID": "trace-test-run",
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(output_dir),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
    }
    telemetry = setup.configure(environ=environ)
    try:
        with ot.training_run():
            with ot.startup():
                time.sleep(0.002)
            for step in (1, 2, 3):
                with ot.training_iteration(iteration=step):
                    with ot.data_loading(iteration=step):
                        pass
                    with ot.forward_backward(iteration=step):
                        time.sleep(0.001)
                    with ot.optimizer_step(iteration=step):
                        pass
            with pytest.raises(RuntimeError):
                with ot.evaluation(iteration=3):
                    raise RuntimeError("evaluation failed")
            # A save that never ends: shutdown ends it as truncated (an end line that says so).
            ot.SpanRecorder().start(
                MEGATRON_CHECKPOINT_SAVE,
                attributes={
                    MEGATRON_CHECKPOINT_TYPE: "global",
                    MEGATRON_CHECKPOINT_STRATEGY: "sync",
                },
            )
            time.sleep(0.002)
    finally:
        telemetry.shutdown()
        testing.reset()


@pytest.fixture
def two_ranks(tmp_path):
    """A run directory of two ranks, and its span JSON lines as written (decoded here)."""
    for rank in (0, 1):
        _record_rank(tmp_path / "out", rank)
    run_dir = find_run_directory(tmp_path / "out")
    records = []
    for rank in (0, 1):
        with open(run_dir / f"spans-rank{rank}.jsonl", encoding="utf-8") as handle:
            records += [json.loads(line) for line in handle]
    return run_dir, records


def test_every_span_is_one_complete_event_with_its_times(two_ranks, tmp_path):
    """Count, ids, ranks, start and duration of each X event match the span's JSON lines."""
    run_dir, records = two_ranks
    path = write_chrome_trace(load_run(run_dir), tmp_path / "trace.json")
    trace = strict_json(path.read_bytes())
    assert trace["displayTimeUnit"] == "ms"
    spans = {r["span_id"]: r for r in records}  # a span's last line: its end when it ended
    ends = {r["span_id"]: r for r in records if r["record"] == "span_end"}
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(spans) == len({e["args"]["span_id"] for e in slices})
    assert {e["args"]["span_id"] for e in slices} == set(spans)
    t0 = min(r["start_time_ns"] for r in records)
    assert trace["otherData"]["ts0_unix_ns"] == t0
    last_by_rank = {}
    for r in records:
        last = max(r["start_time_ns"], r.get("end_time_ns") or 0)
        last_by_rank[r["rank"]] = max(last_by_rank.get(r["rank"], 0), last)
    for event in slices:
        start = spans[event["args"]["span_id"]]  # name, rank, start and parent on both lines
        assert event["name"] == start["name"]
        assert event["pid"] == start["rank"] + 1
        assert event["ts"] == pytest.approx((start["start_time_ns"] - t0) / 1000, abs=1e-3)
        assert event["args"]["parent_span_id"] == start["parent_span_id"]
        end = ends.get(start["span_id"])
        if end is not None:
            assert event["dur"] == pytest.approx(
                (end["end_time_ns"] - start["start_time_ns"]) / 1000, abs=1e-3
            )
            assert event["args"]["status"] == end["status"]
            assert "open" not in event["args"]
        else:  # never ended: open until the last time of its rank, and marked
            expected = last_by_rank[start["rank"]] - start["start_time_ns"]
            assert event["dur"] == pytest.approx(expected / 1000, abs=1e-3)
            assert event["args"]["open"] is True and "truncated" in event["cat"].split(",")
    hung = [e for e in slices if e["name"] == MEGATRON_CHECKPOINT_SAVE]
    assert len(hung) == 2
    assert all(e["args"][OTEL_TRAINING_SPAN_TRUNCATED] is True for e in hung)
    assert all("truncated" in e["cat"].split(",") and "open" not in e["args"] for e in hung)
    failed = [e for e in slices if e["name"] == MEGATRON_EVALUATE]
    assert len(failed) == 2
    assert all(e["args"]["status"] == "ERROR" and "error" in e["cat"].split(",") for e in failed)
    assert all(e["args"]["megatron.iteration"] == 3 for e in failed)
    exceptions = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "exception"]
    assert len(exceptions) == 2  # the evaluation's exception event, as an instant on its thread


def test_one_process_per_rank_and_strictly_nested_threads(two_ranks):
    """One named, ordered process per rank; slices nest strictly per thread, inside parents."""
    run_dir, records = two_ranks
    events = build_chrome_trace(load_run(run_dir))["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {1: "rank 0", 2: "rank 1"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert order == {1: 0, 2: 1}
    named_threads = {
        (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    slices = [e for e in events if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} <= named_threads
    by_id = {e["args"]["span_id"]: e for e in slices}
    nested_children = 0
    for event in slices:
        parent = by_id.get(event["args"]["parent_span_id"] or "")
        if parent is not None and parent["tid"] == event["tid"]:
            assert parent["ts"] <= event["ts"] + 1e-3
            assert event["ts"] + event["dur"] <= parent["ts"] + parent["dur"] + 1e-3
            nested_children += 1
    # Children of spans of their own rank in the files (rank 1's run and segment spans name
    # rank 0's, the roots of the shared traces, as their parents: another process, never nested).
    spans = {r["span_id"]: r for r in records}
    iterations_and_children = sum(
        1
        for r in spans.values()
        if r["parent_span_id"] in spans and spans[r["parent_span_id"]]["rank"] == r["rank"]
    )
    assert nested_children >= iterations_and_children - 2  # all but the failed/hung oddities
    by_thread = {}
    for event in slices:
        by_thread.setdefault((event["pid"], event["tid"]), []).append(event)
    for thread_slices in by_thread.values():
        stack = []
        for event in sorted(thread_slices, key=lambda e: (e["ts"], -e["dur"])):
            end = event["ts"] + event["dur"]
            while stack and stack[-1] <= event["ts"] + 1e-3:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, "slices on one thread overlap"
            stack.append(end)


def test_the_traces_files_alone_give_the_same_slices(two_ranks):
    """Without span JSON lines, the OTLP-JSON traces give one slice per ended span."""
    run_dir, records = two_ranks
    for rank in (0, 1):
        (run_dir / f"spans-rank{rank}.jsonl").unlink()
    slices = [e for e in build_chrome_trace(load_run(run_dir))["traceEvents"] if e["ph"] == "X"]
    ended = {r["span_id"] for r in records if r["record"] == "span_end"}
    assert {e["args"]["span_id"] for e in slices} == ended
    assert all(e["args"]["source"] == "traces" for e in slices)
