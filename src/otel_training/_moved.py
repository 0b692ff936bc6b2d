"""The package's former module paths, still importable: ``otel_training.log_format`` is
``otel_training.logs.formatting``, ``otel_training.setup`` is ``otel_training.configuration``...

The root was grouped by concern (docs/architecture.md). Logging configurations name
``otel_training.log_format.KeyValueFormatter``, programs import ``otel_training.instruments`` as
Megatron-LM's module, and both keep working: importing a former path imports the module where it
lives now and binds the same module object under the former name (``sys.modules``), so a name
patched through one path is patched for both. Nothing here is imported unless a former path is.

:class:`MovedModuleFinder` is installed on ``sys.meta_path`` when ``otel_training`` is imported;
it answers only for the names of :data:`MOVED` and never raises for any other.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Final

__all__ = ["MOVED", "MovedModuleFinder", "install"]

#: Former module path -> where the module lives now.
MOVED: Final = {
    "otel_training._env": "otel_training.config._env",
    "otel_training._export_outage": "otel_training.export._outage",
    "otel_training.device_metrics": "otel_training.metrics.device",
    "otel_training.device_reads": "otel_training.metrics.device_reads",
    "otel_training.environment_variables": "otel_training.config.variables",
    "otel_training.exporters": "otel_training.export.exporters",
    "otel_training.files": "otel_training.export.files",
    "otel_training.heartbeat": "otel_training.metrics.heartbeat",
    "otel_training.identity": "otel_training.config.identity",
    "otel_training.ids": "otel_training.pipeline.ids",
    "otel_training.instruments": "otel_training.metrics.instruments",
    "otel_training.lifecycle": "otel_training.pipeline.lifecycle",
    "otel_training.limits": "otel_training.export.limits",
    "otel_training.log_bridge": "otel_training.logs.bridge",
    "otel_training.log_format": "otel_training.logs.formatting",
    "otel_training.memory": "otel_training.metrics.memory",
    "otel_training.network": "otel_training.pipeline.network",
    "otel_training.open_spans": "otel_training.trace.open_spans",
    "otel_training.processors": "otel_training.trace.processors",
    "otel_training.processors.checkpoint_metrics": (
        "otel_training.trace.processors.checkpoint_metrics"
    ),
    "otel_training.processors.jsonlog": "otel_training.trace.processors.jsonlog",
    "otel_training.processors.nvtx": "otel_training.trace.processors.nvtx",
    "otel_training.proxy": "otel_training._providers",
    "otel_training.replicated": "otel_training.metrics.replicated",
    "otel_training.resource": "otel_training.pipeline.resource",
    "otel_training.segments": "otel_training.trace.segments",
    "otel_training.setup": "otel_training.configuration",
    "otel_training.span_values": "otel_training.trace.span_values",
    "otel_training.throughput": "otel_training.metrics.throughput",
    "otel_training.trace_shape": "otel_training.trace.shape",
    "otel_training.views": "otel_training.metrics.views",
}


class _Alias(importlib.abc.Loader):
    """Loads a former path as the module it names now (the same object)."""

    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported under its own name: nothing more to run."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the former module paths of :data:`MOVED`; ``None`` (not ours) for any other."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (the ABC's signature)
        new = MOVED.get(fullname)
        if new is None:
            return None
        is_package = new == "otel_training.trace.processors"
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), is_package=is_package)


def install() -> None:
    """Puts one :class:`MovedModuleFinder` first on ``sys.meta_path`` (a second call: nothing).
    Never raises."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        # First: a former package's submodule (otel_training.processors.jsonlog) must not be
        # found again by the path finder, in the package's folder, as a second module object.
        sys.meta_path.insert(0, MovedModuleFinder())
