"""The logs signal in real processes: a logging record inside an iteration and an exception in
a phase arrive at the real OTLP receiver (gRPC and HTTP) with the span's ids and the rank's
resource; the embedded default writes logs-rank0.jsonl in OTLP-JSON; shutdown and SIGTERM
with logs stay bounded."""

from __future__ import annotations

import json
import signal
import textwrap

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from support import start_python, terminate_when_ready

from otel_training.semconv.attributes import DL_RANK, DL_WORLD_SIZE
from otel_training.testing import parse_otlp_json

#: Logs one record inside an iteration and lets an exception leave another; prints the ids of
#: both iteration spans (as the code saw them) as the last line.
TRAIN = textwrap.dedent(
    """
    import json, logging, sys
    from opentelemetry import trace
    import otel_training

    def ids():
        context = trace.get_current_span().get_span_context()
        return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}

    if sys.argv[1] == "handler":
        logging.getLogger("train").addHandler(otel_training.logging_handler())
        logging.getLogger("train").setLevel(logging.INFO)
    seen = {}
    with otel_training.training_run():
        with otel_training.training_iteration():
            logging.getLogger("train").warning("loss %.2f at iteration %d", 2.25, 7)
            seen["logged"] = ids()
        try:
            with otel_training.training_iteration():
                seen["failed"] = ids()
                raise RuntimeError("loss is NaN")
        except RuntimeError:
            pass
    logging.getLogger("train").warning("after the run")
    assert otel_training.shutdown()
    print(json.dumps(seen))
    """
)


def _ids(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_record_and_an_exception_arrive_with_the_spans_ids_and_the_ranks_resource(
    run_python, otlp_receiver, protocol
):
    """logging.getLogger("train") inside an iteration arrives as an OTLP log record with that
    span's ids and the rank's resource; an exception leaving an iteration arrives as one
    ERROR record with that span's ids; a record outside any span has none."""
    env = {
        **otlp_receiver.env(protocol),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
    }
    result = run_python(TRAIN, args=["handler"], env=env, timeout_s=60)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = _ids(result.stdout)
    records = otlp_receiver.wait_for(lambda r: len(r.logs()) >= 3 and r.logs(), timeout_s=10)
    by_body = {r.body: r for r in records}
    assert set(by_body) == {
        "loss 2.25 at iteration 7",
        "RuntimeError: loss is NaN",
        "after the run",
    }, [r.body for r in records]
    logged = by_body["loss 2.25 at iteration 7"]
    assert (logged.trace_id, logged.span_id) == (
        seen["logged"]["trace_id"],
        seen["logged"]["span_id"],
    )
    assert (logged.severity_text, logged.severity_number, logged.scope_name) == (
        "WARN",
        13,
        "train",
    )
    assert logged.resource_attributes[DL_RANK] == 1
    assert logged.resource_attributes[DL_WORLD_SIZE] == 2
    assert logged.protocol == ("grpc" if protocol == "grpc" else "http")
    failed = by_body["RuntimeError: loss is NaN"]
    assert (failed.trace_id, failed.span_id) == (
        seen["failed"]["trace_id"],
        seen["failed"]["span_id"],
    )
    assert (failed.severity_text, failed.severity_number) == ("ERROR", 17)
    assert failed.attributes["exception.type"] == "RuntimeError"
    assert failed.attributes["exception.message"] == "loss is NaN"
    stack = failed.attributes["exception.stacktrace"]
    assert stack.startswith("Traceback") and stack.endswith("RuntimeError: loss is NaN\n")
    after = by_body["after the run"]
    assert (after.trace_id, after.span_id) == ("", "")
    span_ids = {s.span_id for s in otlp_receiver.spans()}
    assert {logged.span_id, failed.span_id} <= span_ids  # the ids name exported spans


def test_the_embedded_default_writes_logs_with_the_root_switch(run_python, tmp_path):
    """With OTEL_PYTHON_TRAINING_LOGGING=true and no logging setup, records reach
    logs-rank0.jsonl in the run's directory as OTLP-JSON with the spans' ids, warnings still
    reach stderr as without the bridge, and the destination line names the file."""
    env = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path),
        "OTEL_PYTHON_TRAINING_LOGGING": "true",
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
    }
    result = run_python(TRAIN, args=["root"], env=env, timeout_s=60)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = _ids(result.stdout)
    path = tmp_path / "latest" / "logs-rank0.jsonl"
    assert "logs to OTLP-JSON file " in result.stderr and "logs-rank0.jsonl" in result.stderr
    assert "loss 2.25 at iteration 7" in result.stderr  # logging.lastResort, as before
    records = []
    for line in path.read_text().splitlines():
        request = parse_otlp_json(line, ExportLogsServiceRequest())
        for resource_logs in request.resource_logs:
            resource = {kv.key: kv.value for kv in resource_logs.resource.attributes}
            assert resource[DL_RANK].int_value == 0
            for scope_logs in resource_logs.scope_logs:
                records.extend(scope_logs.log_records)
    by_body = {r.body.string_value: r for r in records}
    assert set(by_body) == {
        "loss 2.25 at iteration 7",
        "RuntimeError: loss is NaN",
        "after the run",
    }
    for body, key in (
        ("loss 2.25 at iteration 7", "logged"),
        ("RuntimeError: loss is NaN", "failed"),
    ):
        record = by_body[body]
        assert (record.trace_id.hex(), record.span_id.hex()) == (
            seen[key]["trace_id"],
            seen[key]["span_id"],
        )
    assert by_body["after the run"].trace_id == b""


DEAD_ENDPOINT = textwrap.dedent(
    """
    import logging
    import otel_training
    logging.getLogger("train").addHandler(otel_training.logging_handler())
    for i in range(50):
        logging.getLogger("train").warning("record %d", i)
    ok = otel_training.shutdown()
    print("shutdown returned", ok, flush=True)
    """
)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_shutdown_with_a_dead_logs_endpoint_stays_bounded(run_python, black_hole, protocol):
    """Logs to an endpoint that accepts and never answers: shutdown() returns (bounded by the
    logs' OTLP timeout) and the process exits 0, well within the subprocess's limit."""
    endpoint = black_hole.endpoint + ("/v1/logs" if protocol != "grpc" else "")
    env = {
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT": "2",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    result = run_python(DEAD_ENDPOINT, env=env, timeout_s=30)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "shutdown returned" in result.stdout
    assert "OTLP/" in result.stderr and "logs to" in result.stderr


LOG_UNTIL_TERMINATED = textwrap.dedent(
    """
    import logging, time
    import otel_training
    logging.getLogger("train").addHandler(otel_training.logging_handler())
    i = 0
    while True:
        i += 1
        logging.getLogger("train").warning("record %d", i)
        if i == 100:
            print("ready", flush=True)
        time.sleep(0.001)
    """
)


def test_sigterm_flushes_the_logs_and_terminates(otlp_receiver, repo_root):
    """SIGTERM into a process that logs in a loop: it dies by SIGTERM as before, and the
    records logged before it (at least the first 100) reach the receiver."""
    env = {
        **otlp_receiver.env("grpc"),
        "OTEL_BLRP_SCHEDULE_DELAY": "60000",  # only the flush at SIGTERM exports
    }
    code, stderr = terminate_when_ready(start_python(LOG_UNTIL_TERMINATED, env=env))
    assert code == -signal.SIGTERM, stderr[-3000:]
    bodies = {r.body for r in otlp_receiver.logs()}
    assert {f"record {i}" for i in range(1, 101)} <= bodies
