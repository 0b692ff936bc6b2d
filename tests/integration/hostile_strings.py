"""Hostile strings and the places they can take in what leaves the process, shared by the
string-rule tests (tests/integration/test_limits_end_to_end.py) and the child processes they
run. Not a test module."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["HOSTILE", "PLACES", "SAMPLES", "emit"]

#: Any Python string: lone surrogates (os.fsdecode of undecodable bytes), controls, quotes,
#: backslashes, characters beyond U+FFFF, and long ones (past every limit).
HOSTILE = st.one_of(
    st.lists(
        st.one_of(
            st.characters(),
            st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
            st.sampled_from(["\x00", "\n", "\u2028", '"', "\\", "\U0001f600", "\udc80"]),
        ),
        max_size=80,
    ).map("".join),
    st.sampled_from(["ckpt-\udc80", "\udcff" * 2000, "\U0001f600" * 20_000]),
)
#: Where a string leaves the process (docs/limits.md, "One rule for every string"). Metric
#: names come through a view (the SDK refuses an instrument named otherwise, and any unit
#: outside ASCII, when it is created: nothing leaves).
PLACES = (
    "tracer.name", "tracer.version", "tracer.schema_url", "tracer.attribute",
    "meter.name", "meter.version", "meter.schema_url", "meter.attribute",
    "logger.name", "logger.version", "logger.schema_url", "logger.attribute",
    "metric.name", "metric.description", "point.attribute.key", "point.attribute.value",
    "span.name", "span.attribute.key", "span.attribute.value", "event.name",
    "event.attribute", "link.attribute", "status.description",
    "resource.key", "resource.value",
    "log.body", "log.attribute.key", "log.attribute.value", "log.event_name",
)  # fmt: skip


def emit(telemetry, place: str, text: str) -> None:
    """Records of well-named tracers, meters and loggers, and one record of each signal with
    ``text`` in ``place`` (the others of that record named ``bad.*``)."""
    from opentelemetry._logs import LogRecord
    from opentelemetry.trace import Status, StatusCode

    def arg(field: str, default=None):
        return text if place == field else default

    tracers, meters, loggers = (
        telemetry.tracer_provider,
        telemetry.meter_provider,
        telemetry.logger_provider,
    )
    with tracers.get_tracer("good").start_as_current_span("good.span"):
        pass
    meters.get_meter("good").create_counter("good.count").add(1)
    loggers.get_logger("good").emit(LogRecord(body="good.log"))

    scope_attributes = {"a": arg("tracer.attribute", "ok")}
    tracer = tracers.get_tracer(
        arg("tracer.name", "bad"),
        arg("tracer.version"),
        arg("tracer.schema_url"),
        attributes=scope_attributes,
    )
    with tracer.start_as_current_span(arg("span.name", "bad.span")) as span:
        span.set_attribute(arg("span.attribute.key", "k"), arg("span.attribute.value", "v"))
        span.add_event(arg("event.name", "bad.event"), {"e": arg("event.attribute", "v")})
        span.add_link(span.get_span_context(), {"l": arg("link.attribute", "v")})
        if place == "status.description":
            span.set_status(Status(StatusCode.ERROR, text))
    meter = meters.get_meter(
        arg("meter.name", "bad"),
        arg("meter.version"),
        arg("meter.schema_url"),
        attributes={"a": arg("meter.attribute", "ok")},
    )
    counter = meter.create_counter("bad.count", description=arg("metric.description", ""))
    counter.add(1, {arg("point.attribute.key", "k"): arg("point.attribute.value", "v")})
    logger = loggers.get_logger(
        arg("logger.name", "bad"),
        arg("logger.version"),
        arg("logger.schema_url"),
        attributes={"a": arg("logger.attribute", "ok")},
    )
    logger.emit(
        LogRecord(
            body=arg("log.body", "bad.log"),
            attributes={arg("log.attribute.key", "k"): arg("log.attribute.value", "v")},
            event_name=arg("log.event_name"),
        )
    )


#: A few hostile strings for children that cannot draw them: an undecodable byte, a lone
#: high surrogate, quotes, a backslash and a newline, characters beyond U+FFFF, controls,
#: a name past 1,024 characters and a value past 16,384.
SAMPLES = (
    "ckpt-\udc80",
    "x\ud800y",
    'q"uo\\te\n',
    "\U0001f600" * 3,
    "\x00\x1b",
    "\u00e9" * 2000,
    "a" * 20_000,
)
