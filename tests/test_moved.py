"""The package's names and its former module paths (otel_training._moved): what programs and
logging configurations import keeps working after the root was grouped by concern."""

from __future__ import annotations

import importlib
import logging
import logging.config
import subprocess
import sys
from pathlib import Path

import pytest
from support import child_env

import otel_training
from otel_training._moved import MOVED

SRC = Path(__file__).resolve().parents[1] / "src"

#: The package's public names before the regrouping (issue 28), written out: the regrouping
#: changed no public name, and a change to this list is a change of the API.
PUBLIC_NAMES = {
    "STEP_DURATION_BUCKETS_MS", "Phase", "SpanRecorder", "StepAccumulator", "Telemetry",
    "TrainingResourceDetector", "activation_offload", "checkpoint_load", "checkpoint_load_stage",
    "checkpoint_save", "checkpoint_save_completed", "checkpoint_save_stage", "configure",
    "data_loading", "dataloader_init", "default_views", "evaluation", "evaluation_step",
    "first_iteration", "flush_deferred", "force_flush", "forward_backward", "get_logger",
    "get_meter", "get_tracer", "gpt_flops_per_token", "grad_sync", "layer", "microbatch",
    "logging_handler", "model_init", "optimizer_step", "p2p", "phase", "record_training_metrics",
    "shutdown", "startup", "step_duration_view", "training_iteration", "training_run",
}  # fmt: skip


def _file_of(module: str) -> Path:
    parts = module.split(".")
    return SRC.joinpath(*parts[:-1], parts[-1] + ".py")


def test_the_public_names_are_those_before_the_regrouping():
    assert set(otel_training.__all__) == PUBLIC_NAMES
    for name in PUBLIC_NAMES:
        assert getattr(otel_training, name) is not None, name
    assert callable(otel_training.configure)  # the function, not the module configuration.py


@pytest.mark.parametrize("former", sorted(MOVED))
def test_a_former_path_is_the_module_where_it_lives_now(former):
    """The same object under both names, so that a patch through one is seen through the other;
    the former path is no file of its own (else it would be a second copy)."""
    module = importlib.import_module(former)
    assert module is importlib.import_module(MOVED[former])
    assert module.__name__ == MOVED[former]
    assert sys.modules[former] is module
    assert not _file_of(former).exists() and not (SRC.joinpath(*former.split("."))).is_dir()


def test_every_module_that_moved_has_its_former_path():
    """Each module or package of the tree on 7b31eb4's root that is no longer there."""
    former_root = {
        "_env", "_export_outage", "device_metrics", "device_reads", "environment_variables",
        "exporters", "files", "heartbeat", "identity", "ids", "instruments", "lifecycle",
        "limits", "log_bridge", "log_format", "memory", "network", "open_spans", "processors",
        "proxy", "replicated", "resource", "segments", "setup", "span_values", "throughput",
        "trace_shape", "views",
    }  # fmt: skip
    assert {name.split(".")[1] for name in MOVED} == former_root


def test_documented_imports_of_former_paths_work():
    from otel_training.instruments import record_training_metrics
    from otel_training.log_bridge import LoggingHandler
    from otel_training.log_format import KeyValueFormatter, LogSpanProcessor
    from otel_training.processors import JsonLogSpanProcessor, NvtxSpanProcessor
    from otel_training.processors.jsonlog import JsonLogSpanProcessor as Deep
    from otel_training.setup import add_flush_hook, current

    assert record_training_metrics is otel_training.record_training_metrics
    assert Deep is JsonLogSpanProcessor
    assert KeyValueFormatter.__module__ == "otel_training.logs.formatting"
    for name in (LoggingHandler, LogSpanProcessor, NvtxSpanProcessor, add_flush_hook, current):
        assert name is not None


def test_a_logging_configuration_names_the_formatter_by_its_former_path():
    """``logging.config.dictConfig`` resolves ``()`` by import: the documented former path."""
    logger = logging.getLogger("test_moved.config")
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"kv": {"()": "otel_training.log_format.KeyValueFormatter"}},
            "handlers": {"h": {"class": "logging.NullHandler", "formatter": "kv"}},
            "loggers": {"test_moved.config": {"handlers": ["h"]}},
        }
    )
    try:
        formatter = logger.handlers[0].formatter
        assert type(formatter).__module__ == "otel_training.logs.formatting"
    finally:
        logger.handlers.clear()


def test_a_former_path_imported_first_in_a_fresh_process():
    """Before anything else of the package: the finder is installed by the package's import,
    and the submodule of a former package is one module, not a second copy."""
    code = (
        "import sys\n"
        "import otel_training.processors.jsonlog as a\n"
        "import otel_training.trace.processors.jsonlog as b\n"
        "from otel_training.setup import configure\n"
        "assert a is b, (a, b)\n"
        "assert [m for m in sys.modules if m.endswith('jsonlog')] == [\n"
        "    'otel_training.trace.processors.jsonlog', 'otel_training.processors.jsonlog']\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


def test_importing_the_package_installs_no_import_hook():
    """A guest: sys.meta_path and sys.path_hooks are the same before and after the import (the
    former paths are entries of sys.modules, not a finder)."""
    code = (
        "import sys\n"
        "hooks = (list(sys.meta_path), list(sys.path_hooks))\n"
        "import otel_training, otel_training.log_format\n"
        "assert (list(sys.meta_path), list(sys.path_hooks)) == hooks\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
