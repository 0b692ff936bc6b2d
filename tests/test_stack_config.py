"""The collector stack's files, checked offline: docker-compose.yaml against the compose spec and
our rules, the collector pipelines, the Prometheus configuration, Grafana provisioning and the
dashboard. What needs running servers is in tests/integration/test_prometheus.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.semconv._incubating.metrics.hw_metrics import HW_TEMPERATURE
from support import load_script, promql_metric_names, promtool_or_unavailable

from otel_training.semconv.spans import SPANS

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yaml"
CONFIG_DIR = ROOT / "collector-config"
COLLECTOR = CONFIG_DIR / "collector.yaml"
HARDWARE = CONFIG_DIR / "hardware.yaml"
COMPOSE_HARDWARE = ROOT / "docker-compose.hardware.yaml"
PROMETHEUS = CONFIG_DIR / "prometheus.yaml"
DATASOURCES = CONFIG_DIR / "grafana" / "provisioning" / "datasources" / "otel-training.yaml"
PROVIDERS = CONFIG_DIR / "grafana" / "provisioning" / "dashboards" / "otel-training.yaml"
DASHBOARD = CONFIG_DIR / "grafana" / "dashboards" / "training.json"
RULES_DIR = CONFIG_DIR / "rules"
RULES = RULES_DIR / "training.yaml"
README = CONFIG_DIR / "README.md"
REGISTRY_DIR = ROOT / "semconv" / "registry"

#: Resource attributes that must become labels on every series (rank identity).
PROMOTED = {
    "dl.rank",
    "dl.local_rank",
    "dl.world_size",
    "dl.node_rank",
    "dl.job.id",
    "dl.run.id",
    "dl.run.attempt",
    "dl.pipeline_parallel.rank",
    "dl.tensor_parallel.rank",
    "dl.data_parallel.rank",
    "host.name",
    "service.instance.id",
}
#: Grafana's built-in variables that the dashboard may use (__from and __to in data links).
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__all", "__from", "__to"}
#: Panels of counters that a healthy run never creates: they read 0 instead of "No data".
ZERO_WHEN_ABSENT = {"Skipped iterations", "Non-finite values"}
#: Panels of the checkpoint durations (megatron.checkpoint.duration).
CHECKPOINT_PANELS = {"Checkpoint duration", "Checkpoint duration per rank"}
#: Metric names on the dashboard that the registry does not declare yet: tensor metrics still
#: being built (tests/integration/test_prometheus.py lists their panels as pending).
PENDING_PREFIX = "megatron_training_tensor_"
#: Tensor-metric families off by default or for diagnosis only: queried in Grafana's Explore,
#: not drawn on the training dashboard.
WITHOUT_PANEL = {
    "megatron.training.tensor.grad_nonfinite",
    "megatron.training.tensor.update_ratio",
    "megatron.training.tensor.activation_max_abs",
    "megatron.training.tensor.residual_rms",
    "megatron.training.tensor.residual_max_abs",
    "megatron.training.tensor.logits_norm",
    "megatron.training.tensor.router_entropy",
    "megatron.training.tensor.router_expert_load",
    # Device metrics: the node's view is DCGM's (hardware.yaml); queried in Explore.
    "dl.gpu.clock.speed",
    # otel-training's own account of what full queues dropped (docs/logs.md): its warning
    # says so in the job's log; queried in Explore.
    "otel_training.log_record.dropped",
    "otel_training.span.dropped",
    # The step of the last training log: what places a value at its step in the report; a
    # dashboard draws over time.
    "dl.training.progress.logged_iteration",
}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(COMPOSE)


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    return _yaml(COLLECTOR)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


# -- helpers -------------------------------------------------------------------------------------

_INTERPOLATION = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def _defaults(text: str) -> str:
    """`text` with compose's ${VAR:-default} interpolation done for an empty environment."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.groups()
        if op in (":-", "-"):
            return arg
        if op in (":?", "?"):
            raise LookupError(f"${{{name}}} is required: {arg}")
        return ""

    return _INTERPOLATION.sub(one, text)


def _mounts(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of each volume entry of a service."""
    mounts = []
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            # SOURCE:TARGET[:MODE]; SOURCE may hold ${VAR:-default}, TARGET is absolute.
            parsed = re.fullmatch(
                r"(?P<source>.+?):(?P<target>/[^:]*)(?::(?P<mode>[\w,]+))?", entry
            )
            assert parsed, f"cannot read volume {entry!r}"
            source, target = parsed["source"], parsed["target"]
            read_only = "ro" in (parsed["mode"] or "").split(",")
        else:
            source, target = entry.get("source", ""), entry["target"]
            read_only = bool(entry.get("read_only"))
        mounts.append((source, target, read_only))
    return mounts


def _mount_target(compose: dict[str, Any], service: str, source: Path) -> str:
    for src, target, _ in _mounts(compose["services"][service]):
        if src.startswith(".") and (ROOT / src).resolve() == source.resolve():
            return target
    raise AssertionError(f"{service} does not mount {source.relative_to(ROOT)}")


def _flag(args: list[str], name: str) -> str:
    for arg in args:
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name}= missing from {args}")


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", []) if "expr" in t]


def _variables_used(text: str) -> set[str]:
    found = re.findall(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]", text)
    return {next(g for g in groups if g) for groups in found}


def _registry_metrics() -> list[dict[str, Any]]:
    metrics = []
    for path in sorted(REGISTRY_DIR.glob("*.yaml")):
        metrics.extend(_yaml(path).get("metrics") or [])
    return metrics


def _registry_resource_attributes() -> set[str]:
    """The rank identity of the registry's resource group: its attributes that are not opt-in
    (the parallel layout is the same on every rank and stays in target_info)."""
    for path in sorted(REGISTRY_DIR.glob("*.yaml")):
        for group in _yaml(path).get("attribute_groups") or []:
            if group["id"] == "dl.training.resource":
                return {
                    a.get("ref") or a["key"]
                    for a in group["attributes"]
                    if a.get("requirement_level") != "opt_in"
                }
    raise AssertionError("attribute group dl.training.resource not found in the registry")


_UNIT_WORDS = {
    "ms": "milliseconds",
    "s": "seconds",
    "By": "bytes",
    "GiBy": "gibibytes",
    "Hz": "hertz",
    "Cel": "celsius",
}
#: OpenTelemetry's own metrics that otel-training exports (not in our registry), with their
#: instrument and unit as the semantic-conventions package defines them
#: (opentelemetry.semconv._incubating.metrics.hw_metrics.create_hw_temperature).
OTEL_METRICS = {HW_TEMPERATURE: ("gauge", "Cel")}


def _prometheus_label(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _prometheus_series(name: str, instrument: str, unit: str) -> list[str]:
    """The series Prometheus makes of a metric with UnderscoreEscapingWithSuffixes (the stack's
    translation strategy, which the Python exporter matches for the units handled here).

    Raises:
        ValueError: for a unit this table does not cover, and for a gauge of unit "1", which
            the stack names with _ratio and the Python exporter without (the paths diverge).
    """
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    unit = re.sub(r"\{[^}]*\}", "", unit or "")
    if unit == "1":
        # The Python exporter adds no suffix; Prometheus 3 would add _ratio, which the
        # collector's transform/unit_one prevents (test_collector_drops_unit_one_before_prometheus).
        unit = ""
    if unit:
        if unit not in _UNIT_WORDS:
            raise ValueError(f"{name}: add the Prometheus word for unit {unit!r}")
        if _UNIT_WORDS[unit] not in base.split("_"):
            base += "_" + _UNIT_WORDS[unit]
    if instrument == "counter" and not base.endswith("_total"):
        base += "_total"
    if instrument == "histogram":
        return [f"{base}_bucket", f"{base}_sum", f"{base}_count"]
    return [base]


def _registry_series() -> dict[str, list[str]]:
    return {
        m["name"]: _prometheus_series(m["name"], m["instrument"], m.get("unit", ""))
        for m in _registry_metrics()
    }


# -- the rules (collector-config/rules/training.yaml) ---------------------------------------------

#: The alerts issue 16 asks for.
ALERTS = {
    "TrainingRankStalled",
    "TrainingJobHung",
    "TrainingHangCulprit",
    "TrainingRankSilent",
    "TrainingCheckpointStale",
    "TrainingStraggler",
}
_PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _yaml(RULES)["groups"] for rule in group["rules"]]


def _records() -> set[str]:
    return {rule["record"] for rule in _rules() if "record" in rule}


def _selected_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not functions, label
    lists (by, on, group_left, ...), label matchers, strings, ranges or keywords."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text)
    return {n for n in names if n.lower() not in _PROMQL_WORDS}


def test_the_rules_file_is_generated_from_its_source():
    """collector-config/rules/training.yaml is what scripts/generate_rules.py renders now."""
    generate_rules = load_script("generate_rules")
    assert RULES.read_text() == generate_rules.render()


def test_the_rules_file_passes_promtool_check_rules():
    """promtool accepts every rule (syntax, duplicate series, templates)."""
    promtool = promtool_or_unavailable()
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_define_the_alerts_of_issue_16_with_severities():
    """The six alerts exist once each, with a severity and a summary."""
    alerts = [rule for rule in _rules() if "alert" in rule]
    assert sorted(rule["alert"] for rule in alerts) == sorted(ALERTS)
    for rule in alerts:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_every_metric_the_rules_read_is_a_registry_metric_or_a_record(dashboard):
    """Each series a rule selects is a registry metric under its Prometheus name, an
    OpenTelemetry hardware metric otel-training exports, or a record of the same file; and
    the selector parser sees the ledger's metrics (so the check cannot pass empty). Every
    record is read by a rule or by the dashboard."""
    known = {name for names in _registry_series().values() for name in names}
    known |= {_prometheus_series(n, i, u)[0] for n, (i, u) in OTEL_METRICS.items()}
    records = _records()
    used: set[str] = set()
    for rule in _rules():
        used |= _selected_names(rule["expr"])
    unknown = used - known - records
    assert not unknown, f"not a registry metric nor a record: {sorted(unknown)}"
    assert {
        "dl_training_phase_time_seconds_total",
        "dl_training_phase_elapsed_seconds",
        "dl_training_progress_age_seconds",
        "dl_training_progress_timestamp_seconds",
        "dl_training_progress_iteration",
        "dl_training_checkpoint_age_seconds",
        "dl_gpu_clock_speed_hertz",
    } <= used
    on_dashboard = {name for expr in _exprs(dashboard) for name in promql_metric_names(expr)}
    # The attempt and job goodput figures are outputs for queries (the dashboard averages the
    # rank-level ones so that it can filter by rank).
    outputs = {r for r in records if r.startswith(("run:", "job:")) and "goodput" in r}
    unread = records - used - on_dashboard - outputs
    assert not unread, f"records nobody reads: {sorted(unread)}"


def test_records_follow_the_level_metric_operation_convention():
    """Recording rules are named level:metric:unit-or-operation, at the rank, run or job
    level, in otel-training's namespace."""
    for record in _records():
        assert re.fullmatch(r"(rank|run|job):dl_training_[a-z_]+:[a-z_]+", record), record


def test_compose_mounts_the_rules_where_prometheus_reads_them(compose):
    """The rules directory is mounted read-only beside prometheus.yaml, where its rule_files
    glob looks, and the glob matches the shipped file."""
    config_target = _mount_target(compose, "prometheus", PROMETHEUS)
    rules_target = _mount_target(compose, "prometheus", RULES_DIR)
    (pattern,) = _yaml(PROMETHEUS)["rule_files"]
    assert not pattern.startswith("/")
    assert f"{Path(config_target).parent}/{pattern}".startswith(rules_target + "/")
    assert [p.name for p in CONFIG_DIR.glob(pattern)] == [RULES.name]


# -- docker-compose.yaml -------------------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_spec():
    """check-jsonschema validates docker-compose.yaml with its vendored compose-spec schema."""
    script = Path(sys.executable).with_name("check-jsonschema")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "check_jsonschema"]
    result = subprocess.run(
        [*command, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_the_four_services(compose):
    """Collector (contrib), Prometheus 3, Jaeger 2 and Grafana, one service each."""
    images = {name: s["image"] for name, s in compose["services"].items()}
    assert set(images) == {"otel-collector", "prometheus", "jaeger", "grafana"}
    assert images["otel-collector"].startswith("otel/opentelemetry-collector-contrib:")
    assert re.fullmatch(r"prom/prometheus:v3\.\d+\.\d+", images["prometheus"])
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", images["jaeger"])
    assert images["grafana"].startswith("grafana/grafana:")


def test_images_are_pinned_to_versions(compose):
    """Every image names an exact version (or digest), never latest."""
    for name, service in compose["services"].items():
        image = service["image"]
        assert "latest" not in image, (name, image)
        assert re.fullmatch(r"[\w./-]+(:v?\d+\.\d+\.\d+(-[\w.]+)?|@sha256:[0-9a-f]{64})", image), (
            name,
            image,
        )


def test_ports_bind_to_loopback_unless_overridden(compose):
    """Every published port binds ${OTEL_TRAINING_BIND:-127.0.0.1}: loopback by default."""
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                host_ip = str(port.get("host_ip", ""))
            else:
                host_ip = str(port).rsplit(":", 2)[0] if str(port).count(":") >= 2 else ""
            assert host_ip == "${OTEL_TRAINING_BIND:-127.0.0.1}", (name, port)
            assert _defaults(host_ip) == "127.0.0.1"


def test_bind_mounts_are_read_only_and_exist(compose):
    """Host directories and files are mounted read-only; shipped configuration exists."""
    named = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for source, target, read_only in _mounts(service):
            if source in named:
                continue
            assert read_only, f"{name}: {source} -> {target} is writable"
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"


def test_prometheus_keeps_its_data_in_a_named_volume(compose):
    """The TSDB lives in the named volume prometheus-data, where --storage.tsdb.path points."""
    prometheus = compose["services"]["prometheus"]
    assert "prometheus-data" in (compose.get("volumes") or {})
    targets = {src: target for src, target, _ in _mounts(prometheus)}
    assert _flag(prometheus["command"], "--storage.tsdb.path") == targets["prometheus-data"]


def test_every_service_has_a_healthcheck(compose):
    """Each service has a health check with a test command; dependants wait for health."""
    for name, service in compose["services"].items():
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), name
    for name in ("otel-collector", "grafana"):
        depends = compose["services"][name]["depends_on"]
        assert all(d["condition"] == "service_healthy" for d in depends.values()), name


def test_no_password_is_written_in_the_compose_file(compose):
    """The Grafana admin password comes from the environment, required; no secret literals."""
    grafana = compose["services"]["grafana"]["environment"]
    assert re.fullmatch(
        r"\$\{GF_SECURITY_ADMIN_PASSWORD:\?[^}]+\}", grafana["GF_SECURITY_ADMIN_PASSWORD"]
    )
    with pytest.raises(LookupError):
        _defaults(grafana["GF_SECURITY_ADMIN_PASSWORD"])
    for name, service in compose["services"].items():
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(e.split("=", 1) for e in environment)
        for key, value in environment.items():
            if re.search(r"PASSWORD|SECRET|TOKEN|API_KEY", key):
                assert re.fullmatch(r"\$\{\w+:\?[^}]+\}", str(value)), (name, key)


def test_grafana_allows_anonymous_read_only_viewing(compose):
    """Anonymous visitors are Viewers; nobody can sign up."""
    environment = compose["services"]["grafana"]["environment"]
    assert environment["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert environment["GF_USERS_ALLOW_SIGN_UP"] == "false"


def test_compose_wires_the_shipped_configuration(compose):
    """Each service reads the file the repository ships, at the path its flags name."""
    services = compose["services"]
    collector_args = services["otel-collector"]["command"]
    assert _flag(collector_args, "--config") == _mount_target(compose, "otel-collector", COLLECTOR)
    prometheus_args = services["prometheus"]["command"]
    assert "--web.enable-otlp-receiver" in prometheus_args
    assert _flag(prometheus_args, "--config.file") == _mount_target(
        compose, "prometheus", PROMETHEUS
    )
    assert _mount_target(compose, "grafana", DATASOURCES.parents[1]) == "/etc/grafana/provisioning"
    dashboards = _mount_target(compose, "grafana", DASHBOARD.parent)
    assert _yaml(PROVIDERS)["providers"][0]["options"]["path"] == dashboards
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards}/{DASHBOARD.name}"


def test_offline_directory_is_mounted_where_the_collector_reads(compose, collector):
    """The run directory (OTEL_PYTHON_TRAINING_OUTPUT_DIR) is mounted where the otlp_json_file
    receivers look, and their globs match the per-rank files of the embedded default."""
    mounts = {src: target for src, target, _ in _mounts(compose["services"]["otel-collector"])}
    source = "${OTEL_PYTHON_TRAINING_OUTPUT_DIR:-./otel-training-telemetry}"
    assert source in mounts
    assert _defaults(source) == "./otel-training-telemetry"
    target = mounts[source]
    receivers = {
        name: config
        for name, config in collector["receivers"].items()
        if name.split("/")[0] in ("otlp_json_file", "otlpjsonfile")
    }
    by_signal = {"metrics": [], "traces": [], "logs": []}
    for name, config in receivers.items():
        assert config.get("start_at") == "beginning", name
        for pattern in config["include"]:
            assert pattern.startswith(f"{target}/"), (name, pattern)
            regex = _glob_regex(pattern[len(target) + 1 :])
            for signal, files in by_signal.items():
                if regex.fullmatch(f"{signal}-rank0.jsonl"):
                    assert regex.fullmatch(f"run42/{signal}-rank17.jsonl"), pattern
                    files.append(name)
    assert all(len(set(names)) == 1 for names in by_signal.values()), by_signal
    assert len({names[0] for names in by_signal.values()}) == 3, by_signal


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A doublestar glob (as the collector's file consumer reads it) as a regex."""
    out = ""
    for part in re.split(r"(\*\*/|\*|\?)", pattern):
        out += {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
    return re.compile(out)


# -- collector-config/collector.yaml ------------------------------------------------------------


def _pipeline_components(collector) -> Iterator[tuple[str, str, str]]:
    for pipeline, config in collector["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in config.get(kind, []):
                yield pipeline, kind, component


def test_every_component_in_a_pipeline_is_defined(collector):
    """Pipelines reference only defined components; every defined one is used (debug is
    optional); extensions in service are defined."""
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    for pipeline, kind, component in _pipeline_components(collector):
        assert component in (collector.get(kind) or {}), f"{pipeline}: {kind} {component}"
        used[kind].add(component)
    for kind, names in used.items():
        unused = set(collector.get(kind) or {}) - names
        assert unused <= {"debug"}, f"{kind} defined but unused: {unused}"
    for extension in collector["service"].get("extensions", []):
        assert extension in collector["extensions"]


def test_every_pipeline_has_receivers_and_exporters(collector):
    """Each pipeline has receivers and exporters and is of a known signal."""
    pipelines = collector["service"]["pipelines"]
    assert {"metrics", "traces", "metrics/offline", "traces/offline"} <= set(pipelines)
    assert {"logs", "logs/offline"} <= set(pipelines)
    for name, config in pipelines.items():
        assert name.split("/")[0] in ("metrics", "traces", "logs"), name
        assert config.get("receivers") and config.get("exporters"), name


def test_processors_are_ordered_memory_limiter_first_batch_last(collector):
    """memory_limiter first, batch last; metrics pipelines accumulate delta before batching."""
    for name, config in collector["service"]["pipelines"].items():
        types = [p.split("/")[0] for p in config["processors"]]
        assert types[0] == "memory_limiter" and types[-1] == "batch", (name, types)
        if name.split("/")[0] == "metrics":
            delta = [
                p
                for p in config["processors"]
                if p.split("/")[0] in ("deltatocumulative", "delta_to_cumulative")
            ]
            assert delta, f"{name}: Prometheus cannot ingest delta without deltatocumulative"
            # A counter that sees no increment for longer than max_stale restarts from zero
            # (skipped iterations are rare): keep streams for hours.
            max_stale = collector["processors"][delta[0]].get("max_stale", "5m")
            assert _duration_s(max_stale) >= 3600, (name, max_stale)


def _duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(float(n) * units[u] for n, u in parts)


def test_logs_pipelines_take_otlp_and_the_files_to_the_debug_exporter(collector):
    """Logs arrive over OTLP (the live path) and from logs-rank*.jsonl (the offline path),
    pass memory_limiter and batch, and end at an exporter defined in the file."""
    pipelines = collector["service"]["pipelines"]
    live, offline = pipelines["logs"], pipelines["logs/offline"]
    assert live["receivers"] == ["otlp"]
    (receiver,) = offline["receivers"]
    assert receiver.split("/")[0] == "otlp_json_file"
    assert any("logs-rank*.jsonl" in p for p in collector["receivers"][receiver]["include"])
    for pipeline in (live, offline):
        assert pipeline["processors"] == ["memory_limiter", "batch"]
        assert pipeline["exporters"] and all(
            e in collector["exporters"] for e in pipeline["exporters"]
        )


def test_exporters_use_current_component_names(collector):
    """otlp_grpc / otlp_http, not the deprecated otlp / otlphttp exporter names."""
    types = {name.split("/")[0] for name in collector["exporters"]}
    assert types <= {"otlp_grpc", "otlp_http", "debug"}, types
    assert {"otlp", "otlphttp"}.isdisjoint(types)


def test_collector_talks_to_the_compose_services(compose, collector):
    """OTLP in on 4317/4318 (published by compose); metrics to Prometheus' OTLP receiver,
    traces to Jaeger's OTLP/gRPC port."""
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    published = {str(p).rsplit(":", 1)[-1] for p in compose["services"]["otel-collector"]["ports"]}
    assert {"4317", "4318"} <= published
    pipelines = collector["service"]["pipelines"]
    for name, config in pipelines.items():
        exporters = [collector["exporters"][e] for e in config["exporters"]]
        if name.startswith("metrics"):
            assert any(
                e.get("endpoint") == "http://prometheus:9090/api/v1/otlp" for e in exporters
            ), name
        if name.startswith("traces"):
            assert any(e.get("endpoint") == "jaeger:4317" for e in exporters), name
    assert "prometheus" in compose["services"] and "jaeger" in compose["services"]


# -- collector-config/prometheus.yaml -------------------------------------------------------------


def test_prometheus_promotes_the_rank_identity_and_keeps_suffixed_names():
    """Rank identity becomes labels; names are UnderscoreEscapingWithSuffixes (the names the
    Python exporter produces); late and offline samples are accepted."""
    config = _yaml(PROMETHEUS)
    otlp = config["otlp"]
    assert otlp["translation_strategy"] == "UnderscoreEscapingWithSuffixes"
    assert set(otlp["promote_resource_attributes"]) == PROMOTED
    # Everything the registry's resource group declares, except service.name (the job label)
    # and process.creation.time (a per-process timestamp, kept in target_info).
    assert _registry_resource_attributes() - {"service.name", "process.creation.time"} == PROMOTED
    assert otlp.get("keep_identifying_resource_attributes") is True
    assert config["storage"]["tsdb"]["out_of_order_time_window"]


def test_prometheus_configuration_passes_promtool(tmp_path):
    """promtool accepts the configuration (the otlp section, which Debian's Prometheus 2 does
    not know, is checked by the test above)."""
    promtool = promtool_or_unavailable()
    config = _yaml(PROMETHEUS)
    config.pop("otlp")
    path = tmp_path / "prometheus.yaml"
    path.write_text(yaml.safe_dump(config))
    shutil.copytree(RULES_DIR, tmp_path / "rules")  # where rule_files points, beside it
    result = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout, result.stdout


# -- Grafana provisioning ----------------------------------------------------------------------


def test_datasources_point_at_the_compose_services(compose, dashboard):
    """Prometheus and Jaeger data sources on their compose ports; the dashboard defaults to the
    provisioned Prometheus."""
    sources = {d["type"]: d for d in _yaml(DATASOURCES)["datasources"]}
    assert sources["prometheus"]["url"] == "http://prometheus:9090"
    assert sources["jaeger"]["url"] == "http://jaeger:16686"
    assert len({d["uid"] for d in sources.values()}) == len(sources)
    variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert variable["query"] == "prometheus"
    assert variable["current"]["value"] == sources["prometheus"]["uid"]


# -- the dashboard -------------------------------------------------------------------------------


def test_panels_have_unique_ids_a_datasource_and_targets(dashboard):
    """Every panel has a unique id; every non-row panel a datasource and PromQL targets."""
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] and dashboard["title"]
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        title = panel["title"]
        assert panel.get("datasource", {}).get("uid") == "${datasource}", title
        assert panel.get("targets"), title
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), title
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), title
            assert target.get("datasource", {}).get("uid") == "${datasource}", title
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, title


def test_template_variables_exist_and_every_use_is_defined(dashboard):
    """service, job and rank are multi-value query variables with All = .*; every $variable
    the dashboard uses anywhere is defined (or a Grafana built-in)."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "service", "job", "rank"} <= set(variables)
    for name in ("service", "job", "rank"):
        variable = variables[name]
        assert variable["type"] == "query" and variable["multi"] and variable["includeAll"]
        assert variable["allValue"] == ".*"
        assert variable["datasource"]["uid"] == "${datasource}"
    text = json.dumps(dashboard)
    undefined = _variables_used(text) - set(variables) - GRAFANA_BUILTINS
    assert not undefined, undefined


def test_queries_filter_on_the_promoted_labels(dashboard):
    """Every query filters on the service, job and rank variables, through the labels that
    promotion creates (dl.job.id -> dl_job_id, dl.rank -> dl_rank; service.name -> job); a
    query of a job's figure alone (a run: record, which has no rank) on service and job."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    labels = {
        "service": "job",
        "job": _prometheus_label("dl.job.id"),
        "rank": _prometheus_label("dl.rank"),
    }
    assert {"dl.job.id", "dl.rank"} <= PROMOTED
    for name, label in labels.items():
        assert re.search(rf",\s*{label}\)$", variables[name]["definition"]), name
    job_level = 0
    for expr in _exprs(dashboard):
        names = promql_metric_names(expr)
        of_the_job = bool(names) and all(n.startswith("run:") for n in names)
        job_level += of_the_job
        for name, label in labels.items():
            if of_the_job and name == "rank":
                continue
            selectors = re.findall(r"\{([^}]*)\}", expr)
            assert selectors and all(f'{label}=~"${name}"' in s for s in selectors), (name, expr)
    assert job_level == 1  # the progress at risk


def test_dashboard_metric_names_are_the_translated_registry_names(dashboard):
    """Each metric the dashboard selects is a registry metric under its Prometheus name, a
    record of the rules file (or a pending tensor metric); each registry metric has a
    panel, of its own or of a record computed from it (a job's figure)."""
    series = _registry_series()
    known = {name for names in series.values() for name in names} | _records()
    used = {name for expr in _exprs(dashboard) for name in promql_metric_names(expr)}
    unknown = {n for n in used - known if not n.startswith(PENDING_PREFIX)}
    assert not unknown, f"not the Prometheus name of any registry metric: {unknown}"
    reads = {rule["record"]: _selected_names(rule["expr"]) for rule in _rules() if "record" in rule}
    drawn, todo = set(used), [n for n in used if n in reads]
    while todo:  # what the records on the dashboard are computed from, all the way down
        for name in reads.pop(todo.pop(), set()) - drawn:
            drawn.add(name)
            todo.extend([name] if name in reads else [])
    used = drawn
    uncovered = [
        m for m, names in series.items() if not set(names) & used and m not in WITHOUT_PANEL
    ]
    assert not uncovered, f"registry metrics without a panel: {uncovered}"
    assert not set(WITHOUT_PANEL) - set(series), "WITHOUT_PANEL names unknown metrics"


def test_readme_naming_table_is_the_translated_registry():
    """The README's OTel -> Prometheus table lists every registry metric with its series."""
    table = {}
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith(("`megatron.", "`dl.", "`otel_training.")):
            table[re.findall(r"`([^`]+)`", cells[0])[0]] = re.findall(r"`([^`]+)`", cells[-1])
    assert table == _registry_series()


def test_step_duration_name_has_the_unit_suffix_and_counters_total():
    """The translation rules this file relies on: ms -> _milliseconds, counters _total."""
    assert _prometheus_series("megatron.training.step_duration_ms", "histogram", "ms") == [
        "megatron_training_step_duration_ms_milliseconds_bucket",
        "megatron_training_step_duration_ms_milliseconds_sum",
        "megatron_training_step_duration_ms_milliseconds_count",
    ]
    assert _prometheus_series("megatron.training.skipped_iters", "counter", "") == [
        "megatron_training_skipped_iters_total"
    ]
    assert _prometheus_series("megatron.training.nonfinite_values", "counter", "{value}") == [
        "megatron_training_nonfinite_values_total"
    ]
    assert _prometheus_series("x.y", "gauge", "1") == ["x_y"]


def test_collector_drops_unit_one_before_prometheus(collector):
    """Every metrics pipeline drops unit "1" before Prometheus, so no series gets _ratio."""
    statements = collector["processors"]["transform/unit_one"]["metric_statements"]
    assert statements == ['set(metric.unit, "") where metric.unit == "1"']
    for name, pipeline in collector["service"]["pipelines"].items():
        if name.startswith("metrics"):
            assert "transform/unit_one" in pipeline["processors"], name


# -- the optional hardware overlay (collector-config/hardware.yaml) ----------------------------


def _merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """The collector's merge of two --config files: mappings merge key by key, the overlay's
    other values win."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


@pytest.fixture(scope="module")
def hardware(collector) -> dict[str, Any]:
    return _merged(collector, _yaml(HARDWARE))


def test_the_hardware_overlay_is_off_in_the_default_stack(collector, compose):
    """The default collector neither defines nor runs hostmetrics or the DCGM scrape."""
    assert not {"hostmetrics", "prometheus/dcgm"} & set(collector["receivers"])
    assert "metrics/hardware" not in collector["service"]["pipelines"]
    assert _flag(compose["services"]["otel-collector"]["command"], "--config").endswith(
        "/collector.yaml"
    )


def test_the_hardware_overlay_adds_hostmetrics_and_the_dcgm_scrape(hardware):
    """Merged over collector.yaml: one more metrics pipeline, hostmetrics reading the host
    through /hostfs and a scrape of dcgm-exporter on its port 9400, into Prometheus."""
    pipeline = hardware["service"]["pipelines"]["metrics/hardware"]
    assert pipeline["receivers"] == ["hostmetrics", "prometheus/dcgm"]
    assert pipeline["exporters"] == ["otlp_http/prometheus"]
    host = hardware["receivers"]["hostmetrics"]
    assert host["root_path"] == "/hostfs"
    assert {"cpu", "memory", "filesystem", "network"} <= set(host["scrapers"])
    (scrape,) = hardware["receivers"]["prometheus/dcgm"]["config"]["scrape_configs"]
    (target,) = scrape["static_configs"][0]["targets"]
    assert target == "${env:DCGM_EXPORTER_ENDPOINT:-dcgm-exporter:9400}"
    # The original pipelines are untouched by the merge.
    assert {"metrics", "traces", "metrics/offline", "traces/offline"} <= set(
        hardware["service"]["pipelines"]
    )


def test_the_merged_hardware_configuration_keeps_the_pipeline_rules(hardware):
    """Every rule of the default configuration holds for the merged one."""
    test_every_component_in_a_pipeline_is_defined(hardware)
    test_every_pipeline_has_receivers_and_exporters(hardware)
    test_processors_are_ordered_memory_limiter_first_batch_last(hardware)
    test_collector_drops_unit_one_before_prometheus(hardware)


def test_the_hardware_compose_overlay_wires_the_overlay_and_the_host_filesystem(compose):
    """docker-compose.hardware.yaml passes both configurations, mounts hardware.yaml and the
    host's filesystem read-only at hostmetrics' root_path, and checks both in its healthcheck;
    it is valid against the compose spec."""
    overlay = _yaml(COMPOSE_HARDWARE)["services"]["otel-collector"]
    configs = [a.split("=", 1)[1] for a in overlay["command"] if a.startswith("--config=")]
    base_config = _flag(compose["services"]["otel-collector"]["command"], "--config")
    assert configs[0] == base_config and configs[1].endswith("/hardware.yaml")
    mounts = {target: (source, ro) for source, target, ro in _mounts(overlay)}
    assert mounts[configs[1]] == ("./collector-config/hardware.yaml", True)
    assert mounts["/hostfs"] == ("/", True)
    assert [a for a in overlay["healthcheck"]["test"] if a.startswith("--config=")] == [
        f"--config={c}" for c in configs
    ]
    script = Path(sys.executable).with_name("check-jsonschema")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "check_jsonschema"]
    result = subprocess.run(
        [*command, "--builtin-schema", "vendor.compose-spec", str(COMPOSE_HARDWARE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- the dashboard: zero counters, checkpoints, links to Jaeger -----------------------------------


def _panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    (panel,) = [p for p in _panels(dashboard) if p.get("title") == title]
    return panel


def test_counters_a_healthy_run_never_creates_read_zero(dashboard):
    """Skipped-iteration and non-finite panels fall back to `or on() vector(0)` after the query."""
    for title in ZERO_WHEN_ABSENT:
        (target,) = _panel(dashboard, title)["targets"]
        query, fallback = re.fullmatch(r"(.+\))\s+or on\(\)\s+(.+)", target["expr"], re.S).groups()
        assert re.fullmatch(
            r'vector\(0\)|label_replace\(vector\(0\), "\w+", "\w+", "", ""\)', fallback
        )
        assert promql_metric_names(query) and not promql_metric_names(fallback), title
        assert query.startswith("sum"), f"{title}: one aggregated series, or vector(0) never hides"


def test_checkpoint_panels_chart_the_checkpoint_histogram_by_operation(dashboard):
    """The checkpoint panels read megatron.checkpoint.duration in seconds, split by operation."""
    (metric,) = [m for m in _registry_metrics() if m["name"] == "megatron.checkpoint.duration"]
    assert (metric["instrument"], metric["unit"]) == ("histogram", "s")
    series = set(_prometheus_series(metric["name"], "histogram", "s"))
    operation = _prometheus_label(metric["attributes"][0]["ref"])
    for title in CHECKPOINT_PANELS:
        panel = _panel(dashboard, title)
        assert panel["fieldConfig"]["defaults"]["unit"] == "s", title
        for target in panel["targets"]:
            expr = target["expr"]
            assert promql_metric_names(expr) <= series and promql_metric_names(expr), (title, expr)
            assert all(operation in by for by in re.findall(r"by \(([^)]*)\)", expr)), expr
            assert f"{{{{{operation}}}}}" in target["legendFormat"], title


def _link_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p for p in _panels(dashboard) if p.get("fieldConfig", {}).get("defaults", {}).get("links")
    ]


def _kept_labels(expr: str) -> set[str] | None:
    """The labels every series of `expr` keeps: None (all) for a bare selector (or one
    filtered by a comparison with a number, which keeps its labels), else those that every
    `by (...)` clause keeps."""
    selector = r"[a-zA-Z_:][a-zA-Z0-9_:]*\{[^}]*\}(\s*[<>!=]=?\s*[0-9.]+)?"
    if re.fullmatch(selector, expr.strip()):
        return None
    clauses = [set(re.split(r",\s*", by)) for by in re.findall(r"by \(([^)]*)\)", expr)]
    assert clauses, f"neither a bare selector nor an aggregation by labels: {expr}"
    return set.intersection(*clauses)


_LINK_VARIABLE = re.compile(r"\$\{(__field\.labels\.(\w+)|__from|__to|(\w+)):?(\w*)\}")

#: What a data link is rendered with in these tests: field labels, and the dashboard's range.
_SAMPLE_LABELS = {
    "job": "my-pretraining run/1&x",
    "dl_rank": "17",
    "megatron_checkpoint_operation": "save",
}
_FROM_MS, _TO_MS = 1_700_000_000_000, 1_700_003_600_000


def _render_link(url: str, variables: dict[str, Any]) -> str:
    """`url` as Grafana renders a data link: labels percent-encoded (the format the link names),
    ${var:raw} verbatim, $__from and $__to in epoch milliseconds."""

    def one(match: re.Match[str]) -> str:
        whole, label, variable, fmt = match.groups()
        if whole == "__from":
            return str(_FROM_MS)
        if whole == "__to":
            return str(_TO_MS)
        value = _SAMPLE_LABELS[label] if label else variables[variable]["query"]
        assert fmt in ("percentencode", "raw"), f"say how ${{{whole}}} is encoded"
        return urllib.parse.quote(value, safe="") if fmt == "percentencode" else value

    return _LINK_VARIABLE.sub(one, url)


def test_per_rank_panels_link_to_the_ranks_traces_in_jaeger(dashboard):
    """Every per-rank panel links to Jaeger with labels that each of its queries keeps."""
    per_rank = {
        p["title"]
        for p in _panels(dashboard)
        if any("{{dl_rank}}" in t.get("legendFormat", "") for t in p.get("targets", []))
    }
    linked = {p["title"] for p in _link_panels(dashboard)}
    assert per_rank == linked
    assert {"Loss", "Step time per rank", "Checkpoint duration per rank"} <= linked
    for panel in _link_panels(dashboard):
        labels = {
            m.group(2)
            for link in panel["fieldConfig"]["defaults"]["links"]
            for m in _LINK_VARIABLE.finditer(link["url"])
            if m.group(2)
        }
        assert {"job", "dl_rank"} <= labels, panel["title"]
        for target in panel["targets"]:
            kept = _kept_labels(target["expr"])
            assert kept is None or labels <= kept, (panel["title"], labels, kept)


def test_jaeger_links_open_a_trace_search_for_the_service_and_rank(compose, dashboard):
    """Explore and Jaeger UI links search the series' service, dl.rank and the time range."""
    jaeger_uid = next(d for d in _yaml(DATASOURCES)["datasources"] if d["type"] == "jaeger")["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    service, rank = _SAMPLE_LABELS["job"], _SAMPLE_LABELS["dl_rank"]
    for panel in _link_panels(dashboard):
        title = panel["title"]
        operation = None
        if title in CHECKPOINT_PANELS:
            operation = f"megatron.checkpoint.{_SAMPLE_LABELS['megatron_checkpoint_operation']}"
            assert operation in SPANS
        links = panel["fieldConfig"]["defaults"]["links"]
        assert len(links) == 2 and all(link["targetBlank"] and link["title"] for link in links)
        explore, ui = (
            urllib.parse.urlsplit(_render_link(link["url"], variables)) for link in links
        )

        assert explore.path == "/explore" and not explore.netloc, title
        params = urllib.parse.parse_qs(explore.query, strict_parsing=True)
        assert params["schemaVersion"] == ["1"]
        (pane,) = json.loads(params["panes"][0]).values()
        assert pane["datasource"] == jaeger_uid
        assert pane["range"] == {"from": str(_FROM_MS), "to": str(_TO_MS)}
        (query,) = pane["queries"]
        assert query["datasource"] == {"type": "jaeger", "uid": jaeger_uid}
        assert query["queryType"] == "search" and query["service"] == service
        assert query["tags"] == f"dl.rank={rank}"  # logfmt, as Grafana's Jaeger search takes it
        assert query.get("operation") == operation, title

        base = urllib.parse.urlsplit(variables["jaeger_url"]["query"])
        assert (ui.scheme, ui.netloc, ui.path) == (base.scheme, base.netloc, "/search"), title
        params = urllib.parse.parse_qs(ui.query, strict_parsing=True)
        assert params["service"] == [service]
        assert json.loads(params["tags"][0]) == {"dl.rank": rank}  # JSON, as the Jaeger UI's URL
        assert params["lookback"] == ["custom"]
        assert params["start"] == [str(_FROM_MS * 1000)] and params["end"] == [str(_TO_MS * 1000)]
        assert params.get("operation") == ([operation] if operation else None), title


def test_jaeger_ui_address_is_a_variable_defaulting_to_the_compose_port(compose, dashboard):
    """The Jaeger UI address is a textbox variable defaulting to the port compose publishes."""
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "jaeger_url")
    assert variable["type"] == "textbox"
    assert variable["query"] == variable["current"]["value"]
    address = urllib.parse.urlsplit(variable["query"])
    published = [
        _defaults(str(port)).rsplit(":", 2) for port in compose["services"]["jaeger"]["ports"]
    ]
    assert [address.hostname, str(address.port), "16686"] in published
