"""Every logged value on the report's curves: the ``training_values`` records that
record_training_metrics queues beside the span lines, read back by the report (and the report
of files without them, drawn from the exported points as before)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from report_files import resource_attributes, write_lines
from support import import_or_unavailable

import_or_unavailable("plotly")

import otel_training as ot  # noqa: E402
from otel_training.metrics import instruments  # noqa: E402
from otel_training.report import build_report, figures, load_job, load_run  # noqa: E402
from otel_training.report.reader import load_runs  # noqa: E402
from otel_training.report.rundir import find_run_directory  # noqa: E402
from otel_training.semconv.metrics import (  # noqa: E402
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
)

T0 = 1_796_000_000 * 10**9
S = 10**9


def _train(output: Path, first: int, last: int, every: int = 10, **environ: str) -> Path:
    """A run through the real pipeline: one iteration span and step duration per step, the
    loss and learning rate every ``every`` steps, one metric export at shutdown; its run
    directory."""
    environ = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(output),
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        "OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM": "false",
        **environ,
    }
    telemetry = ot.configure(environ=environ)
    with ot.training_run():
        for step in range(first, last + 1):
            with ot.training_iteration(iteration=step):
                pass
            ot.record_training_metrics(telemetry.meter, step_duration_ms=10.0)
            if step % every == 0:
                ot.record_training_metrics(
                    telemetry.meter, loss=10.0 / step, learning_rate=1e-3 * step
                )
    telemetry.shutdown()
    directory = Path(find_run_directory(output))
    ot.testing.reset()
    return directory


def _page_figures(page: str) -> dict[str, list[dict]]:
    """The traces of every plot embedded in a report page, by the plot's div id."""
    found = {}
    decoder = json.JSONDecoder()
    for match in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        traces, _ = decoder.raw_decode(page, match.end())
        found[match[1]] = traces
    return found


def _loss_traces(page: str) -> list[dict]:
    """The traces of the one loss plot of a page."""
    (traces,) = [t for key, t in _page_figures(page).items() if "curve" in key and "loss" in key]
    return traces


def test_a_214_step_run_logged_every_10_steps_shows_21_loss_points(tmp_path):
    """21 calls with a loss: 21 raw points at steps 10..210 in the page, each the value given,
    though the metrics were exported once (the gauge's last value only)."""
    directory = _train(tmp_path / "telemetry", 1, 214)
    page = build_report(load_job(directory))
    raw, smoothed = _loss_traces(page)
    assert raw["x"] == list(range(10, 211, 10))
    assert all(
        math.isclose(y, 10.0 / s, rel_tol=1e-5) for y, s in zip(raw["y"], range(10, 211, 10))
    )
    assert smoothed["meta"] == {"smooth_of": 0} and len(smoothed["y"]) == 21
    assert smoothed["y"][0] == raw["y"][0]  # debiased: the first smoothed value is the raw one
    assert "data-smoothing" in page and "Every value logged is drawn" in page
    run = load_run(directory)
    gauge_points = sum(len(s.values) for s in run.ranks[0].gauge(MEGATRON_TRAINING_LOSS))
    assert gauge_points == 1  # what the report drew before: one point


def test_a_second_attempt_keeps_its_own_points(tmp_path):
    """Attempt 0 runs steps 1-214, attempt 1 resumes at 201 and runs to 400: each attempt's
    curve holds the values it logged, at their steps, and nothing of the other's."""
    output = tmp_path / "telemetry"
    job = {"OTEL_PYTHON_TRAINING_RUN_ID": "job"}
    first = _train(output, 1, 214, **job, OTEL_PYTHON_TRAINING_RUN_ATTEMPT="0")
    second = _train(output, 201, 400, **job, OTEL_PYTHON_TRAINING_RUN_ATTEMPT="1")
    assert first != second
    steps = {}
    for directory in (first, second):
        run = load_run(directory)
        plots, _ = figures.curve_plots(run, figures.XAxis(run))
        loss = next(p for p in plots if p.title == "Loss")
        steps[directory.name] = list(loss.figure.data[0].x)
    assert steps[first.name] == list(range(10, 211, 10))
    assert steps[second.name] == list(range(210, 401, 10))
    job = load_job(second)
    assert len(job.runs) == 2
    page = build_report(job)
    loss_plots = [t for k, t in _page_figures(page).items() if "curve" in k and "loss" in k]
    assert sorted(len(traces[0]["x"]) for traces in loss_plots) == [20, 21]


def _values_line(step: int, loss: float | str, created: str, time_ns: int) -> str:
    resource = {**resource_attributes(0, 1, "hand"), "process.creation.time": created}
    return json.dumps(
        {
            "record": "training_values",
            "time_ns": time_ns,
            "step": step,
            "values": {MEGATRON_TRAINING_LOSS: loss, MEGATRON_TRAINING_LEARNING_RATE: 0.1},
            "rank": 0,
            "resource": resource,
        }
    )


def test_values_of_a_restarted_process_do_not_collide(tmp_path):
    """Two processes of rank 0 under one run id (a restart that reused it) log steps that
    overlap: the report splits them into two runs, each with its own values."""
    first = [_values_line(s, 1.0, "2026-12-01T00:00:00Z", T0 + s * S) for s in range(10, 101, 10)]
    second = [_values_line(s, 2.0, "2026-12-01T01:00:00Z", T0 + 3600 * S + s * S)
              for s in range(50, 151, 10)]  # fmt: skip
    write_lines(tmp_path / "spans-rank0.jsonl", first + second)
    runs = load_runs(tmp_path)
    assert len(runs) == 2
    logged = [r.ranks[0].logged[MEGATRON_TRAINING_LOSS] for r in runs]
    assert [[step for step, _, _ in points] for points in logged] == [
        list(range(10, 101, 10)),
        list(range(50, 151, 10)),
    ]
    assert {v for _, _, v in logged[0]} == {1.0} and {v for _, _, v in logged[1]} == {2.0}


def test_a_torn_last_record_of_a_killed_process_is_skipped(tmp_path):
    """A process killed while it wrote leaves half a line: the whole records are read, the
    torn one is skipped with a note, nothing raises; NaN stays a value."""
    created = "2026-12-01T00:00:00Z"
    lines = [_values_line(s, 5.0 / s, created, T0 + s * S) for s in range(10, 51, 10)]
    lines.append(_values_line(60, "NaN", created, T0 + 60 * S))
    torn = _values_line(70, 0.07, created, T0 + 70 * S)[:40]
    write_lines(tmp_path / "spans-rank0.jsonl", lines, torn_tail=torn)
    run = load_run(tmp_path)
    points = run.ranks[0].logged[MEGATRON_TRAINING_LOSS]
    assert [step for step, _, _ in points] == [10, 20, 30, 40, 50, 60]
    assert math.isnan(points[-1][2])
    assert any(f.torn_last_line for f in run.files)
    build_report(run)  # the page is made from what was read


def test_files_without_records_draw_the_exported_points(tmp_path):
    """OTLP only (no span lines): no record is made at all; a run directory of an older
    version (metrics, no records) draws its curves from the exported points as before."""
    ot.configure(environ={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
                          "OTEL_LOGS_EXPORTER": "none"})  # fmt: skip
    assert instruments._values_sink is None
    ot.testing.reset()
    directory = _train(tmp_path / "telemetry", 1, 50)
    spans = directory / "spans-rank0.jsonl"
    kept = [line for line in spans.read_text().splitlines() if "training_values" not in line]
    spans.write_text("\n".join(kept) + "\n")
    run = load_run(directory)
    assert run.ranks[0].logged == {}
    plots, _ = figures.curve_plots(run, figures.XAxis(run))
    loss = next(p for p in plots if p.title == "Loss")
    assert list(loss.figure.data[0].x) == [50]  # the one export, at the step it describes
    assert "Every value logged" not in build_report(run)


def test_a_record_keeps_values_of_the_slow_path(tmp_path):
    """Values that are not plain floats (a numpy scalar, a string, NaN) reach the record as
    numbers; a call with only a step duration or only skipped iterations makes none."""
    np = import_or_unavailable("numpy")
    directory = tmp_path / "telemetry"
    telemetry = ot.configure(environ={"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(directory)})
    ot.record_training_metrics(telemetry.meter, step_duration_ms=5.0)
    ot.record_training_metrics(telemetry.meter, skipped_iters=2)
    ot.record_training_metrics(
        telemetry.meter, loss=np.float32(0.5), grad_norm="1.5", learning_rate=math.nan
    )
    telemetry.shutdown()
    spans = Path(find_run_directory(directory)) / "spans-rank0.jsonl"
    records = [json.loads(line) for line in spans.read_text().splitlines()
               if '"training_values"' in line]  # fmt: skip
    assert len(records) == 1
    assert records[0]["step"] == 1  # one step duration recorded so far
    assert records[0]["values"] == {
        MEGATRON_TRAINING_LOSS: 0.5,
        "megatron.training.grad_norm": 1.5,
        MEGATRON_TRAINING_LEARNING_RATE: "NaN",
    }
