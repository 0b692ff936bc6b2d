"""SIGKILL in the middle of training: what is on disk parses, what was exported stays, and the
next process of the run starts on a fresh line behind the torn tail."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from support import child_env

from otel_training import config
from otel_training.testing import parse_otlp_json

# Trains (spans only) until iterations 1..40 are in the traces file by the batch processor's
# own schedule (no flush), in two exports at least, says so, and keeps training until it is killed.
TRAIN = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import otel_training as ot
    telemetry = ot.configure()
    traces = Path(telemetry.output_dir) / "traces-rank0.jsonl"

    def exported():
        found = set()
        text = traces.read_text() if traces.exists() else ""
        if len(text.splitlines()) < 2:  # two exports at least: one line to keep, one to tear
            return found
        for line in text.splitlines():
            try:
                document = json.loads(line)
            except ValueError:
                continue
            for resource in document["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    for span in scope["spans"]:
                        for a in span.get("attributes", ()):
                            if a["key"] == "megatron.iteration":
                                found.add(int(a["value"]["intValue"]))
        return found

    step = 0
    with ot.training_run():
        while True:
            step += 1
            with ot.training_iteration(iteration=step):
                with ot.optimizer_step(iteration=step):
                    pass
            if step >= 40 and step % 20 == 0 and set(range(1, 41)) <= exported():
                print(json.dumps({"run_dir": telemetry.output_dir}), flush=True)
                break
        while True:  # killed in here, with spans queued and written
            step += 1
            with ot.training_iteration(iteration=step, payload="x" * 2000):
                pass
    """
)

# The next process of the same run (a restart): a few iterations, then a normal shutdown.
RESTART = textwrap.dedent(
    """
    import otel_training as ot
    telemetry = ot.configure()
    with ot.training_run():
        for step in range(1001, 1006):
            with ot.training_iteration(iteration=step):
                pass
    assert telemetry.shutdown()
    """
)


def _env(output_dir: Path) -> dict[str, str]:
    return child_env(
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(output_dir),
        OTEL_PYTHON_TRAINING_RUN_ID="killed-run",
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="per_step",
    )


def _iterations(lines: list[bytes]) -> tuple[set[int], list[int]]:
    """Iteration numbers of the spans in the lines that parse, and the indices of the lines
    that do not."""
    found, broken = set(), []
    for index, line in enumerate(lines):
        try:
            request = parse_otlp_json(line.decode(), ExportTraceServiceRequest())
        except Exception:
            broken.append(index)
            continue
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    for attribute in span.attributes:
                        if attribute.key == "megatron.iteration":
                            found.add(attribute.value.int_value)
    return found, broken


def test_a_killed_run_keeps_what_was_exported_and_its_restart_starts_on_a_fresh_line(tmp_path):
    """After SIGKILL every line but a torn last one parses and the iterations exported before
    it are there; a restart of the run appends whole lines after the torn tail."""
    env = _env(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", TRAIN], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        line = child.stdout.readline()
        assert line, child.stderr.read().decode()[-3000:]
        run_dir = Path(json.loads(line)["run_dir"])
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    traces = run_dir / "traces-rank0.jsonl"
    killed_lines = traces.read_bytes().splitlines()
    found, broken = _iterations(killed_lines)
    assert set(range(1, 41)) <= found
    assert broken in ([], [len(killed_lines) - 1])  # at most the line being written

    # What a kill in the middle of a write leaves, whenever this one landed: a torn last line.
    whole = traces.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)
    kept = whole[0] + b"\n" if len(whole) == 2 else b""
    torn = kept + whole[-1][: len(whole[-1]) // 2]
    traces.write_bytes(torn)
    found_kept, _ = _iterations(kept.splitlines())
    assert found_kept  # the first export's line, whole

    restart = subprocess.run(
        [sys.executable, "-c", RESTART], env=env, capture_output=True, text=True, timeout=120
    )
    assert restart.returncode == 0, restart.stderr[-3000:]
    after = traces.read_bytes()
    assert after.startswith(torn + b"\n")  # the restart's first line is a line of its own
    lines = after.splitlines()
    found_after, broken_after = _iterations(lines)
    assert broken_after == [len(kept.splitlines())]  # only the torn line
    assert found_after == found_kept | set(range(1001, 1006))


def test_the_traces_file_loses_no_more_than_the_metrics_file_on_a_kill():
    """The embedded default exports spans at least as often as metrics, so a SIGKILL loses at
    most one metric export interval of spans too."""
    settings = config.load({})
    assert settings.bsp_schedule_delay_ms is None  # the embedded default's own delay applies
    assert config.DEFAULT_FILE_BSP_SCHEDULE_DELAY_MS <= settings.file_metric_export_interval_ms
