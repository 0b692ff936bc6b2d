"""KeyValueFormatter and LogSpanProcessor: logs as key=value lines, spans as log records."""

from __future__ import annotations

import logging
import math
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider, sampling

from otel_training.logs.formatting import KeyValueFormatter, LogSpanProcessor, format_pairs


def _record(message: str = "hello", **extra) -> logging.LogRecord:
    record = logging.makeLogRecord(
        {"name": "train", "levelname": "INFO", "levelno": 20, "msg": message, "created": 0.25}
    )
    record.__dict__.update(extra)
    return record


def test_a_record_becomes_one_line_of_key_value_pairs():
    """time, level, logger, msg, rank and extra fields, in order, as key=value."""
    line = KeyValueFormatter(rank=3).format(_record("saved checkpoint", path="/ckpt/a", step=20))
    assert line == (
        'time=1970-01-01T00:00:00.250Z level=INFO logger=train msg="saved checkpoint" rank=3 '
        "path=/ckpt/a step=20"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("", '""'),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("k=v", '"k=v"'),
        ("two\nlines", '"two\\nlines"'),
        (math.nan, "NaN"),
        (-math.inf, "-Inf"),
        (0.5, "0.5"),
        (True, "true"),
        (None, "null"),
    ],
)
def test_values_are_quoted_and_escaped_when_needed(value, text):
    """Empty values, spaces, quotes, = and newlines are quoted; NaN and Inf are named."""
    assert format_pairs([("v", value)]) == f"v={text}"


def test_a_value_whose_str_fails_does_not_raise():
    """A value that cannot be turned into text is written as its type name."""

    class Broken:
        def __str__(self):
            raise RuntimeError("no")

    assert format_pairs([("v", Broken())]) == 'v="<Broken>"'


def test_the_current_span_is_added_to_the_line():
    """Inside a span, the line names it and carries its trace and span ids."""
    tracer = TracerProvider().get_tracer("t")
    formatter = KeyValueFormatter()
    with tracer.start_as_current_span("megatron.checkpoint.save") as span:
        line = formatter.format(_record())
    context = span.get_span_context()
    assert (
        f"span=megatron.checkpoint.save trace_id={context.trace_id:032x} "
        f"span_id={context.span_id:016x}"
    ) in line
    assert "span=" not in formatter.format(_record())


def test_an_exception_is_written_as_one_quoted_field():
    """exc_info becomes an exc= field with its newlines escaped, on one line."""
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = _record(exc_info=sys.exc_info())
    line = KeyValueFormatter().format(record)
    assert "\n" not in line
    assert 'exc="Traceback' in line and "ValueError: boom" in line


def test_log_span_processor_logs_span_starts_and_ends_with_their_fields(caplog):
    """LogSpanProcessor logs span_start and span_end records with ids, duration and attributes."""
    provider = TracerProvider()
    provider.add_span_processor(LogSpanProcessor())
    tracer = provider.get_tracer("t")
    with caplog.at_level(logging.INFO, logger="otel_training.spans"):
        with tracer.start_as_current_span("megatron.evaluate", attributes={"name": "x"}) as span:
            span.set_attribute("megatron.iteration", 5)
    start, end = caplog.records
    assert (start.getMessage(), end.getMessage()) == (
        "span_start megatron.evaluate",
        "span_end megatron.evaluate",
    )
    assert end.__dict__["megatron.iteration"] == 5
    assert end.__dict__["span.name"] == "x"  # renamed: logging owns `name`
    assert end.status == "UNSET" and end.duration_ms >= 0
    assert end.span_id == f"{span.get_span_context().span_id:016x}"
    line = KeyValueFormatter().format(end)
    assert "event=span_end span=megatron.evaluate" in line
    assert line.count(" span_id=") == 1


class _RecordOnly(sampling.Sampler):
    """Records every span without sampling it (it is never exported)."""

    def should_sample(self, *args, **kwargs) -> sampling.SamplingResult:
        return sampling.SamplingResult(sampling.Decision.RECORD_ONLY)

    def get_description(self) -> str:
        return "record-only"


def test_ids_are_written_only_for_sampled_spans(caplog):
    """A span recorded but not sampled, or not recorded at all, gives no ids: they would name
    a span that no trace holds."""
    formatter = KeyValueFormatter()
    for sampler in (_RecordOnly(), sampling.ALWAYS_OFF):
        provider = TracerProvider(sampler=sampler)
        processor = LogSpanProcessor()
        provider.add_span_processor(processor)
        with caplog.at_level(logging.INFO, logger="otel_training.spans"):
            with provider.get_tracer("t").start_as_current_span("megatron.evaluate"):
                line = formatter.format(_record())
        assert "trace_id=" not in line and "span_id=" not in line
    logged = [formatter.format(r) for r in caplog.records]
    assert logged and all("trace_id=" not in line for line in logged)


def test_log_span_processor_is_exact_under_many_threads(caplog):
    """8 threads x 200 spans: exactly 1,600 starts and 1,600 ends are logged."""
    provider = TracerProvider()
    provider.add_span_processor(LogSpanProcessor())
    tracer = provider.get_tracer("t")

    def work() -> None:
        for _ in range(200):
            with tracer.start_as_current_span("megatron.evaluate"):
                pass

    with caplog.at_level(logging.INFO, logger="otel_training.spans"):
        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    events = [r.event for r in caplog.records]
    assert events.count("span_start") == events.count("span_end") == 1600
    assert len({r.span_id for r in caplog.records}) == 1600
