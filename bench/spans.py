"""Per-iteration cost of a ``training_iteration`` span, side by side with its peers.

Prints, from one run, the cost per iteration of an empty ``with`` block of:

- ``otel_training``: ``with training_iteration(iteration=i):`` with the span groups at
  ``per_step``, the NVTX processor (when a tool is attached), the JSON lines processor and a
  ``BatchSpanProcessor`` exporting to a no-op exporter: what ``configure()`` installs;
- ``bare_sdk``: ``tracer.start_as_current_span("megatron.train.iteration", attributes=...)``
  with the same attributes (``megatron.iteration``, ``is_goodput_span``) on a plain SDK
  ``TracerProvider`` with a ``BatchSpanProcessor`` to the same no-op exporter;
- ``aidot``: aidot-training-telemetry 1.1.2's ``timed_span(SpanName.ITERATION)`` (its README's
  ``training_iteration()`` no longer exists) with its file, logger (its default: formatted
  lines on stdout, which goes to a file here as in a batch job), NVTX and OTLP traces
  (no-op exporter) backends on, each with its default settings. It runs in its own environment
  (``build/bench-aidot-venv``, created with ``python -m venv`` and ``pip install`` when
  missing), apart from ours, in a subprocess that also times ``bare_sdk`` there.

- ``with_log_lines``: ours with a ``LogSpanProcessor`` writing a key=value line per span to a
  file, the sink aidot's logger backend adds (like for like with ``aidot``);
- ``nvtx_only``: ``with layer("forward"):`` in a group mirrored to NVTX only (a push/pop range,
  no span), inside an open ``training_iteration`` and ``forward_backward``, where a layer runs
  (``nvtx_only_outside``: the same outside any step, where it is a transition of the ledger),
  against ``bare_nvtx``: ``nvtx.start_range``/``nvtx.end_range`` in the same domain;
- ``disabled_ledger``: ``with microbatch("forward"):`` in a disabled group: no span, no range,
  but a phase of the health ledger (its time and failure still counted), inside an open step
  as above (``disabled_ledger_outside``: outside any step);
  ``disabled_noop``: ``with activation_offload("offload"):`` in a disabled group that is no
  phase of the ledger (the shared no-op); ``ledger_alone``: the ledger's own
  ``LEDGER.enter``/``LEDGER.exit`` of that phase outside a step, a transition;
- ``ledger_recorded``: the same with its hot state in a progress record file (a shared
  mapping, ``docs/health.md`` "The progress record"), as ``configure()`` keeps it;
- ``ledger``: the health ledger's own cost per phase transition (``docs/health.md``): a step of
  ``Ledger.enter``/``exit`` for the iteration and its data loading, forward/backward and
  optimizer (8 transitions), per transition; every phase pays it, whatever its span group;
- ``json_writer``: the span JSON lines writer's own work per span, on its thread: an ended
  ``training_iteration`` span of the pipeline formatted as its line and written to a file, as
  the writer does a batch (a figure, no target: part of ``otel_training``);
- ``floor``: what a transition cannot go below in Python (the issue's floor): a call of a
  Python function that reads ``time.perf_counter()`` and stores it in a list;

and the targets (issue 27), judged on CPU time by ``bench/_verdict.py``: otel_training/bare_sdk
<= 1.3, otel_training/aidot and with_log_lines/aidot <= 0.1, nvtx_only/bare_nvtx <= 1.5 (with a
tool attached only: without one both are near no-ops), disabled_ledger/disabled_noop <= 1.64
(the issue's 1.0 us where the shared no-op took 0.61 us: a ratio holds on a slower or busier
machine), ledger_recorded/floor <= 1.5 per transition (the issue's 0.15 us, 1.5 times its
floor). The exit status is 1 when one is missed (both passes
with ``--nvtx-injection``), 3 when a figure is too noisy to judge.
Rounds alternate between the variants so that drift hits all alike, and each round ends with a
flush of the variant's own processors inside the timed region, so that background work (the
JSON writer, the batch exporter) is paid by the variant that caused it. Each round is timed
in wall time and in CPU time of the whole process (all its threads), which other processes on
a busy machine disturb less. Figures are medians over rounds; ratios are medians of the
per-round ratios.

NVTX mode: without a tool attached, the ``nvtx`` package hands out a dummy domain and NVTX calls
are near no-ops (our processor is then not installed at all). ``--nvtx-injection LIB`` runs the
whole benchmark again in a subprocess with ``NVTX_INJECTION64_PATH=LIB`` (for example the
recorder of ``tests/nvtx_injection/recorder.c``, built with
``gcc -shared -fPIC -O2 -o /tmp/librecorder.so tests/nvtx_injection/recorder.c``), so that both
libraries make real NVTX calls. The recorder runs as a profiler does
(``NVTX_RECORDER_MODE=buffer``: every call kept in memory with a timestamp, as Nsight Systems
keeps events while the process runs); ``--nvtx-tool-writes`` makes it write and flush a JSON
line per call instead (the tests' mode, about 1.5 us a call of its own).

Usage: python bench/spans.py [--iterations N] [--rounds R] [--quick] [--nvtx-injection LIB
[--nvtx-tool-writes]] [--no-aidot]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _verdict

ROOT = Path(__file__).resolve().parent.parent
#: The disabled-group target of issue 27, 1.0 us where the shared no-op took 0.61 us, as a ratio.
DISABLED_PER_NOOP = round(1.0 / 0.61, 2)
AIDOT_VENV = ROOT / "build" / "bench-aidot-venv"
AIDOT_REQUIREMENT = "aidot-training-telemetry==1.1.2"

# Runs in aidot's environment as a worker: for each line "aidot N" or "bare N" on stdin, runs N
# iterations and prints the cost per iteration in microseconds.
_AIDOT_SCRIPT = r"""
import json, logging, sys, time, tempfile, os
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

class NoOpExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

import training_telemetry.provider as provider_module
provider_module.OTLPSpanExporterGrpc = lambda endpoint=None: NoOpExporter()
from training_telemetry import (
    FileBackendConfig, LoggerBackendConfig, NVTXBackendConfig, OTLPTracesBackendConfig,
    Provider, SpanName, TelemetryConfig,
)
from training_telemetry.context import timed_span

iterations, directory, results = int(sys.argv[1]), sys.argv[2], os.fdopen(int(sys.argv[3]), "w")
config = TelemetryConfig(
    backends=[
        LoggerBackendConfig(),
        FileBackendConfig(output_file_path=os.path.join(directory, "aidot-file")),
        NVTXBackendConfig(),
        OTLPTracesBackendConfig(exporter="grpc", endpoint="http://127.0.0.1:9"),
    ],
    log_level=logging.WARNING,
)
Provider.set_provider(config)  # its logger backend logs to stdout: a file here, as in a job

sdk = TracerProvider()
sdk.add_span_processor(BatchSpanProcessor(NoOpExporter(), max_queue_size=max(2048, iterations)))
tracer = sdk.get_tracer("bench")

def flush_aidot():
    for backend in Provider.instance().recorder._backends:
        provider = getattr(backend, "_provider", None)
        if provider is not None:
            provider.force_flush()

def aidot(n):
    start, cpu = time.perf_counter_ns(), time.process_time_ns()
    for _ in range(n):
        with timed_span(SpanName.ITERATION):
            pass
    flush_aidot()
    return [(time.perf_counter_ns() - start) / n / 1e3, (time.process_time_ns() - cpu) / n / 1e3]

def bare(n):
    start, cpu = time.perf_counter_ns(), time.process_time_ns()
    for i in range(n):
        with tracer.start_as_current_span(
            "megatron.train.iteration", attributes={"megatron.iteration": i}
        ):
            pass
    sdk.force_flush()
    return [(time.perf_counter_ns() - start) / n / 1e3, (time.process_time_ns() - cpu) / n / 1e3]

aidot(max(10, iterations // 10)); bare(max(10, iterations // 10))
print("ready", file=results, flush=True)
for command in sys.stdin:
    n = int(command.split()[1])
    value = aidot(n) if command.startswith("aidot") else bare(n)
    print(json.dumps(value), file=results, flush=True)
"""


def ensure_aidot_venv() -> Path | None:
    """The Python of aidot's benchmark environment, created on first use; None if it fails."""
    python = AIDOT_VENV / "bin" / "python"
    marker = AIDOT_VENV / ".installed"
    if marker.exists():
        return python
    print(f"creating {AIDOT_VENV} with {AIDOT_REQUIREMENT} (once) ...", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(AIDOT_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", AIDOT_REQUIREMENT], check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"cannot set up aidot-training-telemetry: {error}", file=sys.stderr)
        return None
    marker.touch()
    return python


class AidotWorker:
    """aidot-training-telemetry in its own environment, one round per request."""

    def __init__(self, python: Path, iterations: int, directory: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        read_fd, write_fd = os.pipe()
        self._log = open(os.path.join(directory, "aidot-stdout.log"), "w")  # noqa: SIM115
        self._process = subprocess.Popen(
            [str(python), "-c", _AIDOT_SCRIPT, str(iterations), directory, str(write_fd)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            text=True,
            env=env,
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        self._results = os.fdopen(read_fd)
        if self._results.readline().strip() != "ready":
            raise RuntimeError("the aidot worker did not start (see its stderr above)")

    def round(self, what: str, iterations: int) -> tuple[float, float]:
        self._process.stdin.write(f"{what} {iterations}\n")
        self._process.stdin.flush()
        wall, cpu = json.loads(self._results.readline())
        return wall, cpu

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(30)
        self._results.close()
        self._log.close()


def _per_iteration(start_ns: int, cpu_ns: int, n: int) -> tuple[float, float]:
    """Wall and CPU (all threads of the process) microseconds per iteration since the marks."""
    return (time.perf_counter_ns() - start_ns) / n / 1e3, (
        time.process_time_ns() - cpu_ns
    ) / n / 1e3


def measure(iterations: int, rounds: int, directory: str, with_aidot: bool) -> dict:
    """Per-round costs (us per iteration) of each variant, the rounds interleaved."""
    import logging

    # Room for a whole round in every batch processor: a span dropped on a full queue costs
    # less than one exported, which would favour whichever variant dropped more.
    queue = max(2048, iterations)

    import nvtx
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import otel_training
    from otel_training.logs.formatting import KeyValueFormatter, LogSpanProcessor

    class NoOpExporter(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    # aidot's logger backend formats a line per span; ours writes them only with a
    # LogSpanProcessor, enabled for the "with log lines" rounds (like for like) and off else.
    span_log = logging.getLogger("bench.spans")
    span_log.propagate = False
    handler = logging.FileHandler(os.path.join(directory, "ours-log-lines.log"))
    handler.setFormatter(KeyValueFormatter())
    span_log.addHandler(handler)
    span_log.setLevel(logging.CRITICAL)
    telemetry = otel_training.configure(
        environ={
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step,layer",
            "OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS": "layer",
            "OTEL_PYTHON_TRAINING_JSONLOG_DIR": directory,
            "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
        },
        span_processors=[
            LogSpanProcessor(span_log, starts=False),
            BatchSpanProcessor(NoOpExporter(), max_queue_size=queue),
        ],
        set_global=False,
    )
    sdk = TracerProvider()
    sdk.add_span_processor(BatchSpanProcessor(NoOpExporter(), max_queue_size=queue))
    tracer = sdk.get_tracer("bench")
    training_iteration = otel_training.training_iteration
    layer = otel_training.layer
    microbatch = otel_training.microbatch
    activation_offload = otel_training.activation_offload
    from otel_training.health import ledger as health_ledger
    from otel_training.health.ledger import FORWARD_BACKWARD, LEDGER

    own_ledger = health_ledger.Ledger()
    recorded_ledger = health_ledger.Ledger()  # its hot state in a progress record file
    record_dir = tempfile.mkdtemp(prefix="otel-training-bench-record-")
    recorded_ledger.record_to(os.path.join(record_dir, "ledger-rank0-bench.bin"), {})
    DATA, FB, OPT, ITERATION = (
        health_ledger.DATA_LOADING,
        health_ledger.FORWARD_BACKWARD,
        health_ledger.OPTIMIZER,
        health_ledger.ITERATION,
    )

    def ours(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for i in range(n):
            with training_iteration(iteration=i):
                pass
        telemetry.force_flush()  # the background work of these spans counts too
        return _per_iteration(start, cpu, n)

    def ours_logged(n: int) -> tuple[float, float]:
        span_log.setLevel(logging.INFO)
        try:
            return ours(n)
        finally:
            span_log.setLevel(logging.CRITICAL)
            handler.flush()

    def nvtx_only(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(n):
            with layer("forward", layer_number=1):
                pass
        return _per_iteration(start, cpu, n)

    def bare_nvtx(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(n):
            rid = nvtx.start_range(message="megatron.layer.forward", domain="otel_training")
            nvtx.end_range(rid)
        return _per_iteration(start, cpu, n)

    def disabled_ledger(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(n):
            with microbatch("forward"):  # group microbatch: off
                pass
        return _per_iteration(start, cpu, n)

    forward_backward = otel_training.forward_backward
    steps = iter(range(10**9, 2 * 10**9))

    def in_a_step(variant):
        """``variant`` run inside an open iteration and forward/backward (their own spans,
        opened and closed outside the timed loop)."""

        def run(n: int) -> tuple[float, float]:
            step = next(steps)
            with training_iteration(iteration=step), forward_backward(iteration=step):
                return variant(n)

        return run

    from otel_training.trace.processors.jsonlog import JsonLogSpanProcessor

    with training_iteration(iteration=1) as made:
        pass
    ended = made.span
    writer = JsonLogSpanProcessor(os.path.join(directory, "writer-alone.jsonl"))
    line, end = writer._line, (1, ended)  # (_END, span): a span_end record

    def json_writer(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(0, n, 1024):
            writer._write("".join([line(end) for _ in range(min(1024, n))]))
        return _per_iteration(start, cpu, n)

    box = [0.0]
    perf = time.perf_counter

    def transition() -> None:
        box[0] = perf()

    def floor(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(n):
            transition()
            transition()
        wall, cpu_us = _per_iteration(start, cpu, n)
        return wall / 2, cpu_us / 2  # per call

    def disabled_noop(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(n):
            with activation_offload("offload"):  # group activation_offload: off
                pass
        return _per_iteration(start, cpu, n)

    def ledger_alone(n: int) -> tuple[float, float]:
        enter, leave = LEDGER.enter, LEDGER.exit
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for _ in range(n):
            leave(enter(FORWARD_BACKWARD), FORWARD_BACKWARD)
        return _per_iteration(start, cpu, n)

    def ledger(n: int, of: health_ledger.Ledger = own_ledger) -> tuple[float, float]:
        enter, leave = of.enter, of.exit
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for i in range(n):
            step = enter(ITERATION)
            token = enter(DATA)
            leave(token, DATA)
            token = enter(FB)
            leave(token, FB)
            token = enter(OPT)
            leave(token, OPT)
            leave(step, ITERATION, i)
        wall, cpu_us = _per_iteration(start, cpu, n)
        return wall / 8, cpu_us / 8  # per transition

    def bare(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter_ns(), time.process_time_ns()
        for i in range(n):
            with tracer.start_as_current_span(  # the attributes ours carries (Megatron-LM's)
                "megatron.train.iteration",
                attributes={"megatron.iteration": i, "is_goodput_span": True},
            ):
                pass
        sdk.force_flush()
        return _per_iteration(start, cpu, n)

    aidot = None
    if with_aidot:
        python = ensure_aidot_venv()
        if python is not None:
            aidot = AidotWorker(python, iterations, directory)
    variants = {
        "otel_training": ours,
        "bare_sdk": bare,
        "with_log_lines": ours_logged,
        "nvtx_only": in_a_step(nvtx_only),
        "nvtx_only_outside": nvtx_only,
        "bare_nvtx": bare_nvtx,
        "disabled_ledger": in_a_step(disabled_ledger),
        "disabled_ledger_outside": disabled_ledger,
        "disabled_noop": disabled_noop,
        "ledger_alone": ledger_alone,
        "ledger": ledger,
        "ledger_recorded": lambda n: ledger(n, recorded_ledger),
        "json_writer": json_writer,
        "floor": floor,
    }
    for run in variants.values():
        run(max(10, iterations // 10))
    result: dict = {"destination": telemetry.destination, **{key: [] for key in variants}}
    if aidot is not None:
        result.update(aidot=[], aidot_bare_sdk=[])
    for _ in range(rounds):
        for key, run in variants.items():
            result[key].append(run(iterations))
        if aidot is not None:
            result["aidot"].append(aidot.round("aidot", iterations))
            result["aidot_bare_sdk"].append(aidot.round("bare", iterations))
    if aidot is not None:
        aidot.close()
    writer.shutdown()
    telemetry.shutdown()
    sdk.shutdown()
    return result


def nvtx_mode() -> str:
    if os.environ.get("NVTX_INJECTION64_PATH"):
        how = os.environ.get("NVTX_RECORDER_MODE") or "a JSON line written per call"
        return f"NVTX tool attached ({os.environ['NVTX_INJECTION64_PATH']}, mode: {how})"
    return "no NVTX tool attached (NVTX calls are no-ops; our NVTX processor is not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(
        __doc__,
        "about 1 min without aidot, 2 min with it on 2 cores; twice that with --nvtx-injection "
        "(a second pass with the tool attached); --quick: about 10 s a pass",
    )
    parser.add_argument("--iterations", type=int, default=20_000, help="iterations per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--quick", action="store_true", help="2,000 iterations, 3 rounds, no aidot (a smoke run)"
    )
    parser.add_argument("--nvtx-injection", help="also run with this NVTX injection library")
    parser.add_argument("--no-aidot", action="store_true", help="skip aidot-training-telemetry")
    parser.add_argument(
        "--nvtx-tool-writes",
        action="store_true",
        help="with --nvtx-injection: the recorder writes a line per call (not in memory)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.rounds, args.no_aidot = 2_000, 3, True

    with tempfile.TemporaryDirectory() as directory:
        result = measure(args.iterations, args.rounds, directory, not args.no_aidot)

    def median(key: str, which: int) -> float:
        return statistics.median(r[which] for r in result[key])

    def paired(a: str, b: str) -> dict[str, list[float]]:
        return {
            clock: _verdict.ratios([r[i] for r in result[a]], [r[i] for r in result[b]])
            for i, clock in enumerate(("wall", "cpu"))
        }

    rows = [
        ("otel_training", "training_iteration"),
        ("with_log_lines", "+ a log line a span (aidot's)"),
        ("bare_sdk", "span + BSP"),
        ("nvtx_only", "layer(), NVTX-only, in a step"),
        ("nvtx_only_outside", "the same, outside a step"),
        ("bare_nvtx", "nvtx.start_range/end_range"),
        ("disabled_ledger", "microbatch(), off, in a step"),
        ("disabled_ledger_outside", "the same, outside a step"),
        ("disabled_noop", "activation_offload(), off"),
        ("ledger_alone", "LEDGER.enter + exit"),
        ("ledger", "health ledger, a transition"),
        ("ledger_recorded", "the same, record in a file"),
        ("json_writer", "its JSON line, formatted, written"),
        ("floor", "a call: perf_counter, a store"),
    ]
    if "aidot" in result:
        rows += [("aidot", "timed_span(ITERATION)"), ("aidot_bare_sdk", "span + BSP, aidot's venv")]
    tool = bool(os.environ.get("NVTX_INJECTION64_PATH"))
    print(f"NVTX mode: {nvtx_mode()}")
    print(f"otel_training pipeline: {result['destination']} + BatchSpanProcessor(no-op exporter)")
    print(f"{args.iterations} iterations per round, {args.rounds} rounds interleaved (medians)")
    print(f"load: {_verdict.machine_load()}")
    print(f"  {'variant':23s} {'':30s} {'wall us/it':>10s} {'CPU us/it':>10s}")
    for key, label in rows:
        print(f"  {key:23s} {label:30s} {median(key, 0):10.2f} {median(key, 1):10.2f}")
    print(
        f"Disabled-group phase: {median('disabled_ledger', 0) - median('disabled_noop', 0):.2f}"
        f" us more than the shared no-op ({median('disabled_noop', 0):.2f} us); the ledger "
        f"alone {median('ledger_alone', 0):.2f} us"
    )
    print(
        "figures: medians of rounds, ratios medians of the per-round ratios; CPU time counts "
        "every thread of the process; targets judged on CPU time"
    )
    verdict = _verdict.Verdict("bench-spans" + (" (NVTX tool attached)" if tool else ""))
    verdict.at_most("otel_training / bare_sdk", 1.3, unit="x", judge="cpu", **paired(
        "otel_training", "bare_sdk"))  # fmt: skip
    if "aidot" in result:
        verdict.at_most("otel_training / aidot", 0.1, unit="x", judge="cpu", **paired(
            "otel_training", "aidot"))  # fmt: skip
        verdict.at_most("with_log_lines / aidot", 0.1, unit="x", judge="cpu", **paired(
            "with_log_lines", "aidot"))  # fmt: skip
    if tool:
        verdict.at_most("NVTX-only phase / bare NVTX range", 1.5, unit="x", judge="cpu",
                        **paired("nvtx_only", "bare_nvtx"))  # fmt: skip
    else:
        ratio = median("nvtx_only", 1) / median("bare_nvtx", 1)
        print(f"NVTX-only phase / bare range: {ratio:.2f}x CPU (judged with a tool attached only)")
    verdict.at_most("disabled-group phase / shared no-op", DISABLED_PER_NOOP, unit="x",
                    judge="cpu", **paired("disabled_ledger", "disabled_noop"))  # fmt: skip
    verdict.at_most("ledger transition (record in a file) / floor", 1.5, unit="x", judge="cpu",
                    **paired("ledger_recorded", "floor"))  # fmt: skip
    status = verdict.exit_status()
    if args.nvtx_injection and not tool:
        env = dict(os.environ)
        env["NVTX_INJECTION64_PATH"] = os.path.abspath(args.nvtx_injection)
        env.setdefault("NVTX_RECORDER_OUTPUT", os.devnull)
        if not args.nvtx_tool_writes:
            env.setdefault("NVTX_RECORDER_MODE", "buffer")
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("--nvtx-")]
        if args.nvtx_injection in rest:
            rest.remove(args.nvtx_injection)
        print()
        sys.stdout.flush()
        second = subprocess.run([sys.executable, __file__, *rest], env=env, check=False)
        status = _verdict.worst(status, second.returncode)
    return status


if __name__ == "__main__":
    sys.exit(main())
