"""configure() run again in a real process (case A13): one pipeline per identity."""

from __future__ import annotations

import textwrap

CASE_A13 = textwrap.dedent(
    """
    import time
    import opentelemetry.trace
    import otel_training as ot
    ot.configure()
    meter = ot.get_meter()
    ot.record_training_metrics(meter, loss=5.0, skipped_iters=3)
    time.sleep(1.2)
    ot.configure()
    second_at_ns = time.time_ns()
    with opentelemetry.trace.get_tracer("user").start_as_current_span("user.work"):
        pass
    with ot.training_run():
        pass
    for _ in range(6):
        ot.record_training_metrics(meter, loss=1.0)
        time.sleep(0.5)
    print(second_at_ns, flush=True)
    """
)


def test_case_a13_a_second_configure_stops_the_first_pipeline(run_python, otlp_receiver):
    """Case A13: no loss=5.0 exported more than 1 s after the second configure(); the
    skipped_iters=3 of the first is kept; each span arrives once; exit 0."""
    result = run_python(
        CASE_A13,
        env={**otlp_receiver.env("grpc"), "OTEL_METRIC_EXPORT_INTERVAL": "300"},
        timeout_s=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    second_at_ns = int(result.stdout.split()[-1])
    losses = otlp_receiver.metrics("megatron.training.loss")
    late_fives = [p for p in losses if p.value == 5.0 and p.time_unix_nano > second_at_ns + 1e9]
    assert late_fives == []
    assert any(p.value == 1.0 for p in losses)
    assert 3 in {p.value for p in otlp_receiver.metrics("megatron.training.skipped_iters")}
    names = sorted(s.name for s in otlp_receiver.spans())
    assert names == ["megatron.train", "user.work"]
    instances = {p.resource_attributes["service.instance.id"] for p in losses}
    assert len(instances) == 1  # one identity throughout: the first pipeline did not linger
