"""The ``otel-training demo`` job: a GPT-style byte model trained on the stdlib's own sources.

Needs otel-training's extra ``torch``; importing this package imports torch.

This package is in the tools layer, the top (``tests/test_import_layers.py``): it may import
anything of otel-training and nothing imports it but the command line.
"""

from otel_training.demo.train import DemoConfig, TrainResult, train

__all__ = ["DemoConfig", "TrainResult", "train"]
