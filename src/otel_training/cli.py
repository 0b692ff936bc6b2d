"""The ``otel-training`` command.

Subcommands:

- ``demo``: train a small GPT-style model on the Python standard library's sources and emit the
  Megatron-LM training metrics through OpenTelemetry, configured from the ``OTEL_*`` environment
  variables (with none set, OTLP-JSON files in a local directory). Needs the ``torch`` extra.
  ``otel-training demo --help`` lists its flags. Under ``torchrun --nproc_per_node=N`` it trains
  data-parallel (gloo on CPU, NCCL on CUDA); rank 0 prints.
- ``report [DIR] [--output report.html]``: one self-contained HTML report (plots, summary,
  timeline) of a run of the embedded default's files. Needs the ``report`` extra (plotly).
- ``trace [DIR] [--output trace.json]``: the spans of all ranks of a run as one Chrome
  trace-event file for Perfetto UI or ``chrome://tracing``.
- ``health [DIR] [--json]``: goodput and badput over all attempts of the job, a hang and its
  culprits, stragglers (``docs/health.md``); a terminal summary, or with ``--json`` one JSON
  document. Works on a job that is still running or hung.

``DIR`` is a run directory, or an output directory whose ``latest`` link or newest
subdirectory is taken; by default ``OTEL_PYTHON_TRAINING_OUTPUT_DIR``. Both show every attempt
of that run's job (``dl.job.id``), each on its own and in order. Neither needs torch.

Also runnable as ``python -m otel_training.cli``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Sequence

__all__ = ["main"]

_PROG = "otel-training"
_TORCH_HINT = (
    "otel-training demo needs PyTorch, tqdm and numpy: pip install -e '.[torch]' in the "
    "otel-training checkout (install the torch build that fits your machine first)"
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("otel-training")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="OpenTelemetry-native telemetry for model training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # The demo's own flags are parsed after torch is imported (their defaults live in
    # otel_training.demo.train.DemoConfig); here they pass through unparsed.
    commands.add_parser(
        "demo",
        help="train a small GPT on the stdlib's sources and emit training telemetry "
        "(see 'demo --help')",
        add_help=False,
    )
    where = (
        "a run directory, or an output directory (its 'latest' link or newest run is taken); "
        "every attempt of that run's job is shown; "
        "default: $OTEL_PYTHON_TRAINING_OUTPUT_DIR or ./otel-training-telemetry"
    )
    report = commands.add_parser(
        "report",
        help="write a self-contained HTML report (plots, summary, timeline) of a run",
        description="Write one self-contained HTML file (opens offline) of a run's files.",
    )
    report.add_argument("directory", nargs="?", metavar="DIR", help=where)
    report.add_argument(
        "--output", "-o", default="report.html", help="the HTML file to write (%(default)s)"
    )
    trace = commands.add_parser(
        "trace",
        help="write the spans of all ranks as a Chrome trace-event file (Perfetto)",
        description="Write the spans of all ranks of a run as one Chrome trace-event JSON file.",
    )
    trace.add_argument("directory", nargs="?", metavar="DIR", help=where)
    trace.add_argument(
        "--output", "-o", default="trace.json", help="the JSON file to write (%(default)s)"
    )
    health = commands.add_parser(
        "health",
        help="goodput, hangs and stragglers of a job, over all of its attempts",
        description="Goodput and badput of a job over all of its attempts (the run directories "
        "of one dl.job.id), a hang and its culprits, stragglers with their cause; from the "
        "embedded default's files, also while the job runs (docs/health.md). Thresholds: "
        "OTEL_PYTHON_TRAINING_HANG_FLOOR_S, OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S, "
        "OTEL_PYTHON_TRAINING_HANG_STARTUP_S, OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS.",
    )
    health.add_argument(
        "directory",
        nargs="?",
        metavar="DIR",
        help="any run directory of the job, or the output directory (its 'latest' link or "
        "newest run is taken); default: $OTEL_PYTHON_TRAINING_OUTPUT_DIR or "
        "./otel-training-telemetry",
    )
    health.add_argument(
        "--json", action="store_true", help="print one JSON document instead of a summary"
    )
    return parser


def _load(command: str, directory: str | None):
    """The job for ``report``/``trace`` (every attempt of the run found), or an exit status
    after a one-line message."""
    from otel_training.report import RunNotFoundError, find_run_directory, load_job

    try:
        run_directory = find_run_directory(directory)
    except RunNotFoundError as error:
        hint = "" if directory else " (pass DIR or set OTEL_PYTHON_TRAINING_OUTPUT_DIR)"
        print(f"{_PROG} {command}: error: no run found: {error}{hint}", file=sys.stderr)
        return None, 2
    job = load_job(run_directory, purpose=command)  # each file read once
    for note in job.notes:
        print(_terminal(f"{_PROG} {command}: note: {note}"), file=sys.stderr)
    several = len(job.runs) > 1
    for label, run in zip(job.labels, job.runs):
        for note in run.notes:
            where = f"{label}: " if several else ""
            print(_terminal(f"{_PROG} {command}: note: {where}{note}"), file=sys.stderr)
    return job, 0


#: Characters a terminal acts on rather than shows: C0 and C1 controls but the line feed (an
#: escape sequence sets the window title or the colours), and bidirectional overrides.
_TERMINAL_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: Characters of one line kept of a note (the report shows the notes too).
_NOTE_CHARACTERS = 1_000


def _terminal(text: str, limit: int | None = _NOTE_CHARACTERS) -> str:
    """``text`` as a terminal shows it and nothing else: lone surrogates (an undecodable byte
    of a directory name) and the characters a terminal would act on as backslash escapes,
    cut to ``limit`` characters (names from the files can be 10,000 long)."""
    from otel_training.export.limits import safe_text
    from otel_training.report.wording import cut

    text = _TERMINAL_CONTROLS.sub(lambda m: ascii(m.group())[1:-1], safe_text(text, None))
    return text if limit is None else cut(text, limit)


def _say(text: str) -> None:
    """Prints ``text`` to stdout as :func:`_terminal` makes it, every line whole."""
    print("\n".join(_terminal(line, None) for line in text.split("\n")), flush=True)


def _what(job) -> str:
    """``run ID`` for one run, ``job ID, N attempts`` for several: the start of a sentence."""
    latest = job.latest
    if len(job.runs) == 1:
        return f"run {latest.run_id or latest.directory.name}"
    return f"job {job.job_id or latest.run_id}, {len(job.runs)} attempts"


def _run_report(directory: str | None, output: str) -> int:
    from otel_training.report import write_report

    job, status = _load("report", directory)
    if job is None:
        return status
    try:
        path = write_report(job, output)
    except ModuleNotFoundError as error:
        print(f"{_PROG} report: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"{_PROG} report: error: cannot write {output}: {error}", file=sys.stderr)
        return 1
    ranks = len(job.latest.ranks)
    last = "" if len(job.runs) == 1 else ", the last"
    _say(
        f"report of {_what(job)}{last} with {ranks} rank{'s' if ranks != 1 else ''} in "
        f"{job.latest.directory}: {path}\n"
        f"open it in a browser: {path.as_uri()}"
    )
    return 0


def _run_trace(directory: str | None, output: str) -> int:
    from otel_training.report import write_chrome_trace

    job, status = _load("trace", directory)
    if job is None:
        return status
    try:
        path = write_chrome_trace(job, output)
    except OSError as error:
        print(f"{_PROG} trace: error: cannot write {output}: {error}", file=sys.stderr)
        return 1
    spans = sum(len(run.spans) for run in job.runs)
    ranks = len({s.rank for run in job.runs for s in run.spans})
    _say(
        f"trace of {_what(job)}, {spans:,} spans of {ranks} "
        f"rank{'s' if ranks != 1 else ''}: {path}\n"
        "open it at https://ui.perfetto.dev ('Open trace file') or in chrome://tracing ('Load')"
    )
    return 0


def _run_health(directory: str | None, as_json: bool) -> int:
    import json

    from otel_training.report import RunNotFoundError
    from otel_training.report.health import assess_job, format_text

    try:
        health = assess_job(directory)
    except RunNotFoundError as error:
        hint = "" if directory else " (pass DIR or set OTEL_PYTHON_TRAINING_OUTPUT_DIR)"
        print(f"{_PROG} health: error: no run found: {error}{hint}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(health.to_json(), indent=1, allow_nan=False, default=str), flush=True)
    else:
        _say(format_text(health, width=terminal_width()))
    return 0


def terminal_width(stream=None) -> int:
    """The columns a summary may fill on ``stream`` (default stdout): the terminal's width
    when it is a terminal (``COLUMNS`` first, as :func:`shutil.get_terminal_size` reads it;
    40 at least), else 80 (a pipe, a file, a log). Never raises."""
    import shutil

    stream = sys.stdout if stream is None else stream
    try:
        if not stream.isatty():
            return 80
        return max(40, shutil.get_terminal_size((80, 24)).columns)
    except (AttributeError, OSError, ValueError):
        return 80


def _run_demo(argv: Sequence[str]) -> int:
    if importlib.util.find_spec("torch") is None:
        print(f"{_PROG}: error: {_TORCH_HINT}", file=sys.stderr)
        return 1
    try:
        from otel_training.demo.train import config_from_args, format_summary, train
    except ModuleNotFoundError as exc:  # tqdm/numpy or a broken torch install
        print(f"{_PROG}: error: {exc}. {_TORCH_HINT}", file=sys.stderr)
        return 1
    from otel_training.configuration import configure
    from otel_training.demo.threads import apply_threads

    config = config_from_args(argv, prog=f"{_PROG} demo")
    threads = apply_threads(config.threads)
    telemetry = configure(service_name="otel-training-demo")
    try:
        if not config.quiet and _identity_rank() == 0:
            print(f"threads: {threads.sentence}", flush=True)
        result = train(config, telemetry.meter)  # under torchrun: data-parallel over the ranks
        if result.rank == 0:
            summary = format_summary(
                result,
                telemetry.destination,
                telemetry.output_dir,
                threads=threads.sentence,
                command=command_name(),
            )
            print(summary, flush=True)
    except ValueError as exc:  # settings that do not fit together, the data or the device
        print(f"{_PROG} demo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{_PROG} demo: interrupted; telemetry flushed.", file=sys.stderr)
        return 130
    finally:
        telemetry.shutdown()
    return 0


def _identity_rank() -> int:
    from otel_training import config

    return config.load_identity().rank


def command_name() -> str:
    """How to run ``otel-training`` from the working directory, as a person would type it:
    ``otel-training`` when that name on ``PATH`` is this installation's; else the script
    installed beside this Python (``.venv/bin/otel-training`` when the working directory holds
    ``.venv``); else ``python -m otel_training.cli`` with this Python. Never raises."""
    import shlex
    import shutil
    from pathlib import Path

    try:
        script = Path(sys.executable).parent / _PROG  # the venv's bin, its link not followed
        found = shutil.which(_PROG)
        if script.is_file():
            if found and Path(found).resolve() == script.resolve():
                return _PROG
            try:
                shown = str(script.relative_to(Path.cwd()))
            except ValueError:
                shown = str(script)
            return shlex.quote(shown)
        if found:
            return _PROG
        return f"{shlex.quote(sys.executable)} -m otel_training.cli"
    except (OSError, ValueError):
        return _PROG


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``otel-training`` command.

    Args:
        argv: arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 1 when an optional dependency is missing or an output
        file cannot be written, 2 on a usage error or when ``report``/``trace``/``health`` find
        no run
        (argparse exits with ``SystemExit`` for ``--help``, ``--version`` and bad flags).
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`otel-training health DIR | head -3`): end quietly, as a
        # command in a pipeline does. stdout is pointed at /dev/null so that the interpreter's
        # own flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: Sequence[str] | None) -> int:
    parser = _build_parser()
    args, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "demo":
        return _run_demo(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "report":
        return _run_report(args.directory, args.output)
    if args.command == "trace":
        return _run_trace(args.directory, args.output)
    if args.command == "health":
        return _run_health(args.directory, args.json)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
