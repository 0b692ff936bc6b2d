"""SIGTERM at a random moment into a busy program with no SIGTERM handler of its own (issue 25):
how long it lives on, what it exports, what it records after the signal.

:func:`trial` starts :data:`BUSY` (a tight ``record_training_metrics`` loop inside
``training_run()``, the count of its steps written to a file every 64 steps with an
``os.pwrite``, so a system call every few hundred microseconds), the embedded default or
OTLP/gRPC to a loopback receiver at a 1 s export interval, lets it run for a random 0.3-1.5 s,
reads its count and sends SIGTERM at once. The truth comes from the program's own count (read
here right before the signal, and again once it is dead) and the times taken here (right before
the signal, once it is reaped); the exported count is the step-duration histogram's count in
what reached the file or the receiver.

Used by ``test_signals_no_handler.py`` (a few trials of each exporter) and
``bench/bad_day.py unhandled`` (30 of each, on a quiet and on a loaded machine).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from otlp_receiver import OtlpReceiver
from support import child_env

#: The busy program: no handler of its own. Prints "ready" once its first 1,024 steps are done.
BUSY = textwrap.dedent(
    """
    import os, sys
    import otel_training as ot
    count = os.open(sys.argv[1], os.O_WRONLY)
    meter = ot.get_meter()
    with ot.training_run():
        step = 0
        while True:
            step += 1
            ot.record_training_metrics(meter, step_duration_ms=1.0)
            if step % 64 == 0:
                os.pwrite(count, b"%12d" % step, 0)
                if step == 1024:
                    print("ready", flush=True)
    """
)
STEP_DURATION = "megatron.training.step_duration_ms"
#: OTEL_EXPORTER_OTLP_TIMEOUT of the OTLP trials, in seconds: their bound is this + 1 s.
OTLP_TIMEOUT_S = 1
#: Steps the program may take between the count read here and the signal's delivery (the
#: microseconds of the kill system call; more when this process is descheduled in between on a
#: loaded machine). A program that runs on after the signal takes 100,000 steps a second.
DELIVERY_STEPS = 1024


@dataclass(frozen=True)
class Trial:
    """One SIGTERM into :data:`BUSY`.

    Attributes:
        exporter: "file" (the embedded default) or "otlp" (gRPC to a loopback receiver).
        status: The exit status (``-15``: ended by SIGTERM); ``None`` when it had to be killed.
        seconds: From right before the signal to the reaped exit, in seconds.
        bound_s: The issue's bound: 2 s with the embedded default, the OTLP timeout + 1 s.
        steps_at_signal: The count the program wrote last before the signal.
        steps_at_end: The count the program wrote last of all.
        exported: The step-duration histogram's count that reached the file or the receiver.
        stderr: The program's stderr.
    """

    exporter: str
    status: int | None
    seconds: float
    bound_s: float
    steps_at_signal: int
    steps_at_end: int
    exported: int
    stderr: str

    @property
    def within_bound(self) -> bool:
        """Ended by SIGTERM within the bound."""
        return self.status == -signal.SIGTERM and self.seconds <= self.bound_s

    @property
    def kept_all(self) -> bool:
        """Every step recorded before the signal was exported."""
        return self.exported >= self.steps_at_signal

    @property
    def ran_on(self) -> int:
        """Steps the program wrote after the count read right before the signal."""
        return self.steps_at_end - self.steps_at_signal

    @property
    def stood_still(self) -> bool:
        """No step after the signal (beyond :data:`DELIVERY_STEPS`), none exported that the
        program did not record: a step's record comes before its count is written, so the
        program may have recorded up to 64 steps past the last count it wrote."""
        return self.ran_on <= DELIVERY_STEPS and self.exported <= self.steps_at_end + 64

    @property
    def traceback(self) -> bool:
        """A traceback (the SDK's or any) on stderr."""
        return "Traceback" in self.stderr

    @property
    def ok(self) -> bool:
        """Everything the issue asks of one trial."""
        return self.within_bound and self.kept_all and self.stood_still and not self.traceback


def trial(exporter: str, rng: random.Random, receiver: OtlpReceiver | None = None) -> Trial:
    """Runs one trial with ``exporter`` ("file" or "otlp"; "otlp" needs ``receiver``), the
    delay before the signal drawn from ``rng``; its files go in a
    temporary directory, removed after."""
    with tempfile.TemporaryDirectory(prefix="sigterm-trial-") as directory:
        return _trial(exporter, rng, receiver, Path(directory))


def _trial(exporter: str, rng: random.Random, receiver: OtlpReceiver | None, out: Path) -> Trial:
    count_path = out / "count"
    count_path.write_bytes(b"%12d" % 0)
    env = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out / "telemetry"),
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    bound_s = 2.0
    if exporter == "otlp":
        assert receiver is not None
        receiver.clear()
        # What a killed trial's last periodic export left in flight may arrive late: each
        # trial's points are told apart by a resource attribute of their own.
        env["OTEL_RESOURCE_ATTRIBUTES"] = f"trial.id={out.name}"
        env.update(receiver.env("grpc"), OTEL_EXPORTER_OTLP_TIMEOUT=str(OTLP_TIMEOUT_S))
        bound_s = OTLP_TIMEOUT_S + 1.0
    child = subprocess.Popen(
        [sys.executable, "-c", BUSY, str(count_path)],
        env=child_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    count = os.open(count_path, os.O_RDONLY)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
        time.sleep(rng.uniform(0.3, 1.5))
        steps_at_signal = int(os.pread(count, 12, 0))
        start = time.monotonic()
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=bound_s + 30)
            status: int | None = child.returncode
        except subprocess.TimeoutExpired:
            status = None
        seconds = time.monotonic() - start
        steps_at_end = int(os.pread(count, 12, 0))
    finally:
        os.close(count)
        child.kill()
        child.wait()
    stderr = child.stderr.read()
    if exporter == "otlp":
        assert receiver is not None
        points = receiver.metrics(STEP_DURATION)
        mine = [p for p in points if p.resource_attributes.get("trial.id") == out.name]
        exported = max([p.count or 0 for p in mine] or [0])
    else:
        exported = exported_in_files(out / "telemetry")
    return Trial(
        exporter, status, seconds, bound_s, steps_at_signal, steps_at_end, exported, stderr
    )


def exported_in_files(output_dir: Path) -> int:
    """The largest step-duration histogram count in the embedded default's metrics files
    under ``output_dir`` (cumulative: the last export's)."""
    best = 0
    for path in output_dir.glob("*/metrics-rank*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                document = json.loads(line)
            except ValueError:  # a torn last line
                continue
            for resource in document.get("resourceMetrics", []):
                for scope in resource.get("scopeMetrics", []):
                    for metric in scope.get("metrics", []):
                        if metric["name"] == STEP_DURATION:
                            for point in metric["histogram"]["dataPoints"]:
                                best = max(best, int(point["count"]))
    return best
