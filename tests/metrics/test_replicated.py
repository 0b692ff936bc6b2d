"""Replicated values sent once (otel_training.metrics.replicated): one rank per pipeline stage
exports the values every data- and tensor-parallel peer holds alike, every rank keeps its own
series, and a rank without the parallel layout exports as before and says so."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import metrics_of

import otel_training
from otel_training import config, testing
from otel_training.metrics import replicated
from otel_training.metrics.replicated import (
    AUTO_WORLD_SIZE,
    REPLICATED_METRICS,
    ParallelLayout,
    decide,
)
from otel_training.semconv.metrics import (
    DL_TRAINING_PHASE_TIME,
    DL_TRAINING_PROGRESS_AGE,
    MEGATRON_TRAINING_GRAD_NORM,
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_SKIPPED_ITERS,
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS,
    MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
)
from otel_training.tensor.gauges import TensorMetricGauges

LAYOUT_KEYS = ("dl.pipeline_parallel.rank", "dl.tensor_parallel.rank", "dl.data_parallel.rank")
#: Metrics every rank keeps whatever the policy: its own step, throughput, memory and health.
RANK_OWN = {
    MEGATRON_TRAINING_STEP_DURATION_MS,
    MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
    MEGATRON_TRAINING_TOKENS_PER_SEC,
    MEGATRON_TRAINING_MEMORY_ALLOCATED_GB,
    MEGATRON_TRAINING_TENSOR_ACTIVATION_RMS,
    DL_TRAINING_PHASE_TIME,
    DL_TRAINING_PROGRESS_AGE,
}


def _layout(pp: object, tp: object, dp: object) -> dict[str, object]:
    return dict(zip(LAYOUT_KEYS, (pp, tp, dp)))


def test_the_replicated_set_is_the_registrys():
    """REPLICATED_METRICS holds the registry's replicated metrics and none a rank owns."""
    assert MEGATRON_TRAINING_LOSS in REPLICATED_METRICS
    assert MEGATRON_TRAINING_TENSOR_GRAD_NORM in REPLICATED_METRICS
    assert not RANK_OWN & set(REPLICATED_METRICS)
    assert list(REPLICATED_METRICS) == sorted(REPLICATED_METRICS)


@pytest.mark.parametrize(
    ("setting", "world", "layout", "policy", "exports"),
    [
        ("auto", AUTO_WORLD_SIZE, _layout(3, 1, 1), "all", True),
        ("auto", AUTO_WORLD_SIZE + 1, _layout(3, 1, 1), "pp_first", False),
        ("auto", 4096, _layout(15, 0, 0), "pp_first", True),
        ("auto", 4096, _layout(15, 0, 1), "pp_first", False),
        ("auto", 4096, _layout(15, 1, 0), "pp_first", False),
        ("pp_first", 8, _layout(0, 0, 0), "pp_first", True),
        ("pp_first", 8, _layout(1, 1, 0), "pp_first", False),
        ("all", 4096, _layout(15, 7, 31), "all", True),
    ],
)
def test_one_rank_per_stage_exports_under_pp_first(setting, world, layout, policy, exports):
    """pp_first (explicit, or auto above 64 ranks) keeps tp=0, dp=0 of each stage; all keeps all."""
    decision = decide(setting, world, layout)
    assert (decision.policy, decision.exports) == (policy, exports)
    assert decision.silent_metrics == (() if exports else REPLICATED_METRICS)


@given(
    pp=st.integers(0, 63),
    tp=st.integers(0, 15),
    dp=st.integers(0, 255),
    world=st.integers(AUTO_WORLD_SIZE + 1, 1 << 20),
)
def test_exactly_one_rank_of_each_stage_exports(pp, tp, dp, world):
    """For any layout, a rank exports under auto above 64 ranks iff its TP and DP ranks are 0."""
    assert decide("auto", world, _layout(pp, tp, dp)).exports is (tp == 0 and dp == 0)


def test_ranks_from_otel_resource_attributes_are_strings():
    """Decimal strings (OTEL_RESOURCE_ATTRIBUTES) count as ranks; other values do not."""
    assert ParallelLayout.from_attributes(_layout("2", " 0 ", "1")) == (ParallelLayout(2, 0, 1), ())
    layout, bad = ParallelLayout.from_attributes(_layout(True, -1, "x"))
    assert layout is None and bad == LAYOUT_KEYS


@pytest.mark.parametrize("setting", ["pp_first", "auto"])
def test_without_the_layout_every_rank_exports_and_says_why(setting):
    """A missing parallel rank keeps the old behaviour; the note names what is missing."""
    decision = decide(setting, 4096, {"dl.pipeline_parallel.rank": 3})
    assert (decision.policy, decision.exports) == ("all", True)
    assert "dl.tensor_parallel.rank, dl.data_parallel.rank" in decision.note
    assert "OTEL_PYTHON_TRAINING_EXPORT_REPLICATED" in decision.note


def test_all_ranks_by_default_up_to_64_say_nothing():
    """The default on a small job changes nothing and adds no note."""
    assert decide("auto", 64, {}) == replicated.ReplicatedExport("all", True, None)


def test_silent_rank_note_names_the_metrics_and_who_sends_them():
    """A silent rank's note lists the replicated metrics and the stage whose rank sends them."""
    note = decide("auto", 128, _layout(5, 2, 3)).note
    assert all(name in note for name in REPLICATED_METRICS)
    assert "pipeline stage 5" in note and "128 ranks > 64" in note


def test_config_reads_the_policy_with_one_warning_for_a_bad_value(caplog):
    """OTEL_PYTHON_TRAINING_EXPORT_REPLICATED: auto by default, case-insensitive, bad -> auto."""
    name = "OTEL_PYTHON_TRAINING_EXPORT_REPLICATED"
    assert config.load({}).export_replicated == "auto"
    assert config.load({name: "PP_First"}).export_replicated == "pp_first"
    caplog.clear()
    assert config.load({name: "one"}).export_replicated == "auto"
    (record,) = [r for r in caplog.records if "EXPORT_REPLICATED" in r.getMessage()]
    assert "using 'auto'" in record.getMessage()


class _Layers:
    """A tensor-metric source with two layers and the global value of every family."""

    def observe(self, family):
        return [({"megatron.training.layer": label}, 1.0) for label in ("0", "1", "global")]


def _run_rank(world: int, layout: dict[str, object], policy: str = "auto"):
    """One in-memory rank that records every training value and tensor metric; its points."""
    attributes = ",".join(f"{k}={v}" for k, v in layout.items())
    memory = testing.configure_in_memory(
        {
            "RANK": "1",
            "WORLD_SIZE": str(world),
            "OTEL_RESOURCE_ATTRIBUTES": attributes,
            "OTEL_PYTHON_TRAINING_EXPORT_REPLICATED": policy,
        }
    )
    otel_training.record_training_metrics(
        memory.meter,
        step_duration_ms=100.0,
        loss=2.5,
        throughput_tflops=100.0,
        grad_norm=1.0,
        skipped_iters=1,
        learning_rate=1e-4,
        tokens_per_sec=1000.0,
        memory_allocated_gb=10.0,
    )
    gauges = TensorMetricGauges(memory.meter)
    source = _Layers()
    gauges.add_source(source)
    names = {m.name for m in metrics_of(memory.reader.get_metrics_data())}
    return memory, names


def test_a_silent_rank_exports_its_own_series_and_no_replicated_one():
    """Rank tp=1 of a 128-rank job (auto): no loss, lr, grad norm, skip or parameter norm; its
    step, throughput, memory, activations and health all there; configure says so."""
    memory, names = _run_rank(128, _layout(2, 1, 0))
    assert not names & set(REPLICATED_METRICS)
    assert names >= RANK_OWN
    assert "not from this rank" in memory.telemetry.destination
    memory.telemetry.shutdown()


def test_the_stage_rank_exports_everything():
    """Rank tp=0, dp=0 of the same job exports the replicated values besides its own."""
    memory, names = _run_rank(128, _layout(2, 0, 0))
    expected_replicated = {
        MEGATRON_TRAINING_LOSS,
        MEGATRON_TRAINING_GRAD_NORM,
        MEGATRON_TRAINING_LEARNING_RATE,
        MEGATRON_TRAINING_SKIPPED_ITERS,
        MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    }
    assert names >= RANK_OWN | expected_replicated
    assert "from this rank for pipeline stage 2" in memory.telemetry.destination
    memory.telemetry.shutdown()


def test_a_small_job_exports_from_every_rank_without_a_word():
    """Up to 64 ranks the default is all: the same rank exports the replicated values."""
    memory, names = _run_rank(64, _layout(2, 1, 0))
    assert MEGATRON_TRAINING_LOSS in names
    assert "replicated" not in memory.telemetry.destination
    memory.telemetry.shutdown()


def test_a_rank_without_the_layout_exports_as_before_and_says_so():
    """auto above 64 ranks, no parallel ranks on the Resource: all exported, one note."""
    memory, names = _run_rank(4096, {"dl.job.id": "j"})
    assert MEGATRON_TRAINING_LOSS in names
    assert "replicated values from every rank" in memory.telemetry.destination
    memory.telemetry.shutdown()


def test_the_notes_say_the_policy_as_it_was_set():
    """The notes name the variable as set, the rank count only when auto decided, and the
    replicated metrics as a comma-separated list."""
    name = "OTEL_PYTHON_TRAINING_EXPORT_REPLICATED"
    sending = decide("pp_first", 8, _layout(2, 0, 0)).note
    assert sending == f"replicated values from this rank for pipeline stage 2 ({name}=pp_first)"
    silent = decide("pp_first", 8, _layout(2, 1, 0)).note
    assert silent == (
        f"replicated values ({', '.join(REPLICATED_METRICS)}) not from this rank: the rank of "
        f"pipeline stage 2 with tensor- and data-parallel rank 0 sends them ({name}=pp_first)"
    )
    assert decide("auto", 65, _layout(0, 0, 0)).note.endswith(f"({name}=auto (65 ranks > 64))")
