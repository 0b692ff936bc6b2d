"""A job of gloo ranks (tests/integration/health_rank.py) scraped every second by a real
Prometheus that evaluates the run-health rules every second, for the end-to-end tests
(test_health_alerts.py) and bench/health_alerts.py.

The rules are rendered by scripts/generate_rules.py from the source of the shipped file, with
:data:`E2E_PARAMETERS` (a 1 s hang floor, 4 s straggler windows). The ranks export through
the Python Prometheus exporter, one port each (base + LOCAL_RANK); the scrape job is named
after their service and attaches their identity as target labels, as collector-config/README.md
says the direct-scrape path needs. A thread polls ``/api/v1/alerts`` every 0.2 s and keeps,
for every activation of an alert (a name, labels and Prometheus' ``activeAt``), when it was
first seen pending and firing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from otlp_receiver import free_port
from prometheus_server import DriverProcess, PrometheusServer, free_port_run, poll
from support import load_script

generate_rules = load_script("generate_rules")

RANK_PROGRAM = Path(__file__).resolve().with_name("health_rank.py")
SERVICE = "health-e2e"
JOB_ID = "health-e2e-job"

#: The rules of the end-to-end tests: the shipped rules with a 1 s hang floor, 1 s
#: evaluation, 10 s straggler windows (each about 180 steps of 55 ms; shorter ones would be
#: dominated by the 1 s scrape and evaluation delays) and short memories.
E2E_PARAMETERS = generate_rules.Parameters(
    interval_s=1,
    hang_floor_s=1,
    fresh_s=3,
    silent_for_s=2,
    step_window_s=5,
    median_window_s=60,
    lookback_s=600,
    memory_s=600,
    straggler_window_s=10,
    goodput_live_window_s=10,
    goodput_rolling_window_s=300,
)


#: Dashboard panels that need several ranks or a hang, read by test_health_alerts.py against
#: this job (the one-rank demo of test_prometheus.py cannot show them): title -> why.
PANELS_OF_THIS_JOB = {
    "Busy score of the slowest rank": "a busy score needs peers of the same pipeline stage",
    "Busy score per rank": "a busy score needs peers of the same pipeline stage",
    "Straggler cause": "a busy score needs peers of the same pipeline stage",
    "Hang culprit": "a culprit exists only while a run is hung",
}


def _unix(active_at: str) -> float:
    """Prometheus' RFC 3339 time (nanoseconds, Z) as Unix seconds."""
    trimmed = re.sub(r"(\.\d{6})\d*", r"\1", active_at).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


@dataclass
class AlertRecord:
    """What the poller saw of one activation of an alert (a name and label set, from the
    evaluation that found it active until it resolved)."""

    name: str
    labels: dict[str, str]
    active_at: float
    pending_seen: float | None = None
    firing_seen: float | None = None
    annotations: dict[str, str] = field(default_factory=dict)


def prometheus_config(
    rules: Path,
    interval_s: float,
    service: str,
    base_port: int,
    ranks: int,
    run_id: str,
    job_id: str,
) -> dict[str, Any]:
    """Prometheus' configuration for ``ranks`` ranks whose exporters listen on consecutive
    ports from ``base_port``: scraped every second, ``rules`` evaluated every ``interval_s``,
    each target labelled as the job's resource would be (``dl_rank``, ``dl_run_id``,
    ``dl_job_id``, ``dl_world_size``). Also bench/faults.py's."""
    return {
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": generate_rules.duration(interval_s),
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": service,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{base_port + r}"],
                        "labels": {
                            "dl_rank": str(r),
                            "dl_run_id": run_id,
                            "dl_job_id": job_id,
                            "dl_world_size": str(ranks),
                        },
                    }
                    for r in range(ranks)
                ],
            }
        ],
    }


class HealthJob:
    """``ranks`` processes of health_rank.py with ``plan``, and a Prometheus scraping them.

    Use as a context manager; :meth:`start` returns once every rank trains (after ``go``).
    """

    def __init__(
        self,
        prometheus_binary: str,
        workdir: Path,
        plan: Mapping[str, Any],
        ranks: int = 4,
        parameters: Any = E2E_PARAMETERS,
    ) -> None:
        self.workdir = Path(workdir)
        self.plan = dict(plan)
        self.run_id = f"e2e-{uuid.uuid4().hex[:8]}"
        self.parameters = parameters
        self.size = ranks
        self.base_port = free_port_run(ranks)
        self.master_port = free_port()
        self.ranks: list[DriverProcess] = []
        self.alerts: list[AlertRecord] = []
        self._active: dict[tuple[str, tuple[tuple[str, str], ...]], AlertRecord] = {}
        self.poll_errors = 0
        self.started_at = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        rules = self.workdir / "rules.yaml"
        rules.write_text(generate_rules.render(parameters))
        self.prometheus = PrometheusServer(
            prometheus_binary,
            self.workdir,
            prometheus_config(
                rules, parameters.interval_s, SERVICE, self.base_port, ranks, self.run_id, JOB_ID
            ),
        )

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> HealthJob:
        """Starts the ranks and Prometheus; returns once all targets are up and the ranks were
        told to go."""
        code = RANK_PROGRAM.read_text()
        for r in range(self.size):
            env = {
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(self.size),
                "LOCAL_WORLD_SIZE": str(self.size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.master_port),
                "OTEL_SERVICE_NAME": SERVICE,
                "OTEL_RESOURCE_ATTRIBUTES": f"dl.job.id={JOB_ID}",
                "OTEL_PYTHON_TRAINING_RUN_ID": self.run_id,
                "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(self.workdir / "telemetry"),
                "OTEL_METRICS_EXPORTER": "prometheus",
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none",
                "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                "OTEL_EXPORTER_PROMETHEUS_PORT": str(self.base_port),
            }
            self.ranks.append(DriverProcess(code, env=env, args=[json.dumps(self.plan)]))
        for rank in self.ranks:
            rank.expect("ready", timeout_s=180)
        self.prometheus.start()
        poll(
            "every rank's endpoint scraped",
            lambda: len(self.prometheus.query(f'up{{job="{SERVICE}"}} == 1')) == self.size,
            timeout_s=60,
        )
        threading.Thread(target=self._poll_alerts, daemon=True).start()
        self.started_at = time.time()
        for rank in self.ranks:
            rank.send("go")
        return self

    def close(self) -> None:
        """Kills the ranks (stopped or hung ones included) and stops Prometheus."""
        self._stop.set()
        for rank in self.ranks:
            if rank.process.poll() is None:
                rank.process.kill()
        for rank in self.ranks:
            try:
                rank.process.wait(timeout=30)
            except Exception:  # noqa: BLE001 - best effort in teardown
                pass
        self.prometheus.stop()

    def __enter__(self) -> HealthJob:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the ranks ----------------------------------------------------------------------------

    def expect(self, rank: int, prefix: str, timeout_s: float = 120) -> str:
        """The next line of ``rank`` that starts with ``prefix``."""
        return self.ranks[rank].expect(prefix, timeout_s=timeout_s)

    def stamp(self, rank: int, prefix: str, timeout_s: float = 120) -> float:
        """The Unix time that ``rank``'s next ``prefix`` line carries last."""
        return float(self.expect(rank, prefix, timeout_s).split()[-1])

    def signal(self, rank: int, signum: int) -> float:
        """Sends ``signum`` to ``rank``; returns when (Unix seconds)."""
        at = time.time()
        os.kill(self.ranks[rank].process.pid, signum)
        return at

    def output(self, rank: int) -> str:
        return self.ranks[rank].output()

    # -- alerts -------------------------------------------------------------------------------

    def _poll_alerts(self) -> None:
        while not self._stop.is_set():
            try:
                alerts = self.prometheus.api("alerts")["alerts"]
            except Exception:  # noqa: BLE001 - Prometheus stopping; counted
                self.poll_errors += 1
                alerts = []
            now = time.time()
            with self._lock:
                seen = set()
                for alert in alerts:
                    labels = dict(alert["labels"])
                    if labels.get("dl_run_id", self.run_id) != self.run_id:
                        continue
                    name = labels.pop("alertname")
                    key = (name, tuple(sorted(labels.items())))
                    seen.add(key)
                    active_at = _unix(alert["activeAt"])
                    record = self._active.get(key)
                    if record is None or record.active_at != active_at:
                        record = AlertRecord(name, labels, active_at)
                        self._active[key] = record
                        self.alerts.append(record)
                    if alert["state"] == "pending" and record.pending_seen is None:
                        record.pending_seen = now
                    if alert["state"] == "firing" and record.firing_seen is None:
                        record.firing_seen = now
                        record.annotations = dict(alert.get("annotations") or {})
                for key in set(self._active) - seen:
                    del self._active[key]
            self._stop.wait(0.2)

    def fired(
        self,
        name: str | None = None,
        since: float = 0.0,
        where: Callable[[AlertRecord], bool] = lambda record: True,
    ) -> list[AlertRecord]:
        """The alerts (named ``name``, or any) seen firing at or after ``since``."""
        with self._lock:
            return [
                record
                for record in self.alerts
                if record.firing_seen is not None
                and record.firing_seen >= since
                and (name is None or record.name == name)
                and where(record)
            ]

    def firing_now(self, name: str) -> list[AlertRecord]:
        """The activations of ``name`` that were firing at the last poll."""
        with self._lock:
            return [
                record
                for (alert, _), record in self._active.items()
                if alert == name and record.firing_seen is not None
            ]

    def wait_fired(
        self, name: str, timeout_s: float, since: float = 0.0, **labels: str
    ) -> AlertRecord:
        """The first alert ``name`` with ``labels`` seen firing after ``since``.

        Raises:
            TimeoutError: when none fires within ``timeout_s``.
        """

        def matching() -> AlertRecord | None:
            found = self.fired(
                name,
                since,
                lambda record: all(record.labels.get(k) == v for k, v in labels.items()),
            )
            return min(found, key=lambda record: record.firing_seen) if found else None

        return poll(f"{name} {labels} firing", matching, timeout_s, interval_s=0.1)


def hang_latency_s(job: HealthJob, injected_at: float, timeout_s: float = 30) -> dict[str, Any]:
    """Waits for a hang injected at ``injected_at`` to be declared with its culprit; returns
    ``{"detected_s", "culprit_s", "culprits", "reasons", "silent"}``: seconds from the
    injection to the first evaluation that found the job hung (TrainingJobHung's activeAt)
    and that named a culprit, the ranks named and why, and the ranks TrainingRankSilent
    named (waited for when a culprit is silent). Latencies are None when the alert did not
    fire within ``timeout_s``."""
    result: dict[str, Any] = {"detected_s": None, "culprit_s": None, "culprits": [], "reasons": []}
    try:
        hung = job.wait_fired("TrainingJobHung", timeout_s, since=injected_at)
        result["detected_s"] = hung.active_at - injected_at
        culprit = job.wait_fired("TrainingHangCulprit", timeout_s, since=injected_at)
        result["culprit_s"] = culprit.active_at - injected_at
    except TimeoutError:
        pass
    time.sleep(2)  # any other culprit named next to the first
    culprits = job.fired("TrainingHangCulprit", since=injected_at)
    result["culprits"] = sorted({int(record.labels["dl_rank"]) for record in culprits})
    result["reasons"] = sorted({record.labels["dl_hang_reason"] for record in culprits})
    if "silent" in result["reasons"]:
        # A failed scrape, then the alert's own `for`: it may fire after the culprit.
        try:
            job.wait_fired("TrainingRankSilent", timeout_s, since=injected_at)
        except TimeoutError:
            pass
    result["silent"] = sorted(
        {int(record.labels["dl_rank"]) for record in job.fired("TrainingRankSilent")}
    )
    return result


HANG_WAYS = {
    "sleep": "a wait in forward/backward (GIL released)",
    "gil": "a C call in forward/backward holding the GIL (sum(range(10**12)))",
    "sigstop": "SIGSTOP",
    "sigkill": "SIGKILL",
}


def inject_hang(job: HealthJob, rank: int, how: str) -> float:
    """Hangs ``rank`` the way ``how`` names (a key of :data:`HANG_WAYS`; for ``sleep`` and
    ``gil`` the plan's ``hang`` must be the same); returns the Unix time of the injection."""
    if how in ("sleep", "gil"):
        job.signal(rank, signal.SIGUSR1)
        return job.stamp(rank, "inject", timeout_s=30)
    return job.signal(rank, signal.SIGSTOP if how == "sigstop" else signal.SIGKILL)
