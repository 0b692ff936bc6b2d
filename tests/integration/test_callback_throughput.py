"""Every throughput figure of both framework callbacks, derived by the test itself from what
it fed, on 2 ranks (real gloo, real Lightning and Hugging Face trainers) with gradient
accumulation, slow evaluations and checkpoint saves between steps, ``tokens_per_sample`` and
``tokens_per_batch``: tokens/s for the job and TFLOP/s per device as
``otel_training.metrics.throughput`` defines them (README, "Metrics"; docs/integrations.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from doc_rules import documents
from framework_checks import driver_of, duration_bounds, step_windows
from support import gloo_or_unavailable

HERE = Path(__file__).resolve().parent
WORLD = 2
TOKENS = "megatron.training.tokens_per_sec"
TFLOPS = "megatron.training.throughput_tflops"


def _intervals(record: dict, every: int) -> list[tuple[int, int]]:
    steps = record["steps"]
    return [(first, min(first + every - 1, steps)) for first in range(1, steps + 1, every)]


def _check(record: dict, every: int, expected_counts) -> int:
    """Checks each interval's figures against the bounds the timestamps allow; returns how
    many figures were checked. ``expected_counts(micro) -> {(callback, metric): (numerator,
    divisor)}``: the figure is numerator / (duration x divisor)."""
    windows = step_windows(record["events"])
    checked = 0
    for first, last in _intervals(record, every):
        micro = [m for m in record["micro"] if first <= m[0] <= last]
        assert {m[0] for m in micro} == set(range(first, last + 1))
        shortest, longest = duration_bounds(windows, first, last)
        assert 0 < shortest <= longest
        found = record["intervals"][str(last)]
        for (callback, metric), (numerator, divisor) in expected_counts(micro).items():
            value = found[callback][metric]
            low, high = numerator / (longest * divisor), numerator / (shortest * divisor)
            assert low <= value <= high, (callback, metric, first, last, low, value, high)
            checked += 1
    return checked


@documents(
    "integrations.md",
    "A step lasts from the end of the previous step",
)
@documents(
    "integrations.md",
    "Both throughput figures are `otel_training.metrics.throughput.throughput()`",
)
@documents(
    "integrations.md",
    "else the module's `flops_per_batch` attribute",
)
@documents(
    "integrations.md",
    "(this rank's count × the world size)",
)
@documents("README.md", "and pinned by tests built from independent data")
@documents("README.md", "The demo and the callbacks report the job's rate")
@documents("README.md", "(evaluations and checkpoint saves between steps excluded)")
def test_lightning_throughput_on_two_ranks(run_python, tmp_path):
    """Lightning, 2 DDP ranks, accumulation 2, a 0.25 s validation every 2 steps and save
    every 3: per interval, tokens/s = this rank's fed tokens x 2 / the steps' summed time
    (evaluations and saves outside it) for tokens_per_sample and tokens_per_batch; TFLOP/s =
    flops_per_token x job tokens / (time x 1e12 x 2), and from the module's flops_per_batch."""
    lightning_run = driver_of("lightning")
    gloo_or_unavailable()

    script = str(HERE / "lightning_run.py")
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
    env["OTEL_LOGS_EXPORTER"] = "none"
    result = run_python(
        f"import runpy, sys; sys.argv = [{script!r}, *sys.argv[1:]]; "
        f"runpy.run_path({script!r}, run_name='__main__')",
        args=[str(tmp_path), "--throughput", "--log-every", "2"],
        env=env,
        timeout_s=240,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    seq, per_token = lightning_run.THROUGHPUT_SEQ, lightning_run.THROUGHPUT_FLOPS_PER_TOKEN
    per_batch = lightning_run.THROUGHPUT_FLOPS_PER_BATCH

    def expected(micro):
        by_sample = math.fsum(rows * seq for _, rows, _ in micro) * WORLD
        by_batch = math.fsum(even for _, _, even in micro) * WORLD
        return {
            ("per_sample", TOKENS): (by_sample, 1),
            ("per_batch", TOKENS): (by_batch, 1),
            ("per_sample", TFLOPS): (per_token * by_sample, 1e12 * WORLD),
            ("per_batch", TFLOPS): (len(micro) * per_batch * WORLD, 1e12 * WORLD),
        }

    for rank in range(WORLD):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert (record["rank"], record["world_size"], record["steps"]) == (rank, WORLD, 6)
        tags = [e[0] for e in record["events"]]
        assert tags.count("eval") == 2 * 3 and tags.count("save") == 2 * 2
        assert _check(record, 2, expected) == 3 * 4


@documents(
    "integrations.md",
    "A step lasts from the end of the previous step",
)
@documents(
    "integrations.md",
    "Both throughput figures are `otel_training.metrics.throughput.throughput()`",
)
@documents("integrations.md", "else the Trainer's own count (`state.total_flos`, over all ranks)")
@documents("README.md", ", or a framework's own count")
@documents("README.md", "(evaluations and checkpoint saves between steps excluded)")
def test_transformers_throughput_on_two_ranks(run_python, tmp_path):
    """The HF Trainer under torchrun, 2 gloo ranks, accumulation 2, a 0.25 s evaluation every
    2 steps and save every 3: per logging step, tokens/s = this rank's fed tokens x 2 / the
    steps' summed time for tokens_per_sample and tokens_per_batch; TFLOP/s = flops_per_token x
    job tokens / (time x 1e12 x 2), and from the Trainer's count, 6 x N x both ranks' tokens."""
    transformers_run = driver_of("transformers")
    gloo_or_unavailable()

    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
    env["OTEL_LOGS_EXPORTER"] = "none"
    result = run_python(
        module="torch.distributed.run",
        args=[
            "--standalone",
            "--nproc_per_node",
            str(WORLD),
            str(HERE / "transformers_run.py"),
            str(tmp_path),
            "--throughput",
        ],  # fmt: skip
        env=env,
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    seq, per_token = 32, transformers_run.THROUGHPUT_FLOPS_PER_TOKEN

    for rank in range(WORLD):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert (record["rank"], record["world_size"], record["steps"]) == (rank, WORLD, 6)
        tags = [e[0] for e in record["events"]]
        assert tags.count("eval") == 2 * 3 and tags.count("save") == 2 * 2
        parameters = record["parameters"]

        def expected(micro, parameters=parameters):
            by_sample = math.fsum(rows * seq for _, _, rows, _ in micro) * WORLD
            by_batch = math.fsum(even for _, _, _, even in micro) * WORLD
            counted = 6 * parameters * math.fsum(n for _, n, _, _ in micro) * WORLD
            return {
                ("per_sample", TOKENS): (by_sample, 1),
                ("per_batch", TOKENS): (by_batch, 1),
                ("per_sample", TFLOPS): (per_token * by_sample, 1e12 * WORLD),
                ("per_batch", TFLOPS): (counted, 1e12 * WORLD),
            }

        assert _check(record, 2, expected) == 3 * 4
