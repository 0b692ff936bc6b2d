"""otel_training.integrations without the frameworks, and the callbacks' argument checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import child_env, import_or_unavailable

from otel_training.integrations import _recorder

SRC = str(Path(__file__).resolve().parents[1] / "src")
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
        "import otel_training.setup, otel_training.instruments\n"
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
    assert f"pip install 'otel-training[{extra}]'" in result.stdout
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
