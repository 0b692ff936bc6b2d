"""What the framework-callback tests share: each framework's driver, and reading what
arrived.

Not a test module.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from otel_training.semconv.spans import (
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_EVALUATE,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_FIRST_ITERATION,
    MEGATRON_TRAIN_ITERATION,
    MEGATRON_TRAIN_ITERATION_OPTIMIZER,
    MEGATRON_TRAIN_SEGMENT,
)

STEP = "megatron.training.step_duration_ms"
#: Per framework: the packages its driver needs, and the driver (a module of this folder).
_DRIVERS = {
    "lightning": (("lightning",), "lightning_run"),
    "transformers": (("transformers", "accelerate"), "transformers_run"),
}


def driver_of(framework: str) -> ModuleType:
    """The driver of ``framework``'s tests (``lightning_run``, ``transformers_run``: a small
    real run with the callback), imported once its packages are
    (:func:`support.import_or_unavailable`)."""
    from support import import_or_unavailable  # not at the top: the drivers also run as scripts

    packages, module = _DRIVERS[framework]
    for package in packages:
        import_or_unavailable(package)
    return importlib.import_module(module)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """One torch thread inside the block (a driver's tiny matrices: more threads only contend
    on a shared machine), the count before it after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def receiver_run(framework: str, monkeypatch, receiver) -> Callable[..., dict]:
    """``run(root, **kwargs)``: the driver's ``train`` in this process, the callback
    configuring the pipeline from OTEL_* pointing at ``receiver`` (metrics exported at
    shutdown, every span group); shut down before it returns."""
    train = driver_of(framework).train
    import otel_training

    for key, value in receiver.env("grpc").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_SPAN_GROUPS", "all")

    def run(root: Path, **kwargs):
        try:
            return train(root, **kwargs)
        finally:
            otel_training.shutdown()

    return run


def collections_by_rank(receiver) -> dict[int, list[dict[str, list]]]:
    """Per ``dl.rank``, the metric collections in time order, each ``{name: [points]}`` (the
    points of one collection share its ``time_unix_nano``)."""
    grouped: dict[int, dict[int, dict[str, list]]] = {}
    for point in receiver.metrics():
        rank = point.resource_attributes.get("dl.rank")
        by_time = grouped.setdefault(rank, {})
        by_time.setdefault(point.time_unix_nano, {}).setdefault(point.name, []).append(point)
    return {rank: [found[t] for t in sorted(found)] for rank, found in grouped.items()}


def by_step_count(collections: Sequence[dict[str, list]], name: str) -> dict[int, float]:
    """``{optimizer steps recorded so far: value of the gauge or counter name}``, from each
    collection that has both (the first collection of each step count)."""
    found: dict[int, float] = {}
    for collection in collections:
        if STEP not in collection or name not in collection:
            continue
        steps = collection[STEP][0].count
        points = [p for p in collection[name] if not p.attributes]
        if points and steps not in found:
            found[steps] = points[0].value
    return found


def last_collection(collections: Sequence[dict[str, list]]) -> dict[str, list]:
    """The final collection (the one at shutdown)."""
    return collections[-1]


def tensor_gauges(collection: dict[str, list], family: str) -> dict[str, float]:
    """``{layer label: value}`` of the tensor-metric gauge ``family`` in one collection."""
    points = collection.get(f"megatron.training.tensor.{family}", [])
    return {p.attributes["megatron.training.layer"]: p.value for p in points}


def rate_bounds(
    tokens: float, before_ends: Sequence[float], after_ends: Sequence[float], first: int, last: int
) -> tuple[float, float]:
    """Bounds of tokens/s over the steps ``first..last`` (1-based), from timestamps taken by
    probes just before and just after the callback's hook at each boundary: index 0 is the
    start of the run, index i the end of step i. The callback's clock reads lie between."""
    shortest = before_ends[last] - after_ends[first - 1]
    longest = after_ends[last] - before_ends[first - 1]
    return tokens / longest, tokens / shortest


def named(spans: Sequence, name: str) -> list:
    """The spans named ``name`` (a constant of ``otel_training.semconv.spans``)."""
    return [s for s in spans if s.name == name]


def runs(spans: Sequence) -> list:
    """Each rank's run span (``megatron.train``)."""
    return named(spans, MEGATRON_TRAIN)


def iteration_spans(spans: Sequence) -> list:
    """Each rank's iteration spans (``megatron.train.iteration``)."""
    return named(spans, MEGATRON_TRAIN_ITERATION)


def classify(spans: Sequence) -> dict[str, list]:
    """One rank's spans by role, checking their places: the run (the run trace's root); its
    segment span in the job trace (the root there: a lone rank keeps it), linked to the run;
    the step trace's root segment span, linked to that one; the first iteration wrapping
    iteration 1; iterations in the step trace, evaluations and saves in the job trace;
    optimizer updates in their iterations. Every span has a role."""
    (run,) = runs(spans)
    segments = named(spans, MEGATRON_TRAIN_SEGMENT)
    (segment,) = [s for s in segments if [link[1] for link in s.links] == [run.span_id]]
    (step_root,) = [s for s in segments if s is not segment]
    assert [link[1] for link in step_root.links] == [segment.span_id]
    assert not run.parent_span_id and not segment.parent_span_id
    assert not step_root.parent_span_id
    (first,) = named(spans, MEGATRON_TRAIN_FIRST_ITERATION)
    roles = {
        "iterations": iteration_spans(spans),
        "updates": named(spans, MEGATRON_TRAIN_ITERATION_OPTIMIZER),
        "saves": named(spans, MEGATRON_CHECKPOINT_SAVE),
        "evaluations": named(spans, MEGATRON_EVALUATE),
    }
    assert len(spans) == 4 + sum(len(v) for v in roles.values())
    ids = {s.span_id for s in roles["iterations"]}
    assert all(s.parent_span_id in ids for s in roles["updates"])
    in_segment = [*roles["saves"], *roles["evaluations"]]
    assert all(s.parent_span_id == segment.span_id for s in in_segment)
    in_step = [first, *(s for s in roles["iterations"] if s.parent_span_id != first.span_id)]
    assert all(s.parent_span_id == step_root.span_id for s in in_step)
    return {"run": run, "segment": segment, "step_root": step_root, "first": first, **roles}


def step_windows(events: Sequence) -> dict[int, tuple[tuple[float, float], tuple[float, float]]]:
    """``{step: ((start_lo, start_hi), (end_lo, end_hi))}`` from probe events in the order the
    training thread met them: ``(tag, "-", t, step)`` just before and ``(tag, "+", t, step)``
    just after the callback's hook at a step boundary (``start``, ``end``, ``eval``, ``save``),
    ``("begin", "", t, step)`` at a step's first micro-batch. A step starts at the last
    boundary before its first micro-batch and ends at its ``end``: the callback's clock reads
    lie inside each bracket."""
    opened: dict[str, float] = {}
    boundary: tuple[float, float] | None = None
    starts: dict[int, tuple[float, float]] = {}
    windows = {}
    for tag, side, t, step in events:
        if tag == "begin":
            assert boundary is not None, "a step began before the training loop started"
            starts[step] = boundary
        elif side == "-":
            opened[tag] = t
        else:
            boundary = (opened.pop(tag), t)
            if tag == "end":
                windows[step] = (starts[step], boundary)
    return windows


def duration_bounds(windows: dict, first: int, last: int) -> tuple[float, float]:
    """The shortest and longest possible summed duration of the steps ``first..last`` (s)."""
    steps = [windows[step] for step in range(first, last + 1)]
    shortest = math.fsum(end[0] - start[1] for start, end in steps)
    longest = math.fsum(end[1] - start[0] for start, end in steps)
    return shortest, longest


THROUGHPUT_GAUGES = ("megatron.training.tokens_per_sec", "megatron.training.throughput_tflops")


def throughput_gauges(reader) -> dict[str, float]:
    """The throughput gauges of an ``InMemoryMetricReader`` now (it collects)."""
    from otel_training.testing import points

    data = reader.get_metrics_data()
    found = {}
    for name in THROUGHPUT_GAUGES:
        if gauge := points(data, name):
            ((_, point),) = gauge
            found[name] = point.value
    return found


def in_memory_providers():
    """Providers of a test's own: (callback keyword arguments, metric reader, span exporter)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    kwargs = {"meter_provider": MeterProvider(metric_readers=[reader]),
              "tracer_provider": tracer_provider}  # fmt: skip
    return kwargs, reader, exporter


def steps_recorded(reader) -> int:
    """Points of step_duration_ms in ``reader`` (one per optimizer step that completed)."""
    from otel_training import testing

    found = [p for _, p in testing.points(reader.get_metrics_data(), STEP)]
    return found[0].count if found else 0


def process_wide_registrations() -> tuple:
    """What is registered process-wide now: module registration hooks of both kinds, the
    pipeline's flush hooks, ``sys.excepthook``."""
    import sys

    from torch.nn.modules import module as registry

    from otel_training import configuration as setup

    return (
        len(registry._global_module_registration_hooks),
        len(registry._global_parameter_registration_hooks),
        len(setup._flush_hooks),
        sys.excepthook,
    )


def run_as_recorded(telemetry, snapshot: dict[str, float]) -> tuple:
    """What one run exported to an in-memory pipeline, to compare with another run: its
    iteration numbers, its run spans, the metric names so far. Checks on the way that the
    ``param_norm`` tensor gauge holds this run's global norm of ``snapshot`` (``param:NAME``
    -> norm, the test's own at the last commit)."""
    from support import l2  # not at the top: the drivers also run as scripts

    norm = l2(v for k, v in snapshot.items() if k.startswith("param:"))
    found = {p.attributes["megatron.training.layer"]: p.value
             for _, p in telemetry.points("megatron.training.tensor.param_norm")}  # fmt: skip
    assert found["global"] == pytest.approx(norm, rel=1e-5)
    spans = telemetry.spans.get_finished_spans()
    iterations = sorted(s.attributes["megatron.iteration"] for s in iteration_spans(spans))
    return iterations, len(runs(spans)), sorted({name for name, _ in telemetry.points()})


def callbacks_with_readers(options: dict[str, dict]) -> tuple[dict, list[dict]]:
    """One callback's keyword arguments per entry of ``options`` (name -> its own options),
    each with an ``InMemoryMetricReader`` and a tracer provider of its own and no tensor
    metrics; returns ``({name: reader}, [kwargs, ...])``."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    readers = {name: InMemoryMetricReader() for name in options}
    kwargs = [
        {
            "meter_provider": MeterProvider(metric_readers=[readers[name]]),
            "tracer_provider": TracerProvider(),
            "tensor_metrics": "none",
            **own,
        }
        for name, own in options.items()
    ]
    return readers, kwargs
