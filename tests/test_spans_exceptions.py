"""Exceptions inside phases (case A15): recorded as themselves, propagated unchanged."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import otel_training as ot
from otel_training import configuration as setup


class LazyMessage(Exception):
    """An exception whose __str__ raises, as wrappers of CUDA or NCCL errors may."""

    def __str__(self) -> str:
        raise RuntimeError("the message is not available")


@ot.checkpoint_save(strategy="async")
def save_async() -> None:
    raise ValueError("async save failed")


def test_case_a15_exceptions_are_recorded_and_propagate_unchanged(tmp_path):
    """Case A15: every exception propagates as itself; each span is ERROR and names its type,
    SystemExit(0) is not an error, a chained stack trace keeps its cause, a span errored on
    another thread is ERROR, and the next phase records normally."""
    telemetry = setup.configure(
        environ={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path), "OTEL_METRICS_EXPORTER": "none"}
    )
    lazy = LazyMessage()
    with pytest.raises(LazyMessage) as raised:
        with ot.checkpoint_save("/ckpt/a"):
            raise lazy
    assert raised.value is lazy
    with pytest.raises(SystemExit) as three:
        with ot.phase("job.exit_three"):
            raise SystemExit(3)
    assert three.value.code == 3
    with pytest.raises(SystemExit):
        with ot.phase("job.exit_zero"):
            raise SystemExit(0)
    with pytest.raises(RuntimeError) as chained:
        with ot.evaluation(iteration=1):
            try:
                raise OSError("disk quota exceeded")
            except OSError as cause:
                raise RuntimeError("evaluation failed") from cause
    assert isinstance(chained.value.__cause__, OSError)
    with pytest.raises(ValueError):
        save_async()
    recorder = ot.SpanRecorder()
    handle = recorder.start("job.cross_thread")

    def fail_elsewhere() -> None:
        try:
            raise KeyError("elsewhere")
        except KeyError as error:
            recorder.error(handle, error)
        recorder.stop(handle)

    worker = threading.Thread(target=fail_elsewhere)
    worker.start()
    worker.join()
    with ot.phase("job.after"):
        pass
    assert telemetry.shutdown()

    lines = Path(telemetry.output_dir, "spans-rank0.jsonl").read_text().splitlines()
    ends = [json.loads(line) for line in lines if '"span_end"' in line]
    by_name: dict[str, list[dict]] = {}
    for end in ends:
        by_name.setdefault(end["name"], []).append(end)

    def only(name: str) -> dict:
        (end,) = by_name[name]
        return end

    def exception_event(end: dict) -> dict:
        (event,) = [e for e in end["events"] if e["name"] == "exception"]
        return event["attributes"]

    saves = by_name["megatron.checkpoint.save"]
    lazy_save = next(e for e in saves if e["attributes"].get("megatron.checkpoint.path"))
    assert lazy_save["status"] == "ERROR"
    assert lazy_save["attributes"]["error.type"].endswith("LazyMessage")
    assert exception_event(lazy_save)["exception.type"].endswith("LazyMessage")
    assert "str() of LazyMessage failed" in exception_event(lazy_save)["exception.message"]

    assert only("job.exit_three")["status"] == "ERROR"
    assert only("job.exit_zero")["status"] == "UNSET"
    evaluation = exception_event(only("megatron.evaluate"))
    assert "OSError: disk quota exceeded" in evaluation["exception.stacktrace"]
    assert "direct cause" in evaluation["exception.stacktrace"]

    async_save = next(
        e for e in saves if e["attributes"]["megatron.checkpoint.strategy"] == "async"
    )
    assert async_save["status"] == "ERROR"
    assert exception_event(async_save)["exception.type"] == "ValueError"
    cross = only("job.cross_thread")
    assert cross["status"] == "ERROR" and exception_event(cross)["exception.type"] == "KeyError"
    after = only("job.after")
    assert after["status"] == "UNSET" and after["events"] == []
