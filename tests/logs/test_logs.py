"""The logs signal: its settings, the logging bridge (otel_training.logs.bridge), exceptions on
spans as ERROR log records (processors/exception_logs.py) and SafeLogRecordExporter, with real
SDK parts and the real OTLP encoders."""

from __future__ import annotations

import io
import json
import logging
import os
import re

import pytest
from doc_rules import documents
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context as context_api
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.json.file._log_exporter import FileLogExporter
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits, LogRecordProcessor
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    InMemoryLogRecordExporter,
    LogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace import sampling as sampling_sdk
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from support import examples

import otel_training
from otel_training import config, testing
from otel_training import configuration as setup
from otel_training.export import files, limits
from otel_training.export.exporters import SafeLogRecordExporter
from otel_training.export.limits import Limits, bounded_log_record, bounded_span, cut_marker
from otel_training.logs import bridge as log_bridge
from otel_training.semconv.attributes import DL_RANK, DL_WORLD_SIZE
from otel_training.semconv.attributes import OTEL_TRAINING_LOG_ARGUMENTS as LOG_ARGUMENTS
from otel_training.semconv.attributes import OTEL_TRAINING_LOG_FORMAT_ERROR as FORMAT_ERROR
from otel_training.trace.processors.exception_logs import ExceptionLogSpanProcessor

SUCCESS = LogRecordExportResult.SUCCESS
FAILURE = LogRecordExportResult.FAILURE
#: Any Python string, lone surrogates and controls included (st.text() leaves surrogates out).
ANY_TEXT = st.lists(
    st.one_of(
        st.characters(),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
        st.sampled_from(["\x00", "\n", "\u2028", '"', "\\"]),
    ),
    max_size=200,
).map("".join)
#: Any OTLP AnyValue a caller may hand over, with integers beyond int64 and odd floats.
ANY_VALUE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(),
        st.binary(max_size=200),
        ANY_TEXT,
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(ANY_TEXT, children, max_size=4)
    ),
    max_leaves=12,
)


# -- helpers ----------------------------------------------------------------------------------


class EncodingExporter(LogRecordExporter):
    """Encodes every batch it gets with the real OTLP protobuf encoder and writes it with the
    real OTLP-JSON file exporter; fails the test when either refuses."""

    def __init__(self) -> None:
        self.requests: list[ExportLogsServiceRequest] = []
        self.stream = io.StringIO()
        self._file = FileLogExporter(stream=self.stream)

    def export(self, batch):
        payload = encode_logs(batch).SerializeToString()
        self.requests.append(ExportLogsServiceRequest.FromString(payload))
        assert self._file.export(batch) is SUCCESS
        return SUCCESS

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def records(self):
        return [
            record
            for request in self.requests
            for resource_logs in request.resource_logs
            for scope_logs in resource_logs.scope_logs
            for record in scope_logs.log_records
        ]

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def safe_provider(exporter: LogRecordExporter, **kwargs) -> LoggerProvider:
    """A real LoggerProvider exporting synchronously through SafeLogRecordExporter."""
    provider = LoggerProvider(
        resource=Resource({"service.name": "test"}),
        shutdown_on_exit=False,
        log_record_limits=LogRecordLimits(
            max_attribute_length=LogRecordLimits.UNSET,
            max_log_record_attribute_length=LogRecordLimits.UNSET,
        ),
    )
    provider.add_log_record_processor(
        SimpleLogRecordProcessor(SafeLogRecordExporter(exporter, **kwargs))
    )
    return provider


def strings_in(value, keys: list[str]) -> list[str]:
    """Every string value of a decoded OTLP AnyValue; its map keys are added to ``keys``."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return [value.string_value]
    if which == "array_value":
        return [s for v in value.array_value.values for s in strings_in(v, keys)]
    if which == "kvlist_value":
        keys.extend(kv.key for kv in value.kvlist_value.values)
        return [s for kv in value.kvlist_value.values for s in strings_in(kv.value, keys)]
    return []


def env(**variables: str) -> dict[str, str]:
    """A configure(environ=...) mapping that installs no SIGTERM handler in the test process."""
    return {"OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false", **variables}


def load(caplog, **env):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="otel_training.config"):
        loaded = config.load(env)
    return loaded, [r.getMessage() for r in caplog.records]


@pytest.fixture
def memory():
    """An in-memory pipeline (logs synchronous) with the bridge on the `train` logger."""
    telemetry = testing.configure_in_memory({"RANK": "3", "WORLD_SIZE": "4"})
    logger = logging.getLogger("train")
    handler = otel_training.logging_handler()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield telemetry, logger
    logger.removeHandler(handler)
    logger.setLevel(level)


def finished(telemetry) -> list:
    return [r.log_record for r in telemetry.logs.get_finished_logs()]


# -- settings ---------------------------------------------------------------------------------


def test_logs_default_to_the_embedded_file_with_the_sdks_batch_settings(caplog):
    """With nothing set: logs to the embedded default, the SDK's BLRP delay and timeout (the
    queue sized per exporter), 128 attributes, the root logger not bridged, no warning."""
    loaded, warnings = load(caplog)
    logs = loaded.logs
    assert logs.exporters == ("otlp_json_file",)
    assert (logs.schedule_delay_ms, logs.export_timeout_ms) == (1_000, 30_000)
    assert (logs.max_queue_size, logs.max_export_batch_size) == (None, None)  # per exporter
    assert logs.attribute_count == 128 and not logs.bridge_root_logger
    assert warnings == []


def test_a_logs_endpoint_selects_otlp_for_logs_alone(caplog):
    """OTEL_EXPORTER_OTLP_LOGS_ENDPOINT sends logs by OTLP and leaves the other signals
    embedded; its protocol, headers, timeout and compression win over the generic ones."""
    loaded, warnings = load(
        caplog,
        OTEL_EXPORTER_OTLP_LOGS_ENDPOINT="http://127.0.0.1:4318/v1/logs",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_LOGS_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_HEADERS="a=1",
        OTEL_EXPORTER_OTLP_LOGS_HEADERS="b=2",
        OTEL_EXPORTER_OTLP_TIMEOUT="3",
        OTEL_EXPORTER_OTLP_LOGS_TIMEOUT="4",
        OTEL_EXPORTER_OTLP_LOGS_COMPRESSION="deflate",
    )
    assert warnings == []
    assert loaded.logs.exporters == ("otlp",)
    assert loaded.metrics_exporters == loaded.traces_exporters == ("otlp_json_file",)
    otlp = loaded.logs.otlp
    assert otlp.endpoint == "http://127.0.0.1:4318/v1/logs"
    assert (otlp.protocol, otlp.timeout_s, otlp.compression) == ("http/protobuf", 4.0, "deflate")
    assert otlp.headers == {"a": "1", "b": "2"}


def test_the_generic_endpoint_gets_the_logs_path_over_http(caplog):
    """OTEL_EXPORTER_OTLP_ENDPOINT selects otlp for logs too; over HTTP it gets /v1/logs."""
    loaded, _ = load(
        caplog,
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318",
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
    )
    assert loaded.logs.exporters == ("otlp",)
    assert loaded.logs.otlp.endpoint == "http://127.0.0.1:4318/v1/logs"


@pytest.mark.parametrize(
    ("name", "value", "read"),
    [
        ("OTEL_LOGS_EXPORTER", "loki", lambda s: s.logs.exporters == ("otlp_json_file",)),
        ("OTEL_BLRP_SCHEDULE_DELAY", "soon", lambda s: s.logs.schedule_delay_ms == 1_000),
        ("OTEL_BLRP_EXPORT_TIMEOUT", "nan", lambda s: s.logs.export_timeout_ms == 30_000),
        ("OTEL_BLRP_MAX_QUEUE_SIZE", "0", lambda s: s.logs.max_queue_size == 2048),
        ("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "1.5", lambda s: s.logs.max_export_batch_size == 512),
        ("OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT", "-1", lambda s: s.logs.attribute_count == 128),
        ("OTEL_ATTRIBUTE_COUNT_LIMIT", "many", lambda s: s.logs.attribute_count == 128),
        ("OTEL_PYTHON_TRAINING_LOGGING", "yes", lambda s: s.logs.bridge_root_logger is False),
        ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "5000", lambda s: s.logs.otlp.timeout_s == 10.0),
        (
            "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
            "thrift",
            lambda s: s.logs.otlp.protocol == "grpc",
        ),
    ],
)
def test_a_bad_logs_value_warns_once_and_uses_the_default(caplog, name, value, read):
    """Each unusable logs variable: one warning naming it, then its default."""
    loaded, warnings = load(caplog, **{name: value})
    assert read(loaded)
    assert len(warnings) == 1 and name in warnings[0], warnings


def test_good_logs_values_are_taken(caplog):
    """OTEL_BLRP_*, the record attribute count (over the generic one) and the root switch."""
    loaded, warnings = load(
        caplog,
        OTEL_BLRP_SCHEDULE_DELAY="250",
        OTEL_BLRP_EXPORT_TIMEOUT="2000",
        OTEL_BLRP_MAX_QUEUE_SIZE="64",
        OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="8",
        OTEL_ATTRIBUTE_COUNT_LIMIT="5",
        OTEL_LOGRECORD_ATTRIBUTE_COUNT_LIMIT="7",
        OTEL_PYTHON_TRAINING_LOGGING="TRUE",
        OTEL_LOGS_EXPORTER="console,none",
    )
    logs = loaded.logs
    assert warnings == []
    assert (logs.schedule_delay_ms, logs.export_timeout_ms) == (250, 2000)
    assert (logs.max_queue_size, logs.max_export_batch_size) == (64, 8)
    assert logs.attribute_count == 7 and logs.bridge_root_logger
    assert logs.exporters == ("none",)


def test_a_batch_larger_than_the_queue_is_clamped_with_one_warning(caplog):
    """OTEL_BLRP_MAX_EXPORT_BATCH_SIZE above OTEL_BLRP_MAX_QUEUE_SIZE becomes the queue size."""
    loaded, warnings = load(
        caplog, OTEL_BLRP_MAX_QUEUE_SIZE="16", OTEL_BLRP_MAX_EXPORT_BATCH_SIZE="100"
    )
    assert loaded.logs.max_export_batch_size == 16
    assert len(warnings) == 1 and "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE" in warnings[0]


def test_the_shutdown_bound_counts_the_logs_otlp_timeout(caplog):
    """Shutdown is bounded by the longest OTLP timeout, the logs' included."""
    loaded, _ = load(
        caplog,
        OTEL_METRICS_EXPORTER="none",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="2",
        OTEL_LOGS_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_LOGS_TIMEOUT="7",
    )
    assert loaded.shutdown_timeout_s == 7.0
    only_logs, _ = load(caplog, OTEL_LOGS_EXPORTER="otlp", OTEL_EXPORTER_OTLP_LOGS_TIMEOUT="3")
    assert only_logs.shutdown_timeout_s == 3.0
    local, _ = load(caplog, OTEL_LOGS_EXPORTER="otlp_json_file")
    assert local.shutdown_timeout_s == config.LOCAL_SHUTDOWN_TIMEOUT_S


# -- the pipeline -----------------------------------------------------------------------------


def test_the_embedded_default_writes_logs_in_the_runs_directory(tmp_path):
    """configure() writes logs-rank{R}.jsonl beside the metrics and traces, OTLP-JSON with the
    rank's resource, and says so in the destination line."""
    telemetry = setup.configure(
        environ=env(OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path), RANK="2", WORLD_SIZE="4")
    )
    assert f"logs to OTLP-JSON file {telemetry.output_dir}/logs-rank2.jsonl" in (
        telemetry.destination
    )
    otel_training.get_logger("train").emit(body="hello", severity_number=SeverityNumber.INFO)
    assert telemetry.shutdown()
    (line,) = (tmp_path / "latest" / "logs-rank2.jsonl").read_text().splitlines()
    request = testing.parse_otlp_json(line, ExportLogsServiceRequest())
    resource = {kv.key: kv.value for kv in request.resource_logs[0].resource.attributes}
    assert (resource[DL_RANK].int_value, resource[DL_WORLD_SIZE].int_value) == (2, 4)
    (record,) = request.resource_logs[0].scope_logs[0].log_records
    assert record.body.string_value == "hello"


@pytest.mark.slow
def test_the_embedded_defaults_logs_file_keeps_a_burst(tmp_path):
    """20,000 records logged in a tight loop all reach logs-rank0.jsonl at default settings
    (the local file's queue takes bursts; over OTLP the SDK's 2,048 apply)."""
    telemetry = setup.configure(environ=env(OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path)))
    logger = logging.getLogger("train.burst")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler := otel_training.logging_handler())
    try:
        for i in range(20_000):
            logger.info("record %d", i)
    finally:
        logger.removeHandler(handler)
    assert telemetry.shutdown()
    bodies = []
    for line in (tmp_path / "latest" / "logs-rank0.jsonl").read_text().splitlines():
        request = testing.parse_otlp_json(line, ExportLogsServiceRequest())
        for scope_logs in request.resource_logs[0].scope_logs:
            bodies.extend(r.body.string_value for r in scope_logs.log_records)
    assert bodies == [f"record {i}" for i in range(20_000)]


def test_no_logs_exporter_means_no_logger_provider():
    """OTEL_LOGS_EXPORTER=none (and no extra log processor) builds no LoggerProvider, hence
    no thread; the bridge then costs a check."""
    telemetry = setup.configure(environ=env(OTEL_LOGS_EXPORTER="none", OTEL_TRACES_EXPORTER="none"))
    assert not isinstance(telemetry.logger_provider, LoggerProvider)
    assert "logs to nowhere" in telemetry.destination
    logging.getLogger("train").addHandler(handler := otel_training.logging_handler())
    try:
        logging.getLogger("train").warning("goes nowhere")
    finally:
        logging.getLogger("train").removeHandler(handler)


def test_a_disabled_sdk_has_a_no_op_logger_provider():
    """OTEL_SDK_DISABLED=true: no LoggerProvider, and get_logger() emits into nothing."""
    telemetry = setup.configure(environ=env(OTEL_SDK_DISABLED="true"))
    assert not isinstance(telemetry.logger_provider, LoggerProvider)
    otel_training.get_logger().emit(body="nothing")


def test_the_logger_provider_has_the_pipelines_resource(memory):
    """Log records carry the same resource as the other signals: the rank's identity."""
    telemetry, logger = memory
    logger.info("hello")
    (record,) = telemetry.logs.get_finished_logs()
    assert record.resource is telemetry.telemetry.tracer_provider.resource
    assert record.resource.attributes[DL_RANK] == 3
    assert record.resource.attributes[DL_WORLD_SIZE] == 4


# -- the logging bridge -----------------------------------------------------------------------


def test_a_record_inside_a_sampled_span_carries_its_ids(memory):
    """Inside a recording, sampled span a record has that span's trace id, span id and
    flags; outside any span it has none."""
    telemetry, logger = memory
    logger.info("before")
    with telemetry.telemetry.tracer.start_as_current_span("iteration") as span:
        logger.info("inside")
    outside, inside = finished(telemetry)
    context = span.get_span_context()
    assert (inside.trace_id, inside.span_id) == (context.trace_id, context.span_id)
    assert inside.trace_flags.sampled
    assert (outside.trace_id, outside.span_id, int(outside.trace_flags)) == (0, 0, 0)


class _RecordOnly(sampling_sdk.Sampler):
    def should_sample(self, *args, **kwargs):
        return sampling_sdk.SamplingResult(sampling_sdk.Decision.RECORD_ONLY)

    def get_description(self) -> str:
        return "record-only"


def test_a_record_in_an_unsampled_span_carries_no_ids(memory):
    """In a span that is not sampled (dropped, or recorded only) a record has no ids: they
    would name a span that is never exported."""
    telemetry, logger = memory
    dropped = TracerProvider(sampler=sampling_sdk.ALWAYS_OFF).get_tracer("t")
    record_only = TracerProvider(sampler=_RecordOnly()).get_tracer("t")
    for tracer in (dropped, record_only):
        with tracer.start_as_current_span("unsampled") as span:
            assert span.get_span_context().is_valid
            logger.info("inside an unsampled span")
    for record in finished(telemetry):
        assert (record.trace_id, record.span_id, int(record.trace_flags)) == (0, 0, 0)
    assert len(finished(telemetry)) == 2


def test_a_record_carries_level_message_code_extras_and_exception(memory):
    """Severity number and text, the formatted message as body, the code location, the
    extra= fields (non-primitive ones as text) and exc_info as exception attributes."""
    telemetry, logger = memory

    class Step:
        def __str__(self) -> str:
            return "step-7"

    logger.warning("loss %.1f at %s", 2.5, "iter 7", extra={"step": 7, "obj": Step()})
    try:
        raise KeyError("missing")
    except KeyError:
        logger.exception("lookup failed")
    logger.setLevel(1)
    logger.log(5, "below debug")
    logger.critical({"structured": [1, 2]})
    warning, error, low, critical = finished(telemetry)
    assert (warning.severity_number, warning.severity_text) == (SeverityNumber.WARN, "WARN")
    assert warning.body == "loss 2.5 at iter 7"
    attributes = dict(warning.attributes)
    assert attributes["code.function.name"] == (
        "test_a_record_carries_level_message_code_extras_and_exception"
    )
    assert attributes["code.file.path"] == __file__ and attributes["code.line.number"] > 0
    assert (attributes["step"], attributes["obj"]) == (7, "step-7")
    assert (error.severity_number, error.severity_text) == (SeverityNumber.ERROR, "ERROR")
    assert error.attributes[EXCEPTION_TYPE] == "KeyError"
    assert error.attributes[EXCEPTION_MESSAGE] == "'missing'"
    assert 'raise KeyError("missing")' in error.attributes[EXCEPTION_STACKTRACE]
    assert low.severity_number == SeverityNumber.UNSPECIFIED
    assert (critical.severity_number, critical.severity_text) == (SeverityNumber.FATAL, "FATAL")
    assert critical.body == {"structured": (1, 2)} or critical.body == {"structured": [1, 2]}


def test_severity_numbers_follow_the_data_model():
    """DEBUG..CRITICAL map to 5, 9, 13, 17, 21; the levels above each step add up to 3."""
    expected = {0: 0, 9: 0, 10: 5, 11: 6, 13: 8, 19: 8, 20: 9, 30: 13, 40: 17, 50: 21, 53: 24}
    for levelno, number in expected.items():
        assert log_bridge.severity_number(levelno).value == number
    assert log_bridge.severity_number(99) is SeverityNumber.FATAL4


def test_the_handler_never_raises_into_the_caller():
    """A message whose arguments do not format, a filter or formatter that raises, an extra
    whose str() raises: logging returns normally; what can be kept is exported."""
    telemetry = testing.configure_in_memory()
    # Not propagated: pytest's own capture handler re-raises formatting errors.
    logger = logging.getLogger("train.never_raises")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler := otel_training.logging_handler())

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no str")

    class RaisingFormatter(logging.Formatter):
        def format(self, record):
            raise ValueError("formatter")

    class RaisingFilter(logging.Filter):
        def filter(self, record):
            raise ValueError("filter")

    try:
        logger.info("%d steps", "many")  # a TypeError inside getMessage()
        logger.info("extra", extra={"bad": Broken()})
        handler.setFormatter(RaisingFormatter())
        logger.info("formatted badly")
        handler.addFilter(RaisingFilter())
        logger.info("filtered badly")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    bad_args, extra, formatted = finished(telemetry)
    assert bad_args.body == "%d steps" and bad_args.attributes[LOG_ARGUMENTS] == ("many",)
    assert extra.attributes["bad"] == "<Broken>"
    assert formatted.body == "formatted badly"


def test_the_sdks_and_our_own_records_never_loop_back(memory):
    """Records of the opentelemetry, otel_training and grpc loggers, and records logged while
    an export runs (suppress-instrumentation context), are not bridged."""
    telemetry, logger = memory
    handler = otel_training.logging_handler()
    names = [
        "opentelemetry.sdk._shared_internal",
        "otel_training.export.exporters",
        "grpc._channel",
    ]
    for name in names:
        logging.getLogger(name).addHandler(handler)
    try:
        for name in names:
            logging.getLogger(name).error("from %s", name)
        token = context_api.attach(
            context_api.set_value(context_api._SUPPRESS_INSTRUMENTATION_KEY, True)
        )
        try:
            logger.error("while exporting")
        finally:
            context_api.detach(token)
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(handler)
    assert finished(telemetry) == []


class _LoggingExporter(LogRecordExporter):
    """Logs a warning on every export, as an exporter does when its endpoint fails."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, batch):
        self.exported += len(batch)
        logging.getLogger("urllib3.connectionpool").warning("Retrying after failure")
        return SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class _LoggingProcessor(LogRecordProcessor):
    """Logs to the bridged logger from inside on_emit, on the emitting thread."""

    def __init__(self) -> None:
        self.emitted = 0

    def on_emit(self, log_record) -> None:
        self.emitted += 1
        logging.getLogger("train").error("logged while emitting")

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def test_records_logged_while_exporting_or_emitting_do_not_come_back():
    """With the root logger bridged, an exporter that logs on each export (on the batch
    processor's thread) and a processor that logs while it handles a record (on the logging
    thread) add no record: one record in, one out, however often it is flushed."""
    exporter, processor = _LoggingExporter(), _LoggingProcessor()
    setup.configure(
        environ=env(
            OTEL_LOGS_EXPORTER="none",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            OTEL_PYTHON_TRAINING_LOGGING="true",
        ),
        log_processors=[BatchLogRecordProcessor(exporter), processor],
    )
    train = logging.getLogger("train")
    train.setLevel(logging.INFO)
    try:
        train.info("one record")
        for _ in range(3):
            assert otel_training.force_flush()
    finally:
        train.setLevel(logging.NOTSET)
    assert (exporter.exported, processor.emitted) == (1, 1)


def test_the_handler_follows_a_reconfigured_pipeline_and_stops_after_shutdown(caplog):
    """A handler made before a second configure() emits into the new pipeline; after
    shutdown records go nowhere, without a warning per record."""
    first = testing.configure_in_memory()
    logger = logging.getLogger("train")
    handler = otel_training.logging_handler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("to the first")
        second = testing.configure_in_memory()
        logger.info("to the second")
        assert second.telemetry.shutdown()
        caplog.clear()
        with caplog.at_level(logging.INFO):
            logger.info("after shutdown")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert [r.body for r in finished(first)] == ["to the first"]
    assert [r.body for r in finished(second)] == ["to the second"]
    assert [r.getMessage() for r in caplog.records] == ["after shutdown"]


def test_the_root_switch_adds_the_bridge_once_and_a_later_configure_removes_it():
    """OTEL_PYTHON_TRAINING_LOGGING=true puts one bridge on the root logger, however often
    configure() runs; a configure() without it takes it away."""
    root = logging.getLogger()

    def bridges() -> int:
        return sum(isinstance(h, log_bridge.LoggingHandler) for h in root.handlers)

    on = {"OTEL_PYTHON_TRAINING_LOGGING": "true"}
    first = testing.configure_in_memory(on)
    second = testing.configure_in_memory(on)
    assert bridges() == 1
    logging.getLogger("any.library").warning("seen by the root bridge")
    assert finished(first) == []  # that pipeline was replaced
    assert [r.body for r in finished(second)] == ["seen by the root bridge"]
    testing.configure_in_memory()
    assert bridges() == 0


def test_logging_configuration_functions_work_beside_the_root_bridge(monkeypatch):
    """With the root bridge on, basicConfig() (a no-op when the root logger has a handler)
    and dictConfig() configure the root logger as without it, the bridge staying; a
    configure() without the bridge gives the stdlib functions back."""
    import logging.config

    root = logging.getLogger()
    originals = (logging.basicConfig, logging.config.dictConfig, logging.config.fileConfig)
    monkeypatch.setattr(root, "handlers", [])  # a program's root logger, not pytest's
    monkeypatch.setattr(root, "level", logging.WARNING)
    testing.configure_in_memory({"OTEL_PYTHON_TRAINING_LOGGING": "true"})
    try:
        stream = io.StringIO()
        logging.basicConfig(level=logging.INFO, stream=stream, format="%(message)s")
        logging.getLogger("train").info("basicConfig after configure()")
        assert stream.getvalue() == "basicConfig after configure()\n"
        assert root.level == logging.INFO
        assert [type(h) for h in root.handlers] == [
            logging.StreamHandler,
            type(log_bridge._ROOT_BRIDGE),
        ]
        logging.config.dictConfig(
            {"version": 1, "disable_existing_loggers": False, "root": {"level": "ERROR"}}
        )
        assert root.level == logging.ERROR and root.handlers == [log_bridge._ROOT_BRIDGE]
    finally:
        testing.configure_in_memory()
    assert root.handlers == []
    assert (logging.basicConfig, logging.config.dictConfig, logging.config.fileConfig) == originals


def test_get_logger_follows_the_configured_pipeline():
    """otel_training.get_logger() and the OpenTelemetry logs global emit into the pipeline
    configured now, with the current span's ids (the SDK's rule for an emit without ids)."""
    from opentelemetry import _logs

    first = testing.configure_in_memory(set_global=True)
    logger = otel_training.get_logger("user")
    logger.emit(body="one")
    second = testing.configure_in_memory(set_global=True)
    with second.telemetry.tracer.start_as_current_span("s") as span:
        logger.emit(body="two")
        _logs.get_logger("global").emit(body="three")
    assert [r.body for r in finished(first)] == ["one"]
    two, three = finished(second)
    assert (two.body, three.body) == ("two", "three")
    assert two.span_id == span.get_span_context().span_id


# -- exceptions as ERROR log records ----------------------------------------------------------


def test_an_exception_in_a_phase_is_an_error_record_with_the_spans_ids():
    """An exception leaving a phase: one ERROR record with that span's ids, the exception
    attributes of its event and the status description as body, at the event's time."""
    telemetry = testing.configure_in_memory()
    with pytest.raises(ValueError):
        with otel_training.training_run():
            raise ValueError("loss is NaN")
    (span,) = telemetry.spans.get_finished_spans()
    (record,) = finished(telemetry)
    (event,) = [e for e in span.events if e.name == "exception"]
    assert (record.trace_id, record.span_id) == (span.context.trace_id, span.context.span_id)
    assert record.trace_flags.sampled
    assert (record.severity_number, record.severity_text) == (SeverityNumber.ERROR, "ERROR")
    assert record.body == span.status.description == "ValueError: loss is NaN"
    assert record.timestamp == event.timestamp
    for key in (EXCEPTION_TYPE, EXCEPTION_MESSAGE, EXCEPTION_STACKTRACE):
        assert record.attributes[key] == event.attributes[key]


def _save(path: str) -> None:
    with otel_training.checkpoint_save(path):
        raise OSError("disk full")


def test_an_exception_through_nested_phases_is_logged_once_where_it_left_the_innermost():
    """Recorded on every span it leaves (in this frame or further up), an exception is one
    record: the innermost span's; the same failure raised again later is a record again."""
    groups = {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "job,step,checkpoint"}  # no first_iteration
    telemetry = testing.configure_in_memory(groups)
    with pytest.raises(OSError):
        with otel_training.training_run():
            with otel_training.training_iteration():
                _save("/ckpt/step-1")
    spans = telemetry.spans.get_finished_spans()
    assert len(spans) == 3 and all(any(e.name == "exception" for e in s.events) for s in spans)
    (record,) = finished(telemetry)
    assert record.span_id == spans[0].context.span_id  # the checkpoint save, ended first
    with pytest.raises(OSError):
        with otel_training.training_run():
            try:
                _save("/ckpt/step-2")
            except OSError:
                pass
            raise OSError("disk full")
    assert len(finished(telemetry)) == 3


def test_the_same_exception_in_sibling_spans_is_logged_each_time():
    """Two sibling spans failing alike are two exceptions, two records."""
    telemetry = testing.configure_in_memory()
    tracer = telemetry.telemetry.tracer
    with tracer.start_as_current_span("run"):
        for _ in range(2):
            with pytest.raises(RuntimeError):
                with tracer.start_as_current_span("attempt"):
                    raise RuntimeError("flaky")
    attempts = [s for s in telemetry.spans.get_finished_spans() if s.name == "attempt"]
    records = finished(telemetry)
    assert [r.span_id for r in records] == [s.context.span_id for s in attempts]


def test_an_exception_on_an_unsampled_span_is_logged_without_ids():
    """A record-only span's exception is still an ERROR record, with no ids."""
    exporter = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider(shutdown_on_exit=False)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=_RecordOnly(), shutdown_on_exit=False)
    tracer_provider.add_span_processor(
        ExceptionLogSpanProcessor(logger_provider.get_logger("otel_training"))
    )
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    with tracer_provider.get_tracer("t").start_as_current_span("s") as span:
        span.record_exception(ZeroDivisionError("division by zero"))
    (record,) = exporter.get_finished_logs()
    assert (record.log_record.trace_id, record.log_record.span_id) == (0, 0)
    assert record.log_record.body == "ZeroDivisionError: division by zero"
    assert record.log_record.attributes[EXCEPTION_TYPE] == "ZeroDivisionError"


# -- SafeLogRecordExporter --------------------------------------------------------------------


def test_surrogates_and_huge_values_encode_and_are_bounded():
    """A lone surrogate, a 5 MB body, a huge attribute, bytes, an integer beyond int64 and a
    non-string key: every export encodes in protobuf and as OTLP-JSON lines under 1 MiB, and
    cut values say so."""
    exporter = EncodingExporter()
    logger = safe_provider(exporter, limits=Limits(value_length=4096)).get_logger("train")
    path = os.fsdecode(b"/ckpt/run-\xff/step.pt")
    logger.emit(body=path, attributes={"path": path})
    logger.emit(body="x" * 5_000_000, attributes={"huge": "é" * 3_000_000})
    logger.emit(
        body={"nested": [b"\x00" * 10_000, 2**80, {"k\udcff": "v"}]},
        attributes={"big": 2**64, "blob": b"\xff" * 10_000},
    )
    escaped, huge, nested = exporter.records()
    assert escaped.body.string_value == "/ckpt/run-\\xff/step.pt"
    assert escaped.attributes[0].value.string_value == "/ckpt/run-\\xff/step.pt"
    body = huge.body.string_value
    marker = re.search(r"\.\.\.\[(\d+) characters cut\]$", body)
    assert len(body) == 4096 and len(body) - len(marker.group(0)) + int(marker.group(1)) == 5e6
    assert body.endswith(cut_marker(int(marker.group(1))))
    assert len(huge.attributes[0].value.string_value) == 4096
    values = nested.body.kvlist_value.values[0].value.array_value.values
    assert len(values[0].bytes_value) == 4096 and values[0].bytes_value.endswith(b"cut]")
    assert values[1].double_value == float(2**80)
    assert values[2].kvlist_value.values[0].key == "k\\xff"
    assert nested.attributes[0].value.double_value == float(2**64)
    lines = exporter.lines()
    assert len(lines) == 3
    for line in lines:
        assert len(line.encode()) < files.MAX_LINE_BYTES
        testing.parse_otlp_json(line, ExportLogsServiceRequest())


def test_a_clean_record_passes_unchanged():
    """A record that needs nothing of the rule is handed on as the same object."""
    exporter = InMemoryLogRecordExporter()
    provider = safe_provider(exporter)
    provider.get_logger("train").emit(body="fine", attributes={"step": 3, "loss": 2.5})
    (record,) = exporter.get_finished_logs()
    assert record.log_record.body == "fine" and dict(record.log_record.attributes)["step"] == 3
    assert limits.bounded_log_record(record) is record


def test_many_large_values_fit_the_record_budget():
    """Unbounded values (limit None) that together exceed the record budget are cut alike
    until the record's worst-case JSON size fits; the line stays under 1 MiB."""
    exporter = EncodingExporter()
    logger = safe_provider(exporter, limits=Limits(value_length=None)).get_logger("train")
    logger.emit(body="b" * 400_000, attributes={f"k{i}": "\u00e9" * 100_000 for i in range(8)})
    (line,) = exporter.lines()
    assert len(line.encode()) < files.MAX_LINE_BYTES
    (record,) = exporter.records()
    cut = [kv.value.string_value for kv in record.attributes]
    assert len(set(map(len, cut))) == 1 and cut[0].endswith("characters cut]")


def test_a_batch_is_split_into_requests_under_the_size_limit():
    """A batch whose records together exceed the request limit goes out in several requests,
    in order, each under the limit; nothing is lost."""
    exporter = EncodingExporter()
    processor_exporter = SafeLogRecordExporter(
        exporter, limits=Limits(value_length=None), max_request_bytes=1_000_000
    )
    provider = LoggerProvider(shutdown_on_exit=False)
    memory = InMemoryLogRecordExporter()
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    for i in range(10):
        provider.get_logger("train").emit(body=f"{i}:" + "x" * 200_000)
    assert processor_exporter.export(memory.get_finished_logs()) is SUCCESS
    assert len(exporter.requests) > 1
    assert all(r.ByteSize() < 1_000_000 for r in exporter.requests)
    bodies = [r.body.string_value.split(":")[0] for r in exporter.records()]
    assert bodies == [str(i) for i in range(10)]


class _RefusingLargeBatches(LogRecordExporter):
    """Refuses at once any batch of more than two records, as a receiver with a lower size
    limit would (HTTP 413)."""

    def __init__(self) -> None:
        self.accepted: list[str] = []

    def export(self, batch):
        if len(batch) > 2:
            return FAILURE
        self.accepted.extend(r.log_record.body for r in batch)
        return SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def test_a_refused_batch_is_sent_again_in_halves():
    """A batch refused quickly is split in halves until the receiver takes the pieces."""
    refusing = _RefusingLargeBatches()
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    bodies = [f"{i}" + "y" * 50_000 for i in range(8)]
    for body in bodies:
        provider.get_logger("train").emit(body=body)
    safe = SafeLogRecordExporter(refusing, limits=Limits(value_length=None))
    assert safe.export(memory.get_finished_logs()) is SUCCESS
    assert refusing.accepted == bodies


def test_a_forked_child_exports_nothing():
    """In a forked child (a DataLoader worker) export succeeds without calling the exporter."""
    refusing = _RefusingLargeBatches()
    safe = SafeLogRecordExporter(refusing)
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    provider.get_logger("train").emit(body="parent's")
    batch = memory.get_finished_logs()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = safe.export(batch) is SUCCESS and refusing.accepted == []
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert safe.export(batch) is SUCCESS and refusing.accepted == ["parent's"]


@settings(max_examples=examples(60), deadline=None)
@given(body=ANY_VALUE, attributes=st.dictionaries(ANY_TEXT.filter(bool), ANY_VALUE, max_size=4))
def test_any_log_record_encodes_and_is_bounded(body, attributes):
    """Any body and attributes: the export encodes in protobuf and as an OTLP-JSON line that
    parses, and every string in it is within the limit."""
    exporter = EncodingExporter()
    logger = safe_provider(exporter, limits=Limits(value_length=64)).get_logger("t\udcff")
    logger.emit(body=body, attributes=attributes, severity_text="INFO\ud800")
    (line,) = exporter.lines()
    json.loads(line)
    testing.parse_otlp_json(line, ExportLogsServiceRequest())
    (record,) = exporter.records()
    keys = [kv.key for kv in record.attributes]
    values = strings_in(record.body, keys)
    for kv in record.attributes:
        values.extend(strings_in(kv.value, keys))
    assert all(len(text) <= 64 for text in values)
    assert all(len(key) <= limits.MAX_NAME_LENGTH for key in keys)
    assert exporter.requests[0].resource_logs[0].scope_logs[0].scope.name == "t\\xff"


@documents("limits.md", "`OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT` for logs")
def test_each_signal_cuts_values_at_its_own_limit_else_the_generic_one():
    """Log bodies and attributes are cut at OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT, span
    values at OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT when no span limit is set."""
    memory = testing.configure_in_memory(
        {
            "OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100",
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "50",
        }
    )
    settings = memory.telemetry.settings
    otel_training.get_logger("limits").emit(body="b" * 500, attributes={"a": "a" * 500})
    with otel_training.phase("limits", value="v" * 500):
        pass
    (record,) = memory.logs.get_finished_logs()
    bounded = bounded_log_record(record, settings.log_limits).log_record
    assert len(bounded.body) == 100 and len(bounded.attributes["a"]) == 100
    (span,) = [s for s in memory.spans.get_finished_spans() if s.name == "limits"]
    assert len(bounded_span(span, settings.span_limits).attributes["value"]) == 50


# -- what the bridge keeps, and what a full queue drops -------------------------------------


def test_a_message_that_does_not_format_keeps_its_template_and_arguments(caplog):
    """log.info("%d", "x"), an argument whose __str__ raises and a dict template with a
    missing key: the record is exported with its template as the body, each argument's text
    in otel_training.log.arguments and the error; one warning says exactly that."""
    telemetry = testing.configure_in_memory()
    logger = logging.getLogger("train.formatting")
    logger.propagate = False  # pytest's capture handler would print logging's own error
    logger.setLevel(logging.INFO)
    logger.addHandler(handler := otel_training.logging_handler())

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no str")

    try:
        with caplog.at_level(logging.WARNING, logger="otel_training"):
            logger.info("%d", "x")
            logger.info("checkpoint %s of %s", Broken(), 7)
            logger.info("%(step)d at %(loss)s", {"step": 3, "lr": 0.1})
            logger.info("loss %.3f", 0.25)  # one that formats is untouched
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    typed, broken, mapping, fine = finished(telemetry)
    assert (typed.body, typed.attributes[LOG_ARGUMENTS]) == ("%d", ("x",))
    assert typed.attributes[FORMAT_ERROR].startswith("TypeError: %d format")
    assert broken.body == "checkpoint %s of %s"
    assert broken.attributes[LOG_ARGUMENTS] == ("<Broken>", "7")
    assert broken.attributes[FORMAT_ERROR] == "RuntimeError: no str"
    assert mapping.attributes[LOG_ARGUMENTS] == ("step=3", "lr=0.1")
    assert mapping.attributes[FORMAT_ERROR] == "KeyError: 'loss'"
    assert fine.body == "loss 0.250" and LOG_ARGUMENTS not in fine.attributes
    (warning,) = [r.getMessage() for r in caplog.records if "format the message" in r.getMessage()]
    assert "template as the body" in warning and LOG_ARGUMENTS in warning
    assert "dropped" not in warning


@pytest.mark.parametrize(
    "trace_flags, valid, linked",
    [(0x01, True, True), (0x00, True, False), (0x01, False, False)],
)
def test_a_log_record_links_only_to_a_sampled_span(trace_flags, valid, linked):
    """link_to_span: the ids of a valid, sampled span; else zeros and not sampled (no record
    points at a span that no backend has); None is no span."""
    from opentelemetry._logs import LogRecord
    from opentelemetry.trace import SpanContext, TraceFlags

    trace_id, span_id = (
        (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331) if valid else (0, 0)
    )
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(trace_flags))
    record = log_bridge.link_to_span(LogRecord(body="x"), context)
    expected = (trace_id, span_id, trace_flags) if linked else (0, 0, 0)
    assert (record.trace_id, record.span_id, int(record.trace_flags)) == expected
    record = log_bridge.link_to_span(LogRecord(body="x"), None)
    assert (record.trace_id, record.span_id, int(record.trace_flags)) == (0, 0, 0)
