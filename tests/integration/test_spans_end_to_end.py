"""`otel-training demo` end to end: its phase spans reach a real OTLP receiver with the right
names, parents and attributes; the NVTX ranges that an injection library records are balanced
and named like the spans; the JSON lines parse and match the spans."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nvtx_injection  # noqa: E402
from support import strict_json_lines  # noqa: E402

DEMO = [
    "demo", "--steps", "6", "--log-interval", "3", "--eval-interval", "3", "--eval-batches",
    "2", "--checkpoint-interval", "3", "--layers", "1", "--d-model", "32", "--heads", "2",
    "--seq-len", "32", "--batch-size", "4", "--warmup", "2", "--max-data-bytes", "200000",
    "--tensor-metrics", "none", "--quiet",
]  # fmt: skip
EXPECTED_COUNTS = {
    "megatron.train": 1,
    "megatron.startup": 1,
    "megatron.train.segment": 2,  # in the job trace, and the root of the rank's step trace
    "megatron.train.first_iteration": 1,
    "megatron.train.iteration": 6,
    "megatron.train.iteration.data_loading": 6,
    "megatron.train.iteration.forward_backward": 6,
    "megatron.train.iteration.optimizer": 6,
    "megatron.evaluate": 2,
    "megatron.checkpoint.save": 2,
}


def test_demo_spans_reach_otlp_nvtx_and_json_lines_alike(
    run_python, otlp_receiver, recorder_library, tmp_path
):
    """The demo's spans: names, parents and attributes over OTLP; balanced NVTX ranges named
    like them; JSON lines that match them one to one."""
    nvtx_output = tmp_path / "nvtx.jsonl"
    lines_dir = tmp_path / "lines"
    env = {
        **otlp_receiver.env("grpc"),
        **nvtx_injection.environment(recorder_library, nvtx_output),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all",
        "OTEL_PYTHON_TRAINING_JSONLOG_DIR": str(lines_dir),
    }
    result = run_python(module="otel_training.cli", args=DEMO, env=env, timeout_s=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NVTX domain otel_training" in result.stdout + result.stderr

    # OTLP: names, counts, parents, attributes
    spans = otlp_receiver.spans()
    assert collections.Counter(s.name for s in spans) == EXPECTED_COUNTS
    by_id = {s.span_id: s for s in spans}
    (run,) = [s for s in spans if s.name == "megatron.train"]
    (first,) = [s for s in spans if s.name == "megatron.train.first_iteration"]
    step_trace = first.trace_id  # the rank's step trace: its iterations, their phases
    (segment,) = [
        s for s in spans if s.name == "megatron.train.segment" and s.trace_id != step_trace
    ]
    (root,) = [s for s in spans if s.name == "megatron.train.segment" and s.trace_id == step_trace]
    assert not run.parent_span_id and not segment.parent_span_id  # the keeper's: the roots
    assert not root.parent_span_id and [link[1] for link in root.links] == [segment.span_id]
    assert run.status_code == "unset"
    assert {s.trace_id for s in spans} == {run.trace_id, segment.trace_id, step_trace}
    assert run.resource_attributes["dl.rank"] == 0
    assert {s.scope_name for s in spans} == {"otel_training"}
    inner = (
        "megatron.train.iteration.data_loading",
        "megatron.train.iteration.forward_backward",
        "megatron.train.iteration.optimizer",
    )
    for span in spans:
        assert span.start_time_unix_nano <= span.end_time_unix_nano
        parent = by_id.get(span.parent_span_id)
        if span.name in inner:
            assert parent.name == "megatron.train.iteration", span.name
            assert span.attributes["megatron.iteration"] == parent.attributes["megatron.iteration"]
        elif span.name == "megatron.startup":
            assert parent is run
        elif span.name == "megatron.train.iteration" and span.attributes["megatron.iteration"] == 1:
            assert parent.name == "megatron.train.first_iteration"
        elif span.name in ("megatron.train.iteration", "megatron.train.first_iteration"):
            assert parent is root, span.name  # the step trace's root, linked to the segment
            assert span.trace_id == step_trace
        elif span.name not in ("megatron.train", "megatron.train.segment"):  # saves, evaluations
            assert parent is segment, span.name
            assert span.trace_id == segment.trace_id
    iterations = sorted(
        s.attributes["megatron.iteration"] for s in spans if s.name == "megatron.train.iteration"
    )
    assert iterations == [1, 2, 3, 4, 5, 6]
    saves = sorted(
        (s for s in spans if s.name == "megatron.checkpoint.save"),
        key=lambda s: s.attributes["megatron.iteration"],
    )
    assert [s.attributes["megatron.iteration"] for s in saves] == [3, 6]
    for save, step in zip(saves, (3, 6)):
        assert save.attributes["megatron.checkpoint.type"] == "global"
        assert save.attributes["megatron.checkpoint.strategy"] == "sync"
        assert save.attributes["megatron.checkpoint.path"].endswith(f"step-{step:06d}.pt")
        assert save.attributes["megatron.checkpoint.size"] > 10_000  # a real torch.save
    assert sorted(
        s.attributes["megatron.iteration"] for s in spans if s.name == "megatron.evaluate"
    ) == [3, 6]

    # NVTX: one balanced range per span, named like it
    matched = nvtx_injection.assert_balanced(nvtx_injection.read(nvtx_output))
    assert collections.Counter(r.message for r in matched) == EXPECTED_COUNTS
    assert {r.domain for r in matched} == {"otel_training"}

    # JSON lines: an end line per span, matching the OTLP span; a start line before it for
    # the spans still open when the writer ran (the run, at least)
    lines_path = lines_dir / "latest" / "spans-rank0.jsonl"  # the run's directory
    lines = strict_json_lines(lines_path.read_text())
    starts = {line["span_id"]: line for line in lines if line["record"] == "span_start"}
    ends = {line["span_id"]: line for line in lines if line["record"] == "span_end"}
    assert set(ends) == set(by_id) and set(starts) <= set(ends)
    assert run.span_id in starts
    for span_id, span in by_id.items():
        start, end = starts.get(span_id, ends[span_id]), ends[span_id]
        assert start["name"] == end["name"] == span.name
        assert start["trace_id"] == end["trace_id"] == span.trace_id
        assert (end["parent_span_id"] or "") == span.parent_span_id
        assert end["start_time_ns"] == span.start_time_unix_nano
        assert end["end_time_ns"] == span.end_time_unix_nano
        assert end["attributes"] == span.attributes
        assert end["status"] == span.status_code.upper()
        assert start["rank"] == end["rank"] == 0
