"""The phases' once-only warnings: one line per cause and process, with the exception being
handled (logger otel_training.spans; the mechanism is :class:`otel_training._log_once.LogOnce`)."""

from __future__ import annotations

from otel_training._log_once import LogOnce

#: ``warn_once(cause, message, *args, exc_info=True)``; never raises.
warn_once = LogOnce("otel_training.spans", exc_info=True)
