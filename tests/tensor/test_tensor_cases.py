"""Cases A1 (a stalled or raising tensor metric must not stop metric export) and A9 (router
and per-layer tensor metrics stay within the cardinality limit) of the handed cases."""

from __future__ import annotations

import gc
import logging
import threading
import tracemalloc

import pytest
from support import import_or_unavailable

torch = import_or_unavailable("torch")

from opentelemetry.sdk.metrics.export import (  # noqa: E402
    PeriodicExportingMetricReader,
)
from torch import nn  # noqa: E402

from otel_training import configuration as setup  # noqa: E402
from otel_training.metrics.instruments import record_training_metrics  # noqa: E402
from otel_training.tensor import TensorMetricExecutor, TensorMetricGauges, TensorObserver  # noqa: E402
from otel_training.testing import RecordingMetricExporter, points  # noqa: E402

P = "megatron.training."
GRAD = P + "tensor.grad_norm"
BALANCE = P + "tensor.router_balance"


class NeverLanding:
    """A device event behind a reduction that never finishes."""

    def query(self) -> bool:
        return False


class StallingExecutor(TensorMetricExecutor):
    """After its first due step, every device-to-host copy stalls forever (on CPU, the path a
    CUDA copy stuck behind a long collective takes)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stall = False

    def _is_host(self, device):
        return not self.stall

    def _copy_to_host(self, buffer):
        return buffer.clone(), NeverLanding()


class RaisingRouterSource:
    """A router-statistics source that raises on every read (a freed or resized layer tensor)."""

    def __init__(self) -> None:
        self.calls = 0

    def observe(self, family):
        if family != BALANCE:
            return []
        self.calls += 1
        raise RuntimeError("router tensor was resized")


class MoeBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Linear(4, 4)
        self.router = nn.Linear(4, 3, bias=False)
        self.top_k = 1

    def forward(self, x):
        return x + self.mlp(x) * self.router(x).softmax(-1).max(-1, keepdim=True).values


def test_a1_stalled_and_raising_tensor_metrics_do_not_stop_export(caplog):
    """Every collection completes and exports loss and step time while grad-norm copies stall
    and a router source raises; the stalled gauge keeps its last completed values; the reader
    thread lives; each failure is logged once."""
    exporter = RecordingMetricExporter()
    # Collections are driven by the test (reader.force_flush) rather than by the clock, so the
    # test asserts what each collection holds, not when it happened.
    reader = PeriodicExportingMetricReader(
        exporter, export_interval_millis=3_600_000, export_timeout_millis=500
    )
    telemetry = setup.configure(
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
        metric_readers=[reader],
        set_global=False,
    )
    model = nn.Module()
    model.layers = nn.ModuleList([MoeBlock(), MoeBlock()])
    executor = StallingExecutor()
    observer = TensorObserver(
        model, "grad_norm:1,router:1", meter=telemetry.meter, executor=executor
    )
    raising = RaisingRouterSource()
    TensorMetricGauges.for_meter(telemetry.meter).add_source(raising)

    def step(n: int) -> None:
        observer.begin_step(n)
        model.layers[1](model.layers[0](torch.randn(8, 4))).square().mean().backward()
        observer.commit()

    step(1)  # completes: the last values the stalled gauge may report
    first = {a["megatron.training.layer"]: v for a, v in executor.published.observe(GRAD)}
    executor.stall = True
    completed = []
    with caplog.at_level(logging.WARNING):
        for n in range(2, 10):
            step(n)
            record_training_metrics(telemetry.meter, loss=2.5, step_duration_ms=100.0)
            completed.append(reader.force_flush(timeout_millis=5_000))
        alive = reader._daemon_thread.is_alive()
        in_flight, dropped = executor.pending, executor.stats.dropped
        telemetry.shutdown(timeout_millis=2_000)
    observer.close()

    assert completed == [True] * 8  # no collection was held by the stalled copies
    assert alive
    collected = exporter.exports[:8]
    assert len(collected) == 8
    for found in collected:
        assert P + "loss" in found and P + "step_duration_ms" in found
        grad = {p.attributes["megatron.training.layer"]: p.value for p in found.get(GRAD, [])}
        assert grad == first  # the last completed values, never a partial or newer step
        assert found.get(BALANCE)  # the router metric's own values still export
    # Four copies stay in flight (max_pending); the later due steps are dropped and counted.
    assert (in_flight, dropped) == (4, 4)
    assert raising.calls >= 8
    messages = [r.getMessage() for r in caplog.records]
    assert sum("router tensor was resized" in m for m in messages) == 1
    assert sum("still in flight" in m for m in messages) == 1


def _series(reader) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for name, point in points(reader.get_metrics_data()):
        found.setdefault(name, []).append(dict(point.attributes))
    return found


class RouterLayer(nn.Module):
    def __init__(self, experts: int | None) -> None:
        super().__init__()
        self.mlp = nn.Linear(4, 4)
        self.router = nn.Linear(4, experts, bias=False) if experts else None
        self.top_k = 2

    def forward(self, x):
        if self.router is not None:
            self.router(x)
        return x + self.mlp(x)


@pytest.mark.parametrize("opt_in", [False, True])
def test_a9_router_and_layer_metrics_stay_under_the_cardinality_limit(
    opt_in, caplog, in_memory_meter
):
    """48 MoE layers x 128 experts and 96 layers of grad norms: per-layer summaries, at most
    max_expert_series per-expert series on opt-in only, no overflow series."""
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleList([RouterLayer(128 if i < 48 else None) for i in range(96)])
    schedule = "grad_norm:1,router:1" + (",router_expert_load:1" if opt_in else "")
    observer = TensorObserver(model, schedule, meter=in_memory_meter.meter)
    with caplog.at_level(logging.WARNING):
        for step in (1, 2):
            observer.begin_step(step)
            x = torch.randn(64, 4)
            for layer in model.layers:
                x = layer(x)
            x.square().mean().backward()
            observer.commit()
            found = _series(in_memory_meter.reader)
    assert all(len(series) <= 2000 for series in found.values())
    assert not any("otel.metric.overflow" in a for series in found.values() for a in series)
    assert len(found[GRAD]) == 97  # 96 layers + global
    assert len(found[BALANCE]) == 48 * 3  # per layer: max/mean, CV, dead fraction
    assert len(found[P + "tensor.router_entropy"]) == 48
    if opt_in:
        assert len(found[P + "tensor.router_expert_load"]) == 256  # the default cap
        assert sum("max_expert_series" in r.getMessage() for r in caplog.records) == 1
    else:
        assert P + "tensor.router_expert_load" not in found


@pytest.mark.slow
def test_a9_memory_is_flat_from_step_1000_to_10000(in_memory_meter):
    """The executor, its store and the gauges keep no per-step state: memory stays flat."""
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(4)])
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    observer = TensorObserver(model, "grad_norm:1,param_norm:1", meter=in_memory_meter.meter)
    tracemalloc.start()
    try:
        for step in range(1, 10_001):
            observer.begin_step(step)
            observer.commit()
            if step % 1000 == 0:
                in_memory_meter.reader.get_metrics_data()
            if step == 1000:
                gc.collect()
                at_1000 = tracemalloc.get_traced_memory()[0]
        gc.collect()
        at_10000 = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert observer.executor.stats.published == 10_000
    assert at_10000 - at_1000 < 1_000_000, (at_1000, at_10000)


def test_gauge_callbacks_do_not_wait_for_a_busy_training_thread(in_memory_meter):
    """A collection returns while the training thread is blocked inside a commit."""
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(2, 2)])
    observer = TensorObserver(model, "param_norm:1", meter=in_memory_meter.meter)
    observer.commit()
    entered, release = threading.Event(), threading.Event()
    original = observer.executor._run

    def blocked_run(step, work):
        entered.set()
        release.wait(30)
        original(step, work)

    observer.executor._run = blocked_run
    worker = threading.Thread(target=observer.commit)
    worker.start()
    try:
        assert entered.wait(30)
        found = _series(in_memory_meter.reader)
        still_blocked = worker.is_alive()  # the commit had not returned when the reading did
    finally:
        release.set()
        worker.join()
    assert still_blocked
    assert len(found[P + "tensor.param_norm"]) == 2
