"""The ground truth of ``docs/health.md`` in all its variants: how far ``otel-training health``
is from the truth, per bucket.

Each variant runs the 2-rank gloo job of ``tests/integration/health_job.py`` (its own truth
log: ``time.time()`` at every phase boundary), kills attempt 0 inside step 48, restarts it 1.5 s
later as attempt 1 (it loads step 40 and runs to 100), and compares ``otel-training health
--json`` with the truth computed from the truth logs alone
(``tests/integration/health_truth.py``):

- ``sigkill``: both ranks SIGKILLed; ``TORCHELASTIC_RESTART_COUNT``; a run directory per attempt
  (this one also runs in ``make test``: ``tests/integration/test_health_ground_truth.py``);
- ``sigterm``: both ranks SIGTERMed (telemetry's handler flushes, spans truncated);
- ``slurm``: ``SLURM_RESTART_COUNT``; a run directory per attempt too;
- ``no_counter``: no restart counter; attempts told apart and ordered by creation time;
- ``rank0_first``: rank 0 SIGKILLed alone; rank 1 fails in its next all_reduce;
- ``default_groups``: the default span groups (no per-step spans);
- ``kills``: 20 SIGKILLs of one rank at random moments with the default span groups, each
  restarted at once (``tests/integration/kill_trials.py``): end, last step, lost progress and
  downtime against one step time.

Prints, per variant, each bucket's error in seconds against the tolerance max(1 % of W, 2 step
times), the goodput error in points (target 0.5), and the lost steps; exits 1 when any variant
misses a target (``bench/_verdict.py``). About 40 s a variant on a shared 2-core machine.

Run: ``make bench-health`` or ``.venv/bin/python bench/health.py [VARIANT ...]``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))  # what health_truth imports (support)

import _verdict  # noqa: E402
from health_truth import BUCKETS, VARIANTS, errors, run_variant  # noqa: E402
from kill_trials import errors as kill_errors  # noqa: E402
from kill_trials import trial  # noqa: E402

#: Trials of the ``kills`` variant.
KILLS = 20


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(
        __doc__,
        "about 40 s a variant on a shared 2-core machine, 10 min for all; kills: about 2 min",
    )
    parser.add_argument(
        "variants", nargs="*", metavar="VARIANT", help=", ".join((*VARIANTS, "kills"))
    )
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS and v != "kills"]
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    names = args.variants or [*VARIANTS, "kills"]
    verdict = _verdict.Verdict("bench-health")
    if "kills" in names:
        names.remove("kills")
        _kills(verdict)
    header = " ".join(f"{b[:9]:>9s}" for b in (*BUCKETS, "productive"))
    print(f"{'variant':15s} {'W s':>6s} {'tol s':>6s} {header} {'goodput':>8s}  lost steps  s")
    judged: dict[str, list[str]] = {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"otel-training-health-{name}-") as base:
            outcome = run_variant(Path(base), name)
        found = errors(outcome)
        tolerance = outcome.truth["tolerance_s"]
        lost = outcome.health["attempts"][0]["lost_iterations"]
        missed = missed_buckets(found, tolerance)
        cells = " ".join(f"{found[b]:+9.3f}" for b in (*BUCKETS, "productive"))
        print(
            f"{name:15s} {outcome.truth['wall_s']:6.1f} {tolerance:6.3f} {cells} "
            f"{found['goodput_points']:+7.2f}p  {str(lost):10s} {outcome.seconds:3.0f}"
            + (f"  MISSED: {', '.join(missed)}" if missed else ""),
            flush=True,
        )
        judged[name] = missed
    print(
        "errors: health minus truth, seconds per bucket (goodput in points); tolerance "
        "max(1 % of W, 2 step times); a killed attempt ends at its progress record's last "
        "transition (docs/health.md, Precision)"
    )
    for name, missed in judged.items():
        verdict.check(
            name,
            not missed,
            "every bucket within tolerance, goodput within 0.5 points"
            if not missed
            else f"outside: {', '.join(missed)}",
        )
    return verdict.exit_status()


def missed_buckets(found: dict[str, float], tolerance_s: float) -> list[str]:
    """The buckets of one variant whose error is outside ``tolerance_s`` (seconds), and
    ``goodput`` when its error is over 0.5 points."""
    missed = [b for b in (*BUCKETS, "productive") if abs(found[b]) > tolerance_s]
    if abs(found["goodput_points"]) > 0.5:
        missed.append("goodput")
    return missed


def _kills(verdict: _verdict.Verdict) -> None:
    """``KILLS`` SIGKILLs at random moments with the default span groups, each restarted at
    once from its last save (``tests/integration/kill_trials.py``): each figure's error against
    the longest step of its run. True when every one is within it."""
    import random

    rng = random.Random(23)
    print(f"kills: {KILLS} SIGKILLs at random moments, default span groups, restarted at once")
    print(f"{'trial':>5s} {'end s':>8s} {'last step':>9s} {'lost s':>8s} {'downtime s':>10s} "
          f"{'tol s':>6s}")  # fmt: skip
    worst: dict[str, float] = {}
    within = 0
    for k in range(KILLS):
        with tempfile.TemporaryDirectory(prefix="otel-training-kill-") as base:
            found = trial(Path(base), rng)
        error = kill_errors(found)
        tolerance = found.longest_step_s + 0.01
        ok = (
            0 <= error["last_step"] <= 1
            and -tolerance <= error["end_s"] <= 0.005
            and abs(error["lost_s"]) <= tolerance
            and abs(error["downtime_s"]) <= tolerance
        )
        within += ok
        for name, value in error.items():
            worst[name] = max(worst.get(name, 0.0), abs(value))
        print(
            f"{k:5d} {error['end_s']:+8.3f} {error['last_step']:+9d} {error['lost_s']:+8.3f} "
            f"{error['downtime_s']:+10.3f} {tolerance:6.3f}" + ("" if ok else "  MISSED"),
            flush=True,
        )
    print(
        f"kills: {within}/{KILLS} within one step time; largest |error|: end "
        f"{worst['end_s']:.3f} s, last step {worst['last_step']:.0f}, lost progress "
        f"{worst['lost_s']:.3f} s, downtime {worst['downtime_s']:.3f} s"
    )
    verdict.check("kills", within == KILLS, f"{within}/{KILLS} within one step time")


if __name__ == "__main__":
    sys.exit(main())
