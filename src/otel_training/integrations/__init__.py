"""Callbacks that record a framework's training run with otel-training, one line each.

- :class:`otel_training.integrations.lightning.OtelTrainingCallback` for PyTorch Lightning
  (``lightning.pytorch`` or ``pytorch_lightning``): the extra ``lightning``;
- :class:`otel_training.integrations.transformers.OtelTrainingCallback` for the Hugging Face
  ``Trainer``: the extra ``transformers``;
- :func:`otel_training.integrations.ddp.register_comm_hook` for PyTorch's
  ``DistributedDataParallel``: the wait at the end of backward recorded as ``communication``.

Importing this package imports neither framework; importing one of its modules imports that
module's framework when it is installed, and building its callback without the framework raises
``ModuleNotFoundError`` naming the extra to install. What they record, and what they cannot
know: ``docs/integrations.md``.

This package is in the instrumentation layer (``tests/test_import_layers.py``): it may import
the API (``otel_training.configuration``, ``spans``, ``phases``) and everything below it; never
the report or the tools.
"""

__all__: list[str] = []
