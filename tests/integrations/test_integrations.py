"""otel_training.integrations without the frameworks, and the callbacks' argument checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import child_env, import_or_unavailable, metrics_of

from otel_training.integrations import _recorder

SRC = str(Path(__file__).resolve().parents[2] / "src")
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
        "import otel_training.configuration, otel_training.metrics.instruments\n"
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
    assert f"(otel-training's extra {extra})" in result.stdout
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
    from otel_training.config._env import EnvReader
    from otel_training.config.identity import read_identity

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
    assert str(raised.value) == (
        "this callback needs lightning: pip install lightning (otel-training's extra lightning)"
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
    metrics = {m.name: m.data.data_points for m in metrics_of(reader.get_metrics_data())}
    (rate,) = [p.value for p in metrics["megatron.training.tokens_per_sec"]]
    (step,) = metrics["megatron.training.step_duration_ms"]  # a histogram of one step
    assert step.count == 1
    assert rate * step.sum / 1000.0 == pytest.approx(6000, rel=1e-6)


def test_a_recorder_without_providers_configures_with_the_frameworks_ranks(caplog, monkeypatch):
    """No pipeline yet: the recorder configures one from OTEL_* with the framework's rank and
    world size. A pipeline configured before with other ranks is used as it is, with one
    warning naming both."""
    from otel_training import configuration as setup
    from otel_training import testing

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
        for m in metrics_of(reader.get_metrics_data())
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


# -- the run recorder on its own: in-memory providers, a clock the test moves -------------------


class _Clock:
    """Stands in for the ``time`` module in ``_recorder``: ``perf_counter`` is what the test
    set (seconds)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now


class _Recording:
    """A RunRecorder on in-memory providers (per-step span groups), its spans and points."""

    def __init__(self, monkeypatch, world_size: int = 1, **options) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "per_step")
        self.clock = _Clock()
        monkeypatch.setattr(_recorder, "time", self.clock)
        self.reader = InMemoryMetricReader()
        self.exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.recorder = _recorder.RunRecorder(
            meter_provider=MeterProvider(metric_readers=[self.reader]),
            tracer_provider=tracer_provider,
            **options,
        )
        self.identity = _recorder.FrameworkIdentity(rank=0, local_rank=0, world_size=world_size)

    def step(self, number: int, seconds: float, *micro_batches, skipped: bool = False) -> None:
        """Optimizer step ``number`` of ``seconds``; each micro-batch a (loss, tokens) pair."""
        self.recorder.begin_step(number)
        for loss, tokens in micro_batches:
            self.recorder.add_micro_batch(loss, tokens=tokens)
        self.clock.now += seconds
        self.recorder.begin_optimizer()
        self.recorder.end_step(skipped=skipped)

    def points(self) -> dict[str, list]:
        """Every metric's points of the collection now (a histogram point as itself)."""
        return {
            m.name: list(m.data.data_points) for m in metrics_of(self.reader.get_metrics_data())
        }

    def values(self, name: str) -> list:
        return [p.value for p in self.points().get(name, [])]

    def spans(self, name: str) -> list:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


def test_a_step_lasts_from_the_last_boundary_to_its_optimizer_update(monkeypatch):
    """step_duration_ms of each step is the time since the previous boundary: the start of the
    run, the end of the previous step, of an evaluation, of a checkpoint save or of a failed
    one, or a mark_boundary; the time of evaluations and saves is in no step."""
    recording = _Recording(monkeypatch)
    recorder, clock = recording.recorder, recording.clock
    recorder.start_run(recording.identity)  # boundary 100
    clock.now += 0.25  # data loading of step 1, in it
    recording.step(1, 0.75)  # 1,000 ms
    recorder.begin_evaluation(1)
    clock.now += 30.0
    recorder.end_evaluation()
    recording.step(2, 2.0)  # 2,000 ms
    recorder.begin_checkpoint("/ckpt", 2)
    clock.now += 60.0
    recorder.end_checkpoint()
    recording.step(3, 0.5)  # 500 ms
    recorder.begin_checkpoint("/ckpt", 3)
    clock.now += 7.0
    recorder.fail_checkpoint(OSError("disk full"))
    recording.step(4, 0.125)  # 125 ms
    clock.now += 9.0
    recorder.mark_boundary()
    recording.step(5, 4.0)  # 4,000 ms
    assert recorder.steps_in_interval == 5
    (histogram,) = recording.points()["megatron.training.step_duration_ms"]
    assert histogram.count == 5
    assert histogram.sum == pytest.approx(7625.0)
    assert (histogram.min, histogram.max) == (pytest.approx(125.0), pytest.approx(4000.0))
    recorder.record_interval()
    assert recorder.steps_in_interval == 0
    recorder.end_run()


def test_an_interval_rate_is_the_jobs_tokens_over_the_steps_time(monkeypatch):
    """tokens/s is this rank's tokens x the world size over the interval's step time; TFLOP/s
    per device uses flops_per_token of the constructor over a framework's FLOPs count; a
    micro-batch of 0 tokens is counted (a rate of 0), one without a count is not."""
    recording = _Recording(monkeypatch, world_size=4, flops_per_token=1e12)
    recorder = recording.recorder
    recorder.start_run(recording.identity)
    recording.step(1, 2.0, (1.0, 10), (1.0, 30))
    recorder.record_interval(flops_global=5e15)
    assert recording.values("megatron.training.tokens_per_sec") == [pytest.approx(80.0)]
    # 160 tokens of the job x 1e12 FLOPs over 2 s and 4 devices
    assert recording.values("megatron.training.throughput_tflops") == [pytest.approx(20.0)]
    recorder.end_run()

    zero = _Recording(monkeypatch, world_size=2)
    zero.recorder.start_run(zero.identity)
    zero.step(1, 1.0, (1.0, 0))
    assert zero.recorder.counts_tokens
    zero.recorder.record_interval(flops_global=4e12)  # no flops_per_token: the framework's
    assert zero.values("megatron.training.tokens_per_sec") == [0.0]
    assert zero.values("megatron.training.throughput_tflops") == [pytest.approx(2.0)]
    zero.recorder.end_run()

    uncounted = _Recording(monkeypatch, world_size=2)
    uncounted.recorder.start_run(uncounted.identity)
    uncounted.step(1, 1.0, (1.0, None))
    assert not uncounted.recorder.counts_tokens
    uncounted.recorder.record_interval()
    assert uncounted.values("megatron.training.tokens_per_sec") == []
    assert uncounted.values("megatron.training.throughput_tflops") == []
    uncounted.recorder.end_run()


def test_a_failed_run_marks_its_open_phases_and_records_no_step(monkeypatch):
    """fail_run records the exception on every open phase (ERROR, an exception event) and
    the run span, ends them, records no step_duration_ms point for the interrupted step and
    forgets the run: a record_interval or step after it records nothing, and the next run
    starts clean."""
    from opentelemetry.trace import StatusCode

    from otel_training.semconv import spans as names

    recording = _Recording(monkeypatch)
    recorder = recording.recorder
    recorder.start_run(recording.identity)
    recorder.begin_step(1)
    recorder.add_micro_batch(5.0, tokens=8)
    recorder.begin_optimizer()
    recorder.fail_run(ValueError("out of memory"))
    assert not recorder.active and not recorder.in_step
    failed = [
        *recording.spans(names.MEGATRON_TRAIN),
        *recording.spans(names.MEGATRON_TRAIN_ITERATION),
        *recording.spans(names.MEGATRON_TRAIN_ITERATION_OPTIMIZER),
    ]
    assert len(failed) == 3
    for span in failed:
        assert span.status.status_code is StatusCode.ERROR
        assert [e.name for e in span.events] == ["exception"]
        assert span.events[0].attributes["exception.message"] == "out of memory"
    recorder.record_interval(loss=1.0)  # no run: nothing
    recorder.begin_step(2)
    recorder.end_step()
    points = recording.points()
    assert "megatron.training.step_duration_ms" not in points
    assert "megatron.training.loss" not in points

    recorder.start_run(recording.identity)
    recording.step(1, 1.0, (2.0, 4))
    recorder.record_interval()
    assert recording.values("megatron.training.loss") == [2.0]  # not the failed step's 5
    recorder.end_run()
    (second,) = [s for s in recording.spans(names.MEGATRON_TRAIN) if s not in failed]
    assert second.status.status_code is StatusCode.UNSET


def test_a_run_started_again_before_its_end_fails_the_first(monkeypatch):
    """start_run while a run is open ends that run with RunInterrupted (status ERROR) and
    starts a new one; end_run ends every phase still open, without an error."""
    from opentelemetry.trace import StatusCode

    from otel_training.semconv import spans as names

    recording = _Recording(monkeypatch)
    recorder = recording.recorder
    recorder.start_run(recording.identity)
    recorder.begin_step(1)
    recorder.start_run(recording.identity)
    (first,) = recording.spans(names.MEGATRON_TRAIN)
    # the first run, its step, and the first-iteration span around the process's first step
    before = len(recording.exporter.get_finished_spans())
    assert before == 3
    assert all(
        s.status.status_code is StatusCode.ERROR for s in recording.exporter.get_finished_spans()
    )
    assert first.events[0].attributes["exception.type"].endswith("RunInterrupted")
    assert first.events[0].attributes["exception.message"] == (
        "the previous run ended without its end hook"
    )
    assert recorder.active and not recorder.in_step
    recorder.begin_step(1)
    recorder.begin_evaluation(None)
    recorder.begin_checkpoint("/c", 1, strategy="async")
    recorder.begin_checkpoint_load("/l")
    recorder.end_run()
    ended = recording.exporter.get_finished_spans()
    assert {s.name for s in ended} >= {
        names.MEGATRON_TRAIN_ITERATION,
        names.MEGATRON_EVALUATE,
        names.MEGATRON_CHECKPOINT_SAVE,
        names.MEGATRON_CHECKPOINT_LOAD,
    }
    assert all(s.status.status_code is StatusCode.UNSET for s in ended[before:])
    assert len(recording.spans(names.MEGATRON_TRAIN)) == 2
    (save,) = recording.spans(names.MEGATRON_CHECKPOINT_SAVE)
    assert "async" in save.attributes.values()
    (evaluation,) = recording.spans(names.MEGATRON_EVALUATE)
    (run,) = [s for s in recording.spans(names.MEGATRON_TRAIN) if s is not first]
    assert evaluation.parent.span_id == run.context.span_id
    assert save.parent.span_id == run.context.span_id


def test_a_checkpoint_load_carries_the_iteration_it_restored(monkeypatch):
    """A checkpoint load is one span under the run with the path and, once read, the
    iteration restored (megatron.iteration); record_checkpoint_load records one at once; a
    load ended by an exception is ERROR; a load that never began ends nothing."""
    from opentelemetry.trace import StatusCode

    from otel_training.semconv import spans as names

    recording = _Recording(monkeypatch)
    recorder = recording.recorder
    recorder.begin_checkpoint_load("/early")  # no run: nothing
    assert not recorder.loading
    recorder.start_run(recording.identity)
    recorder.begin_checkpoint_load("/ckpt/a")
    assert recorder.loading
    recorder.begin_checkpoint_load("/ckpt/other")  # one is open: nothing
    recorder.end_checkpoint_load(40)
    assert not recorder.loading
    recorder.end_checkpoint_load(41)  # none open: nothing
    recorder.record_checkpoint_load("/ckpt/b", 50)
    recorder.begin_checkpoint_load("/ckpt/c")
    recorder.end_checkpoint_load(None)
    recorder.begin_checkpoint_load("/ckpt/d")
    recorder.fail_checkpoint(OSError("gone"))
    recorder.end_run()
    loads = recording.spans(names.MEGATRON_CHECKPOINT_LOAD)
    assert len(loads) == 4
    (run,) = recording.spans(names.MEGATRON_TRAIN)
    assert all(s.parent.span_id == run.context.span_id for s in loads)
    by_path = {next(v for v in s.attributes.values() if str(v).startswith("/")): s for s in loads}
    assert set(by_path) == {"/ckpt/a", "/ckpt/b", "/ckpt/c", "/ckpt/d"}
    assert by_path["/ckpt/a"].attributes["megatron.iteration"] == 40
    assert by_path["/ckpt/b"].attributes["megatron.iteration"] == 50
    assert "megatron.iteration" not in by_path["/ckpt/c"].attributes
    assert by_path["/ckpt/d"].status.status_code is StatusCode.ERROR
    assert by_path["/ckpt/a"].status.status_code is StatusCode.UNSET


def test_an_evaluation_opens_once_with_its_iteration(monkeypatch):
    """begin_evaluation opens one evaluation span under the run with the iteration (none
    before a run, none while one is open); end_evaluation without one is harmless."""
    from otel_training.semconv import spans as names

    recording = _Recording(monkeypatch)
    recorder = recording.recorder
    recorder.begin_evaluation(1)  # no run
    recorder.end_evaluation()
    recorder.start_run(recording.identity)
    recorder.begin_evaluation(7)
    recorder.begin_evaluation(8)  # open: nothing
    recorder.end_evaluation()
    recorder.end_run()
    (evaluation,) = recording.spans(names.MEGATRON_EVALUATE)
    assert evaluation.attributes["megatron.iteration"] == 7


def test_interval_losses_are_the_mean_of_the_intervals_steps_only(monkeypatch):
    """The interval's loss is the mean of the micro-batch losses of its non-skipped steps,
    tensors included (detached: no graph is kept); the next interval starts empty; a loss
    scale of 1 leaves it as it is."""
    torch = import_or_unavailable("torch")
    recording = _Recording(monkeypatch)
    recorder = recording.recorder
    recorder.start_run(recording.identity)
    weight = torch.tensor(2.0, requires_grad=True)
    recording.step(1, 1.0, (weight * 1.0, None), (weight * 2.0, None))  # 2 and 4
    recorder.record_interval()
    recording.step(2, 1.0, (torch.tensor(10.0), None))
    recording.step(3, 1.0, (torch.tensor(99.0), None), skipped=True)
    recorder.record_interval(loss_scale=1.0)
    recorder.end_run()
    assert recording.values("megatron.training.loss") == [pytest.approx(10.0)]
    # the first interval's mean (3) was exported at the first collection: read it separately
    first = _Recording(monkeypatch)
    first.recorder.start_run(first.identity)
    first.step(1, 1.0, (weight * 1.0, None), (weight * 2.0, None))
    recorded = []
    monkeypatch.setattr(
        _recorder, "record_training_metrics", lambda meter, **kw: recorded.append(kw)
    )
    first.recorder.record_interval()
    (interval,) = [r for r in recorded if "loss" in r]
    assert float(interval["loss"]) == pytest.approx(3.0)
    assert not interval["loss"].requires_grad
    assert interval["skipped_iters"] == 0 and interval["memory_allocated_gb"] is None


def test_the_tensor_observer_follows_the_schedule_given_or_configured(monkeypatch, caplog):
    """watch_model builds a TensorObserver for a schedule (given, else
    OTEL_PYTHON_TRAINING_TENSOR_METRICS), none for "none", "off" or an empty one; a model it
    cannot observe is one warning and no observer; a second model closes the first's
    observer; end_run closes it after publishing what is in flight."""
    torch = import_or_unavailable("torch")
    model = torch.nn.Linear(2, 2)
    for schedule in ("none", " OFF ", ""):
        recording = _Recording(monkeypatch, tensor_metrics=schedule)
        recording.recorder.start_run(recording.identity)
        recording.recorder.watch_model(model)
        assert recording.recorder.observer is None
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_TENSOR_METRICS", "none")
    configured = _Recording(monkeypatch)
    configured.recorder.start_run(configured.identity)
    configured.recorder.watch_model(model)
    assert configured.recorder.observer is None
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_TENSOR_METRICS", "grad_norm:1")
    configured.recorder.watch_model(model)
    assert configured.recorder.observer is not None

    recording = _Recording(monkeypatch, tensor_metrics="grad_norm:1")
    recorder = recording.recorder
    recorder.start_run(recording.identity)
    recorder.watch_model(model)
    first = recorder.observer
    closed, flushed = [], []
    monkeypatch.setattr(first, "close", lambda: closed.append(first))
    recorder.watch_model(torch.nn.Linear(2, 3))
    assert closed == [first] and recorder.observer is not first
    second = recorder.observer
    monkeypatch.setattr(second, "flush", lambda seconds: flushed.append(seconds))
    recorder.begin_step(1)
    model(torch.ones(1, 2)).sum().backward()
    recorder.begin_optimizer()
    recorder.end_step()
    recorder.end_run()
    assert flushed == [_recorder._FINAL_FLUSH_S] and recorder.observer is None

    _recorder.warn_once.clear()
    broken = _Recording(monkeypatch, tensor_metrics="grad_norm:1")
    broken.recorder.start_run(broken.identity)
    with caplog.at_level("WARNING", logger="otel_training.integrations"):
        broken.recorder.watch_model(object())
    assert broken.recorder.observer is None
    assert [r.getMessage() for r in caplog.records] == [
        "otel-training: no tensor metrics for this model"
    ]
    _recorder.warn_once.clear()


def test_counts_outside_a_run_and_unusable_token_counts_are_ignored(caplog):
    """Before a run, micro-batches and global tokens are not counted; tokens_per_batch that
    returns no int or a negative count is no count (said once); a batch's size is the
    leading dimension of its first tensor, found breadth first through mappings and sequences."""
    torch = import_or_unavailable("torch")
    recorder = _recorder.RunRecorder()
    recorder.add_micro_batch(1.0, tokens=5)
    recorder.add_tokens_global(5)
    assert not recorder.counts_tokens and not recorder.active
    recorder.record_interval()  # nothing to record, no pipeline needed
    _recorder.warn_once.clear()
    with caplog.at_level("WARNING", logger="otel_training.integrations"):
        assert _recorder.count_tokens({}, None, lambda b: "many") is None
        assert _recorder.count_tokens({}, None, lambda b: None) is None
    assert len(caplog.records) == 1
    assert _recorder.count_tokens({}, None, lambda b: -1) is None
    assert _recorder.count_tokens({}, None, lambda b: 0) == 0
    assert _recorder.count_tokens({}, None, lambda b: torch.tensor(12)) == 12
    _recorder.warn_once.clear()
    nested = {"meta": [None, "x"], "inputs": [{"ids": torch.zeros(4, 2)}, torch.zeros(9)]}
    assert _recorder.batch_size_of(nested) == 9  # the shallower tensor: breadth first
    assert _recorder.batch_size_of({"meta": [None], "inputs": [{"ids": torch.zeros(4, 2)}]}) == 4
    assert _recorder.batch_size_of([torch.tensor(3.0), (torch.zeros(6, 1),)]) == 6
    assert _recorder.batch_size_of(torch.zeros(0, 5)) == 0
    assert _recorder.batch_size_of(["text", 3]) is None
    assert _recorder.count_tokens([torch.zeros(0, 5)], 7, None) == 0


def test_a_hook_that_raises_is_logged_once_and_returns_none(caplog):
    """guarded: an exception of a hook is logged once per hook (with its name) and the hook
    returns None; what a working hook returns is handed back."""

    class Hooks:
        @_recorder.guarded
        def broken(self, value):
            raise RuntimeError(value)

        @_recorder.guarded
        def working(self, value):
            return value * 2

    hooks = Hooks()
    _recorder.warn_once.clear()
    with caplog.at_level("WARNING", logger="otel_training.integrations"):
        assert hooks.broken(1) is None
        assert hooks.broken(2) is None
    assert hooks.working(3) == 6
    (said,) = caplog.records
    assert "Hooks.broken failed" in said.getMessage() and said.exc_info is not None
    _recorder.warn_once.clear()


@pytest.mark.parametrize("tokens_per_sample", [1, 7])
@pytest.mark.parametrize("flops_per_token", [1e-9, 0.5, 6e9])
def test_usable_arguments_are_accepted(tokens_per_sample, flops_per_token):
    """The smallest token count (1) and any positive finite FLOPs per token pass."""
    _recorder.validate_options("grad_norm:10", tokens_per_sample, None, flops_per_token)
    _recorder.validate_options(None, None, len, flops_per_token)


_POSITIVE = "flops_per_token must be a positive number, got"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"tokens_per_sample": 8, "tokens_per_batch": len},
            ValueError,
            "give tokens_per_sample= or tokens_per_batch=, not both",
        ),
        (
            {"tokens_per_sample": 2.0},
            ValueError,
            "tokens_per_sample must be a positive int, got 2.0",
        ),
        ({"tokens_per_batch": 8}, TypeError, "tokens_per_batch must be callable, got 8"),
        ({"flops_per_token": 0}, ValueError, f"{_POSITIVE} 0"),
        ({"flops_per_token": "many"}, ValueError, f"{_POSITIVE} 'many'"),
        ({"flops_per_token": float("inf")}, ValueError, f"{_POSITIVE} inf"),
    ],
)
def test_a_refused_argument_is_named_with_its_value(kwargs, error, message):
    options = {"tensor_metrics": None, "tokens_per_sample": None, "tokens_per_batch": None,
               "flops_per_token": None, **kwargs}  # fmt: skip
    with pytest.raises(error) as raised:
        _recorder.validate_options(**options)
    assert str(raised.value) == message


def test_an_unknown_tensor_metric_is_refused_with_the_known_ones():
    from otel_training import config

    with pytest.raises(ValueError) as raised:
        _recorder.validate_options("grad_norm:10,weight_decay:5", None, None, None)
    known = ", ".join(config.TENSOR_METRIC_NAMES)
    assert str(raised.value) == (
        f"tensor_metrics: unknown tensor metric 'weight_decay'; known: {known}"
    )


def test_memory_is_recorded_on_cuda_only(monkeypatch):
    """memory_allocated_gb is read and recorded with each interval of a run on CUDA, not of a
    run on the CPU."""
    monkeypatch.setattr(_recorder, "memory_allocated_gib", lambda: 1.5)
    for on_cuda, expected in ((True, [1.5]), (False, [])):
        recording = _Recording(monkeypatch)
        if on_cuda:
            recording.recorder.start_run(recording.identity, on_cuda=True)
        else:
            recording.recorder.start_run(recording.identity)
        recording.step(1, 1.0, (1.0, 4))
        recording.recorder.record_interval()
        assert recording.values("megatron.training.memory_allocated_gb") == expected
        recording.recorder.end_run()


def test_one_rank_counts_its_own_tokens_and_a_plain_end_of_step_is_not_skipped(monkeypatch):
    """World size 1: tokens/s is this rank's tokens over the step time; end_step() without
    arguments is a step that was not skipped (its loss counts, no skipped iteration)."""
    recording = _Recording(monkeypatch)
    recorder = recording.recorder
    recorder.start_run(recording.identity)
    recorder.begin_step(1)
    recorder.add_micro_batch(3.0, tokens=50)
    recording.clock.now += 2.0
    recorder.end_step()
    recorder.record_interval()
    assert recording.values("megatron.training.tokens_per_sec") == [pytest.approx(25.0)]
    assert recording.values("megatron.training.loss") == [3.0]
    assert recording.values("megatron.training.skipped_iters") == []  # none skipped
    recorder.end_run()


def test_given_providers_receive_what_the_recorder_records(monkeypatch):
    """With both providers given, the metrics carry the project's instrumentation scope; with
    only a meter provider, its metrics go there (spans to the configured pipeline); with only
    a tracer provider, its spans go there (metrics to the configured pipeline)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_training import configuration as setup
    from otel_training import testing
    from otel_training.semconv import spans as names

    recording = _Recording(monkeypatch)
    recording.recorder.start_run(recording.identity)
    recording.step(1, 1.0, (1.0, 4))
    scopes = {
        sm.scope.name
        for rm in recording.reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
    }
    assert scopes == {setup.INSTRUMENTATION_NAME}
    recording.recorder.end_run()

    pipeline = testing.configure_in_memory({"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step"})
    reader = InMemoryMetricReader()
    meter_only = _recorder.RunRecorder(meter_provider=MeterProvider(metric_readers=[reader]))
    meter_only.start_run(recording.identity)
    meter_only.begin_step(1)
    meter_only.end_step()
    meter_only.end_run()
    names_read = {m.name for m in metrics_of(reader.get_metrics_data())}
    assert "megatron.training.step_duration_ms" in names_read
    assert names.MEGATRON_TRAIN in {s.name for s in pipeline.spans.get_finished_spans()}

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer_only = _recorder.RunRecorder(tracer_provider=tracer_provider)
    tracer_only.start_run(recording.identity)
    tracer_only.begin_step(1)
    tracer_only.end_step()
    tracer_only.end_run()
    assert names.MEGATRON_TRAIN in {s.name for s in exporter.get_finished_spans()}
    testing.reset()


def test_the_observer_counts_the_frameworks_steps_and_records_to_the_recorders_meter(
    monkeypatch,
):
    """The tensor observer is built with the schedule given and the recorder's meter, and
    follows the framework's step numbers: a metric due every 10 steps is measured at step 10
    (a resumed run's first step) and recorded where the recorder's metrics go. A failed run
    closes its observer without waiting for results in flight."""
    torch = import_or_unavailable("torch")
    from otel_training.semconv.metrics import MEGATRON_TRAINING_TENSOR_GRAD_NORM

    recording = _Recording(monkeypatch, tensor_metrics="grad_norm:10")
    recorder = recording.recorder
    recorder.start_run(recording.identity)
    model = torch.nn.Linear(2, 2)
    recorder.watch_model(model)
    recorder.begin_step(10)
    model(torch.ones(1, 2)).sum().backward()
    recorder.begin_optimizer()
    recorder.end_step()
    recorder.end_run()
    assert recording.values(MEGATRON_TRAINING_TENSOR_GRAD_NORM)

    failing = _Recording(monkeypatch, tensor_metrics="grad_norm:10")
    failing.recorder.start_run(failing.identity)
    failing.recorder.watch_model(model)
    observer = failing.recorder.observer
    flushed = []
    monkeypatch.setattr(observer, "flush", lambda seconds: flushed.append(seconds))
    failing.recorder.fail_run(RuntimeError("stop"))
    assert flushed == [] and failing.recorder.observer is None
