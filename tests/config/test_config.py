"""config.load: every variable, each bad value -> one warning naming it, then the default."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest
from doc_rules import documents
from hypothesis import given
from hypothesis import strategies as st

from otel_training import config


def load(caplog, **env):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="otel_training.config"):
        settings = config.load(env)
    return settings, [r.getMessage() for r in caplog.records]


def test_defaults_use_the_embedded_exporter(caplog):
    """With nothing set: embedded files, 60 s interval, 30 s timeout, no warning."""
    settings, warnings = load(caplog)
    assert settings.metrics_exporters == ("otlp_json_file",)
    assert settings.traces_exporters == ("otlp_json_file",)
    assert settings.metric_export_interval_ms == 60_000
    assert settings.metric_export_timeout_ms == 30_000
    assert settings.metrics_otlp.timeout_s == 10.0
    assert settings.output_dir == "otel-training-telemetry"
    assert not settings.sdk_disabled
    assert warnings == []


def test_an_endpoint_selects_otlp(caplog):
    """An OTLP endpoint without an exporter name selects otlp for both signals."""
    settings, _ = load(caplog, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4317")
    assert settings.metrics_exporters == ("otlp",)
    assert settings.traces_exporters == ("otlp",)
    assert settings.metrics_otlp.endpoint == "http://127.0.0.1:4317"
    assert settings.metrics_otlp.protocol == "grpc"


def test_a_signal_endpoint_selects_otlp_for_that_signal_only(caplog):
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT sends traces to OTLP and leaves metrics embedded."""
    settings, _ = load(caplog, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://h:4318/v1/traces")
    assert settings.traces_exporters == ("otlp",)
    assert settings.metrics_exporters == ("otlp_json_file",)


def test_http_generic_endpoint_gets_the_signal_path(caplog):
    """Over http/protobuf the generic endpoint gets /v1/{signal}; a signal endpoint is kept."""
    settings, _ = load(
        caplog,
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318/",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http://other:4318/custom",
    )
    assert settings.metrics_otlp.endpoint == "http://collector:4318/v1/metrics"
    assert settings.traces_otlp.endpoint == "http://other:4318/custom"
    assert settings.metrics_otlp.protocol == "http/protobuf"


@pytest.mark.parametrize("spelling", ["true", "TRUE", " true ", "True"])
def test_sdk_disabled_is_case_insensitive(caplog, spelling):
    """Case A4(a): booleans ignore case and surrounding whitespace."""
    settings, warnings = load(caplog, OTEL_SDK_DISABLED=spelling)
    assert settings.sdk_disabled
    assert warnings == []


def test_bad_boolean_warns_and_keeps_default(caplog):
    """A boolean that is neither true nor false: one warning naming it, default kept."""
    settings, warnings = load(caplog, OTEL_SDK_DISABLED="yes")
    assert not settings.sdk_disabled
    assert len(warnings) == 1 and "OTEL_SDK_DISABLED" in warnings[0]


@pytest.mark.parametrize("raw", ["abc", "0", "-5000", "nan", "inf"])
def test_bad_export_interval_warns_and_uses_60s(caplog, raw):
    """Case A4(c): a non-numeric, zero, negative or non-finite interval -> 60,000 ms."""
    settings, warnings = load(caplog, OTEL_METRIC_EXPORT_INTERVAL=raw)
    assert settings.metric_export_interval_ms == 60_000
    assert len(warnings) == 1 and "OTEL_METRIC_EXPORT_INTERVAL" in warnings[0]


def test_timeout_longer_than_interval_is_clamped(caplog):
    """Case A4(d): a timeout above the interval warns and is clamped to the interval."""
    settings, warnings = load(
        caplog, OTEL_METRIC_EXPORT_INTERVAL="1000", OTEL_METRIC_EXPORT_TIMEOUT="5000"
    )
    assert settings.metric_export_interval_ms == 1000
    assert settings.metric_export_timeout_ms == 1000
    assert len(warnings) == 1 and "OTEL_METRIC_EXPORT_TIMEOUT" in warnings[0]


def test_headers_keep_valid_entries_and_name_the_malformed_one(caplog):
    """Case A4(e): a value with a plain space is kept; a bare entry is named and dropped."""
    settings, warnings = load(
        caplog,
        OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer abc def,bare-entry,x-tenant=a%20b",
        OTEL_EXPORTER_OTLP_METRICS_HEADERS="x-metrics=1",
    )
    assert settings.traces_otlp.headers == {
        "authorization": "Bearer abc def",
        "x-tenant": "a b",
    }
    assert settings.metrics_otlp.headers["x-metrics"] == "1"
    assert "entry 2" in " ".join(warnings) and "bare-entry" not in " ".join(warnings)
    assert all("OTEL_EXPORTER_OTLP" in w for w in warnings)


def test_header_key_with_space_is_malformed(caplog):
    """A header name must be an HTTP token: 'my key=v' is dropped with a warning."""
    settings, warnings = load(caplog, OTEL_EXPORTER_OTLP_HEADERS="my key=v,ok=1")
    assert settings.metrics_otlp.headers == {"ok": "1"}
    assert warnings


@pytest.mark.parametrize(
    "name,raw,attribute,default",
    [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten", "timeout_s", 10.0),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "timeout_s", 10.0),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon", "protocol", "grpc"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "protocol", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "compression", "none"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x", "endpoint", None),
    ],
)
def test_bad_otlp_values_warn_and_fall_back(caplog, name, raw, attribute, default):
    """Each bad OTLP value: one warning naming the variable, then the default."""
    settings, warnings = load(caplog, **{name: raw})
    assert getattr(settings.metrics_otlp, attribute) == default
    assert warnings and all(name in w for w in warnings)


def test_timeout_is_in_seconds_and_per_signal_wins(caplog):
    """OTEL_EXPORTER_OTLP_TIMEOUT is seconds (Python SDK); the signal variable wins."""
    settings, _ = load(
        caplog, OTEL_EXPORTER_OTLP_TIMEOUT="3", OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="1.5"
    )
    assert settings.metrics_otlp.timeout_s == 3.0
    assert settings.traces_otlp.timeout_s == 1.5


def test_compression_none_and_gzip(caplog):
    """'none' and 'gzip' are accepted for gRPC; deflate over gRPC becomes gzip."""
    assert load(caplog, OTEL_EXPORTER_OTLP_COMPRESSION="gzip")[0].metrics_otlp.compression == "gzip"
    settings, warnings = load(caplog, OTEL_EXPORTER_OTLP_COMPRESSION="deflate")
    assert settings.metrics_otlp.compression == "gzip" and warnings


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("none", ("none",)),
        ("otlp,console", ("otlp", "console")),
        ("none,otlp", ("none",)),
        ("prometheus", ("prometheus",)),
    ],
)
def test_metrics_exporter_lists(caplog, raw, expected):
    """OTEL_METRICS_EXPORTER takes a list; none wins over everything."""
    assert load(caplog, OTEL_METRICS_EXPORTER=raw)[0].metrics_exporters == expected


def test_unknown_exporter_is_named(caplog):
    """An unknown exporter name is warned about; known ones in the list are kept."""
    settings, warnings = load(caplog, OTEL_TRACES_EXPORTER="zipkin,console")
    assert settings.traces_exporters == ("console",)
    assert "zipkin" in warnings[0]
    settings, warnings = load(caplog, OTEL_TRACES_EXPORTER="prometheus")
    assert settings.traces_exporters == ("otlp_json_file",)


def test_case_a4b_metrics_none_traces_otlp(caplog):
    """Case A4(b): metrics off, traces to OTLP."""
    settings, _ = load(caplog, OTEL_METRICS_EXPORTER="none", OTEL_TRACES_EXPORTER="otlp")
    assert settings.metrics_exporters == ("none",)
    assert settings.traces_exporters == ("otlp",)


@pytest.mark.parametrize(
    "name,raw,attribute,default",
    [
        ("OTEL_BSP_SCHEDULE_DELAY", "-1", "bsp_schedule_delay_ms", 5000),
        ("OTEL_BSP_EXPORT_TIMEOUT", "x", "bsp_export_timeout_ms", 30000),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "1.5", "bsp_max_queue_size", 2048),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0", "bsp_max_export_batch_size", 512),
        ("OTEL_TRACES_SAMPLER", "sometimes", "sampler", "parentbased_always_on"),
        (
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            "both",
            "temporality_preference",
            "cumulative",
        ),
        ("OTEL_EXPORTER_PROMETHEUS_PORT", "70000", "prometheus_port", 9464),
    ],
)
def test_other_bad_values(caplog, name, raw, attribute, default):
    """Batch processor, sampler, temporality and Prometheus values fall back with a warning."""
    settings, warnings = load(caplog, **{name: raw})
    assert getattr(settings, attribute) == default
    assert len(warnings) == 1 and name in warnings[0]


def test_sampler_ratio(caplog):
    """traceidratio takes OTEL_TRACES_SAMPLER_ARG in [0, 1]; outside it the ratio is 1."""
    settings, _ = load(caplog, OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25")
    assert (settings.sampler, settings.sampler_arg) == ("traceidratio", 0.25)
    settings, warnings = load(
        caplog, OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="2"
    )
    assert settings.sampler_arg == 1.0 and "OTEL_TRACES_SAMPLER_ARG" in warnings[0]


def test_temporality_preference_is_case_insensitive(caplog):
    """DELTA is read as delta."""
    settings, _ = load(caplog, OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE="DELTA")
    assert settings.temporality_preference == "delta"


@pytest.mark.parametrize(
    "raw,rank,world,local,exports",
    [
        ("all", 3, 8, 3, True),
        ("last", 7, 8, 3, True),
        ("last", 6, 8, 2, False),
        ("first_per_node", 4, 8, 0, True),
        ("first_per_node", 5, 8, 1, False),
        ("0,4-6", 5, 8, 1, True),
        ("0,4-6", 3, 8, 3, False),
    ],
)
def test_export_ranks_policy(caplog, raw, rank, world, local, exports):
    """OTEL_PYTHON_TRAINING_EXPORT_RANKS selects the ranks that export."""
    settings, warnings = load(
        caplog,
        OTEL_PYTHON_TRAINING_EXPORT_RANKS=raw,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(local),
    )
    assert settings.export_ranks.exports(settings.identity) is exports
    assert warnings == []


@pytest.mark.parametrize("raw", ["some", "1,x", "5-2"])
def test_bad_export_ranks_fall_back_to_all(caplog, raw):
    """An unusable rank policy warns and exports from every rank."""
    settings, warnings = load(caplog, OTEL_PYTHON_TRAINING_EXPORT_RANKS=raw)
    assert settings.export_ranks.policy == "all"
    assert "OTEL_PYTHON_TRAINING_EXPORT_RANKS" in warnings[0]


def test_step_duration_buckets(caplog):
    """Bucket overrides parse; unsorted or non-numeric ones warn and keep the built-in ones."""
    settings, _ = load(caplog, OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS="10, 100,1000")
    assert settings.step_duration_buckets_ms == (10.0, 100.0, 1000.0)
    for bad in ("100,10", "a,b", "-1,5"):
        settings, warnings = load(caplog, OTEL_PYTHON_TRAINING_STEP_DURATION_BUCKETS_MS=bad)
        assert settings.step_duration_buckets_ms is None and warnings


def test_identity_from_torchrun(caplog):
    """torchrun's variables give rank, local rank, world size, node rank and the run id."""
    settings, _ = load(
        caplog,
        RANK="5",
        LOCAL_RANK="1",
        WORLD_SIZE="8",
        LOCAL_WORLD_SIZE="4",
        GROUP_RANK="1",
        TORCHELASTIC_RUN_ID="run-42",
    )
    identity = settings.identity
    assert (identity.rank, identity.local_rank, identity.world_size) == (5, 1, 8)
    assert (identity.local_world_size, identity.node_rank) == (4, 1)
    assert identity.launcher == "torchrun"
    assert identity.run_id == "run-42" and identity.job_id == "run-42"


def test_identity_from_slurm(caplog):
    """SLURM's variables are used when torchrun's are absent."""
    settings, _ = load(
        caplog,
        SLURM_JOB_ID="1234",
        SLURM_STEP_ID="0",
        SLURM_PROCID="9",
        SLURM_LOCALID="1",
        SLURM_NTASKS="16",
        SLURM_NODEID="2",
        SLURM_NTASKS_PER_NODE="8",
    )
    identity = settings.identity
    assert (identity.rank, identity.local_rank, identity.world_size) == (9, 1, 16)
    assert (identity.node_rank, identity.local_world_size) == (2, 8)
    assert (identity.launcher, identity.job_id, identity.run_id) == (
        "slurm",
        "1234",
        "slurm-1234.0",
    )


def test_torchrun_inside_slurm_prefers_torchrun_ranks(caplog):
    """Under torchrun in a SLURM allocation, RANK wins and the job id is SLURM's."""
    settings, _ = load(
        caplog,
        RANK="3",
        WORLD_SIZE="16",
        LOCAL_RANK="3",
        TORCHELASTIC_RUN_ID="elastic-7",
        SLURM_JOB_ID="99",
        SLURM_PROCID="0",
        SLURM_NTASKS="2",
        SLURM_NODEID="1",
    )
    identity = settings.identity
    assert (identity.rank, identity.world_size, identity.node_rank) == (3, 16, 1)
    assert (identity.job_id, identity.run_id) == ("99", "elastic-7")


def test_identity_in_kubernetes(caplog):
    """In Kubernetes: pod name from HOSTNAME, node rank from JOB_COMPLETION_INDEX."""
    settings, _ = load(
        caplog,
        KUBERNETES_SERVICE_HOST="10.0.0.1",
        HOSTNAME="trainer-2-abcde",
        POD_NAMESPACE="ml",
        JOB_COMPLETION_INDEX="2",
        RANK="16",
        WORLD_SIZE="32",
    )
    identity = settings.identity
    assert identity.node_rank == 2 and identity.launcher == "kubernetes"
    assert (identity.k8s_pod_name, identity.k8s_namespace) == ("trainer-2-abcde", "ml")


def test_run_id_override_and_single_process(caplog):
    """OTEL_PYTHON_TRAINING_RUN_ID wins; a lone process is rank 0 of 1."""
    settings, _ = load(caplog, OTEL_PYTHON_TRAINING_RUN_ID="my-run")
    identity = settings.identity
    assert (identity.rank, identity.world_size, identity.run_id) == (0, 1, "my-run")
    assert identity.launcher == "none"


def test_bad_rank_value_warns(caplog):
    """A non-numeric RANK warns and the process counts as a single one."""
    settings, warnings = load(caplog, RANK="zero", WORLD_SIZE="2")
    assert settings.identity.rank == 0 and "RANK" in warnings[0]


def test_a_generic_variable_warns_once_for_both_signals(caplog):
    """OTEL_EXPORTER_OTLP_TIMEOUT=0 is read for metrics and traces but warned about once."""
    _, warnings = load(caplog, OTEL_EXPORTER_OTLP_TIMEOUT="0")
    assert len(warnings) == 1


@pytest.mark.parametrize(
    "raw,expected,warned",
    [("0.0001", 100.0, True), ("50", 100.0, True), ("1e300", 60_000.0, True), ("250", 250, False)],
)
def test_export_interval_bounds(caplog, raw, expected, warned):
    """Sub-100 ms intervals are raised to 100 ms, absurd ones use the default: no busy loop."""
    settings, warnings = load(caplog, OTEL_METRIC_EXPORT_INTERVAL=raw)
    assert settings.metric_export_interval_ms == expected
    assert bool(warnings) is warned


def test_otlp_timeout_in_milliseconds_is_caught(caplog):
    """OTEL_EXPORTER_OTLP_TIMEOUT=10000 (ms by mistake) warns that it is seconds."""
    settings, warnings = load(caplog, OTEL_EXPORTER_OTLP_TIMEOUT="10000")
    assert settings.metrics_otlp.timeout_s == 10.0
    assert "seconds" in warnings[0]


def test_huge_rank_range_is_refused(caplog):
    """A rank range that would exhaust memory is refused with a warning."""
    settings, warnings = load(caplog, OTEL_PYTHON_TRAINING_EXPORT_RANKS="0-2000000000")
    assert settings.export_ranks.policy == "all" and warnings


def test_grpc_metadata_keys_are_checked(caplog):
    """Over gRPC a key gRPC rejects ('%zz') is dropped; over HTTP token keys pass."""
    settings, warnings = load(caplog, OTEL_EXPORTER_OTLP_HEADERS="%zz=1,ok=2")
    assert settings.metrics_otlp.headers == {"ok": "2"} and "entry 1" in warnings[0]


def test_scheme_less_grpc_endpoint_warns_about_tls(caplog):
    """host:port without a scheme means TLS for gRPC: the user is told."""
    _, warnings = load(caplog, OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:4317")
    assert len(warnings) == 1 and "TLS" in warnings[0]


def test_default_timeout_is_clamped_silently(caplog):
    """A 5 s interval clamps the default 30 s timeout without a warning about an unset one."""
    settings, warnings = load(caplog, OTEL_METRIC_EXPORT_INTERVAL="5000")
    assert settings.metric_export_timeout_ms == 5000 and warnings == []


def test_service_name_and_resource_attributes_come_from_the_mapping(caplog):
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are parsed from the given mapping."""
    settings, warnings = load(
        caplog, OTEL_SERVICE_NAME="svc", OTEL_RESOURCE_ATTRIBUTES="a=1,b=x%20y,broken"
    )
    assert settings.service_name == "svc"
    assert dict(settings.resource_attributes) == {"a": "1", "b": "x y"}
    assert len(warnings) == 1 and "entry 3" in warnings[0]


# -- Megatron-LM's and NeMo Lens' variables --------------------------------------------------


def test_megatron_and_lens_span_groups_are_aliases_below_ours(caplog):
    """MEGATRON_OTEL_SPAN_GROUPS, else NEMO_LENS_SPAN_GROUPS, when ours is unset."""
    per_step = config.SPAN_GROUP_PRESETS["per_step"]
    assert load(caplog, MEGATRON_OTEL_SPAN_GROUPS="per_step")[0].span_groups == per_step
    assert load(caplog, NEMO_LENS_SPAN_GROUPS="per_step")[0].span_groups == per_step
    settings, _ = load(
        caplog,
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="none",
        MEGATRON_OTEL_SPAN_GROUPS="all",
        NEMO_LENS_SPAN_GROUPS="all",
    )
    assert settings.span_groups == frozenset()
    both, _ = load(caplog, MEGATRON_OTEL_SPAN_GROUPS="job", NEMO_LENS_SPAN_GROUPS="all")
    assert both.span_groups == {"job"}


def test_profiling_is_all_and_old_group_names_warn_once(caplog):
    """Megatron-LM's profiling preset is all; our names from before warn and still work."""
    assert (
        load(caplog, OTEL_PYTHON_TRAINING_SPAN_GROUPS="profiling")[0].span_groups
        == (config.SPAN_GROUP_PRESETS["all"])
    )
    settings, warnings = load(caplog, OTEL_PYTHON_TRAINING_SPAN_GROUPS="iteration,run")
    assert settings.span_groups == {"step", "job"}
    assert len(warnings) == 2 and "now called 'step'" in warnings[0]


@pytest.mark.parametrize(
    ("env", "exporting"),
    [
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "single_rank"}, [3]),
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "single_rank", "MEGATRON_OTEL_EXPORT_RANK": "1"}, [1]),
        ({"NEMO_LENS_EXPORT_STRATEGY": "single_rank", "NEMO_LENS_EXPORT_RANK": "0"}, [0]),
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "all_ranks"}, [0, 1, 2, 3]),
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "first_rank_per_node"}, [0, 2]),
        # No rank scores below 0: the rank of the lowest md5 score (3 of 0..3) exports alone.
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "sampled",
          "MEGATRON_OTEL_EXPORT_SAMPLE_RATE": "0"}, [3]),
        ({"MEGATRON_OTEL_RANK_STRATEGY": "single_rank", "MEGATRON_OTEL_EXPORT_RANK": "2"}, [2]),
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "single_rank",
          "MEGATRON_OTEL_RANK_STRATEGY": "all_ranks"}, [3]),
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "sampled"}, [0, 1, 2, 3]),
        ({"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "0",
          "MEGATRON_OTEL_EXPORT_STRATEGY": "single_rank"}, [0]),
    ],
)  # fmt: skip
def test_megatron_export_strategies_choose_ranks_as_megatron_does(caplog, env, exporting):
    """single_rank (default the last rank), all_ranks, first_rank_per_node, sampled; ours wins."""
    chosen = []
    for rank in range(4):
        settings, _ = load(caplog, RANK=str(rank), LOCAL_RANK=str(rank % 2), WORLD_SIZE="4", **env)
        if settings.export_ranks.exports(settings.identity):
            chosen.append(rank)
    assert chosen == exporting


def test_sampled_ranks_are_chosen_by_nemo_lens_rule_and_stable():
    """sampled:RATE picks ranks by md5 of the rank, as NeMo Lens does: stable, near the rate."""
    import hashlib

    def lens(rank: int, rate: float) -> bool:
        digest = hashlib.md5(str(rank).encode()).hexdigest()
        return (int(digest, 16) % 10000) / 10000.0 < rate

    policy = config.ExportRanks("sampled", rate=0.25)
    chosen = [
        r for r in range(1000) if policy.exports(config.RankIdentity(rank=r, world_size=1000))
    ]
    assert chosen == [r for r in range(1000) if lens(r, 0.25)]
    assert 200 < len(chosen) < 300


def _lens_score(rank: int) -> float:
    import hashlib

    return (int(hashlib.md5(str(rank).encode()).hexdigest(), 16) % 10000) / 10000.0


@given(rate=st.floats(0.0, 1.0), world=st.integers(1, 300))
def test_sampled_exports_from_at_least_one_rank_at_any_rate(rate, world):
    """sampled at any rate and world size: NeMo Lens' ranks when it chooses any, else exactly
    the one rank of lowest md5 score; every rank computes the same set."""
    policy = config.ExportRanks("sampled", rate=rate)
    chosen = [
        r for r in range(world) if policy.exports(config.RankIdentity(rank=r, world_size=world))
    ]
    lens = [r for r in range(world) if _lens_score(r) < rate]
    if lens:
        assert chosen == lens
    else:
        assert chosen == [min(range(world), key=lambda r: (_lens_score(r), r))]


def test_a_rate_of_one_percent_on_eight_ranks_exports_from_one(caplog):
    """sampled:0.01 on 8 ranks, where md5(rank) < rate selects none: one rank exports."""
    assert [_lens_score(r) < 0.01 for r in range(8)] == [False] * 8
    settings, warnings = load(caplog, OTEL_PYTHON_TRAINING_EXPORT_RANKS="sampled:0.01")
    assert warnings == []
    chosen = [
        r
        for r in range(8)
        if settings.export_ranks.exports(config.RankIdentity(rank=r, world_size=8))
    ]
    assert len(chosen) == 1


@pytest.mark.parametrize(
    ("environ", "nowhere"),
    [
        ({"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "8,9"}, True),
        ({"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "7,9"}, False),
        ({"MEGATRON_OTEL_EXPORT_STRATEGY": "single_rank", "MEGATRON_OTEL_EXPORT_RANK": "8"}, True),
        ({"NEMO_LENS_EXPORT_STRATEGY": "single_rank", "NEMO_LENS_EXPORT_RANK": "-1"}, False),
        ({"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "sampled:0"}, False),
        ({"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "last"}, False),
        ({"OTEL_PYTHON_TRAINING_EXPORT_RANKS": "first_per_node"}, False),
    ],
)
def test_a_policy_knows_when_no_rank_of_the_job_exports(caplog, environ, nowhere):
    """A list or a single rank beyond the world of 8 selects nowhere; the others never do."""
    settings, _ = load(caplog, RANK="0", WORLD_SIZE="8", **environ)
    assert settings.export_ranks.exports_nowhere(8) is nowhere
    chosen = [
        r
        for r in range(8)
        if settings.export_ranks.exports(config.RankIdentity(rank=r, world_size=8))
    ]
    assert (chosen == []) is nowhere
    name, value = next(iter(environ.items()))
    assert f"{name}={value}" in settings.export_ranks.setting


def test_a_bad_export_strategy_warns_once_and_every_rank_exports(caplog):
    """An unknown strategy is one warning and the default (all ranks)."""
    settings, warnings = load(caplog, MEGATRON_OTEL_EXPORT_STRATEGY="some_ranks")
    assert settings.export_ranks.policy == "all" and len(warnings) == 1


@documents("spans.md", "L = `OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS` (default 1000)")
@documents("spans.md", "(B, default 20,000 spans, about 2.4 MB)")
def test_nvtx_only_groups_and_trace_segments(caplog):
    """fine is the fine-grained groups; names add up; the segment length is a whole number."""
    settings, _ = load(caplog, OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS="fine")
    assert settings.nvtx_only_groups == {
        "microbatch",
        "layer",
        "communication",
        "activation_offload",
    }
    assert load(caplog, OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS="layer")[0].nvtx_only_groups == {
        "layer"
    }
    assert load(caplog)[0].nvtx_only_groups == frozenset()
    renamed, warnings = load(caplog, OTEL_PYTHON_TRAINING_NVTX_ONLY_GROUPS="iteration,layer")
    assert renamed.nvtx_only_groups == {"step", "layer"} and not warnings  # as span groups take it
    assert (
        load(caplog, OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS="50")[0].trace_segment_iterations
        == 50
    )
    bad, warnings = load(caplog, OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS="0")
    assert bad.trace_segment_iterations == config.DEFAULT_TRACE_SEGMENT_ITERATIONS == 1000
    assert len(warnings) == 1
    assert load(caplog)[0].trace_span_budget == config.DEFAULT_TRACE_SPAN_BUDGET == 20_000
    assert load(caplog, OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET="64")[0].trace_span_budget == 64
    for raw in ("0", "-5", "2.5", "many"):
        bad, warnings = load(caplog, OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET=raw)
        assert bad.trace_span_budget == config.DEFAULT_TRACE_SPAN_BUDGET, raw
        assert len(warnings) == 1 and "OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET" in warnings[0], raw


@documents(
    "spans.md",
    "`OTEL_PYTHON_TRAINING_RUN_ID`, else Megatron-LM's `MEGATRON_OTEL_RUN_ID`, else NeMo",
)
def test_megatron_and_lens_run_ids(caplog):
    """OTEL_PYTHON_TRAINING_RUN_ID, else MEGATRON_OTEL_RUN_ID, else NEMO_LENS_RUN_ID."""
    assert load(caplog, NEMO_LENS_RUN_ID="lens")[0].identity.run_id == "lens"
    assert (
        load(caplog, MEGATRON_OTEL_RUN_ID="mg", NEMO_LENS_RUN_ID="lens")[0].identity.run_id == "mg"
    )
    assert (
        load(caplog, OTEL_PYTHON_TRAINING_RUN_ID="ours", MEGATRON_OTEL_RUN_ID="mg")[
            0
        ].identity.run_id
        == "ours"
    )


@pytest.mark.parametrize("interval", ["²", "1" * 5_000, "+5", "1.5", "0", ""])
def test_a_tensor_metric_interval_that_is_no_whole_number_is_warned_and_skipped(caplog, interval):
    """An interval int() cannot read (a superscript digit, more digits than it converts) is a
    bad entry like any other: one warning, the entry skipped, never an exception."""
    variable = "OTEL_PYTHON_TRAINING_TENSOR_METRICS"
    settings, warnings = load(caplog, **{variable: f"grad_norm:{interval},router:5"})
    assert settings.tensor_metrics == (("router", 5),)
    assert len(warnings) == 1 and variable in warnings[0]


def test_the_code_and_the_environment_read_a_schedule_alike():
    """One reading of a schedule: entries in order, blanks and empty entries dropped, the case of
    a name kept, ``none``/``off`` in any case for no metric at all."""
    entries = config.split_tensor_metric_schedule(" Grad_Norm : 10 ,, router:x ,:3")
    assert entries == (
        config.ScheduleEntry("Grad_Norm : 10", "Grad_Norm", 10),
        config.ScheduleEntry("router:x", "router", None),
        config.ScheduleEntry(":3", "", 3),
    )
    assert config.split_tensor_metric_schedule(" OFF ") is None
    assert config.split_tensor_metric_schedule("None") is None
    assert config.split_tensor_metric_schedule(" , ") == ()


class _ReadRecorder(Mapping[str, str]):
    """An environment that notes every variable asked for."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return key in self._values

    def get(self, key: str, default=None):
        self.asked.add(key)
        return self._values.get(key, default)

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def test_standard_variables_lists_every_standard_variable_load_reads():
    """config.STANDARD_VARIABLES is the standard OTEL_* variables load() reads, no more, no fewer
    (with every exporter and a ratio sampler, so that each branch reads its own)."""
    asked: set[str] = set()
    for values in (
        {},
        {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "otlp",
         "OTEL_LOGS_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
    ):  # fmt: skip
        environ = _ReadRecorder(values)
        config.load(environ)
        asked |= environ.asked
    ours = "OTEL_PYTHON_TRAINING_"
    standard = {v for v in asked if v.startswith("OTEL_") and not v.startswith(ours)}
    assert sorted(standard) == sorted(config.STANDARD_VARIABLES)
    assert len(set(config.STANDARD_VARIABLES)) == len(config.STANDARD_VARIABLES)
