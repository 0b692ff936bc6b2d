"""Span processors of otel-training: NVTX ranges and JSON lines, installed by ``configure()``.

- :class:`NvtxSpanProcessor`: every span as an NVTX start/end range keyed by its span id, for
  Nsight Systems timelines.
- :class:`JsonLogSpanProcessor`: one JSON object per line when a span starts and when it ends,
  one file per rank.

Both run synchronously on the thread that starts or ends a span, never raise there, and flush
or close at the TracerProvider's shutdown.
"""

from __future__ import annotations

import logging
import os

from opentelemetry.sdk.trace import SpanProcessor

from otel_training import config
from otel_training.processors.jsonlog import JsonLogSpanProcessor
from otel_training.processors.nvtx import NvtxSpanProcessor

__all__ = ["JsonLogSpanProcessor", "NvtxSpanProcessor", "span_mirrors"]

_logger = logging.getLogger(__name__)


def span_mirrors(settings: config.Settings) -> tuple[list[SpanProcessor], list[str]]:
    """The processors that ``configure()`` installs from ``settings``, and what they write to.

    - :class:`NvtxSpanProcessor` in ``settings.nvtx_domain`` unless ``settings.nvtx`` is False
      (``OTEL_PYTHON_TRAINING_NVTX=false`` or ``NVTX_DISABLE``); it is inert without the
      ``nvtx`` module or an attached tool, and only then left out.
    - :class:`JsonLogSpanProcessor` writing ``spans-rank{RANK}.jsonl`` in
      ``settings.jsonlog_dir`` when set, else in ``settings.output_dir`` when the embedded
      default (``otlp_json_file``) exports traces; none otherwise.

    Never raises: a file that cannot be opened logs one warning and is left out.
    """
    processors: list[SpanProcessor] = []
    targets: list[str] = []
    if settings.nvtx:
        nvtx_processor = NvtxSpanProcessor(settings.nvtx_domain)
        if nvtx_processor.active:
            processors.append(nvtx_processor)
            targets.append(f"NVTX domain {settings.nvtx_domain}")
    directory = settings.jsonlog_dir
    if directory is None and "otlp_json_file" in settings.traces_exporters:
        directory = settings.output_dir
    if directory is not None:
        path = os.path.join(directory, f"spans-rank{settings.identity.rank}.jsonl")
        try:
            processors.append(JsonLogSpanProcessor(path))
            targets.append(f"span JSON lines {path}")
        except OSError as error:
            _logger.warning("cannot write span JSON lines to %s: %s", path, error)
    return processors, targets
