"""Reports from the embedded default's files: an offline HTML report and a Perfetto trace.

Usage::

    from otel_training import report

    job = report.load_job(report.find_run_directory("otel-training-telemetry"))
    report.write_report(job, "report.html")        # needs the report extra (plotly, jinja2)
    report.write_chrome_trace(job, "trace.json")   # Perfetto UI, chrome://tracing

Importing this package imports neither plotly nor jinja2; :func:`write_report` does.

This package is in the report layer (``tests/test_import_layers.py``): it reads files with the
health definitions, the settings and the SDK's names below it, and is imported only by the
tools (the command line, ``testing``).
"""

from otel_training.report.chrome_trace import build_chrome_trace, write_chrome_trace
from otel_training.report.html import REPORT_HINT, build_report, write_report
from otel_training.report.quantiles import histogram_quantile, quantiles_over_time
from otel_training.report.reader import load_job, load_run
from otel_training.report.run import (
    TRUNCATED_ATTRIBUTE,
    CounterSeries,
    FileStats,
    Gap,
    GaugeSeries,
    HistogramSeries,
    Job,
    RankTelemetry,
    Run,
    Span,
)
from otel_training.report.rundir import RunNotFoundError, find_run_directory, job_directories

__all__ = [
    "REPORT_HINT",
    "TRUNCATED_ATTRIBUTE",
    "CounterSeries",
    "FileStats",
    "Gap",
    "GaugeSeries",
    "HistogramSeries",
    "Job",
    "RankTelemetry",
    "Run",
    "RunNotFoundError",
    "Span",
    "build_chrome_trace",
    "build_report",
    "find_run_directory",
    "histogram_quantile",
    "job_directories",
    "load_job",
    "load_run",
    "quantiles_over_time",
    "write_chrome_trace",
    "write_report",
]
