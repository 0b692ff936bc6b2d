"""Span times from one clock per process (issue 15 item 6): a wall clock stepped by an hour
between the start and the end of a phase distorts no duration, none is negative, and the JSON
lines and the OTLP export carry the same times."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import opentelemetry.sdk.trace as sdk_trace
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_training as ot
from otel_training import configuration as setup
from otel_training.semconv import spans as names

HOUR_NS = 3_600 * 10**9


class SteppedWallClock:
    """The host's wall clock, as ``time.time_ns``/``time.time`` and the SDK's own reference
    to it, moved by whole steps as NTP (or ``date -s``) moves it; the monotonic clock
    (``perf_counter``) is not touched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset_ns = 0
        real_ns, real_s = time.time_ns, time.time
        monkeypatch.setattr(time, "time_ns", lambda: real_ns() + self.offset_ns)
        monkeypatch.setattr(time, "time", lambda: real_s() + self.offset_ns / 1e9)
        monkeypatch.setattr(sdk_trace, "time_ns", time.time_ns)

    def step(self, by_ns: int) -> None:
        self.offset_ns += by_ns


class Elapsed:
    """Monotonic bounds of a block: inner (inside the phase) and outer (around it), in ns."""

    def __init__(self) -> None:
        self.outer_start = self.inner_start = self.inner_end = self.outer_end = 0


@pytest.fixture
def stepped(monkeypatch) -> SteppedWallClock:
    return SteppedWallClock(monkeypatch)


def test_a_wall_clock_step_distorts_no_span(tmp_path, stepped):
    """The wall clock jumps +1 h inside one phase and -1 h inside another (and in a deferred
    end, a segment, an event, an exception, a span truncated at shutdown): every exported
    duration lies between the monotonic time inside and around its block, none is negative,
    events lie inside their spans, and the JSON lines carry the OTLP file's times exactly."""
    from test_spans import _DeviceScalar

    exporter = InMemorySpanExporter()
    telemetry = setup.configure(
        environ={
            "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all",
        },
        span_processors=[SimpleSpanProcessor(exporter)],
        set_global=False,
    )
    bounds: dict[tuple[str, int], Elapsed] = {}

    def timed(key: tuple[str, int], phase, step_ns: int, body=None):
        bound = bounds[key] = Elapsed()
        bound.outer_start = time.perf_counter_ns()
        try:
            with phase as handle:
                bound.inner_start = time.perf_counter_ns()
                stepped.step(step_ns)
                time.sleep(0.002)
                if body is not None:
                    body(handle)
                bound.inner_end = time.perf_counter_ns()
        except ValueError:
            pass  # inner_end: taken before it raised
        bound.outer_end = time.perf_counter_ns()

    def failing(handle) -> None:
        handle.add_event("loss_spike", {"loss": 9.0})
        bounds[(names.MEGATRON_EVALUATE, 2)].inner_end = time.perf_counter_ns()
        raise ValueError("diverged")

    release = threading.Event()
    release.set()
    loss = _DeviceScalar(2.0, release)
    run = ot.SpanRecorder().start_phase(ot.training_run)
    timed((names.MEGATRON_TRAIN_FIRST_ITERATION, 1), ot.training_iteration(iteration=1), +HOUR_NS)
    timed(
        (names.MEGATRON_TRAIN_ITERATION, 2),
        ot.training_iteration(iteration=2, record_step_duration=True),
        -HOUR_NS,
        lambda it: it.set_attribute("megatron.training.loss", loss),  # a deferred end
    )
    timed((names.MEGATRON_EVALUATE, 2), ot.evaluation(iteration=2), -HOUR_NS, failing)
    stepped.step(+2 * HOUR_NS)  # between phases, before the segment and the run end
    ot.SpanRecorder().start_phase(ot.checkpoint_save, "/ckpt", iteration=2)  # never stopped
    stepped.step(-3 * HOUR_NS)
    run.stop()  # ends the run and its segment
    assert telemetry.shutdown(timeout_millis=10_000)  # truncates the checkpoint save

    spans = exporter.get_finished_spans()
    finished = {  # the segment span: the job trace's (the step trace's root ends with it)
        (s.name, s.attributes.get("megatron.iteration")): s for s in reversed(spans)
    }
    for span in spans:
        assert span.end_time >= span.start_time, span.name
        for event in span.events:
            assert span.start_time <= event.timestamp <= span.end_time, (span.name, event.name)
    for key, bound in bounds.items():
        duration = finished[key].end_time - finished[key].start_time
        inside, around = bound.inner_end - bound.inner_start, bound.outer_end - bound.outer_start
        assert 0 < inside <= duration <= around, key
    truncated = finished[(names.MEGATRON_CHECKPOINT_SAVE, 2)]
    assert truncated.attributes["otel_training.span.truncated"] is True
    segment = finished[(names.MEGATRON_TRAIN_SEGMENT, None)]
    run_span = finished[(names.MEGATRON_TRAIN, None)]
    # 2 h forward then 3 h back since the run began, yet every span lies inside the run.
    assert run_span.end_time - run_span.start_time < 60 * 10**9
    for span in spans:
        if span is not run_span:
            assert run_span.start_time <= span.start_time <= span.end_time, span.name
    assert segment.end_time <= run_span.end_time

    json_lines = _json_line_times(Path(telemetry.output_dir, "spans-rank0.jsonl"))
    otlp = _otlp_times(Path(telemetry.output_dir, "traces-rank0.jsonl"))
    ours = {f"{s.context.span_id:016x}": (s.start_time, s.end_time) for s in spans}
    assert json_lines == otlp == ours


def _json_line_times(path: Path) -> dict[str, tuple[int, int]]:
    ends = [json.loads(line) for line in path.read_text().splitlines() if '"span_end"' in line]
    return {e["span_id"]: (e["start_time_ns"], e["end_time_ns"]) for e in ends}


def _otlp_times(path: Path) -> dict[str, tuple[int, int]]:
    times = {}
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    times[span["spanId"]] = (
                        int(span["startTimeUnixNano"]),
                        int(span["endTimeUnixNano"]),
                    )
    return times


def test_the_step_duration_is_the_span_duration_under_a_clock_step(stepped):
    """A step-duration point is the difference of the same two clock readings as its span:
    equal to the span's duration, the wall clock stepped back an hour inside it."""
    from otel_training import testing

    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"})
    with ot.training_iteration(iteration=5, record_step_duration=True):  # the first: wrapped
        pass
    with ot.training_iteration(iteration=6, record_step_duration=True):
        stepped.step(-HOUR_NS)
        time.sleep(0.001)
    spans = [
        s for s in pipeline.spans.get_finished_spans() if s.name == names.MEGATRON_TRAIN_ITERATION
    ]
    points = [p for _, p in pipeline.points("megatron.training.step_duration_ms")]
    assert points[0].count == 2
    assert points[0].max >= 1.0  # the stepped one is still at least its 1 ms sleep
    durations_ms = sorted((s.end_time - s.start_time) / 1e6 for s in spans)
    assert points[0].sum == pytest.approx(sum(durations_ms))
    assert points[0].max == pytest.approx(durations_ms[-1])
