"""JsonLogSpanProcessor: one strict-JSON line per span start and end, per rank."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from doc_rules import documents
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode
from support import strict_json_lines

import otel_training
from otel_training import configuration as setup
from otel_training.export.limits import DEFAULT_VALUE_LENGTH, cut_marker
from otel_training.trace.processors import JsonLogSpanProcessor, jsonlog


def _provider(path: Path, **kwargs) -> tuple[TracerProvider, JsonLogSpanProcessor]:
    resource = Resource({"service.name": "test", "dl.rank": 5, "dl.world_size": 8, "x": "y"})
    provider = TracerProvider(resource=resource)
    processor = JsonLogSpanProcessor(path, **kwargs)
    provider.add_span_processor(processor)
    return provider, processor


def test_a_span_open_when_the_writer_runs_gets_a_start_line_and_an_end_line(tmp_path):
    """Start and end lines carry name, ids, times, duration, status, attributes, events, rank."""
    path = tmp_path / "spans" / "spans-rank5.jsonl"
    provider, processor = _provider(path)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("megatron.train") as run:
        with tracer.start_as_current_span(
            "megatron.checkpoint.save", attributes={"megatron.iteration": 200}
        ) as save:
            assert processor.force_flush()  # the writer runs: both spans are open
            save.set_attribute("megatron.checkpoint.size", 1024)
            save.add_event("staged", {"shards": 3})
            save.set_status(Status(StatusCode.OK))
    provider.shutdown()
    lines = strict_json_lines(path.read_text())
    assert [(line["record"], line["name"]) for line in lines] == [
        ("span_start", "megatron.train"),
        ("span_start", "megatron.checkpoint.save"),
        ("span_end", "megatron.checkpoint.save"),
        ("span_end", "megatron.train"),
    ]
    start, end = lines[1], lines[2]
    context = save.get_span_context()
    assert start["trace_id"] == end["trace_id"] == f"{context.trace_id:032x}"
    assert start["span_id"] == end["span_id"] == f"{context.span_id:016x}"
    assert start["parent_span_id"] == f"{run.get_span_context().span_id:016x}"
    assert lines[0]["parent_span_id"] is None
    assert start["start_time_ns"] == end["start_time_ns"] == save.start_time
    assert start["attributes"] == {"megatron.iteration": 200}  # as at start
    assert set(start) == {
        "record", "name", "trace_id", "span_id", "parent_span_id", "start_time_ns",
        "attributes", "rank", "resource",
    }  # fmt: skip
    assert end["end_time_ns"] == save.end_time
    assert end["duration_ms"] == pytest.approx((save.end_time - save.start_time) / 1e6)
    assert end["status"] == "OK" and end["status_description"] is None
    assert end["attributes"] == {"megatron.iteration": 200, "megatron.checkpoint.size": 1024}
    (event,) = end["events"]
    assert event["name"] == "staged" and event["attributes"] == {"shards": 3}
    assert isinstance(event["time_ns"], int)
    for line in lines:
        assert line["rank"] == 5
        assert line["resource"] == {"service.name": "test", "dl.rank": 5, "dl.world_size": 8}


def test_a_span_that_ends_before_the_writer_runs_gets_one_line_with_all_of_it(tmp_path):
    """A span started and ended within one batch of the writer has only its end line, which
    carries what a start line would (ids, parent, start time, attributes); a span still open
    then gets its start line."""
    path = tmp_path / "spans.jsonl"
    provider, processor = _provider(path, flush_interval_s=3600)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("megatron.train") as run:
        for step in (1, 2):
            with tracer.start_as_current_span(
                "megatron.train.iteration", attributes={"megatron.iteration": step}
            ) as it:
                it.set_attribute("megatron.skipped", False)
        assert processor.force_flush()
    provider.shutdown()
    lines = strict_json_lines(path.read_text())
    assert [(line["record"], line["name"]) for line in lines] == [
        ("span_start", "megatron.train"),
        ("span_end", "megatron.train.iteration"),
        ("span_end", "megatron.train.iteration"),
        ("span_end", "megatron.train"),
    ]
    first = lines[1]
    assert first["parent_span_id"] == f"{run.get_span_context().span_id:016x}"
    assert first["attributes"] == {"megatron.iteration": 1, "megatron.skipped": False}
    assert first["start_time_ns"] < first["end_time_ns"]
    assert lines[0]["span_id"] == lines[-1]["span_id"]


def test_an_exception_event_carries_type_message_and_stack(tmp_path):
    """A failed span's end line has status ERROR and the exception event's fields."""
    path = tmp_path / "spans.jsonl"
    provider, _ = _provider(path)
    with pytest.raises(KeyError):
        with provider.get_tracer("t").start_as_current_span("megatron.checkpoint.load"):
            raise KeyError("model.layers.3")
    provider.shutdown()
    end = strict_json_lines(path.read_text())[-1]
    assert end["status"] == "ERROR"
    (event,) = end["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "KeyError"
    assert event["attributes"]["exception.message"] == "'model.layers.3'"
    assert "Traceback" in event["attributes"]["exception.stacktrace"]


def test_a_span_that_hangs_leaves_its_start_line_on_disk(tmp_path):
    """While a span is open, its start line reaches the file within the flush interval."""
    path = tmp_path / "spans.jsonl"
    provider, _ = _provider(path, flush_interval_s=0.05)
    span = provider.get_tracer("t").start_span("megatron.checkpoint.save")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not path.read_text():
        time.sleep(0.02)
    (line,) = strict_json_lines(path.read_text())
    assert (line["record"], line["name"]) == ("span_start", "megatron.checkpoint.save")
    span.end()
    provider.shutdown()


def test_non_finite_numbers_are_written_as_strings_so_the_json_is_strict(tmp_path):
    """NaN and infinities become "NaN", "Infinity", "-Infinity"; every line is strict JSON."""
    path = tmp_path / "spans.jsonl"
    provider, processor = _provider(path)
    attributes = {"loss": math.nan, "up": math.inf, "down": -math.inf, "many": (1.0, math.nan)}
    with provider.get_tracer("t").start_as_current_span("s", attributes=attributes) as span:
        assert processor.force_flush()  # the start line is written while the span is open
        span.add_event("spike", {"grad_norm": math.inf})
    provider.shutdown()
    start, end = strict_json_lines(path.read_text())
    expected = {"loss": "NaN", "up": "Infinity", "down": "-Infinity", "many": [1.0, "NaN"]}
    assert start["attributes"] == expected
    assert end["attributes"] == expected
    assert end["events"][0]["attributes"] == {"grad_norm": "Infinity"}


def test_jsonable_turns_numpy_scalars_and_tensors_into_numbers_and_never_raises():
    """numpy scalars and one-element tensors become numbers; anything else a string."""

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert jsonlog.jsonable(np.float32(0.5)) == 0.5
    assert jsonlog.jsonable(np.int16(3)) == 3
    assert jsonlog.jsonable(np.float64("nan")) == "NaN"
    assert jsonlog.jsonable(torch.tensor(1.25)) == 1.25
    assert jsonlog.jsonable(torch.tensor([7])) == 7
    assert jsonlog.jsonable(torch.zeros(2)) == str(torch.zeros(2))
    assert jsonlog.jsonable({"a": (np.int8(1), None, True)}) == {"a": [1, None, True]}
    assert jsonlog.jsonable(Broken()) == "<Broken>"
    long = jsonlog.jsonable("x" * (DEFAULT_VALUE_LENGTH + 10))
    assert len(long) == DEFAULT_VALUE_LENGTH and long.endswith(cut_marker(10 + len(cut_marker(10))))


def test_shutdown_flushes_everything_and_later_spans_are_ignored(tmp_path):
    """Shutdown writes every queued line and closes the file; it is idempotent."""
    path = tmp_path / "spans.jsonl"
    provider, processor = _provider(path, flush_interval_s=3600)
    tracer = provider.get_tracer("t")
    for step in range(500):
        with tracer.start_as_current_span("megatron.train.iteration", attributes={"i": step}):
            pass
    processor.shutdown()
    processor.shutdown()
    lines = strict_json_lines(path.read_text())
    assert {line["record"] for line in lines} == {"span_end"}  # each ended in the one batch
    assert [line["attributes"]["i"] for line in lines] == list(range(500))
    with tracer.start_as_current_span("late"):
        pass
    assert len(path.read_text().splitlines()) == 500


def test_force_flush_writes_what_was_queued(tmp_path):
    """force_flush returns True once the lines queued before it are on disk."""
    path = tmp_path / "spans.jsonl"
    provider, processor = _provider(path, flush_interval_s=3600)
    with provider.get_tracer("t").start_as_current_span("s"):
        pass
    assert processor.force_flush(5_000)
    assert [line["record"] for line in strict_json_lines(path.read_text())] == ["span_end"]
    provider.shutdown()


def test_a_full_queue_drops_records_and_counts_them(tmp_path, caplog):
    """Beyond max_queue_size records are dropped, counted, and one warning says so."""
    path = tmp_path / "spans.jsonl"
    provider, processor = _provider(path, flush_interval_s=3600, max_queue_size=3)
    tracer = provider.get_tracer("t")
    for _ in range(3):
        with tracer.start_as_current_span("s"):
            pass
    assert processor.dropped == 3
    assert sum("queue" in r.getMessage() for r in caplog.records) == 1
    provider.shutdown()


def test_a_forked_child_writes_no_line(tmp_path):
    """A forked child (a DataLoader worker) records nothing into the parent's file."""
    path = tmp_path / "spans.jsonl"
    provider, processor = _provider(path)
    tracer = provider.get_tracer("t")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        with tracer.start_as_current_span("child"):
            pass
        queued = len(processor._queue)
        processor.shutdown()
        os._exit(0 if queued == 0 else 1)
    _, status = os.waitpid(pid, 0)
    with tracer.start_as_current_span("parent"):
        pass
    provider.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0  # the child queued nothing
    assert [line["name"] for line in strict_json_lines(path.read_text())] == ["parent"]


# -- configure() ----------------------------------------------------------------------------


def test_configure_writes_span_lines_per_rank_beside_the_embedded_default(tmp_path):
    """With the embedded default, spans-rank{RANK}.jsonl is written in the output directory."""
    out = tmp_path / "out"
    telemetry = setup.configure(
        environ={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out), "RANK": "3", "WORLD_SIZE": "4"},
        set_global=False,
    )
    with otel_training.training_run():
        pass
    telemetry.shutdown()
    path = Path(telemetry.output_dir) / "spans-rank3.jsonl"
    assert path.parent.parent == out
    assert f"span JSON lines {path}" in telemetry.destination
    lines = strict_json_lines(path.read_text())
    assert [(line["record"], line["rank"]) for line in lines] == [("span_end", 3)]
    assert lines[0]["resource"]["dl.world_size"] == 4


@pytest.mark.parametrize(
    ("environ", "written"),
    [
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_PYTHON_TRAINING_JSONLOG_DIR": "{dir}"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp_json_file"}, True),
    ],
)
def test_span_lines_are_on_with_the_embedded_default_or_a_directory(tmp_path, environ, written):
    """JSON lines are written when traces use the embedded default or a directory is set."""
    directory = tmp_path / "lines"
    env = {k: v.replace("{dir}", str(directory)) for k, v in environ.items()}
    env.update(OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(directory), OTEL_METRICS_EXPORTER="none")
    telemetry = setup.configure(environ=env, set_global=False)
    telemetry.shutdown()
    assert (directory / "latest" / "spans-rank0.jsonl").exists() is written
    assert ("span JSON lines" in telemetry.destination) is written


def test_an_unwritable_directory_warns_and_configures_without_lines(tmp_path, caplog):
    """A JSON-lines directory that cannot be created logs a warning; configure() works."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    telemetry = setup.configure(
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_JSONLOG_DIR": str(blocker / "sub"),
        },
        set_global=False,
    )
    assert "span JSON lines" not in telemetry.destination
    assert any("cannot write spans" in r.getMessage() for r in caplog.records)


@documents("limits.md", "U+0085, U+2028 and U+2029 are also written as")
def test_line_separators_inside_values_are_escaped_so_each_record_is_one_line(tmp_path):
    """U+0085, U+2028 and U+2029 (which str.splitlines() takes for line ends) and a newline
    inside a name or value leave one record per line, each value intact once parsed."""
    provider, processor = _provider(tmp_path / "spans.jsonl")
    text = "a\x85b\u2028c\u2029d\ne\x00"
    with provider.get_tracer("t").start_as_current_span(text, attributes={"v": text}):
        pass
    processor.force_flush()
    raw = (tmp_path / "spans.jsonl").read_text(encoding="utf-8")
    (line,) = strict_json_lines(raw)
    assert len(raw.splitlines()) == 1 and line["name"] == text == line["attributes"]["v"]
    provider.shutdown()
