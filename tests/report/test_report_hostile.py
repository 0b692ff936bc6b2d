"""The report and the trace of runs whose every string is hostile (tests/hostile_run.py; and a
run recorded through the real pipeline with hostile names): the page has exactly the elements
of the same run with plain strings (no script, no element added), every section, ids that need
no escaping, the strings shown as text; the trace is strict JSON in the Trace Event Format.
Chromium loads the same pages in tests/integration/test_report_browser.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import hostile_run  # noqa: E402
import pytest
from support import import_or_unavailable, strict_json

import_or_unavailable("plotly")

import otel_training as ot  # noqa: E402
from otel_training.report import (  # noqa: E402
    build_chrome_trace,
    find_run_directory,
    load_job,
    write_chrome_trace,
    write_report,
)

SECTIONS = ("health", "attempts", "a1-summary", "a1-curves", "a1-tensors", "a1-timeline",
            "a2-summary", "a2-files")  # fmt: skip


class Structure(HTMLParser):
    """The elements of a page as the browser parses its HTML: a count per tag, the ids, the
    attributes that would run script, and the text of the ``<script>`` elements' starts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: Counter = Counter()
        self.ids: list[str] = []
        self.handlers: list[tuple[str, str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] += 1
        for key, value in attrs:
            if key == "id":
                self.ids.append(value or "")
            if key.startswith("on") or (value or "").strip().lower().startswith("javascript:"):
                self.handlers.append((tag, key))

    def handle_data(self, data):
        self.text.append(data)


def structure(page: str) -> Structure:
    parsed = Structure()
    parsed.feed(page)
    parsed.close()
    return parsed


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """The report page of the hostile job and of the plain one (two attempts, two ranks)."""
    found = {}
    for name, text in (("hostile", hostile_run.hostile), ("plain", hostile_run.plain)):
        base = tmp_path_factory.mktemp(name)
        directories = hostile_run.write_job(base, text)
        job = load_job(directories[-1])
        assert len(job.runs) == 2, [str(d) for d in job.directories]
        path = write_report(job, base / "report.html")
        found[name] = (path.read_text(encoding="utf-8"), directories[-1])
    return found


def test_a_hostile_job_adds_no_element(pages):
    """Tag for tag, the hostile page has the elements of the plain one: no script, image,
    link or style added; no event handler or javascript: URL anywhere."""
    hostile, plain = structure(pages["hostile"][0]), structure(pages["plain"][0])
    assert hostile.tags == plain.tags
    assert hostile.handlers == plain.handlers == []
    plots = len(re.findall(r"Plotly\.newPlot", pages["plain"][0]))
    # the error box's, plotly.js, the smoothing control's, one per plot
    assert hostile.tags["script"] == 3 + plots


def test_a_hostile_job_shows_every_section_and_its_strings_as_text(pages):
    """Every section is there; the payloads are text on the page (the run id, a span's error,
    a layer name inside plotly's data, the directory name with its undecodable byte)."""
    page = pages["hostile"][0]
    parsed = structure(page)
    assert set(SECTIONS) <= set(parsed.ids)
    text = "".join(parsed.text)
    assert "<script>document.documentElement.setAttribute('data-pwned','long')" in text
    assert "'sq' \u202e RTL \\xff-a0" in text  # the directory's byte, as the string rule says
    assert "lone \\ud800 surrogates \\udfff\\x80" in text  # lone surrogates, escaped
    assert "<script>document" not in page  # never raw, in the HTML or plotly's data
    assert "&lt;script&gt;document" in page


def test_every_id_of_the_page_needs_no_escaping(pages):
    """Ids (plotly writes the plot's into a script as it is) are letters, digits, _ . -."""
    for name in ("hostile", "plain"):
        ids = structure(pages[name][0]).ids
        assert ids and all(re.fullmatch(r"[A-Za-z0-9_.-]+", i) for i in ids), name
    assert len(set(structure(pages["hostile"][0]).ids)) == len(structure(pages["hostile"][0]).ids)


def check_trace_events(document: dict) -> None:
    """The Trace Event Format's JSON Object Format, as Perfetto and chrome://tracing read it."""
    assert set(document) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert document["displayTimeUnit"] in ("ms", "ns")
    for event in document["traceEvents"]:
        assert event["ph"] in ("M", "X", "i") and isinstance(event["name"], str)
        assert type(event["pid"]) is int and isinstance(event.get("args", {}), dict)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "process_sort_index", "process_labels",
                                     "thread_name", "thread_sort_index")  # fmt: skip
            continue
        assert type(event["tid"]) is int and isinstance(event["ts"], (int, float))
        assert event["ts"] >= 0 and isinstance(event["cat"], str)
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0
        else:
            assert event["s"] in ("t", "p", "g")


def test_the_trace_of_a_hostile_job_is_strict_json_with_its_names_intact(pages, tmp_path):
    """The trace file loads with json (strict UTF-8, no NaN), has the format's structure,
    and keeps the span names as they were (lone surrogates as backslash escapes)."""
    directory = pages["hostile"][1]
    path = write_chrome_trace(load_job(directory), tmp_path / "trace.json")
    raw = path.read_bytes()
    document = strict_json(raw)
    check_trace_events(document)
    names = {e["name"] for e in document["traceEvents"] if e["ph"] == "X"}
    assert hostile_run.hostile(23, long=True) in names
    assert any("lone \\ud800 surrogates" in n for n in names)
    assert "\\xff-a0" in json.dumps(document["otherData"]["attempts"][0]["directory"])
    plain = build_chrome_trace(load_job(pages["plain"][1]))
    assert len(plain["traceEvents"]) == len(document["traceEvents"])


def _record_hostile_run(text, output: Path) -> Path:
    """A run recorded through the real pipeline (configure, phases, metrics, an exception),
    every name and value from ``text``, into ``output``; the run directory it wrote."""
    environ = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(output),
        "OTEL_SERVICE_NAME": text(1, long=True),
        "OTEL_PYTHON_TRAINING_RUN_ID": text(5, long=True),
        "OTEL_RESOURCE_ATTRIBUTES": "team=" + text(6).replace(",", " ").replace("=", " "),
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
    }
    telemetry = ot.configure(environ=environ)
    with ot.training_run(**{text(21): text(22, long=True)}):
        for step in range(1, 4):
            with ot.training_iteration(iteration=step) as it:
                it.set_attribute(text(24, long=True), text(25))
            ot.record_training_metrics(telemetry.meter, step_duration_ms=10.0, loss=1.0 / step)
        try:
            with ot.phase(text(23, long=True), **{text(29): text(30)}):
                raise RuntimeError(text(27, long=True))
        except RuntimeError:
            pass
    telemetry.shutdown()
    return find_run_directory(output)


def test_a_run_recorded_with_hostile_names_reports_like_a_plain_one(tmp_path):
    """Through the real exporters and back: the same elements as the plain run's page, and
    a strict trace."""
    pages = {}
    for name, text in (("hostile", hostile_run.hostile), ("plain", hostile_run.plain)):
        directory = _record_hostile_run(text, tmp_path / name)
        job = load_job(directory)
        pages[name] = structure(write_report(job, tmp_path / f"{name}.html").read_text("utf-8"))
        check_trace_events(build_chrome_trace(job))
        ot.testing.reset()
    assert pages["hostile"].tags == pages["plain"].tags
    assert pages["hostile"].handlers == []
