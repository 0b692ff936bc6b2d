"""The ``otel-training demo`` job: a GPT-style byte model trained on the stdlib's own sources.

Needs the ``torch`` extra (``pip install 'otel-training[torch]'``); importing this package
imports torch.
"""

from otel_training.demo.train import DemoConfig, TrainResult, train

__all__ = ["DemoConfig", "TrainResult", "train"]
