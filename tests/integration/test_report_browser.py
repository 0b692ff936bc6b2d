"""The report of a real demo run, opened from file:// in a real headless Chromium: no script
error, every plot drawn with data points, no request made by the page, and a screenshot."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support import child_env, chromium_or_unavailable, import_or_unavailable

import_or_unavailable("torch")
import_or_unavailable("plotly")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--hide-scrollbars",
    "--virtual-time-budget=15000",
]
DEMO = [
    "demo", "--steps", "40", "--log-interval", "4", "--layers", "2", "--d-model", "32",
    "--heads", "2", "--seq-len", "32", "--batch-size", "4", "--moe", "--experts", "4",
    "--eval-interval", "20", "--checkpoint-interval", "20", "--max-data-bytes", "200000",
    "--tensor-metrics", "grad_norm:2,param_norm:2,activation_rms:2,router:2",
    "--device", "cpu", "--quiet",
]  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A real demo run (several metric exports, all span groups, tensor metrics), reported
    with the real command."""
    base = tmp_path_factory.mktemp("report-browser")
    env = child_env(
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(base / "telemetry"),
        OTEL_METRIC_EXPORT_INTERVAL="200",
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="all",
        OTEL_PYTHON_TRAINING_SHUTDOWN_ON_SIGTERM="false",
    )
    demo = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", *DEMO],
        env=env, cwd=base, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr[-3000:]
    output = base / "report.html"
    made = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "report", "-o", str(output)],
        env=env, cwd=base, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    assert str(output) in made.stdout
    return output


class _Rendered(HTMLParser):
    """Per plot container: the data points plotly drew (markers and bars, line vertices,
    heatmap images); and the script-error box."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, int]] = {}
        self.current: str | None = None
        self.depth = 0
        self.errors_hidden: bool | None = None
        self.error_lines = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id") == "script-errors":
            self.errors_hidden = "hidden" in attrs
        if "script-error" in (attrs.get("class") or "").split():
            self.error_lines += 1
        if tag == "div" and "data-plot" in attrs and self.current is None:
            self.current, self.depth = attrs["data-plot"], 0
            self.plots[self.current] = {"expected": int(attrs["data-points"]), "points": 0,
                                        "vertices": 0, "images": 0, "svg": 0}  # fmt: skip
        if self.current is None:
            return
        if tag == "div":
            self.depth += 1
        counts = self.plots[self.current]
        classes = (attrs.get("class") or "").split()
        if tag == "svg" and "main-svg" in classes:
            counts["svg"] += 1
        if tag in ("path", "g") and "point" in classes:  # a marker path, a bar's group
            counts["points"] += 1
        if tag == "path" and "js-line" in classes:
            d = attrs.get("d") or ""
            counts["vertices"] += d.count("M") + d.count("L")
        if tag == "image":
            counts["images"] += 1

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "div":
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.current is not None and tag == "div":
            self.depth -= 1
            if self.depth == 0:
                self.current = None


def _browse(url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [chromium_or_unavailable(), *FLAGS, f"--user-data-dir={profile}", *extra, url],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def _page_requests(net_log: Path) -> list[str]:
    """URLs of the requests that a page (not the browser itself) started, from a net log."""
    log = json.loads(net_log.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log["events"]:
        params = event.get("params") or {}
        if event["type"] != start_job or "url" not in params:  # the end of a job has no URL
            continue
        if params.get("initiator") != "not an origin":  # the browser's own: "not an origin"
            urls.append(params["url"])
    return urls


def test_the_report_renders_without_errors_and_every_plot_has_points(report, tmp_path):
    """Loaded from file://, the page reports no script error and each plot has drawn points."""
    result = _browse(report.as_uri(), tmp_path, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = _Rendered()
    dom.feed(result.stdout)
    assert dom.errors_hidden is True and dom.error_lines == 0
    names = set(dom.plots)
    for metric in ("loss", "learning_rate", "grad_norm", "tokens_per_sec", "throughput_tflops"):
        assert f"plot-curve-megatron.training.{metric}" in names
    assert {
        "plot-step-duration-quantiles",
        "plot-step-duration-histogram",
        "plot-timeline",
    } <= names
    heatmaps = [n for n in names if n.startswith("plot-heatmap-")]
    assert len(heatmaps) >= 6  # grad, param, activation RMS, 3 router statistics, entropy
    for name, counts in dom.plots.items():
        assert counts["expected"] > 0, name
        assert counts["svg"] >= 1, f"{name} was not drawn"
        drawn = counts["points"] + counts["vertices"] + counts["images"]
        assert drawn > 0, f"{name} has no data point in the DOM: {counts}"
        if name.startswith("plot-heatmap-"):
            assert counts["images"] >= 1
        if name in ("plot-step-duration-histogram", "plot-timeline"):
            assert counts["points"] == counts["expected"]  # one bar per bucket / span


def test_the_page_requests_nothing(report, tmp_path):
    """The report page starts no request in the net log, where a fetching probe page shows one."""
    net_log = tmp_path / "report-net.json"
    result = _browse(report.as_uri(), tmp_path, "--dump-dom", f"--log-net-log={net_log}")
    assert result.returncode == 0
    assert _page_requests(net_log) == []
    probe = tmp_path / "probe.html"
    probe.write_text('<!DOCTYPE html><img src="http://127.0.0.1:9/probe.png">')
    probe_log = tmp_path / "probe-net.json"
    _browse(probe.as_uri(), tmp_path, "--dump-dom", f"--log-net-log={probe_log}")
    assert _page_requests(probe_log) == ["http://127.0.0.1:9/probe.png"]


def test_a_screenshot_of_the_report(report, tmp_path_factory):
    """A full-width screenshot of the page is written (a PNG of the window's size)."""
    shot = report.parent / "report.png"
    result = _browse(
        report.as_uri(), report.parent, "--window-size=1400,3000", f"--screenshot={shot}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (1400, 3000)
    print(f"screenshot: {shot} ({shot.stat().st_size:,} bytes, {width}x{height})")


ATTEMPT = (
    "import otel_training as ot\n"
    "t = ot.configure()\n"
    "for it in range(1, 9):\n"
    "    with ot.training_iteration(iteration=it):\n"
    "        pass\n"
    "    ot.record_training_metrics(t.meter, loss=2.0 / it, step_duration_ms=3.0)\n"
    "    t.force_flush()\n"
    "t.shutdown()\n"
)


def test_a_report_of_two_attempts_draws_each_attempt(tmp_path):
    """Two attempts of one SLURM job (requeue 0 and 1), reported from the output directory
    with the real command: the attempts table links both, each attempt's curves and timeline
    are drawn (prefixed ids a1-/a2-, none shared), and no script fails."""
    env = child_env(
        OTEL_PYTHON_TRAINING_OUTPUT_DIR=str(tmp_path / "telemetry"),
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="per_step",
        SLURM_JOB_ID="913",
        SLURM_PROCID="0",
        SLURM_NTASKS="1",
    )
    for count in ("0", "1"):
        done = subprocess.run(
            [sys.executable, "-c", ATTEMPT], env={**env, "SLURM_RESTART_COUNT": count},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    output = tmp_path / "attempts.html"
    made = subprocess.run(
        [sys.executable, "-m", "otel_training.cli", "report", str(tmp_path / "telemetry"),
         "-o", str(output)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0 and "job 913, 2 attempts," in made.stdout, made.stderr
    result = _browse(output.as_uri(), tmp_path, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = _Rendered()
    dom.feed(result.stdout)
    assert dom.errors_hidden is True and dom.error_lines == 0
    for prefix in ("a1-", "a2-"):
        for plot in ("plot-curve-megatron.training.loss", "plot-timeline"):
            counts = dom.plots[prefix + plot]
            assert counts["svg"] >= 1 and counts["points"] + counts["vertices"] > 0, plot
    assert 'href="#a1-summary">attempt 0</a>' in result.stdout
    assert 'href="#a2-summary">attempt 1</a>' in result.stdout


class _Structure(HTMLParser):
    """A rendered page's elements: per tag, those outside the plots and, inside them, those
    that hostile text could add (links, scripts, images, styled or broken text); the marks
    a payload's script would leave; the sections; each plot's drawing."""

    INJECTABLE = frozenset(
        ("a", "script", "img", "iframe", "object", "embed", "style", "link", "foreignobject")
        + ("tspan", "b", "i", "br", "input", "form", "svg")
    )

    def __init__(self) -> None:
        super().__init__()
        self.outside: dict[str, int] = {}
        self.inside: dict[str, int] = {}
        self.marks: list[str] = []
        self.ids: set[str] = set()
        self.title = ""
        self._in_title = False
        self._plot_depth = 0
        self.plots: dict[str, int] = {}
        self._plot = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-pwned" in attrs:
            self.marks.append(attrs["data-pwned"] or "")
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        self._in_title = tag == "title"
        if tag == "div" and "data-plot" in attrs and self._plot is None:
            self._plot, self._plot_depth = attrs["data-plot"], 0
            self.plots[self._plot] = 0
        if self._plot is None:
            self.outside[tag] = self.outside.get(tag, 0) + 1
            return
        if tag == "div":
            self._plot_depth += 1
        if tag in self.INJECTABLE:
            self.inside[tag] = self.inside.get(tag, 0) + 1
        if tag == "svg" and "main-svg" in (attrs.get("class") or ""):
            self.plots[self._plot] += 1

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "div":
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        self._in_title = False
        if self._plot is not None and tag == "div":
            self._plot_depth -= 1
            if self._plot_depth == 0:
                self._plot = None

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def test_a_report_whose_every_string_is_hostile_runs_no_script_and_adds_no_element(tmp_path):
    """A job of two attempts whose every string is markup, script, quotes, </script>,
    right-to-left overrides, lone surrogates and 10,000 characters (run and job ids, service,
    span names, attribute keys and values, exception messages, layer names, the directory
    name), reported with the real command and rendered in Chromium: no payload's script ran,
    the page has the elements of the same job with plain strings (plots included), every
    section and plot is drawn, no script error; its trace is strict JSON."""
    import hostile_run

    rendered = {}
    for name, text in (("hostile", hostile_run.hostile), ("plain", hostile_run.plain)):
        directories = hostile_run.write_job(tmp_path / name, text)
        output = tmp_path / f"{name}.html"
        made = subprocess.run(
            [sys.executable, "-m", "otel_training.cli", "report", str(directories[-1]),
             "-o", str(output)],
            env=child_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert made.returncode == 0 and ", 2 attempts," in made.stdout, made.stderr[-3000:]
        result = _browse(output.as_uri(), tmp_path, "--dump-dom")
        assert result.returncode == 0, result.stderr[-2000:]
        page = _Structure()
        page.feed(result.stdout)
        rendered[name] = page
        dom = _Rendered()
        dom.feed(result.stdout)
        assert dom.errors_hidden is True and dom.error_lines == 0, name
        traced = subprocess.run(
            [sys.executable, "-m", "otel_training.cli", "trace", str(directories[-1]),
             "-o", str(tmp_path / f"{name}.json")],
            env=child_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert traced.returncode == 0, traced.stderr[-3000:]
        document = json.loads((tmp_path / f"{name}.json").read_bytes().decode("utf-8"))
        assert {e["ph"] for e in document["traceEvents"]} == {"M", "X", "i"}
    hostile, plain = rendered["hostile"], rendered["plain"]
    assert hostile.marks == [] and plain.marks == []
    assert hostile.title == plain.title.replace("plain4", hostile.title.split(" · ")[0])
    assert hostile.outside == plain.outside
    assert hostile.inside == plain.inside
    for section in ("health", "attempts", "a1-summary", "a1-curves", "a2-tensors",
                    "a2-timeline", "a2-files"):  # fmt: skip
        assert section in hostile.ids, section
    assert len(hostile.plots) == len(plain.plots) >= 16 and all(hostile.plots.values())
