"""The heartbeat over OTLP against a real receiver: the hang signals arrive on their short
interval from a second MeterProvider with the rank's Resource, every other metric keeps the
long interval, and no series has two writers. About 2 s."""

from __future__ import annotations

from support import metrics_of

import otel_training
from otel_training.metrics import heartbeat

HANG = set(heartbeat.HEARTBEAT_METRICS)


def test_hang_signals_arrive_on_the_heartbeat_and_nowhere_else(otlp_receiver):
    """Heartbeat 200 ms, export interval 60 s: three exports of only the hang signals before
    the first main export; at shutdown the main export carries the rest and no hang signal;
    both carry the same Resource."""
    telemetry = otel_training.configure(
        environ={
            **otlp_receiver.env("grpc"),
            "OTEL_METRIC_EXPORT_INTERVAL": "60000",
            "OTEL_PYTHON_TRAINING_HEARTBEAT_INTERVAL": "200",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
            "RANK": "3",
            "WORLD_SIZE": "4",
        },
        set_global=False,
    )
    try:
        assert "hang signals over OTLP every 0.2 s" in telemetry.destination
        otel_training.record_training_metrics(telemetry.meter, step_duration_ms=10.0, loss=1.0)

        def beats(receiver):
            requests = receiver.metric_requests()
            return len(requests) >= 3 and requests

        early = otlp_receiver.wait_for(beats, timeout_s=30)
        for request in early:
            names = {m.name for m in metrics_of(request)}
            assert names and names <= HANG, names
    finally:
        telemetry.shutdown()
    points = otlp_receiver.metrics()
    by_name: dict[str, set[int]] = {}
    for index, request in enumerate(otlp_receiver.metric_requests()):
        for metric in metrics_of(request):
            by_name.setdefault(metric.name, set()).add(index)
    main = {
        index
        for name, indices in by_name.items()
        if name == "megatron.training.loss"
        for index in indices
    }
    assert len(main) == 1, "one main export, at shutdown"
    (main_index,) = main
    hang_in_main = {name for name, indices in by_name.items() if main_index in indices} & HANG
    assert not hang_in_main, hang_in_main
    assert {"megatron.training.step_duration_ms", "dl.training.phase.time"} <= set(by_name)
    # No step completed in this process: progress.timestamp is absent (docs/health.md).
    assert {"dl.training.progress.age", "dl.training.phase.elapsed"} <= set(by_name)
    resources = {
        tuple(sorted(p.resource_attributes.items()))
        for p in points
        if p.name in HANG or p.name == "megatron.training.loss"
    }
    assert len(resources) == 1 and dict(next(iter(resources)))["dl.rank"] == 3
