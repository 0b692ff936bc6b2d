"""A guest in the process: in real processes, telemetry leaves every process-wide hook as the
program set it (excepthooks, signal handlers, the root logger, warnings filters, the global
random state, the OpenTelemetry globals it set first), runs after the program's atexit hooks
and never breaks its fork handlers. Signals have their own tests in ``test_signals.py``."""

from __future__ import annotations

import json
import textwrap

from otel_training.semconv.attributes import OTEL_TRAINING_SPAN_TRUNCATED

SNAPSHOT = textwrap.dedent(
    """
    import faulthandler, gc, json, locale, logging, os, random, signal, socket, sys
    import threading, warnings

    def hooks():
        root = logging.getLogger()
        found = {
            "sys.excepthook": sys.excepthook,
            "sys.unraisablehook": sys.unraisablehook,
            "sys.displayhook": sys.displayhook,
            "sys.breakpointhook": sys.breakpointhook,
            "threading.excepthook": threading.excepthook,
            "sys.gettrace": sys.gettrace(),
            "sys.getprofile": sys.getprofile(),
            "threading.gettrace": threading.gettrace(),
            "threading.getprofile": threading.getprofile(),
            "root level": root.level,
            "root handlers": list(root.handlers),
            "root filters": list(root.filters),
            "root disabled": root.disabled,
            "logging.disable": root.manager.disable,
            "logging.getLoggerClass": logging.getLoggerClass(),
            "logging.getLogRecordFactory": logging.getLogRecordFactory(),
            "logging.lastResort": logging.lastResort,
            "logging.raiseExceptions": logging.raiseExceptions,
            "logging.basicConfig": logging.basicConfig,
            "warnings.filters": list(warnings.filters),
            "warnings.showwarning": warnings.showwarning,
            "random.getstate": random.getstate(),
            "faulthandler": faulthandler.is_enabled(),
            "sys.getswitchinterval": sys.getswitchinterval(),
            "sys.getrecursionlimit": sys.getrecursionlimit(),
            "socket.getdefaulttimeout": socket.getdefaulttimeout(),
            "os.environ": dict(os.environ),
            "os.getcwd": os.getcwd(),
            "sys.path": list(sys.path),
            "sys.meta_path": list(sys.meta_path),
            "sys.path_hooks": list(sys.path_hooks),
            "std streams": (sys.stdin, sys.stdout, sys.stderr),
            "gc.callbacks": list(gc.callbacks),
            "gc": (gc.isenabled(), gc.get_threshold()),
            "threading.stack_size": threading.stack_size(),
            "locale": locale.setlocale(locale.LC_ALL),
        }
        for number in signal.valid_signals():
            if number not in (signal.SIGKILL, signal.SIGSTOP):
                found[f"signal {number}"] = signal.getsignal(number)
        return found

    # What adds warnings filters in any program that uses these libraries, done first so that
    # only telemetry's own doing is compared: importing the OpenTelemetry SDK's logs (its
    # dropped-attributes warning) and numpy (imported by nvtx; its ABI warnings), and the
    # SDK's TracerProvider.get_tracer (its InstrumentationScope deprecation, at every call).
    import importlib
    for name in ("opentelemetry.sdk._logs", "numpy", "nvtx"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    from opentelemetry.sdk.trace import TracerProvider
    TracerProvider().get_tracer("program")
    signal.signal(signal.SIGTERM, lambda signum, frame: None)   # the program's own
    random.seed(1234)
    before = hooks()
    import otel_training as ot
    ot.configure()
    meter = ot.get_meter()
    logging.getLogger("train").addHandler(ot.logging_handler())
    with ot.training_run():
        with ot.training_iteration(iteration=1):
            ot.record_training_metrics(meter, loss=1.0, step_duration_ms=5.0)
            logging.getLogger("train").warning("a record")
    ot.force_flush()
    during = hooks()
    ot.shutdown()
    after = hooks()
    print(json.dumps({
        "during": sorted(k for k in before if before[k] != during[k]),
        "after": sorted(k for k in before if before[k] != after[k]),
    }))
    """
)


def test_configure_record_and_shutdown_leave_every_process_wide_hook_alone(
    run_python, otlp_receiver
):
    """Excepthooks, trace and profile functions, every signal's handler, the root logger,
    the logging factories, warnings filters (beyond those the OpenTelemetry SDK and numpy
    add in any program), the global random state, the environment,
    sys.path and import hooks, std streams, gc and locale: the same before import, while
    telemetry records (metrics, spans, logs) and after shutdown."""
    result = run_python(SNAPSHOT, env=otlp_receiver.env("grpc"))
    assert result.returncode == 0, result.stderr[-3000:]
    changed = json.loads(result.stdout.strip().splitlines()[-1])
    assert changed == {"during": [], "after": []}
    assert {p.value for p in otlp_receiver.metrics("megatron.training.loss")} == {1.0}


ROOT_LOGGER = textwrap.dedent(
    """
    import json, logging
    import otel_training as ot
    original = logging.basicConfig
    ot.configure()                       # OTEL_PYTHON_TRAINING_LOGGING=true: the root bridge
    root = logging.getLogger()
    assert root.level == logging.WARNING, root.level
    logging.basicConfig(level=logging.INFO, format="PROGRAM %(name)s %(message)s")
    kinds = sorted(type(h).__name__ for h in root.handlers)
    logging.getLogger("train").info("configured after configure()")
    ot.configure(environ={"OTEL_PYTHON_TRAINING_LOGGING": "false"})
    print(json.dumps({
        "with the bridge": kinds,
        "level": logging.getLevelName(root.level),
        "basicConfig given back": logging.basicConfig is original,
        "without the bridge": [type(h).__name__ for h in root.handlers],
    }))
    """
)


def test_basic_config_after_configure_still_configures_the_root_logger(
    run_python, otlp_receiver, tmp_path
):
    """With the root bridge on, configure() leaves the root logger's level alone and a
    program's basicConfig() after it still sets the level and adds its handler (it does
    nothing when the root logger has one): the record is printed and exported. A configure()
    without the bridge removes it and gives basicConfig back."""
    env = {**otlp_receiver.env("grpc"), "OTEL_PYTHON_TRAINING_LOGGING": "true"}
    result = run_python(ROOT_LOGGER, env=env, cwd=tmp_path)  # its second configure's files
    assert result.returncode == 0, result.stderr[-3000:]
    assert "PROGRAM train configured after configure()" in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "with the bridge": ["StreamHandler", "_RootBridge"],
        "level": "INFO",
        "basicConfig given back": True,
        "without the bridge": ["StreamHandler"],
    }
    assert "configured after configure()" in [r.body for r in otlp_receiver.logs()]


ATEXIT = textwrap.dedent(
    """
    import atexit
    import otel_training as ot
    spans = {}

    def finish(label, **values):      # the program's last words: end a span, record a metric
        spans[label].end()
        ot.record_training_metrics(ot.get_meter(), **values)

    atexit.register(finish, "registered.before.configure", loss=-1.0)
    ot.configure()
    atexit.register(finish, "registered.after.configure", grad_norm=0.25)
    tracer = ot.get_tracer("program")
    for label in ("registered.before.configure", "registered.after.configure"):
        spans[label] = tracer.start_span(label)
    """
)


def test_atexit_hooks_registered_before_or_after_configure_run_before_the_shutdown(
    run_python, otlp_receiver
):
    """A program's atexit hook registered before configure() (after the import) and one
    registered after it both run while telemetry is still up: the spans they end and the
    values they record are exported, nothing truncated."""
    result = run_python(ATEXIT, env=otlp_receiver.env("grpc"))
    assert result.returncode == 0, result.stderr[-3000:]
    spans = {s.name: s for s in otlp_receiver.spans()}
    for label in ("registered.before.configure", "registered.after.configure"):
        assert OTEL_TRAINING_SPAN_TRUNCATED not in spans[label].attributes
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [-1.0]
    assert [p.value for p in otlp_receiver.metrics("megatron.training.grad_norm")] == [0.25]


GLOBALS = textwrap.dedent(
    """
    import json
    from opentelemetry import _logs, metrics, trace
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    import otel_training as ot

    reader = InMemoryMetricReader()
    tracer_provider, logger_provider = TracerProvider(), LoggerProvider()
    meter_provider = MeterProvider(metric_readers=[reader])
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    _logs.set_logger_provider(logger_provider)
    ot.configure()
    kept = [
        trace.get_tracer_provider() is tracer_provider,
        metrics.get_meter_provider() is meter_provider,
        _logs.get_logger_provider() is logger_provider,
    ]
    metrics.get_meter("program").create_counter("program.count").add(1)
    ot.record_training_metrics(ot.get_meter(), loss=3.0)
    names = [m.name for r in reader.get_metrics_data().resource_metrics
             for s in r.scope_metrics for m in s.metrics]
    print(json.dumps({"kept": kept, "program's reader": names}))
    """
)


def test_opentelemetry_globals_the_program_set_first_are_kept_with_one_warning_each(
    run_python, otlp_receiver
):
    """Tracer, meter and logger providers set as globals before configure() stay the
    globals, with one warning each (and not the API's own "Overriding" line); the program's
    instruments record there, otel_training's into its own pipeline."""
    result = run_python(GLOBALS, env=otlp_receiver.env("grpc"))
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"kept": [True, True, True], "program's reader": ["program.count"]}
    for kind in ("TracerProvider", "MeterProvider", "LoggerProvider"):
        assert result.stderr.count(f"the program installed its own {kind}") == 1, kind
    assert "Overriding of current" not in result.stderr
    assert [p.value for p in otlp_receiver.metrics("megatron.training.loss")] == [3.0]
    assert "program.count" not in otlp_receiver.metric_names()


FORK_HANDLERS = textwrap.dedent(
    """
    import logging, os, threading
    import otel_training as ot

    calls = []
    def program_fork_handlers(tag):
        os.register_at_fork(
            before=lambda: calls.append(f"before-{tag}"),
            after_in_parent=lambda: calls.append(f"parent-{tag}"),
            after_in_child=lambda: calls.append(f"child-{tag}"),
        )

    program_fork_handlers("1")
    ot.configure()
    program_fork_handlers("2")
    logging.basicConfig(level=logging.INFO)
    logger = logging.getLogger("train")
    logger.addHandler(ot.logging_handler())
    meter = ot.get_meter()
    stop = threading.Event()

    def busy():    # telemetry busy on another thread whenever the main thread forks
        i = 0
        while not stop.is_set():
            i += 1
            with ot.training_iteration(iteration=i):
                ot.record_training_metrics(meter, loss=float(i))
                logger.info("step %d", i)

    threading.Thread(target=busy, daemon=True).start()
    seen = set()
    for n in range(10):
        calls.clear()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:    # a worker records, spans and logs: no-ops or its own, never a hang
            os.close(read_end)
            with ot.training_iteration(iteration=0):
                ot.record_training_metrics(meter, loss=-1.0)
            logger.info("worker %d", n)
            os.write(write_end, ",".join(calls).encode())
            os._exit(0)
        os.close(write_end)
        child = os.read(read_end, 1000).decode()
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        seen.add((child, ",".join(calls), status))
    stop.set()
    print(sorted(seen))
    """
)


def test_the_programs_fork_handlers_run_in_order_and_forks_never_hang(run_python, tmp_path):
    """Fork handlers the program registers before and after configure() run in the order
    os.register_at_fork promises, in parent and child, ten forks while another thread
    records metrics, spans and logs; every child exits 0 and no handler raises."""
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "60000", "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path)}
    result = run_python(FORK_HANDLERS, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    child = "before-2,before-1,child-1,child-2"
    parent = "before-2,before-1,parent-1,parent-2"
    assert result.stdout.strip() == str([(child, parent, 0)])
    assert "Exception ignored" not in result.stderr


EXCEPTHOOKS = textwrap.dedent(
    """
    import sys, threading
    def program_hook(kind, value, traceback):
        print("program sys hook", kind.__name__, flush=True)
    sys.excepthook = program_hook                 # before configure()
    import otel_training as ot
    ot.configure()
    def program_thread_hook(args):
        print("program thread hook", args.exc_type.__name__, flush=True)
    threading.excepthook = program_thread_hook    # after configure()
    thread = threading.Thread(target=lambda: 1 / 0)
    thread.start()
    thread.join()
    with ot.training_run():
        raise RuntimeError("boom")
    """
)


def test_the_programs_excepthooks_run_and_the_exit_status_stays(run_python, otlp_receiver):
    """sys.excepthook set before configure() and threading.excepthook set after it are the
    ones that run; an uncaught exception still exits 1, its run span exported as an error."""
    result = run_python(EXCEPTHOOKS, env=otlp_receiver.env("grpc"))
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "program thread hook ZeroDivisionError",
        "program sys hook RuntimeError",
    ]
    (run,) = otlp_receiver.spans("megatron.train")
    assert run.status_code == "error"
