"""The framework examples run as written (short settings) and their telemetry reaches a real
OTLP receiver: every optimizer step, the loss and tokens/s."""

from __future__ import annotations

import pytest
from framework_checks import STEP, collections_by_rank, last_collection
from support import import_or_unavailable

SHORT = ["--steps", "4", "--batch-size", "2", "--seq-len", "16", "--accumulate", "2",
         "--log-every", "2", "--data-bytes", "20000"]  # fmt: skip


@pytest.mark.parametrize(
    ("script", "framework"),
    [
        ("examples/lightning_example.py", "lightning"),
        ("examples/transformers_example.py", "transformers"),
    ],
)
def test_example_runs_and_exports(run_python, otlp_receiver, repo_root, script, framework):
    """The example trains four steps; the receiver gets four step points, loss and tokens/s."""
    import_or_unavailable(framework)
    env = {**otlp_receiver.env("grpc"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    path = str(repo_root / script)
    result = run_python(
        f"import runpy, sys; sys.argv = [{path!r}, *sys.argv[1:]]; "
        f"runpy.run_path({path!r}, run_name='__main__')",
        args=SHORT,
        env=env,
        timeout_s=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "trained 4 steps; telemetry: metrics to OTLP/gRPC" in result.stdout
    final = last_collection(collections_by_rank(otlp_receiver)[0])
    assert final[STEP][0].count == 4
    assert {"megatron.training.loss", "megatron.training.tokens_per_sec"} <= set(final)
    assert otlp_receiver.spans()  # at least the run
