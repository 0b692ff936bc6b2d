"""A real Prometheus for integration tests, and long-lived Python driver processes it scrapes.

`PrometheusServer` starts the `prometheus` binary (Debian's ``/usr/bin/prometheus`` in CI) as
the test's own process: a free port on 127.0.0.1, a configuration file and a TSDB in a temporary
directory. It never touches a system service. Queries go through the HTTP API; every wait is a
bounded poll.

`DriverProcess` runs Python code in a child process that stays alive while Prometheus scrapes
it, and talks to the test through lines on stdin/stdout.

`grafana_render` expands Grafana template variables in a PromQL expression as Grafana does
before it sends the query.
"""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from otlp_receiver import LOOPBACK, free_port
from support import child_env

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]


def poll(what: str, probe: Callable[[], T | None], timeout_s: float, interval_s: float = 0.2) -> T:
    """Calls `probe` until it returns something other than None (or False); returns that.

    Raises:
        TimeoutError: after `timeout_s` seconds, naming `what` and the last value seen.
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s (last: {last!r})")
        time.sleep(interval_s)


def free_port_run(count: int) -> int:
    """A base port P such that P..P+count-1 are free on 127.0.0.1 now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.bind(("127.0.0.1", port))
                sockets.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no run of free ports")


class PrometheusError(RuntimeError):
    """Prometheus answered an API call with an error."""


class PrometheusServer:
    """One Prometheus process on 127.0.0.1 with a configuration and TSDB under `workdir`.

    Args:
        binary: the `prometheus` executable.
        workdir: an empty directory for prometheus.yaml, the TSDB and the log.
        config: the configuration, as the YAML document's mapping.
    """

    def __init__(self, binary: str, workdir: Path, config: Mapping[str, Any]) -> None:
        self.binary = binary
        self.workdir = Path(workdir)
        self.config = dict(config)
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> PrometheusServer:
        """Starts Prometheus and waits until /-/ready answers 200."""
        config_path = self.workdir / "prometheus.yaml"
        config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        for attempt in range(3):  # another process may grab the free port in between
            self.port = free_port()
            log = self._log_path.open("ab")
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address={LOOPBACK}:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
            log.close()
            try:
                poll("Prometheus ready", self._ready, timeout_s)
                return self
            except TimeoutError:
                self.stop()
                if attempt == 2:
                    raise RuntimeError(f"Prometheus did not start:\n{self.log()}") from None
        return self

    def _ready(self) -> bool | None:
        if self._process is not None and self._process.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return None

    def log(self) -> str:
        """What Prometheus printed so far."""
        try:
            return self._log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stops the process (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- HTTP API -------------------------------------------------------------------------

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """GET /api/v1/<path> with `params`; returns the `data` of a successful answer.

        Raises:
            PrometheusError: on an error answer (for example a PromQL syntax error).
        """
        query = urllib.parse.urlencode(params, doseq=True)
        url = f"{self.url}/api/v1/{path}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            body = json.loads(error.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the result vector (or [] for an empty one)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return result

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        """Range query; the result matrix."""
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step_s:g}"
        )
        return data["result"]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """Values of `label`, optionally only on series that `match` selects."""
        params = {} if match is None else {"match[]": [match]}
        return self.api(f"label/{label}/values", **params)

    def series(self, match: str) -> list[dict[str, str]]:
        """Label sets of the series that the selector `match` selects."""
        return self.api("series", **{"match[]": [match]})

    def value(self, expr: str) -> float | None:
        """The value of a query that yields one sample, or None when it yields nothing."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None

    def targets_up(self) -> dict[str, float]:
        """`up` of every scrape job: job name -> 1.0 or 0.0."""
        return {r["metric"]["job"]: float(r["value"][1]) for r in self.query("up")}


# -- driver processes ------------------------------------------------------------------------


class DriverProcess:
    """Python `code` running in a child process, talked to through lines.

    The child reads commands from stdin and answers on stdout; `send` writes a line, `expect`
    waits (bounded) for a line that starts with a prefix. stderr is kept for failure messages.
    """

    def __init__(
        self,
        code: str,
        env: Mapping[str, str | None] | None = None,
        args: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._seen: list[str] = []
        self._stderr: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=child_env(env),
            cwd=cwd or REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        threading.Thread(
            target=self._pump, args=(self.process.stdout, self._lines), daemon=True
        ).start()
        threading.Thread(target=self._drain, daemon=True).start()

    @staticmethod
    def _pump(stream, lines: queue.Queue[str | None]) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._stderr.append(line)

    def output(self) -> str:
        """Everything the child printed so far, stdout then stderr."""
        return "\n".join(self._seen) + "\n--- stderr ---\n" + "".join(self._stderr)

    def send(self, line: str) -> None:
        """Writes one command line to the child's stdin."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect(self, prefix: str, timeout_s: float = 60.0) -> str:
        """The next stdout line that starts with `prefix` (earlier lines are kept in output()).

        Raises:
            AssertionError: when the child exits or `timeout_s` passes first.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(remaining, 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"no line starting {prefix!r} within {timeout_s:g} s\n{self.output()}"
                ) from None
            if line is None:
                self.process.wait(timeout=10)
                raise AssertionError(
                    f"driver exited ({self.process.returncode}) before {prefix!r}\n{self.output()}"
                )
            self._seen.append(line)
            if line.startswith(prefix):
                return line

    def close(self, timeout_s: float = 20.0) -> int:
        """Sends `quit`, closes stdin and waits; kills the child if it does not exit in time."""
        if self.process.poll() is None:
            try:
                self.send("quit")
                assert self.process.stdin is not None
                self.process.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode


# -- Grafana template variables ----------------------------------------------------------------

#: Grafana's built-in interval variables, as the Prometheus data source of the stack expands
#: them: $__rate_interval is at least four times the data source's scrape interval (15 s).
GRAFANA_INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}

_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")


def grafana_variables(text: str) -> set[str]:
    """Names of the template variables that `text` uses ($name, ${name}, ${name:fmt}, [[name]])."""
    return {next(g for g in m.groups() if g) for m in _VARIABLE.finditer(text)}


def _regex_escape(value: str) -> str:
    # A regex metacharacter gets a backslash, itself escaped for the PromQL string literal.
    value = value.replace("\\", "\\" * 4)
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def grafana_render(expr: str, values: Mapping[str, str | Sequence[str]]) -> str:
    """`expr` with its template variables expanded as Grafana expands them for Prometheus.

    `values` maps a variable to its selection: the string ``"$__all"`` (All, rendered as the
    variable's allValue ``.*``), one value, or several (rendered as ``(a|b)``). Values are
    escaped as Grafana's Prometheus data source escapes them for a regex matcher inside a
    double-quoted PromQL string. Built-in intervals come from `GRAFANA_INTERVALS`.

    Raises:
        KeyError: for a variable that neither `values` nor `GRAFANA_INTERVALS` knows.
    """

    def one(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        if name in GRAFANA_INTERVALS:
            return GRAFANA_INTERVALS[name]
        selection = values[name]
        if selection == "$__all":
            return ".*"
        if isinstance(selection, str):
            return _regex_escape(selection)
        escaped = [_regex_escape(v) for v in selection]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return _VARIABLE.sub(one, expr)
