"""configure(): providers from the environment, the embedded default, no-op modes, resource."""

from __future__ import annotations

import logging
import os
import random
import threading
from pathlib import Path

import pytest
from doc_rules import documents
from google.protobuf import json_format
from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support import metrics_of

import otel_training
from otel_training import configuration as setup
from otel_training import testing
from otel_training.config.identity import process_tag
from otel_training.semconv.attributes import DL_RANK, DL_RUN_ID, DL_WORLD_SIZE


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


def test_embedded_default_writes_otlp_json_files_per_rank(tmp_path, monkeypatch):
    """With nothing configured, metrics and traces land in OTLP-JSON files that parse."""
    out = tmp_path / "out"
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_OUTPUT_DIR", str(out))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    telemetry = otel_training.configure()
    assert "OTLP-JSON file" in telemetry.destination
    otel_training.record_training_metrics(telemetry.meter, loss=2.5, step_duration_ms=12.0)
    with telemetry.tracer.start_as_current_span("megatron.train"):
        pass
    assert telemetry.shutdown()
    run = Path(telemetry.output_dir)
    assert run.parent == out and (out / "latest").resolve() == run
    assert run.name == telemetry.settings.identity.run_id
    assert {"metrics-rank3.jsonl", "traces-rank3.jsonl"} <= {p.name for p in run.iterdir()}

    lines = (run / "metrics-rank3.jsonl").read_text().splitlines()
    assert lines
    request = json_format.Parse(lines[-1], ExportMetricsServiceRequest())
    resource = {kv.key: kv.value for kv in request.resource_metrics[0].resource.attributes}
    assert resource[DL_RANK].int_value == 3
    assert resource[DL_WORLD_SIZE].int_value == 4
    names = {m.name for m in metrics_of(request)}
    assert {"megatron.training.loss", "megatron.training.step_duration_ms"} <= names

    span_line = (run / "traces-rank3.jsonl").read_text().splitlines()[0]
    spans = testing.parse_otlp_json(span_line, ExportTraceServiceRequest())
    assert spans.resource_spans[0].scope_spans[0].spans[0].name == "megatron.train"


@pytest.mark.parametrize("spelling", ["true", "TRUE", " true "])
def test_sdk_disabled_starts_no_thread_and_no_socket(monkeypatch, spelling):
    """Case A4(a): disabled means no-op providers, no threads, no sockets, no raise."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", spelling)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    threads, sockets = threading.active_count(), _open_sockets()
    telemetry = otel_training.configure()
    for i in range(20):
        otel_training.record_training_metrics(telemetry.meter, loss=float(i), step_duration_ms=1.0)
    assert isinstance(telemetry.meter_provider, metrics_api.NoOpMeterProvider)
    assert isinstance(telemetry.tracer_provider, trace_api.NoOpTracerProvider)
    assert "disabled" in telemetry.destination
    assert threading.active_count() == threads
    assert _open_sockets() == sockets
    assert telemetry.shutdown()


def test_other_ranks_get_no_op_providers(monkeypatch):
    """With EXPORT_RANKS=last, rank 2 of 8 exports nothing and says so."""
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_EXPORT_RANKS", "last")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "8")
    telemetry = otel_training.configure()
    assert isinstance(telemetry.meter_provider, metrics_api.NoOpMeterProvider)
    assert "rank 2" in telemetry.destination and "last" in telemetry.destination


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        (
            {"MEGATRON_OTEL_EXPORT_STRATEGY": "single_rank"},
            "MEGATRON_OTEL_EXPORT_STRATEGY=single_rank",
        ),
        ({"MEGATRON_OTEL_RANK_STRATEGY": "first_rank_per_node"}, "MEGATRON_OTEL_RANK_STRATEGY"),
        (
            {"NEMO_LENS_EXPORT_STRATEGY": "sampled", "NEMO_LENS_EXPORT_SAMPLE_RATE": "0.3"},
            "NEMO_LENS_EXPORT_STRATEGY=sampled, NEMO_LENS_EXPORT_SAMPLE_RATE=0.3",
        ),
        ({"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "0"}, "OTEL_PYTHON_TRAINING_EXPORT_RANKS=0"),
    ],
)
def test_the_destination_line_names_the_variable_the_user_set(monkeypatch, environ, named):
    """A rank left out by a policy says which variable (and value) left it out."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    telemetry = otel_training.configure()
    assert isinstance(telemetry.meter_provider, metrics_api.NoOpMeterProvider)
    assert named in telemetry.destination and "rank 1" in telemetry.destination
    if "OTEL_PYTHON_TRAINING_EXPORT_RANKS" not in environ:
        assert "OTEL_PYTHON_TRAINING_EXPORT_RANKS" not in telemetry.destination


def test_a_policy_that_selects_no_rank_says_so_once(monkeypatch, caplog):
    """EXPORT_RANKS=8,9 in a world of 4: one warning naming the variable, even after a second
    configure(); the destination says no rank exports."""
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_EXPORT_RANKS", "8,9")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        first = otel_training.configure()
        second = otel_training.configure()
    said = [r.getMessage() for r in caplog.records if "no rank of this job" in r.getMessage()]
    assert len(said) == 1 and "OTEL_PYTHON_TRAINING_EXPORT_RANKS=8,9" in said[0]
    for telemetry in (first, second):
        assert "none from any rank" in telemetry.destination


def test_configure_sets_globals_and_get_meter_uses_them():
    """configure() installs proxies as the globals; they and get_meter() record into it."""
    memory = testing.configure_in_memory(set_global=True)
    assert metrics_api.get_meter_provider() is setup._METER_PROXY
    otel_training.record_training_metrics(otel_training.get_meter(), loss=1.25)
    metrics_api.get_meter("user").create_counter("user.steps").add(2)
    assert [p.value for _, p in memory.points("megatron.training.loss")] == [1.25]
    assert [p.value for _, p in memory.points("user.steps")] == [2]


def test_get_meter_configures_from_the_environment_on_first_use(monkeypatch):
    """get_meter() before configure() configures from OTEL_* once."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert setup.current() is None
    meter = otel_training.get_meter()
    assert setup.current() is not None
    assert otel_training.get_meter() is not None and meter is not None
    assert metrics_api.get_meter_provider() is setup._METER_PROXY
    assert meter._real_meter in setup.current().meter_provider._meters.values()


def test_set_global_false_leaves_globals_alone():
    """configure(set_global=False) does not touch the OpenTelemetry globals."""
    testing.configure_in_memory(set_global=False)
    assert not hasattr(metrics_api.get_meter_provider(), "_sdk_config")


def test_resource_carries_rank_identity_and_user_overrides(monkeypatch):
    """Detected rank identity is in the resource; OTEL_RESOURCE_ATTRIBUTES and code win."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r-9")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "dl.run.id=from-env,team=llm")
    telemetry = setup.configure(
        service_name="trainer",
        resource_attributes={"team": "from-code"},
        metric_readers=[],
        set_global=False,
        environ={**os.environ, "OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
    )
    attributes = dict(telemetry.meter_provider._sdk_config.resource.attributes)
    assert attributes[DL_RANK] == 1 and attributes[DL_WORLD_SIZE] == 2
    assert attributes[DL_RUN_ID] == "from-env"
    assert attributes["team"] == "from-code"
    assert attributes["service.name"] == "trainer"
    assert attributes["service.instance.id"] == f"r-9-rank1-{process_tag()}"


def test_otel_service_name_beats_the_default_service_name(monkeypatch):
    """service_name= is only a default: OTEL_SERVICE_NAME wins."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    telemetry = setup.configure(
        service_name="demo",
        set_global=False,
        environ={**os.environ, "OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
    )
    assert telemetry.meter_provider._sdk_config.resource.attributes["service.name"] == "from-env"


@documents(
    "spans.md", "The span ids of the spans themselves come from each process's own generator"
)
def test_span_ids_do_not_follow_the_global_random_seed():
    """Two ranks that seed `random` alike still get different span ids."""
    ids = []
    for _ in range(2):
        memory = testing.configure_in_memory()
        random.seed(1234)
        with memory.telemetry.tracer.start_as_current_span("s") as span:
            ids.append(span.get_span_context().span_id)
    assert ids[0] != ids[1]


def test_destination_line_is_announced(caplog):
    """One log line at configure says where telemetry goes."""
    with caplog.at_level(logging.INFO, logger="otel_training"):
        otel_training.configure()
    lines = [r.getMessage() for r in caplog.records if "telemetry:" in r.getMessage()]
    assert len(lines) == 1 and "metrics-rank0.jsonl" in lines[0]


def test_shutdown_is_idempotent_and_flushes():
    """shutdown() hands the last values to the reader's final collection, and may be called
    twice (the second returns at once)."""
    exported = []

    class Keeping(InMemoryMetricReader):
        def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
            exported.extend(testing.points(self.get_metrics_data(), "megatron.training.loss"))
            super().shutdown(timeout_millis=timeout_millis, **kwargs)

    telemetry = setup.configure(
        environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"},
        metric_readers=[Keeping()],
    )
    otel_training.record_training_metrics(telemetry.meter, loss=3.0)
    assert telemetry.shutdown(timeout_millis=2000)
    assert [p.value for _, p in exported] == [3.0]
    assert telemetry.shutdown(timeout_millis=2000)
    assert len(exported) == 1


def test_no_socket_opened_for_the_embedded_default():
    """The embedded default needs no server: configure opens no socket."""
    sockets = _open_sockets()
    telemetry = otel_training.configure()
    assert _open_sockets() == sockets
    telemetry.shutdown()


def test_flush_hooks_run_before_the_final_collection():
    """A flush hook publishes its values before the readers collect, and can be removed."""
    from opentelemetry.metrics import Observation

    published: list[float] = []
    before = list(setup._flush_hooks)
    memory = testing.configure_in_memory()
    memory.meter.create_observable_gauge(
        "test.published", callbacks=[lambda options: [Observation(v) for v in published[-1:]]]
    )
    remove = setup.add_flush_hook(lambda timeout_s: published.append(7.0))
    try:
        assert memory.telemetry.force_flush(timeout_millis=2000)
        assert [p.value for _, p in memory.points("test.published")] == [7.0]
    finally:
        remove()
    assert setup._flush_hooks == before  # the process-wide hooks only (deferred values)
    assert otel_training.flush_deferred in before


def test_unwritable_output_dir_falls_back_without_crashing(monkeypatch, tmp_path, caplog):
    """An output directory that cannot be created warns and uses the default directory."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_OUTPUT_DIR", str(blocker / "sub"))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING):
        telemetry = otel_training.configure()
    assert "cannot write" in caplog.text
    run = Path(telemetry.output_dir)
    assert run.parent == tmp_path / "otel-training-telemetry"
    assert f"{run}/metrics-rank0.jsonl" in telemetry.destination
    telemetry.shutdown()


def test_rejected_endpoint_is_not_used_behind_our_back(monkeypatch):
    """An endpoint the settings (config/) rejected is not re-read by the SDK's exporter."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://elsewhere")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    telemetry = otel_training.configure()
    (reader,) = telemetry.meter_provider._metric_readers
    assert reader._exporter._exporter._endpoint == "localhost:4317"
    assert "http://localhost:4317" in telemetry.destination
    telemetry.shutdown(timeout_millis=1000)


def test_configure_twice_stops_the_first_and_everything_follows_the_second(caplog):
    """Case A13: a second configure() flushes and stops the first pipeline; meters and
    tracers obtained before record into the second."""
    first = testing.configure_in_memory(set_global=True)
    meter = otel_training.get_meter()
    tracer = trace_api.get_tracer("user")
    otel_training.record_training_metrics(meter, loss=5.0, skipped_iters=3)
    with caplog.at_level(logging.INFO, logger="otel_training"):
        second = testing.configure_in_memory(set_global=True)
    for thread in setup._retiring:
        thread.join(5)
    assert "called again" in caplog.text
    assert first.telemetry._shutdown_finished.is_set() and first.telemetry not in setup._live
    assert [p.value for _, p in first.points("megatron.training.skipped_iters")] == [3]
    otel_training.record_training_metrics(meter, loss=1.0)
    with tracer.start_as_current_span("user.work"):
        pass
    assert [p.value for _, p in second.points("megatron.training.loss")] == [1.0]
    assert [s.name for s in second.spans.get_finished_spans()] == ["user.work"]
    assert first.spans.get_finished_spans() == ()


def test_environ_mapping_governs_the_resource():
    """configure(environ=...) takes service name and resource attributes from the mapping."""
    telemetry = setup.configure(
        set_global=False,
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_SERVICE_NAME": "from-mapping",
            "OTEL_RESOURCE_ATTRIBUTES": "team=llm",
        },
    )
    attributes = telemetry.meter_provider._sdk_config.resource.attributes
    assert attributes["service.name"] == "from-mapping" and attributes["team"] == "llm"


def test_resource_attributes_are_parsed_once_as_the_specification_says(monkeypatch, caplog):
    """OTEL_RESOURCE_ATTRIBUTES: keys and values percent-decoded, one warning per malformed
    entry and none from the SDK; os.environ is not read when a mapping is given."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "from.os=1")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-os")
    with caplog.at_level(logging.DEBUG):
        telemetry = setup.configure(
            set_global=False,
            environ={
                "OTEL_METRICS_EXPORTER": "none",
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_RESOURCE_ATTRIBUTES": "team%3Dname=llm%2Cpre,broken,=nokey,ok=x%20y",
            },
        )
    attributes = telemetry.meter_provider._sdk_config.resource.attributes
    assert attributes["team=name"] == "llm,pre" and attributes["ok"] == "x y"
    assert "from.os" not in attributes and attributes["service.name"] != "from-os"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["otel_training.config"] * 2
    assert ["entry 2" in r.getMessage() for r in warnings] == [True, False]


@documents(
    "spans.md", "one set in `OTEL_RESOURCE_ATTRIBUTES` or in code is kept as given, with `-rank{R}`"
)
@pytest.mark.parametrize(("world_size", "expected"), [("4", "pod-7-rank2"), ("1", "pod-7")])
def test_one_instance_id_for_a_whole_pod_stays_distinct_per_rank(world_size, expected):
    """A service.instance.id an operator sets for a whole pod gets -rank{R} with several
    ranks, so ranks stay distinct series."""
    telemetry = setup.configure(
        set_global=False,
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=pod-7",
            "RANK": "2" if world_size == "4" else "0",
            "WORLD_SIZE": world_size,
        },
    )
    attributes = telemetry.meter_provider._sdk_config.resource.attributes
    assert attributes["service.instance.id"] == expected


def test_undecodable_bytes_in_the_service_name_are_escaped():
    """An environment value with undecodable bytes (surrogates) reaches the resource escaped."""
    name = os.fsdecode(b"job-\xff")
    telemetry = setup.configure(
        set_global=False,
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_SERVICE_NAME": name,
        },
    )
    assert telemetry.meter_provider._sdk_config.resource.attributes["service.name"] == "job-\\xff"


def test_no_secret_in_the_destination_or_any_warning(caplog):
    """Header values, URL userinfo and a malformed entry's content appear nowhere we log."""
    with caplog.at_level(logging.DEBUG):
        telemetry = setup.configure(
            set_global=False,
            environ={
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://user:PASSWORD1@127.0.0.1:9",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key:SECRET2,authorization=Bearer%20TOKEN3",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://user:PASSWORD4@host",
            },
        )
    text = caplog.text + telemetry.destination + repr(telemetry.settings)
    for secret in ("PASSWORD1", "SECRET2", "TOKEN3", "PASSWORD4"):
        assert secret not in text
    assert "http://127.0.0.1:9/v1/metrics" in telemetry.destination
    assert telemetry.settings.metrics_otlp.headers["authorization"] == "Bearer TOKEN3"
    telemetry.shutdown(timeout_millis=500)


@documents("README.md", "The parallel layout Megatron-LM adds there")
def test_the_parallel_layout_is_what_the_training_code_passes():
    """dl.tensor_parallel.size, dl.pipeline_parallel.size and dl.data_parallel.size are not
    detected from a launcher; configure(resource_attributes=...) puts them in the Resource."""
    from otel_training.semconv.attributes import (
        DL_DATA_PARALLEL_SIZE,
        DL_PIPELINE_PARALLEL_SIZE,
        DL_TENSOR_PARALLEL_SIZE,
    )

    environ = {"RANK": "3", "WORLD_SIZE": "64", "TORCHELASTIC_RUN_ID": "r"}
    environ |= {"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"}
    layout = {DL_TENSOR_PARALLEL_SIZE: 8, DL_PIPELINE_PARALLEL_SIZE: 2, DL_DATA_PARALLEL_SIZE: 4}
    detected = setup.configure(set_global=False, environ=environ)
    attributes = detected.meter_provider._sdk_config.resource.attributes
    assert not set(layout) & set(attributes) and attributes[DL_WORLD_SIZE] == 64
    passed = setup.configure(set_global=False, environ=environ, resource_attributes=layout)
    attributes = passed.meter_provider._sdk_config.resource.attributes
    assert {k: attributes[k] for k in layout} == layout
