"""What leaves the process against real receivers: huge values (case A11), undecodable paths
(case A12), batches a receiver refuses as too large, and the string rule in every output."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import pytest
from doc_rules import documents
from hostile_strings import HOSTILE, PLACES, emit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.view import View
from otlp_receiver import OtlpReceiver, free_port
from support import strict_json_lines

from otel_training import configuration as setup
from otel_training.export.limits import DEFAULT_VALUE_LENGTH, MAX_NAME_LENGTH, safe_text

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


def _longest_string(node) -> int:
    if isinstance(node, str):
        return len(node)
    if isinstance(node, dict):
        return max([_longest_string(v) for v in node.values()] + [0])
    if isinstance(node, list):
        return max([_longest_string(v) for v in node] + [0])
    return 0


@documents("limits.md", "A string value is cut to the value-length limit")
@documents("limits.md", "refuses a request over 4 MiB")
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

    lines = strict_json_lines((tmp_path / "lines" / "latest" / "spans-rank0.jsonl").read_bytes())
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


@documents("limits.md", "The rest of the value is kept")
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
    lines = strict_json_lines((tmp_path / "latest" / "spans-rank0.jsonl").read_bytes())
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
    traces = strict_json_lines((run / "traces-rank0.jsonl").read_bytes())
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
    lines = strict_json_lines((run / "spans-rank0.jsonl").read_bytes())
    assert len([line for line in lines if line["record"] == "span_end"]) == 14
    assert strict_json_lines((run / "metrics-rank0.jsonl").read_bytes())


@documents("limits.md", "without retry information is not retried unchanged")
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


# -- every name that leaves the process ---------------------------------------------------------


def emit_configured(place: str, text: str, environ: dict[str, str]):
    """configure() from ``environ`` (a view renames the bad counter to ``text`` for
    ``metric.name``, ``text`` is a resource key or value for ``resource.*``), :func:`emit`,
    shut down; returns the telemetry handle."""
    views = [View(instrument_name="bad.count", name=text)] if place == "metric.name" else []
    resource = {}
    if place == "resource.key":
        resource = {text: "v"}
    elif place == "resource.value":
        resource = {"bad.resource": text}
    telemetry = setup.configure(
        environ={
            **environ,
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
        },
        set_global=False,
        views=views,
        resource_attributes=resource,
    )
    try:
        emit(telemetry, place, text)
    finally:
        assert telemetry.shutdown()
    return telemetry


def _is_cut_of(received: str, value: str) -> bool:
    """Whether ``received`` is ``value`` cut further by the record or group budget: its head
    followed by the marker."""
    head, marker, _ = received.rpartition("...[")
    return bool(marker) and received.endswith(" characters cut]") and value.startswith(head)


def _scopes(requests, kind: str) -> list:
    """Every instrumentation scope of the received requests of ``kind`` (spans, metrics or
    logs), with the schema URL of its group as ``(scope, schema_url)``."""
    resource_kind, scope_kind = f"resource_{kind}", f"scope_{kind}"
    return [
        (group.scope, group.schema_url)
        for request in requests
        for resource in getattr(request, resource_kind)
        for group in getattr(resource, scope_kind)
    ]


@pytest.fixture(scope="module", params=["grpc", "http/protobuf"])
def any_protocol_receiver(request):
    with OtlpReceiver() as receiver:
        yield receiver, request.param


@documents("limits.md", "goes through one function")
@documents("limits.md", "costs at most its own records, never a batch")
@documents("limits.md", "a view may rename a metric to any string")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(place=st.sampled_from(PLACES), raw=HOSTILE)
def test_any_string_anywhere_costs_at_most_itself(any_protocol_receiver, place, raw):
    """Property, against the real receiver over gRPC and HTTP: a string of any content in any
    place that leaves the process (scope names, versions, schema URLs and attributes, metric
    names and descriptions, span, event and link fields, resource keys and values, log
    bodies, attributes and event names) never costs another record: every well-named span,
    metric and log arrives, and so does the record that carried it, the string after the
    string rule (limits.safe_text)."""
    receiver, protocol = any_protocol_receiver
    receiver.clear()
    text = "x" + raw  # the SDK itself refuses empty names and keys
    name, value = safe_text(text, MAX_NAME_LENGTH), safe_text(text, DEFAULT_VALUE_LENGTH)
    emit_configured(place, text, {**receiver.env(protocol)})

    spans = {span.scope_name: span for span in receiver.spans()}
    counts = ("good.count", "bad.count", name)
    points = {p.scope_name: p for p in receiver.metrics() if p.name in counts}
    logs = {log.scope_name: log for log in receiver.logs()}
    assert spans["good"].name == "good.span"
    assert points["good"].value == 1
    assert logs["good"].body == "good.log"
    span = spans[name if place == "tracer.name" else "bad"]
    point = points[name if place == "meter.name" else "bad"]
    log = logs[name if place == "logger.name" else "bad"]
    assert point.value == 1 and point.name == (name if place == "metric.name" else "bad.count")
    expected = {
        "span.name": lambda: span.name == name,
        "span.attribute.key": lambda: span.attributes[name] == "v",
        "span.attribute.value": lambda: span.attributes["k"] == value,
        "event.name": lambda: span.events[0][0] == name,
        "event.attribute": lambda: span.events[0][1]["e"] == value,
        "link.attribute": lambda: span.links[0][2]["l"] == value,
        "status.description": lambda: span.status_message == value,
        "metric.description": lambda: point.description == name,  # cut as a name
        "point.attribute.key": lambda: point.attributes[name] == "v",
        "point.attribute.value": lambda: point.attributes["k"] == value,
        "meter.version": lambda: point.scope_version == name,
        "log.body": lambda: log.body == value,
        "log.attribute.key": lambda: log.attributes[name] == "v",
        "log.attribute.value": lambda: log.attributes["k"] == value,
        "resource.key": lambda: (
            span.resource_attributes[name] == "v"
            and point.resource_attributes[name] == "v"
            and log.resource_attributes[name] == "v"
        ),
        "resource.value": lambda: all(  # a resource stays under 48 KiB: cut further
            r["bad.resource"] == value or _is_cut_of(r["bad.resource"], value)
            for r in (span.resource_attributes, point.resource_attributes, log.resource_attributes)
        ),
    }
    if place in expected:
        assert expected[place](), place
    signal = place.split(".")[0]
    if signal in ("tracer", "meter", "logger"):
        kind = {"tracer": "spans", "meter": "metrics", "logger": "logs"}[signal]
        requests = {
            "spans": receiver.trace_requests,
            "metrics": receiver.metric_requests,
            "logs": receiver.log_requests,
        }[kind]()
        scope = name if place.endswith(".name") else "bad"
        found = [(s, url) for s, url in _scopes(requests, kind) if s.name == scope]
        assert found, (place, _scopes(requests, kind))
        bad_scope, schema_url = found[0]
        field = place.split(".")[1]
        if field == "version":
            assert bad_scope.version == name
        elif field == "schema_url" and protocol == "grpc":
            assert schema_url in (name, "")  # the SDK's encoders may leave it out
        elif field == "attribute":  # a scope stays under 48 KiB: cut further when longer
            received = {kv.key: kv.value.string_value for kv in bad_scope.attributes}["a"]
            assert received == value or _is_cut_of(received, value), len(received)


@documents("limits.md", "in the OTLP-JSON files, in the span JSON lines")
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(place=st.sampled_from(PLACES), raw=HOSTILE)
def test_any_string_anywhere_keeps_every_file_line(place, raw):
    """Property, for the embedded default: a string of any content in any place leaves every
    line of the OTLP-JSON files and the span JSON lines strict UTF-8 JSON under 1 MiB, with
    every record in them."""
    text = "x" + raw
    with tempfile.TemporaryDirectory() as directory:
        telemetry = emit_configured(
            place,
            text,
            {
                "OTEL_TRACES_EXPORTER": "otlp_json_file",
                "OTEL_METRICS_EXPORTER": "otlp_json_file",
                "OTEL_LOGS_EXPORTER": "otlp_json_file",
                "OTEL_PYTHON_TRAINING_OUTPUT_DIR": directory,
            },
        )
        run = Path(telemetry.output_dir)
        for file in ("traces", "metrics", "logs", "spans"):
            raw_lines = (run / f"{file}-rank0.jsonl").read_bytes().splitlines()
            assert raw_lines and max(len(line) for line in raw_lines) < MIB, file
        traces = strict_json_lines((run / "traces-rank0.jsonl").read_bytes())
        spans = [
            s["name"]
            for request in traces
            for r in request["resourceSpans"]
            for g in r["scopeSpans"]
            for s in g["spans"]
        ]
        assert len(spans) == 2 and "good.span" in spans
        metrics = strict_json_lines((run / "metrics-rank0.jsonl").read_bytes())
        counts = [
            m["name"]
            for request in metrics
            for r in request["resourceMetrics"]
            for g in r["scopeMetrics"]
            for m in g["metrics"]
            if m["name"] in ("good.count", "bad.count", safe_text(text, MAX_NAME_LENGTH))
        ]
        assert len(counts) == 2 and "good.count" in counts
        logs = strict_json_lines((run / "logs-rank0.jsonl").read_bytes())
        bodies = [
            record.get("body")
            for request in logs
            for r in request["resourceLogs"]
            for g in r["scopeLogs"]
            for record in g["logRecords"]
        ]
        assert len(bodies) == 2 and {"stringValue": "good.log"} in bodies
        lines = strict_json_lines((run / "spans-rank0.jsonl").read_bytes())
        assert len([line for line in lines if line["record"] == "span_end"]) == 2


CONSOLE_AND_PROMETHEUS = textwrap.dedent(
    """
    import sys, urllib.request
    sys.path.insert(0, "tests/integration")
    from hostile_strings import PLACES, SAMPLES, emit
    from opentelemetry.sdk.metrics.view import View
    from otel_training import configuration as setup

    telemetry = setup.configure(
        set_global=False,
        views=[View(instrument_name="bad.count", name="renamed." + SAMPLES[0])],
        resource_attributes={SAMPLES[0]: SAMPLES[1], "bad.resource": SAMPLES[-1]},
    )
    emitted = 0
    for place in PLACES:
        if place != "metric.name":
            for text in SAMPLES:
                emit(telemetry, place, "x" + text)
                emitted += 1
    port = telemetry.settings.prometheus_port_of_rank()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        scrape = reply.read().decode("utf-8")
    print("SCRAPE", reply.status, emitted, scrape.count("good_count_total{"), flush=True)
    assert telemetry.shutdown()
    """
)


@documents("limits.md", "on the console and in a Prometheus scrape")
def test_any_string_anywhere_keeps_the_console_and_prometheus(run_python):
    """Hostile strings in every place, through the console exporters of every signal and
    the Prometheus reader: every record is printed, and the scrape answers 200 in UTF-8
    with the well-named counter of every meter (a string the text format cannot carry would
    fail every scrape)."""
    port = free_port()
    result = run_python(
        CONSOLE_AND_PROMETHEUS,
        env={
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "prometheus,console",
            "OTEL_LOGS_EXPORTER": "console",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        },
        timeout_s=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("SCRAPE")]
    _, status, emitted, good_series = line.split()
    assert status == "200" and int(emitted) == (len(PLACES) - 1) * 7
    assert int(good_series) == 1  # one meter "good", its counter added to every time
    assert result.stdout.count('"name": "good.span"') == int(emitted)
    assert result.stdout.count('"body": "good.log"') == int(emitted)
    assert "Traceback" not in result.stderr
