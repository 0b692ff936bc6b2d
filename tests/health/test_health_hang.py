"""Hang thresholds, stalled ranks, a hung job and its culprits (health/hang.py,
docs/health.md), each rule pinned by an example computed by hand."""

from __future__ import annotations

import pytest
from doc_rules import documents
from hypothesis import given
from hypothesis import strategies as st
from support import import_or_unavailable

from otel_training import config
from otel_training.health import hang
from otel_training.health.hang import HangPolicy, RankState, judge


@documents("health.md", "max(5 × median step, floor)")
def test_h_in_a_step_phase_is_five_median_steps_at_least_the_floor():
    """max(5 x median step, floor): 60 s for 2 s steps, 100 s for 20 s steps."""
    policy = HangPolicy()
    assert policy.threshold_s("forward_backward", 2.0) == 60.0
    assert policy.threshold_s("communication", 20.0) == 100.0
    assert policy.threshold_s("other", None) == 60.0  # no median yet: the floor
    assert HangPolicy(floor_s=1.0).threshold_s("data_loading", 0.05) == 1.0


@documents("health.md", "max(2 × the longest of that phase seen in the attempt (any rank)")
def test_long_phases_get_twice_the_longest_seen_at_least_ten_minutes():
    """A checkpoint save: max(2 x longest save seen, 600 s, the step threshold)."""
    policy = HangPolicy()
    assert policy.threshold_s("checkpoint_save", 2.0, None) == 600.0
    assert policy.threshold_s("checkpoint_save", 2.0, 400.0) == 800.0
    assert policy.threshold_s("evaluate", 200.0, 10.0) == 1000.0  # 5 x 200 s steps
    assert policy.threshold_s("checkpoint_load", 1.0, 1.0) == 600.0


@documents("health.md", "`startup`, `warmup` | max(budget, the step H)")
def test_startup_and_warmup_get_thirty_minutes():
    """The initial budget of NVRx and DLRover: 1,800 s."""
    assert HangPolicy().threshold_s("startup") == 1800.0
    assert HangPolicy().threshold_s("warmup", 1.0) == 1800.0
    assert HangPolicy(startup_s=60.0).threshold_s("warmup", 20.0) == 100.0


@documents(
    "health.md",
    "The ranks' watchdogs and `otel-training health` read the same variables (`config/`)",
)
@documents("health.md", "`OTEL_PYTHON_TRAINING_HANG_STARTUP_S` (1800)")
@documents("health.md", "`OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S` (600)")
@documents("health.md", "`OTEL_PYTHON_TRAINING_HANG_FLOOR_S` (60)")
def test_the_floor_is_read_from_the_environment_like_the_ranks_read_it():
    """OTEL_PYTHON_TRAINING_HANG_FLOOR_S and the budgets, with the one bad-value policy."""
    settings = config.load(
        {
            "OTEL_PYTHON_TRAINING_HANG_FLOOR_S": "1.5",
            "OTEL_PYTHON_TRAINING_HANG_PHASE_BUDGET_S": "30",
            "OTEL_PYTHON_TRAINING_HANG_STARTUP_S": "90",
            "OTEL_PYTHON_TRAINING_STRAGGLER_WINDOW_STEPS": "50",
        }
    )
    assert settings.hang == HangPolicy(floor_s=1.5, phase_budget_s=30.0, startup_s=90.0)
    assert settings.straggler_window_steps == 50
    assert config.load({}).hang == HangPolicy(60.0, 600.0, 1800.0)


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "nan", "1e99"])
def test_a_bad_floor_warns_once_and_uses_the_default(raw, caplog):
    """A value that is not a positive number (or beyond a week): one warning, then 60 s."""
    settings = config.load({"OTEL_PYTHON_TRAINING_HANG_FLOOR_S": raw})
    assert settings.hang.floor_s == 60.0
    assert sum("OTEL_PYTHON_TRAINING_HANG_FLOOR_S" in r.message for r in caplog.records) == 1


@documents(
    "health.md", "The median step of a rank: the median over its samples of (step time gained ÷"
)
def test_the_median_step_is_the_median_of_interval_means():
    """Samples (iteration, cumulative step time): the mean per step of each interval, then
    the median; intervals without a step left out."""
    samples = [(10, 1.0), (20, 2.0), (20, 2.0), (30, 5.0), (40, 6.0)]
    # means: 0.1, (no step), 0.3, 0.1 -> median 0.1
    assert hang.median_step_s(samples) == pytest.approx(0.1)
    assert hang.median_step_s([(5, 1.0)]) is None


def state(rank, phase="communication", age=100.0, threshold=60.0, iteration=10, silent=False):
    return RankState(rank, phase, age, threshold, iteration, silent)


@documents("health.md", "Hung: every exporting rank is stalled")
@documents("health.md", "Stalled: hang age > H for its phase.")
def test_a_job_is_hung_when_every_exporting_rank_is_stalled():
    """Stalled = progress age above H; one rank still progressing means no hang."""
    verdict = judge([state(0), state(1, age=10.0)])
    assert verdict.stalled_ranks == (0,) and not verdict.hung and verdict.culprits == ()
    verdict = judge([state(0), state(1)])
    assert verdict.hung and verdict.since_s == 100.0


@documents("health.md", "`silent`: the silent ranks")
def test_rule_one_silent_ranks_while_peers_export():
    """A rank that stopped exporting (GIL held, SIGSTOP, dead) is the culprit."""
    verdict = judge([state(0), state(1, phase="forward_backward", silent=True), state(2)])
    assert verdict.hung and verdict.rule == "silent" and verdict.culprits == (1,)
    assert verdict.silent_ranks == (1,)


@documents(
    "health.md", "`outside_communication`: while at least half of the ranks are in `communication`"
)
def test_rule_two_ranks_outside_communication_while_most_wait_in_it():
    """Ranks 0, 2, 3 wait in communication; rank 1 never reached the collective."""
    ranks = [state(0), state(1, phase="forward_backward"), state(2), state(3)]
    verdict = judge(ranks)
    assert verdict.rule == "outside_communication" and verdict.culprits == (1,)
    assert verdict.phases == {0: "communication", 1: "forward_backward", 2: "communication",
                              3: "communication"}  # fmt: skip


@documents(
    "health.md",
    "`lowest_progress`: the ranks with the lowest progress iteration, when the ranks differ",
)
def test_rule_three_the_lowest_progress():
    """Nobody in communication: the ranks at the lowest iteration."""
    ranks = [state(0, "data_loading", iteration=12), state(1, "data_loading", iteration=11),
             state(2, "optimizer", iteration=11)]  # fmt: skip
    verdict = judge(ranks)
    assert verdict.rule == "lowest_progress" and verdict.culprits == (1, 2)


@documents(
    "health.md",
    "`lowest_progress`: the ranks with the lowest progress iteration, when the ranks differ",
)
def test_no_culprit_when_the_ranks_cannot_be_told_apart():
    """All in the same phase at the same iteration: hung, no culprit named."""
    verdict = judge([state(0, "data_loading"), state(1, "data_loading")])
    assert verdict.hung and verdict.culprits == () and verdict.rule is None


@documents("health.md", "`pause_over_budget`: the ranks in a pause past its H")
@documents("health.md", "Each rule names the ranks that are not where the others wait.")
@documents("health.md", "When every rank waits at the same place (same iteration, same phase")
def test_rule_two_a_pause_over_budget_holds_the_others():
    """Rank 2's evaluation is past its H (700 s > 600 s) while ranks 0 and 1 wait in
    forward_backward: rank 2. Every rank in a pause past H (all save together): no one by this
    rule (same phase and iteration: no culprit at all)."""
    ranks = [state(0, "forward_backward", 700.0), state(1, "forward_backward", 700.0),
             state(2, "evaluate", 700.0, 600.0)]  # fmt: skip
    verdict = judge(ranks)
    assert verdict.hung and (verdict.rule, verdict.culprits) == ("pause_over_budget", (2,))
    within = [*ranks[:2], RankState(2, "evaluate", 500.0, 600.0, 10, pause_age_s=0.0)]
    assert not judge(within).hung
    everyone = [state(r, "checkpoint_save", 700.0, 600.0) for r in range(3)]
    verdict = judge(everyone)
    assert verdict.hung and verdict.rule is None and verdict.culprits == ()


@documents("health.md", "`behind_in_step`: when every rank has completed the same iteration")
@documents("health.md", "so the ranks wait in `forward_backward` for the one still loading")
def test_rule_five_under_ddp_the_rank_behind_in_its_step():
    """DDP: ranks 0, 1, 3 wait in the all-reduce inside backward (forward_backward); rank 2 is
    stuck loading data, all at iteration 11: rank 2. Between steps (``other``) comes before
    data loading; ``communication`` before ``optimizer``."""
    phases = ["forward_backward", "forward_backward", "data_loading", "forward_backward"]
    ranks = [state(r, phase, iteration=11) for r, phase in enumerate(phases)]
    verdict = judge(ranks)
    assert verdict.hung and (verdict.rule, verdict.culprits) == ("behind_in_step", (2,))
    two = [state(0, "forward_backward"), state(1, "other")]
    assert (judge(two).rule, judge(two).culprits) == ("behind_in_step", (1,))
    late = [state(0, "optimizer"), state(1, "optimizer"), state(2, "communication"),
            state(3, "optimizer"), state(4, "optimizer")]  # fmt: skip
    assert (judge(late).rule, judge(late).culprits) == ("behind_in_step", (2,))
    assert hang.STEP_ORDER == (
        "other",
        "data_loading",
        "forward_backward",
        "communication",
        "optimizer",
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from([*hang.STEP_PHASES, *hang.PAUSE_PHASES]),
            st.integers(0, 3),
            st.booleans(),
        ),
        min_size=2,
        max_size=8,
    )
)
def test_a_hung_job_whose_ranks_differ_always_has_a_culprit(ranks):
    """Every rank stalled: when the ranks differ in phase or iteration (or one is silent while
    another exports), some rule names a culprit, and only ranks of the job; when they do not
    differ, none. (Ranks all in pauses, in different ones, are not told apart: none says
    which waits for which.)"""
    states = [state(i, p, 700.0, 600.0, it, s) for i, (p, it, s) in enumerate(ranks)]
    verdict = judge(states)
    assert verdict.hung
    silent = 0 < sum(s for *_, s in ranks) < len(ranks)
    paused = all(p in hang.PAUSE_PHASES for p, _, _ in ranks)
    differ = (
        silent
        or (len({(p, it) for p, it, _ in ranks}) > 1 and not paused)
        or (paused and len({it for _, it, _ in ranks}) > 1)
    )
    assert bool(verdict.culprits) == differ, verdict
    assert (verdict.rule is None) == (not differ)
    assert set(verdict.culprits) <= set(range(len(ranks)))


@documents("health.md", "(every rank, when none exports)")
def test_when_no_rank_exports_all_are_judged():
    """Every rank silent (the job died): hung when all were stalled, no silent culprit."""
    verdict = judge([state(0, silent=True), state(1, "forward_backward", silent=True)])
    assert verdict.hung and verdict.rule == "outside_communication" and verdict.culprits == (1,)


@documents("health.md", "Silent: no export for 2 export intervals + 1 s")
def test_silence_is_two_export_intervals_and_a_second():
    """5 s exports: silent after 11 s."""
    assert hang.silence_s(5.0) == 11.0


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["communication", "forward_backward", "data_loading"]),
            st.floats(0, 1000),
            st.integers(0, 5),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_culprits_are_always_stalled_or_silent_ranks_of_a_hung_job(ranks):
    """Whatever the ranks: culprits only when hung, and only ranks of the job."""
    verdict = judge([state(i, p, a, 60.0, it, s) for i, (p, a, it, s) in enumerate(ranks)])
    if not verdict.hung:
        assert verdict.culprits == ()
    assert set(verdict.culprits) <= set(range(len(ranks)))
    assert verdict.since_s == min(a for _, a, _, _ in ranks)


def test_the_health_variables_are_documented():
    """Each OTEL_PYTHON_TRAINING_HANG_* and _STRAGGLER_* variable is in docs/health.md and the
    configuration table (docs/configuration.md)."""
    from pathlib import Path

    from otel_training.config import variables as environment_variables

    root = Path(__file__).resolve().parents[2]
    health = (root / "docs" / "health.md").read_text()
    readme = (root / "docs" / "configuration.md").read_text()
    names = [n for n in environment_variables.__all__ if "_HANG_" in n or "_STRAGGLER_" in n]
    assert len(names) == 4
    for name in names:
        assert name in health, name
        short = name.replace("OTEL_PYTHON_TRAINING", "")
        assert name in readme or short in readme, name


@documents(
    "health.md", "`outside_communication`: while at least half of the ranks are in `communication`"
)
@documents("health.md", "Culprits, the ranks of the first of these rules that names any")
def test_the_first_rule_that_names_a_rank_wins():
    """Rule 1 before rule 2 before rule 3; rule 2 needs half of the ranks in communication
    (2 of 4 is enough, 1 of 4 is not)."""
    ranks = [state(0), state(1, "forward_backward"), state(2, silent=True), state(3)]
    assert (judge(ranks).rule, judge(ranks).culprits) == ("silent", (2,))
    ranks = [
        state(0, iteration=9),
        state(1, "forward_backward", iteration=12),
        state(2, iteration=9),
    ]
    assert (judge(ranks).rule, judge(ranks).culprits) == ("outside_communication", (1,))
    half = [state(0), state(1), state(2, "optimizer"), state(3, "optimizer")]
    assert (judge(half).rule, judge(half).culprits) == ("outside_communication", (2, 3))
    quarter = [
        state(0, iteration=12),
        state(1, "optimizer", iteration=11),
        state(2, "optimizer", iteration=12),
        state(3, "optimizer", iteration=12),
    ]
    assert (judge(quarter).rule, judge(quarter).culprits) == ("lowest_progress", (1,))


@documents("health.md", "Stalled: hang age > H for its phase.")
def test_a_rank_is_stalled_only_past_h():
    """Progress age exactly H is not stalled; a millisecond more is (alone, and by judge)."""
    assert not state(0, age=60.0, threshold=60.0).stalled
    assert state(0, age=60.001, threshold=60.0).stalled
    assert not hang.stalled(state(0, age=60.0, threshold=60.0))
    assert judge([state(0, age=60.001, threshold=60.0)]).stalled_ranks == (0,)


# -- a waiting peer is not stalled: rank 0 saves, rank 1 waits in the next collective -----------


def saving(age: float, pause_age: float = 0.0) -> RankState:
    """Rank 0 in a checkpoint save, its last step ``age`` s ago, H 600 s (the budget)."""
    return RankState(0, "checkpoint_save", age, 600.0, 10, pause_age_s=pause_age)


def waiting(age: float, pause_age: float | None = 1000.0, phase="communication") -> RankState:
    """Rank 1 waiting in ``phase``, its last step ``age`` s ago, H 60 s; its own last pause
    (its warm-up) ended ``pause_age`` s ago."""
    return RankState(1, phase, age, 60.0, 10, pause_age_s=pause_age)


@documents("health.md", "A waiting peer is not stalled.")
@documents("health.md", "its peers wait in the next collective (in `communication`, or in")
@documents("health.md", "a paused rank excuses the peers that wait for it, one past its H excuses")
def test_a_peer_waiting_for_a_save_within_its_budget_is_not_stalled():
    """Rank 0 has saved for 300 s (H 600 s): rank 1, 300 s without progress in communication
    (H 60 s), is not stalled, nor in forward_backward (a DDP all-reduce). At 601 s the save
    is past its budget: both stalled, hung, rank 0 the culprit (its pause over budget; in
    forward_backward, where DDP's all-reduce waits, too)."""
    for phase in ("communication", "forward_backward"):
        verdict = judge([saving(300.0), waiting(300.0, phase=phase)])
        assert verdict.stalled_ranks == () and not verdict.hung
    for phase in ("communication", "forward_backward"):
        verdict = judge([saving(601.0), waiting(601.0, phase=phase)])
        assert verdict.stalled_ranks == (0, 1) and verdict.hung
        assert (verdict.rule, verdict.culprits) == ("pause_over_budget", (0,))
    # alone, rank 1 would be stalled at 300 s
    assert judge([waiting(300.0)]).stalled_ranks == (1,)


@documents(
    "health.md",
    "in a step phase, the lesser of its progress age and the",
)
def test_after_the_peers_save_its_progress_age_counts_from_the_saves_end():
    """Rank 0's 300 s save ended 50 s ago (both now in communication, no step since): hang
    age min(350, 50) = 50 s, within 60 s; 61 s after the save's end both are stalled."""
    ended = RankState(0, "communication", 350.0, 60.0, 10, pause_age_s=50.0)
    assert hang.hang_age_s(waiting(350.0), 50.0) == 50.0
    assert judge([ended, waiting(350.0)]).stalled_ranks == ()
    ended = RankState(0, "communication", 361.0, 60.0, 10, pause_age_s=61.0)
    assert judge([ended, waiting(361.0)]).stalled_ranks == (0, 1)
    # in a pause, the hang age is the progress age (no open time known), whatever the peers
    assert hang.hang_age_s(saving(300.0), 0.0) == 300.0


@documents(
    "health.md",
    "A rank is paused while it is in one of those phases and the time that phase has been open",
)
def test_paused_means_in_a_pause_within_its_h():
    """A save at 600 s of 600 is paused, at 600.001 s not; communication never is; startup
    and warm-up and the long phases are pauses. The time the pause has been open counts, not
    the progress age: a load open 30 s of its 600, 730 s after the last progress (a long
    start-up before it), is paused; its hang age is 30 s."""
    assert saving(600.0).paused and not saving(600.001).paused
    loading = RankState(0, "checkpoint_load", 730.0, 600.0, None, open_s=30.0)
    assert loading.paused and hang.hang_age_s(loading, 0.0) == 30.0
    assert not judge([loading, RankState(1, "checkpoint_load", 730.0, 600.0, None)]).hung
    assert not RankState(0, "checkpoint_load", 730.0, 600.0, None, open_s=601.0).paused
    assert RankState(0, "communication", 70.0, 60.0, 3, open_s=1.0).stalled  # step: progress
    assert not waiting(1.0).paused
    assert hang.PAUSE_PHASES == {"startup", "warmup", "checkpoint_save", "checkpoint_load",
                                 "evaluate"}  # fmt: skip
    starting = RankState(0, "warmup", 100.0, 1800.0, None, pause_age_s=0.0)
    assert judge([starting, waiting(300.0)]).stalled_ranks == ()


@documents("health.md", "A rank's pause age is the time since its last pause ended; for a rank")
@documents("health.md", "The attempt's pause age is the least pause age of its ranks, leaving")
def test_the_attempts_pause_age_is_the_least_of_its_ranks_but_those_past_h():
    """Pause ages 0 (rank 0 saving, alive), 1000: the attempt's is 0. A save past its H is left
    out: 1000. A rank that died in its save 100 s ago (its latest evidence): 100, so the waiting
    rank (300 s without progress, H 60 s) is stalled."""
    assert hang.pause_age_s([saving(300.0), waiting(300.0)]) == 0.0
    assert hang.pause_age_s([saving(700.0), waiting(700.0)]) == 1000.0
    assert hang.pause_age_s([waiting(1.0, pause_age=None)]) is None
    dead = saving(300.0, pause_age=100.0)
    assert hang.pause_age_s([dead, waiting(300.0)]) == 100.0
    assert judge([dead, waiting(300.0)]).stalled_ranks == (1,)


def test_a_verdict_holds_until_the_hang_age_or_the_peers_budget_runs_out():
    """Rank 1 (H 60 s) excused by rank 0 saving for 300 s (H 600 s): unchanged for
    min(60 - 0, 600 - 300) = 60 s; with the save at 580 s, for 20 s; stalled: 0."""
    assert hang.unchanged_for_s(waiting(300.0), [saving(300.0)]) == 60.0
    assert hang.unchanged_for_s(waiting(580.0), [saving(580.0)]) == 20.0
    assert hang.unchanged_for_s(waiting(700.0), [saving(700.0)]) == 0.0


def _frame(path, function):
    return f'  File "{path}", line 12, in {function}\n    code()\n'


@documents("health.md", "`outside_collective`: when the watchdogs' stacks of the stall show")
@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        ([("/venv/torch/distributed/distributed_c10d.py", "all_reduce")], True),
        ([("/venv/torch/distributed/c10d_logger.py", "wrapper")], True),
        (
            [
                ("/venv/torch/_tensor.py", "backward"),
                ("/venv/torch/autograd/graph.py", "_engine_run_backward"),
            ],
            True,
        ),  # fmt: skip
        ([("/venv/torch/autograd/__init__.py", "backward")], True),
        ([("C:\\venv\\torch\\distributed\\distributed_c10d.py", "barrier")], True),
        ([("/venv/torch/autograd/grad_mode.py", "__enter__")], False),
        ([("/venv/torch/nn/modules/module.py", "_call_impl")], False),
        ([("/job/train.py", "backward")], False),
        ([("/job/distributed/loader.py", "next")], False),
        ([], False),
    ],
)
def test_a_stack_at_a_collective_is_in_torch_distributed_or_autograds_backward(frames, expected):
    """Frames as ``traceback.format_stack`` writes them, outermost first, under the training
    loop's own frame."""
    stack = _frame("/job/train.py", "main") + "".join(_frame(p, f) for p, f in frames)
    assert hang.at_collective(stack) is expected
    assert hang.at_collective("(the stack could not be formatted)") is False


def test_a_real_backward_pass_stands_at_a_collective():
    """The stack formatted inside a real autograd backward pass (a gradient hook, where DDP's
    reducer starts its all-reduce) of this torch: at a collective; the same code's stack
    outside backward: not."""
    import traceback

    torch = import_or_unavailable("torch")
    seen = []
    weight = torch.ones(3, requires_grad=True)
    weight.register_hook(lambda grad: seen.append("".join(traceback.format_stack())))
    (weight * 2).sum().backward()
    assert seen and hang.at_collective(seen[0]), seen
    assert not hang.at_collective("".join(traceback.format_stack()))


@documents("health.md", "and the report only: a Python stack is no metric, so the rules name")
def test_rule_six_the_ranks_whose_stacks_are_not_at_a_collective():
    """Plain DDP, every rank in forward_backward at iteration 10: ranks 0 and 2 stand in
    backward's all-reduce, rank 1 in its forward pass: rank 1. Every stack at a collective, or
    none known: no culprit; a rank without a stack is named by nothing; an earlier rule wins."""

    def ranks(*collective):
        return [
            RankState(r, "forward_backward", 100.0, 60.0, 10, at_collective=c)
            for r, c in enumerate(collective)
        ]

    verdict = judge(ranks(True, False, True))
    assert verdict.hung and (verdict.rule, verdict.culprits) == ("outside_collective", (1,))
    assert (judge(ranks(True, None, False)).rule, judge(ranks(True, None, False)).culprits) == (
        "outside_collective",
        (2,),
    )
    for same in (ranks(True, True, True), ranks(None, None, None), ranks(None, False, False)):
        assert judge(same).hung and judge(same).rule is None and judge(same).culprits == ()
    behind = [*ranks(True, True), RankState(2, "data_loading", 100.0, 60.0, 10)]
    assert (judge(behind).rule, judge(behind).culprits) == ("behind_in_step", (2,))
    assert hang.STACK_CULPRIT_RULES == ("outside_collective",)
    from pathlib import Path

    rules = (
        Path(__file__).resolve().parents[2] / "collector-config/rules/training.yaml"
    ).read_text()
    assert "outside_collective" not in rules and "behind_in_step" in rules
