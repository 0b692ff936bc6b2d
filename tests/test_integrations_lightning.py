"""The Lightning callback on providers of its own (in memory), in a real CPU run."""

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


def _require_lightning():
    sys.path.insert(0, str(INTEGRATION))
    from framework_checks import require

    require("lightning")
    import lightning_run

    return lightning_run


def test_given_providers_get_everything_and_nothing_is_configured(tmp_path, monkeypatch):
    """meter_provider= and tracer_provider=: metrics and spans go there; configure() is not
    called, so no pipeline of the environment exists afterwards."""
    driver = _require_lightning()
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    driver.train(
        tmp_path,
        callback_kwargs={
            "meter_provider": MeterProvider(metric_readers=[reader]),
            "tracer_provider": tracer_provider,
            "tensor_metrics": "param_norm:2",
            "tokens_per_batch": lambda batch: int(batch[0][:, 1:].numel()),
        },
        trainer_kwargs={"max_steps": 4, "log_every_n_steps": 2},
    )
    assert setup.current() is None
    data = reader.get_metrics_data()
    (step,) = [p for _, p in testing.points(data, "megatron.training.step_duration_ms")]
    assert step.count == 4
    names = {name for name, _ in testing.points(data)}
    assert {"megatron.training.loss", "megatron.training.tokens_per_sec"} <= names
    assert "megatron.training.tensor.param_norm" in names
    spans = exporter.get_finished_spans()
    assert len(spans) == 1 + 1 + 4 + 4  # the run, the first iteration, iterations, updates


def test_the_callback_keeps_no_tap_after_fit(tmp_path):
    """After fit the trainer's save_checkpoint and the precision plugin are their own again."""
    driver = _require_lightning()
    testing.configure_in_memory(set_global=True)
    result = driver.train(
        tmp_path,
        callback_kwargs={"tensor_metrics": "none"},
        trainer_kwargs={"max_steps": 2, "gradient_clip_val": 1.0},
    )
    trainer = result["trainer"]
    assert "save_checkpoint" not in vars(trainer)
    assert "clip_grad_by_norm" not in vars(trainer.precision_plugin)
    assert not any(trainer.optimizers[0]._optimizer_step_post_hooks)


@pytest.mark.parametrize("package", ["lightning"])
def test_the_callback_is_a_lightning_callback(package):
    """OtelTrainingCallback is a lightning.pytorch.Callback."""
    _require_lightning()
    import lightning.pytorch

    from otel_training.integrations.lightning import OtelTrainingCallback

    assert isinstance(OtelTrainingCallback(), lightning.pytorch.Callback)
