"""The Hugging Face callback on providers of its own (in memory), in a real CPU run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_training import setup, testing

INTEGRATION = Path(__file__).resolve().parent / "integration"


def _require_transformers():
    sys.path.insert(0, str(INTEGRATION))
    from framework_checks import require

    require("transformers")
    require("accelerate")
    import transformers_run

    return transformers_run


def _value(data, name):
    (point,) = [p for _, p in testing.points(data, name)]
    return point


def test_given_providers_tokens_per_sample_and_flops_per_token(tmp_path, monkeypatch):
    """meter_provider=/tracer_provider= get everything (nothing configured); tokens come from
    tokens_per_sample, TFLOP/s from flops_per_token times the per-device rate."""
    driver = _require_transformers()
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    result = driver.train(
        tmp_path,
        callback_kwargs={
            "meter_provider": MeterProvider(metric_readers=[reader]),
            "tracer_provider": tracer_provider,
            "tensor_metrics": "none",
            "tokens_per_sample": 10,
            "flops_per_token": 2e6,
        },
        args_kwargs={"max_steps": 4, "gradient_accumulation_steps": 2, "logging_steps": 2},
    )
    assert setup.current() is None
    data = reader.get_metrics_data()
    assert _value(data, "megatron.training.step_duration_ms").count == 4
    rate = _value(data, "megatron.training.tokens_per_sec").value
    tflops = _value(data, "megatron.training.throughput_tflops").value
    assert tflops == pytest.approx(2e6 * rate / 1e12, rel=1e-12)
    last = [h for h in result["trainer"].state.log_history if "loss" in h][-1]
    assert _value(data, "megatron.training.loss").value == pytest.approx(last["loss"], rel=1e-6)
    assert len(exporter.get_finished_spans()) == 1 + 1 + 4 + 4  # run, first iteration, ...updates


def test_the_callback_is_a_trainer_callback():
    """OtelTrainingCallback is a transformers.TrainerCallback."""
    _require_transformers()
    import transformers

    from otel_training.integrations.transformers import OtelTrainingCallback

    assert isinstance(OtelTrainingCallback(), transformers.TrainerCallback)


def test_the_exception_hook_always_calls_the_programs_and_never_clobbers_it(monkeypatch):
    """The run's sys.excepthook passes every exception on to the program's hook, even when
    recording it raises; removed while the program has chained its own hook on top, it leaves
    the program's in place and from then on only passes exceptions on."""
    _require_transformers()
    from otel_training.integrations.transformers import OtelTrainingCallback

    seen, recorded = [], []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(("program", kind)))
    callback = OtelTrainingCallback()

    def failing_record(exception):
        recorded.append(type(exception))
        raise ZeroDivisionError("recording failed")

    monkeypatch.setattr(callback, "record_exception", failing_record)
    callback._hook_exceptions()
    ours = sys.excepthook
    sys.excepthook(RuntimeError, RuntimeError("first"), None)

    def program_on_top(kind, value, tb):
        seen.append(("on top", kind))
        ours(kind, value, tb)

    sys.excepthook = program_on_top
    callback._unhook()
    assert sys.excepthook is program_on_top
    sys.excepthook(ValueError, ValueError("second"), None)
    assert recorded == [RuntimeError]
    assert seen == [("program", RuntimeError), ("on top", ValueError), ("program", ValueError)]
