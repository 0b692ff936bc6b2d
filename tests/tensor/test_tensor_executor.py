"""The tensor-metric executor: batched norms, collectives packed across metrics and stages, one
host copy per due step, publication of asynchronous copies, flush before the final export."""

from __future__ import annotations

import logging
import math
import threading

import pytest
from support import import_or_unavailable

torch = import_or_unavailable("torch")

import numpy as np  # noqa: E402
from opentelemetry.sdk.metrics.export import (  # noqa: E402
    PeriodicExportingMetricReader,
)

from otel_training import configuration as setup  # noqa: E402
from otel_training.tensor import (  # noqa: E402
    GLOBAL,
    FamilyValues,
    Final,
    L2NormMetric,
    MaxAbsMetric,
    Owned,
    PublishedValues,
    Rows,
    Shard,
    Site,
    SiteKind,
    TensorMetric,
    TensorMetricExecutor,
    layer_attributes,
)
from otel_training.testing import RecordingMetricExporter  # noqa: E402

GRAD = frozenset({SiteKind.GRAD})
FAMILY = "megatron.training.tensor.grad_norm"
MAX_FAMILY = "megatron.training.tensor.activation_max_abs"


class FakeAxes:
    """Two ranks along every named axis; this process is ``rank`` along each."""

    version = ("fake",)

    def __init__(self, sizes: dict[str, int], rank: int = 0) -> None:
        self.sizes, self._rank = sizes, rank

    def size(self, axis: str) -> int:
        return self.sizes.get(axis, 1)

    def rank(self, axis: str) -> int:
        return self._rank if axis in self.sizes else 0

    def group(self, axis: str):
        return f"group-{axis}"


@pytest.fixture
def all_reduce(monkeypatch):
    """A fake all_reduce over identical ranks: SUM multiplies by the axis size, MAX keeps."""
    calls = []

    def fake(tensor, op=None, group=None, async_op=False):
        calls.append((group, str(op), tensor.numel()))
        if "SUM" in str(op).upper():
            tensor.mul_(2)

    monkeypatch.setattr(torch.distributed, "all_reduce", fake)
    return calls


def _rows(values, *placements, layer="decoder.layers.0"):
    sites = tuple(
        Site(f"p{i}", SiteKind.GRAD, layer, tuple(p.items())) for i, p in enumerate(placements)
    )
    return Rows(sites, torch.tensor(values, dtype=torch.float32), (1,) * len(sites))


def _executor(axes=None) -> TensorMetricExecutor:
    executor = TensorMetricExecutor(flush_on_shutdown=False)
    if axes is not None:
        executor.axes = axes
    return executor


def _values(executor: TensorMetricExecutor, family: str) -> dict[str, float]:
    return {
        next(iter(a.values())) if len(a) == 1 else tuple(a.values()): v
        for a, v in executor.published.observe(family)
    }


# -- packing and stages ---------------------------------------------------------------------


def test_collectives_of_all_metrics_are_packed_per_axis_and_op(all_reduce):
    """Two sum metrics and a max metric over dp make one SUM and one MAX all_reduce."""
    executor = _executor(FakeAxes({"dp": 2}))
    grad = L2NormMetric("grad_norm", GRAD, FAMILY)
    param = L2NormMetric(
        "param_norm", frozenset({SiteKind.PARAMETER}), "megatron.training.tensor.param_norm"
    )
    peak = MaxAbsMetric("activation_max_abs", frozenset({SiteKind.ACTIVATION}), MAX_FAMILY)
    dp = {"dp": Shard(0)}
    executor.run(
        1,
        [
            (grad, _rows([3.0, 4.0], dp, dp)),  # the norms of this rank's two shards
            (param, _rows([1.0], dp)),
            (peak, _rows([5.0, 2.0], dp, dp)),
        ],
    )
    assert sorted(op for _, op, _ in all_reduce) == sorted(
        [str(torch.distributed.ReduceOp.SUM), str(torch.distributed.ReduceOp.MAX)]
    )
    assert executor.stats.collectives == 2
    # Each fake rank holds the same shards, so the whole tensors have twice the squares.
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(math.sqrt(2 * (9.0 + 16.0)))
    assert _values(executor, MAX_FAMILY)[GLOBAL] == 5.0


def test_rows_sharded_on_two_axes_reduce_in_two_stages(all_reduce):
    """A tensor sharded over dp and tp reduces over dp, then tp; a dp-only one once."""
    executor = _executor(FakeAxes({"dp": 2, "tp": 2}))
    metric = L2NormMetric("grad_norm", GRAD, FAMILY)
    executor.run(
        1, [(metric, _rows([1.0, 1.0], {"dp": Shard(0), "tp": Shard(1)}, {"dp": Shard(0)}))]
    )
    assert [group for group, _, _ in all_reduce] == ["group-dp", "group-tp"]
    assert [n for _, _, n in all_reduce] == [2, 1]  # both rows over dp, then one over tp
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(math.sqrt(4 * 1.0 + 2 * 1.0))


def test_replicated_rows_are_not_communicated(all_reduce):
    """Replicated tensors count once, sharded ones are summed over ranks."""
    executor = _executor(FakeAxes({"dp": 2}))
    metric = L2NormMetric("grad_norm", GRAD, FAMILY)
    executor.run(1, [(metric, _rows([9.0, 1.0], {}, {"dp": Shard(0)}))])
    assert [n for _, _, n in all_reduce] == [1]
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(math.sqrt(81.0 + 2 * 1.0))


def test_rows_owned_by_another_rank_contribute_nothing(all_reduce):
    """An Owned row counts only on its owner: on rank 1 the rank-0 row becomes 0."""
    executor = _executor(FakeAxes({"ep": 2}, rank=1))
    metric = L2NormMetric("grad_norm", GRAD, FAMILY)
    executor.run(1, [(metric, _rows([100.0, 4.0], {"ep": Owned(0)}, {"ep": Owned(1)}))])
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(math.sqrt(2 * 16.0))


def test_no_process_group_means_no_collective(all_reduce):
    """Without process groups the executor never calls all_reduce."""
    executor = _executor()
    metric = L2NormMetric("grad_norm", GRAD, FAMILY)
    executor.run(1, [(metric, _rows([3.0], {"dp": Shard(0)}))])
    assert all_reduce == []
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(3.0)


# -- one copy, failures, the store ------------------------------------------------------------


class Boom(TensorMetric):
    name = "boom"
    kinds = GRAD
    families = ("megatron.training.tensor.grad_nonfinite",)

    def start(self, rows, axes):
        raise RuntimeError("freed tensor")


def test_one_host_copy_per_due_step_and_a_failing_metric_loses_only_itself(caplog):
    """Three metrics in a step: one copy; the raising one is dropped and logged once."""
    executor = _executor()
    grad = L2NormMetric("grad_norm", GRAD, FAMILY)
    peak = MaxAbsMetric("activation_max_abs", frozenset({SiteKind.ACTIVATION}), MAX_FAMILY)
    with caplog.at_level(logging.WARNING, logger="otel_training.tensor.executor"):
        for step in (1, 2, 3):
            executor.run(
                step,
                [(grad, _rows([4.0], {})), (Boom(), _rows([1.0], {})), (peak, _rows([2.0], {}))],
            )
    assert (executor.stats.due_steps, executor.stats.host_copies) == (3, 3)
    assert executor.stats.failures == 3
    assert sum("boom" in r.getMessage() for r in caplog.records) == 1
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(4.0)
    assert _values(executor, MAX_FAMILY)[GLOBAL] == 2.0


def test_published_values_are_capped_per_family_keeping_global(caplog):
    """max_series keeps the global value first; the cut is logged once."""
    store = PublishedValues(max_series=3)
    labels = [f"decoder.layers.{i}" for i in range(5)] + [GLOBAL]
    fv = FamilyValues(FAMILY, tuple(layer_attributes(x) for x in labels), np.arange(6.0))
    with caplog.at_level(logging.WARNING):
        store.publish(1, [fv])
        store.publish(2, [fv])
    kept = {a["megatron.training.layer"]: v for a, v in store.observe(FAMILY)}
    assert kept == {GLOBAL: 5.0, "decoder.layers.0": 0.0, "decoder.layers.1": 1.0}
    assert sum("max_series" in r.getMessage() for r in caplog.records) == 1


def test_reading_the_store_never_waits_for_a_publisher():
    """observe() returns on another thread while a publisher holds the publication lock."""
    store = PublishedValues()
    store.publish(1, [FamilyValues(FAMILY, (layer_attributes(GLOBAL),), np.array([1.5]))])
    found, done = [], threading.Event()

    def read() -> None:
        found.extend(store.observe(FAMILY))
        done.set()

    with store._lock:  # a publisher stuck mid-publication
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        returned_while_locked = done.wait(30)
    reader.join()
    assert returned_while_locked
    assert found == [(layer_attributes(GLOBAL), 1.5)]


# -- asynchronous copies ----------------------------------------------------------------------


class FakeEvent:
    """A device event that completes after ``after`` queries (never when ``after`` is None)."""

    def __init__(self, after: int | None) -> None:
        self.after, self.queries = after, 0

    def query(self) -> bool:
        self.queries += 1
        return self.after is not None and self.queries > self.after


class DeviceLikeExecutor(TensorMetricExecutor):
    """Takes the asynchronous (CUDA) path on CPU, with fake events."""

    def __init__(self, after: int | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.after = after

    @staticmethod
    def _is_host(device):
        return False

    def _copy_to_host(self, buffer):
        return buffer.clone(), FakeEvent(self.after)


def test_values_are_published_only_once_their_copy_has_landed():
    """poll() publishes nothing while the event is pending, then the steps in order."""
    executor = DeviceLikeExecutor(after=2, flush_on_shutdown=False)
    metric = L2NormMetric("grad_norm", GRAD, FAMILY)
    executor.run(1, [(metric, _rows([4.0], {}))])  # run polls once
    assert executor.published.observe(FAMILY) == [] and executor.pending == 1
    assert executor.poll() == 0  # second query: still in flight
    assert executor.poll() == 1
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(4.0)
    assert executor.published.step(FAMILY) == 1


def test_a_stalled_copy_makes_flush_return_false_at_its_deadline():
    """flush() polls a copy that never lands until its deadline, then returns False and keeps
    the copy pending."""
    executor = DeviceLikeExecutor(after=None, flush_on_shutdown=False)
    executor.run(1, [(L2NormMetric("grad_norm", GRAD, FAMILY), _rows([4.0], {}))])
    (pending,) = executor._pending
    queries = pending.event.queries
    assert executor.flush(0.05) is False
    assert pending.event.queries > queries + 1 and executor.pending == 1
    assert executor.published.observe(FAMILY) == []


def test_flush_returns_as_soon_as_the_copy_lands():
    """flush() publishes a copy that lands during the wait and returns True at once: the event
    is not queried again after it completed."""
    executor = DeviceLikeExecutor(after=3, flush_on_shutdown=False)
    executor.run(1, [(L2NormMetric("grad_norm", GRAD, FAMILY), _rows([4.0], {}))])
    (pending,) = executor._pending
    assert executor.flush(600.0) is True
    assert pending.event.queries == 4  # three "not yet", one "landed", no more
    assert _values(executor, FAMILY)[GLOBAL] == pytest.approx(4.0)


def test_a_device_far_behind_skips_steps_instead_of_queueing_without_bound(caplog):
    """With max_pending copies in flight a due step is skipped, counted and logged once."""
    executor = DeviceLikeExecutor(after=None, max_pending=2, flush_on_shutdown=False)
    metric = L2NormMetric("grad_norm", GRAD, FAMILY)
    with caplog.at_level(logging.WARNING):
        for step in range(1, 6):
            executor.run(step, [(metric, _rows([4.0], {}))])
    assert executor.pending == 2 and executor.stats.dropped == 3
    assert sum("still in flight" in r.getMessage() for r in caplog.records) == 1


def test_shutdown_publishes_landed_copies_before_the_final_export():
    """The executor's flush hook runs before the readers' last collection."""
    from otel_training.tensor import TensorMetricGauges

    exporter = RecordingMetricExporter()
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    telemetry = setup.configure(
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
        metric_readers=[reader],
        set_global=False,
    )
    executor = DeviceLikeExecutor(after=3)  # registers its flush hook
    TensorMetricGauges.for_meter(telemetry.meter).add_source(executor.published)
    executor.run(7, [(L2NormMetric("grad_norm", GRAD, FAMILY), _rows([9.0], {}))])
    assert executor.pending == 1  # still in flight when training ends
    assert telemetry.shutdown() is True
    final = exporter.exports[-1]
    by_layer = {p.attributes["megatron.training.layer"]: p.value for p in final[FAMILY]}
    assert by_layer == {"decoder.layers.0": 9.0, GLOBAL: 9.0}


def test_the_flush_hook_goes_away_with_the_executor():
    """An executor that is garbage collected no longer takes part in flushes."""
    import gc

    executor = TensorMetricExecutor()
    hook = setup._flush_hooks[-1]
    del executor
    gc.collect()
    assert hook not in setup._flush_hooks


def test_close_stops_taking_part_in_flushes():
    """close() removes the flush hook at once."""
    executor = TensorMetricExecutor()
    hook = setup._flush_hooks[-1]
    executor.close()
    assert hook not in setup._flush_hooks


def test_final_values_are_finished_on_the_reading_thread():
    """finish() runs when the values are first read, on that thread, once."""
    threads = []

    class Recording(TensorMetric):
        name = "recording"
        kinds = GRAD
        families = (FAMILY,)

        def start(self, rows, axes):
            def finish(host):
                threads.append(threading.current_thread().name)
                return [FamilyValues(FAMILY, (layer_attributes(GLOBAL),), host.astype(float))]

            return Final(rows.values, finish)

    executor = _executor()
    executor.run(1, [(Recording(), _rows([2.5], {}))])
    assert threads == []
    reader = threading.Thread(target=lambda: executor.published.observe(FAMILY), name="reader")
    reader.start()
    reader.join()
    executor.published.observe(FAMILY)
    assert threads == ["reader"]
    assert _values(executor, FAMILY)[GLOBAL] == 2.5
