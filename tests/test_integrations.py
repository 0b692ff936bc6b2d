"""otel_training.integrations without the frameworks, and the callbacks' argument checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import child_env, import_or_unavailable

from otel_training.integrations import _recorder

SRC = str(Path(__file__).resolve().parents[1] / "src")
FRAMEWORKS = ("lightning", "pytorch_lightning", "transformers", "accelerate")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120
    )


def test_importing_otel_training_imports_no_framework():
    """import otel_training (and its integrations package) leaves Lightning and transformers
    unimported."""
    result = _python(
        "import sys, otel_training, otel_training.integrations, otel_training.spans\n"
        "import otel_training.setup, otel_training.instruments\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("lightning", ("lightning", "pytorch_lightning"), "lightning"),
        ("transformers", ("transformers",), "transformers"),
    ],
)
def test_a_callback_without_its_framework_names_the_extra(module, blocked, extra):
    """With the framework absent the module imports, and building the callback raises
    ModuleNotFoundError naming the extra to install."""
    block = "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    result = _python(
        "import sys\n"
        + block
        + f"from otel_training.integrations.{module} import OtelTrainingCallback\n"
        "try:\n"
        "    OtelTrainingCallback()\n"
        "except ModuleNotFoundError as error:\n"
        "    print('raised:', error, error.name)\n"
    )
    assert result.returncode == 0, result.stderr
    assert f"pip install 'otel-training[{extra}]'" in result.stdout
    assert result.stdout.startswith("raised:")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"tensor_metrics": "grad_norm:0"}, ValueError),
        ({"tensor_metrics": "no_such_metric:10"}, ValueError),
        ({"tokens_per_sample": 8, "tokens_per_batch": len}, ValueError),
        ({"tokens_per_sample": 0}, ValueError),
        ({"tokens_per_sample": True}, ValueError),
        ({"tokens_per_batch": 8}, TypeError),
        ({"flops_per_token": -1.0}, ValueError),
        ({"flops_per_token": float("nan")}, ValueError),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, error):
    """The callbacks' constructors raise on arguments they could not use."""
    options = {"tensor_metrics": None, "tokens_per_sample": None, "tokens_per_batch": None,
               "flops_per_token": None, **kwargs}  # fmt: skip
    with pytest.raises(error):
        _recorder.validate_options(**options)


def test_tokens_come_from_the_batch_shape_or_the_given_function():
    """tokens_per_sample multiplies the batch's leading dimension; tokens_per_batch is called."""
    torch = import_or_unavailable("torch")
    batch = {"input_ids": torch.zeros(3, 7, dtype=torch.long), "mask": torch.ones(3, 7)}
    assert _recorder.count_tokens(batch, 7, None) == 21
    assert _recorder.count_tokens([(batch["input_ids"],)], 5, None) == 15
    assert _recorder.count_tokens(batch, None, lambda b: int(b["mask"].sum())) == 21
    assert _recorder.count_tokens(batch, None, None) is None
    assert _recorder.count_tokens({"text": "no tensor"}, 7, None) is None


def test_a_frameworks_identity_is_the_torchrun_variables_the_pipeline_reads():
    """FrameworkIdentity.environ() gives the torchrun variables from which the pipeline reads
    the same rank, local rank, world size, node rank and local world size; the node values
    only where the framework says them."""
    from otel_training._env import EnvReader
    from otel_training.identity import read_identity

    said = _recorder.FrameworkIdentity(
        rank=5, local_rank=1, world_size=8, node_rank=2, local_world_size=4
    )
    read = read_identity(EnvReader(said.environ()))
    assert (read.rank, read.local_rank, read.world_size, read.node_rank) == (5, 1, 8, 2)
    assert read.local_world_size == 4
    unsaid = _recorder.FrameworkIdentity(rank=5, local_rank=1, world_size=8).environ()
    assert unsaid == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}


def test_a_missing_framework_raises_module_not_found_naming_the_extra():
    """missing_framework raises ModuleNotFoundError for the package, saying which extra to
    install, from the import error."""
    cause = ImportError("no lightning")
    with pytest.raises(ModuleNotFoundError) as raised:
        _recorder.missing_framework("lightning", "lightning", cause)
    assert (
        str(raised.value) == "this callback needs lightning: pip install 'otel-training[lightning]'"
    )
    assert raised.value.name == "lightning" and raised.value.__cause__ is cause


def test_tokens_counted_over_all_ranks_by_the_framework_make_the_job_rate():
    """Tokens the framework gathered over all ranks (add_tokens_global) are the job's tokens
    of the step: tokens/s x the step's duration = those tokens, not times the world size."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    reader = InMemoryMetricReader()
    recorder = _recorder.RunRecorder(
        meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=TracerProvider()
    )
    recorder.add_tokens_global(10)  # no run yet: nothing to count
    recorder.start_run(_recorder.FrameworkIdentity(rank=0, local_rank=0, world_size=4))
    recorder.begin_step(1)
    recorder.add_tokens_global(6000)
    recorder.end_step()
    recorder.record_interval()
    recorder.end_run()
    metrics = {
        m.name: m.data.data_points
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (rate,) = [p.value for p in metrics["megatron.training.tokens_per_sec"]]
    (step,) = metrics["megatron.training.step_duration_ms"]  # a histogram of one step
    assert step.count == 1
    assert rate * step.sum / 1000.0 == pytest.approx(6000, rel=1e-6)


def test_a_recorder_without_providers_configures_with_the_frameworks_ranks(caplog, monkeypatch):
    """No pipeline yet: the recorder configures one from OTEL_* with the framework's rank and
    world size. A pipeline configured before with other ranks is used as it is, with one
    warning naming both."""
    from otel_training import setup, testing

    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")
    recorder = _recorder.RunRecorder()
    recorder.start_run(_recorder.FrameworkIdentity(rank=1, local_rank=1, world_size=2))
    recorder.end_run()
    identity = setup.current().settings.identity
    assert (identity.rank, identity.local_rank, identity.world_size) == (1, 1, 2)
    assert not [r for r in caplog.records if r.name == "otel_training.integrations"]
    _recorder.warn_once.clear()
    with caplog.at_level("WARNING", logger="otel_training.integrations"):
        recorder.start_run(_recorder.FrameworkIdentity(rank=0, local_rank=0, world_size=2))
        recorder.end_run()
    assert setup.current().settings.identity.rank == 1
    (said,) = [r for r in caplog.records if r.name == "otel_training.integrations"]
    assert "rank 1 of 2, the framework rank 0 of 2" in said.getMessage()
    _recorder.warn_once.clear()
    testing.reset()


def test_a_checkpoint_save_is_one_span_with_its_path_iteration_and_strategy():
    """begin_checkpoint opens one checkpoint-save span under the run, with the path, the
    iteration and the strategy (sync unless said); a second begin while it is open opens
    nothing; before a run, nothing."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_training.semconv import spans as names

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = _recorder.RunRecorder(
        meter_provider=MeterProvider(), tracer_provider=tracer_provider
    )
    recorder.begin_checkpoint("/before", 1)  # no run: nothing
    recorder.start_run(_recorder.FrameworkIdentity(rank=0, local_rank=0, world_size=1))
    recorder.begin_checkpoint("/ckpt/step-5", 5)
    recorder.begin_checkpoint("/other", 6)  # one is open: nothing
    recorder.end_checkpoint()
    recorder.end_run()
    (save,) = [s for s in exporter.get_finished_spans() if s.name == names.MEGATRON_CHECKPOINT_SAVE]
    values = set(save.attributes.values())
    assert {"/ckpt/step-5", 5, "sync"} <= values and "/other" not in values


def _interval_points(**interval) -> dict[str, list]:
    """The points of one log interval of three steps (losses 1 and 3; a skipped step of loss
    100; loss 2), recorded with ``record_interval(**interval)``."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    reader = InMemoryMetricReader()
    recorder = _recorder.RunRecorder(
        meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=TracerProvider()
    )
    recorder.start_run(_recorder.FrameworkIdentity(rank=0, local_rank=0, world_size=1))
    for step, losses, skipped in ((1, (1.0, 3.0), False), (2, (100.0,), True), (3, (2.0,), False)):
        recorder.begin_step(step)
        for loss in losses:
            recorder.add_micro_batch(loss, tokens=8)
        recorder.end_step(skipped=skipped)
    recorder.record_interval(**interval)
    recorder.end_run()
    return {
        m.name: [p.value for p in m.data.data_points if hasattr(p, "value")]
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


def test_record_interval_hands_on_what_the_framework_gives():
    """The grad norm and learning rate given are recorded as given; the loss is the mean of
    the non-skipped steps' micro-batch losses times loss_scale; the skipped steps are counted;
    a loss the framework gives wins over the mean."""
    points = _interval_points(grad_norm=0.5, learning_rate=1e-3, loss_scale=2.0)
    assert points["megatron.training.grad_norm"] == [0.5]
    assert points["megatron.training.learning_rate"] == [1e-3]
    assert points["megatron.training.loss"] == [pytest.approx(4.0)]  # mean(1, 3, 2) x 2
    assert points["megatron.training.skipped_iters"] == [1]
    given = _interval_points(loss=7.5, loss_scale=2.0)
    assert given["megatron.training.loss"] == [7.5]
    assert "megatron.training.grad_norm" not in given
    assert "megatron.training.learning_rate" not in given


def test_a_steps_spans_nest_under_the_run_with_the_frameworks_step_number(monkeypatch):
    """begin_step opens the iteration span of the framework's step under the run span (a
    second begin while one is open opens nothing); the optimizer span is the iteration's
    child with the same number; an optimizer update outside a step is the run's child."""
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "per_step")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_training.semconv import spans as names

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = _recorder.RunRecorder(
        meter_provider=MeterProvider(), tracer_provider=tracer_provider
    )
    recorder.start_run(_recorder.FrameworkIdentity(rank=0, local_rank=0, world_size=1))
    recorder.begin_step(5)
    recorder.begin_step(6)  # one is open: nothing
    recorder.begin_optimizer()
    recorder.end_optimizer()
    recorder.end_step()
    recorder.begin_optimizer()  # no step open
    recorder.end_optimizer()
    recorder.end_run()
    spans = exporter.get_finished_spans()
    (run,) = [s for s in spans if s.name == names.MEGATRON_TRAIN]
    (step,) = [s for s in spans if s.name == names.MEGATRON_TRAIN_ITERATION]
    inside, outside = [s for s in spans if s.name == names.MEGATRON_TRAIN_ITERATION_OPTIMIZER]
    assert step.attributes["megatron.iteration"] == 5
    # the process's first step is wrapped by the first-iteration span, a child of the run
    (first,) = [s for s in spans if s.name == names.MEGATRON_TRAIN_FIRST_ITERATION]
    assert step.parent.span_id == first.context.span_id
    assert first.parent.span_id == run.context.span_id
    assert inside.parent.span_id == step.context.span_id
    assert inside.attributes["megatron.iteration"] == 5
    assert outside.parent.span_id == run.context.span_id
    assert "megatron.iteration" not in outside.attributes
