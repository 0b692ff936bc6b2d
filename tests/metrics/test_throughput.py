"""Per-step accounting under gradient accumulation (case A7) and the FLOP formulas."""

from __future__ import annotations

import math

import pytest
from doc_rules import documents
from support import import_or_unavailable

from otel_training.metrics.throughput import (
    StepAccumulator,
    gpt_flops_per_token,
    tflops_per_device,
)

# Case A7: 8 data-parallel ranks, accumulation 4, micro-batch 2 x 2048 tokens.
DP = 8
MICRO_BATCH_TOKENS = 2 * 2048
MICRO_BATCH_S = (0.3, 0.3, 0.3, 0.7)
MICRO_BATCH_LOSSES = (2.0, 2.2, 1.8, 2.0)


def _a7_step(acc: StepAccumulator, *, skipped: bool = False):
    for loss in MICRO_BATCH_LOSSES:
        acc.add_micro_batch(loss, tokens=MICRO_BATCH_TOKENS)
    return acc.end_step(sum(MICRO_BATCH_S), skipped=skipped)


def test_a7_step_rate_is_global_tokens_over_step_time():
    """One A7 step gives 131,072 tokens / 1.6 s = 81,920 tokens/s globally, 10,240 per GPU."""
    acc = StepAccumulator(data_parallel_size=DP)
    record = _a7_step(acc)
    assert record.tokens_global == 131_072
    assert record.duration_s == pytest.approx(1.6)
    assert record.tokens_per_sec_global == pytest.approx(81_920)
    assert record.tokens_per_sec_per_device == pytest.approx(10_240)
    assert record.duration_ms == pytest.approx(1600)


@documents("README.md", "over the whole job (this rank's × the data-parallel size)")
def test_a7_interval_rate_avoids_the_known_wrong_values():
    """The interval rate is 81,920 (10,240 per GPU), never 20,480 nor the ~93,623 rate mean."""
    acc = StepAccumulator(data_parallel_size=DP)
    for _ in range(3):
        _a7_step(acc)
    stats = acc.interval()
    assert stats.tokens_per_sec_global == pytest.approx(81_920)
    assert stats.tokens_per_sec_per_device == pytest.approx(10_240)
    # The case's two wrong answers, as the case gives them (tokens of one micro-batch over
    # the step's time; the mean of per-micro-batch rates): the accumulator gives neither.
    for wrong in (20_480, 93_623):
        assert not math.isclose(stats.tokens_per_sec_global, wrong, rel_tol=1e-3)
    assert stats.steps == 3
    assert stats.mean_step_duration_s == pytest.approx(1.6)
    assert stats.mean_step_duration_ms == pytest.approx(1600)


def test_a7_accumulation_setting_does_not_change_the_rate():
    """Accumulation 1 with a 4x micro-batch at the same 1.6 s gives the same 81,920 tokens/s."""
    acc = StepAccumulator(data_parallel_size=DP)
    acc.add_micro_batch(2.0, tokens=4 * MICRO_BATCH_TOKENS)
    record = acc.end_step(1.6)
    stats = acc.interval()
    assert record.tokens_per_sec_global == pytest.approx(81_920)
    assert stats.tokens_per_sec_global == pytest.approx(81_920)
    assert stats.tokens_per_sec_per_device == pytest.approx(10_240)


@documents(
    "README.md",
    "mean of the micro-batch losses over the log interval's non-skipped optimizer steps",
)
def test_a7_step_loss_is_the_micro_batch_mean_one_per_step():
    """The step's loss is 2.0, the mean of its micro-batches, as one value per optimizer step."""
    acc = StepAccumulator(data_parallel_size=DP)
    records = [_a7_step(acc) for _ in range(2)]
    assert [r.loss for r in records] == [pytest.approx(2.0), pytest.approx(2.0)]
    assert all(r.micro_batches == 4 for r in records)
    assert acc.interval().loss == pytest.approx(2.0)


@documents(
    "README.md",
    "mean of the micro-batch losses over the log interval's non-skipped optimizer steps",
)
def test_skipped_steps_are_left_out_of_the_loss_but_counted():
    """A skipped step's loss is excluded from the interval loss; it is counted and its work kept."""
    acc = StepAccumulator(data_parallel_size=DP)
    _a7_step(acc)
    acc.add_micro_batch(float("nan"), tokens=MICRO_BATCH_TOKENS)
    acc.end_step(0.4, skipped=True)
    stats = acc.interval()
    assert stats.loss == pytest.approx(2.0)
    assert stats.skipped_iters == 1
    assert stats.steps == 2
    assert stats.tokens_global == 131_072 + MICRO_BATCH_TOKENS * DP
    assert stats.tokens_per_sec_global == pytest.approx(stats.tokens_global / 2.0)


def test_interval_of_only_skipped_steps_has_no_loss():
    """When every step of an interval was skipped the loss is None (nothing to record)."""
    acc = StepAccumulator()
    acc.add_micro_batch(float("inf"), tokens=10)
    acc.end_step(1.0, skipped=True)
    stats = acc.interval()
    assert stats.loss is None
    assert stats.skipped_iters == 1


def test_interval_resets_after_each_call():
    """Each interval covers only the steps since the previous call."""
    acc = StepAccumulator()
    acc.add_micro_batch(4.0, tokens=100)
    acc.end_step(1.0)
    acc.interval()
    acc.add_micro_batch(1.0, tokens=300)
    acc.end_step(1.0)
    stats = acc.interval()
    assert stats.loss == pytest.approx(1.0)
    assert stats.tokens_per_sec_global == pytest.approx(300)
    assert stats.steps == 1
    assert acc.step == 2
    empty = acc.interval()
    assert (empty.steps, empty.loss, empty.tokens_per_sec_global) == (0, None, None)


@documents("README.md", "per device: that / world size")
def test_world_size_divides_the_per_device_rate():
    """With tensor/pipeline parallelism the per-device rate divides by the full world size."""
    acc = StepAccumulator(data_parallel_size=2, world_size=8)
    acc.add_micro_batch(1.0, tokens=1000)
    acc.end_step(1.0)
    stats = acc.interval()
    assert stats.tokens_per_sec_global == pytest.approx(2000)
    assert stats.tokens_per_sec_per_device == pytest.approx(250)


def test_tensor_losses_are_averaged_as_tensors_without_host_reads():
    """0-d tensor losses stay tensors (detached, no .item()) and average to the right value."""
    torch = import_or_unavailable("torch")
    acc = StepAccumulator(data_parallel_size=DP)
    weight = torch.ones((), requires_grad=True)
    for loss in MICRO_BATCH_LOSSES:
        acc.add_micro_batch(weight * loss, tokens=MICRO_BATCH_TOKENS)
    record = acc.end_step(1.6)
    stats = acc.interval()
    for value in (record.loss, stats.loss):
        assert isinstance(value, torch.Tensor)
        assert value.dim() == 0
        assert not value.requires_grad
        assert value.item() == pytest.approx(2.0)
    assert stats.tokens_per_sec_global == pytest.approx(81_920)


def test_half_precision_tensor_losses_are_averaged_in_float32():
    """bf16 losses are averaged in fp32, so accumulation does not round the mean."""
    torch = import_or_unavailable("torch")
    acc = StepAccumulator()
    for loss in MICRO_BATCH_LOSSES:
        acc.add_micro_batch(torch.tensor(loss, dtype=torch.bfloat16), tokens=1)
    acc.end_step(1.0)
    loss = acc.interval().loss
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(2.0, abs=0.01)


def test_invalid_hot_path_values_are_dropped_not_raised():
    """A negative token count or a NaN duration is dropped with a warning, never raised."""
    acc = StepAccumulator()
    acc.add_micro_batch(1.0, tokens=-5)
    acc.add_micro_batch(1.0, tokens=10)
    record = acc.end_step(float("nan"))
    assert record.duration_s is None
    assert record.tokens_per_sec_global is None
    acc.add_micro_batch(1.0, tokens=10)
    acc.end_step(2.0)
    stats = acc.interval()
    assert stats.steps == 2
    assert stats.tokens_per_sec_global == pytest.approx(5.0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_constructor_rejects_bad_sizes(bad):
    """The constructor raises ValueError for a data-parallel size that is not a positive int."""
    with pytest.raises(ValueError):
        StepAccumulator(data_parallel_size=bad)


@documents("README.md", "FLOPs/token = 6N + 12·L·d·S (+ 6·d·V with a tied head")
def test_gpt_flops_per_token_formula():
    """FLOPs/token = 6N + 12·L·d·S (+ 6·d·V for an output head outside N)."""
    n, layers, d, s = 124_000_000, 12, 768, 1024
    assert gpt_flops_per_token(n, layers, d, s) == 6 * n + 12 * layers * d * s
    assert gpt_flops_per_token(n, layers, d, s, vocab_size=50_257) == (
        6 * n + 12 * layers * d * s + 6 * d * 50_257
    )
    with pytest.raises(ValueError):
        gpt_flops_per_token(-1, layers, d, s)


def test_tflops_per_device():
    """TFLOP/s per device = FLOPs/token x tokens/s per device / 1e12."""
    assert tflops_per_device(1e9, 10_240) == pytest.approx(10.24)


def test_unusable_losses_are_dropped_not_raised():
    """A vector, a string or a list as loss is dropped with a warning; end_step never raises."""
    torch = import_or_unavailable("torch")
    accumulator = StepAccumulator()
    for bad in (torch.ones(3), "x", [1.0]):
        accumulator.add_micro_batch(loss=bad, tokens=4)
        assert accumulator.end_step(1.0).loss is None
    accumulator.add_micro_batch(loss=torch.tensor([3.0]), tokens=4)
    assert float(accumulator.end_step(1.0).loss) == 3.0


@documents(
    "README.md",
    "model FLOPs of the interval over all GPUs / (the interval's summed step time",
)
def test_throughput_is_the_one_definition_of_the_job_and_device_rates():
    """throughput(): tokens/s = job tokens / time; per device = that / world size; TFLOP/s per
    device = FLOPs / (time x 1e12 x world size), Megatron-LM's training_log formula."""
    from otel_training.metrics.throughput import Throughput, global_count, throughput

    # 2 data-parallel ranks, each 3 micro-batches of 4 x 128 tokens, in 0.25 s.
    job_tokens = global_count(3 * 4 * 128, 2)
    assert job_tokens == 3072
    figures = throughput(0.25, world_size=2, tokens_global=job_tokens, flops_per_token=1e9)
    assert figures.tokens_per_sec_global == pytest.approx(12_288)
    assert figures.tokens_per_sec_per_device == pytest.approx(6_144)
    assert figures.tflops_per_device == pytest.approx(6.144)
    # A framework's own FLOP count of the interval over all devices: 4e12 FLOPs, 2 s, 4 GPUs.
    counted = throughput(2.0, world_size=4, flops_global=4e12)
    assert counted.tflops_per_device == pytest.approx(0.5)
    assert counted.tokens_per_sec_global is None
    # flops_per_token wins over a framework's count; without tokens there is no TFLOP/s from it.
    assert throughput(1.0, tokens_global=10, flops_per_token=1e12, flops_global=5e12) == (
        throughput(1.0, tokens_global=10, flops_per_token=1e12)
    )
    assert throughput(1.0, flops_per_token=1e9).tflops_per_device is None
    assert throughput(2.0, flops_per_token=1e9, flops_global=4e12).tflops_per_device == 2.0
    for no_time in (0.0, -1.0, None, float("nan")):
        assert throughput(no_time, tokens_global=10, flops_global=1.0) == Throughput(
            None, None, None
        )


@documents("README.md", "`StepAccumulator` gives both")
@documents(
    "README.md",
    "Both throughput figures are defined once, in `otel_training.metrics.throughput.throughput()`",
)
def test_interval_and_step_figures_come_from_throughput():
    """StepAccumulator's step and interval rates, and IntervalStats.throughput(), equal
    throughput() over the same tokens and summed step time."""
    from otel_training.metrics.throughput import Throughput, throughput

    acc = StepAccumulator(data_parallel_size=2, world_size=4)
    acc.add_micro_batch(1.0, tokens=300)
    acc.add_tokens_global(60)
    record = acc.end_step(0.5)
    acc.add_micro_batch(1.0, tokens=100)
    acc.end_step(1.5)
    stats = acc.interval()
    assert record.tokens_global == 660
    assert record.tokens_per_sec_per_device == pytest.approx(660 / 0.5 / 4)
    expected = throughput(2.0, world_size=4, tokens_global=860, flops_per_token=2e9)
    assert stats.throughput(flops_per_token=2e9) == expected
    assert expected.tflops_per_device == pytest.approx(2e9 * 860 / (2.0 * 1e12 * 4))
    assert (stats.tokens_per_sec_global, stats.tokens_per_sec_per_device) == (
        expected.tokens_per_sec_global,
        expected.tokens_per_sec_per_device,
    )
    assert stats.throughput(count_tokens=False, flops_per_token=2e9) == Throughput(None, None, None)


def test_a_gathered_token_count_that_is_not_a_count_is_dropped_with_one_warning(caplog):
    """add_tokens_global takes 0 and positive ints; a negative, fractional or boolean count is
    dropped with one warning for the cause "invalid token count", shared with
    add_micro_batch's (said once, whichever method meets it first)."""
    from otel_training.metrics import throughput as module

    module._warn_once.clear()
    acc = StepAccumulator()
    with caplog.at_level("WARNING", logger="otel_training.metrics.throughput"):
        acc.add_tokens_global(0)
        acc.add_tokens_global(7)
        assert caplog.records == []
        for bad in (-5, 2.5, True):
            acc.add_tokens_global(bad)
        acc.add_micro_batch(None, tokens=-1)
    assert [r.getMessage() for r in caplog.records] == [
        "StepAccumulator: dropping invalid token count -5"
    ]
    assert acc.end_step(1.0).tokens_global == 7
    module._warn_once.clear()


def test_skipped_steps_are_counted_per_interval():
    """The skipped steps of an interval are those since the previous interval."""
    acc = StepAccumulator()
    _a7_step(acc, skipped=True)
    assert acc.interval().skipped_iters == 1
    _a7_step(acc)
    assert acc.interval().skipped_iters == 0


def test_a_steps_and_an_intervals_tflops_use_the_flops_given():
    """StepRecord.throughput(flops_per_token) and IntervalStats.throughput(flops_global) give
    TFLOP/s per device = FLOPs / (time x 10^12 x world size)."""
    acc = StepAccumulator(data_parallel_size=2, world_size=4)
    acc.add_micro_batch(1.0, tokens=500)  # 1,000 tokens over the job
    record = acc.end_step(2.0)
    assert record.throughput(flops_per_token=4e9).tflops_per_device == pytest.approx(
        4e9 * 1000 / (2.0 * 1e12 * 4)
    )
    stats = acc.interval()
    figures = stats.throughput(flops_global=8e12, count_tokens=False)
    assert figures.tflops_per_device == pytest.approx(8e12 / (2.0 * 1e12 * 4))


@pytest.mark.parametrize(
    "name", ["n_params_non_embedding", "n_layers", "d_model", "seq_len", "vocab_size"]
)
def test_a_negative_flops_argument_is_named_in_the_error(name):
    """gpt_flops_per_token raises ValueError naming the negative argument and its value."""
    args = {"n_params_non_embedding": 1, "n_layers": 1, "d_model": 1, "seq_len": 1}
    args[name] = -3
    with pytest.raises(ValueError, match=f"^{name} must be >= 0, got -3$"):
        gpt_flops_per_token(**args)


def test_each_invalid_hot_path_value_is_dropped_with_one_warning_per_cause(caplog):
    """A loss that is not a scalar, a loss that is no number, a token count that is no count
    and a duration that is no time are each dropped, never raised, with one warning per cause
    naming the value (a second such value says nothing more)."""
    torch = import_or_unavailable("torch")
    from otel_training.metrics import throughput as module

    module._warn_once.clear()
    acc = StepAccumulator()
    with caplog.at_level("WARNING", logger="otel_training.metrics.throughput"):
        for _ in range(2):
            acc.add_micro_batch(torch.ones(2), tokens=2.5)
            acc.add_micro_batch("abc", tokens=-1.0)
            acc.add_micro_batch(None, tokens="many")
            record = acc.end_step("soon")
    assert [r.getMessage() for r in caplog.records] == [
        "StepAccumulator: dropping a loss of shape (2,) (a scalar is needed)",
        "StepAccumulator: dropping invalid token count 2.5",
        "StepAccumulator: dropping the loss 'abc'",
        "StepAccumulator: dropping invalid duration_s 'soon'",
    ]
    assert (record.step, record.loss, record.tokens_global, record.duration_s) == (2, None, 0, None)
    assert record.micro_batches == 3
    module._warn_once.clear()


def test_token_counts_that_are_whole_numbers_are_counted(caplog):
    """0 tokens, a whole float and a numpy integer are counts (no warning): the global count is
    each times the data-parallel size; a zero-length step is a step of 0 s."""
    numpy = import_or_unavailable("numpy")
    from otel_training.metrics import throughput as module

    module._warn_once.clear()
    acc = StepAccumulator(data_parallel_size=3)
    with caplog.at_level("WARNING", logger="otel_training.metrics.throughput"):
        acc.add_micro_batch(1.0)  # no count given: 0 tokens
        acc.add_micro_batch(1.0, tokens=0)
        acc.add_micro_batch(1.0, tokens=2.0)
        acc.add_micro_batch(1.0, tokens=0.0)
        acc.add_micro_batch(1.0, tokens=numpy.int64(5))
        record = acc.end_step(0.0)
    assert caplog.records == []
    assert (record.tokens_global, record.micro_batches, record.duration_s) == (21, 5, 0.0)
    for skipped in (True, True, False):
        acc.end_step(1.0, skipped=skipped)
    assert acc.interval().skipped_iters == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data_parallel_size": 1.5}, "data_parallel_size must be an int, got 1.5"),
        ({"data_parallel_size": True}, "data_parallel_size must be an int, got True"),
        ({"data_parallel_size": 0}, "data_parallel_size must be >= 1, got 0"),
        ({"world_size": 0}, "world_size must be a positive int, got 0"),
        ({"world_size": 2.0}, "world_size must be a positive int, got 2.0"),
        ({"world_size": True}, "world_size must be a positive int, got True"),
    ],
)
def test_the_constructor_names_the_bad_size(kwargs, message):
    """A data-parallel or world size that is not a positive int raises ValueError naming it
    and its value."""
    with pytest.raises(ValueError, match=f"^{message}$"):
        StepAccumulator(**kwargs)


def test_double_precision_tensor_losses_stay_double():
    """Float64 losses are averaged in float64, integer ones in float32 (never truncated)."""
    torch = import_or_unavailable("torch")
    acc = StepAccumulator()
    acc.add_micro_batch(torch.tensor(1.0, dtype=torch.float64))
    acc.add_micro_batch(torch.tensor(2.0, dtype=torch.float64))
    assert acc.end_step(1.0).loss.dtype == torch.float64
    acc.add_micro_batch(torch.tensor(1))
    acc.add_micro_batch(torch.tensor(2))
    loss = acc.end_step(1.0).loss
    assert loss.dtype == torch.float32 and loss.item() == 1.5
