"""NvtxSpanProcessor against real NVTX: a C injection library records every range.

NVTX v3 loads the library named by NVTX_INJECTION64_PATH at the first NVTX call of a process,
so each case runs in a child process that has it in its environment.
"""

from __future__ import annotations

import os
import sys

import nvtx_injection
import pytest
from opentelemetry.trace import INVALID_SPAN
from support import not_here

import otel_training
import otel_training.testing
from otel_training.phases import LedgerPhase, SpanPhase
from otel_training.semconv import spans as names
from otel_training.trace.processors import NvtxSpanProcessor, nvtx

pytestmark = pytest.mark.slow  # built with gcc; each case in a child process

PREAMBLE = """
import threading, time
from opentelemetry.sdk.trace import TracerProvider
from otel_training.trace.processors import NvtxSpanProcessor
processor = NvtxSpanProcessor()
assert processor.active, "the recorder is not attached"
provider = TracerProvider()
provider.add_span_processor(processor)
tracer = provider.get_tracer("test")
"""


def test_nested_spans_on_one_thread_are_balanced_named_and_categorised(record):
    """Nested spans give one range each, named like the span, with the group's category and
    colour, in the otel_training domain."""
    records = record(
        PREAMBLE
        + """
with tracer.start_as_current_span("megatron.train"):
    with tracer.start_as_current_span("megatron.train.iteration"):
        with tracer.start_as_current_span("megatron.train.iteration.forward_backward"):
            pass
        with tracer.start_as_current_span("megatron.train.iteration.optimizer"):
            pass
    with tracer.start_as_current_span("my.own.phase"):
        pass
provider.shutdown()
"""
    )
    matched = nvtx_injection.assert_balanced(records)
    assert [(r.message, r.category) for r in matched] == [
        (names.MEGATRON_TRAIN, "job"),
        (names.MEGATRON_TRAIN_ITERATION, "step"),
        (names.MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD, "forward_backward"),
        (names.MEGATRON_TRAIN_ITERATION_OPTIMIZER, "optimizer"),
        ("my.own.phase", "custom"),
    ]
    assert {r.domain for r in matched} == {"otel_training"}
    assert [r.color for r in matched] == [
        nvtx.GROUP_COLORS[g] for g in ("job", "step", "forward_backward", "optimizer", "custom")
    ]
    assert len({r.start_tid for r in matched} | {r.end_tid for r in matched}) == 1
    # nested: each child range starts after and ends before its parent
    run, iteration, forward_backward, _, _ = matched
    assert run.start_index < iteration.start_index < forward_backward.start_index
    assert forward_backward.end_index < iteration.end_index < run.end_index


def test_a_span_ended_on_another_thread_ends_its_range(record):
    """A span started on the main thread and ended on another gives one balanced range."""
    records = record(
        PREAMBLE
        + """
span = tracer.start_span("megatron.checkpoint.save")
worker = threading.Thread(target=span.end)
worker.start()
worker.join()
provider.shutdown()
"""
    )
    (only,) = nvtx_injection.assert_balanced(records)
    assert only.message == names.MEGATRON_CHECKPOINT_SAVE
    assert only.category == "checkpoint"
    assert only.start_tid != only.end_tid


def test_overlapping_spans_that_end_out_of_order_stay_balanced(record):
    """A parent that ends before its child, and interleaved spans, end the right ranges."""
    records = record(
        PREAMBLE
        + """
from opentelemetry import trace
a = tracer.start_span("a.first")
b = tracer.start_span("b.second", trace.set_span_in_context(a))
c = tracer.start_span("c.third")
a.end()
c.end()
b.end()
provider.shutdown()
"""
    )
    matched = nvtx_injection.assert_balanced(records)
    ends = sorted(matched, key=lambda r: r.end_index)
    assert [r.message for r in ends] == ["a.first", "c.third", "b.second"]


def test_an_exception_inside_a_phase_still_ends_its_range(record):
    """A phase left by an exception has its range ended; configure() installs the processor."""
    records = record(
        """
import otel_training
telemetry = otel_training.configure(service_name="nvtx-test")
assert "NVTX domain otel_training" in telemetry.destination, telemetry.destination
try:
    with otel_training.training_run():
        with otel_training.training_iteration(iteration=1):
            raise RuntimeError("diverged")
except RuntimeError:
    pass
telemetry.shutdown()
""",
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="per_step",
    )
    matched = nvtx_injection.assert_balanced(records)
    assert [r.message for r in matched] == [
        names.MEGATRON_TRAIN,
        names.MEGATRON_TRAIN_SEGMENT,
        names.MEGATRON_TRAIN_SEGMENT,  # the root of the rank's step trace
        names.MEGATRON_TRAIN_FIRST_ITERATION,
        names.MEGATRON_TRAIN_ITERATION,
    ]


def test_many_threads_ending_each_others_spans_stay_balanced(record):
    """Four threads start spans that the next thread ends: every range is balanced."""
    records = record(
        PREAMBLE
        + """
import queue
handoff = [queue.Queue() for _ in range(4)]
def work(i):
    for n in range(200):
        handoff[(i + 1) % 4].put(tracer.start_span(f"t{i}"))
        handoff[i].get().end()
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
provider.shutdown()
"""
    )
    matched = nvtx_injection.assert_balanced(records)
    assert len(matched) == 800
    assert sum(r.start_tid != r.end_tid for r in matched) == 800


def test_shutdown_ends_the_ranges_of_spans_never_ended(record):
    """At shutdown, ranges of spans still open are ended, so the trace is balanced."""
    records = record(
        PREAMBLE
        + """
hung = tracer.start_span("megatron.checkpoint.save")
provider.shutdown()
"""
    )
    (only,) = nvtx_injection.assert_balanced(records)
    assert only.message == names.MEGATRON_CHECKPOINT_SAVE


def test_the_domain_comes_from_the_environment(record):
    """OTEL_PYTHON_TRAINING_NVTX_DOMAIN names the domain of the ranges."""
    records = record(
        """
import otel_training
telemetry = otel_training.configure()
with otel_training.training_run():
    pass
telemetry.shutdown()
""",
        OTEL_PYTHON_TRAINING_NVTX_DOMAIN="my_job",
    )
    (only,) = nvtx_injection.assert_balanced(records)
    assert only.domain == "my_job"


@pytest.mark.parametrize(
    "env",
    [{"OTEL_PYTHON_TRAINING_NVTX": "false"}, {"NVTX_DISABLE": "1"}],
    ids=["otel_switch", "nvtx_disable"],
)
def test_disabled_nvtx_makes_no_nvtx_call_at_all(record, env):
    """With NVTX switched off, not a single NVTX call reaches the tool (not even its init)."""
    records = record(
        """
import otel_training
telemetry = otel_training.configure()
assert "NVTX" not in telemetry.destination
with otel_training.training_run():
    with otel_training.checkpoint_save("x"):
        pass
telemetry.shutdown()
""",
        **env,
    )
    assert records == []


def test_a_deferred_span_closes_its_range_when_the_phase_exits(record):
    """A phase whose span waits for a device value ends its NVTX range at exit, before the
    span itself ends on the background thread."""
    records = record(
        """
import os, threading, json
import otel_training
telemetry = otel_training.configure()
release = threading.Event()
class DeviceScalar:
    device = "cuda:0"
    def __float__(self):
        release.wait(10)
        return 1.5
with otel_training.training_iteration(iteration=1) as it:
    it.set_attribute("megatron.training.loss", DeviceScalar())
with open(os.environ["NVTX_RECORDER_OUTPUT"]) as f:
    ops = [json.loads(line)["op"] for line in f]
assert ops.count("end") == 1, ops  # the range ended at exit, the span has not
release.set()
telemetry.shutdown()
""",
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="step",
    )
    (only,) = nvtx_injection.assert_balanced(records)
    assert only.message == names.MEGATRON_TRAIN_ITERATION


# -- without a tool ------------------------------------------------------------------------


def test_without_a_tool_the_processor_is_inert(monkeypatch):
    """No injection library attached: the nvtx package gives a dummy domain; nothing runs."""
    if os.environ.get("NVTX_INJECTION64_PATH"):
        not_here("a tool is attached to this test process")
    processor = NvtxSpanProcessor()
    assert not processor.active
    processor.on_start(object())  # not even looked at
    processor.on_end(object())
    processor.shutdown()


def test_without_the_nvtx_module_the_processor_is_inert(monkeypatch):
    """When nvtx cannot be imported the processor is inert and raises nothing."""
    monkeypatch.setitem(sys.modules, "nvtx", None)
    processor = NvtxSpanProcessor()
    assert not processor.active
    processor.on_start(object())
    processor.on_end(object())
    assert processor.force_flush()


def test_a_disabled_processor_does_not_import_nvtx(monkeypatch):
    """enabled=False makes the processor inert before it imports nvtx."""

    class Trap:
        def __getattr__(self, name):
            raise AssertionError("nvtx was used")

    monkeypatch.setitem(sys.modules, "nvtx", Trap())
    processor = NvtxSpanProcessor(enabled=False)
    assert not processor.active and processor.domain == "otel_training"


def test_an_unusable_nvtx_switch_warns_once_and_keeps_nvtx_on(caplog):
    """OTEL_PYTHON_TRAINING_NVTX=maybe logs one warning naming it; NVTX stays on."""
    from otel_training import config

    with caplog.at_level("WARNING"):
        settings = config.load({"OTEL_PYTHON_TRAINING_NVTX": "maybe"})
    assert settings.nvtx is True
    assert settings.nvtx_domain == "otel_training"
    assert [r for r in caplog.records if "OTEL_PYTHON_TRAINING_NVTX" in r.getMessage()]
    assert len(caplog.records) == 1
    assert config.load({"NVTX_DISABLE": "1"}).nvtx is False
    assert config.load({"OTEL_PYTHON_TRAINING_NVTX_DOMAIN": "job7"}).nvtx_domain == "job7"


def test_nvtx_only_groups_give_push_pop_ranges_and_no_spans(record):
    """With OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS=fine, layer and micro-batch phases are
    push/pop ranges with the group's category (nested on their thread), and no span; the
    iteration around them is still a span with its start/end range."""
    records = record(
        """
import otel_training as ot
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
telemetry = ot.configure(span_processors=[SimpleSpanProcessor(exporter)])
with ot.training_iteration(iteration=1):
    for _ in range(3):
        with ot.microbatch("forward"):
            with ot.layer("forward", layer_number=1):
                with ot.layer("mlp", layer_number=1):
                    pass
telemetry.shutdown()
assert [s.name for s in exporter.get_finished_spans()] == ["megatron.train.iteration"]
""",
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="step,microbatch,layer",
        OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS="fine",
    )
    categories = {(r["domain"], r["category"]): r["name"] for r in records if r["op"] == "category"}
    pushes = [r for r in records if r["op"] == "push"]
    assert [r["message"] for r in pushes] == [
        names.MEGATRON_MICROBATCH_FORWARD,
        names.MEGATRON_LAYER_FORWARD,
        names.MEGATRON_LAYER_MLP,
    ] * 3
    assert [categories[(r["domain"], r["category"])] for r in pushes[:3]] == [
        "microbatch",
        "layer",
        "layer",
    ]
    stack = 0
    for r in records:  # balanced and nested on one thread
        stack += {"push": 1, "pop": -1}.get(r["op"], 0)
        assert stack >= 0
    assert stack == 0 and len(pushes) == 9
    (only,) = nvtx_injection.ranges(records)
    assert only.message == names.MEGATRON_TRAIN_ITERATION


def test_nvtx_only_phases_without_a_tool_are_the_shared_no_op():
    """Without an NVTX tool attached an NVTX-only phase makes no range and no span: the shared
    no-op, or, for a phase of the health ledger, the small object that only feeds it."""
    otel_training.testing.configure_in_memory(
        {
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all",
            "OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS": "layer,activation_offload",
        }
    )
    offload = otel_training.activation_offload("offload")
    assert offload is otel_training.spans.NOOP_PHASE
    layer = otel_training.layer("forward", layer_number=1)
    assert type(layer) is LedgerPhase and layer.span is INVALID_SPAN
    assert type(otel_training.microbatch("forward")) is SpanPhase


def test_the_recorders_buffer_mode_counts_every_call_without_writing_them(record):
    """NVTX_RECORDER_MODE=buffer (the benchmarks' profiler-like tool) keeps the calls in
    memory and writes one summary line at exit: 2 per span range, 2 per NVTX-only phase."""
    five_steps = """
import otel_training as ot
telemetry = ot.configure()
for step in range(1, 6):
    with ot.training_iteration(iteration=step):
        with ot.layer("forward", layer_number=1):
            pass
telemetry.shutdown()
"""
    groups = {
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "step,layer",
        "OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS": "layer",
    }
    (summary,) = record(five_steps, **groups, NVTX_RECORDER_MODE="buffer")
    assert summary["op"] == "summary"
    counted = record(five_steps, **groups)
    assert counted[0] == summary  # the same output file: the buffered run's line first
    counted = counted[1:]
    assert summary["events"] == len(counted)  # the same calls, one event each
    assert sum(r["op"] in ("start", "end", "push", "pop") for r in counted) == 5 * 2 * 2
