"""The shipped Grafana dashboard against a real Prometheus that scrapes the real demo.

One Prometheus process (Debian's ``prometheus`` binary, started by this module on a free
loopback port with a temporary configuration and TSDB) scrapes, every second:

- the demo training run (``otel_training.demo.train`` through ``configure()`` with
  ``OTEL_METRICS_EXPORTER=prometheus``), kept alive after training until its last values are
  scraped. The scrape job is named after the service and attaches the rank identity as target
  labels, as ``promote_resource_attributes`` in collector-config/prometheus.yaml does on the
  compose path; the test checks those labels against the ``target_info`` the exporter writes.
  It skips one iteration (an injected NaN) and saves checkpoints;
- a shorter, healthy demo run (no skipped iteration, no non-finite value) for the panels of
  counters that such a run never creates, which must read 0;
- two small drivers for case A5, one with the temporality preference unset and one with
  ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta``.

The same Prometheus evaluates the run-health rules of collector-config/rules/training.yaml
(rendered with tests/integration/alerts_job.py's 1 s parameters), so the dashboard's queries
of recorded series run against real records.

Then every PromQL expression of the dashboard runs with its template variables expanded as
Grafana expands them, and must return data, except the panels listed in `GPU_ONLY`,
`PENDING_TENSOR` and `PANELS_OF_THIS_JOB` (several ranks or a hang: test_health_alerts.py
reads them); the panels of `ZERO_WHEN_ABSENT` return 0 for the healthy run.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alerts_job import E2E_PARAMETERS, PANELS_OF_THIS_JOB, generate_rules
from otlp_receiver import free_port
from prometheus_server import (
    DriverProcess,
    PrometheusServer,
    grafana_render,
    grafana_variables,
    poll,
)
from support import prometheus_or_unavailable, promql_metric_names

from otel_training.config import TENSOR_METRIC_NAMES
from otel_training.metrics.views import STEP_DURATION_BUCKETS_MS

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "collector-config" / "grafana" / "dashboards" / "training.json"
README = ROOT / "collector-config" / "README.md"
REGISTRY_DIR = ROOT / "semconv" / "registry"

SERVICE = "otel-training-demo"
IDENTITY = {  # target labels of the demo's scrape job = its resource attributes, promoted
    "dl_job_id": "prometheus-test-job",
    "dl_run_id": "prometheus-test-run",
    "dl_rank": "0",
    "dl_local_rank": "0",
    "dl_world_size": "1",
    "dl_node_rank": "0",
}
# About 5-10 s of training on one CPU core: Prometheus scrapes it several times while it runs.
DEMO_STEPS = 500
DEMO_CHECKPOINT_INTERVAL = 200  # checkpoints at steps 200 and 400 (megatron.checkpoint.duration)
DEMO_ARGS = [
    "--steps", str(DEMO_STEPS), "--log-interval", "20", "--batch-size", "8", "--seq-len", "64",
    "--layers", "2", "--d-model", "64", "--heads", "2", "--max-data-bytes", "200000",
    "--inject-nonfinite-at", "100", "--device", "cpu", "--quiet", "--moe", "--experts", "4",
    "--checkpoint-interval", str(DEMO_CHECKPOINT_INTERVAL),
    # every tensor metric, so that each series of the README table exists
    "--tensor-metrics", ",".join(f"{name}:10" for name in TENSOR_METRIC_NAMES),
]  # fmt: skip

#: The healthy run: another service, no injected NaN, no tensor metrics, two checkpoints.
HEALTHY = "otel-training-demo-healthy"
HEALTHY_IDENTITY = {**IDENTITY, "dl_job_id": "prometheus-test-healthy-job"}
HEALTHY_STEPS = 60
HEALTHY_ARGS = [
    "--steps", str(HEALTHY_STEPS), "--log-interval", "20", "--batch-size", "8", "--seq-len", "64",
    "--layers", "2", "--d-model", "64", "--heads", "2", "--max-data-bytes", "200000",
    "--device", "cpu", "--quiet", "--checkpoint-interval", "30",
]  # fmt: skip

#: Panels whose data only a GPU produces: title -> why.
GPU_ONLY = {
    "GPU memory allocated": "megatron.training.memory_allocated_gb is recorded on CUDA only",
}
#: Panels of tensor metrics not produced yet: title -> the metric the panel is drawn for. Empty:
#: the demo (with --moe) produces every tensor metric the dashboard draws.
PENDING_TENSOR: dict[str, str] = {}
#: Panels of counters that a healthy run never creates: they read 0 there, not "No data".
ZERO_WHEN_ABSENT = {"Skipped iterations", "Non-finite values"}
#: Panels of megatron.checkpoint.duration.
CHECKPOINT_PANELS = {"Checkpoint duration", "Checkpoint duration per rank"}

STEP = "megatron_training_step_duration_ms_milliseconds"
SKIPPED = "megatron_training_skipped_iters_total"
NONFINITE = "megatron_training_nonfinite_values_total"
CHECKPOINT = "megatron_checkpoint_duration_seconds"

DEMO_DRIVER = r"""
import sys
from otel_training.demo.train import config_from_args, train
from otel_training.configuration import configure

config = config_from_args(sys.argv[1:], prog="demo-driver")
telemetry = configure(service_name="otel-training-demo")
print("serving", flush=True)
if sys.stdin.readline().strip() != "go":  # sent once Prometheus scrapes the endpoint
    sys.exit(0)
result = train(config, telemetry.meter)
print(f"trained {result.steps} {result.skipped_iters} {len(result.checkpoints)}", flush=True)
for line in sys.stdin:  # stay alive until Prometheus has scraped the last values
    if line.strip() == "quit":
        break
telemetry.shutdown()
"""

A5_DRIVER = r"""
import sys
from otel_training.metrics.instruments import record_training_metrics
from otel_training.configuration import configure

telemetry = configure(service_name="a5")
print("serving", flush=True)
for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
        break
    # interval SKIPPED MS...: one log interval: a step-duration point per step, then the
    # interval's skipped iterations (added only when > 0, as Megatron-LM does).
    for ms in words[2:]:
        record_training_metrics(telemetry.meter, step_duration_ms=float(ms))
    record_training_metrics(telemetry.meter, skipped_iters=int(words[1]))
    print("recorded", flush=True)
telemetry.shutdown()
"""
A5_JOBS = {"a5-default": None, "a5-delta": "delta"}  # job -> temporality preference
A5_INTERVALS = [(1, [120.0, 250.0, 1300.0]), (0, [120.0, 250.0, 1300.0]), (2, [120.0] * 3)]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL) of every Prometheus target."""
    return [
        (panel["title"], target["refId"], target["expr"])
        for panel in _panels(dashboard)
        for target in panel.get("targets", [])
        if "expr" in target
    ]


def _variable_query(variable: dict[str, Any]) -> str:
    query = variable["query"]
    return query["query"] if isinstance(query, dict) else query


_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$", re.S)


def _readme_series() -> dict[str, list[str]]:
    """OTel metric name -> Prometheus series names, from the naming table of the README."""
    table: dict[str, list[str]] = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`megatron."):
            names = re.findall(r"`([^`]+)`", cells[0])
            table[names[0]] = re.findall(r"`([a-z_:][a-z0-9_:]*)`", cells[-1])
    return table


def _finite(result: list[dict[str, Any]]) -> bool:
    return all(math.isfinite(float(sample["value"][1])) for sample in result)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    return prometheus_or_unavailable()


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return {"demo": free_port(), "healthy": free_port(), **{job: free_port() for job in A5_JOBS}}


@pytest.fixture(scope="module")
def prometheus(prometheus_binary, ports, tmp_path_factory) -> Iterator[PrometheusServer]:
    workdir = tmp_path_factory.mktemp("prometheus")
    rules = workdir / "rules.yaml"
    rules.write_text(generate_rules.render(E2E_PARAMETERS))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": SERVICE,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{ports['demo']}"], "labels": dict(IDENTITY)}
                ],
            },
            {
                "job_name": HEALTHY,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{ports['healthy']}"], "labels": HEALTHY_IDENTITY}
                ],
            },
            *(
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{ports[job]}"]}]}
                for job in A5_JOBS
            ),
        ],
    }
    with PrometheusServer(prometheus_binary, workdir, config) as p:
        yield p


def _driver_env(port: int, output_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(output_dir),
        **extra,
    }


@contextlib.contextmanager
def _demo_run(
    prometheus: PrometheusServer,
    service: str,
    identity: dict[str, str],
    port: int,
    args: list[str],
    output_dir: Path,
    expected: tuple[int, int, int],
) -> Iterator[float]:
    """Runs the demo as `service` until Prometheus has scraped its final values (steps,
    skipped iterations, checkpoints saved: `expected`); yields that time."""
    attributes = ",".join(
        f"{label.replace('_', '.')}={value}"
        for label, value in identity.items()
        if label in ("dl_job_id", "dl_run_id")
    )
    driver = DriverProcess(
        DEMO_DRIVER,
        env=_driver_env(
            port, output_dir, OTEL_RESOURCE_ATTRIBUTES=attributes, OTEL_SERVICE_NAME=service
        ),
        args=args,
    )
    try:
        driver.expect("serving", timeout_s=90)
        poll(
            f"the endpoint of {service} scraped",
            lambda: prometheus.targets_up().get(service) == 1.0,
            timeout_s=30,
        )
        driver.send("go")
        trained = tuple(map(int, driver.expect("trained", timeout_s=180).split()[1:]))
        assert trained == expected, driver.output()
        steps, skipped, checkpoints = trained
        selector = f'{{job="{service}"}}'
        saves = f'{{job="{service}", megatron_checkpoint_operation="save"}}'
        try:
            poll(
                f"the final values of {service} scraped",
                lambda: (
                    prometheus.value(f"{STEP}_count{selector}") == steps
                    and (prometheus.value(f"{SKIPPED}{selector}") or 0) == skipped
                    and prometheus.value(f"{CHECKPOINT}_count{saves}") == checkpoints
                ),
                timeout_s=30,
            )
        except TimeoutError as error:
            pytest.fail(f"{error}\n{driver.output()}\n--- prometheus ---\n{prometheus.log()}")
        yield time.time()
    finally:
        driver.close()


@pytest.fixture(scope="module")
def demo(prometheus, ports, tmp_path_factory) -> Iterator[float]:
    """Runs the demo until Prometheus has scraped its final values; yields that time."""
    with _demo_run(
        prometheus,
        SERVICE,
        IDENTITY,
        ports["demo"],
        DEMO_ARGS,
        tmp_path_factory.mktemp("demo"),
        expected=(DEMO_STEPS, 1, DEMO_STEPS // DEMO_CHECKPOINT_INTERVAL),
    ) as scraped_at:
        yield scraped_at


@pytest.fixture(scope="module")
def healthy_demo(prometheus, ports, tmp_path_factory) -> Iterator[float]:
    """Runs the healthy demo (no skipped iteration, no non-finite value, two checkpoints) until
    Prometheus has scraped its final values; yields that time."""
    with _demo_run(
        prometheus,
        HEALTHY,
        HEALTHY_IDENTITY,
        ports["healthy"],
        HEALTHY_ARGS,
        tmp_path_factory.mktemp("healthy"),
        expected=(HEALTHY_STEPS, 0, 2),
    ) as scraped_at:
        yield scraped_at


# -- the demo through Prometheus -----------------------------------------------------------------


def test_series_names_are_those_of_the_readme_table(prometheus, demo):
    """Every series name the README's naming table promises exists, from the real exporter."""
    table = _readme_series()
    assert "megatron.training.step_duration_ms" in table, "README naming table not found"
    gpu_only = {"megatron.training.memory_allocated_gb"}
    missing = [
        (otel, name)
        for otel, names in table.items()
        if otel not in gpu_only
        for name in names
        if not prometheus.series(f'{{__name__="{name}", job="{SERVICE}"}}')
    ]
    assert not missing, f"promised but not in Prometheus: {missing}"
    produced = set(prometheus.label_values("__name__", f'{{job="{SERVICE}"}}'))
    promised = {name for names in table.values() for name in names}
    unlisted = {n for n in produced if n.startswith("megatron_")} - promised
    assert not unlisted, f"series missing from the README table: {sorted(unlisted)}"


def test_nonfinite_values_carry_the_metric_label(prometheus, demo):
    """The injected NaN step is counted under megatron_training_metric=<the metric's name>."""
    result = prometheus.query(
        "megatron_training_nonfinite_values_total"
        f'{{job="{SERVICE}", megatron_training_metric="megatron.training.grad_norm"}}',
        at=demo,
    )
    assert [float(r["value"][1]) for r in result] == [1.0]


def test_target_labels_equal_the_resource_in_target_info(prometheus, demo):
    """The rank labels the dashboard filters on are named and valued as the resource says."""
    result = prometheus.query(f'target_info{{job="{SERVICE}"}}', at=demo)
    assert len(result) == 1, result
    labels = result[0]["metric"]
    # The exporter writes the resource attributes into target_info under their Prometheus
    # names; where a target label of the same name exists, Prometheus keeps the scraped one as
    # exported_<name>. Both must be the identity the dashboard filters on.
    resource = {
        k.removeprefix("exported_"): v for k, v in labels.items() if k.startswith("exported_")
    }
    assert {k: resource.get(k) for k in IDENTITY} == IDENTITY, labels
    assert {k: labels.get(k) for k in IDENTITY} == IDENTITY, labels
    assert labels["service_name"] == SERVICE


def test_variable_queries_return_the_run(prometheus, demo):
    """The service, job and rank variables list this run, queried as Grafana queries them."""
    expected = {"service": SERVICE, "job": IDENTITY["dl_job_id"], "rank": IDENTITY["dl_rank"]}
    selection: dict[str, str] = {}
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        parsed = _LABEL_VALUES.match(_variable_query(variable).strip())
        assert parsed, f"${variable['name']}: not label_values(...)"
        match = parsed["match"] and grafana_render(parsed["match"], {**selection})
        values = prometheus.label_values(parsed["label"], match)
        assert expected[variable["name"]] in values, (variable["name"], values)
        selection[variable["name"]] = "$__all"


@pytest.mark.parametrize("mode", ["all", "selected"])
def test_every_dashboard_query_returns_data(prometheus, demo, mode):
    """Each PromQL of the dashboard returns finite data (All, then this run's values)."""
    dashboard = _dashboard()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    values: dict[str, str | list[str]] = {name: "$__all" for name in variables}
    if mode == "selected":
        values.update(service=[SERVICE], job=[IDENTITY["dl_job_id"]], rank=[IDENTITY["dl_rank"]])
    excluded = {**GPU_ONLY, **PENDING_TENSOR, **PANELS_OF_THIS_JOB}
    failures = []
    checked = 0
    for title, ref, expr in _queries(dashboard):
        rendered = grafana_render(expr, values)
        result = prometheus.query(rendered, at=demo)  # a PromQL error fails here, for all
        if title in excluded:
            continue
        checked += 1
        if not result or not _finite(result):
            failures.append(f"{title} [{ref}]: {result!r}\n    {rendered}")
        for name in {n for n in promql_metric_names(expr) if n.startswith("megatron_")}:
            if not prometheus.series(f'{{__name__="{name}"}}'):
                failures.append(f"{title} [{ref}]: no series named {name}")
    assert checked >= 10
    assert not failures, "\n".join(failures)


def _panel_values(title: str, values: dict[str, Any], at: float, prometheus) -> list[tuple]:
    """(labels, value) of every series that each query of the panel `title` returns."""
    found = []
    for panel_title, _, expr in _queries(_dashboard()):
        if panel_title == title:
            for sample in prometheus.query(grafana_render(expr, values), at=at):
                found.append((sample["metric"], float(sample["value"][1])))
    return found


def _selection(service: str, identity: dict[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {v["name"]: "$__all" for v in _dashboard()["templating"]["list"]}
    values.update(service=[service], job=[identity["dl_job_id"]], rank=[identity["dl_rank"]])
    return values


def test_counter_panels_read_zero_for_a_healthy_run(prometheus, demo, healthy_demo):
    """A healthy run's counter panels read 0; the demo's real counts are not hidden."""
    healthy = f'job="{HEALTHY}"'
    assert not prometheus.series(f'{{__name__=~"{SKIPPED}|{NONFINITE}", {healthy}}}')
    assert {p["title"] for p in _panels(_dashboard())} >= ZERO_WHEN_ABSENT
    for title in ZERO_WHEN_ABSENT:
        values = _panel_values(
            title, _selection(HEALTHY, HEALTHY_IDENTITY), healthy_demo, prometheus
        )
        assert [value for _, value in values] == [0.0], (title, values)
        counted = _panel_values(title, _selection(SERVICE, IDENTITY), demo, prometheus)
        assert counted and all(value >= 1 for _, value in counted), (title, counted)


def test_checkpoint_panels_chart_the_saves_of_each_run(prometheus, demo, healthy_demo):
    """The checkpoint panels return each run's saves (traces not exported), by operation."""
    for service, identity, at in (
        (SERVICE, IDENTITY, demo),
        (HEALTHY, HEALTHY_IDENTITY, healthy_demo),
    ):
        for title in CHECKPOINT_PANELS:
            values = _panel_values(title, _selection(service, identity), at, prometheus)
            assert values, (service, title)
            for labels, value in values:
                assert labels["megatron_checkpoint_operation"] == "save", labels
                assert 0 < value < 300, (service, title, labels, value)
        # The histogram's count is the number of saves, from the spans of a run whose traces
        # are not exported (OTEL_TRACES_EXPORTER=none).
        count = prometheus.value(f'sum({CHECKPOINT}_count{{job="{service}"}})')
        assert count == (DEMO_STEPS // DEMO_CHECKPOINT_INTERVAL if service == SERVICE else 2)


def test_excluded_panels_exist_and_stay_excluded_for_a_reason():
    """GPU_ONLY, PENDING_TENSOR and PANELS_OF_THIS_JOB name real panels; a pending metric is
    not declared yet."""
    titles = {panel["title"] for panel in _panels(_dashboard())}
    assert set(GPU_ONLY) <= titles and set(PENDING_TENSOR) <= titles
    assert set(PANELS_OF_THIS_JOB) <= titles
    declared = "\n".join(p.read_text() for p in REGISTRY_DIR.glob("*.yaml"))
    landed = [
        m for m in PENDING_TENSOR.values() if re.search(rf"name:\s*{re.escape(m)}\s", declared)
    ]
    assert not landed, (
        f"tensor metrics {landed} are declared now: make the demo produce them and remove "
        "their panels from PENDING_TENSOR"
    )


def test_dashboard_variables_are_all_known_to_the_renderer():
    """Every variable the dashboard uses is defined or a Grafana built-in interval."""
    dashboard = _dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    values = {name: "$__all" for name in defined}
    for _, _, expr in _queries(dashboard):
        grafana_render(expr, values)  # raises KeyError for an unknown variable
        assert grafana_variables(expr) - defined <= {"__rate_interval", "__interval", "__range"}


# -- case A5: counters only go up, histograms arrive whole ----------------------------------------


def test_a5_skipped_iters_and_step_histogram_with_either_temporality(prometheus, ports, tmp_path):
    """skipped_iters +1, +0, +2 over three scrapes reads 1, 1, 3 and never drops; the
    histogram's buckets, count and sum are whole; the same with a delta preference."""
    drivers = {
        job: DriverProcess(
            A5_DRIVER,
            env=_driver_env(
                ports[job],
                tmp_path / job,
                OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=preference,
            ),
        )
        for job, preference in A5_JOBS.items()
    }
    try:
        for driver in drivers.values():
            driver.expect("serving", timeout_s=60)
        started = time.time()
        expected_total = 0
        seen: dict[str, list[float]] = {job: [] for job in drivers}
        for skipped, durations_ms in A5_INTERVALS:
            sent = time.time()
            for driver in drivers.values():
                driver.send(f"interval {skipped} " + " ".join(map(str, durations_ms)))
            for driver in drivers.values():
                driver.expect("recorded", timeout_s=10)
            expected_total += skipped
            for job in drivers:
                # A scrape that happened after this interval was recorded.
                sample = poll(
                    f"{job}: a scrape after interval +{skipped}",
                    lambda job=job, sent=sent: _sample_after(
                        prometheus, f'{SKIPPED}{{job="{job}"}}', sent
                    ),
                    timeout_s=20,
                )
                seen[job].append(sample)
        ended = time.time() + 1
        step_counts = sum(len(d) for _, d in A5_INTERVALS)
        step_sum = sum(sum(d) for _, d in A5_INTERVALS)
        for job in drivers:
            selector = f'{{job="{job}"}}'
            assert seen[job] == [1.0, 1.0, 3.0], (job, seen[job])
            values = [
                float(v)
                for series in prometheus.query_range(f"{SKIPPED}{selector}", started, ended, 0.5)
                for _, v in series["values"]
            ]
            assert values and values[-1] == 3.0 and values == sorted(values), (job, values)
            assert prometheus.value(f"resets({SKIPPED}{selector}[5m])") == 0.0
            poll(
                f"{job}: last histogram scraped",
                lambda s=selector: prometheus.value(f"{STEP}_count{s}") == step_counts,
                timeout_s=10,
            )
            assert prometheus.value(f"{STEP}_sum{selector}") == pytest.approx(step_sum)
            buckets = {
                r["metric"]["le"]: float(r["value"][1])
                for r in prometheus.query(f"{STEP}_bucket{selector}")
            }
            bounds = [float(b) for b in STEP_DURATION_BUCKETS_MS]
            assert len(buckets) == len(bounds) + 1 and buckets["+Inf"] == step_counts
            every_ms = [ms for _, durations in A5_INTERVALS for ms in durations]
            for le, count in buckets.items():
                bound = math.inf if le == "+Inf" else float(le)
                assert count == sum(ms <= bound for ms in every_ms), (job, le, count)
    finally:
        for driver in drivers.values():
            driver.close()


def _sample_after(prometheus: PrometheusServer, selector: str, after: float) -> float | None:
    """The value of `selector` when its latest sample was scraped after `after`, else None."""
    stamp = prometheus.value(f"timestamp({selector})")
    if stamp is None or stamp <= after:
        return None
    return prometheus.value(selector)
