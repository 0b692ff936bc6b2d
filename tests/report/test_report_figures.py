"""A report that answers at a glance (report/figures.py, heatmaps.py, timeline.py, steps.py):
the plotly figures themselves inspected: axis titles with units, titled colour bars on one
scale per family over the job, constants drawn as constants, a colour per span group, labelled
timeline rows, and training values at the steps they describe on every rank."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from report_files import (  # noqa: E402
    gauge,
    metrics_line,
    span_lines,
    write_ledger_metrics,
    write_lines,
)
from support import import_or_unavailable

import_or_unavailable("plotly")

from otel_training.report import build_report, figures, heatmaps, load_job, load_run  # noqa: E402
from otel_training.report.run import Job  # noqa: E402
from otel_training.report.steps import SOURCE_PROGRESS  # noqa: E402
from otel_training.report.style import group_color  # noqa: E402
from otel_training.semconv.attributes import (  # noqa: E402
    MEGATRON_TRAINING_LAYER,
    MEGATRON_TRAINING_ROUTER_STATISTIC,
)
from otel_training.semconv.metrics import (  # noqa: E402
    MEGATRON_TRAINING_LEARNING_RATE,
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
)
from otel_training.semconv.spans import (  # noqa: E402
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_ITERATION,
    MEGATRON_TRAIN_ITERATION_DATA_LOADING,
    MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
    MEGATRON_TRAIN_ITERATION_OPTIMIZER,
)

T0 = 1_796_000_000 * 10**9
S = 10**9
LOGGED = [10, 20, 30, 40]


def _values(step: int) -> dict:
    """What both ranks log at ``step``: the loss averaged over the ranks, the schedule."""
    return {
        "loss": 10.0 / step,
        "learning_rate": 1e-3 * (1 - step / 100),
        "grad_norm": 1.0 + step % 7,
        "tokens_per_sec": 1000.0 + step,
        "throughput_tflops": 0.5,
        "memory_allocated_gb": 2.0 + step / 100,
    }


def _two_ranks(directory: Path) -> None:
    """Two ranks log at steps 10, 20, 30, 40 and export at different steps (7, 14... and 9,
    18...), as two processes' periodic readers do."""
    for rank, every in ((0, 7), (1, 9)):
        write_ledger_metrics(
            directory / f"metrics-rank{rank}.jsonl",
            steps=40,
            log_every=10,
            export_at=range(every, 41, every),
            values=_values,
            rank=rank,
            world_size=2,
        )


def test_ranks_that_logged_alike_draw_one_line_at_the_logged_steps(tmp_path):
    """Both ranks' loss and learning rate are at steps 10-40 (what they describe), identical,
    so one line; without the logged step they would sit at each rank's export steps."""
    _two_ranks(tmp_path)
    run = load_run(tmp_path)
    axis = figures.XAxis(run)
    assert axis.source == SOURCE_PROGRESS
    reached = {rank: axis.xs(rank, run.ranks[rank].gauge(MEGATRON_TRAINING_LOSS)[0].times_ns)
               for rank in (0, 1)}  # fmt: skip
    assert reached[0] != reached[1]  # the steps reached at the exports differ between ranks
    plots, _ = figures.curve_plots(run, axis)
    by_name = {p.id.removeprefix("plot-curve-"): p for p in plots}
    for name in (MEGATRON_TRAINING_LOSS, MEGATRON_TRAINING_LEARNING_RATE):
        assert all(list(t.x) == LOGGED for t in by_name[name].figure.data), name
        names = {t.name.removesuffix(" (raw)") for t in by_name[name].figure.data}
        assert names == {"ranks 0, 1"}, names
    loss = by_name[MEGATRON_TRAINING_LOSS].figure.data[0]
    assert list(loss.y) == pytest.approx([10.0 / s for s in LOGGED], rel=1e-5)
    assert figures.curves_exact(run, axis)
    assert "at the step it describes" in axis.lead(True)


def test_ranks_that_each_missed_a_logged_value_still_draw_one_line_with_all(tmp_path):
    """Two values logged within one export interval: the gauge exports only the later one,
    a different one on each rank (rank 0 misses step 20, rank 1 step 10); the ranks agree
    where both have a value, so one line holds every step either exported."""
    for rank, exports in ((0, [12, 32]), (1, [22, 38])):
        write_ledger_metrics(
            tmp_path / f"metrics-rank{rank}.jsonl", steps=40, log_every=10, export_at=exports,
            values=_values, rank=rank, world_size=2,
        )  # fmt: skip
    run = load_run(tmp_path)
    axis = figures.XAxis(run)
    per_rank = {r: axis.value_points(r, *_gauge_points(run, r))[:2] for r in (0, 1)}
    assert per_rank[0][0] == [10, 30, 40] and per_rank[1][0] == [20, 30, 40]
    plots, _ = figures.curve_plots(run, axis)
    loss = plots[0].figure.data
    assert [t.name for t in loss] == ["ranks 0, 1 (raw)", "ranks 0, 1"]
    assert list(loss[0].x) == LOGGED


def _gauge_points(run, rank, name=MEGATRON_TRAINING_LOSS):
    series = run.ranks[rank].gauge(name)[0]
    return series.times_ns, series.values


def test_values_that_differ_by_rank_keep_a_line_each_at_the_same_steps(tmp_path):
    """Tokens/s differs by rank: one line each, both at the logged steps."""
    for rank, every in ((0, 6), (1, 11)):
        write_ledger_metrics(
            tmp_path / f"metrics-rank{rank}.jsonl", steps=40, log_every=10,
            export_at=range(every, 41, every), rank=rank, world_size=2,
            values=lambda step, rank=rank: {"tokens_per_sec": 1000.0 * (rank + 1) + step},
        )  # fmt: skip
    run = load_run(tmp_path)
    plots, _ = figures.curve_plots(run, figures.XAxis(run))
    traces = [t for t in plots[0].figure.data if t.name.endswith("(raw)")]
    assert [t.name for t in traces] == ["rank 0 (raw)", "rank 1 (raw)"]
    assert all(list(t.x) == LOGGED for t in traces)


def _tensor_line(rank: int, values: dict[str, list[float]], statistic_values=None) -> str:
    points = [
        (T0 + t * S, v, {MEGATRON_TRAINING_LAYER: layer})
        for layer, series in values.items()
        for t, v in enumerate(series)
    ]
    metrics = [gauge(MEGATRON_TRAINING_TENSOR_GRAD_NORM, points)]
    if statistic_values is not None:
        metrics.append(
            gauge(
                MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
                [
                    (
                        T0 + t * S,
                        v,
                        {
                            MEGATRON_TRAINING_LAYER: "decoder.layers.0",
                            MEGATRON_TRAINING_ROUTER_STATISTIC: "dead_fraction",
                        },
                    )
                    for t, v in enumerate(statistic_values)
                ],
            )  # fmt: skip
        )
    return metrics_line(rank, metrics, world_size=1)


def _full_run(directory: Path) -> None:
    """Every kind of plot: curves and step durations (real exports with the ledger), tensor
    heatmaps, spans of four groups."""
    write_ledger_metrics(
        directory / "metrics-rank0.jsonl", steps=40, log_every=10,
        export_at=range(5, 41, 5), values=_values,
    )  # fmt: skip
    with open(directory / "metrics-rank0.jsonl", "a", encoding="utf-8") as handle:
        handle.write(
            _tensor_line(0, {"decoder.layers.0": [1.0, 2.0], "decoder.layers.1": [3.0, 4.0]},
                         [0.0, 0.0]) + "\n"
        )  # fmt: skip
    root = "f" * 16
    lines = span_lines(MEGATRON_TRAIN, root, None, T0, T0 + 100 * S, world_size=1)
    for step in range(1, 6):
        parent = f"{step:016x}"
        start = T0 + step * 10 * S
        lines += span_lines(MEGATRON_TRAIN_ITERATION, parent, root, start, start + 8 * S,
                            attributes={"megatron.iteration": step}, world_size=1)  # fmt: skip
        for k, name in enumerate((MEGATRON_TRAIN_ITERATION_DATA_LOADING,
                                  MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD,
                                  MEGATRON_TRAIN_ITERATION_OPTIMIZER)):  # fmt: skip
            lines += span_lines(name, f"{step:08x}{k + 1:08x}", parent, start + k * 2 * S,
                                start + (k * 2 + 1) * S, world_size=1)  # fmt: skip
    lines += span_lines(MEGATRON_CHECKPOINT_SAVE, "c" * 16, root, T0 + 70 * S, T0 + 75 * S,
                        world_size=1)  # fmt: skip
    write_lines(directory / "spans-rank0.jsonl", lines)


def _all_plots(run):
    axis = figures.XAxis(run)
    curves, _ = figures.curve_plots(run, axis)
    timeline, _ = figures.timeline_plot(run)
    return [
        *curves,
        *figures.step_duration_plots(run, axis),
        *figures.tensor_heatmaps(run, axis),
        timeline,
    ]


def test_every_plot_has_both_axis_titles_and_the_units_of_its_quantity(tmp_path):
    """Each figure names its x and y axes; a quantity with a unit says it; every colour bar
    has a title."""
    _full_run(tmp_path)
    plots = _all_plots(load_run(tmp_path))
    assert len(plots) >= 11
    for plot in plots:
        layout = plot.figure.layout
        assert layout.xaxis.title.text and layout.yaxis.title.text, plot.id
        for trace in plot.figure.data:
            if trace.type == "heatmap":
                assert trace.colorbar.title.text, plot.id
    titles = {p.id: (p.figure.layout.xaxis.title.text, p.figure.layout.yaxis.title.text)
              for p in plots}  # fmt: skip
    assert titles["plot-curve-megatron.training.tokens_per_sec"][1] == "tokens/s"
    assert "TFLOP/s" in titles["plot-curve-megatron.training.throughput_tflops"][1]
    assert "(GiB)" in titles["plot-curve-megatron.training.memory_allocated_gb"][1]
    assert titles["plot-step-duration-quantiles"] == (figures.STEP_AXIS, "step duration (ms)")
    assert "(ms)" in titles["plot-step-duration-histogram"][0]
    assert titles["plot-timeline"][0] == "seconds since the first span"


def test_a_constant_is_drawn_as_a_constant(tmp_path):
    """A learning rate of 0 throughout: a y axis from 0 with 0 ticked, not -1..1; a router
    statistic that is 0 everywhere: one colour bar tick '0 (every value)', from 0 up."""
    write_ledger_metrics(
        tmp_path / "metrics-rank0.jsonl", steps=20, log_every=5, export_at=range(3, 21, 3),
        values=lambda step: {"learning_rate": 0.0, "loss": 5.0},
    )  # fmt: skip
    with open(tmp_path / "metrics-rank0.jsonl", "a", encoding="utf-8") as handle:
        handle.write(_tensor_line(0, {"decoder.layers.0": [1.0, 2.0]}, [0.0, 0.0, 0.0]) + "\n")
    run = load_run(tmp_path)
    axis = figures.XAxis(run)
    plots = {p.id.removeprefix("plot-curve-"): p for p in figures.curve_plots(run, axis)[0]}
    lr = plots[MEGATRON_TRAINING_LEARNING_RATE].figure.layout.yaxis
    assert list(lr.range) == [0, 1] and list(lr.tickvals) == [0]
    loss = plots[MEGATRON_TRAINING_LOSS].figure.layout.yaxis
    assert list(loss.range) == [0, 7.5]  # 5.0 at two thirds of an axis from 0
    assert "Constant: 5 throughout" in plots[MEGATRON_TRAINING_LOSS].caption
    dead = [p for p in figures.tensor_heatmaps(run, axis) if "dead_fraction" in p.title][0]
    trace = dead.figure.data[0]
    assert trace.zmin == 0 and trace.zmax > 0
    assert list(trace.colorbar.ticktext) == ["0 (every value)"]
    assert trace.colorbar.title.text == "dead fraction"


def test_one_colour_scale_per_family_over_every_attempt(tmp_path):
    """The grad-norm heatmaps of two attempts (values 1-4 and 10-40) share one scale, 1 to
    40, in the page the report writes."""
    for attempt, scale in ((0, 1.0), (1, 10.0)):
        directory = tmp_path / f"run-a{attempt}"
        directory.mkdir()
        layers = {"decoder.layers.0": [1 * scale, 2 * scale],
                  "decoder.layers.1": [3 * scale, 4 * scale]}  # fmt: skip
        write_lines(directory / "metrics-rank0.jsonl", [_tensor_line(0, layers)])
    runs = [load_run(tmp_path / f"run-a{a}") for a in (0, 1)]
    data = [heatmaps.heatmap_data(run, figures.XAxis(run)) for run in runs]
    ranges = heatmaps.colour_ranges(d for found in data for d in found)
    assert ranges == {(MEGATRON_TRAINING_TENSOR_GRAD_NORM, ""): (1.0, 40.0)}
    page = build_report(Job("job", runs, [r.directory for r in runs]))
    heatmap_scales = re.findall(r'"zmax":([0-9.e+-]+),"zmin":([0-9.e+-]+)', page) or [
        (b, a) for a, b in re.findall(r'"zmin":([0-9.e+-]+),"zmax":([0-9.e+-]+)', page)
    ]
    assert len(heatmap_scales) == 2
    assert {(float(high), float(low)) for high, low in heatmap_scales} == {(40.0, 1.0)}


def test_every_timeline_row_is_labelled_and_every_group_has_its_own_colour(tmp_path):
    """One tick label per row, the rank on its first row; each span group's bars in the
    group's own colour, no two groups alike."""
    _full_run(tmp_path)
    run = load_run(tmp_path)
    plot, _ = figures.timeline_plot(run)
    yaxis = plot.figure.layout.yaxis
    rows = max(y for trace in plot.figure.data for y in trace.y) + 1
    assert list(yaxis.tickvals) == list(range(rows)) and rows == 3
    assert list(yaxis.ticktext) == [
        "rank 0 · train", "train.iteration, checkpoint.save",
        "iteration: data_loading, forward_backward, optimizer",
    ]  # fmt: skip
    colors = {trace.name: trace.marker.color for trace in plot.figure.data}
    assert set(colors) == {"job", "step", "checkpoint", "data_loading", "forward_backward",
                           "optimizer"}  # fmt: skip
    assert all(color == group_color(name) for name, color in colors.items())
    assert len(set(colors.values())) == len(colors)


def test_one_rank_is_one_rank(tmp_path):
    """A run of one rank says '1 rank' and 'rank 0', never 'ranks 0' or '1 ranks'."""
    write_ledger_metrics(
        tmp_path / "metrics-rank0.jsonl", steps=10, log_every=5, export_at=[5], values=_values
    )
    write_lines(
        tmp_path / "spans-rank0.jsonl",
        span_lines(MEGATRON_TRAIN, "a" * 16, None, T0, T0 + S, world_size=1)[:1],  # never ends
    )
    job = load_job(tmp_path)
    page = build_report(job)
    assert "1 rank ·" in page and "1 (rank 0)" in page
    assert "1 span never ended (megatron.train; rank 0)" in page
    assert "ranks 0" not in page and "1 ranks" not in page
