"""``python -m otel_training``: the ``otel-training`` command (:mod:`otel_training.cli`)."""

import sys

from otel_training.cli import main

sys.exit(main())
