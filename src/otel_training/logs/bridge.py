"""The bridge from Python ``logging`` to the OpenTelemetry logs signal.

:class:`LoggingHandler` is a ``logging.Handler`` that turns each record it handles into an
OpenTelemetry log record of the configured pipeline (``OTEL_LOGS_EXPORTER``), with:

- the rank's identity: the pipeline's resource (``dl.rank``, ``dl.world_size``,
  ``service.instance.id``...), as on metrics and spans;
- inside a span that is recording and sampled (so exported), that span's trace id, span id and
  trace flags; none outside a span or in one that is not sampled, so an id always names a span
  that exists in the trace (the rule of :class:`otel_training.logs.formatting.KeyValueFormatter`);
- the body: the formatted message (``record.getMessage()``, or the handler's formatter); when
  the message cannot be formatted (``log.info("%d", "x")``, an argument whose ``__str__``
  raises), its template, with the arguments' texts in ``otel_training.log.arguments`` and the
  error in ``otel_training.log.format_error`` (one warning says so, once);
- the severity: the OpenTelemetry number of ``record.levelno`` and the text ``DEBUG``,
  ``INFO``, ``WARN``, ``ERROR``, ``FATAL`` (the SDK's mapping);
- the attributes ``code.file.path``, ``code.function.name``, ``code.line.number``, the
  ``exception.type``, ``exception.message`` and ``exception.stacktrace`` of ``exc_info``, and the
  record's ``extra=`` fields (values that are not str, bool, int, float or bytes as their
  ``str()``);
- the instrumentation scope: the logger's name.

Two ways in (``docs/logs.md``): ``logging.getLogger("train").addHandler(
otel_training.logging_handler())``, or ``OTEL_PYTHON_TRAINING_LOGGING=true``, with which
``configure()`` adds one handler to the root logger (and a later ``configure()`` without it
removes it). Both follow the configured pipeline: after a second ``configure()`` records go to
the new one; after shutdown, or on a rank that exports nothing, they cost a check and go
nowhere.

No loop back into the exporter: records of the ``opentelemetry``, ``otel_training`` and
``grpc`` loggers, records logged while an exporter runs (the SDK marks its export threads with
the suppress-instrumentation context key), and records logged while this handler itself emits
(a full queue's warning) are not bridged. They still reach the other handlers.

The handler never raises into the caller: anything that goes wrong is logged once as a warning
(to the other handlers) saying what happens instead: a message that does not format is kept as
above, a formatter that fails is skipped, a record that a filter or the translation fails on is
not exported. It runs on the logging thread: a record costs its translation and an append to the
batch processor's queue; the string rule of :mod:`otel_training.export.limits` is applied later, on
the exporter's thread.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import _logs as logs_api
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.semconv.attributes.code_attributes import (
    CODE_FILE_PATH,
    CODE_FUNCTION_NAME,
    CODE_LINE_NUMBER,
)
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import SpanContext, TraceFlags

from otel_training._log_once import LogOnce
from otel_training.export.limits import safe_text
from otel_training.semconv.attributes import (
    OTEL_TRAINING_LOG_ARGUMENTS,
    OTEL_TRAINING_LOG_FORMAT_ERROR,
)

__all__ = [
    "IGNORED_LOGGERS",
    "LoggingHandler",
    "bridge_root_logger",
    "has_handlers_besides_bridge",
    "link_to_span",
    "severity_number",
]

_logger = logging.getLogger("otel_training.logs")

#: Loggers whose records are never bridged (and their children): the SDK's and exporters'
#: own, and otel-training's, which may log while an export runs.
IGNORED_LOGGERS = ("opentelemetry", "otel_training", "grpc")

try:  # the key the SDK's batch processors attach while they export
    from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
except ImportError:  # pragma: no cover - present in every supported SDK
    _SUPPRESS_INSTRUMENTATION_KEY = "suppress_instrumentation"

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_SEVERITY_TEXT = {"WARNING": "WARN", "CRITICAL": "FATAL"}
_PRIMITIVES = (str, bool, int, float, bytes)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)

# The current pipeline's logger provider, or None when nothing is configured or it is shut
# down (given by configuration.py).
_current_provider: Callable[[], logs_api.LoggerProvider | None] = lambda: None  # noqa: E731

_emitting = threading.local()
_said = LogOnce(_logger, exc_info=True)


def bind(current_provider: Callable[[], logs_api.LoggerProvider | None]) -> None:
    """Tells the handlers where the current pipeline's logger provider is (configuration.py)."""
    global _current_provider
    _current_provider = current_provider


def severity_number(levelno: int) -> SeverityNumber:
    """The OpenTelemetry severity number of a ``logging`` level (the data model's mapping, as
    the SDK's handler makes it): DEBUG 10 -> 5, INFO 20 -> 9, WARNING 30 -> 13, ERROR 40 -> 17,
    CRITICAL 50 -> 21; the three levels above each step add 1 to 3; below 10, UNSPECIFIED;
    above 53, FATAL4. Never raises."""
    if levelno < 10:
        return SeverityNumber.UNSPECIFIED
    if levelno > 53:
        return SeverityNumber.FATAL4
    step, within = divmod(levelno, 10)
    return SeverityNumber(1 + 4 * step + min(within, 3))


def link_to_span(record: LogRecord, span_context: SpanContext | None) -> LogRecord:
    """Gives ``record`` the trace and span ids of ``span_context`` when it is a valid, sampled
    span's (one that is exported), else no ids (zeros, not sampled): a log record never points
    at a span that no backend has. Used by every log record otel-training emits (the bridge,
    the exception records of :mod:`otel_training.trace.processors.exception_logs`, the hang
    watchdog's stacks). Returns ``record``; never raises."""
    if span_context is not None and span_context.is_valid and span_context.trace_flags.sampled:
        record.trace_id = span_context.trace_id
        record.span_id = span_context.span_id
        record.trace_flags = span_context.trace_flags
    else:
        record.trace_id = 0
        record.span_id = 0
        record.trace_flags = _NOT_SAMPLED
    return record


def _ignored(name: str) -> bool:
    for prefix in IGNORED_LOGGERS:
        if name == prefix or name.startswith(prefix + "."):
            return True
    return False


def _warn_once(cause: str, consequence: str, *, exc_info: bool = True) -> None:
    """Logs that the bridge could not do ``cause`` and what happens instead, once per cause
    (to the other handlers: records of otel_training's loggers are never bridged)."""
    _said(
        cause,
        "otel-training: the logging bridge could not %s; %s. This warning is shown once.",
        cause,
        consequence,
        exc_info=exc_info,
    )


def _text(value: Any) -> str:
    """``value`` as text by the string rule, not cut (the exporter cuts it)."""
    return value if type(value) is str else safe_text(value, None)


def _format_error(record: logging.LogRecord) -> str | None:
    """What ``record.getMessage()`` raises, or None when it formats."""
    try:
        record.getMessage()
    except Exception as error:
        return _error_text(error)
    return None


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {_text(error)}"


def _arguments(args: Any) -> tuple[str, ...]:
    """A record's arguments as texts: each positional one, or a mapping's items as
    ``key=value``; one argument that is neither, alone. Never raises."""
    try:
        if isinstance(args, Mapping):
            return tuple(f"{_text(k)}={_text(v)}" for k, v in args.items())
        if isinstance(args, tuple):
            return tuple(_text(a) for a in args)
    except Exception:
        pass
    return (_text(args),)


class LoggingHandler(logging.Handler):
    """A ``logging`` handler that emits each record as an OpenTelemetry log record.

    Args:
        level: Records below this level are not bridged (``logging.NOTSET``: all that reach
            the handler).
        logger_provider: Emit on this provider; default: the configured pipeline's, followed
            across ``configure()`` calls (nothing is emitted while none is configured).

    What a record carries is in the module docstring. ``handle``/``emit`` run on the thread
    that logs, take no lock of their own and never raise.
    """

    def __init__(
        self,
        level: int = logging.NOTSET,
        *,
        logger_provider: logs_api.LoggerProvider | None = None,
    ) -> None:
        super().__init__(level)
        self._logger_provider = logger_provider
        self._provider: logs_api.LoggerProvider | None = None
        self._loggers: dict[str, logs_api.Logger] = {}

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        """Filters and emits ``record`` without the handler lock (emitting is thread-safe:
        an append to the batch processor's queue). Never raises."""
        try:
            passed = self.filter(record)
        except Exception:
            _warn_once("apply a filter", "such records are not exported")
            return False
        if isinstance(passed, logging.LogRecord):  # Python 3.12+: a filter may replace it
            record = passed
        if passed:
            self.emit(record)
        return bool(passed)

    def emit(self, record: logging.LogRecord) -> None:
        """Emits ``record`` on the pipeline's logger named after ``record.name``. Never
        raises."""
        if getattr(_emitting, "active", False):
            return
        _emitting.active = True
        try:
            self._emit(record)
        except Exception:
            _warn_once("translate a record", "such records are not exported")
        finally:
            _emitting.active = False

    def _emit(self, record: logging.LogRecord) -> None:
        if _ignored(record.name):
            return
        context = context_api.get_current()
        if context_api.get_value(_SUPPRESS_INSTRUMENTATION_KEY, context):
            return
        provider = self._logger_provider or _current_provider()
        if provider is None or isinstance(provider, logs_api.NoOpLoggerProvider):
            return
        if provider is not self._provider:
            self._loggers = {}
            self._provider = provider
        logger = self._loggers.get(record.name)
        if logger is None:
            logger = provider.get_logger(record.name)
            self._loggers[record.name] = logger
        span = trace_api.get_current_span(context)
        span_context = span.get_span_context()
        body, format_error = self._body(record)
        attributes = self._attributes(record)
        if format_error is not None:  # the message's template is the body: keep its arguments
            attributes[OTEL_TRAINING_LOG_ARGUMENTS] = _arguments(record.args)
            attributes[OTEL_TRAINING_LOG_FORMAT_ERROR] = format_error
            _warn_once(
                "format the message of a record",
                "such records are exported with their message template as the body, their "
                f"arguments in {OTEL_TRAINING_LOG_ARGUMENTS} and the error in "
                f"{OTEL_TRAINING_LOG_FORMAT_ERROR}",
            )
        log_record = LogRecord(
            timestamp=int(record.created * 1e9),
            observed_timestamp=time.time_ns(),
            context=context,
            severity_text=_SEVERITY_TEXT.get(record.levelname, record.levelname),
            severity_number=severity_number(record.levelno),
            body=body,
            attributes=attributes,
        )
        # Ids only of a span that is recorded and sampled: one that will be exported.
        logger.emit(link_to_span(log_record, span_context if span.is_recording() else None))

    def _body(self, record: logging.LogRecord) -> tuple[Any, str | None]:
        """(the body, why the message could not be formatted or None)."""
        if self.formatter is not None:
            try:
                return self.format(record), None
            except Exception:
                failed = _format_error(record)
                if failed is not None:  # the message itself: kept as its template below
                    return _text(record.msg), failed
                _warn_once(
                    "format a record with its handler's formatter",
                    "such records are exported with their message, unformatted by it",
                )
        msg = record.msg
        if not record.args and not isinstance(msg, str):
            # A non-string message (a dict, a number) is kept as a structured body.
            if msg is None or isinstance(msg, (*_PRIMITIVES, list, tuple, dict)):
                return msg, None
            return _text(msg), None
        try:
            return record.getMessage(), None
        except Exception as error:
            return _text(msg), _error_text(error)

    def _attributes(self, record: logging.LogRecord) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            CODE_FILE_PATH: record.pathname,
            CODE_FUNCTION_NAME: record.funcName,
            CODE_LINE_NUMBER: record.lineno,
        }
        for key, value in record.__dict__.items():
            if key in _RECORD_FIELDS:
                continue
            attributes[_text(key)] = value if type(value) in _PRIMITIVES else _text(value)
        if record.exc_info and record.exc_info[0] is not None:
            kind, error, tb = record.exc_info
            qualified = kind.__qualname__
            if kind.__module__ not in ("builtins", None):
                qualified = f"{kind.__module__}.{qualified}"
            attributes[EXCEPTION_TYPE] = qualified
            attributes[EXCEPTION_MESSAGE] = _text(error)
            try:
                attributes[EXCEPTION_STACKTRACE] = "".join(
                    traceback.format_exception(kind, error, tb)
                )
            except Exception:
                attributes[EXCEPTION_STACKTRACE] = f"{kind.__name__}: {_text(error)}"
        return attributes


class _RootBridge(LoggingHandler):
    """The handler ``OTEL_PYTHON_TRAINING_LOGGING=true`` puts on the root logger. When it is
    the only handler a record meets, the record also goes to ``logging.lastResort`` (stderr,
    WARNING and above), as it would without the bridge."""

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        passed = super().handle(record)
        last_resort = logging.lastResort
        try:
            if (
                last_resort is not None
                and record.levelno >= last_resort.level
                and not has_handlers_besides_bridge(logging.getLogger(record.name))
            ):
                last_resort.handle(record)
        except Exception:
            pass
        return passed


_ROOT_BRIDGE = _RootBridge()


def has_handlers_besides_bridge(logger: logging.Logger) -> bool:
    """``logger.hasHandlers()``, not counting the root logger's bridge: whether a record of
    ``logger`` reaches a handler that writes it somewhere a person reads."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(h is not _ROOT_BRIDGE for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent  # type: ignore[assignment]
    return False


def bridge_root_logger(enabled: bool) -> None:
    """Adds the bridge to the root logger (once) or removes it. ``configure()`` calls this
    with ``OTEL_PYTHON_TRAINING_LOGGING``; nothing else of the root logger (level, other
    handlers, filters) is touched. Never raises.

    While the bridge is on, ``logging.basicConfig``, ``logging.config.dictConfig`` and
    ``fileConfig`` are wrapped so that they do what they would do without it: a program's
    ``basicConfig()`` after ``configure()`` still configures the root logger (it does nothing
    when the root logger has a handler), and the bridge stays. The OpenTelemetry SDK's own
    logging setup does the same. Removing the bridge restores the functions that are still
    ours."""
    root = logging.getLogger()
    if enabled:
        if _ROOT_BRIDGE not in root.handlers:
            root.addHandler(_ROOT_BRIDGE)
        _wrap_config_functions()
    else:
        if _ROOT_BRIDGE in root.handlers:
            root.removeHandler(_ROOT_BRIDGE)
        _unwrap_config_functions()


# (module, name) -> (the function we wrapped, our wrapper)
_wrapped_config: dict[tuple[Any, str], tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _config_functions() -> list[tuple[Any, str]]:
    import logging.config

    config = logging.config
    return [(logging, "basicConfig"), (config, "dictConfig"), (config, "fileConfig")]


def _wrap_config_functions() -> None:
    try:
        for module, name in _config_functions():
            current = getattr(module, name)
            if (module, name) in _wrapped_config and _wrapped_config[module, name][1] is current:
                continue
            wrapper = _without_bridge(current)
            _wrapped_config[module, name] = (current, wrapper)
            setattr(module, name, wrapper)
    except Exception:
        _warn_once("keep logging.basicConfig working beside the root bridge")


def _unwrap_config_functions() -> None:
    for (module, name), (original, wrapper) in list(_wrapped_config.items()):
        if getattr(module, name, None) is wrapper:  # not wrapped again since: give it back
            setattr(module, name, original)
            del _wrapped_config[module, name]


def _without_bridge(config_function: Callable[..., Any]) -> Callable[..., Any]:
    """``config_function`` run with the root bridge taken off the root logger, then put back
    (last) if it was there."""

    @functools.wraps(config_function)
    def configure_logging(*args: Any, **kwargs: Any) -> Any:
        root = logging.getLogger()
        bridged = _ROOT_BRIDGE in root.handlers
        if bridged:
            root.removeHandler(_ROOT_BRIDGE)
        try:
            return config_function(*args, **kwargs)
        finally:
            if bridged and _ROOT_BRIDGE not in root.handlers:
                root.addHandler(_ROOT_BRIDGE)

    return configure_logging
