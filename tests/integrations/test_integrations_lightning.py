"""The Lightning callback on providers of its own (in memory), in a real CPU run."""

from __future__ import annotations

import pytest
from framework_checks import (
    STEP,
    driver_of,
    duration_bounds,
    in_memory_providers,
    named,
    process_wide_registrations,
    run_as_recorded,
    step_windows,
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

pytestmark = pytest.mark.slow  # real Lightning runs on the CPU


def test_given_providers_get_everything_and_nothing_is_configured(tmp_path, monkeypatch):
    """meter_provider= and tracer_provider=: metrics and spans go there; configure() is not
    called, so no pipeline of the environment exists afterwards."""
    driver = driver_of("lightning")
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
    driver = driver_of("lightning")
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
    driver_of("lightning")
    import lightning.pytorch

    from otel_training.integrations.lightning import OtelTrainingCallback

    assert isinstance(OtelTrainingCallback(), lightning.pytorch.Callback)


# -- failures, resumes, the sanity check, the second time (issue 15 items 3 and 11) -----------


@pytest.mark.parametrize(
    ("where", "module_kwargs", "trainer_kwargs", "span", "kind"),
    [
        ("training_step", {"fail_at_step": 3}, {}, "megatron.train.iteration", RuntimeError),
        ("interrupt", {"interrupt_at_step": 3}, {}, "megatron.train.iteration", KeyboardInterrupt),
        (
            "validation",
            {"fail_validation_at_step": 2},
            {"limit_val_batches": 1, "val_check_interval": 2},
            "megatron.evaluate",
            RuntimeError,
        ),
        ("save", {"fail_save": True}, {"checkpoint_every": 2}, "megatron.checkpoint.save", OSError),
    ],
)
def test_a_failed_fit_is_an_error_and_the_next_fit_records_as_the_first(
    tmp_path, monkeypatch, where, module_kwargs, trainer_kwargs, span, kind
):
    """A fit ended by an exception the caller catches (in a step, a KeyboardInterrupt, in a
    validation, in a checkpoint save): the run and the phase it interrupted end with status
    ERROR and the exception, the interrupted step records no point; a second fit with the same
    callback then records exactly as a clean one (nothing of the first leaks into it)."""
    import signal

    driver = driver_of("lightning")
    import lightning.pytorch as lightning

    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    kwargs, reader, exporter = in_memory_providers()
    callback_kwargs = {**kwargs, "tensor_metrics": "none", "tokens_per_sample": 16}
    options = {"max_steps": 4, "log_every_n_steps": 2, **trainer_kwargs}
    every = options.pop("checkpoint_every", 0)
    if every:
        options["callbacks"] = [
            lightning.callbacks.ModelCheckpoint(
                dirpath=tmp_path / "ckpt", every_n_train_steps=every, save_top_k=-1
            )
        ]
        options["enable_checkpointing"] = True
    sigint = signal.getsignal(signal.SIGINT)
    from otel_training.integrations.lightning import OtelTrainingCallback

    callback = OtelTrainingCallback(**callback_kwargs)
    try:
        with pytest.raises((kind, SystemExit)):  # Lightning exits 1 on KeyboardInterrupt
            driver.train(tmp_path / "first", callback=callback, trainer_kwargs=options,
                         module_kwargs=module_kwargs)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, sigint)
    spans = exporter.get_finished_spans()
    (run,) = named(spans, "megatron.train")
    failed = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert {s.name for s in failed} >= {"megatron.train", span}, where
    for record in failed:
        (event,) = [e for e in record.events if e.name == "exception"]
        assert event.attributes["exception.type"].endswith(kind.__name__)
    completed = 2
    assert steps_recorded(reader) == completed
    iterations = named(spans, "megatron.train.iteration")
    assert sorted(s.attributes["megatron.iteration"] for s in iterations) == list(
        range(1, completed + 1 + (span == "megatron.train.iteration"))
    )

    exporter.clear()
    result = driver.train(tmp_path / "second", callback=callback,
                          trainer_kwargs={"max_steps": 4, "log_every_n_steps": 2})  # fmt: skip
    spans = exporter.get_finished_spans()
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)
    assert steps_recorded(reader) == completed + 4
    iterations = named(spans, "megatron.train.iteration")
    assert sorted(s.attributes["megatron.iteration"] for s in iterations) == [1, 2, 3, 4]
    (loss,) = [p.value for _, p in testing.points(reader.get_metrics_data(),
                                                  "megatron.training.loss")]  # fmt: skip
    micro = result["before"]["micro_losses"]
    assert loss == pytest.approx(sum(micro[2:4]) / 2)  # the second fit's last interval only


@pytest.mark.parametrize("saved_at", ["step_end", "mid_accumulation"])
def test_a_resume_counts_whole_steps_from_the_restored_step(tmp_path, monkeypatch, saved_at):
    """fit(ckpt_path=) with accumulation 2: the load is a checkpoint_load span holding the
    restored global_step (also the health ledger's resume point), inside the run; then each
    optimizer step is numbered as Lightning numbers it and holds all the micro-batches
    Lightning runs for it (no phantom step at the first micro-batch after the resume)."""
    from otel_training.health.ledger import LEDGER

    driver = driver_of("lightning")
    import lightning.pytorch as lightning

    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    path = tmp_path / "resume.ckpt"
    first = {"max_steps": 3, "accumulate_grad_batches": 2, "log_every_n_steps": 2}
    if saved_at == "step_end":
        saving = lightning.callbacks.ModelCheckpoint(
            dirpath=tmp_path, filename="resume", every_n_train_steps=3, save_top_k=-1
        )
        first.update(enable_checkpointing=True, callbacks=[saving])
    else:
        first["callbacks"] = [driver.save_at_micro_batch(path, 5)]  # during step 3
    kwargs, _, _ = in_memory_providers()
    driver.train(tmp_path / "first", callback_kwargs={**kwargs, "tensor_metrics": "none"},
                 trainer_kwargs=first)  # fmt: skip
    restored = int(torch_load(path)["global_step"])
    assert restored == (3 if saved_at == "step_end" else 2)

    kwargs, reader, exporter = in_memory_providers()
    result = driver.train(
        tmp_path / "second",
        callback_kwargs={**kwargs, "tensor_metrics": "none", "tokens_per_sample": 16},
        trainer_kwargs={"max_steps": 6, "accumulate_grad_batches": 2, "log_every_n_steps": 2},
        ckpt_path=str(path),
    )
    assert result["trainer"].global_step == 6
    spans = exporter.get_finished_spans()
    (load,) = named(spans, "megatron.checkpoint.load")
    (run,) = named(spans, "megatron.train")
    assert load.attributes["megatron.iteration"] == restored
    assert load.attributes["megatron.checkpoint.path"] == str(path)
    assert load.parent.span_id == run.context.span_id
    assert run.start_time <= load.start_time and load.end_time <= run.end_time
    assert LEDGER.read().loaded_iteration == restored
    iterations = sorted(s.attributes["megatron.iteration"] for s in
                        named(spans, "megatron.train.iteration"))  # fmt: skip
    assert iterations == list(range(restored + 1, 7))
    assert steps_recorded(reader) == 6 - restored
    micro_steps = [step for step, _, _ in result["before"]["micro"]]
    assert (
        sorted(set(micro_steps)) == iterations
    )  # each step's micro-batches, as Lightning ran them


def torch_load(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def test_the_sanity_check_is_neither_an_evaluation_nor_in_a_step(tmp_path, monkeypatch):
    """num_sanity_val_steps before fit: no evaluation span for it, and no step's duration has
    it (each validation lasts >= 0.2 s; the steps' summed duration lies within what the
    probes around the callback's boundaries allow)."""
    driver = driver_of("lightning")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    kwargs, reader, exporter = in_memory_providers()
    events: list = []
    result = driver.train(
        tmp_path,
        callback_kwargs={**kwargs, "tensor_metrics": "none"},
        trainer_kwargs={
            "max_steps": 4,
            "num_sanity_val_steps": 1,
            "limit_val_batches": 1,
            "val_check_interval": 2,
        },  # fmt: skip
        module_kwargs={"validation_sleep_s": 0.2},
        events=events,
    )
    loops = result["trainer"].fit_loop.epoch_loop.val_loop.batch_progress.total.completed
    assert loops == 2  # the validations during fit; the sanity check ran before them
    spans = exporter.get_finished_spans()
    assert len(named(spans, "megatron.evaluate")) == 2
    (histogram,) = [p for _, p in testing.points(reader.get_metrics_data(), STEP)]
    shortest, longest = duration_bounds(step_windows(events), 1, 4)
    assert shortest * 1e3 <= histogram.sum <= longest * 1e3


def test_a_second_callback_trainer_and_fit_record_exactly_as_the_first(tmp_path, monkeypatch):
    """Two fits in one process on the configured pipeline, each with a new callback, trainer
    and model and tensor metrics: the second exports its own steps, losses and tensor gauges
    as the first did, and each leaves no tap, hook or registration behind."""
    driver = driver_of("lightning")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")
    telemetry = testing.configure_in_memory()
    baseline = process_wide_registrations()
    seen = []
    for run in range(2):
        telemetry.spans.clear()
        result = driver.train(
            tmp_path / str(run),
            callback_kwargs={"tensor_metrics": "param_norm:1", "tokens_per_sample": 16},
            trainer_kwargs={"max_steps": 4, "log_every_n_steps": 2},
            module_kwargs={"d_model": 8 + 8 * run},
            snapshot_every=4,
        )
        trainer = result["trainer"]
        assert "save_checkpoint" not in vars(trainer)
        assert "load_checkpoint" not in vars(trainer.strategy)
        assert not any(trainer.optimizers[0]._optimizer_step_post_hooks)
        assert not any(m._forward_hooks or m._forward_pre_hooks
                       for m in trainer.lightning_module.modules())  # fmt: skip
        assert process_wide_registrations() == baseline
        seen.append(run_as_recorded(telemetry, result["before"]["snapshots"][4]))
    assert seen[0] == seen[1]
    (histogram,) = [p for _, p in telemetry.points(STEP)]
    assert histogram.count == 8


@pytest.mark.parametrize("write_fails", [False, True])
def test_an_async_save_is_good_when_its_write_ends(tmp_path, write_fails):
    """With AsyncCheckpointIO the save span ends when the write is handed to its thread: the
    ledger's last good checkpoint moves only when the wrapped plugin's write returns; a write
    that raises never makes one."""
    import threading

    driver = driver_of("lightning")
    import lightning.pytorch as lightning
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    from otel_training.health.ledger import LEDGER

    release = threading.Event()
    seen = {}

    class GatedIO(TorchCheckpointIO):
        """Writes only when the test says so (a slow disk); raises when told to."""

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            release.wait(30)
            if write_fails:
                raise OSError("injected: disk quota exceeded")
            super().save_checkpoint(checkpoint, path, storage_options)

    class Probe(lightning.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 3:  # the save of step 2 is still being written
                seen["during"] = LEDGER.read().saved_iteration
                release.set()

    testing.configure_in_memory(set_global=True)
    options = {
        "max_steps": 4,
        "plugins": [AsyncCheckpointIO(GatedIO())],
        "enable_checkpointing": True,
        "callbacks": [
            lightning.callbacks.ModelCheckpoint(
                dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1
            ),
            Probe(),
        ],
    }
    if write_fails:
        with pytest.raises(OSError, match="disk quota"):
            driver.train(tmp_path, callback_kwargs={"tensor_metrics": "none"},
                         trainer_kwargs=options)  # fmt: skip
    else:
        driver.train(tmp_path, callback_kwargs={"tensor_metrics": "none"}, trainer_kwargs=options)
    assert seen["during"] is None
    assert LEDGER.read().saved_iteration == (None if write_fails else 4)
