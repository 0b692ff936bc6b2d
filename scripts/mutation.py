#!/usr/bin/env python3
"""Mutation testing of the modules that hold definitions and rules (``make mutation``).

Runs mutmut 3 once per module of ``[tool.otel_training.mutation]`` in ``pyproject.toml``, each
in its own directory ``mutants/{module}/`` (git ignores ``mutants/``), with mutmut's settings
of ``[tool.mutmut]`` and, as its test selection, only the tests listed for that module:
mutmut's stats run then gives each mutant the tests among them that reach its function, and a
mutant runs only those, stopping at the first failure. The modules of one package that list
the same tests share one run, in ``mutants/{package}/`` (:func:`runs`). Prints the kill rate
per module and every mutant that was not killed, with its diff; ``docs/testing.md`` says why
each is accepted.

Usage::

    python scripts/mutation.py                      # every module, from scratch
    python scripts/mutation.py ledger export/files  # some modules (by name or path: choose())
    python scripts/mutation.py limits               # the modules of a package
    python scripts/mutation.py --keep clock         # keep earlier results, retest changes only

Options: ``--max-children N`` (default: the CPU count), ``--fail-under PERCENT`` (exit 1 when
fewer of the mutants of the modules run were killed), ``--keep``.

A mutant counts as killed when a test failed (or timed out, or crashed) with it; survivors,
mutants that no selected test reaches (``no tests``) and suspicious ones count against the
rate. Needs the ``mutation`` extra (mutmut); no network.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest  # mutmut's own dependency

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mutmut brings toml there
    import toml as tomllib

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
#: Statuses of ``mutmut results`` that count as killed.
KILLED = frozenset({"killed", "timeout", "segfault", "caught by type check"})
_RESULT_LINE = re.compile(r"^\s+(?P<key>\S+): (?P<status>.+)$")
_MUTANT = re.compile(r"^(?P<module>.+)\.(?P<function>x[^.]+)__mutmut_(?P<number>\d+)$")


@dataclass
class Outcome:
    """The mutants of one module by status, and how long its run took (with the other modules
    of that run: ``shared``)."""

    module: str
    directory: Path
    statuses: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    failed: str | None = None
    shared: bool = False

    @property
    def killed(self) -> int:
        return sum(status in KILLED for status in self.statuses.values())

    @property
    def not_killed(self) -> list[str]:
        return sorted(key for key, status in self.statuses.items() if status not in KILLED)


def _settings() -> tuple[dict, dict, dict]:
    """(pytest's settings, mutmut's, tests by module) from pyproject.toml."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    return tool["pytest"]["ini_options"], tool["mutmut"], tool["otel_training"]["mutation"]


def _stem(module: str) -> str:
    """``src/otel_training/health/ledger.py`` -> ``health.ledger``; a package's
    ``__init__.py`` -> the package (``export/limits/__init__.py`` -> ``export.limits``)."""
    relative = Path(module).relative_to("src/otel_training").with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def choose(table: list[str], names: list[str]) -> list[str]:
    """The modules of ``table`` that ``names`` select, in the table's order. A name is a module
    or a package, dotted or as a path, whole or by its last parts: ``ledger``, ``health.ledger``,
    ``src/otel_training/health/ledger.py``; ``limits/spans.py`` or ``limits.spans`` (not the
    root's ``spans.py``); ``limits``: every module of ``export/limits/`` in the table. A name
    that fits more than one module or package is refused with them listed (``metrics``:
    ``metrics/``, ``health/metrics.py``, ``export/limits/metrics.py``): ValueError, as for a
    name that fits none."""
    chosen: set[str] = set()
    for name in names:
        key = name.removesuffix(".py").replace("/", ".").removeprefix("src.")
        key = key.removeprefix("otel_training.")
        targets: dict[str, list[str]] = {}
        for module in table:
            parts = Path(module).relative_to("src/otel_training").with_suffix("").parts
            for end in range(len(parts), 0, -1):  # the file, then each package above it
                target = ".".join(parts[:end])
                if target == key or target.endswith("." + key):
                    targets.setdefault(target, []).append(module)
        if not targets:
            raise ValueError(f"not in [tool.otel_training.mutation]: {name}")
        if len(targets) > 1:
            raise ValueError(f"{name} fits {', '.join(sorted(targets))}: name one of them")
        chosen.update(*targets.values())
    return [module for module in table if module in chosen]


def runs(modules: list[str], table: dict[str, list[str]]) -> list[list[str]]:
    """``modules`` as mutmut runs: the modules of one package that list the same tests share
    one (one stats run and one clean run of those tests instead of one each: about a minute
    each for ``export/limits/``'s modules and ``tests/export/test_limits.py``), in order of
    their first module; any other module runs alone."""
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for module in modules:
        grouped.setdefault((str(Path(module).parent), tuple(table[module])), []).append(module)
    return list(grouped.values())


def _run_directory(modules: list[str]) -> Path:
    """``mutants/{module}/`` for a module alone, ``mutants/{package}/`` for a shared run
    (``mutants/otel_training/`` for the root's modules)."""
    if len(modules) == 1:
        return MUTANTS / _stem(modules[0])
    package = Path(modules[0]).parent.relative_to("src/otel_training").parts
    return MUTANTS / (".".join(package) or "otel_training")


def _toml(table: str, values: dict) -> str:
    """A TOML table of strings, numbers, booleans and lists of them (JSON spells them alike)."""
    lines = [f"[{table}]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _prepare(
    directory: Path, modules: list[str], tests: list[str], pytest_options: dict, mutmut: dict
):
    """A project root for one run: links to the sources and tests, and a pyproject.toml whose
    mutmut section mutates ``modules`` and selects ``tests``."""
    directory.mkdir(parents=True, exist_ok=True)
    linked = ["src", "tests", *(Path(p).parts[0] for p in mutmut.get("also_copy", []))]
    for name in dict.fromkeys(linked):
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(ROOT / name, directory))
    settings = {**mutmut, "only_mutate": modules, "pytest_add_cli_args_test_selection": tests}
    text = _toml("tool.pytest.ini_options", pytest_options) + "\n" + _toml("tool.mutmut", settings)
    (directory / "pyproject.toml").write_text(text)


def _mutmut(directory: Path, *args: str, log=None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(Path(__file__).resolve()), "--as-mutmut", *args]
    # The tests see it (tests/support.py: UNDER_MUTATION): fewer, repeatable hypothesis examples.
    env = {**os.environ, "OTEL_TRAINING_MUTATION": "1"}
    if log is not None:
        return subprocess.run(command, cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT)
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)


def run_modules(
    modules: list[str], tests: list[str], options: argparse.Namespace, settings
) -> list[Outcome]:
    """Runs mutmut once on ``modules`` with ``tests`` and reads back every mutant's status,
    by module."""
    pytest_options, mutmut, _ = settings
    directory = _run_directory(modules)
    outcomes = [Outcome(module, directory, shared=len(modules) > 1) for module in modules]
    if not options.keep and directory.exists():
        shutil.rmtree(directory)
    missing = [test for test in tests if not (ROOT / test).exists()]
    if missing:
        for outcome in outcomes:
            outcome.failed = f"tests not found: {', '.join(missing)}"
        return outcomes
    _prepare(directory, modules, tests, pytest_options, mutmut)
    started = time.monotonic()
    args = ["run"] + ([f"--max-children={options.max_children}"] if options.max_children else [])
    with open(directory / "mutmut.log", "w") as log:
        run = _mutmut(directory, *args, log=log)
    for outcome in outcomes:
        outcome.wall_s = time.monotonic() - started
        if run.returncode != 0:
            outcome.failed = f"mutmut run exited {run.returncode}: see {directory / 'mutmut.log'}"
    if run.returncode != 0:
        return outcomes
    # A mutant's key begins with its module's dotted name (otel_training.export.limits.spans).
    by_name = {f"otel_training.{_stem(o.module)}": o for o in outcomes}
    listed = _mutmut(directory, "results", "--all", "true")
    for line in listed.stdout.splitlines():
        match = _RESULT_LINE.match(line)
        if match:
            mutant = _MUTANT.match(match["key"])
            outcome = by_name.get(mutant["module"]) if mutant else None
            (outcome or outcomes[0]).statuses[match["key"]] = match["status"]
    return outcomes


def _diff(outcome: Outcome, key: str) -> list[str]:
    """The changed lines of mutant ``key`` (what ``mutmut show`` prints), without headers."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    here = os.getcwd()
    os.chdir(outcome.directory)
    try:
        shown = get_diff_for_mutant(key, path=outcome.module).splitlines()
    except Exception as error:  # a mutant mutmut cannot show: say so, keep listing
        shown = [f"+ (no diff: {error})"]
    finally:
        os.chdir(here)
    return [
        line
        for line in shown
        if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()
    ]


def _readable(key: str) -> str:
    """``otel_training.clock.x_unix_s__mutmut_3`` -> ``unix_s #3``; methods as Class.method."""
    match = _MUTANT.match(key)
    if not match:
        return key
    function = match["function"]
    function = function[2:].replace("ǁ", ".") if function.startswith("xǁ") else function[2:]
    return f"{function} #{match['number']}"


def _row(name: str, mutants: int, killed: int, wall: str) -> str:
    rate = 100.0 * killed / mutants if mutants else 100.0
    return f"{name:<44} {mutants:>7} {killed:>7} {mutants - killed:>5} {rate:>6.1f}% {wall:>7}"


def report(outcomes: list[Outcome], total_s: float) -> float:
    """Prints the kill rate per module (a shared run's wall time once, on a line of its own
    below its modules) and the mutants not killed; returns the overall rate in percent."""
    print()
    print(f"{'module':<44} {'mutants':>7} {'killed':>7} {'not':>5} {'rate':>7} {'wall':>7}")
    killed = mutants = 0
    for index, outcome in enumerate(outcomes):
        name = outcome.module.removeprefix("src/")
        if outcome.failed:
            print(f"{name:<44} FAILED: {outcome.failed}")
        else:
            count = len(outcome.statuses)
            killed, mutants = killed + outcome.killed, mutants + count
            wall = "-" if outcome.shared else f"{outcome.wall_s:.0f}s"
            print(_row(name, count, outcome.killed, wall))
        following = outcomes[index + 1] if index + 1 < len(outcomes) else None
        if outcome.shared and (following is None or following.directory != outcome.directory):
            run = [o for o in outcomes if o.directory == outcome.directory and not o.failed]
            print(
                _row(
                    f"  one run: {outcome.directory.name}",
                    sum(len(o.statuses) for o in run),
                    sum(o.killed for o in run),
                    f"{outcome.wall_s:.0f}s",
                )
            )
    overall = 100.0 * killed / mutants if mutants else 100.0
    print(_row("all", mutants, killed, f"{total_s:.0f}s"))
    for outcome in outcomes:
        if outcome.failed or not outcome.not_killed:
            continue
        print(f"\nnot killed in {outcome.module.removeprefix('src/')}:")
        for key in outcome.not_killed:
            print(f"  {_readable(key)} ({outcome.statuses[key]}): {key}")
            for line in _diff(outcome, key):
                print(f"      {line}")
    return overall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "modules", nargs="*", help="modules or packages, by name or path (default: all)"
    )
    parser.add_argument("--max-children", type=int, default=None)
    parser.add_argument("--fail-under", type=float, default=0.0)
    parser.add_argument("--keep", action="store_true", help="reuse earlier results")
    options = parser.parse_args(argv)
    settings = _settings()
    table = settings[2]
    chosen = list(table)
    if options.modules:
        try:
            chosen = choose(chosen, options.modules)
        except ValueError as error:
            parser.error(str(error))
    started = time.monotonic()
    outcomes = []
    for modules in runs(chosen, table):
        tests = table[modules[0]]
        print(f"mutating {', '.join(modules)} with {', '.join(tests)} ...", flush=True)
        outcomes += run_modules(modules, tests, options, settings)
    overall = report(outcomes, time.monotonic() - started)
    if any(outcome.failed for outcome in outcomes):
        return 2
    return 1 if overall < options.fail_under else 0


#: Imported in mutmut's process before it forks its fork server, so that each mutant's test
#: process (forked from that server) finds them loaded: imported afresh, torch alone took
#: about 1.5 s of every mutant whose tests use it. Importing them starts no thread.
PRELOADED = ("torch", "plotly.graph_objects", "plotly.io", "plotly.offline", "jinja2")


class _SharedSetupTimes:
    """A pytest plugin for mutmut's stats run: adds to each test's duration the setup time of
    the fixtures wider than a function (module, class, session) that it uses. mutmut orders
    a mutant's tests by their call time alone, but the mutant's process pays such a fixture's
    setup for the first of its tests that uses it: a test of 0.03 s on a module fixture of
    1.4 s (the hostile report pages) is no quick test."""

    def __init__(self, durations: dict[str, float]):
        self.durations = durations
        self.setup_s: dict[int, float] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        started = time.perf_counter()
        try:
            return (yield)
        finally:
            if fixturedef.scope != "function":
                self.setup_s[id(fixturedef)] = time.perf_counter() - started

    def pytest_runtest_teardown(self, item):
        definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        for name in item.fixturenames:
            chain = definitions.get(name)
            if chain:
                self.durations[item.nodeid] += self.setup_s.get(id(chain[-1]), 0.0)


def _warm_plotly() -> None:
    """A figure of each trace type the report draws, written as HTML: plotly loads its
    classes, validators and default template lazily, on first use (about 0.16 s of every
    mutant whose tests draw a figure)."""
    import plotly.graph_objects as go

    figure = go.Figure([go.Scatter(x=[0], y=[0]), go.Bar(x=[0], y=[0]), go.Heatmap(z=[[0]])])
    figure.update_layout(title="warm", xaxis_title="x", coloraxis={"colorbar": {"title": "c"}})
    figure.to_html(full_html=False, include_plotlyjs=False)


def _as_mutmut(args: list[str]) -> None:
    """mutmut's command line, its fork server given each mutant's tests fastest first (as its
    plain fork runner does; the fork server keeps them in no order): a mutant is then stopped
    by the quickest test that notices it, not by whichever comes first. The modules of
    :data:`PRELOADED` that are installed are imported first, and the trampolines read the
    active mutant from the process (see below)."""
    import gc
    import importlib

    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if "plotly" in sys.modules:
        _warm_plotly()
    from mutmut.__main__ import cli
    from mutmut.mutation import trampoline
    from mutmut.runners.harness import PytestRunner
    from mutmut.state import state
    from mutmut.workers.isolation import ForkServerRunner

    environment_first = trampoline.get_mutant_under_test

    def mutant_under_test() -> str:
        name = trampoline._mutant_under_test
        return environment_first() if name is None else name

    # Every call of a mutated module's function asks which mutant is active; mutmut's answer
    # reads os.environ twice (about half of a trampoline's 1.1 us, and the size rules' tests
    # make millions of calls). mutmut sets the process's own copy with each mutant (and
    # mirrors it into the environment, which no test of ours changes): read that first.
    trampoline.get_mutant_under_test = mutant_under_test

    # mutmut freezes the garbage collector's objects before it starts its fork server, which
    # then imports and collects the tests: freeze those too, so that a collection in a
    # mutant's process (pytest makes two at its end) does not walk them (0.1-0.2 s a mutant).
    warm_up = PytestRunner.warm_up

    def warm_up_then_freeze(self) -> None:
        warm_up(self)
        gc.freeze()

    PytestRunner.warm_up = warm_up_then_freeze

    run_stats = PytestRunner.run_stats

    def run_stats_with_shared_setup_times(self, *, tests):
        plugin = _SharedSetupTimes(state().duration_by_test)
        execute = self.execute_pytest
        self.execute_pytest = lambda params, plugins=(), **kwargs: execute(
            params, plugins=[*plugins, plugin], **kwargs
        )
        try:
            return run_stats(self, tests=tests)
        finally:
            del self.execute_pytest

    PytestRunner.run_stats = run_stats_with_shared_setup_times

    submit = ForkServerRunner.submit

    def fastest_first(self, mutant_name, tests, cpu_time_limit, estimated_time):
        durations = state().duration_by_test
        tests = sorted(tests, key=lambda test: (durations.get(test, 0.0), test))
        return submit(self, mutant_name, tests, cpu_time_limit, estimated_time)

    ForkServerRunner.submit = fastest_first
    cli(args, prog_name="mutmut")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--as-mutmut"]:
        _as_mutmut(sys.argv[2:])
    sys.exit(main())
