"""What every benchmark ends with, written once: figures from rounds, judged against targets.

A figure is the median of its rounds (for a ratio: the median of the per-round ratios of
interleaved rounds, so that drift hits both sides alike). Its spread is
``(max - min) / median`` of those rounds; above ``MAX_SPREAD`` the rounds disagree too much for
the median to mean anything, and the line says so ("too noisy: rounds spread X-Y") instead of
giving the figure. A noisy figure is still judged when its rounds all fall on one side of the
target (every round misses: missed; every round meets it: met); otherwise it is not judged.

Where a bench measures in its own process, each figure is given in wall time and in CPU time
(``time.process_time``: every thread of the process, which other processes on a busy machine
disturb less) and judged on the one the bench names.

Exit status of a bench (``Verdict.exit_status``): 0 every target met; 1 a target missed (the
last line names which); 3 none missed but a figure too noisy to judge. ``BENCH_FORCE_MISS=1``
makes every target impossible (a bound of -inf or +inf, a check false), to test that path.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: The largest spread, (max - min) / median of the rounds, at which a figure still means
#: something.
MAX_SPREAD = 0.5

#: Set to 1 to make every target impossible (tests of the exit status).
FORCE_MISS_VARIABLE = "BENCH_FORCE_MISS"

EXIT_MET, EXIT_MISSED, EXIT_NOISY = 0, 1, 3

EXIT_STATUS_HELP = (
    "exit status: 0 every target met; 1 a target missed (named on the last line); 3 none "
    f"missed but a figure too noisy to judge (its rounds spread over {MAX_SPREAD:g} of their "
    f"median). {FORCE_MISS_VARIABLE}=1 makes every target impossible."
)


def parser(doc: str, duration: str, *, targets: bool = True) -> argparse.ArgumentParser:
    """An argument parser whose help gives the bench's first line, its expected duration and
    (when it has targets) what its exit status means."""
    epilog = f"Expected duration: {duration}."
    if targets:
        epilog += " " + EXIT_STATUS_HELP
    else:
        epilog += " Figures, not targets: exit status 0 unless the bench fails to run."
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=epilog)


def timed(function: Callable[[], object]) -> tuple[float, float]:
    """(wall s, CPU s of the whole process) that one call of ``function`` took."""
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """The per-round ratios of two variants measured in the same (interleaved) rounds."""
    return [a / b for a, b in zip(numerators, denominators, strict=True)]


def spread(rounds: Sequence[float]) -> float:
    """(max - min) / median of the rounds; inf where a round is not positive (a time or a
    ratio of times that is 0 or below is noise, not a measurement)."""
    if min(rounds) <= 0:
        return math.inf
    return (max(rounds) - min(rounds)) / statistics.median(rounds)


def machine_load() -> str:
    """The load averages over 1, 5 and 15 min and the cores, to print beside the figures."""
    try:
        with open("/proc/loadavg") as loadavg:
            return f"{' '.join(loadavg.read().split()[:3])} on {os.cpu_count()} cores"
    except OSError:
        return f"unknown, {os.cpu_count()} cores"


def worst(*statuses: int) -> int:
    """The exit status of several passes: a miss anywhere wins, then a noisy figure, then any
    other failure to run."""
    for status in (EXIT_MISSED, EXIT_NOISY):
        if status in statuses:
            return status
    return max(statuses)


def forced_miss() -> bool:
    return os.environ.get(FORCE_MISS_VARIABLE, "") not in ("", "0")


@dataclass
class Judged:
    """One target and what became of it: True met, False missed, None not judged."""

    name: str
    met: bool | None
    line: str


class Verdict:
    """The targets of one bench run, judged as they come, and the exit status at the end."""

    def __init__(self, bench: str, *, max_spread: float = MAX_SPREAD) -> None:
        self.bench = bench
        self.max_spread = max_spread
        self.judged: list[Judged] = []
        self.force = forced_miss()

    def at_most(self, name: str, target: float, **rounds: Sequence[float]) -> bool | None:
        """Judges ``name``: the median of its rounds <= ``target``. See ``figure``."""
        return self.figure(name, target, "<=", **rounds)

    def at_least(self, name: str, target: float, **rounds: Sequence[float]) -> bool | None:
        """Judges ``name``: the median of its rounds >= ``target``. See ``figure``."""
        return self.figure(name, target, ">=", **rounds)

    def figure(
        self,
        name: str,
        target: float,
        sense: str,
        *,
        unit: str = "",
        judge: str | None = None,
        max_spread: float | None = None,
        **rounds: Sequence[float],
    ) -> bool | None:
        """Prints one figure and judges it. ``rounds``: one list of per-round values per clock
        (``wall=[...]``, ``cpu=[...]``), the first one given, or ``judge``, is judged; the others
        are printed beside it; ``max_spread`` overrides the bench's for this figure. Returns
        True met, False missed, None too noisy to judge."""
        clocks = {clock: list(values) for clock, values in rounds.items() if values}
        judged_on = judge or next(iter(clocks))
        bound = target
        if self.force:
            bound = -math.inf if sense == "<=" else math.inf

        def meets(value: float) -> bool:
            return value <= bound if sense == "<=" else value >= bound

        parts = []
        met: bool | None = None
        for clock, values in clocks.items():
            middle = statistics.median(values)
            wide = spread(values) > (self.max_spread if max_spread is None else max_spread)
            text = (
                f"too noisy: rounds spread {min(values):.3g}-{max(values):.3g}"
                if wide
                else f"{middle:.3f}{unit}"
            )
            parts.append(f"{clock} {text}")
            if clock != judged_on:
                continue
            if not wide:
                met = meets(middle)
            elif all(meets(v) for v in values):
                met = True
            elif not any(meets(v) for v in values):
                met = False
        outcome = {True: "met", False: "MISSED", None: "not judged (too noisy)"}[met]
        forced = " [forced]" if self.force else ""
        line = (
            f"{name}: {', '.join(parts)}  (target {sense} {target:g}{unit} on {judged_on}"
            f"{forced}: {outcome})"
        )
        print(line, flush=True)
        self.judged.append(Judged(name, met, line))
        return met

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Judges a target that is a condition (a count, an error within its tolerance)."""
        ok = ok and not self.force
        forced = " [forced]" if self.force else ""
        line = f"{name}: {detail}{forced}: {'met' if ok else 'MISSED'}"
        print(line, flush=True)
        self.judged.append(Judged(name, ok, line))
        return ok

    @property
    def missed(self) -> list[str]:
        return [j.name for j in self.judged if j.met is False]

    @property
    def noisy(self) -> list[str]:
        return [j.name for j in self.judged if j.met is None]

    def exit_status(self) -> int:
        """Prints the verdict's last line and returns the exit status (module docstring)."""
        met = sum(1 for j in self.judged if j.met)
        if self.missed:
            print(f"{self.bench}: MISSED {len(self.missed)} target(s): {', '.join(self.missed)}")
            return EXIT_MISSED
        if self.noisy:
            print(
                f"{self.bench}: {met} target(s) met; too noisy to judge: "
                f"{', '.join(self.noisy)} (run it again on a quieter machine)"
            )
            return EXIT_NOISY
        print(f"{self.bench}: all {met} target(s) met")
        return EXIT_MET
