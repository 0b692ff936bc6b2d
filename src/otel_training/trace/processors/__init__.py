"""Span processors of otel-training: NVTX ranges, JSON lines and checkpoint durations, installed
by ``configure()``.

- :class:`NvtxSpanProcessor`: every span as an NVTX start/end range keyed by its span id, for
  Nsight Systems timelines.
- :class:`JsonLogSpanProcessor`: one JSON object per line when a span ends, and when it starts
  if it is still open when the writer runs; one file per rank.
- :class:`CheckpointMetricsSpanProcessor`: the duration of each checkpoint save and load span
  on the histogram ``megatron.checkpoint.duration``, for backends that store no spans.
- :mod:`~otel_training.trace.processors.exception_logs`: the exceptions recorded on spans,
  also as ERROR log records (a span processor that emits logs).
- :mod:`~otel_training.trace.processors.batch`: the SDK's batch processors, of spans and of
  log records alike, counting what a full queue drops.

Each runs on the thread that starts or ends a span (the batch processors and the JSON lines
only queue there: their own thread exports or writes), never raises there, and flushes or
closes at its provider's shutdown.

This package is in the SDK layer (``tests/test_import_layers.py``): it may import the settings,
the health definitions, the leaves and the SDK layer's other packages; never the API
(``configuration``, ``spans``, ``phases``) or anything above it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TextIO

from opentelemetry.sdk.trace import SpanProcessor

from otel_training import config
from otel_training.trace.processors.checkpoint_metrics import CheckpointMetricsSpanProcessor
from otel_training.trace.processors.jsonlog import JsonLogSpanProcessor
from otel_training.trace.processors.nvtx import NvtxSpanProcessor

__all__ = [
    "CheckpointMetricsSpanProcessor",
    "JsonLogSpanProcessor",
    "NvtxSpanProcessor",
    "span_mirrors",
]

_logger = logging.getLogger(__name__)


def span_mirrors(
    settings: config.Settings,
    open_file: Callable[[str, str | None], tuple[TextIO | None, str | None]],
) -> tuple[list[SpanProcessor], list[str]]:
    """The processors that ``configure()`` installs from ``settings``, and what they write to.

    - :class:`NvtxSpanProcessor` in ``settings.nvtx_domain`` unless ``settings.nvtx`` is False
      (``OTEL_PYTHON_TRAINING_NVTX=false`` or ``NVTX_DISABLE``); it is inert without the
      ``nvtx`` module or an attached tool, and only then left out.
    - :class:`JsonLogSpanProcessor` writing ``spans-rank{RANK}.jsonl`` in the run's directory
      inside ``settings.jsonlog_dir`` when set, else inside ``settings.output_dir`` when the
      embedded default (``otlp_json_file``) exports traces; none otherwise. ``open_file(signal,
      base_dir)`` opens the file, ``base_dir=None`` meaning the output directory (see
      ``pipeline.outputs.Outputs.open``).

    Never raises: a file that cannot be opened logs one warning and is left out.
    """
    processors: list[SpanProcessor] = []
    targets: list[str] = []
    if settings.nvtx:
        nvtx_processor = NvtxSpanProcessor(settings.nvtx_domain)
        if nvtx_processor.active:
            processors.append(nvtx_processor)
            targets.append(f"NVTX domain {settings.nvtx_domain}")
    if settings.jsonlog_dir is not None or "otlp_json_file" in settings.traces_exporters:
        stream, path = open_file("spans", settings.jsonlog_dir)
        if stream is not None:
            processors.append(
                JsonLogSpanProcessor(stream=stream, path=path, limits=settings.span_limits)
            )
            targets.append(f"span JSON lines {path}")
    return processors, targets
