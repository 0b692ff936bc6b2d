"""Same call, same behaviour, whatever the configuration (issue 15 item 8).

A program drawn by hypothesis drives the public phase API (the phase functions, ``with``,
decorators, :class:`otel_training.SpanRecorder` handles, the handles' methods,
``record_training_metrics``), with exceptions, interruptions and bad arguments, under each
configuration: every group enabled, the default groups, none, every group mirrored to NVTX only,
``OTEL_SDK_DISABLED``, a rank that does not export, and nothing configured yet. What each call
returns or raises, the warnings it gives and everything the health ledger records (on a clock
that ticks once per reading, so that every transition counts) must be the same in all of them;
only what is exported may differ.

The NVTX-only configuration makes NVTX ranges only with a tool attached: without one it is a
configuration of its own (nothing exported); :func:`test_the_same_with_an_nvtx_tool_attached`
runs the comparison again in a child process with the tests' NVTX recorder attached.
"""

from __future__ import annotations

import contextvars
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import nvtx_injection
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry import trace as trace_api
from support import child_env, examples

import otel_training as ot
from otel_training import config, testing
from otel_training.health import ledger as health
from otel_training.phases import NvtxPhase, Phase, SpanPhase
from otel_training.semconv import spans as names
from otel_training.trace.processors import NvtxSpanProcessor

pytestmark = pytest.mark.slow  # hypothesis programs in every configuration, NVTX in a child

#: Exporters off: what is exported is not compared, and no reader reads the ledger meanwhile.
BASE = {
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_TRACES_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
    "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
    "WORLD_SIZE": "2",
}
UNCONFIGURED = None
CONFIGURATIONS: dict[str, dict[str, str] | None] = {
    "all groups": {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all"},
    "default groups": {},
    "no groups": {"OTEL_PYTHON_TRAINING_SPAN_GROUPS": "none"},
    "every group NVTX-only": {
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "all",
        "OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS": ",".join(sorted(config.SPAN_GROUPS)),
    },
    "SDK disabled": {"OTEL_SDK_DISABLED": "true"},
    "rank that does not export": {"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "1", "RANK": "0"},
    "nothing configured yet": UNCONFIGURED,
}
EXAMPLES = examples(int(os.environ.get("PHASES_SAME_BEHAVIOUR_EXAMPLES", "150")))

# -- the programs ----------------------------------------------------------------------------------

iterations = st.one_of(st.none(), st.integers(1, 30))
no_arguments = st.just(((), {}))


def _one(*values: Any) -> st.SearchStrategy:
    return st.sampled_from(values).map(lambda value: ((value,), {}))


CALLS: dict[str, st.SearchStrategy] = {
    "training_run": no_arguments,
    "startup": no_arguments,
    "model_init": no_arguments,
    "dataloader_init": no_arguments,
    "training_iteration": st.tuples(
        st.just(()),
        st.fixed_dictionaries({"iteration": iterations, "record_step_duration": st.booleans()}),
    ),
    "first_iteration": st.tuples(st.just(()), st.fixed_dictionaries({"iteration": iterations})),
    "forward_backward": st.tuples(
        st.just(()),
        st.fixed_dictionaries(
            {"iteration": iterations, "num_microbatches": st.one_of(st.none(), st.integers(1, 8))}
        ),
    ),
    "optimizer_step": st.tuples(st.just(()), st.fixed_dictionaries({"iteration": iterations})),
    "data_loading": st.tuples(st.just(()), st.fixed_dictionaries({"iteration": iterations})),
    "microbatch": _one("forward", "backward", "sideways"),
    "layer": _one("forward", "self_attention", "mlp", "norm"),
    "p2p": _one("send_forward", "recv_forward", "send_backward", "recv_backward", "bcast"),
    "grad_sync": _one("start", "finish", "halfway"),
    "activation_offload": _one("offload", "reload", "swap"),
    "checkpoint_save": st.tuples(
        st.just(("/ckpt",)),
        st.fixed_dictionaries(
            {"iteration": iterations, "strategy": st.sampled_from(["sync", "async"])}
        ),
    ),
    "checkpoint_save_stage": _one("state_dict", "io_write", "finalize", "upload"),
    "checkpoint_load": st.tuples(
        st.just(("/ckpt",)), st.fixed_dictionaries({"iteration": iterations})
    ),
    "checkpoint_load_stage": _one("io_read", "io_write"),
    "evaluation": st.tuples(st.just(()), st.fixed_dictionaries({"iteration": iterations})),
    "evaluation_step": st.tuples(
        st.just(()), st.fixed_dictionaries({"eval_iteration": iterations})
    ),
    "phase": st.tuples(
        st.sampled_from(
            [names.MEGATRON_CHECKPOINT_SAVE, names.MEGATRON_TRAIN_ITERATION, "myproject.preprocess"]
        ).map(lambda name: (name,)),
        st.fixed_dictionaries(
            {"group": st.sampled_from([None, "custom", "step", "evaluate", "nonsense"])}
        ),
    ),
}
calls = st.sampled_from(sorted(CALLS)).flatmap(
    lambda name: CALLS[name].map(lambda arguments: (name, *arguments))
)
#: What leaves a phase: nothing, an error, an interruption, or an exit (0 is not an error).
endings = st.sampled_from(
    [None, "ValueError", "KeyboardInterrupt", "SystemExit(0)", "SystemExit(1)"]
)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(0, 9), max_size=3),
    st.sampled_from([(1, "a"), {"nested": 1}]),
)
metric_keys = st.sampled_from(
    ["loss", "grad_norm", "learning_rate", "step_duration_ms", "skipped_iters", "los"]
)
metric_values = st.one_of(
    st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.just("abc")
)
metrics = st.dictionaries(metric_keys, metric_values, max_size=3)
keys = st.sampled_from(["megatron.skipped", "a.b", "loss", ""])
mappings_or_not = st.one_of(st.dictionaries(keys, values, max_size=3), st.just([1, 2]))

leaves = st.one_of(
    st.tuples(st.just("attr"), keys, values),
    st.tuples(st.just("attrs"), mappings_or_not),
    st.tuples(
        st.just("event"), st.sampled_from(["loss_spike", ""]), st.one_of(st.none(), mappings_or_not)
    ),
    st.tuples(st.just("metrics"), metrics),
    st.tuples(st.just("record"), metrics),
    st.tuples(st.just("error"), endings.filter(lambda ending: ending is not None)),
    st.tuples(st.just("stop"), st.integers(0, 1)),  # this phase, or the one around it
    st.just(("start",)),
)


def programs(depth: int = 0) -> st.SearchStrategy:
    """Lists of operations; ``with``, decorated calls and recorder handles hold programs."""
    if depth >= 3:
        return st.lists(leaves, max_size=3)
    body = st.deferred(lambda: programs(depth + 1))
    phases = st.tuples(
        st.sampled_from(["with", "decorate", "handle"]), calls, endings, st.booleans(), body
    )
    return st.lists(st.one_of(leaves, phases), max_size=5 if depth else 7)


# -- running one program ---------------------------------------------------------------------------


def _exception(ending: str) -> BaseException:
    return {
        "ValueError": lambda: ValueError("bad batch"),
        "KeyboardInterrupt": KeyboardInterrupt,
        "SystemExit(0)": lambda: SystemExit(0),
        "SystemExit(1)": lambda: SystemExit(1),
    }[ending]()


def _described(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"SystemExit({error.code})"
    return type(error).__name__


def _handle(handle: Any) -> tuple:
    """What the contract says of a handle: a Phase, whose span is a Span and is_recording a
    bool (their values are what is exported)."""
    return (
        isinstance(handle, Phase),
        isinstance(handle.span, trace_api.Span),
        type(handle.is_recording) is bool,
    )


class Runner:
    """Runs a program and notes every outcome; counts the kinds of handles it made."""

    def __init__(self) -> None:
        self.notes: list[tuple] = []
        self.kinds: list[type] = []
        self.recorder = ot.SpanRecorder()
        self.open: list[Phase] = []  # the handles around the operation running now

    def run(self, program: list, handle: Phase | None) -> None:
        for operation in program:
            getattr(self, "_" + operation[0])(operation, handle)

    def _call(self, call: tuple) -> Phase:
        name, args, kwargs = call
        phase = getattr(ot, name)(*args, **kwargs)
        self.kinds.append(type(phase))
        self.notes.append(("made", name, _handle(phase)))
        return phase

    def _with(self, operation: tuple, handle: Phase | None) -> None:
        _, call, ending, propagate, body = operation
        phase = self._call(call)
        try:
            with phase as entered:
                self.notes.append(("entered", entered is phase))
                self.open.append(entered)
                try:
                    self.run(body, entered)
                finally:
                    self.open.pop()
                if ending is not None:
                    raise _exception(ending)
        except BaseException as error:  # noqa: BLE001 - KeyboardInterrupt, SystemExit too
            self.notes.append(("left with", _described(error)))
            if propagate:
                raise
        self.notes.append(("after with", _handle(phase)))

    def _decorate(self, operation: tuple, handle: Phase | None) -> None:
        _, call, ending, propagate, body = operation
        decorator = self._call(call)

        def function(x: int) -> int:
            self.run(body, handle)
            if ending is not None:
                raise _exception(ending)
            return 2 * x

        decorated = decorator(function)
        self.notes.append(("decorated", callable(decorated), decorated.__name__))
        try:
            self.notes.append(("returned", decorated(21)))
        except BaseException as error:  # noqa: BLE001
            self.notes.append(("raised", _described(error)))
            if propagate:
                raise

    def _handle(self, operation: tuple, handle: Phase | None) -> None:
        _, (name, args, kwargs), ending, _, body = operation
        started = self.recorder.start_phase(getattr(ot, name), *args, parent=handle, **kwargs)
        self.kinds.append(type(started))
        self.notes.append(("started", name, _handle(started)))
        self.open.append(started)
        try:
            self.run(body, started)
        finally:
            self.open.pop()
            if ending is not None:
                self.recorder.error(started, _exception(ending))
            self.recorder.event(started, "stopping", {"n": 1})
            self.notes.append(("stop", self.recorder.stop(started, {"done": True})))
            self.notes.append(("stop again", self.recorder.stop(started)))

    def _guarded(self, what: str, action) -> None:
        try:
            self.notes.append((what, "returned", action()))
        except Exception as error:
            self.notes.append((what, "raised", _described(error)))

    def _attr(self, operation: tuple, handle: Phase | None) -> None:
        if handle is not None:
            self._guarded("attr", lambda: handle.set_attribute(operation[1], operation[2]))

    def _attrs(self, operation: tuple, handle: Phase | None) -> None:
        if handle is not None:
            self._guarded("attrs", lambda: handle.set_attributes(operation[1]))

    def _event(self, operation: tuple, handle: Phase | None) -> None:
        if handle is not None:
            self._guarded("event", lambda: handle.add_event(operation[1], operation[2]))

    def _metrics(self, operation: tuple, handle: Phase | None) -> None:
        if handle is not None:
            self._guarded("metrics", lambda: handle.record_metrics(**operation[1]))

    def _record(self, operation: tuple, handle: Phase | None) -> None:
        self._guarded("record", lambda: ot.record_training_metrics(ot.get_meter(), **operation[1]))

    def _error(self, operation: tuple, handle: Phase | None) -> None:
        if handle is not None:
            self._guarded("error", lambda: handle.error(_exception(operation[1])))

    def _stop(self, operation: tuple, handle: Phase | None) -> None:
        if len(self.open) > operation[1]:  # stopped early, inside its block (or a nested one)
            self._guarded("stop", self.open[-1 - operation[1]].stop)

    def _start(self, operation: tuple, handle: Phase | None) -> None:
        if handle is not None:
            self._guarded("start", lambda: handle.start() is handle)


class _Ticks:
    """A clock that advances by one at each reading: the ledger's figures then count its
    transitions exactly, whatever time the configurations take."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.name, record.getMessage()))


def run_under(environ: dict[str, str] | None, program: list) -> tuple[dict, Runner]:
    """Runs ``program`` under one configuration; returns what must not differ."""
    testing.reset()
    health.LEDGER.__init__(0.0, perf=_Ticks(), unix=_Ticks())
    logged = _Warnings()
    logger = logging.getLogger("otel_training")
    variables = dict(BASE)
    if environ is UNCONFIGURED:
        patched = mock.patch.dict(os.environ, variables)
    else:
        patched = mock.patch.dict(os.environ, {})
        testing.configure_in_memory({**variables, **environ})
    logger.addHandler(logged)
    runner = Runner()
    left_current: list[bool] = []

    def run() -> None:  # in a context of its own: whatever it leaves current stays there
        try:
            runner.run(program, None)
        except BaseException as error:  # noqa: BLE001
            runner.notes.append(("propagated out", _described(error)))
        left_current.append(trace_api.get_current_span() is not trace_api.INVALID_SPAN)

    try:
        with patched, warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            contextvars.Context().run(run)
    finally:
        logger.removeHandler(logged)
    outcome = {
        "calls": runner.notes,
        "warnings": logged.seen,
        "python warnings": [(w.category.__name__, str(w.message)) for w in warned],
        "ledger": health.LEDGER.read(),
        "ledger open": list(health.LEDGER._stack),
        # Nothing a phase made current is left current (contexts are restored in order).
        "span left current": left_current,
    }
    testing.reset()
    return outcome, runner


def compare(program: list, *, nvtx_tool: bool = False) -> dict[str, list[type]]:
    """Runs ``program`` in every configuration and asserts the outcomes are equal; returns
    the kinds of handles each configuration made."""
    kinds = {}
    reference_name, reference = None, None
    try:
        for name, environ in CONFIGURATIONS.items():
            outcome, runner = run_under(environ, program)
            kinds[name] = runner.kinds
            if reference is None:
                reference_name, reference = name, outcome
                continue
            for key in outcome:
                assert outcome[key] == reference[key], f"{key}: {name} != {reference_name}"
    finally:
        health.LEDGER.__init__()  # the real clocks again
    nvtx_only = kinds["every group NVTX-only"]
    assert SpanPhase not in nvtx_only
    if nvtx_tool:
        spans = sum(kind is SpanPhase for kind in kinds["all groups"])
        assert sum(kind is NvtxPhase for kind in nvtx_only) == spans
    else:
        assert NvtxPhase not in nvtx_only
    return kinds


# One example of everything, always run: nested phases of every path, each ending.
EVERYTHING = [
    (
        "with",
        ("training_run", (), {}),
        None,
        False,
        [
            ("handle", ("training_iteration", (), {"iteration": 1, "record_step_duration": True}),
             None, False, [("metrics", {"loss": 1.0, "los": 2.0}), ("attr", "a.b", 1)]),
            ("with", ("training_iteration", (), {"iteration": 2, "record_step_duration": True}),
             "ValueError", False, [("with", ("microbatch", ("forward",), {}), None, False, [])]),
            ("decorate", ("checkpoint_save", ("/ckpt",), {"iteration": 2}), "SystemExit(0)", False,
             []),
            ("with", ("evaluation", (), {"iteration": 2}), "KeyboardInterrupt", True,
             [("with", ("layer", ("mlp",), {}), "SystemExit(1)", True, [])]),
        ],
    ),
    ("with", ("training_run", (), {}), None, False,
     [("with", ("evaluation", (), {"iteration": 3}), None, False, [("stop", 1)]),
      ("with", ("startup", (), {}), None, False, [])]),
    ("with", ("checkpoint_load", ("/ckpt",), {"iteration": 9}), None, False,
     [("attrs", [1, 2]), ("event", "x", [1, 2]), ("metrics", {"los": 1.0})]),
    ("record", {"loss": "abc", "step_duration_ms": -1.0}),
]  # fmt: skip


@example(program=EVERYTHING)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=programs())
def test_the_same_calls_behave_alike_in_every_configuration(program):
    """Whatever the configuration, every call of the phase API returns, raises and warns the
    same, and the health ledger records the same transitions; only exports differ."""
    compare(program, nvtx_tool=NvtxSpanProcessor().active)


def test_the_same_with_an_nvtx_tool_attached(recorder_library, tmp_path):
    """With the tests' NVTX recorder attached, NVTX-only groups make NVTX ranges (a phase for
    every span of the all-groups run), and still every call behaves the same."""
    output = tmp_path / "nvtx.jsonl"
    env = child_env(nvtx_injection.environment(recorder_library, output))
    env.update(
        NVTX_RECORDER_MODE="buffer",
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path / "telemetry"),
        PHASES_SAME_BEHAVIOUR_EXAMPLES=str(max(10, EXAMPLES // 3)),
    )
    script = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = {[str(Path(__file__).resolve().parents[i]) for i in (0, 1)]!r}
        from otel_training.trace.processors import NvtxSpanProcessor
        assert NvtxSpanProcessor().active, "the recorder is not attached"
        import test_phases_same_behaviour as same
        same.compare(same.EVERYTHING, nvtx_tool=True)
        same.test_the_same_calls_behave_alike_in_every_configuration()
        print("compared")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0 and "compared" in result.stdout, result.stderr[-4000:]
    (summary,) = nvtx_injection.read(output)
    assert summary["op"] == "summary" and summary["events"] > 0


def test_every_phase_function_is_drawn():
    """The programs draw every public phase function: none is left out of the comparison
    (checkpoint_save_completed opens no phase: it completes an asynchronous save)."""
    public = {n for n in ot.spans.__all__ if n not in ("NOOP_PHASE", "Phase", "SpanRecorder")}
    assert public - {"enabled_groups", "checkpoint_save_completed"} == set(CALLS)
    assert all(name in ot.__all__ for name in CALLS)
