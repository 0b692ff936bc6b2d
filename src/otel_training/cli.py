"""The ``otel-training`` command.

Subcommands:

- ``demo``: train a small GPT-style model on the Python standard library's sources and emit the
  Megatron-LM training metrics through OpenTelemetry, configured from the ``OTEL_*`` environment
  variables (with none set, OTLP-JSON files in a local directory). Needs the ``torch`` extra.
  ``otel-training demo --help`` lists its flags. Under ``torchrun --nproc_per_node=N`` it trains
  data-parallel (gloo on CPU, NCCL on CUDA); rank 0 prints.

Also runnable as ``python -m otel_training.cli``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["main"]

_PROG = "otel-training"
_TORCH_HINT = (
    "otel-training demo needs PyTorch, tqdm and numpy: pip install 'otel-training[torch]' "
    "(install the torch build that fits your machine first)"
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
    return parser


def _run_demo(argv: Sequence[str]) -> int:
    if importlib.util.find_spec("torch") is None:
        print(f"{_PROG}: error: {_TORCH_HINT}", file=sys.stderr)
        return 1
    try:
        from otel_training.demo.train import config_from_args, format_summary, train
    except ModuleNotFoundError as exc:  # tqdm/numpy or a broken torch install
        print(f"{_PROG}: error: {exc}. {_TORCH_HINT}", file=sys.stderr)
        return 1
    from otel_training.setup import configure

    config = config_from_args(argv, prog=f"{_PROG} demo")
    telemetry = configure(service_name="otel-training-demo")
    try:
        result = train(config, telemetry.meter)  # under torchrun: data-parallel over the ranks
        if result.rank == 0:
            summary = format_summary(result, telemetry.destination, telemetry.output_dir)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``otel-training`` command.

    Args:
        argv: arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 1 when an optional dependency is missing, 2 on a usage
        error (argparse exits with ``SystemExit`` for ``--help``, ``--version`` and bad flags).
    """
    parser = _build_parser()
    args, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "demo":
        return _run_demo(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
