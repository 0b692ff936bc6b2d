"""The report: one self-contained HTML page of a run, built with plotly and jinja2.

plotly.js is inlined once (the bundle ``include_plotlyjs=True`` would inline, from
``plotly.offline.get_plotlyjs``) and every figure's data is inlined as JSON, so the file opens
offline and requests nothing. Needs the ``report`` extra (plotly, jinja2); both are imported
only when a report is built, so ``otel-training trace`` and ``import otel_training`` do not
need them.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import html
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_training.report._nogc import no_gc
from otel_training.report.run import Job, Run
from otel_training.report.series import SMOOTH_JS
from otel_training.report.summary import Summary, summarize
from otel_training.report.verdict import Verdict
from otel_training.report.wording import cut, plural, rank_list

__all__ = ["REPORT_HINT", "build_report", "dom_id", "format_value", "utf8", "write_report"]

REPORT_HINT = (
    "otel-training report needs plotly and jinja2: pip install -e '.[report]' in the "
    "otel-training checkout"
)

_PLOT_CONFIG = {
    "displaylogo": False,
    "displayModeBar": "hover",
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "select2d"],
}


@dataclass
class _Tile:
    label: str
    value: str
    detail: str = ""
    bad: bool = False


@dataclass
class _Section:
    id: str
    title: str
    lead: str = ""
    plots: list[dict[str, Any]] = field(default_factory=list)
    empty: str = ""
    wide: bool = False
    #: The smoothing weight of the section's curves, shown and adjustable in the page.
    smoothing: float | None = None


def _require_libraries():
    try:
        import jinja2
        import plotly.io
        import plotly.offline
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"{REPORT_HINT} ({error})") from error
    return jinja2, plotly


def format_value(value: float | None) -> str:
    """A value for a person: 4 significant digits, thousands separators from 10,000, an
    exponent below 0.001. Never raises."""
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e4:
        return f"{value:,.0f}"
    if magnitude and magnitude < 1e-3:
        return f"{value:.3e}"
    return f"{value:.4g}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {s:02d} s"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _iso(ns_or_s: float | None, scale: float = 1e9) -> str:
    if ns_or_s is None:
        return "–"
    moment = _dt.datetime.fromtimestamp(ns_or_s / scale, tz=_dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _rank_cells(values: dict[int, float], ranks: list[int]) -> tuple[list[str], list[str]]:
    if len(ranks) <= 8:
        return [f"rank {r}" for r in ranks], [format_value(values.get(r)) for r in ranks]
    present = sorted(values.values())
    middle = present[len(present) // 2] if present else None
    return ["min", "median", "max"], [
        format_value(present[0] if present else None),
        format_value(middle),
        format_value(present[-1] if present else None),
    ]


def _tiles(summary: Summary) -> list[_Tile]:
    by_name = {row.name: row for row in summary.metrics}

    def first(name: str) -> float | None:
        row = by_name.get(name)
        return row.by_rank[min(row.by_rank)] if row and row.by_rank else None

    from otel_training.semconv.metrics import (
        MEGATRON_TRAINING_LOSS,
        MEGATRON_TRAINING_THROUGHPUT_TFLOPS,
        MEGATRON_TRAINING_TOKENS_PER_SEC,
    )

    ranks = summary.ranks
    tiles = [
        _Tile(
            "steps",
            summary.steps_text if summary.steps is not None else "–",
            f"from {summary.steps_source}" if summary.steps_source else "",
        ),
        _Tile("duration", _duration(summary.duration_s), f"from {_iso(summary.start_ns)}"),
        _Tile(
            "ranks",
            f"{len(ranks)}" + (f" of {summary.world_size}" if summary.world_size else ""),
            (plural(len(summary.hosts), "host") + ": " if summary.hosts else "")
            + ", ".join(summary.hosts[:3])
            + (" …" if len(summary.hosts) > 3 else ""),
        ),
        _Tile(
            "last loss",
            format_value(first(MEGATRON_TRAINING_LOSS)),
            "rank " + str(min(ranks)) if ranks else "",
        ),
        _Tile("tokens/s", format_value(first(MEGATRON_TRAINING_TOKENS_PER_SEC)), "last value"),
        _Tile(
            "TFLOP/s per GPU",
            format_value(first(MEGATRON_TRAINING_THROUGHPUT_TFLOPS)),
            "last value",
        ),
    ]
    q = summary.step_duration_quantiles_ms
    tiles.append(
        _Tile(
            "step time p50",
            f"{format_value(q[0.5])} ms" if 0.5 in q else "–",
            f"p99 {format_value(q[0.99])} ms" if 0.99 in q else "",
        )
    )
    nonfinite = sum(summary.nonfinite.values())
    tiles.append(
        _Tile("non-finite values", format_value(nonfinite), "NaN or Inf passed", nonfinite > 0)
    )
    tiles.append(
        _Tile(
            "skipped iterations",
            format_value(summary.skipped_iters),
            "most of any rank",
            summary.skipped_iters > 0,
        )
    )
    return tiles


_ID_CHARACTERS = re.compile(r"[^A-Za-z0-9_.-]")


def dom_id(text: str) -> str:
    """``text`` as an HTML id that needs no escaping anywhere (plotly writes it into a
    ``<script>`` as it is): characters other than letters, digits, ``_ . -`` become ``_``, and
    a changed id gets a short hash of the original so that two stay apart."""
    safe = _ID_CHARACTERS.sub("_", text)[:120]
    if safe == text:
        return safe
    digest = hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=4).hexdigest()
    return f"{safe}-{digest}"


def _plot_html(plot, plotly, prefix: str = "") -> dict[str, Any]:
    div_id = dom_id(prefix + plot.id)
    html = plotly.io.to_html(
        plot.figure,
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        config=_PLOT_CONFIG,
        default_width="100%",
        default_height=f"{plot.figure.layout.height or 300}px",
        validate=False,
    )
    return {
        "id": div_id,
        "title": plot.title,
        "caption": plot.caption,
        "points": plot.points,
        "html": html,
    }


def build_report(source: Run | Job) -> str:
    """The report page of a run, or of every attempt of a job (each attempt its own sections,
    in the order they ran, after a table of the attempts).

    Sections: the job's run health; per attempt, its summary (run id, service, ranks, world
    size, steps, duration, files, the eight Megatron-LM metrics' last values, non-finite
    values, skipped iterations), training curves, step duration quantiles and histogram,
    per-layer tensor heatmaps (one colour scale per family over the job), the timeline of
    phases, the files read. Anything missing is said in the page instead. Every string from
    the files is escaped: it shows as text, never as markup or script.

    Raises:
        ModuleNotFoundError: when plotly or jinja2 is not installed (the ``report`` extra).
    """
    jinja2, plotly = _require_libraries()
    with no_gc():
        return _build(Job.of(source), jinja2, plotly)


#: Characters kept of a name from the files in the page's header and titles.
_HEADER_ID_LENGTH = 120
#: Characters kept of a value from the files in the summary and the tables.
_VALUE_LENGTH = 240
#: Characters kept of a note (notes quote names from the files).
_NOTE_LENGTH = 600


def _short(text: str, limit: int = _HEADER_ID_LENGTH) -> str:
    return cut(text, limit)


def _build(job: Job, jinja2, plotly) -> str:
    import markupsafe

    from otel_training.report import figures, heatmaps

    several = len(job.runs) > 1
    labels = job.labels
    axes = [figures.XAxis(run) for run in job.runs]
    tensor_data = [heatmaps.heatmap_data(run, axis) for run, axis in zip(job.runs, axes)]
    ranges = heatmaps.colour_ranges(data for found in tensor_data for data in found)
    attempts = []
    downsampled = False
    for index, run in enumerate(job.runs):
        prefix = f"a{index + 1}-" if several else ""
        context, shrunk = _attempt(
            run,
            labels[index] if several else "",
            prefix,
            plotly,
            axes[index],
            heatmaps.heatmap_plots(tensor_data[index], axes[index], ranges),
        )
        attempts.append(context)
        downsampled = downsampled or shrunk
    notes = list(job.notes)
    if not several:
        notes += job.runs[0].notes
    notes = [_short(note, _NOTE_LENGTH) for note in notes]
    if downsampled:
        notes.append(
            "Long series were downsampled to keep this page small: curves keep each bucket's "
            "lowest and highest point, heatmaps the last value per column, the timeline merges "
            "runs of one span name (captions say which). The files have every point."
        )
    health, health_plots, health_empty, verdict = _health(job)
    health_section = _Section(
        "health",
        "Run health",
        "Goodput over every attempt of this job, where each rank's time went, the progress "
        "a crash would lose, stragglers and a hang's culprit (definitions: "
        "<code>docs/health.md</code>; the same figures as <code>otel-training health</code>)."
        if health is not None
        else "",
        [_plot_html(p, plotly) for p in health_plots],
        health_empty,
    )
    plots = [p for a in attempts for s in a["sections"] for p in s.plots]
    plots += health_section.plots
    latest = attempts[-1]
    environment = jinja2.Environment(  # the templates of report/templates/, all HTML
        loader=jinja2.PackageLoader("otel_training.report"),
        autoescape=True,
        keep_trailing_newline=True,
    )
    template = environment.get_template("report.html.j2")
    title = (job.job_id or latest["summary"].run_id) if several else latest["summary"].run_id
    subtitle = (
        f"{len(job.runs)} attempts, ordered {_ORDERED[job.ordered_by]}"
        if several
        else latest["subtitle"]
    )
    return template.render(
        version=_version(),
        several=several,
        title=_short(title),
        subtitle=subtitle,
        notes=notes,
        attempts=attempts,
        attempt_rows=[a["row"] for a in attempts],
        health_section=health_section,
        health=health,
        verdict=verdict,
        plots=plots,
        plotly_js=markupsafe.Markup(plotly.offline.get_plotlyjs()) if plots else "",
        smooth_js=markupsafe.Markup(SMOOTH_JS),
        built_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )


_ORDERED = {
    "attempt": "by attempt number",
    "process.creation.time": "by process start time",
    "first record": "by first record",
}


def _ranks_fact(ranks: list[int]) -> str:
    """``1 (rank 0)``, ``2 (ranks 0, 1)``, ``8 (ranks 0–7)``."""
    if not ranks:
        return "–"
    return f"{len(ranks)} ({'rank' if len(ranks) == 1 else 'ranks'} {rank_list(ranks)})"


def _attempt(
    run: Run, label: str, prefix: str, plotly, axis, heatmap_plots: list
) -> tuple[dict[str, Any], bool]:
    """The template's context of one attempt (ids prefixed with ``prefix``) and whether any
    of its plots was downsampled."""
    from otel_training.report import figures

    summary = summarize(run, axis.clocks)
    curves, missing_curves = figures.curve_plots(run, axis)
    step_plots = figures.step_duration_plots(run, axis)
    timeline, _ = figures.timeline_plot(run)
    axis_lead = axis.lead(figures.curves_exact(run, axis), figures.curves_every_value(run))
    heatmap_lead = (
        f"x axis: {figures.STEP_AXIS}, the step reached when the values were exported (from "
        f"{axis.source})."
        if axis.is_steps
        else f"x axis: {figures.TIME_AXIS}."
    )
    sections = [
        _Section(
            prefix + "curves",
            "Training curves",
            axis_lead,
            [_plot_html(p, plotly, prefix) for p in curves],
            (
                "Not recorded: "
                + ", ".join(missing_curves)
                + "."
                + (
                    " Memory is recorded on CUDA devices only."
                    if "Memory allocated" in missing_curves
                    else ""
                )
            )
            if missing_curves
            else "",
            smoothing=figures.SMOOTHING if any(p.smoothed for p in curves) else None,
        ),
        _Section(
            prefix + "step-duration",
            "Step duration",
            "",
            [_plot_html(p, plotly, prefix) for p in step_plots],
            "" if step_plots else "No <code>megatron.training.step_duration_ms</code> point.",
        ),
        _Section(
            prefix + "tensors",
            "Tensor metrics per layer",
            "Per-layer statistics of the tensor observer, layers in model order; one colour "
            "scale per family, the same in every attempt. " + heatmap_lead
            if heatmap_plots
            else "",
            [_plot_html(p, plotly, prefix) for p in heatmap_plots],
            ""
            if heatmap_plots
            else "No per-layer tensor metric in this run (see "
            "<code>OTEL_PYTHON_TRAINING_TENSOR_METRICS</code> and docs/tensor-metrics.md).",
        ),
        _Section(
            prefix + "timeline",
            "Timeline",
            "",
            [_plot_html(timeline, plotly, prefix)] if timeline is not None else [],
            "" if timeline is not None else "No span in this run.",
            wide=True,
        ),
    ]
    metric_headers: list[str] = []
    metric_rows = []
    for row in summary.metrics:
        metric_headers, cells = _rank_cells(row.by_rank, summary.ranks)
        metric_rows.append({"name": row.name, "unit": row.unit, "what": row.what, "cells": cells})
    facts = [
        ("run id", summary.run_id),
        ("service", summary.service_name or "–"),
        ("ranks", _ranks_fact(summary.ranks)),
        ("world size", str(summary.world_size) if summary.world_size else "–"),
        ("hosts", ", ".join(summary.hosts) or "–"),
        ("started", _iso(summary.start_ns)),
        ("directory", str(run.directory)),
    ]
    if run.job_id is not None:
        facts.insert(1, ("job id", run.job_id))
    if run.attempt_label:
        facts.insert(2, ("attempt", run.attempt_label))
    if run.created_s is not None:
        facts.append(("processes started", _iso(run.created_s, 1.0)))
    facts = [(key, _short(value, _VALUE_LENGTH)) for key, value in facts]
    files = []
    for f in run.files:
        problems = []
        if f.error:
            problems.append(f.error)
        if f.torn_last_line:
            problems.append("last line cut")
        if f.bad_lines:
            problems.append(f"{f.bad_lines} unreadable lines")
        if f.skipped:
            problems.append(f.skipped)
        files.append(
            {
                "name": _short(f.path.name, _VALUE_LENGTH),
                "rank": f.rank,
                "size": _size(f.size_bytes),
                "lines": "–" if f.skipped else f"{f.lines:,}",
                "notes": ", ".join(problems) or "–",
                "modified": _iso(f.mtime_s, 1.0),
            }
        )
    subtitle = " · ".join(
        part
        for part in (
            _short(summary.service_name) if summary.service_name else None,
            plural(len(summary.ranks), "rank"),
            summary.steps_text if summary.steps is not None else None,
            _duration(summary.duration_s) if summary.duration_s is not None else None,
            _iso(summary.start_ns) if summary.start_ns is not None else None,
        )
        if part
    )
    shrunk = any(p.downsampled for p in [*curves, *step_plots, *heatmap_plots]) or (
        timeline is not None and timeline.downsampled
    )
    row = {
        "label": label,
        "anchor": f"#{prefix}summary",
        "run_id": _short(summary.run_id, _VALUE_LENGTH),
        "started": _iso(run.created_s, 1.0)
        if run.created_s is not None
        else _iso(summary.start_ns),
        "duration": _duration(summary.duration_s),
        "ranks": str(len(summary.ranks)),
        "steps": summary.steps_text if summary.steps is not None else "–",
        "failed": str(sum(1 for s in run.spans if s.failed)),
        "open": str(sum(1 for s in run.spans if s.truncated)),
        "directory": _short(str(run.directory), _VALUE_LENGTH),
    }
    context = {
        "label": label,
        "prefix": prefix,
        "summary": summary,
        "short_run_id": _short(summary.run_id),
        "subtitle": subtitle,
        "notes": [_short(note, _NOTE_LENGTH) for note in run.notes] if label else [],
        "tiles": _tiles(summary),
        "metric_table": {"headers": metric_headers, "rows": metric_rows},
        "nonfinite": [
            (_short(k, _VALUE_LENGTH), format_value(v))
            for k, v in sorted(summary.nonfinite.items())
        ],
        "facts": facts,
        "sections": sections,
        "files": files,
        "directory": _short(str(run.directory), _VALUE_LENGTH),
        "row": row,
    }
    return context, shrunk


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("otel-training")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def write_report(source: Run | Job, path: str | os.PathLike) -> Path:
    """Writes :func:`build_report` of ``source`` (a run, or a job's attempts) to ``path``
    (UTF-8; a lone surrogate, such as an undecodable byte of a directory name, is written as
    a backslash escape, ``\\xNN``).

    Returns:
        The absolute path written.

    Raises:
        ModuleNotFoundError: when plotly or jinja2 is not installed.
        OSError: when the file cannot be written.
    """
    page = build_report(source)
    path = Path(path).absolute()
    path.write_bytes(utf8(page))
    return path


def utf8(text: str) -> bytes:
    """``text`` in UTF-8, lone surrogates as backslash escapes (the string rule of
    :func:`otel_training.export.limits.safe_text`). Never raises."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        from otel_training.export.limits import safe_text

        return safe_text(text, None).encode()


def _health(job: Job) -> tuple[dict[str, Any] | None, list, str, Verdict]:
    """The job-level "Run health" section (every attempt of the job, once): its tables, plots,
    what to say when there is none, and the verdict the page opens with
    (:mod:`otel_training.report.verdict`, the words of ``otel-training health``). Never
    raises: a job that cannot be assessed is a sentence."""
    from otel_training.report import verdict as _verdict
    from otel_training.report.health import assess_read
    from otel_training.report.health_figures import health_plots, health_tables

    try:
        health = assess_read(job)
    except Exception as error:  # the report must not fail for its health section
        return (
            None,
            [],
            f"Run health could not be assessed ({type(error).__name__}: "
            f"{html.escape(str(error))}).",
            _verdict.unknown(f"it could not be assessed ({type(error).__name__}: {error})"),
        )
    if not any(p.ledger for p in health.processes):
        return (
            None,
            [],
            "No health ledger in these files (<code>dl.training.phase.time</code>): they were "
            "written by a version without it, or with metrics off.",
            _verdict.unknown(
                "no health ledger in these files (dl.training.phase.time): they were written "
                "by a version without it, with metrics off, or with metrics sent only to "
                "Prometheus or a collector"
            ),
        )
    return health_tables(health), health_plots(health), "", _verdict.judge(health)
