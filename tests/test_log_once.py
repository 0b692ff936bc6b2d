"""The once-only and rate-limited log lines of the package (otel_training._log_once)."""

from __future__ import annotations

import ast
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support import fork_or_unavailable

from otel_training import _log_once, testing
from otel_training._log_once import MINUTE_S, LogOnce

_SRC = Path(__file__).resolve().parents[1] / "src" / "otel_training"


def _lines(caplog, name: str = "test.once") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_each_cause_is_said_once_on_its_logger_at_its_level(caplog):
    """The first call of a cause logs message % args on the helper's logger at its level; a
    later call of that cause logs nothing; another cause logs its own line."""
    once = LogOnce("test.once", level=logging.INFO)
    with caplog.at_level(logging.INFO, logger="test.once"):
        assert once("a", "first %s", "a")
        assert not once("a", "again %s", "a")
        assert once(("b", TypeError), "first %s", "b")
    assert _lines(caplog) == ["first a", "first b"]
    assert {r.levelno for r in caplog.records} == {logging.INFO}


def test_exc_info_is_the_helpers_default_unless_a_call_says(caplog):
    """A helper made with exc_info=True carries the exception being handled; a call with
    exc_info=False does not."""
    once = LogOnce("test.once", exc_info=True)
    with caplog.at_level(logging.WARNING, logger="test.once"):
        try:
            raise ValueError("boom")
        except ValueError:
            once("with", "with the exception")
            once("without", "without it", exc_info=False)
    with_it, without = caplog.records
    assert with_it.exc_info is not None and with_it.exc_info[0] is ValueError
    assert not without.exc_info


def test_an_interval_says_a_cause_again_once_it_has_passed(caplog, monkeypatch):
    """With interval_s, a cause is said again once its last line is interval_s old, never
    sooner (the clock is the module's, set by the test: no waiting)."""
    clock = [1000.0]
    monkeypatch.setattr(_log_once, "_now", lambda: clock[0])
    once = LogOnce("test.once", interval_s=MINUTE_S)
    with caplog.at_level(logging.WARNING, logger="test.once"):
        said = []
        for seconds in (0, 1, 59.9, 60, 61, 119.9, 120):
            clock[0] = 1000.0 + seconds
            said.append(once("cause", "at %s", seconds))
    assert said == [True, False, False, True, False, False, True]
    assert _lines(caplog) == ["at 0", "at 60", "at 120"]
    assert MINUTE_S == 60.0  # case A1: each distinct failure at most once per minute


def test_say_uses_the_text_as_its_own_cause(caplog):
    """say() logs each distinct text once: the same message with other values is said again."""
    once = LogOnce("test.once")
    with caplog.at_level(logging.WARNING, logger="test.once"):
        once.say("bad value %r", 1)
        once.say("bad value %r", 1)
        once.say("bad value %r", 2)
        once.say("100% wrong")  # no arguments: the message is the text, unformatted
        once.say("odd %d", "not a number")  # a format that does not fit: said, never raised
    assert _lines(caplog) == [
        "bad value 1",
        "bad value 2",
        "100% wrong",
        "odd %d ('not a number',)",
    ]


def test_an_unhashable_cause_is_said_once_and_never_raises(caplog):
    """A cause that cannot be hashed (a list) counts by its repr."""
    once = LogOnce("test.once")
    with caplog.at_level(logging.WARNING, logger="test.once"):
        assert once(["a"], "list")
        assert not once(["a"], "list")
    assert _lines(caplog) == ["list"]


def test_the_causes_remembered_are_bounded_oldest_first(caplog):
    """Past max_causes, the oldest cause is forgotten (said again), the newest are kept."""
    once = LogOnce("test.once", max_causes=3)
    with caplog.at_level(logging.WARNING, logger="test.once"):
        for cause in "abcd":
            once(cause, cause)
        assert not once("d", "d") and not once("c", "c")
        assert once("a", "a again")
    assert _lines(caplog) == ["a", "b", "c", "d", "a again"]


def test_many_threads_say_a_cause_exactly_once(caplog):
    """Sixteen threads giving the same causes at the same moment log each cause once."""
    once = LogOnce("test.once")
    start = threading.Barrier(16)

    def run() -> None:
        start.wait()
        for index in range(200):
            once(index % 20, "cause %d", index % 20)

    with caplog.at_level(logging.WARNING, logger="test.once"), ThreadPoolExecutor(16) as pool:
        for future in [pool.submit(run) for _ in range(16)]:
            future.result()
    assert sorted(_lines(caplog)) == sorted(f"cause {i}" for i in range(20))


def test_a_forked_child_says_a_new_cause_although_the_lock_was_held_at_fork():
    """A lock held (by another thread) when the process forks does not deadlock the child: it
    says a new cause and keeps what the parent said."""
    fork_or_unavailable()
    once = LogOnce("test.once")
    once("parent", "said in the parent")
    read, write = os.pipe()
    with once._lock:  # as if another thread were writing a cause at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            answer = b"%d%d" % (once("child", "new in the child"), once("parent", "again"))
            os.write(write, answer)
            os._exit(0)
    os.close(write)
    try:
        # Bounded: a deadlocked child is killed and the test fails (no wall-clock assertion).
        timer = threading.Timer(60, os.kill, (pid, 9))
        timer.start()
        _, status = os.waitpid(pid, 0)
        timer.cancel()
        answer = os.read(read, 16)
    finally:
        os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == b"10"  # the new cause said, the parent's not again


def test_testing_reset_forgets_every_helpers_causes(caplog):
    """otel_training.testing.reset() makes every helper, the package's own included, say each
    cause again."""
    from otel_training.integrations import _recorder

    once = LogOnce("test.once")
    with caplog.at_level(logging.WARNING):
        once("a", "a")
        _recorder.warn_once("test-cause", "integrations line")
        testing.reset()
        once("a", "a")
        _recorder.warn_once("test-cause", "integrations line")
    assert [r.getMessage() for r in caplog.records if "a" == r.getMessage()] == ["a", "a"]
    lines = [r for r in caplog.records if r.getMessage() == "integrations line"]
    assert [r.name for r in lines] == ["otel_training.integrations"] * 2


# -- one helper for the package --------------------------------------------------------------


def _marked(test: ast.expr) -> str | None:
    """What a once-only test reads: ``x`` of ``not x``, ``s`` of ``k in s`` / ``k not in s``."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.unparse(test.operand)
    if isinstance(test, ast.Compare) and isinstance(test.ops[0], (ast.In, ast.NotIn)):
        return ast.unparse(test.comparators[0])
    return None


def _marks(nodes: list[ast.stmt], name: str) -> bool:
    """Sets ``name = True`` or calls ``name.add(...)``."""
    tree = ast.Module(body=nodes, type_ignores=[])
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value:
            if any(ast.unparse(target) == name for target in n.targets):
                return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add":
            if ast.unparse(n.func.value) == name:
                return True
    return False


def _logs(nodes: list[ast.stmt]) -> bool:
    """Logs a line a person reads (debug lines left out)."""
    tree = ast.Module(body=nodes, type_ignores=[])
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("warning", "info", "error", "log", "exception")
        for n in ast.walk(tree)
    )


def _unconditional(statements: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run whenever ``statements`` run: into ``with`` and ``try`` bodies,
    not into branches, loops, handlers or nested functions."""
    found = []
    for statement in statements:
        if isinstance(statement, ast.With | ast.Try):
            found += _unconditional(statement.body)
        elif not isinstance(statement, ast.If | ast.For | ast.While | ast.FunctionDef):
            found.append(statement)
    return found


def _marks_and_logs_together(function: ast.FunctionDef, name: str) -> bool:
    """``function`` marks ``name`` and logs unconditionally after its early return (a log in
    a branch on another condition is no once-only line)."""
    return _marks(function.body, name) and _logs(_unconditional(function.body))


def _said_flags(tree: ast.AST) -> list[int]:
    """Lines of the shapes of a once-only warning written by hand: ``if not x: x = True;
    log``, ``if k not in s: s.add(k); log``, or an early ``if k in s: return`` in a function
    that then adds ``k`` to ``s`` and logs."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (name := _marked(node.test)):
            if _marks(node.body, name) and _logs(node.body):
                found.append(node.lineno)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(node):
                if (
                    isinstance(n, ast.If)
                    and (name := _marked(n.test))
                    and len(n.body) == 1
                    and isinstance(n.body[0], ast.Return)
                    and _marks_and_logs_together(node, name)
                ):
                    found.append(n.lineno)
    return sorted(set(found))


def test_no_module_writes_its_own_once_only_warning():
    """Every once-only or rate-limited line goes through LogOnce: no module of the package
    keeps its own flag or set of causes beside a log call (shown to fail on the copies this
    replaced)."""
    copies = {
        str(path.relative_to(_SRC)): lines
        for path in sorted(_SRC.rglob("*.py"))
        if path.name != "_log_once.py"
        and (lines := _said_flags(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert copies == {}


def test_the_once_only_shape_is_recognised():
    """The check above finds the hand-written shapes (a flag, a set of causes, an early
    return) and leaves a plain conditional warning alone."""
    flag = "if not self._warned:\n    self._warned = True\n    _logger.warning('x')\n"
    causes = "if cause not in _warned:\n    _warned.add(cause)\n    _logger.warning('x')\n"
    early = (
        "def warn(cause):\n    if cause in _warned:\n        return\n"
        "    _warned.add(cause)\n    _logger.warning('x')\n"
    )
    plain = "if not ok:\n    _logger.warning('x')\n"
    other_branch = (  # a set that gates reads, and a warning in a branch of its own
        "def get(field):\n    if field in _unsupported:\n        return None\n"
        "    if lost:\n        _logger.warning('x')\n    _unsupported.add(field)\n"
    )
    assert _said_flags(ast.parse(flag)) == [1]
    assert _said_flags(ast.parse(causes)) == [1]
    assert _said_flags(ast.parse(early)) == [2]
    assert _said_flags(ast.parse(plain)) == []
    assert _said_flags(ast.parse(other_branch)) == []


class _FailingSource:
    """A device source and a ledger whose every read raises."""

    def read(self):
        raise OSError("the read failed")


def test_a_read_that_fails_at_every_collection_is_said_once_a_minute(caplog, in_memory_meter):
    """Case A1: a device read and a ledger read that fail at every collection of the reader's
    thread log one line each, not one per collection (the clock stands still)."""

    from otel_training.health.metrics import observe_ledger
    from otel_training.metrics.device import DeviceMetrics

    devices = DeviceMetrics(in_memory_meter.meter, _FailingSource(), min_interval_s=0.0)
    observe_ledger(in_memory_meter.meter, source=_FailingSource)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            in_memory_meter.reader.get_metrics_data()
    assert devices.reads >= 5
    lines = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert sorted(lines) == [
        "device metrics: reading the devices failed",
        "reading the health ledger failed",
    ]
