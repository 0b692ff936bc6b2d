"""The ledger against its definition (``docs/health.md``, "Where the time goes"), written here the
plain way: any sequence of phases opened and closed (nested, out of order, the same phase inside
itself, saves and pauses, DDP's collective wait) gives the phase times, the open phase and the
steps that a straightforward reading of the definition gives. The ledger's short paths (a phase
that changes nothing is no transition, the hot state in a list) must not change a figure."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support import LedgerClock

from otel_training.health import ledger as L


@dataclass
class Open:
    code: int  # as given to enter()
    effective: int  # the phase its time goes to while innermost
    token: int  # the ledger's
    start: float  # since when its effective phase is open (an outer one's start, when the same)


class Definition:
    """The definition, plainly: the time goes to the innermost open phase's effective phase
    (an iteration is warm-up when it is the process's first, else forward/backward; an
    asynchronous save is a save; inside a save, load, evaluation, warm-up or startup the
    effective phase is as :func:`ledger.effective` says), to ``startup`` before the first
    iteration began and ``other`` after when none is open; after DDP's collective wait inside
    forward/backward, to ``communication`` until the next phase opens or closes. A phase that
    closes closes every phase opened after it; an iteration that closes without an exception
    is a step. The open phase is open since it opened, or since the phase around it opened when
    both are the same; ``startup`` since the process began, ``other`` since the last phase
    closed (the process's start until then); ``communication`` since the wait began."""

    def __init__(self, now: float) -> None:
        self.times = [0.0] * len(L.PHASES)
        self.open: list[Open] = []
        self.begun = False
        self.waiting = False
        self.since = now
        self.base_start = now  # the process began now
        self.wait_start = now
        self.steps = 0
        self.iteration: int | None = None

    def innermost(self) -> int:
        if self.waiting:
            return L.COMMUNICATION
        if self.open:
            return self.open[-1].effective
        return L.OTHER if self.begun else L.STARTUP

    def open_since(self) -> float:
        if self.waiting:
            return self.wait_start
        return self.open[-1].start if self.open else self.base_start

    def advance(self, now: float) -> None:
        self.times[self.innermost()] += now - self.since
        self.since = now

    def enter(self, code: int, now: float, token: int) -> None:
        self.advance(now)
        self.waiting = False
        phase = code
        if code in (L.ITERATION, L.WARMUP):
            if not self.begun:
                self.begun = True
                phase = L.WARMUP
            elif code == L.ITERATION:
                phase = L.FORWARD_BACKWARD
        elif code == L.ASYNC_SAVE:
            phase = L.CHECKPOINT_SAVE
        start = now
        if self.open:
            outer = self.open[-1]
            phase = L.effective(outer.effective, phase)
            if phase == outer.effective:
                start = outer.start
        self.open.append(Open(code, phase, token, start))

    def exit(self, index: int, now: float, iteration: int | None) -> None:
        self.advance(now)
        self.waiting = False
        closed = self.open[index]
        del self.open[index:]
        if not self.open and self.begun:
            self.base_start = now
        if closed.code == L.ITERATION:
            self.steps += 1
            if iteration is None:
                iteration = 1 if self.iteration is None else self.iteration + 1
            self.iteration = iteration

    def collective_wait(self, now: float) -> None:
        if self.waiting or not self.open or self.open[-1].effective != L.FORWARD_BACKWARD:
            return
        self.advance(now)
        self.waiting = True
        self.wait_start = now


CODES = [  # the step's phases twice: most phases are inside a step
    L.ITERATION,
    L.FORWARD_BACKWARD,
    L.DATA_LOADING,
    L.FORWARD_BACKWARD,
    L.OPTIMIZER,
    L.COMMUNICATION,
    L.ITERATION,
    L.EVALUATE,
    L.CHECKPOINT_SAVE,
    L.ASYNC_SAVE,
    L.CHECKPOINT_LOAD,
    L.STARTUP,
    L.WARMUP,
]
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("enter"), st.sampled_from(CODES)),
        st.tuples(st.just("exit"), st.integers(0, 5)),  # which open phase, from the innermost
        st.tuples(st.just("step"), st.none()),  # a with-block loop step: enter + exit inside
        st.tuples(st.just("wait"), st.none()),
        st.tuples(st.just("advance"), st.sampled_from([0.0, 0.001, 0.03, 0.06, 0.5])),
    ),
    max_size=60,
)


def check(ledger: L.Ledger, truth: Definition, now: float) -> None:
    reading = ledger.read()
    assert reading.open_phase == L.PHASES[truth.innermost()]
    assert reading.open_s == pytest.approx(now - truth.open_since(), abs=1e-9)
    got = [reading.phase_time_s[name] for name in L.PHASES]
    assert got == pytest.approx(truth.times, abs=1e-9)
    assert (ledger.steps, ledger.iteration) == (truth.steps, truth.iteration)


# DDP's wait, then a phase that would change nothing opens, or one that changed nothing closes:
# either ends the wait.
_WAIT = [("enter", L.ITERATION), ("exit", 0), ("enter", L.ITERATION), ("advance", 0.5)]
_WAIT += [("enter", L.FORWARD_BACKWARD), ("wait", None), ("advance", 0.5)]


@settings(max_examples=400, deadline=None)
@given(OPERATIONS)
@example(_WAIT + [("enter", L.FORWARD_BACKWARD), ("advance", 0.5)])
@example(_WAIT + [("exit", 0), ("advance", 0.5)])
@example(  # the same inside a transfer inside the step: the wait ends in the inner phase's start
    _WAIT[:4]
    + [("enter", L.COMMUNICATION), ("advance", 0.2), ("enter", L.FORWARD_BACKWARD)]
    + [("advance", 0.1), ("enter", L.FORWARD_BACKWARD), ("wait", None), ("advance", 0.3)]
    + [("exit", 0), ("advance", 0.4)]
)
@example(
    _WAIT[:2]
    + [("enter", L.COMMUNICATION), ("enter", L.FORWARD_BACKWARD), ("advance", 0.2)]
    + [("wait", None), ("advance", 0.1)]
)  # forward/backward inside a transfer: its time
def test_any_sequence_of_phases_is_timed_as_the_definition_says(tmp_path_factory, operations):
    """Phase times, the open phase, steps and the last iteration after every operation, with
    the progress record attached (its copies must not change what the ledger says)."""
    fake = LedgerClock()
    ledger = L.Ledger(fake.unix(), perf=fake.perf, unix=fake.unix)
    ledger.record_to(str(tmp_path_factory.mktemp("r") / "ledger-rank0-t.bin"), {"dl.rank": 0})
    truth = Definition(fake.t)
    for what, value in operations:
        if what == "enter":
            truth.enter(value, fake.t, ledger.enter(value))
        elif what == "exit" and truth.open:
            index = max(0, len(truth.open) - 1 - value)
            closed = truth.open[index]
            ledger.exit(closed.token, closed.code)
            truth.exit(index, fake.t, None)
        elif what == "step":  # the phases inside a step, as with blocks
            for code in (L.DATA_LOADING, L.FORWARD_BACKWARD):
                token = ledger.enter(code)
                truth.enter(code, fake.t, token)
                fake.t += 0.01
                ledger.exit(token, code)
                truth.exit(len(truth.open) - 1, fake.t, None)
        elif what == "wait":
            ledger.collective_wait()
            truth.collective_wait(fake.t)
        elif what == "advance":
            fake.t += value
        truth.advance(fake.t)
        check(ledger, truth, fake.t)


def test_a_phase_that_changes_nothing_still_closes_what_opened_after_it():
    """A layer inside forward/backward (no transition) stopped out of order, while a transfer
    opened inside it is still open: the transfer closes with it, as any phase's would."""
    fake = LedgerClock()
    ledger = L.Ledger(fake.unix(), perf=fake.perf, unix=fake.unix)
    step = ledger.enter(L.ITERATION)  # the first: warm-up
    ledger.exit(step, L.ITERATION)
    step = ledger.enter(L.ITERATION)
    layer = ledger.enter(L.FORWARD_BACKWARD)  # the same phase as its step: no transition
    transfer = ledger.enter(L.COMMUNICATION)
    fake.t += 0.2
    assert ledger.read().open_phase == "communication"
    ledger.exit(layer, L.FORWARD_BACKWARD)
    assert ledger.read().open_phase == "forward_backward"
    fake.t += 0.1
    ledger.exit(transfer, L.COMMUNICATION)  # closed already: nothing
    ledger.exit(step, L.ITERATION)
    times = ledger.read().phase_time_s
    assert (times["communication"], times["forward_backward"]) == pytest.approx((0.2, 0.1))
