"""An exception that ends a phase, as the phases record it on a span.

What counts as an error: every exception but ``GeneratorExit`` (a generator closed while inside
a phase) and ``SystemExit`` with code 0 or ``None`` (a program that chose to end normally);
``KeyboardInterrupt`` and ``SystemExit(1)`` are errors. Whatever it is, a phase that an
exception leaves did not complete (:mod:`otel_training.phases._phase`).

On the span: status ERROR with ``{type name}: {message}``, ``error.type`` (the qualified type
name), and an ``exception`` event with ``exception.type``, ``exception.message``,
``exception.stacktrace`` (the chain included) and ``exception.escaped``, as the OpenTelemetry
semantic conventions name them.
"""

from __future__ import annotations

import traceback

from opentelemetry import trace as trace_api
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import Status, StatusCode

from otel_training import clock

__all__ = ["is_error", "record_exception"]


def is_error(exception: BaseException) -> bool:
    """Whether ``exception`` makes the span of the phase it leaves an error."""
    if isinstance(exception, GeneratorExit):
        return False
    if isinstance(exception, SystemExit):
        return exception.code not in (0, None)
    return True


def record_exception(span: trace_api.Span, exception: BaseException) -> None:
    """Sets status ERROR and ``error.type`` on ``span`` and adds the ``exception`` event, dated
    on the process clock. Raises what the span raises (the caller guards)."""
    kind = type(exception)
    qualified = kind.__qualname__
    if kind.__module__ not in ("builtins", None):
        qualified = f"{kind.__module__}.{qualified}"
    message = exception_message(exception)
    # Status and type first: whatever happens to the event, the span is an error.
    span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {message}"))
    span.set_attribute(ERROR_TYPE, qualified)
    span.add_event(
        "exception",
        {
            EXCEPTION_TYPE: qualified,
            EXCEPTION_MESSAGE: message,
            EXCEPTION_STACKTRACE: stack_trace(exception),
            EXCEPTION_ESCAPED: True,
        },
        timestamp=clock.now_ns(),
    )


def exception_message(exception: BaseException) -> str:
    """``str(exception)``, or what says it could not be had: an exception whose ``__str__``
    raises (wrappers of CUDA or NCCL errors, lazy messages) is still recorded as itself."""
    try:
        message = str(exception)
        return message if type(message) is str else str.__str__(message)
    except Exception as error:
        return f"<str() of {type(exception).__name__} failed: {type(error).__name__}>"


def stack_trace(exception: BaseException) -> str:
    """The formatted traceback with its chain (``raise ... from ...``); never raises."""
    try:
        return "".join(
            traceback.format_exception(type(exception), exception, exception.__traceback__)
        )
    except Exception:
        return f"{type(exception).__name__}: {exception_message(exception)}"
