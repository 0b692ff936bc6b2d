"""Prometheus measured, not only modelled: a real Prometheus holding 65,536 series shaped like
otel-training's, its head series, resident memory and bytes per series.

The exposition is generated from the scale model (``bench/scale_model.py``): every series of a
rank of the 4,096-rank job (TP 8, PP 16, DP 32), named as the stack names them
(UnderscoreEscapingWithSuffixes), with the rank identity that ``collector-config/prometheus.yaml``
promotes to labels (its ``promote_resource_attributes``, plus ``job`` and ``instance``) and a
``target_info`` per rank: ranks 0, 1, 2, ... until 65,536 series. A small HTTP server on
127.0.0.1 serves it in the text format, every value moving at every scrape; Debian's Prometheus
(2.x: it has no OTLP receiver, so it scrapes what the stack would push) scrapes it every 5 s.

Measured: ``prometheus_tsdb_head_series``, ``process_resident_memory_bytes`` and
``go_memstats_heap_inuse_bytes`` before the target is added (Prometheus scraping itself) and
after a minute of scrapes; bytes per series = the growth over the series added. Extrapolated
(labelled so): that figure times the series of the 4,096-rank job from the model.

Usage: python bench/prometheus_scale.py [--series N] [--scrapes N] (make bench-prometheus);
about 2 minutes. Needs the ``prometheus`` binary (PROMETHEUS_BINARY, PATH or /usr/bin).
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

import _verdict
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _scale_model():
    spec = importlib.util.spec_from_file_location("scale_model", ROOT / "bench" / "scale_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("scale_model", module)
    spec.loader.exec_module(module)
    return module


model = _scale_model()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series_of_job(w, count: int) -> list[tuple[str, str]]:
    """The first ``count`` series of job ``w``, rank after rank: ``(name, label text)`` each,
    labels sorted. Every rank has its series (EXPORT_REPLICATED=auto applied: the ranks that do
    not export replicated values lack them) and one ``target_info``."""
    promoted = yaml.safe_load((ROOT / "collector-config" / "prometheus.yaml").read_text())["otlp"][
        "promote_resource_attributes"
    ]
    loud = model.rank_streams(w, exports_replicated=True)
    quiet = model.rank_streams(w, exports_replicated=False)
    out: list[tuple[str, str]] = []
    rank = 0
    while len(out) < count:
        resource = model.rank_resource(w, rank)
        layout = {k: resource[k] for k in model._LAYOUT_KEYS}
        exports = model.replicated.decide(w.replicated_policy, w.ranks, layout).exports
        identity = {model._label(k): str(resource[k]) for k in promoted if k in resource}
        identity["job"] = str(resource["service.name"])
        identity["instance"] = str(resource["service.instance.id"])
        for stream in loud if exports else quiet:
            for name, labels in model.prometheus_samples(stream):
                out.append((name, _labels({**identity, **labels})))
        info = {
            model._label(k): str(v)
            for k, v in resource.items()
            if k not in promoted and not k.startswith("dl.")
        }
        out.append(("target_info", _labels({**identity, **info})))
        rank += 1
    return out[:count]


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


class Exposition:
    """The text exposition of ``series``, new values at every request (a random walk per
    series, so that chunks hold real samples). Thread-safe; counters only go up."""

    def __init__(self, series: list[tuple[str, str]]) -> None:
        self.series = series
        self.values = [random.Random(i).uniform(1, 100) for i in range(len(series))]
        self.rng = random.Random(65536)
        self.lock = threading.Lock()
        self.scrapes = 0

    def render(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            lines = []
            for i, (name, labels) in enumerate(self.series):
                self.values[i] += self.rng.random()
                lines.append(f"{name}{{{labels}}} {self.values[i]:.6g}")
            return ("\n".join(lines) + "\n").encode()


def serve(exposition: Exposition) -> tuple[http.server.ThreadingHTTPServer, int]:
    """Serves ``exposition`` on 127.0.0.1, a free port, on a daemon thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - name fixed by http.server
            body = exposition.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def find_prometheus() -> str | None:
    for candidate in (os.environ.get("PROMETHEUS_BINARY"), shutil.which("prometheus")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    """A Prometheus process of this run (its own port, configuration and TSDB)."""

    def __init__(self, binary: str, workdir: Path, scrape_interval_s: float) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.interval = scrape_interval_s
        self.config = workdir / "prometheus.yaml"
        self._write([])
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "prometheus.log").open("wb"),
        )
        self._wait(lambda: self._get("/-/ready") is not None, 60, "ready")

    def _write(self, targets: list[str]) -> None:
        jobs = [
            {
                "job_name": "prometheus",
                "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}],
            }
        ]
        if targets:
            jobs.append(
                {
                    "job_name": "training",
                    "honor_labels": True,
                    "scrape_timeout": f"{self.interval:g}s",
                    "sample_limit": 0,
                    "static_configs": [{"targets": targets}],
                }
            )
        config = {
            "global": {"scrape_interval": f"{self.interval:g}s"},
            "scrape_configs": jobs,
        }
        self.config.write_text(yaml.safe_dump(config))

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.read()
        except OSError:
            return None

    def value(self, expr: str) -> float | None:
        body = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        if body is None:
            return None
        result = json.loads(body)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def add_target(self, target: str) -> None:
        self._write([target])
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/-/reload", method="POST")
        urllib.request.urlopen(request, timeout=30).close()

    def _wait(self, probe, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not probe():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.workdir / "prometheus.log").read_text(errors="replace")
                raise RuntimeError(f"Prometheus not {what} within {timeout_s:g} s:\n{log}")
            time.sleep(0.5)

    def wait_for(self, expr: str, minimum: float, timeout_s: float) -> float:
        found = {}

        def probe() -> bool:
            found["v"] = self.value(expr)
            return found["v"] is not None and found["v"] >= minimum

        self._wait(probe, timeout_s, f"{expr} >= {minimum:g}")
        return found["v"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


MEMORY = {
    "head series": "prometheus_tsdb_head_series",
    "resident memory": "process_resident_memory_bytes",
    "Go heap in use": "go_memstats_heap_inuse_bytes",
}


def measure(series_count: int, scrapes: int, interval_s: float) -> dict[str, float]:
    """Runs the measurement; the figures before and after, and bytes per series."""
    binary = find_prometheus()
    if binary is None:
        raise SystemExit("no prometheus binary (apt-get install prometheus, or PROMETHEUS_BINARY)")
    w = model.Workload(4096)
    series = series_of_job(w, series_count)
    exposition = Exposition(series)
    server, port = serve(exposition)
    workdir = Path(tempfile.mkdtemp(prefix="prometheus-scale-"))
    prometheus = Prometheus(binary, workdir, interval_s)
    try:
        prometheus.wait_for("prometheus_tsdb_head_series", 1, 60)
        time.sleep(3 * interval_s)  # a few self-scrapes: the baseline settles
        before = {k: prometheus.value(v) or 0.0 for k, v in MEMORY.items()}
        prometheus.add_target(f"127.0.0.1:{port}")
        prometheus.wait_for(
            "prometheus_tsdb_head_series", before["head series"] + series_count, 300
        )
        started = exposition.scrapes
        deadline = time.monotonic() + scrapes * interval_s * 4 + 60
        while exposition.scrapes - started < scrapes and time.monotonic() < deadline:
            time.sleep(interval_s / 2)
        time.sleep(interval_s)  # the last scrape's memory shows in the next self-scrape
        after = {k: prometheus.value(v) or 0.0 for k, v in MEMORY.items()}
        scraped = exposition.scrapes - started
        duration = prometheus.value('scrape_duration_seconds{job="training"}') or 0.0
    finally:
        prometheus.stop()
        server.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    added = after["head series"] - before["head series"]
    return {
        **{f"{k} before": v for k, v in before.items()},
        **{f"{k} after": v for k, v in after.items()},
        "series added": added,
        "scrapes": scraped,
        "scrape duration s": duration,
        "resident bytes per series": (after["resident memory"] - before["resident memory"]) / added,
        "heap bytes per series": (after["Go heap in use"] - before["Go heap in use"]) / added,
        "ranks generated": _ranks_in(series),
    }


def _ranks_in(series: list[tuple[str, str]]) -> int:
    return sum(1 for name, _ in series if name == "target_info")


def main(argv: list[str] | None = None) -> int:
    parser = _verdict.parser(__doc__, "about 2 min", targets=False)
    parser.add_argument("--series", type=int, default=65_536)
    parser.add_argument("--scrapes", type=int, default=12, help="scrapes of the target")
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval, s")
    args = parser.parse_args(argv)
    figures = measure(args.series, args.scrapes, args.interval)
    print(f"Prometheus {_version()} scraping {args.series:,} series of otel-training's shape")
    print(
        f"({figures['ranks generated']:.0f} ranks of the 4,096-rank job, {args.scrapes} scrapes "
        f"every {args.interval:g} s; one scrape took {figures['scrape duration s']:.2f} s)\n"
    )
    rows = []
    for key in MEMORY:
        rows.append([key, f"{figures[key + ' before']:,.0f}", f"{figures[key + ' after']:,.0f}"])
    print(model._table(["[measured]", "before", "after"], rows))
    per_series = figures["resident bytes per series"]
    per_heap = figures["heap bytes per series"]
    print(
        f"\n[measured] {figures['series added']:,.0f} series added: "
        f"{per_series:,.0f} B resident per series, {per_heap:,.0f} B of Go heap per series."
    )
    print("\n[measured x model] extrapolated to the jobs of the scale model:\n")
    rows = []
    for w in model.SCALES:
        for policy in ("all", "auto"):
            load = model.metrics_load(replace(w, replicated_policy=policy))
            rows.append(
                [
                    f"{w.ranks:,}",
                    policy,
                    f"{load.series:,}",
                    f"{load.series * per_series / 2**30:.2f} GiB",
                    f"{load.series * per_heap / 2**30:.2f} GiB",
                ]
            )
    print(
        model._table(
            ["ranks", "EXPORT_REPLICATED", "active series [model]", "resident", "Go heap"], rows
        )
    )
    return 0


def _version() -> str:
    binary = find_prometheus()
    if binary is None:
        return "?"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return out.split()[2] if len(out.split()) > 2 else out.strip()


if __name__ == "__main__":
    sys.exit(main())
