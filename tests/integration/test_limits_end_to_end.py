"""What leaves the process against real receivers: huge values (case A11), undecodable paths
(case A12), batches a receiver refuses as too large, and the string rule in every output."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from otlp_receiver import OtlpReceiver

from otel_training import setup
from otel_training.limits import DEFAULT_VALUE_LENGTH

MIB = 1024 * 1024

CASE_A11 = textwrap.dedent(
    """
    import otel_training as ot
    with ot.training_run():
        for i in range(10):
            with ot.evaluation(iteration=i):
                pass
        with ot.checkpoint_save("/ckpt/step-10", iteration=10) as save:
            save.set_attribute("megatron.checkpoint.manifest", "m" * 5_000_000)
        try:
            with ot.checkpoint_load("/ckpt/step-10"):
                raise RuntimeError("shard mismatch: " + "s" * 3_000_000)
        except RuntimeError:
            pass
        for i in range(10, 20):
            with ot.evaluation(iteration=i):
                pass
    ot.shutdown()
    """
)


def _strict(path: Path) -> list[dict]:
    def refuse(constant: str):
        raise ValueError(f"bare {constant}")

    raw = path.read_bytes()
    return [json.loads(line, parse_constant=refuse) for line in raw.decode("utf-8").splitlines()]


def _longest_string(node) -> int:
    if isinstance(node, str):
        return len(node)
    if isinstance(node, dict):
        return max([_longest_string(v) for v in node.values()] + [0])
    if isinstance(node, list):
        return max([_longest_string(v) for v in node] + [0])
    return 0


@pytest.mark.parametrize(
    ("limit_variable", "limit"),
    [
        (None, DEFAULT_VALUE_LENGTH),
        ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", 4096),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", 4096),
    ],
)
def test_case_a11_huge_values_lose_no_span(
    run_python, otlp_receiver, tmp_path, limit_variable, limit
):
    """Case A11: with a 5 MB attribute and a 3 MB exception message every span arrives over
    gRPC (4 MiB limit), every value within the limit, every JSON line under 1 MiB."""
    env = {
        **otlp_receiver.env("grpc"),
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_PYTHON_TRAINING_JSONLOG_DIR": str(tmp_path / "lines"),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "default,load_checkpoint",
    }
    if limit_variable:
        env[limit_variable] = str(limit)
    result = run_python(CASE_A11, env=env, timeout_s=120)
    assert result.returncode == 0, result.stderr[-3000:]

    spans = otlp_receiver.spans()
    names = [s.name for s in spans]
    assert names.count("megatron.evaluate") == 20
    assert {"megatron.train", "megatron.checkpoint.save", "megatron.checkpoint.load"} <= set(names)
    (load,) = otlp_receiver.spans("megatron.checkpoint.load")
    assert load.status_code == "error"
    (save,) = otlp_receiver.spans("megatron.checkpoint.save")
    manifest = save.attributes["megatron.checkpoint.manifest"]
    assert len(manifest) == limit and manifest.endswith(" characters cut]")
    texts = [
        load.status_message,
        *(v for _, attributes in load.events for v in attributes.values()),
    ]
    assert max(len(t) for t in texts if isinstance(t, str)) <= limit
    assert max(otlp_receiver.request_sizes("traces")) < 4 * MIB

    lines = _strict(tmp_path / "lines" / "latest" / "spans-rank0.jsonl")
    ends = [line for line in lines if line["record"] == "span_end"]
    assert len(ends) == len(spans) == 24  # the run, its segment, 20 evaluations, save, load
    raw = (tmp_path / "lines" / "latest" / "spans-rank0.jsonl").read_bytes().splitlines()
    assert max(len(line) for line in raw) < MIB
    assert max(_longest_string(line) for line in ends) <= limit


CASE_A12 = textwrap.dedent(
    """
    import os
    import otel_training as ot
    path = os.fsdecode(b"/ckpt/run-\\xff\\xfe/step-000100.pt")
    meter = ot.get_meter()
    with ot.training_run():
        for i in range(5):
            with ot.evaluation(iteration=i):
                pass
        with ot.checkpoint_save(path, iteration=100):
            pass
        try:
            with ot.checkpoint_load(path):
                raise FileNotFoundError(2, "No such file or directory", path)
        except FileNotFoundError:
            pass
        for i in range(5, 10):
            with ot.evaluation(iteration=i):
                pass
        ot.record_training_metrics(meter, loss=1.5)
    ot.shutdown()
    """
)
ESCAPED = "/ckpt/run-\\xff\\xfe/step-000100.pt"


def test_case_a12_undecodable_path_reaches_the_collector_escaped(
    run_python, otlp_receiver, tmp_path
):
    """Case A12 against a collector: the path arrives escaped, the rest intact, every span and
    every JSON line with it."""
    env = {
        **otlp_receiver.env("grpc"),
        "OTEL_PYTHON_TRAINING_JSONLOG_DIR": str(tmp_path),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "default,load_checkpoint",
    }
    result = run_python(CASE_A12, env=env, timeout_s=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (save,) = otlp_receiver.spans("megatron.checkpoint.save")
    assert save.attributes["megatron.checkpoint.path"] == ESCAPED
    (load,) = otlp_receiver.spans("megatron.checkpoint.load")
    # str(FileNotFoundError) shows the file name's repr, which Python escapes itself
    assert "/ckpt/run-\\udcff\\udcfe/step-000100.pt" in load.status_message
    assert load.status_code == "error"
    assert len(otlp_receiver.spans("megatron.evaluate")) == 10
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [1.5]
    lines = _strict(tmp_path / "latest" / "spans-rank0.jsonl")
    assert len([line for line in lines if line["record"] == "span_end"]) == 14
    (save_line,) = [
        line
        for line in lines
        if line["record"] == "span_end" and line["name"] == "megatron.checkpoint.save"
    ]
    assert save_line["attributes"]["megatron.checkpoint.path"] == ESCAPED


def test_case_a12_undecodable_path_in_the_embedded_default(run_python, tmp_path):
    """Case A12 with the embedded default: OTLP-JSON traces and span JSON lines hold the
    escaped path; every line is strict UTF-8 JSON."""
    out = tmp_path / "telemetry"
    env = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "default,load_checkpoint",
    }
    result = run_python(CASE_A12, env=env, timeout_s=120)
    assert result.returncode == 0, result.stderr[-3000:]
    run = out / "latest"
    traces = _strict(run / "traces-rank0.jsonl")
    spans = [
        span
        for request in traces
        for resource in request["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    assert len(spans) == 14  # the run, its segment, 10 evaluations, save, load
    (save,) = [s for s in spans if s["name"] == "megatron.checkpoint.save"]
    attributes = {a["key"]: a["value"] for a in save["attributes"]}
    assert attributes["megatron.checkpoint.path"] == {"stringValue": ESCAPED}
    lines = _strict(run / "spans-rank0.jsonl")
    assert len([line for line in lines if line["record"] == "span_end"]) == 14
    assert _strict(run / "metrics-rank0.jsonl")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_batch_refused_as_too_large_is_split_not_lost(protocol):
    """A receiver with a 1 MiB limit refuses a 3 MB request: it is sent again in halves and
    every span arrives, each request within the limit."""
    with OtlpReceiver(max_request_bytes=MIB) as receiver:
        env = {
            **receiver.env(protocol),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
        }
        telemetry = setup.configure(environ=env, set_global=False)
        for i in range(100):
            with telemetry.tracer.start_as_current_span(f"work.{i}") as span:
                span.set_attributes({key: key * 16_000 for key in "abc"})
        assert telemetry.shutdown()
        assert sorted(s.name for s in receiver.spans()) == sorted(f"work.{i}" for i in range(100))
        assert max(receiver.request_sizes("traces")) <= MIB
        if protocol != "grpc":
            assert receiver.refused  # it did refuse once: the split was needed


def test_batches_stay_under_the_request_limit_by_themselves():
    """10 MB of spans reach a receiver with the default 4 MiB limit in requests under 4 MiB,
    none refused."""
    with OtlpReceiver() as receiver:
        env = {
            **receiver.env("http/protobuf"),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
        }
        telemetry = setup.configure(environ=env, set_global=False)
        for i in range(100):
            with telemetry.tracer.start_as_current_span(f"work.{i}") as span:
                span.set_attribute("blob", "y" * 16_000)
                span.set_attribute("more", "z" * 16_000)
                span.set_attribute("again", "w" * 16_000)
        assert telemetry.shutdown()
        assert len(receiver.spans()) == 100 and not receiver.refused
        assert len(receiver.request_sizes("traces")) >= 2
        assert max(receiver.request_sizes("traces")) < 4 * MIB
