"""report.html, report.figures, report.summary: the page and its plots from real and
hand-written run files."""

from __future__ import annotations

import math
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_files import (  # noqa: E402
    gauge,
    metrics_line,
    span_lines,
    span_record,
    write_lines,
    write_real_metrics,
)
from support import import_or_unavailable

import_or_unavailable("plotly")

from otel_training.report import (  # noqa: E402
    build_report,
    figures,  # noqa: E402
    load_run,
    write_report,
)
from otel_training.report.run import TRUNCATED_ATTRIBUTE  # noqa: E402
from otel_training.report.summary import summarize  # noqa: E402
from otel_training.semconv.attributes import (  # noqa: E402
    MEGATRON_TRAINING_LAYER,
    MEGATRON_TRAINING_METRIC,
    MEGATRON_TRAINING_ROUTER_STATISTIC,
)
from otel_training.semconv.metrics import (  # noqa: E402
    MEGATRON_TRAINING_LOSS,
    MEGATRON_TRAINING_NONFINITE_VALUES,
    MEGATRON_TRAINING_TENSOR_GRAD_NORM,
    MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE,
)
from otel_training.semconv.spans import (  # noqa: E402
    MEGATRON_CHECKPOINT_SAVE,
    MEGATRON_EVALUATE,
    MEGATRON_TRAIN,
    MEGATRON_TRAIN_ITERATION,
)

T0 = 1_796_000_000 * 10**9
S = 10**9


class _Page(HTMLParser):
    """Scripts, external references and plot containers of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.script_sources: list[str] = []
        self.external: list[str] = []
        self.plots: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.script_sources.append(attrs["src"])
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            if value and not value.startswith("#"):
                self.external.append(value)
        if "data-plot" in attrs:
            self.plots[attrs["data-plot"]] = int(attrs["data-points"])


def _parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    return parser


def _real_run(directory: Path, ranks=(0, 1)) -> None:
    """Two ranks: real SDK metric exports (cumulative) and span lines with iterations."""
    for rank in ranks:
        batches = [
            {
                "step_duration_ms": [100.0 + 5 * i + rank, 120.0],
                "loss": 4.0 - 0.3 * i,
                "learning_rate": 1e-3 * (i + 1),
                "grad_norm": 1.0 / (i + 1),
                "tokens_per_sec": 1000.0 + i,
                "throughput_tflops": 0.1,
                "memory_allocated_gb": 2.0,
                "skipped_iters": 1 if i == 2 else None,
            }
            for i in range(6)
        ]
        batches[3]["loss"] = math.nan  # counted by megatron.training.nonfinite_values
        write_real_metrics(
            directory / f"metrics-rank{rank}.jsonl", batches, rank=rank, world_size=2
        )
        lines = []
        root = f"{rank + 1:02x}" + "0" * 14
        lines += span_lines(MEGATRON_TRAIN, root, None, T0, T0 + 60 * S, rank=rank)
        for step in range(1, 11):
            lines += span_lines(
                MEGATRON_TRAIN_ITERATION,
                f"{rank + 1:02x}{step:014x}",
                root,
                T0 + step * S,
                T0 + step * S + S // 2,
                rank=rank,
                attributes={"megatron.iteration": step},
            )
        lines += span_lines(
            MEGATRON_EVALUATE,
            f"{rank + 1:02x}" + "e" * 14,
            root,
            T0 + 20 * S,
            T0 + 22 * S,
            rank=rank,
            status="ERROR",
        )
        write_lines(directory / f"spans-rank{rank}.jsonl", lines)


def test_the_page_is_self_contained_and_every_plot_has_points(tmp_path):
    """Nothing is fetched (plotly.js inlined once) and every plot container holds points."""
    _real_run(tmp_path)
    page = build_report(load_run(tmp_path))
    parsed = _parse(page)
    assert parsed.script_sources == [] and parsed.external == []
    assert page.count("plotly.js v") >= 1 and page.count("Plotly.newPlot") == len(parsed.plots)
    assert parsed.plots and all(points > 0 for points in parsed.plots.values())
    expected = {
        "plot-curve-megatron.training.loss",
        "plot-curve-megatron.training.learning_rate",
        "plot-curve-megatron.training.grad_norm",
        "plot-curve-megatron.training.tokens_per_sec",
        "plot-curve-megatron.training.throughput_tflops",
        "plot-curve-megatron.training.memory_allocated_gb",
        "plot-step-duration-quantiles",
        "plot-step-duration-histogram",
        "plot-step-duration-by-rank",
        "plot-timeline",
    }
    assert expected <= set(parsed.plots)


def test_the_summary_has_the_run_and_the_last_values(tmp_path):
    """Run id, ranks, steps, the eight metrics' last values, non-finite and skipped counts."""
    _real_run(tmp_path)
    run = load_run(tmp_path)
    summary = summarize(run)
    assert summary.run_id == run.run_id and summary.ranks == [0, 1] and summary.world_size == 2
    assert summary.steps == 10 and summary.steps_source.startswith("iteration spans")
    rows = {row.name: row for row in summary.metrics}
    assert len(rows) == 8
    assert rows[MEGATRON_TRAINING_LOSS].by_rank == {0: pytest.approx(2.5), 1: pytest.approx(2.5)}
    assert rows["megatron.training.skipped_iters"].by_rank == {0: 1, 1: 1}
    assert summary.nonfinite == {MEGATRON_TRAINING_LOSS: 2}  # one NaN on each rank
    assert summary.skipped_iters == 1
    assert set(summary.step_duration_quantiles_ms) == {0.5, 0.9, 0.99}
    page = build_report(run)
    assert run.run_id in page
    assert "non-finite values (NaN, Inf) passed for" in page


def test_steps_come_from_the_step_duration_count_without_iteration_spans(tmp_path):
    """Without iteration spans the x axis counts the step-duration observations."""
    write_real_metrics(
        tmp_path / "metrics-rank0.jsonl",
        [
            {"step_duration_ms": [10.0] * 5, "loss": 3.0},
            {"step_duration_ms": [10.0] * 5, "loss": 2.0},
        ],
    )
    run = load_run(tmp_path)
    axis = figures.XAxis(run)
    assert axis.is_steps and "step_duration_ms" in axis.source
    plots, _ = figures.curve_plots(run, axis)
    loss = next(p for p in plots if p.id.endswith(MEGATRON_TRAINING_LOSS))
    assert list(loss.figure.data[0].x)[:2] == [5, 10]


def test_without_any_step_count_the_curves_are_over_time(tmp_path):
    """Gauges alone (no histogram, no iteration span): seconds since the run's start."""
    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [
            metrics_line(0, [gauge(MEGATRON_TRAINING_LOSS, [(T0 + t * S, 5.0 - t, {})])])
            for t in range(3)
        ],
    )
    run = load_run(tmp_path)
    axis = figures.XAxis(run)
    assert not axis.is_steps
    plots, missing = figures.curve_plots(run, axis)
    assert [p.title for p in plots] == ["Loss"] and "Learning rate" in missing
    assert list(plots[0].figure.data[0].x) == [0.0, 1.0, 2.0]
    assert figures.TIME_AXIS in build_report(run)


def test_many_ranks_are_drawn_as_a_median_and_a_band(tmp_path):
    """Beyond eight ranks the curve is the median over ranks with a min-max band."""
    for rank in range(12):
        write_lines(
            tmp_path / f"metrics-rank{rank}.jsonl",
            [
                metrics_line(
                    rank,
                    [gauge(MEGATRON_TRAINING_LOSS, [(T0 + t * S, 3.0 + rank - t * 0.1, {})])],
                    world_size=12,
                )
                for t in range(5)
            ],
        )
    run = load_run(tmp_path)
    plots, _ = figures.curve_plots(run, figures.XAxis(run))
    names = [trace.name for trace in plots[0].figure.data]
    assert names == ["max", "min to max", "median"]
    medians = list(plots[0].figure.data[2].y)
    assert medians[0] == pytest.approx((3.0 + 5 + 3.0 + 6) / 2)  # ranks 5 and 6 of 0..11


def test_long_series_are_downsampled_and_the_page_says_so(tmp_path):
    """A 20,000-point gauge is cut to the budget, its spike kept, and a note says so."""
    values = [1.0 + (t % 7) * 0.01 for t in range(20_000)]
    values[12_345] = 40.0
    points = [(T0 + t * S, v, {}) for t, v in enumerate(values)]
    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [metrics_line(0, [gauge(MEGATRON_TRAINING_LOSS, points)], world_size=1)],
    )
    run = load_run(tmp_path)
    plots, _ = figures.curve_plots(run, figures.XAxis(run))
    assert plots[0].downsampled and plots[0].points < 20_000 // 2
    assert 40.0 in list(plots[0].figure.data[0].y)
    note = (
        "Long series were downsampled to keep this page small: curves keep each bucket&#39;s "
        "lowest and highest point, heatmaps the last value per column, the timeline merges "
        "runs of one span name (captions say which). The files have every point."
    )
    page = build_report(run)
    assert page.count(note) == 1
    assert "No spans file (spans-rank*.jsonl or traces-rank*.jsonl): the timeline is empty." in page
    short = tmp_path / "short"
    short.mkdir()
    write_lines(
        short / "metrics-rank0.jsonl",
        [metrics_line(0, [gauge(MEGATRON_TRAINING_LOSS, points[:50])], world_size=1)],
    )
    assert "Long series were downsampled to keep" not in build_report(load_run(short))


def test_heatmaps_order_layers_naturally_and_split_router_statistics(tmp_path):
    """Layers in model order without ``global``; one heatmap per router statistic, in order."""
    points = []
    for layer in ("decoder.layers.10", "decoder.layers.2", "decoder.layers.1", "global"):
        points += [(T0 + t * S, float(t), {MEGATRON_TRAINING_LAYER: layer}) for t in range(3)]
    balance = [
        (
            T0 + t * S,
            1.5,
            {MEGATRON_TRAINING_LAYER: "decoder.layers.0", MEGATRON_TRAINING_ROUTER_STATISTIC: stat},
        )
        for t in range(3)
        for stat in ("dead_fraction", "max_over_mean", "coefficient_of_variation")
    ]
    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [
            metrics_line(
                0,
                [
                    gauge(MEGATRON_TRAINING_TENSOR_GRAD_NORM, points),
                    gauge(MEGATRON_TRAINING_TENSOR_ROUTER_BALANCE, balance),
                ],
            )
        ],
    )
    run = load_run(tmp_path)
    heatmaps = figures.tensor_heatmaps(run, figures.XAxis(run))
    grad = heatmaps[0]
    assert list(grad.figure.data[0].y) == [
        "decoder.layers.1",
        "decoder.layers.2",
        "decoder.layers.10",
    ]
    assert grad.points == 9
    assert [h.title.split(": ")[-1] for h in heatmaps[1:]] == [
        "max_over_mean",
        "coefficient_of_variation",
        "dead_fraction",
    ]


def test_the_timeline_marks_failed_and_truncated_spans(tmp_path):
    """Failed spans are outlined in red, truncated and open ones hatched."""
    lines = [
        *span_lines(
            MEGATRON_TRAIN, "1" * 16, None, T0, T0 + 10 * S, attributes={TRUNCATED_ATTRIBUTE: True}
        ),
        *span_lines(MEGATRON_EVALUATE, "2" * 16, "1" * 16, T0 + S, T0 + 2 * S, status="ERROR"),
        span_record("span_start", MEGATRON_CHECKPOINT_SAVE, "3" * 16, "1" * 16, T0 + 3 * S),
    ]
    write_lines(tmp_path / "spans-rank0.jsonl", lines)
    plot, reduction = figures.timeline_plot(load_run(tmp_path))
    assert reduction is None and plot.points == 3
    bars = {}
    for trace in plot.figure.data:
        for text, line, pattern in zip(
            trace.hovertext, trace.marker.line.color, trace.marker.pattern.shape
        ):
            bars[text.split("</b>")[0].removeprefix("<b>")] = (line, pattern)
    assert bars[MEGATRON_EVALUATE] == (figures.ERROR_COLOR, "")
    assert bars[MEGATRON_TRAIN][1] == "/" and bars[MEGATRON_CHECKPOINT_SAVE][1] == "/"


def test_a_long_timeline_merges_runs_of_one_span_name(tmp_path):
    """Thousands of iterations become a few bars (per run between other phases), with counts."""
    root = "f" * 16
    lines = span_lines(MEGATRON_TRAIN, root, None, T0, T0 + 5000 * S)
    for i in range(1, 4001):
        lines += span_lines(
            MEGATRON_TRAIN_ITERATION,
            f"{i:016x}",
            root,
            T0 + i * S,
            T0 + i * S + S // 2,
            attributes={"megatron.iteration": i},
        )
        if i == 2000:
            lines += span_lines(
                MEGATRON_CHECKPOINT_SAVE,
                "c" * 16,
                root,
                T0 + i * S + S // 2,
                T0 + i * S + 900_000_000,
            )
    write_lines(tmp_path / "spans-rank0.jsonl", lines)
    plot, reduction = figures.timeline_plot(load_run(tmp_path), max_bars=500)
    assert "merged" in reduction
    texts = [t for trace in plot.figure.data for t in trace.hovertext]
    merged = [t for t in texts if "× 2,000" in t]
    assert len(merged) == 2 and any("iterations 1–2,000" in t for t in merged)
    assert plot.points == 4  # the run, two blocks of iterations, the checkpoint


def test_an_empty_run_still_gives_a_page(tmp_path):
    """No file at all: a small page with the note and no plot (and no plotly.js)."""
    path = write_report(load_run(tmp_path), tmp_path / "report.html")
    page = path.read_text()
    assert "holds no *-rank*.jsonl file" in page
    assert _parse(page).plots == {} and "plotly.js v" not in page
    assert path.stat().st_size < 100_000


def test_notes_of_damaged_files_reach_the_page(tmp_path):
    """A torn last line and a missing signal are said at the top of the page."""
    good = metrics_line(0, [gauge(MEGATRON_TRAINING_LOSS, [(T0, 1.0, {})])])
    write_lines(tmp_path / "metrics-rank0.jsonl", [good], torn_tail=good[:40])
    page = build_report(load_run(tmp_path))
    assert "the last line is cut" in page and "No spans file" in page


def test_nonfinite_counts_by_metric(tmp_path):
    """megatron.training.nonfinite_values is summed over ranks per metric name."""
    from report_files import counter

    for rank in (0, 1):
        write_lines(
            tmp_path / f"metrics-rank{rank}.jsonl",
            [
                metrics_line(
                    rank,
                    [
                        counter(
                            MEGATRON_TRAINING_NONFINITE_VALUES,
                            [
                                (
                                    T0,
                                    T0 + S,
                                    2 + rank,
                                    {MEGATRON_TRAINING_METRIC: MEGATRON_TRAINING_LOSS},
                                )
                            ],
                            "cumulative",
                        )
                    ],
                )
            ],
        )
    assert summarize(load_run(tmp_path)).nonfinite == {MEGATRON_TRAINING_LOSS: 5}


def test_values_durations_sizes_and_times_read_as_the_report_writes_them():
    """format_value: 4 significant digits, thousands separators from 10,000, an exponent
    below 0.001, a dash for none, inf and nan as Python writes them; durations in seconds
    under 2 minutes, then minutes and seconds, then hours and minutes; sizes in B, KiB, MiB,
    GiB; times in UTC."""
    from otel_training.report.html import _duration, _iso, _size, format_value

    values = [None, float("inf"), float("nan"), 0, 3.14159, 9999.4, 1e4, 12345.6, -20000,
              0.001, 0.0005, -0.0002]  # fmt: skip
    assert [format_value(v) for v in values] == [
        "–", "inf", "nan", "0", "3.142", "9999", "10,000", "12,346", "-20,000",
        "0.001", "5.000e-04", "-2.000e-04",
    ]  # fmt: skip
    assert [_duration(s) for s in (None, 59.96, 119.94, 120, 3599.6, 3725)] == [  # rounded
        "–", "60.0 s", "119.9 s", "2 min 00 s", "1 h 00 min", "1 h 02 min",
    ]  # fmt: skip
    assert [_size(n) for n in (0, 1023, 1024, 1536 * 1024, 5 * 1024**3, 3 * 1024**4)] == [
        "0 B", "1,023 B", "1.0 KiB", "1.5 MiB", "5.0 GiB", "3,072.0 GiB",
    ]  # fmt: skip
    assert [_iso(None), _iso(0), _iso(86_400_000_000_000 + 1), _iso(90, scale=1)] == [
        "–", "1970-01-01 00:00:00 UTC", "1970-01-02 00:00:00 UTC", "1970-01-01 00:01:30 UTC",
    ]  # fmt: skip


def test_dom_ids_need_no_escaping_and_two_texts_never_share_one():
    """An id is the text where it is letters, digits, _ . - only (at most 120 of them); any
    other text gets those characters as _ and 8 hex digits of its BLAKE2b hash, so that two
    texts that look alike stay apart."""
    import hashlib

    from otel_training.report.html import dom_id

    def digest(text: str) -> str:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()

    assert dom_id("loss.rank-0_a") == "loss.rank-0_a"
    assert dom_id("a b") == "a_b-" + digest("a b") and dom_id("a b") != dom_id("a_b")
    odd = '"><script>\udcff'
    assert dom_id(odd) == "___script__-" + digest(odd)
    assert dom_id("x" * 121) == "x" * 120 + "-" + digest("x" * 121)
    assert dom_id("x" * 120) == "x" * 120


def test_ranks_are_shown_each_up_to_eight_then_as_min_median_and_max():
    """Up to 8 ranks: one cell per rank (a dash where one has no value); more: the minimum,
    median and maximum of the values present."""
    from otel_training.report.html import _rank_cells

    assert _rank_cells({0: 1.0, 2: 3.0}, [0, 1, 2]) == (
        ["rank 0", "rank 1", "rank 2"],
        ["1", "–", "3"],
    )
    eight = _rank_cells({r: 1.0 for r in range(8)}, list(range(8)))
    assert eight == ([f"rank {r}" for r in range(8)], ["1"] * 8)
    values = {rank: float(rank * 10) for rank in range(9)}
    assert _rank_cells(values, list(range(10))) == (["min", "median", "max"], ["0", "40", "80"])
    assert _rank_cells({}, list(range(9))) == (["min", "median", "max"], ["–", "–", "–"])


def test_the_tiles_at_a_glance_say_each_figure_and_where_it_comes_from(tmp_path):
    """The tiles: steps (and their source), duration (from the start, UTC), ranks of the
    world size and the hosts (three named, then an ellipsis), the last loss of the first rank,
    tokens/s, TFLOP/s, step time p50 and p99, non-finite values and skipped iterations (marked
    bad when any); a dash where a figure is unknown."""
    import dataclasses

    from otel_training.report.html import _duration, _iso, _tiles

    _real_run(tmp_path)
    summary = summarize(load_run(tmp_path))
    tiles = {t.label: t for t in _tiles(summary)}
    assert list(tiles) == [
        "steps", "duration", "ranks", "last loss", "tokens/s", "TFLOP/s per GPU",
        "step time p50", "non-finite values", "skipped iterations",
    ]  # fmt: skip
    assert tiles["steps"].value == "10 steps (1–10)"  # the wording of every "steps"
    assert tiles["steps"].detail == f"from {summary.steps_source}"
    assert tiles["duration"].value == _duration(summary.duration_s) != "–"
    assert tiles["duration"].detail == f"from {_iso(summary.start_ns)}"
    assert tiles["ranks"].value == "2 of 2"
    assert (tiles["last loss"].value, tiles["last loss"].detail) == ("2.5", "rank 0")
    assert [tiles[k].bad for k in ("non-finite values", "skipped iterations")] == [True, True]
    assert (tiles["non-finite values"].value, tiles["skipped iterations"].value) == ("2", "1")
    unknown = dataclasses.replace(
        summary, steps=None, steps_source=None, world_size=None, hosts=["a", "b", "c", "d"]
    )
    tiles = {t.label: t for t in _tiles(unknown)}
    assert (tiles["steps"].value, tiles["steps"].detail) == ("–", "")
    assert (tiles["ranks"].value, tiles["ranks"].detail) == ("2", "4 hosts: a, b, c …")
    one = {t.label: t for t in _tiles(dataclasses.replace(summary, hosts=["h"]))}
    assert one["ranks"].detail == "1 host: h"
    none = {t.label: t for t in _tiles(dataclasses.replace(summary, hosts=[]))}
    assert none["ranks"].detail == ""


# -- the page's parts, one at a time ---------------------------------------------------------

from otel_training.report import html as page_html  # noqa: E402
from otel_training.report.summary import MetricRow, Summary  # noqa: E402


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "–"),
        (math.nan, "nan"),
        (-math.inf, "-inf"),
        (0, "0"),
        (0.001, "0.001"),
        (0.00042, "4.200e-04"),
        (-0.0005, "-5.000e-04"),
        (3.14159, "3.142"),
        (9999.4, "9999"),
        (10_000, "10,000"),
        (-12_345.6, "-12,346"),
        (1.5e9, "1,500,000,000"),
    ],
)
def test_a_value_for_a_person_has_four_digits_separators_or_an_exponent(value, shown):
    """format_value: 4 significant digits; thousands separators from 10,000; an exponent
    below 0.001; a dash for no value; non-finite values as Python writes them."""
    assert page_html.format_value(value) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "–"),
        (0, "0.0 s"),
        (119.94, "119.9 s"),
        (120, "2 min 00 s"),
        (125.4, "2 min 05 s"),
        (3599.6, "1 h 00 min"),
        (3725, "1 h 02 min"),
        (7384, "2 h 03 min"),
    ],
)
def test_a_duration_is_seconds_then_minutes_then_hours(seconds, shown):
    assert page_html._duration(seconds) == shown


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        (0, "0 B"),
        (1023, "1,023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (3 * 1024**2, "3.0 MiB"),
        (5 * 1024**3, "5.0 GiB"),
        (3000 * 1024**3, "3,000.0 GiB"),
    ],
)
def test_a_file_size_is_in_binary_units_up_to_gib(size, shown):
    assert page_html._size(size) == shown


def test_times_are_utc_from_nanoseconds_or_seconds():
    assert page_html._iso(None) == "–"
    assert page_html._iso(0) == "1970-01-01 00:00:00 UTC"
    assert page_html._iso(1_796_000_000 * 10**9) == "2026-11-30 00:53:20 UTC"
    assert page_html._iso(1_796_000_000.7, 1.0) == "2026-11-30 00:53:20 UTC"


def test_a_metric_row_has_a_cell_per_rank_up_to_eight_then_min_median_max():
    """Up to 8 ranks: a column per rank (a dash where a rank has no value); beyond: the
    minimum, the median (the upper one of an even count) and the maximum of the values."""
    assert page_html._rank_cells({0: 1.5, 2: 3.0}, [0, 1, 2]) == (
        ["rank 0", "rank 1", "rank 2"],
        ["1.5", "–", "3"],
    )
    values = {rank: float(rank * rank) for rank in range(10)}
    assert page_html._rank_cells(values, list(range(10))) == (
        ["min", "median", "max"],
        ["0", "25", "81"],
    )
    assert page_html._rank_cells({}, list(range(9))) == (["min", "median", "max"], ["–"] * 3)


def test_the_ranks_fact_counts_and_lists_them():
    assert page_html._ranks_fact([]) == "–"
    assert page_html._ranks_fact([3]) == "1 (rank 3)"
    assert page_html._ranks_fact([0, 1]) == "2 (ranks 0, 1)"
    assert page_html._ranks_fact(list(range(8))) == "8 (ranks 0–7)"


def _summary(**changes) -> Summary:
    values = dict(
        run_id="r",
        service_name="svc",
        ranks=[2, 3],
        world_size=8,
        hosts=["h1", "h2", "h3", "h4"],
        steps=12_345,
        steps_source="iteration spans",
        start_ns=0,
        duration_s=150.0,
        metrics=[
            MetricRow("megatron.training.loss", "", "last value", {3: 2.5, 2: 2.25}),
            MetricRow("megatron.training.tokens_per_sec", "{token}/s", "last value", {2: 1e5}),
            MetricRow("megatron.training.throughput_tflops", "TFLOP/s", "last value", {3: 0.5}),
        ],
        nonfinite={"megatron.training.loss": 2.0},
        skipped_iters=3,
        step_duration_quantiles_ms={0.5: 120.0, 0.9: 130.0, 0.99: 150.0},
    )
    values.update(changes)
    return Summary(**values)


def test_the_summary_tiles_say_each_figure_with_its_source():
    """The tiles: steps (and where they come from), duration (from the start), ranks of the
    world size with up to three hosts, the lowest rank's last loss, the job's tokens/s, TFLOP/s
    per GPU, the step time p50 and p99, non-finite values and skipped iterations (both marked
    bad when there are any)."""
    tiles = [(t.label, t.value, t.detail, t.bad) for t in page_html._tiles(_summary())]
    assert tiles == [
        ("steps", "steps up to 12,345", "from iteration spans", False),  # first unknown
        ("duration", "2 min 30 s", "from 1970-01-01 00:00:00 UTC", False),
        ("ranks", "2 of 8", "4 hosts: h1, h2, h3 …", False),
        ("last loss", "2.25", "rank 2", False),
        ("tokens/s", "100,000", "last value", False),
        ("TFLOP/s per GPU", "0.5", "last value", False),
        ("step time p50", "120 ms", "p99 150 ms", False),
        ("non-finite values", "2", "NaN or Inf passed", True),
        ("skipped iterations", "3", "most of any rank", True),
    ]
    bare = _summary(
        ranks=[],
        world_size=None,
        hosts=["h1"],
        steps=None,
        steps_source=None,
        metrics=[],
        nonfinite={},
        skipped_iters=0,
        step_duration_quantiles_ms={},
    )
    tiles = [(t.label, t.value, t.detail, t.bad) for t in page_html._tiles(bare)]
    assert tiles == [
        ("steps", "–", "", False),
        ("duration", "2 min 30 s", "from 1970-01-01 00:00:00 UTC", False),
        ("ranks", "0", "1 host: h1", False),
        ("last loss", "–", "", False),
        ("tokens/s", "–", "last value", False),
        ("TFLOP/s per GPU", "–", "last value", False),
        ("step time p50", "–", "", False),
        ("non-finite values", "0", "NaN or Inf passed", False),
        ("skipped iterations", "0", "most of any rank", False),
    ]


def test_an_id_needs_no_escaping_and_two_stay_apart():
    """dom_id keeps an id of letters, digits and _ . - as it is; any other character becomes
    _, the id is cut to 120 characters and gets the first 4 bytes of the BLAKE2b hash of the
    original (UTF-8, lone surrogates kept), so that two ids never merge."""
    import hashlib

    assert page_html.dom_id("plot-curve-megatron.training.loss_1") == (
        "plot-curve-megatron.training.loss_1"
    )
    for text in ("a b", "a\"b<'>", "x" * 130, "é\udc80"):
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=4)
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in text)
        assert page_html.dom_id(text) == f"{safe[:120]}-{digest.hexdigest()}"
    assert page_html.dom_id("a b") != page_html.dom_id("a_b")


def test_a_plot_is_a_div_of_its_own_without_the_library():
    """_plot_html: the figure as a div with the given id (prefixed), no page around it, no
    plotly.js (the page inlines it once), the project's plot settings, the figure's height
    (300 px when it sets none) and the full width; title, caption and points handed on."""
    import plotly
    import plotly.graph_objects as go

    from otel_training.report.plot import Plot

    for height, shown in ((None, "300px"), (450, "450px")):
        figure = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout={"height": height})
        plot = Plot("curve-x", "Loss", "c", figure, points=2)
        part = page_html._plot_html(plot, plotly, "a2-")
        assert {k: part[k] for k in ("id", "title", "caption", "points")} == {
            "id": "a2-curve-x",
            "title": "Loss",
            "caption": "c",
            "points": 2,
        }
        div = part["html"]
        assert div.lstrip().startswith(f'<div style="height:{shown}; width:100%;">')
        assert "<html" not in div and "<body" not in div and 'id="a2-curve-x"' in div
        assert "plotly.js v" not in div and "<script src" not in div
        assert '"displaylogo": false' in div and '"responsive": true' in div
        assert '"modeBarButtonsToRemove": ["lasso2d", "select2d"]' in div
        assert '"displayModeBar": "hover"' in div


def test_a_page_is_written_as_utf8_with_lone_surrogates_escaped(tmp_path):
    assert page_html.utf8("é\n") == "é\n".encode()
    assert page_html.utf8("a\udc80b") == b"a\\x80b"


def test_the_report_needs_its_libraries_and_says_how_to_get_them(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(ModuleNotFoundError) as raised:
        page_html._require_libraries()
    assert str(raised.value).startswith(page_html.REPORT_HINT + " (")


def test_a_health_assessment_that_fails_is_a_sentence_with_the_error_escaped(monkeypatch):
    from otel_training.report import health

    def broken(job):
        raise ValueError("<b>bad</b>")

    monkeypatch.setattr(health, "assess_read", broken)
    tables, plots, empty, verdict = page_html._health(object())
    assert (tables, plots) == (None, [])
    assert empty == "Run health could not be assessed (ValueError: &lt;b&gt;bad&lt;/b&gt;)."
    assert verdict.word == "Unknown"  # the template escapes the verdict's text
    assert verdict.headline == (
        "run health unknown: it could not be assessed (ValueError: <b>bad</b>)"
    )


def test_an_attempts_context_has_its_facts_files_row_and_sections(tmp_path):
    """_attempt: the facts (job id and attempt where known, the processes' start time where
    recorded), a row per file (size, lines, what went wrong with it), the attempt's row of the
    attempts table, the subtitle, and the sections with their ids prefixed and what each says
    when it has nothing to draw; the attempt's notes only when it is one of several."""
    import dataclasses

    import plotly

    from otel_training.report.run import FileStats

    _real_run(tmp_path)
    run = load_run(tmp_path)
    run.job_id = "job-7"
    run.attempt = 2
    run.created_s = 1_796_000_000.0
    run.notes = ["a note"]
    odd = FileStats(
        path=tmp_path / "traces-rank1.jsonl",
        signal="traces",
        rank=1,
        size_bytes=2048,
        mtime_s=0.0,
        lines=3,
        torn_last_line=True,
        bad_lines=2,
        error="unreadable: EIO",
        skipped="read from the span lines",
    )
    run.files = [*run.files[:1], odd]
    context, shrunk = page_html._attempt(run, "attempt 2", "a2-", plotly, figures.XAxis(run), [])
    summary = context["summary"]
    assert context["facts"] == [
        ("run id", summary.run_id),
        ("job id", "job-7"),
        ("attempt", "attempt 2"),
        ("service", "report-test"),
        ("ranks", "2 (ranks 0, 1)"),
        ("world size", "2"),
        ("hosts", "node-0, node-1"),
        ("started", page_html._iso(summary.start_ns)),
        ("directory", str(tmp_path)),
        ("processes started", "2026-11-30 00:53:20 UTC"),
    ]
    first = run.files[0]
    assert context["files"] == [
        {
            "name": "metrics-rank0.jsonl",
            "rank": 0,
            "size": page_html._size(first.size_bytes),
            "lines": f"{first.lines:,}",
            "notes": "–",
            "modified": page_html._iso(first.mtime_s, 1.0),
        },
        {
            "name": "traces-rank1.jsonl",
            "rank": 1,
            "size": "2.0 KiB",
            "lines": "–",
            "notes": "unreadable: EIO, last line cut, 2 unreadable lines, read from the span lines",
            "modified": "1970-01-01 00:00:00 UTC",
        },
    ]
    failed = sum(1 for s in run.spans if s.failed)
    assert context["row"] == {
        "label": "attempt 2",
        "anchor": "#a2-summary",
        "run_id": summary.run_id,
        "started": "2026-11-30 00:53:20 UTC",
        "duration": page_html._duration(summary.duration_s),
        "ranks": "2",
        "steps": "10 steps (1–10)",
        "failed": str(failed),
        "open": "0",
        "directory": str(tmp_path),
    }
    assert context["subtitle"] == " · ".join(
        [
            "report-test",
            "2 ranks",
            "10 steps (1–10)",
            page_html._duration(summary.duration_s),
            page_html._iso(summary.start_ns),
        ]
    )
    assert context["notes"] == ["a note"] and context["prefix"] == "a2-"
    assert context["nonfinite"] == [("megatron.training.loss", "2")]
    assert context["metric_table"]["headers"] == ["rank 0", "rank 1"]
    sections = [(s.id, s.title, bool(s.plots), s.empty, s.wide) for s in context["sections"]]
    assert sections == [
        ("a2-curves", "Training curves", True, "", False),
        ("a2-step-duration", "Step duration", True, "", False),
        (
            "a2-tensors",
            "Tensor metrics per layer",
            False,
            "No per-layer tensor metric in this run (see "
            "<code>OTEL_PYTHON_TRAINING_TENSOR_METRICS</code> and docs/tensor-metrics.md).",
            False,
        ),
        ("a2-timeline", "Timeline", True, "", True),
    ]
    assert all(p["id"].startswith("a2-") for s in context["sections"] for p in s.plots)
    leads = [s.lead for s in context["sections"]]
    assert leads == [
        "x axis: optimizer step, from iteration spans (megatron.iteration) (a value is placed "
        "at the step reached when it was exported: up to an export interval after the step it "
        "describes).",
        "",
        "",
        "",
    ]
    assert not shrunk
    alone, _ = page_html._attempt(
        dataclasses.replace(run, job_id=None, attempt=None, created_s=None),
        "",
        "",
        plotly,
        figures.XAxis(run),
        [],
    )
    assert [key for key, _ in alone["facts"]] == [
        "run id", "service", "ranks", "world size", "hosts", "started", "directory",
    ]  # fmt: skip
    assert alone["notes"] == [] and alone["row"]["anchor"] == "#summary"


def test_sections_without_data_say_what_is_missing(tmp_path):
    """A run with only a loss gauge: the curves section names the curves not recorded (and
    that memory is recorded on CUDA devices only), the step-duration section says there is
    no step-duration point, the timeline that there is no span."""
    import plotly

    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [metrics_line(0, [gauge("megatron.training.loss", [(T0, 5.0, {})])])],
    )
    run = load_run(tmp_path)
    context, _ = page_html._attempt(run, "", "", plotly, figures.XAxis(run), [])
    empties = {s.id: s.empty for s in context["sections"]}
    assert empties["curves"] == (
        "Not recorded: Learning rate, Grad norm, Tokens/s, TFLOP/s per GPU, Memory allocated. "
        "Memory is recorded on CUDA devices only."
    )
    assert empties["step-duration"] == ("No <code>megatron.training.step_duration_ms</code> point.")
    assert empties["timeline"] == "No span in this run."
    assert context["row"]["steps"] == "–" and "steps" not in context["subtitle"]


def _gauge_run(directory: Path, loss: float = 5.0):
    directory.mkdir()
    write_lines(
        directory / "metrics-rank0.jsonl",
        [metrics_line(0, [gauge(MEGATRON_TRAINING_LOSS, [(T0, loss, {})])])],
    )
    return load_run(directory)


@pytest.mark.parametrize(
    ("ordered_by", "said"),
    [
        ("attempt", "by attempt number"),
        ("process.creation.time", "by process start time"),
        ("first record", "by first record"),
    ],
)
def test_a_job_page_is_titled_by_the_job_and_says_how_its_attempts_are_ordered(
    tmp_path, ordered_by, said
):
    """A page of several attempts: titled with the job id, subtitled with the number of
    attempts and their order, ids of each attempt prefixed a1-, a2-; the job's notes on top
    and each attempt's notes in its own part. A page of one run: titled with its run id, its
    notes on top."""
    from otel_training.report.run import Job

    first, second = _gauge_run(tmp_path / "a"), _gauge_run(tmp_path / "b", 4.0)
    first.notes, second.notes = ["first's note"], ["second's note"]
    long = "a job note of 300 characters " + "x" * 271  # notes keep 600 characters
    job = Job("job-9", [first, second], notes=["the job's note", long], ordered_by=ordered_by)
    page = build_report(job)
    assert "<title>" in page and page.count("job-9") >= 1
    assert f"2 attempts, ordered {said}" in page
    assert 'id="a1-curves"' in page and 'id="a2-curves"' in page
    for note in ("the job&#39;s note", "first&#39;s note", "second&#39;s note", long):
        assert page.count(note) == 1, note
    single = build_report(first)
    assert first.run_id in single and single.count("first&#39;s note") == 1
    alone = build_report(Job("job-9", [first], notes=["a job-wide note"]))
    assert alone.count("first&#39;s note") == 1 and alone.count("a job-wide note") == 1
    assert 'id="curves"' in single and "attempts, ordered" not in single


def test_a_page_without_plots_carries_no_plotly_and_says_when_and_by_what_it_was_made(
    tmp_path, monkeypatch
):
    """A run with nothing to draw: the page has no plotly.js at all; every page names the
    version that made it and when (UTC, to the second), and ends with a newline."""
    import datetime as dt
    from importlib.metadata import version

    write_lines(
        tmp_path / "metrics-rank0.jsonl",
        [metrics_line(0, [gauge("myproject.other", [(T0, 1.0, {})])])],
    )
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    page = build_report(load_run(tmp_path))
    after = dt.datetime.now(dt.timezone.utc)
    assert "plotly.js v" not in page and "Plotly.newPlot" not in page
    assert f'<meta name="generator" content="otel-training {version("otel-training")}">' in page
    made = page.split(f"Made by otel-training {version('otel-training')} at ", 1)[1][:23]
    moment = dt.datetime.strptime(made, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=dt.timezone.utc)
    assert before <= moment <= after
    assert page.endswith("\n")


def test_a_page_made_from_a_source_tree_says_its_version_is_unknown(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert page_html._version() == "unknown"


def test_the_metric_table_and_the_tensor_section_of_an_attempt(tmp_path):
    """The metric table has a row per metric with its unit, what the value is and a cell per
    rank; a run with per-layer tensor metrics leads its tensor section with the one colour
    scale per family and the x axis; memory recorded, no note that it is CUDA-only."""
    import plotly

    from otel_training.report import heatmaps

    _real_run(tmp_path)
    run = load_run(tmp_path)
    context, _ = page_html._attempt(run, "", "", plotly, figures.XAxis(run), [])
    rows = context["metric_table"]["rows"]
    assert rows[0] == {
        "name": MEGATRON_TRAINING_LOSS,
        "unit": "",
        "what": "last value",
        "cells": ["2.5", "2.5"],
    }
    assert rows[3]["unit"] == "tokens/s" and rows[3]["cells"] == ["1005", "1005"]

    tensors = tmp_path / "tensors"
    tensors.mkdir()
    layers = [
        (T0 + t * S, float(t), {MEGATRON_TRAINING_LAYER: "decoder.layers.0"}) for t in range(3)
    ]
    write_lines(
        tensors / "metrics-rank0.jsonl",
        [
            metrics_line(
                0,
                [
                    gauge(MEGATRON_TRAINING_TENSOR_GRAD_NORM, layers),
                    gauge("megatron.training.memory_allocated_gb", [(T0, 2.0, {})]),
                ],
            )
        ],
    )
    run = load_run(tensors)
    axis = figures.XAxis(run)
    data = heatmaps.heatmap_data(run, axis)
    plots = heatmaps.heatmap_plots(data, axis, heatmaps.colour_ranges(data))
    context, _ = page_html._attempt(run, "", "a1-", plotly, axis, plots)
    (section,) = [s for s in context["sections"] if s.id == "a1-tensors"]
    assert section.lead == (
        "Per-layer statistics of the tensor observer, layers in model order; one colour scale "
        f"per family, the same in every attempt. x axis: {figures.TIME_AXIS}."
    )
    assert section.empty == "" and section.plots
    assert all(p["id"].startswith("a1-") for p in section.plots)
    (curves,) = [s for s in context["sections"] if s.id == "a1-curves"]
    assert curves.empty == (
        "Not recorded: Loss, Learning rate, Grad norm, Tokens/s, TFLOP/s per GPU."
    )  # memory recorded: no word of CUDA
    facts = dict(context["facts"])
    assert facts["service"] != "–" and facts["world size"] == "2"


def test_the_heatmaps_of_every_attempt_share_one_colour_scale_per_family(tmp_path):
    """Two attempts whose grad norms span 0-2 and 10-12: both heatmaps are drawn on the one
    scale 0-12, so that a colour means the same value in each."""
    import re

    from otel_training.report.run import Job

    runs = []
    for name, base in (("a", 0.0), ("b", 10.0)):
        directory = tmp_path / name
        directory.mkdir()
        points = [
            (T0 + t * S, base + t, {MEGATRON_TRAINING_LAYER: "decoder.layers.0"}) for t in range(3)
        ]
        write_lines(
            directory / "metrics-rank0.jsonl",
            [metrics_line(0, [gauge(MEGATRON_TRAINING_TENSOR_GRAD_NORM, points)])],
        )
        runs.append(load_run(directory))
    page = build_report(Job("job", runs))
    scales = re.findall(r'"zmax":([0-9.e+-]+),"zmin":([0-9.e+-]+)', page)
    scales += [
        (high, low) for low, high in re.findall(r'"zmin":([0-9.e+-]+),"zmax":([0-9.e+-]+)', page)
    ]
    assert len(scales) == 2 and {(float(h), float(lo)) for h, lo in scales} == {(12.0, 0.0)}


def test_an_attempts_names_keep_240_characters_and_its_parts_are_named_for_the_page(tmp_path):
    """In the summary and the tables, names from the files keep 240 characters (the header
    120); the attempt's context carries its label, short run id, tiles and directory under
    the names the template reads; three hosts are listed whole, a fourth is an ellipsis."""
    import plotly

    _real_run(tmp_path)
    run = load_run(tmp_path)
    long_id = "r" * 200
    run.run_id = long_id
    context, _ = page_html._attempt(run, "attempt 3", "", plotly, figures.XAxis(run), [])
    summary = context["summary"]
    assert summary.run_id == long_id
    assert dict(context["facts"])["run id"] == long_id and context["row"]["run_id"] == long_id
    assert context["short_run_id"] == page_html._short(long_id) != long_id
    assert context["label"] == "attempt 3" and context["directory"] == str(tmp_path)
    assert [t.label for t in context["tiles"]] == [t.label for t in page_html._tiles(summary)]
    three = [t for t in page_html._tiles(_summary(hosts=["a", "b", "c"])) if t.label == "ranks"]
    assert three[0].detail == "3 hosts: a, b, c"
    (one,) = [
        t
        for t in page_html._tiles(_summary(nonfinite={"x": 1.0}))
        if t.label == "non-finite values"
    ]
    assert one.bad  # a single NaN is one too many


def test_an_attempts_directory_keeps_240_characters_and_its_notes_600(tmp_path):
    """The directory of an attempt (its page's fact and its context) keeps 240 characters
    and each of its notes 600: more than a header's 120."""
    import plotly

    deep = tmp_path / ("d" * 150)
    deep.mkdir()
    _real_run(deep)
    run = load_run(deep)
    assert 120 < len(str(deep)) <= 240
    run.notes = ["n" * 500]
    context, _ = page_html._attempt(run, "attempt 2", "", plotly, figures.XAxis(run), [])
    assert context["directory"] == str(deep) and context["row"]["directory"] == str(deep)
    assert context["notes"] == ["n" * 500]
