"""Where the main thread stands still on a SIGTERM that nobody else handles
(otel_training.pipeline.lifecycle), and what the final flush takes after it
(otel_training.configuration). The signals themselves, in real processes:
tests/integration/test_signals_no_handler.py."""

from __future__ import annotations

import sys
import textwrap
from types import FrameType

import pytest
from doc_rules import documents
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_training import configuration as setup
from otel_training.pipeline import lifecycle
from otel_training.testing import points


def _stack(*modules: str) -> str | None:
    """Calls one function per module of ``modules`` (outermost first), each defined in a
    namespace of that ``__name__``; in the innermost, finds the frame to finish and returns
    the module it belongs to (None: stand still at once)."""
    found: list[FrameType | None] = []

    def probe() -> None:
        found.append(lifecycle._call_to_finish(sys._getframe(1)))

    call = probe
    for depth, module in enumerate(reversed(modules)):
        namespace = {"__name__": module, "inner": call}
        exec(textwrap.dedent(f"def level_{depth}():\n    inner()\n"), namespace)
        call = namespace[f"level_{depth}"]
    call()
    (frame,) = found
    return None if frame is None else frame.f_globals["__name__"]


@pytest.mark.parametrize(
    ("modules", "finish"),
    [
        # the program's own code: at once
        (["__main__", "train"], None),
        (["__main__", "json.encoder"], None),
        (["__main__", "torch.nn.modules"], None),
        # telemetry's call on top: its outermost frame, the standard library's between count
        (["__main__", "otel_training.metrics.instruments", "opentelemetry.sdk.metrics._internal"],
         "otel_training.metrics.instruments"),
        (["__main__", "opentelemetry.sdk.trace", "threading"], "opentelemetry.sdk.trace"),
        (["__main__", "otel_training.configuration", "logging"], "otel_training.configuration"),
        (["__main__", "importlib._bootstrap"], "importlib._bootstrap"),
        # a handler of the program's that logging called, under telemetry's lock
        (
            ["__main__", "otel_training.configuration", "logging", "myhandlers"],
            "otel_training.configuration",
        ),
        (["__main__", "logging", "myhandlers", "json.encoder"], "logging"),
        # the program's code that a wrapper of telemetry's called (a decorator): at once
        (["__main__", "opentelemetry.util._decorator", "train"], None),
        (["__main__", "otel_training.phases", "train", "otel_training.metrics.instruments"],
         "otel_training.metrics.instruments"),
        # our own training programs are the program's
        (["otel_training.cli", "otel_training.demo.train"], None),
        (
            ["otel_training.demo.train", "otel_training.metrics.instruments"],
            "otel_training.metrics.instruments",
        ),
    ],
)  # fmt: skip
def test_the_main_thread_stands_still_once_telemetrys_call_returns(modules, finish):
    """Interrupted in the program's code, the main thread stands still at once; inside a call
    of telemetry's, logging's or the import machinery's, once the outermost such call on top of
    the stack returns (a handler that logging called counts with logging)."""
    assert _stack(*modules) == finish


@documents("limits.md", "their measurements are dropped from the moment the final flush begins")
def test_the_final_flush_takes_no_measurement_made_after_it_began():
    """Once the SIGTERM shutdown has begun, a thread of the program's that records adds
    nothing to the final collection; what came before stays."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    counter = provider.get_meter("test").create_counter("steps")
    counter.add(3)
    setup._stop_measurements(provider)
    counter.add(4)
    assert [p.value for _, p in points(reader.get_metrics_data(), "steps")] == [3]
    provider.shutdown()
