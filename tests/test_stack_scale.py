"""The collector agent and gateway of the stack at scale (collector-config/agent.yaml,
gateway.yaml, docker-compose.scale.yaml), checked offline: the pipeline rules of each tier, the
options of every component against those of the pinned contrib version, and the compose
variant's wiring. Each rule is also shown to catch the configuration that breaks it."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_stack_config import (
    COMPOSE,
    PROMETHEUS,
    ROOT,
    _defaults,
    _duration_s,
    _flag,
    _mount_target,
    _mounts,
)
from test_stack_config import (
    test_every_component_in_a_pipeline_is_defined as components_are_defined,
)

CONFIG_DIR = ROOT / "collector-config"
AGENT = CONFIG_DIR / "agent.yaml"
GATEWAY = CONFIG_DIR / "gateway.yaml"
COMPOSE_SCALE = ROOT / "docker-compose.scale.yaml"

#: Exporters that send over the network: each needs a persistent queue (debug writes to the
#: collector's own output).
NETWORK_EXPORTERS = {"otlp_grpc", "otlp_http", "load_balancing", "loadbalancing"}
#: Processors that keep state per stream or per trace: never in a gateway, which any request
#: may reach.
STATEFUL = {
    "deltatocumulative",
    "delta_to_cumulative",
    "cumulativetodelta",
    "tail_sampling",
    "groupbytrace",
    "spanmetrics",
}
DELTA = {"deltatocumulative", "delta_to_cumulative"}
LOAD_BALANCING = {"load_balancing", "loadbalancing"}

#: The options each component type takes in otelcol-contrib 0.159.0, as checked in its sources
#: (opentelemetry-collector v0.159.0: config/configgrpc, config/confighttp, config/configretry,
#: exporter/exporterhelper/internal/queuebatch/config.go, processor/memorylimiterprocessor,
#: processor/batchprocessor, exporter/otlpexporter, exporter/otlphttpexporter; contrib:
#: extension/storage/filestorage, processor/deltatocumulativeprocessor, the transform
#: processor, extension/healthcheckextension). A key outside these is a typo the collector
#: would refuse at start.
OPTIONS: dict[str, set[str]] = {
    "memory_limiter": {
        "check_interval",
        "limit_mib",
        "spike_limit_mib",
        "limit_percentage",
        "spike_limit_percentage",
        "min_gc_interval_when_soft_limited",
        "min_gc_interval_when_hard_limited",
    },
    "batch": {
        "timeout",
        "send_batch_size",
        "send_batch_max_size",
        "metadata_keys",
        "metadata_cardinality_limit",
    },
    "deltatocumulative": {"max_stale", "max_streams"},
    "transform": {
        "error_mode",
        "metric_statements",
        "trace_statements",
        "log_statements",
        "profile_statements",
    },
    "otlp_grpc": {
        "endpoint",
        "compression",
        "tls",
        "keepalive",
        "read_buffer_size",
        "write_buffer_size",
        "wait_for_ready",
        "headers",
        "user_agent",
        "balancer_name",
        "authority",
        "auth",
        "middlewares",
        "timeout",
        "sending_queue",
        "retry_on_failure",
    },
    "otlp_http": {
        "endpoint",
        "traces_endpoint",
        "metrics_endpoint",
        "logs_endpoint",
        "profiles_endpoint",
        "encoding",
        "compression",
        "compression_params",
        "tls",
        "headers",
        "timeout",
        "proxy_url",
        "read_buffer_size",
        "write_buffer_size",
        "max_idle_conns",
        "max_idle_conns_per_host",
        "max_conns_per_host",
        "idle_conn_timeout",
        "disable_keep_alives",
        "auth",
        "middlewares",
        "cookies",
        "sending_queue",
        "retry_on_failure",
    },
    "debug": {"verbosity", "sampling_initial", "sampling_thereafter", "use_internal_logger"},
    "file_storage": {
        "directory",
        "timeout",
        "compaction",
        "fsync",
        "create_directory",
        "directory_permissions",
    },
    "health_check": {"endpoint", "path", "check_collector_pipeline", "tls", "response_body"},
    "otlp": {"protocols"},
}
QUEUE_OPTIONS = {
    "enabled",
    "wait_for_result",
    "sizer",
    "queue_size",
    "block_on_overflow",
    "storage",
    "num_consumers",
    "batch",
}
RETRY_OPTIONS = {
    "enabled",
    "initial_interval",
    "randomization_factor",
    "multiplier",
    "max_interval",
    "max_elapsed_time",
}
COMPACTION_OPTIONS = {
    "on_start",
    "on_rebound",
    "directory",
    "max_transaction_size",
    "rebound_needed_threshold_mib",
    "rebound_trigger_threshold_mib",
    "check_interval",
    "cleanup_on_start",
}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _type(name: str) -> str:
    return name.split("/")[0]


def tier_problems(config: dict[str, Any], role: str) -> list[str]:
    """What breaks the rules of a tier (``agent`` or ``gateway``) in a collector configuration:

    - memory_limiter first and batch last in every pipeline;
    - deltatocumulative in every metrics pipeline of the agent, where a rank's streams always
      arrive, and no processor that keeps state per stream or trace in the gateway;
    - every network exporter has a sending queue on a file_storage extension that the service
      starts, and retries without giving up (the queue is the bound);
    - no load-balancing exporter routes metrics by service (the default), and traces only by
      trace id in the job-level (skeleton) pipeline, whose traces are bounded.
    """
    problems = []
    extensions = config.get("extensions") or {}
    started = set(config["service"].get("extensions") or [])
    for name, pipeline in config["service"]["pipelines"].items():
        signal = name.split("/")[0]
        types = [_type(p) for p in pipeline.get("processors") or []]
        if not types or types[0] != "memory_limiter" or types[-1] != "batch":
            problems.append(f"{name}: memory_limiter first and batch last, not {types}")
        delta = DELTA & set(types)
        if role == "agent" and signal == "metrics" and not delta:
            problems.append(f"{name}: the agent accumulates delta streams (deltatocumulative)")
        if role == "gateway" and STATEFUL & set(types):
            problems.append(f"{name}: stateful {sorted(STATEFUL & set(types))} in a gateway")
        for exporter_name in pipeline.get("exporters") or []:
            exporter = (config.get("exporters") or {}).get(exporter_name) or {}
            kind = _type(exporter_name)
            if kind in LOAD_BALANCING:
                key = exporter.get("routing_key", "service" if signal != "traces" else "traceID")
                if signal == "metrics" and key == "service":
                    problems.append(f"{name}: {exporter_name} routes metrics by service")
                if signal == "traces" and key == "traceID" and name != "traces/job":
                    problems.append(f"{name}: {exporter_name} routes step traces by trace id")
            if kind not in NETWORK_EXPORTERS:
                continue
            queue = exporter.get("sending_queue") or {}
            storage = queue.get("storage")
            if queue.get("enabled") is False or not storage or _type(storage) != "file_storage":
                problems.append(f"{exporter_name}: no persistent sending queue on file_storage")
            elif storage not in extensions or storage not in started:
                problems.append(f"{exporter_name}: storage {storage} is not a started extension")
            retry = exporter.get("retry_on_failure") or {}
            if retry.get("enabled") is False or retry.get("max_elapsed_time") not in (0, "0s"):
                problems.append(
                    f"{exporter_name}: gives batches up while the queue could hold them"
                )
    if role == "agent":
        for name, processor in (config.get("processors") or {}).items():
            if _type(name) in DELTA and _duration_s(processor.get("max_stale", "5m")) < 3600:
                problems.append(f"{name}: max_stale under 1 h restarts a quiet counter at zero")
    return problems


def option_problems(config: dict[str, Any]) -> list[str]:
    """Options that the pinned collector does not know, per component (see OPTIONS)."""
    problems = []
    for section in ("receivers", "processors", "exporters", "extensions"):
        for name, options in (config.get(section) or {}).items():
            known = OPTIONS.get(_type(name))
            if known is None:
                problems.append(f"{name}: a component type these tests do not know")
                continue
            unknown = set(options or {}) - known
            if unknown:
                problems.append(f"{name}: unknown options {sorted(unknown)}")
            for key, allowed in (
                ("sending_queue", QUEUE_OPTIONS),
                ("retry_on_failure", RETRY_OPTIONS),
                ("compaction", COMPACTION_OPTIONS),
            ):
                unknown = set((options or {}).get(key) or {}) - allowed
                if unknown:
                    problems.append(f"{name}.{key}: unknown options {sorted(unknown)}")
    return problems


@pytest.fixture(scope="module")
def agent() -> dict[str, Any]:
    return _yaml(AGENT)


@pytest.fixture(scope="module")
def gateway() -> dict[str, Any]:
    return _yaml(GATEWAY)


@pytest.fixture(scope="module")
def scale() -> dict[str, Any]:
    return _yaml(COMPOSE_SCALE)


# -- the tiers' rules ----------------------------------------------------------------------------


def test_agent_and_gateway_keep_the_rules_of_their_tier(agent, gateway):
    """Both configurations break no rule of their tier, use only defined components and only
    options the pinned collector knows."""
    assert tier_problems(agent, "agent") == []
    assert tier_problems(gateway, "gateway") == []
    for config in (agent, gateway):
        components_are_defined(config)
        assert option_problems(config) == []
        assert {"metrics", "traces", "logs"} <= set(config["service"]["pipelines"])


def _broken(config: dict[str, Any], change: str) -> dict[str, Any]:
    """``config`` with one rule broken."""
    config = copy.deepcopy(config)
    pipelines = config["service"]["pipelines"]
    if change == "batch first":
        pipelines["metrics"]["processors"].reverse()
    elif change == "no memory_limiter":
        pipelines["traces"]["processors"].remove("memory_limiter")
    elif change == "delta in the gateway":
        config["processors"]["deltatocumulative"] = {"max_stale": "24h"}
        pipelines["metrics"]["processors"].insert(1, "deltatocumulative")
    elif change == "no delta in the agent":
        pipelines["metrics"]["processors"].remove("deltatocumulative")
    elif change == "memory queue":
        for exporter in config["exporters"].values():
            exporter.get("sending_queue", {}).pop("storage", None)
    elif change == "queue on a missing extension":
        config["service"]["extensions"].remove("file_storage/queue")
    elif change == "retries give up":
        for exporter in config["exporters"].values():
            if "retry_on_failure" in exporter:
                exporter["retry_on_failure"]["max_elapsed_time"] = "300s"
    elif change in ("metrics by service", "metrics by default", "steps by trace id"):
        lb = {"protocol": {"otlp": {}}, "resolver": {"dns": {"hostname": "otel-gateway"}}}
        if change == "metrics by service":
            lb["routing_key"] = "service"
        lb["sending_queue"] = {"storage": "file_storage/queue"}
        lb["retry_on_failure"] = {"max_elapsed_time": "0s"}
        config["exporters"]["load_balancing"] = lb
        signal = "traces" if change == "steps by trace id" else "metrics"
        pipelines[signal]["exporters"] = ["load_balancing"]
    elif change == "short max_stale":
        config["processors"]["deltatocumulative"]["max_stale"] = "5m"
    return config


@pytest.mark.parametrize(
    ("role", "change"),
    [
        ("agent", "batch first"),
        ("gateway", "no memory_limiter"),
        ("gateway", "delta in the gateway"),
        ("agent", "no delta in the agent"),
        ("agent", "memory queue"),
        ("gateway", "memory queue"),
        ("agent", "queue on a missing extension"),
        ("gateway", "retries give up"),
        ("agent", "metrics by service"),
        ("agent", "metrics by default"),
        ("agent", "steps by trace id"),
        ("agent", "short max_stale"),
    ],
)
def test_each_rule_catches_the_configuration_that_breaks_it(agent, gateway, role, change):
    """A configuration with one rule broken is reported."""
    config = agent if role == "agent" else gateway
    assert tier_problems(_broken(config, change), role), change


def test_an_unknown_option_is_reported(agent):
    """A misspelt option (balancer instead of balancer_name) is reported."""
    config = copy.deepcopy(agent)
    config["exporters"]["otlp_grpc/gateway"]["balancer"] = "round_robin"
    config["exporters"]["otlp_grpc/gateway"]["sending_queue"]["persistent"] = True
    assert len(option_problems(config)) == 2


# -- what each tier talks to ------------------------------------------------------------------


def test_the_agent_listens_on_loopback_and_sends_to_every_gateway(agent):
    """Ranks reach the agent on 127.0.0.1:4317/4318 by default; it sends gzip over gRPC to all
    addresses of the gateways' DNS name, round robin, with a queue bounded in bytes."""
    protocols = agent["receivers"]["otlp"]["protocols"]
    assert _defaults(protocols["grpc"]["endpoint"].replace("env:", "")) == "127.0.0.1:4317"
    assert _defaults(protocols["http"]["endpoint"].replace("env:", "")) == "127.0.0.1:4318"
    (exporter,) = agent["exporters"].values()
    assert exporter["endpoint"].startswith("dns:///")
    assert exporter["balancer_name"] == "round_robin" and exporter["compression"] == "gzip"
    queue = exporter["sending_queue"]
    assert queue["sizer"] == "bytes" and queue["queue_size"] >= 256 * 2**20
    batch = agent["processors"]["batch"]
    assert batch["send_batch_max_size"] == batch["send_batch_size"] == 8192


def test_the_gateway_sends_to_prometheus_otlp_and_jaeger(gateway, scale):
    """Metrics to Prometheus 3's OTLP receiver (or Mimir) over OTLP/HTTP, traces to Jaeger over
    OTLP/gRPC, by default the compose services; the unit-1 rule as in collector.yaml; agents
    reconnect every few minutes so that new gateways get traffic."""
    metrics = gateway["exporters"]["otlp_http/metrics"]["endpoint"]
    traces = gateway["exporters"]["otlp_grpc/traces"]["endpoint"]
    assert _defaults(metrics.replace("env:", "")) == "http://prometheus:9090/api/v1/otlp"
    assert _defaults(traces.replace("env:", "")) == "jaeger:4317"
    environment = scale["services"]["otel-gateway"]["environment"]
    assert environment["METRICS_OTLP_ENDPOINT"] == "http://prometheus:9090/api/v1/otlp"
    assert environment["TRACES_OTLP_ENDPOINT"] == "jaeger:4317"
    statements = gateway["processors"]["transform/unit_one"]["metric_statements"]
    assert statements == ['set(metric.unit, "") where metric.unit == "1"']
    assert "transform/unit_one" in gateway["service"]["pipelines"]["metrics"]["processors"]
    keepalive = gateway["receivers"]["otlp"]["protocols"]["grpc"]["keepalive"]
    assert _duration_s(keepalive["server_parameters"]["max_connection_age"]) <= 600
    port = gateway["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]
    assert port["prometheus"]["port"] == 8888


# -- docker-compose.scale.yaml -----------------------------------------------------------------


def test_the_scale_compose_file_is_valid_against_the_compose_spec():
    """check-jsonschema validates docker-compose.scale.yaml with the compose-spec schema."""
    script = Path(sys.executable).with_name("check-jsonschema")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "check_jsonschema"]
    result = subprocess.run(
        [*command, "--builtin-schema", "vendor.compose-spec", str(COMPOSE_SCALE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_scale_stack_runs_an_agent_and_replicated_gateways(scale):
    """An agent publishing OTLP on loopback, at least two gateway replicas publishing nothing,
    the collector image of the single-collector stack, and the backends of docker-compose.yaml."""
    services = scale["services"]
    base = _yaml(COMPOSE)["services"]
    collector_image = base["otel-collector"]["image"]
    assert services["otel-agent"]["image"] == services["otel-gateway"]["image"] == collector_image
    assert services["otel-gateway"]["deploy"]["replicas"] >= 2
    assert "ports" not in services["otel-gateway"]
    published = [_defaults(str(p)) for p in services["otel-agent"]["ports"]]
    assert {"127.0.0.1:4317:4317", "127.0.0.1:4318:4318"} <= set(published)
    for name in ("prometheus", "jaeger", "grafana"):
        assert services[name]["extends"] == {"file": COMPOSE.name, "service": name}
    for name, service in services.items():
        image = service.get("image")
        if image:
            assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), (name, image)


def test_the_scale_stack_wires_agent_gateway_and_queue(scale, agent):
    """Each collector reads the shipped file at the path its --config names and its health check
    validates it; the agent sends to the gateway service and keeps its queue in a named volume
    that a one-shot service hands to the collector's user first."""
    services = scale["services"]
    for name, path in (("otel-agent", AGENT), ("otel-gateway", GATEWAY)):
        config = _flag(services[name]["command"], "--config")
        assert config == _mount_target(scale, name, path)
        assert f"--config={config}" in services[name]["healthcheck"]["test"]
    environment = services["otel-agent"]["environment"]
    assert environment["OTEL_GATEWAY_ENDPOINT"].split(":")[0] == "otel-gateway"
    assert environment["OTEL_AGENT_LISTEN_HOST"] == "0.0.0.0"
    queue_dir = environment["OTEL_AGENT_QUEUE_DIR"]
    mounts = {target: source for source, target, _ in _mounts(services["otel-agent"])}
    assert mounts[queue_dir] in scale["volumes"]
    helper = services["otel-agent"]["depends_on"]["queue-permissions"]
    assert helper["condition"] == "service_completed_successfully"
    chown = services["queue-permissions"]["command"]
    assert chown[:2] == ["chown", "-R"] and chown[-1] == queue_dir
    assert services["otel-agent"]["depends_on"]["otel-gateway"]["condition"] == "service_healthy"


def test_prometheus_takes_native_histograms_over_otlp():
    """The stack's Prometheus (3.5) is started with the native-histograms feature, without
    which it refuses the exponential step histogram (docs/scale.md); from 3.8 on no flag is
    needed."""
    prometheus = _yaml(COMPOSE)["services"]["prometheus"]
    major, minor = (int(x) for x in re.search(r":v(\d+)\.(\d+)", prometheus["image"]).groups())
    assert (major, minor) >= (3, 0)
    if (major, minor) < (3, 8):
        assert "--enable-feature=native-histograms" in prometheus["command"]
    assert _flag(prometheus["command"], "--config.file") == _mount_target(
        _yaml(COMPOSE), "prometheus", PROMETHEUS
    )
