"""The run-health rules of collector-config/rules/training.yaml under ``promtool test rules``.

Each test builds the series a small job of ranks would export (the ledger's metrics, sampled
every 15 s as the stack does) from a timeline of phases written here, independently of the
rules, and states when each alert must and must not fire. The rules are those shipped
(:func:`generate_rules.render` with its defaults: 60 s hang floor, 15 s evaluation, 5 min
straggler windows). Each promtool run needs under a second of CPU.
"""

from __future__ import annotations

import bisect
import math
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from doc_rules import documents
from support import load_script, promtool_or_unavailable

from otel_training.health import hang, straggler
from otel_training.health.ledger import PHASES

pytestmark = pytest.mark.slow  # promtool runs in a child process per test

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "collector-config" / "rules" / "training.yaml"
INTERVAL_S = 15
LABELS = {"job": "train", "dl_run_id": "run-1"}


generate_rules = load_script("generate_rules")


@pytest.fixture(scope="module")
def promtool() -> str:
    return promtool_or_unavailable()


# -- a job of ranks, as the ledger would report it ---------------------------------------------


@dataclass
class Segment:
    start: float
    end: float
    phase: str


@dataclass
class Rank:
    """One rank's phases (contiguous from process creation at t=0), steps and saves."""

    rank: int
    segments: list[Segment] = field(default_factory=list)
    steps: list[tuple[float, int]] = field(default_factory=list)  # (completed at, iteration)
    saves: list[tuple[float, int]] = field(default_factory=list)  # (completed at, iteration)
    silent_from: float = math.inf
    stale: bool = True  # a failed scrape (direct path) or just no more samples (OTLP)
    devices: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    origin: float = 0.0  # process creation: no sample before it

    @property
    def t(self) -> float:
        return self.segments[-1].end if self.segments else self.origin

    def phase(self, name: str, seconds: float) -> None:
        assert name in PHASES, name
        self.segments.append(Segment(self.t, self.t + seconds, name))

    def sample(self, t: float) -> dict[str, list[tuple[dict[str, str], float]]]:
        """metric name -> [(point labels, value)] at time t, as the ledger reads then."""
        index = bisect.bisect_right(self._starts(), t) - 1
        open_segment = self.segments[index]
        assert open_segment.start <= t < open_segment.end, (t, open_segment)
        spent = dict(self._spent_before[index])
        spent[open_segment.phase] += t - open_segment.start
        done = bisect.bisect_right(self._step_times, t)
        series: dict[str, list[tuple[dict[str, str], float]]] = {
            "dl_training_phase_time_seconds_total": [
                ({"dl_training_phase": p}, spent[p]) for p in PHASES
            ],
            "dl_training_phase_elapsed_seconds": [
                ({"dl_training_phase": p}, t - open_segment.start if p == open_segment.phase else 0)
                for p in PHASES
            ],
            "dl_training_progress_age_seconds": [
                ({}, t - (self.steps[done - 1][0] if done else 0.0))
            ],
        }
        series["dl_training_progress_steps_total"] = [({}, done)]  # this process's, monotonic
        if done:
            series["dl_training_progress_iteration"] = [({}, self.steps[done - 1][1])]
            series["dl_training_progress_timestamp_seconds"] = [({}, self.steps[done - 1][0])]
        # The ledger's checkpoint age: only on a rank that saved, since the step that its last
        # good save holds completed (a rank that never saves has none).
        completed = dict((i, at) for at, i in self.steps)
        held = [completed[i] for at, i in self.saves if at <= t]
        if held:
            series["dl_training_checkpoint_age_seconds"] = [({}, t - max(held))]
        return series

    def freeze(self) -> None:
        """Precomputes the time spent in each phase before each segment (call once built)."""
        self._spent_before = []
        spent = dict.fromkeys(PHASES, 0.0)
        for segment in self.segments:
            self._spent_before.append(dict(spent))
            spent[segment.phase] += segment.end - segment.start
        self._step_times = [at for at, _ in self.steps]
        self.__starts = [s.start for s in self.segments]

    def _starts(self) -> list[float]:
        return self.__starts


class Job:
    """Ranks in lockstep: every step ends at the same time on every rank, the fastest ranks
    waiting in communication for the slowest (a synchronous all-reduce)."""

    def __init__(
        self,
        ranks: int,
        startup_s: float = 30.0,
        *,
        start_s: float = 0.0,
        labels: Mapping[str, str] | None = None,
        instance: str = "node",
        resumed_from: int = 0,
    ) -> None:
        """``ranks`` processes created at ``start_s``; ``labels`` on all of their series (on
        top of LABELS), ``instance`` the prefix of each one's instance label; their first step
        is ``resumed_from`` + 1 (a restart that restored that step)."""
        self.resumed_from = resumed_from
        self.ranks = [Rank(r, origin=start_s) for r in range(ranks)]
        self.labels = dict(labels or {})
        self.instance = instance
        for rank in self.ranks:
            rank.phase("startup", startup_s)

    @property
    def t(self) -> float:
        return max(rank.t for rank in self.ranks)

    @property
    def iteration(self) -> int:
        return len(self.ranks[0].steps)

    def steps(
        self,
        n: int,
        data: float = 1.0,
        fb: float = 3.0,
        opt: float = 0.5,
        comm: float = 0.5,
        slower: Mapping[int, Mapping[str, float]] | None = None,
        without_communication: bool = False,
    ) -> Job:
        """n steps; ``slower[rank]`` multiplies that rank's "data", "fb" or "opt" time."""
        for _ in range(n):
            times = {}
            for rank in self.ranks:
                factor = (slower or {}).get(rank.rank, {})
                times[rank.rank] = (
                    data * factor.get("data", 1),
                    fb * factor.get("fb", 1),
                    opt * factor.get("opt", 1),
                )
            wall = max(sum(t) for t in times.values()) + comm
            for rank in self.ranks:
                d, f, o = times[rank.rank]
                if not rank.steps:  # the first iteration of the process: warm-up, all of it
                    rank.phase("warmup", wall)
                elif without_communication:  # the all-reduce hides inside backward
                    rank.phase("data_loading", d)
                    rank.phase("forward_backward", wall - d - o)
                    rank.phase("optimizer", o)
                else:
                    rank.phase("data_loading", d)
                    rank.phase("forward_backward", f)
                    rank.phase("communication", wall - d - f - o)
                    rank.phase("optimizer", o)
                rank.steps.append((rank.t, self.resumed_from + len(rank.steps) + 1))
        return self

    def pause(self, phase: str, seconds: float, ranks: Iterable[int] | None = None) -> Job:
        """``ranks`` (default all) spend ``seconds`` in ``phase``; the others wait for them in
        communication (a barrier)."""
        chosen = set(range(len(self.ranks)) if ranks is None else ranks)
        for rank in self.ranks:
            rank.phase(phase if rank.rank in chosen else "communication", seconds)
            if phase == "checkpoint_save" and rank.rank in chosen:
                rank.saves.append((rank.t, len(rank.steps)))
        return self

    def hang(self, phases: Mapping[int, str]) -> Job:
        """From now on each rank stays in its phase of ``phases`` (default: communication)."""
        for rank in self.ranks:
            rank.segments.append(Segment(rank.t, math.inf, phases.get(rank.rank, "communication")))
        return self

    def silent(self, rank: int, at: float, stale: bool = True) -> Job:
        """``rank`` exports nothing from ``at`` on; ``stale``: a failed scrape marks its series
        stale at once (the direct path), else they just stop (OTLP)."""
        self.ranks[rank].silent_from = at
        self.ranks[rank].stale = stale
        return self

    def device(self, rank: int, series: str, labels: Mapping[str, str], value: float) -> Job:
        """``rank`` also exports the device metric ``series`` at ``value`` throughout."""
        self.ranks[rank].devices.append((series, dict(labels), value))
        return self

    def input_series(self, until: float) -> list[dict[str, str]]:
        """promtool's input_series, one sample every INTERVAL_S from 0 to ``until``."""
        times = [i * INTERVAL_S for i in range(int(until // INTERVAL_S) + 1)]
        out: dict[str, list[str]] = {}
        for rank in self.ranks:
            rank.freeze()
            identity = {**LABELS, **self.labels, "dl_rank": str(rank.rank),
                        "instance": f"{self.instance}:{rank.rank}"}  # fmt: skip
            for name, labels, value in rank.devices:
                out[_series(name, {**identity, **labels})] = [f"{value:g}"] * len(times)
            silence_marked = False
            for t in times:
                if t < rank.origin:
                    continue
                if t >= rank.silent_from:
                    for values in _rank_series(out, identity, rank.sample(rank.silent_from - 1)):
                        values.append("stale" if rank.stale and not silence_marked else "_")
                    silence_marked = True
                    continue
                for name, points in rank.sample(t).items():
                    for attributes, value in points:
                        key = _series(name, {**identity, **attributes})
                        values = out.setdefault(key, ["_"] * int(t // INTERVAL_S))
                        values.append(f"{value:.4f}".rstrip("0").rstrip("."))
            for values in out.values():
                values.extend(["_"] * (len(times) - len(values)))
        return [{"series": key, "values": " ".join(values)} for key, values in out.items()]


def _merged(jobs: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """The input series of several jobs; a series that two of them write (a process restarted
    under the same labels, as a direct scrape of one target sees it) takes, at each sample,
    the value that is there (a later process's after an earlier one's)."""
    found: dict[str, list[str]] = {}
    for series in jobs:
        for entry in series:
            values = entry["values"].split(" ")
            mine = found.setdefault(entry["series"], values)
            if mine is not values:
                found[entry["series"]] = [b if b != "_" else a for a, b in zip(mine, values)]
    return [{"series": key, "values": " ".join(values)} for key, values in found.items()]


def _series(name: str, labels: Mapping[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _rank_series(out, identity, sample) -> Iterable[list[str]]:
    for name, points in sample.items():
        for attributes, _ in points:
            key = _series(name, {**identity, **attributes})
            if key in out:
                yield out[key]


# -- running promtool ---------------------------------------------------------------------------


@dataclass
class Check:
    """At ``at`` seconds, ``query`` returns exactly ``samples``: {labels: value}."""

    at: float
    query: str
    samples: Mapping[tuple[tuple[str, str], ...], float]


def firing(alert: str, by: str = "dl_rank") -> str:
    """The firing alerts named ``alert``, one sample per value of the labels ``by``."""
    return f'count by ({by}) (ALERTS{{alertname="{alert}", alertstate="firing"}})'


def pending(alert: str, by: str = "dl_rank") -> str:
    return f'count by ({by}) (ALERTS{{alertname="{alert}", alertstate="pending"}})'


def ranks(*numbers: int, **extra: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of a `count by (dl_rank, ...)` query: one per rank, value 1."""
    return {tuple(sorted({"dl_rank": str(n), **extra}.items())): 1 for n in numbers}


NONE: dict[tuple[tuple[str, str], ...], float] = {}


def run_promtool(
    promtool: str,
    tmp_path: Path,
    job: Job | Sequence[Job],
    until: float,
    checks: list[Check],
    parameters: generate_rules.Parameters | None = None,
) -> None:
    """Writes the rules (the shipped ones, or rendered with ``parameters``) and a test of
    ``checks`` over ``job``'s series; runs promtool on them."""
    rules = tmp_path / "training.yaml"
    rules.write_text(RULES.read_text() if parameters is None else generate_rules.render(parameters))
    tests = []
    for check in checks:
        tests.append(
            {
                "expr": check.query,
                "eval_time": f"{int(check.at)}s",
                "exp_samples": [
                    {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}", "value": v}
                    for labels, v in check.samples.items()
                ],
            }
        )
    document = {
        "rule_files": [rules.name],
        "evaluation_interval": f"{INTERVAL_S}s",
        "tests": [
            {
                "interval": f"{INTERVAL_S}s",
                "input_series": _merged(
                    [one.input_series(until) for one in ([job] if isinstance(job, Job) else job)]
                ),
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False, width=10_000))
    result = subprocess.run(
        [promtool, "test", "rules", path.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _after(t: float, seconds: float) -> float:
    """The first sample (and evaluation) time at which ``seconds`` have passed since ``t``
    by more than nothing: the first multiple of INTERVAL_S strictly after t + seconds."""
    return (math.floor((t + seconds) / INTERVAL_S) + 1) * INTERVAL_S


def _before(t: float) -> float:
    """The last evaluation time before ``t``."""
    return (math.ceil(t / INTERVAL_S) - 1) * INTERVAL_S


def _alerts_at(at: float) -> Check:
    """No alert fires at ``at``."""
    return Check(at, 'count by (alertname) (ALERTS{alertstate="firing"})', NONE)


# -- the phases -----------------------------------------------------------------------------------


def test_the_rules_classify_every_phase_of_the_ledger_once():
    """Each value of dl.training.phase is a pause (with a budget) or a training phase, once;
    busy and productive phases are training phases."""
    pauses, training = set(generate_rules.PAUSES), set(generate_rules.TRAINING)
    assert pauses | training == set(PHASES) and not pauses & training
    assert set(generate_rules.BUSY) <= training and set(generate_rules.PRODUCTIVE) <= training
    assert "communication" not in generate_rules.BUSY


@documents("health.md", "the Prometheus rules carry the same numbers")
@documents("health.md", "the Prometheus rules follow it")
def test_a_variant_changes_only_its_parameters(capsys):
    """`generate_rules.py --stdout --hang-floor-s 30 --interval-s 5` prints the same rules
    with a 30 s floor and 5 s evaluation, and says so in its header; `--check` passes on
    the committed file; a window shorter than two evaluations is refused."""
    assert generate_rules.main(["--stdout", "--hang-floor-s", "30", "--interval-s", "5"]) == 0
    variant = capsys.readouterr().out
    shipped = RULES.read_text()
    assert "Parameters: interval_s=5, hang_floor_s=30." in variant
    assert variant.count("interval: 5s") == shipped.count("interval: 15s") == 3
    squeeze = " ".join(variant.split())
    assert "5 * last_over_time(run:dl_training_step_median:seconds[6h]), 30 )" in squeeze
    assert variant.count("\n") == shipped.count("\n")
    assert generate_rules.main(["--check"]) == 0
    with pytest.raises(ValueError, match="straggler_window_s"):
        generate_rules.Parameters(interval_s=60, straggler_window_s=90)


# -- hangs --------------------------------------------------------------------------------------


def test_a_hang_stalls_every_rank_after_the_floor_and_names_the_rank_outside_communication(
    promtool, tmp_path
):
    """Steps of 5 s (H = the 60 s floor): a rank stuck in forward/backward while its peer waits
    in communication makes both stalled, the job hung and that rank the culprit at the first
    evaluation whose sample is more than 60 s after the last step, not one earlier."""
    job = Job(2).steps(100)
    last_step = job.t
    job.hang({1: "forward_backward"})
    fired = _after(last_step, 60)
    run_promtool(
        promtool,
        tmp_path,
        job,
        fired + 120,
        [
            _alerts_at(fired - INTERVAL_S),
            Check(fired, firing("TrainingRankStalled"), ranks(0, 1)),
            Check(fired, firing("TrainingJobHung", "job"), {(("job", "train"),): 1}),
            Check(
                fired,
                firing("TrainingHangCulprit", "dl_rank, dl_hang_reason"),
                ranks(1, dl_hang_reason="outside_communication"),
            ),
            Check(fired, firing("TrainingRankSilent"), NONE),
        ],
    )


def test_the_hang_threshold_is_five_median_steps_when_that_exceeds_the_floor(promtool, tmp_path):
    """Steps of 20 s: H = 5 x 20 s = 100 s, so 90 s without progress is no hang and the first
    sample more than 100 s after the last step is."""
    job = Job(2).steps(60, data=4, fb=12, opt=2, comm=2)
    last_step = job.t
    job.hang({0: "data_loading"})
    fired = _after(last_step, 100)
    run_promtool(
        promtool,
        tmp_path,
        job,
        fired + 60,
        [
            _alerts_at(fired - INTERVAL_S),  # the last sample before: 90 s after the step
            Check(fired, firing("TrainingRankStalled"), ranks(0, 1)),
            Check(
                fired,
                'max by (dl_rank) (rank:dl_training_hang_threshold:seconds{dl_rank="0"})',
                {(("dl_rank", "0"),): 100},
            ),
        ],
    )


def test_a_checkpoint_within_budget_raises_nothing_during_or_after_it(promtool, tmp_path):
    """A 9 min checkpoint save and a 4 min evaluation on every rank (budget 10 min) raise no
    alert, during them or in the steps after them, though the progress age passes 60 s."""
    job = Job(2).steps(50)
    save_start = job.t
    job.pause("checkpoint_save", 540).steps(30)
    eval_start = job.t
    job.pause("evaluate", 240).steps(30).hang({})
    checks = [
        _alerts_at(t)
        for t in range(int(save_start), int(eval_start + 400), INTERVAL_S)
        if t % INTERVAL_S == 0
    ]
    checks.append(
        Check(
            save_start + 300,
            "max by (dl_rank, dl_hang_threshold) "
            '(rank:dl_training_hang_threshold:seconds{dl_rank="0"})',
            {(("dl_hang_threshold", "pause_budget"), ("dl_rank", "0")): 600},
        )
    )
    run_promtool(promtool, tmp_path, job, eval_start + 400, checks)


def test_a_checkpoint_over_its_budget_stalls_the_rank(promtool, tmp_path):
    """A save still open after max(2 x the longest earlier one, 10 min) stalls its rank: the
    first save (6 min) within 10 min; the second within 12 min (2 x 6 min) but not after."""
    job = Job(2).steps(40).pause("checkpoint_save", 360).steps(40)
    second = job.t
    for rank in job.ranks:
        rank.segments.append(Segment(rank.t, math.inf, "checkpoint_save"))
    fired = _after(second, 720)
    run_promtool(
        promtool,
        tmp_path,
        job,
        fired + 60,
        [
            Check(_after(second, 660), firing("TrainingRankStalled"), NONE),
            _alerts_at(fired - INTERVAL_S),
            Check(fired, firing("TrainingRankStalled"), ranks(0, 1)),
            Check(fired, firing("TrainingJobHung", "job"), {(("job", "train"),): 1}),
        ],
    )


def test_peers_waiting_for_a_rank_that_saves_within_budget_are_not_stalled(promtool, tmp_path):
    """Rank 0 saves for 5 min while rank 1 waits in communication (a barrier): no alert then
    or in the steps after, though rank 1's progress age passes 60 s."""
    job = Job(2).steps(50)
    start = job.t
    job.pause("checkpoint_save", 300, ranks=[0]).steps(40).hang({})
    run_promtool(
        promtool,
        tmp_path,
        job,
        start + 500,
        [_alerts_at(t) for t in range(int(_after(start, 0)), int(start + 500), INTERVAL_S)],
    )


@documents("health.md", "`behind_in_step`: when every rank has completed the same iteration")
def test_under_ddp_the_rank_behind_in_its_step_is_the_culprit(promtool, tmp_path):
    """DDP: no rank is ever in communication (the all-reduce runs inside backward). Ranks 0, 1
    and 3 wait in forward_backward; rank 2 is stuck loading data at the same iteration: rank 2,
    behind_in_step, as `otel-training health` says (hang.judge on the same phases)."""
    job = Job(4).steps(100, without_communication=True)
    last_step = job.t
    job.hang({0: "forward_backward", 1: "forward_backward", 2: "data_loading",
              3: "forward_backward"})  # fmt: skip
    fired = _after(last_step, 60)
    states = [hang.RankState(r, p, 61.0, 60.0, 100) for r, p in enumerate(
        ["forward_backward", "forward_backward", "data_loading", "forward_backward"])]  # fmt: skip
    assert (hang.judge(states).rule, hang.judge(states).culprits) == ("behind_in_step", (2,))
    run_promtool(
        promtool,
        tmp_path,
        job,
        fired + 60,
        [
            _alerts_at(fired - INTERVAL_S),
            Check(fired, firing("TrainingJobHung", "job"), {(("job", "train"),): 1}),
            Check(
                fired,
                firing("TrainingHangCulprit", "dl_rank, dl_hang_reason"),
                ranks(2, dl_hang_reason="behind_in_step"),
            ),
        ],
    )


@documents("health.md", "`pause_over_budget`: the ranks in a pause past its H")
def test_a_save_that_never_finishes_names_the_saving_rank(promtool, tmp_path):
    """Rank 0 saves and never finishes while rank 1 waits in forward_backward (a DDP
    all-reduce): nothing within the 10 min budget; past it, the job is hung and rank 0 the
    culprit, pause_over_budget."""
    job = Job(2).steps(40, without_communication=True)
    start = job.t
    job.ranks[0].segments.append(Segment(start, math.inf, "checkpoint_save"))
    job.ranks[1].segments.append(Segment(start, math.inf, "forward_backward"))
    fired = _after(start, 600)
    run_promtool(
        promtool,
        tmp_path,
        job,
        fired + 60,
        [
            _alerts_at(fired - INTERVAL_S),
            Check(fired, firing("TrainingJobHung", "job"), {(("job", "train"),): 1}),
            Check(
                fired,
                firing("TrainingHangCulprit", "dl_rank, dl_hang_reason"),
                ranks(0, dl_hang_reason="pause_over_budget"),
            ),
        ],
    )


def test_startup_and_warmup_have_their_own_budget(promtool, tmp_path):
    """A rank 25 min in startup is not stalled; one past 30 min is."""
    job = Job(2, startup_s=3000)
    job.ranks[0].segments[0].end = math.inf
    job.ranks[1].segments[0].end = math.inf
    run_promtool(
        promtool,
        tmp_path,
        job,
        _after(0, 1800) + 30,
        [
            _alerts_at(1500),
            _alerts_at(_before(1800)),
            Check(_after(0, 1800), firing("TrainingRankStalled"), ranks(0, 1)),
        ],
    )


# -- silence and its culprits ----------------------------------------------------------------


def test_a_silent_rank_is_reported_after_its_for_and_is_the_culprit_of_the_hang(promtool, tmp_path):
    """Rank 1 stops answering scrapes (SIGSTOP, GIL held) while rank 0 waits in communication:
    TrainingRankSilent is pending at once and fires only after its 1 min `for`; the job is
    hung once rank 0 is stalled, with rank 1 the culprit (silent)."""
    job = Job(2).steps(60)
    last_step = job.t
    job.hang({1: "forward_backward"}).silent(1, at=_after(last_step, 0))
    silent = _after(last_step, 0)
    run_promtool(
        promtool,
        tmp_path,
        job,
        silent + 180,
        [
            Check(silent, pending("TrainingRankSilent"), ranks(1)),
            Check(silent + 45, firing("TrainingRankSilent"), NONE),
            Check(silent + 60, firing("TrainingRankSilent"), ranks(1)),
            Check(_after(last_step, 60), firing("TrainingRankStalled"), ranks(0)),
            Check(
                _after(last_step, 60),
                firing("TrainingHangCulprit", "dl_rank, dl_hang_reason"),
                ranks(1, dl_hang_reason="silent"),
            ),
            Check(_before(_after(last_step, 60)), firing("TrainingJobHung", "job"), NONE),
        ],
    )


def test_a_rank_is_silent_only_while_its_peers_export(promtool, tmp_path):
    """When every rank stops exporting (the job ended, or a whole node froze), no rank is
    reported silent and no hang is declared."""
    job = Job(2).steps(60)
    end = _after(job.t, 0)
    job.hang({}).silent(0, at=end).silent(1, at=end)
    run_promtool(
        promtool, tmp_path, job, end + 300, [_alerts_at(t) for t in (end, end + 60, end + 240)]
    )


def test_over_otlp_a_rank_is_silent_once_its_latest_sample_is_older_than_fresh(promtool, tmp_path):
    """Without stale markers (the OTLP path), a rank that stops exporting counts as exporting
    until its latest sample is 60 s old, then is silent."""
    job = Job(2).steps(60)
    last = _after(job.t, 0)
    job.hang({}).silent(1, at=last, stale=False)
    last_sample = last - INTERVAL_S
    run_promtool(
        promtool,
        tmp_path,
        job,
        last + 240,
        [
            Check(last_sample + 45, pending("TrainingRankSilent"), NONE),
            Check(last_sample + 75, pending("TrainingRankSilent"), ranks(1)),
        ],
    )


def test_without_silence_or_stray_phase_the_culprit_is_the_rank_behind(promtool, tmp_path):
    """Every rank in communication, rank 1 one step behind the others (a pipeline that lost a
    message): rank 1 is the culprit by lowest progress."""
    job = Job(3).steps(60)
    job.ranks[1].steps.pop()  # rank 1 never completed the last step
    last_step = job.t
    job.hang({})
    fired = _after(last_step, 60)
    run_promtool(
        promtool,
        tmp_path,
        job,
        fired + 30,
        [
            Check(
                fired,
                firing("TrainingHangCulprit", "dl_rank, dl_hang_reason"),
                ranks(1, dl_hang_reason="lowest_progress"),
            )
        ],
    )


# -- checkpoints --------------------------------------------------------------------------------


def test_checkpoint_stale_fires_when_a_crash_would_lose_more_than_its_threshold(promtool, tmp_path):
    """No save since the first iteration began (at 30 s): TrainingCheckpointStale fires at the
    first sample past the threshold after it, not at the one before; a save resets it. The
    rules are rendered with a 10 min threshold (the shipped 3 h would take 720 evaluations)."""
    job = Job(1).steps(160)
    begun = next(s.start for s in job.ranks[0].segments if s.phase == "warmup")
    job.pause("checkpoint_save", 30).steps(40).hang({})
    fired = _after(begun, 600)
    saved = job.ranks[0].saves[0][0]
    run_promtool(
        promtool,
        tmp_path,
        job,
        saved + 60,
        [
            Check(fired - INTERVAL_S, firing("TrainingCheckpointStale", "job"), NONE),
            Check(fired, firing("TrainingCheckpointStale", "job"), {(("job", "train"),): 1}),
            Check(_after(saved, 0), firing("TrainingCheckpointStale", "job"), NONE),
        ],
        parameters=generate_rules.Parameters(checkpoint_stale_s=600),
    )


@documents("health.md", "A rank that never saves (DDP's rank > 0) has no checkpoint age")
def test_ddp_rank_zero_saving_alone_keeps_the_job_risk_flat(promtool, tmp_path):
    """DDP: rank 0 saves every 100 steps, rank 1 never does. The job's progress at risk is
    rank 0's (flat, below one save interval), TrainingCheckpointStale never fires; when rank
    0's saves stop it fires. Before the first save the risk runs from when training began."""
    job = Job(2)
    for _ in range(6):  # 100 steps of 5.5 s and a 30 s save, six times: 58 min
        job.steps(100).pause("checkpoint_save", 30, ranks=[0])
    last_save = job.ranks[0].saves[-1][0]
    job.steps(130).hang({})  # the saves stop: 12 min without one
    begun = next(s.start for s in job.ranks[0].segments if s.phase == "warmup")
    first_save = job.ranks[0].saves[0][0]
    risk = "max by (job) (run:dl_training_checkpoint_age:seconds)"
    held_at = job.ranks[0].steps[599][0]  # step 600, the last save's
    at = _after(last_save, 60)
    run_promtool(
        promtool,
        tmp_path,
        job,
        last_save + 12 * 60,
        [
            Check(_after(begun, 300), risk, {(("job", "train"),): _after(begun, 300) - begun}),
            Check(
                _after(first_save, 0),
                risk,
                {(("job", "train"),): _after(first_save, 0) - job.ranks[0].steps[99][0]},
            ),  # fmt: skip
            Check(at, risk, {(("job", "train"),): at - held_at}),
            Check(_after(first_save, 600), firing("TrainingCheckpointStale", "job"), NONE),
            Check(
                _after(held_at, 600) - INTERVAL_S, firing("TrainingCheckpointStale", "job"), NONE
            ),  # fmt: skip
            Check(
                _after(held_at, 600),
                firing("TrainingCheckpointStale", "job"),
                {(("job", "train"),): 1},
            ),  # fmt: skip
        ],
        parameters=generate_rules.Parameters(checkpoint_stale_s=600),
    )


@documents("health.md", "a rank of an ended cohort is never silent, stalled or a straggler")
@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4), (4, 4)])
def test_an_elastic_membership_change_leaves_no_alert_for_the_ended_cohort(
    promtool, tmp_path, before, after
):
    """torchrun keeps the restart count (the same dl_run_attempt) when a node is lost (4 -> 2),
    one joins (2 -> 4) or one is replaced (4 -> 4, new processes): the ranks of the ended
    cohort, whose samples just stop (OTLP), are never silent, and the job's live goodput
    averages only the ranks alive now."""
    first = Job(before, labels={"dl_world_size": str(before)}, instance="old").steps(60)
    ended = first.t
    first.hang({})  # the processes die: their last samples are of now
    for rank in range(before):
        first.silent(rank, at=_after(ended, 0), stale=False)
    second = Job(after, start_s=_after(ended, 20), labels={"dl_world_size": str(after)},
                 instance="new").steps(80)  # fmt: skip
    later = _after(second.ranks[0].steps[10][0], 0)  # old samples still in the 5 min window
    run_promtool(
        promtool,
        tmp_path,
        [first, second],
        second.t - 15,
        [
            Check(t, firing("TrainingRankSilent"), NONE)
            for t in (later, _after(later, 90), _after(later, 200))
        ]
        + [
            Check(
                _after(later, 90),
                "count by (job) (rank:dl_training_goodput_live:ratio)",
                {(("job", "train"),): after},
            ),  # fmt: skip
            Check(_after(later, 90), pending("TrainingRankSilent"), NONE),
            Check(_after(later, 90), "count(run:dl_training_hung:ranks)", NONE),
        ],
    )


@documents("health.md", "Every rate and delta of progress in the rules uses the counter")
def test_a_restart_onto_an_older_checkpoint_inside_the_window_reads_right(promtool, tmp_path):
    """One target (a direct scrape) restarts: its process reached step 150, the next one
    restores step 100 and goes on. Over windows that span the restart, the step time stays
    the true 5 s (+- 10 %) and the live goodput stays above 0.5 while steps complete: both
    count steps with dl_training_progress_steps_total, which resets with the process, never
    with the iteration gauge, which goes back."""
    first = Job(1).steps(150)
    ended = first.t
    first.hang({}).silent(0, at=_after(ended, 0), stale=True)
    second = Job(1, start_s=_after(ended, 30), resumed_from=100).steps(100)
    begun = next(s.start for s in second.ranks[0].segments if s.phase == "warmup")
    times = [_after(begun, seconds) for seconds in (30, 90, 150)]  # windows of 5 min
    run_promtool(
        promtool,
        tmp_path,
        [first, second],
        second.t - 15,
        [Check(t, "count(rank:dl_training_step:seconds > 4.5 < 5.5)", {(): 1}) for t in times]
        + [Check(t, "count(rank:dl_training_goodput_live:ratio > 0.5)", {(): 1}) for t in times],
    )


def test_the_shipped_thresholds_are_those_of_the_definition():
    """The shipped rules use the definitions of docs/health.md: H = max(5 x median step, 60 s),
    pauses max(2 x longest, 10 min), startup 30 min, stragglers 1.15 over three 5 min windows
    (the crossing one and 2 more: `for: 10m`) with an 80 % cause share, checkpoint stale after
    3 h."""
    p = generate_rules.Parameters()
    assert (p.hang_step_factor, p.hang_floor_s) == (5, 60)
    assert (p.pause_budget_factor, p.pause_budget_floor_s, p.startup_budget_s) == (2, 600, 1800)
    assert (p.straggler_threshold, p.straggler_window_s, p.cause_share) == (1.15, 300, 0.8)
    assert p.checkpoint_stale_s == 3 * 3600
    text = " ".join(RULES.read_text().split())
    assert "clamp_min( 5 * last_over_time(run:dl_training_step_median:seconds[6h]), 60 )" in text
    assert "rank:dl_training_straggler_score:ratio > 1.15 unless" in text and "for: 10m" in text


# -- stragglers ---------------------------------------------------------------------------------


def _straggler_checks(start: float, *stragglers: int, cause: str) -> list[Check]:
    score = "rank:dl_training_straggler_score:ratio"
    flagged = {k: v for rank in stragglers for k, v in ranks(rank).items()}
    causes = {k: v for rank in stragglers for k, v in ranks(rank, cause=cause).items()}
    return [
        Check(start - INTERVAL_S, f"count by (dl_rank) ({score} > 1.15)", NONE),
        # Not before the condition has held for the `for` (two windows) ...
        Check(start + 600, firing("TrainingStraggler"), NONE),
        # ... and within three windows of the slow-down.
        Check(start + 900, firing("TrainingStraggler"), flagged),
        Check(
            start + 900,
            "count by (dl_rank, cause) (rank:dl_training_straggler_cause:info "
            f"and on (dl_rank) ({score} > 1.15))",
            causes,
        ),
    ]


@documents("health.md", "Straggler: score > 1.15 in at least 3 consecutive windows")
def test_a_compute_straggler_among_four_is_flagged_within_three_windows(promtool, tmp_path):
    """Four ranks, rank 1's forward/backward 50 % slower from a step on: its score passes 1.15,
    TrainingStraggler fires within three windows (not within two), and the cause is compute;
    the wall-clock step time of every rank stays equal."""
    job = Job(4).steps(120)
    start = job.t
    job.steps(250, slower={1: {"fb": 1.5}}).hang({})
    checks = _straggler_checks(start, 1, cause="compute")
    run_promtool(promtool, tmp_path, job, start + 1000, checks)


def test_a_data_straggler_between_two_is_flagged_with_cause_data(promtool, tmp_path):
    """Two ranks (the peer reference is the other rank, not a median that includes the rank),
    rank 1's data loading twice as slow: flagged within three windows, cause data."""
    job = Job(2).steps(120)
    start = job.t
    job.steps(250, data=1.5, slower={1: {"data": 2.0}}).hang({})
    run_promtool(promtool, tmp_path, job, start + 1000, _straggler_checks(start, 1, cause="data"))


@documents("health.md", "with 2 of 4 ranks slow,")
@documents("health.md", "In a group of 4 or more it is the group's **lower quartile**, r included")
def test_two_slow_ranks_of_four_are_both_flagged(promtool, tmp_path):
    """Ranks 1 and 3 of 4 compute 40 % slower (busy 5.7 s against 4.5 s a step): the lower
    quartile stays a fast rank's, both score 1.27 and are flagged within three windows, as
    `otel-training health` flags them (straggler.assess on the same per-step times). No score
    exists before a rank has trained one window after its warm-up."""
    job = Job(4).steps(120)
    start = job.t
    job.steps(250, slower={1: {"fb": 1.4}, 3: {"fb": 1.4}}).hang({})
    checks = _straggler_checks(start, 1, 3, cause="compute")
    checks.append(
        Check(
            start + 900,
            'round(1000 * max by (dl_rank) (rank:dl_training_straggler_score:ratio{dl_rank="1"}))',
            {(("dl_rank", "1"),): round(1000 * 5.7 / 4.5)},
        )
    )
    checks.append(Check(250, "count(rank:dl_training_straggler_score:ratio)", NONE))
    assert straggler.score(5.7, [4.5, 5.7, 4.5]) == pytest.approx(5.7 / 4.5)
    run_promtool(promtool, tmp_path, job, start + 1000, checks)


@documents("health.md", "over the windows that flagged it, from each part's excess over the")
@documents("health.md", "The rules average each part's excess over the two windows")
def test_the_cause_is_taken_over_the_flagging_windows_as_the_cli_takes_it(promtool, tmp_path):
    """Rank 1 of 4 loads data twice as slowly (+1 s a step, score 1.22) for 140 steps, then
    for its last 15 steps also computes 40 % longer: the last window alone would read mixed
    (data 1 s, compute about 0.4 s of excess), but over the windows that flagged it data
    explains it, and `otel-training health` (the median over its flagged windows) says data:
    cause data. Each part's excess against the peers' reference of the part, 0 when below."""
    job = Job(4).steps(120)
    job.steps(140, slower={1: {"data": 2.0}})
    job.steps(15, slower={1: {"data": 2.0, "fb": 1.4}})
    end = job.t
    job.hang({})
    score = "rank:dl_training_straggler_score:ratio"
    run_promtool(
        promtool,
        tmp_path,
        job,
        end + 60,
        [
            Check(end - INTERVAL_S, firing("TrainingStraggler"), ranks(1)),
            Check(
                end - INTERVAL_S,
                "count by (dl_rank, cause) (rank:dl_training_straggler_cause:info "
                f"and on (dl_rank) ({score} > 1.15))",
                ranks(1, cause="data"),
            ),
        ],
    )


@documents("health.md", "a spike stays in the sliding window for one window and cannot fire")
def test_a_single_spike_fires_no_straggler(promtool, tmp_path):
    """One step of rank 2's forward/backward takes twenty times as long (60 s, a quarter of a
    window's worth of its peers' busy time): its score passes 1.15 for less than one window;
    TrainingStraggler never fires."""
    job = Job(4).steps(120)
    start = job.t
    job.steps(1, slower={2: {"fb": 20}}).steps(200).hang({})
    checks = [
        Check(t, firing("TrainingStraggler"), NONE)
        for t in range(int(_after(start, 0)), int(start + 1000), 60)
    ]
    checks.append(
        Check(
            start + 120,
            "count by (dl_rank) (rank:dl_training_straggler_score:ratio > 1.15)",
            ranks(2),
        )
    )
    run_promtool(promtool, tmp_path, job, start + 1000, checks)


def test_a_compute_straggler_whose_gpu_runs_a_lower_clock_is_gpu_throttle(promtool, tmp_path):
    """Four ranks, rank 3's forward/backward 50 % slower and its SM clock at 80 % of its
    peers' (dl.gpu.clock.speed): the cause is gpu_throttle, not compute; a rank hotter by
    5 °C only is no hint."""
    job = Job(4).steps(120)
    start = job.t
    job.steps(150, slower={3: {"fb": 1.5}}).hang({})
    sm = {"dl_gpu_clock_domain": "sm", "hw_id": "gpu0"}
    for rank in range(4):
        job.device(rank, "dl_gpu_clock_speed_hertz", sm, 1.41e9 if rank != 3 else 1.13e9)
        job.device(rank, "hw_temperature_celsius", {"hw_id": "gpu0"}, 60 + 5 * (rank == 0))
    run_promtool(
        promtool,
        tmp_path,
        job,
        start + 700,
        [
            Check(
                start + 600,
                "count by (dl_rank, cause) (rank:dl_training_straggler_cause:info "
                "and on (dl_rank) (rank:dl_training_straggler_score:ratio > 1.15))",
                ranks(3, cause="gpu_throttle"),
            )
        ],
    )


def test_without_communication_phase_stragglers_are_unattributed_not_guessed(promtool, tmp_path):
    """Three ranks without a communication phase (the all-reduce hides in backward), rank 2's
    data loading twice as slow: busy times stay equal, so no straggler is flagged, and every
    rank's cause reads "unattributed"."""
    job = Job(3).steps(120, without_communication=True)
    start = job.t
    job.steps(150, data=1.5, slower={2: {"data": 2.0}}, without_communication=True).hang({})
    run_promtool(
        promtool,
        tmp_path,
        job,
        start + 700,
        [
            Check(start + 600, firing("TrainingStraggler"), NONE),
            Check(
                start + 600,
                "count by (dl_rank, cause) (rank:dl_training_straggler_cause:info)",
                {
                    **ranks(0, cause="unattributed"),
                    **ranks(1, cause="unattributed"),
                    **ranks(2, cause="unattributed"),
                },
            ),
        ],
    )


def test_no_straggler_in_a_healthy_job_with_pauses(promtool, tmp_path):
    """Four equal ranks with checkpoint saves (one on rank 0 alone, the others waiting) and an
    evaluation: no busy score above 1.2 and no alert over 25 min."""
    job = Job(4).steps(60).pause("checkpoint_save", 120).steps(60).pause("evaluate", 200)
    job.steps(60).pause("checkpoint_save", 60, ranks=[0]).steps(40)
    end = job.t - 30
    job.hang({})
    checks = [_alerts_at(t) for t in range(450, int(end), 150)]
    checks += [
        Check(t, "count by (dl_rank) (rank:dl_training_straggler_score:ratio > 1.2)", NONE)
        for t in range(450, int(end), 150)
    ]
    run_promtool(promtool, tmp_path, job, end, checks)


# -- goodput --------------------------------------------------------------------------------------


def _productive_share(rank: Rank, start: float, end: float) -> float:
    productive = {"forward_backward", "optimizer", "communication"}
    spent = sum(
        max(0.0, min(s.end, end) - max(s.start, start))
        for s in rank.segments
        if s.phase in productive
    )
    return spent / (end - start)


def test_goodput_is_the_productive_share_of_time_and_a_stall_is_not_productive(promtool, tmp_path):
    """Per attempt: (forward/backward + optimizer + communication) / time since the process
    started; live: the same over the last 5 min. Once the job is stalled, live goodput falls
    to 0 after a window without steps, and the stalled time leaves the attempt's goodput."""
    job = Job(2).steps(200).pause("evaluate", 300).steps(100)
    last_step = job.t
    job.hang({})
    rank = job.ranks[0]
    at = 1800  # inside the last steps
    late = _after(last_step, 600)  # stalled for 10 min (H = 60 s)
    attempt_late = _productive_share(rank, 0, late) - (late - last_step) / late
    run = (("dl_run_id", "run-1"), ("job", "train"))
    attempt = "round(run:dl_training_goodput_attempt:ratio, 0.001)"
    live = "round(run:dl_training_goodput_live:ratio, 0.01)"
    run_promtool(
        promtool,
        tmp_path,
        job,
        late,
        [
            Check(at, attempt, {run: round(_productive_share(rank, 0, at), 3)}),
            Check(at, live, {run: round(_productive_share(rank, at - 300, at), 2)}),
            Check(late, live, {run: 0}),
            Check(late, attempt, {run: round(attempt_late, 3)}),
        ],
    )
