"""The Hugging Face callback on providers of its own (in memory), in a real CPU run."""

from __future__ import annotations

import sys

import pytest
from framework_checks import (
    STEP,
    driver_of,
    in_memory_providers,
    named,
    process_wide_registrations,
    run_as_recorded,
    steps_recorded,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_training import configuration as setup
from otel_training import testing

pytestmark = pytest.mark.slow  # real Trainer runs on the CPU


def _value(data, name):
    (point,) = [p for _, p in testing.points(data, name)]
    return point


def test_given_providers_tokens_per_sample_and_flops_per_token(tmp_path, monkeypatch):
    """meter_provider=/tracer_provider= get everything (nothing configured); tokens come from
    tokens_per_sample, TFLOP/s from flops_per_token times the per-device rate."""
    driver = driver_of("transformers")
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
    driver_of("transformers")
    import transformers

    from otel_training.integrations.transformers import OtelTrainingCallback

    assert isinstance(OtelTrainingCallback(), transformers.TrainerCallback)


def test_the_exception_hook_always_calls_the_programs_and_never_clobbers_it(monkeypatch):
    """The run's sys.excepthook passes every exception on to the program's hook, even when
    recording it raises; removed while the program has chained its own hook on top, it leaves
    the program's in place and from then on only passes exceptions on."""
    driver_of("transformers")
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


# -- failures, resumes, the second time (issue 15 items 3 and 11) ----------------------------


def _iterations(spans) -> list[int]:
    return sorted(s.attributes["megatron.iteration"] for s in
                  named(spans, "megatron.train.iteration"))  # fmt: skip


def _failing_model(driver, training_forward: int = 0, evaluation: bool = False,
                   kind: type = RuntimeError):  # fmt: skip
    """The driver's model, raising ``kind`` at its ``training_forward``-th training forward
    pass, or at its first evaluation forward pass."""
    model = driver.build_model(32)
    seen = {"training": 0}

    def fail(module, args, kwargs):
        if module.training:
            seen["training"] += 1
            if seen["training"] == training_forward:
                raise kind("injected failure in a training forward pass")
        elif evaluation:
            raise kind("injected failure in an evaluation")

    model.register_forward_pre_hook(fail, with_kwargs=True)
    return model


def _failing_save_trainer():
    import transformers

    class FailingSave(transformers.Trainer):
        def _save_checkpoint(self, model, trial):
            raise OSError("injected failure in a checkpoint save")

    return FailingSave


@pytest.mark.parametrize(
    ("where", "span", "kind"),
    [
        ("training", "megatron.train.iteration", RuntimeError),
        ("interrupt", "megatron.train.iteration", KeyboardInterrupt),
        ("evaluation", "megatron.evaluate", RuntimeError),
        ("save", "megatron.checkpoint.save", OSError),
    ],
)
def test_a_failed_train_is_an_error_and_the_next_train_records_as_the_first(
    tmp_path, monkeypatch, where, span, kind
):
    """train() ended by an exception the caller catches (in a step, a KeyboardInterrupt, in an
    evaluation, in a checkpoint save): the run and the phase it interrupted end with status
    ERROR and the exception, the interrupted step records no point; a second train() with the
    same callback on a new Trainer then records exactly as a clean one."""
    driver = driver_of("transformers")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    kwargs, reader, exporter = in_memory_providers()
    args = {"max_steps": 4, "gradient_accumulation_steps": 2, "logging_steps": 2}
    options = {"model": driver.build_model(32)}
    if where in ("training", "interrupt"):
        options["model"] = _failing_model(driver, training_forward=5, kind=kind)  # step 3
    elif where == "evaluation":
        options["model"] = _failing_model(driver, evaluation=True)
        args.update(eval_strategy="steps", eval_steps=2)
    else:
        options["trainer_class"] = _failing_save_trainer()
        args.update(save_strategy="steps", save_steps=2)
    from otel_training.integrations.transformers import OtelTrainingCallback

    callback = OtelTrainingCallback(**kwargs, tensor_metrics="none")
    excepthook = sys.excepthook
    with pytest.raises(kind):
        driver.train(tmp_path / "first", callback=callback, args_kwargs=args, **options)
    assert sys.excepthook is excepthook  # the chained hook is gone with the run
    spans = exporter.get_finished_spans()
    failed = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert {s.name for s in failed} >= {"megatron.train", span}, where
    for record in failed:
        (event,) = [e for e in record.events if e.name == "exception"]
        assert event.attributes["exception.type"].endswith(kind.__name__)
    completed = 2
    assert steps_recorded(reader) == completed
    assert _iterations(spans) == list(range(1, completed + 1 + (span.endswith("iteration"))))

    exporter.clear()
    clean = {**args, "eval_strategy": "no", "save_strategy": "no"}
    result = driver.train(tmp_path / "second", callback=callback, args_kwargs=clean)
    spans = exporter.get_finished_spans()
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)
    assert steps_recorded(reader) == completed + 4
    assert _iterations(spans) == [1, 2, 3, 4]
    (loss,) = [p.value for _, p in testing.points(reader.get_metrics_data(),
                                                  "megatron.training.loss")]  # fmt: skip
    last = [h for h in result["trainer"].state.log_history if "loss" in h][-1]
    assert loss == pytest.approx(last["loss"], rel=1e-6)


def test_a_callback_added_after_init_ends_a_caught_failure_at_the_next_train(tmp_path):
    """A callback given with add_callback misses the first train()'s start: when that train()
    fails and the caller catches it, the next train() ends the run still open with status
    ERROR (RunInterrupted) before recording its own."""
    driver = driver_of("transformers")
    kwargs, reader, exporter = in_memory_providers()
    from otel_training.integrations.transformers import OtelTrainingCallback

    callback = OtelTrainingCallback(**kwargs, tensor_metrics="none")
    args = {"max_steps": 4, "gradient_accumulation_steps": 2, "logging_steps": 2}
    with pytest.raises(RuntimeError):
        driver.train(tmp_path / "first", callback=callback, add_callback=True, args_kwargs=args,
                     model=_failing_model(driver, training_forward=5))  # fmt: skip
    assert not any(s.name == "megatron.train" for s in exporter.get_finished_spans())
    driver.train(tmp_path / "second", callback=callback, add_callback=True, args_kwargs=args)
    first, second = named(exporter.get_finished_spans(), "megatron.train")
    assert first.status.status_code is StatusCode.ERROR
    assert first.attributes["error.type"].endswith("RunInterrupted")
    assert second.status.status_code is StatusCode.UNSET
    assert steps_recorded(reader) == 2 + 4


@pytest.mark.parametrize("given", ["callbacks", "add_callback"])
def test_a_resume_counts_whole_steps_from_the_restored_step(tmp_path, monkeypatch, given):
    """train(resume_from_checkpoint=) with accumulation 2: a checkpoint_load span holding the
    restored global_step (also the health ledger's resume point), timed inside the run when
    the callback was given to the Trainer; then each optimizer step is numbered as the Trainer
    numbers it, with all its micro-batches and none of those it skips."""
    from otel_training.health.ledger import LEDGER

    driver = driver_of("transformers")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    kwargs, _, _ = in_memory_providers()
    args = {"gradient_accumulation_steps": 2, "logging_steps": 2, "save_strategy": "steps",
            "save_steps": 3}  # fmt: skip
    driver.train(tmp_path, callback_kwargs={**kwargs, "tensor_metrics": "none"},
                 args_kwargs={**args, "max_steps": 3})  # fmt: skip
    path = tmp_path / "out" / "checkpoint-3"
    assert path.is_dir()

    kwargs, reader, exporter = in_memory_providers()
    result = driver.train(
        tmp_path / "resumed",
        callback_kwargs={**kwargs, "tensor_metrics": "none"},
        args_kwargs={**args, "max_steps": 6, "save_strategy": "no"},
        resume_from_checkpoint=str(path),
        add_callback=given == "add_callback",
    )
    assert result["trainer"].state.global_step == 6
    spans = exporter.get_finished_spans()
    (load,) = named(spans, "megatron.checkpoint.load")
    (run,) = named(spans, "megatron.train")
    assert load.attributes["megatron.iteration"] == 3
    assert load.parent.span_id == run.context.span_id
    if given == "callbacks":  # timed: from train() to the restored state
        assert load.attributes["megatron.checkpoint.path"] == str(path)
        assert run.start_time <= load.start_time < load.end_time <= run.end_time
    assert LEDGER.read().loaded_iteration == 3
    assert _iterations(spans) == [4, 5, 6]
    assert steps_recorded(reader) == 3
    assert [step for step, *_ in result["before"]["micro"]] == [4, 4, 5, 5, 6, 6]


def test_a_second_callback_trainer_and_train_record_exactly_as_the_first(tmp_path, monkeypatch):
    """Two train() in one process on the configured pipeline, each with a new callback,
    Trainer and model and tensor metrics: the second exports its own steps and tensor gauges
    as the first did, and each leaves no hook or registration behind."""
    driver = driver_of("transformers")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    telemetry = testing.configure_in_memory()
    baseline = process_wide_registrations()
    seen = []
    for run in range(2):
        telemetry.spans.clear()
        result = driver.train(
            tmp_path / str(run),
            callback_kwargs={"tensor_metrics": "param_norm:1"},
            args_kwargs={
                "max_steps": 4,
                "gradient_accumulation_steps": 2,
                "logging_steps": 2,
                "learning_rate": 1e-3 * (run + 1),
            },  # fmt: skip
            snapshot_every=4,
        )
        model = result["trainer"].model
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
        assert process_wide_registrations() == baseline
        seen.append(run_as_recorded(telemetry, result["before"]["snapshots"][4]))
    assert seen[0] == seen[1]
    (histogram,) = [p for _, p in telemetry.points(STEP)]
    assert histogram.count == 8
