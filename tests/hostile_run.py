"""Run files whose every string is hostile, and the same run with plain strings, for the
report's and the trace's tests (tests/report/test_report_hostile.py, and in Chromium
tests/integration/test_report_browser.py).

Every string a file can carry (run and job ids, service and host names, span names, attribute
keys and values, exception messages and events, layer names and router statistics, metric
attributes, a gap's reason) is markup that would run a script or add an element if it were
not escaped, quotes of both kinds, ``</script>``, right-to-left text and direction overrides,
lone surrogates (written as JSON escapes, as a foreign writer might) and 10,000 characters;
the run directory's name too (with a byte that is not UTF-8). The plain run has the same
shape (ranks, spans, metrics, notes), so that the two pages have the same elements.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from report_files import key_value

#: A script that would mark the page if it ran (the browser test reads the mark).
MARK = "document.documentElement.setAttribute('data-pwned','{}');window.__pwned=1"

PAYLOADS = (
    "<script>" + MARK.format("script") + "</script>",
    '"><img src=x onerror="' + MARK.format("img").replace("'", "&#39;") + '">',
    "'\"></script><script>" + MARK.format("close") + "</script><!--",
    '<a href="javascript:' + MARK.format("link") + '">link</a><b>bold</b><br>new line',
    '<svg onload="' + MARK.format("svg") + '"><style>*{display:none}</style>',
    "RTL \u202eتجربة\u202c \u202dLTR\u202c \u2066isolate\u2069 %{y} {{7*7}} ${7*7}",
    "lone \ud800 surrogates \udfff\udc80",
)
LONG = "<script>" + MARK.format("long") + "</script>" + "\u202e" + "x" * 10_000

#: A directory name (bytes) that is hostile and not UTF-8.
DIRECTORY = os.fsdecode(
    b"run <img src=x onerror=\"document.title=1\"> 'sq' \xe2\x80\xae RTL \xff-a"
)


def hostile(slot: int, long: bool = False) -> str:
    """The hostile string of ``slot`` (every slot its own, so none is dropped as a repeat)."""
    return f"{slot}{LONG if long else ''}{PAYLOADS[slot % len(PAYLOADS)]}"


def plain(slot: int, long: bool = False) -> str:
    """The plain string of ``slot``."""
    return f"plain{slot}"


T0 = 1_796_000_000 * 10**9
S = 10**9


def _resource(text, rank: int, attempt: int) -> dict[str, Any]:
    return {
        "service.name": text(1, long=True),
        "service.instance.id": f"{text(2)}-{attempt}-{rank}",
        "host.name": text(3),
        "dl.rank": rank,
        "dl.world_size": 2,
        "dl.job.id": text(4, long=True),
        "dl.run.id": text(5, long=True) + f"-a{attempt}",
        "dl.run.attempt": attempt,
        text(6): text(7),
    }


def _gauge(name: str, points: list[tuple[int, float, dict]]) -> dict:
    return {
        "name": name,
        "gauge": {
            "dataPoints": [
                {"timeUnixNano": str(t), "asDouble": v,
                 "attributes": [key_value(k, a) for k, a in attrs.items()]}
                for t, v, attrs in points
            ]
        },
    }  # fmt: skip


def _metrics_lines(text, rank: int, attempt: int) -> list[str]:
    resource = {"attributes": [key_value(k, v) for k, v in _resource(text, rank, attempt).items()]}
    lines = []
    for export in range(1, 5):
        t = T0 + export * 5 * S
        step = export * 10
        metrics = [
            _gauge("megatron.training.loss", [(t, 4.0 / export, {})]),
            _gauge("megatron.training.learning_rate", [(t, 1e-3, {})]),
            _gauge("dl.training.progress.iteration", [(t, float(step), {})]),
            _gauge("dl.training.progress.logged_iteration", [(t, float(step), {})]),
            _gauge(
                "megatron.training.tensor.grad_norm",
                [
                    (t, 1.0 + layer + export, {"megatron.training.layer": text(10 + layer)})
                    for layer in range(2)
                ],
            ),  # fmt: skip
            _gauge(
                "megatron.training.tensor.router_balance",
                [
                    (
                        t,
                        1.5,
                        {
                            "megatron.training.layer": text(10),
                            "megatron.training.router.statistic": text(12),
                        },
                    )
                ],
            ),  # fmt: skip
            {
                "name": "megatron.training.step_duration_ms",
                "histogram": {
                    "aggregationTemporality": 2,
                    "dataPoints": [
                        {
                            "startTimeUnixNano": str(T0),
                            "timeUnixNano": str(t),
                            "count": str(step),
                            "sum": 100.0 * step,
                            "bucketCounts": ["0", str(step), "0"],
                            "explicitBounds": [50.0, 200.0],
                            "attributes": [],
                        }
                    ],
                },
            },  # fmt: skip
            {
                "name": "megatron.training.nonfinite_values",
                "sum": {
                    "aggregationTemporality": 2,
                    "isMonotonic": True,
                    "dataPoints": [
                        {
                            "startTimeUnixNano": str(T0),
                            "timeUnixNano": str(t),
                            "asInt": "1",
                            "attributes": [key_value("megatron.training.metric", text(13))],
                        }
                    ],
                },
            },  # fmt: skip
        ]
        document = {
            "resourceMetrics": [
                {"resource": resource,
                 "scopeMetrics": [{"scope": {"name": text(14)}, "metrics": metrics}]}
            ]
        }  # fmt: skip
        lines.append(json.dumps(document))
    return lines


def _span_lines(text, rank: int, attempt: int) -> list[str]:
    resource = _resource(text, rank, attempt)
    lines = []

    def span(name, span_id, parent, start, end, attributes, status="UNSET", events=()):
        base = {
            "name": name, "trace_id": "ab" * 16, "span_id": span_id, "parent_span_id": parent,
            "start_time_ns": start, "attributes": attributes, "rank": rank, "resource": resource,
        }  # fmt: skip
        lines.append(json.dumps({"record": "span_start", **base}))
        if end is not None:
            lines.append(json.dumps({
                "record": "span_end", **base, "end_time_ns": end,
                "duration_ms": (end - start) / 1e6, "status": status,
                "status_description": f"RuntimeError: {text(20, long=True)}"
                if status == "ERROR" else None,
                "events": list(events),
            }))  # fmt: skip

    root = f"{rank + 1:02x}{attempt:02x}" + "0" * 12
    span("megatron.train", root, None, T0, T0 + 30 * S, {"megatron.iteration": 0})
    for step in range(1, 4):
        span("megatron.train.iteration", f"{rank + 1:02x}{attempt:02x}{step:012x}", root,
             T0 + step * 5 * S, T0 + step * 5 * S + 2 * S,
             {"megatron.iteration": step, text(21): text(22, long=True)})  # fmt: skip
    span(
        text(23, long=True),
        f"{rank + 1:02x}{attempt:02x}" + "e" * 12,
        root,
        T0 + 20 * S,
        T0 + 22 * S,
        {text(24, long=True): text(25), "megatron.iteration": 3},
        status="ERROR",
        events=[
            {
                "name": "exception",
                "time_ns": T0 + 21 * S,
                "attributes": {"exception.type": text(26), "exception.message": text(27)},
            }
        ],
    )
    span(text(34), f"{rank + 1:02x}{attempt:02x}" + "d" * 12, root, T0 + 25 * S, None,
         {text(29): text(30)})  # never ended  # fmt: skip
    return lines


def _gap_line(text, rank: int, attempt: int) -> str:
    return json.dumps({
        "record": "gap", "file": f"spans-rank{rank}.jsonl", "from_unix_ns": T0 + S,
        "to_unix_ns": T0 + 2 * S, "lost_lines": 3, "lost_records": 3, "gone_lines": 0,
        "reason": text(31), "resource": _resource(text, rank, attempt),
    })  # fmt: skip


def write_job(base: Path, text=hostile, attempts: int = 2) -> list[Path]:
    """The run directories of a job of ``attempts`` attempts on two ranks, every string from
    ``text`` (:func:`hostile` or :func:`plain`). The last attempt's directory is named as the
    embedded default names it (from its run id); the earlier ones :data:`DIRECTORY` with the
    attempt (plain: ``plain-run-a{N}``), found as siblings of the same job. Returns the
    directories, attempt by attempt."""
    from otel_training.export.files import run_directory_name

    directories = []
    for attempt in range(attempts):
        if attempt == attempts - 1:
            name = run_directory_name(_resource(text, 0, attempt)["dl.run.id"])
        else:
            name = (DIRECTORY if text is hostile else "plain-run-a") + str(attempt)
        directory = base / name
        directory.mkdir(parents=True)
        for rank in (0, 1):
            _write(directory / f"metrics-rank{rank}.jsonl", _metrics_lines(text, rank, attempt))
            _write(directory / f"spans-rank{rank}.jsonl", _span_lines(text, rank, attempt))
        _write(directory / "gaps-rank0.jsonl", [_gap_line(text, 0, attempt)])
        directories.append(directory)
    return directories


def _write(path: Path, lines: list[str]) -> None:
    # json.dumps writes a lone surrogate as its \\uD8xx escape (ASCII): what lands on disk.
    with open(path, "w", encoding="ascii") as handle:
        handle.writelines(line + "\n" for line in lines)
    written = T0 / S + 40  # long ago: no "still in progress" note, whenever the test runs
    os.utime(path, (written, written))
