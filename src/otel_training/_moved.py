"""The package's former module paths, still importable: ``otel_training.log_format`` is
``otel_training.logs.formatting``, ``otel_training.setup`` is ``otel_training.configuration``...

The root was grouped by concern (docs/architecture.md). Logging configurations name
``otel_training.log_format.KeyValueFormatter``, programs import ``otel_training.instruments`` as
Megatron-LM's module, and both keep working: when ``otel_training`` is imported,
:func:`install` enters each module of :data:`MOVED` in ``sys.modules`` under its former name
too (the same module object, so a name patched through one path is patched for both) and as an
attribute of its former parent. No import hook is installed (a guest leaves ``sys.meta_path``
alone): the modules are those that importing ``otel_training`` loads anyway, and two small ones.
"""

from __future__ import annotations

import importlib
import sys
from typing import Final

__all__ = ["MOVED", "install"]

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


def install() -> None:
    """Enters every module of :data:`MOVED` under its former name, in ``sys.modules`` and as an
    attribute of its former parent (``otel_training.setup``); run once, at the end of the
    package's import, when the modules are loaded. Never raises: a module that cannot be imported
    keeps no former name."""
    for former, new in MOVED.items():
        try:
            module = importlib.import_module(new)
        except Exception:
            continue
        sys.modules.setdefault(former, module)
        parent, _, leaf = former.rpartition(".")
        if parent in sys.modules and not hasattr(sys.modules[parent], leaf):
            setattr(sys.modules[parent], leaf, module)
