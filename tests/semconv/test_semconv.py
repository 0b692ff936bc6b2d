"""The semantic-convention registry (semconv/) and the constants generated from it."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from doc_rules import documents
from support import metrics_of, program_or_unavailable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "generate_semconv.py"
GENERATED_DIR = ROOT / "src" / "otel_training" / "semconv"


def _load_generator():
    spec = importlib.util.spec_from_file_location("generate_semconv", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


gen = _load_generator()

MEGATRON_REASON = (
    "wire compatibility with Megatron-LM megatron/core/telemetry/training_metrics.py "
    "and NeMo dashboards"
)
# name -> (instrument, unit as exported, description at creation): Megatron-LM's, verbatim.
MEGATRON_METRICS = {
    "megatron.training.step_duration_ms": (
        "histogram",
        "ms",
        "Duration of one training step in milliseconds.",
    ),
    "megatron.training.loss": ("gauge", "", "Training loss value at each log interval."),
    "megatron.training.throughput_tflops": ("gauge", "", "Training throughput in TFLOP/s/GPU."),
    "megatron.training.grad_norm": ("gauge", "", "Global gradient norm."),
    "megatron.training.skipped_iters": ("counter", "", "Number of training iterations skipped."),
    "megatron.training.learning_rate": ("gauge", "", "Current learning rate."),
    "megatron.training.tokens_per_sec": ("gauge", "", "Training throughput in tokens/second."),
    "megatron.training.memory_allocated_gb": ("gauge", "", "Peak GPU memory allocated in GB."),
}


@pytest.fixture(scope="module")
def registry():
    return gen.load_registry()


@pytest.fixture(scope="module")
def schema():
    return gen.load_schema()


# --- the registry ---------------------------------------------------------------------------


def test_vendored_schema_is_the_definition_2_schema(schema):
    """The vendored schema is a valid 2020-12 JSON schema whose file_format is definition/2."""
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["file_format"]["const"] == "definition/2"
    assert (ROOT / "semconv" / "schema" / "LICENSE").read_text().find("Apache License") >= 0
    assert "open-telemetry/weaver" in (ROOT / "semconv" / "schema" / "NOTICE").read_text()


def test_registry_files_validate_against_the_schema(registry, schema):
    """Every semconv/registry/*.yaml file is valid definition/2 and declares that format."""
    assert len(registry.documents) >= 2
    assert gen.schema_violations(registry, schema) == []
    assert all(doc["file_format"] == "definition/2" for doc in registry.documents.values())


def test_registry_breaks_no_rule(registry):
    """The registry passes every naming and annotation rule of the generator."""
    assert [str(v) for v in gen.rule_violations(registry)] == []


def test_names_are_lower_case_and_dotted(registry):
    """Every metric name, attribute key, entity type and group id is lower-case and dotted."""
    names = (
        [m["name"] for m in registry.metrics]
        + [a["key"] for a in registry.attributes]
        + [e["type"] for e in registry.entities]
        + [g["id"] for g in registry.attribute_groups]
    )
    pattern = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"
    assert names and all(re.fullmatch(pattern, n) for n in names), names


def test_briefs_end_with_a_period(registry):
    """Every brief (metrics, attributes, entities, public groups) ends with a period."""
    entries = registry.metrics + registry.attributes + registry.entities
    entries += [g for g in registry.attribute_groups if g["visibility"] == "public"]
    assert [e.get("brief") for e in entries if not e["brief"].strip().endswith(".")] == []


def test_no_metric_name_is_the_namespace_of_another(registry):
    """No metric name X exists beside another metric named X + '.' + something."""
    names = [m["name"] for m in registry.metrics]
    assert [(a, b) for a in names for b in names if b.startswith(a + ".")] == []


def test_units_of_rule_following_metrics_are_ucum(registry):
    """Metrics without a naming exception have UCUM units and no unit in their name."""
    plain = [m for m in registry.metrics if "naming_exception" not in _ours(m)]
    assert plain, "expected at least one metric that follows the naming rules"
    for metric in plain:
        assert gen.is_ucum_unit(metric["unit"]), metric["name"]
        assert not gen.has_unit_in_name(metric["name"]), metric["name"]


def test_true_units_are_ucum(registry):
    """Every metric declares the true unit of its value, and it is a UCUM unit."""
    assert all(gen.is_ucum_unit(_ours(m)["true_unit"]) for m in registry.metrics)


@documents("README.md", "`semconv/` declares them as naming exceptions")
def test_exceptions_are_exactly_the_eight_megatron_metrics_with_the_reason(registry):
    """The naming exceptions are exactly Megatron-LM's eight metrics, each with its reason."""
    exceptions = {
        m["name"]: _ours(m)["naming_exception"]
        for m in registry.metrics
        if "naming_exception" in _ours(m)
    }
    assert set(exceptions) == set(MEGATRON_METRICS)
    for name, exception in exceptions.items():
        assert " ".join(exception["reason"].split()) == MEGATRON_REASON, name
        assert exception["rules"], name


def test_megatron_metrics_keep_instrument_unit_and_description(registry):
    """Megatron-LM's metrics keep its instrument, exported unit and description verbatim."""
    declared = {m["name"]: (m["instrument"], m["unit"], m["brief"]) for m in registry.metrics}
    for name, expected in MEGATRON_METRICS.items():
        assert declared[name] == expected, name


def test_nonfinite_counter_follows_the_naming_rules(registry):
    """megatron.training.nonfinite_values is a {value} counter keyed by a point attribute."""
    metric = next(m for m in registry.metrics if m["name"] == "megatron.training.nonfinite_values")
    assert (metric["instrument"], metric["unit"]) == ("counter", "{value}")
    assert metric["brief"] == (
        "Non-finite (NaN or infinite) values passed to record_training_metrics and dropped by "
        "the SDK."
    )
    assert [r["ref"] for r in metric["attributes"]] == ["megatron.training.metric"]
    assert "naming_exception" not in _ours(metric)
    assert "megatron.training.metric" in {a["key"] for a in registry.attributes}


def test_rank_identity_attributes_are_resource_attributes(registry):
    """The dl.* keys are declared, typed, and are the identity/description of an entity."""
    types = {a["key"]: a["type"] for a in registry.attributes}
    expected = {
        "dl.rank": "int",
        "dl.local_rank": "int",
        "dl.world_size": "int",
        "dl.node_rank": "int",
        "dl.job.id": "string",
        "dl.run.id": "string",
    }
    assert {k: types.get(k) for k in expected} == expected
    entity_keys = {
        r["ref"] for e in registry.entities for r in e["identity"] + e.get("description", [])
    }
    assert set(expected) <= entity_keys
    assert "megatron.training.metric" not in entity_keys


def test_external_references_resolve_to_opentelemetry_semconv(registry):
    """Referenced OTel attributes (host, service, process, error.type, hw.id, and the thread
    and stack of the hang event) resolve to semconv constants."""
    external = gen.external_attributes(registry)
    assert set(external) == {
        "host.name",
        "service.name",
        "service.instance.id",
        "process.creation.time",
        "error.type",
        "hw.id",
        "thread.id",
        "thread.name",
        "code.stacktrace",
    }
    for key, path in external.items():
        module, _, constant = path.rpartition(".")
        assert getattr(importlib.import_module(module), constant) == key


# --- the rule checker can fail --------------------------------------------------------------


def _ours(entry: dict[str, Any]) -> dict[str, Any]:
    return (entry.get("annotations") or {}).get("otel_training") or {}


_GOOD_METRIC = {
    "name": "example.training.duration",
    "instrument": "histogram",
    "unit": "s",
    "stability": "development",
    "brief": "Duration of an example step.",
    "annotations": {
        "code_generation": {"metric_value_type": "double"},
        "otel_training": {"true_unit": "s"},
    },
}


def _metric(**changes: Any) -> dict[str, Any]:
    metric = copy.deepcopy(_GOOD_METRIC)
    for key, value in changes.items():
        if key in ("naming_exception", "true_unit", "replicated", "heartbeat"):
            metric["annotations"]["otel_training"][key] = value
        elif key == "value_type":
            metric["annotations"]["code_generation"] = {}
        else:
            metric[key] = value
    return metric


def _write_registry(directory: Path, document: dict[str, Any]) -> Path:
    registry_dir = directory / "registry"
    registry_dir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"file_format": "definition/2", **document}, sort_keys=False)
    (registry_dir / "bad.yaml").write_text(text)
    return registry_dir


_BAD_CASES = {
    "name_syntax": [_metric(name="Example.Training.Duration")],
    "brief_period": [_metric(brief="Duration of an example step")],
    "duplicate": [_metric(), _metric()],
    "namespace_collision": [_metric(), _metric(name="example.training.duration.max")],
    "unit_ucum": [_metric(unit="")],
    "unit_in_name": [_metric(name="example.training.duration_ms", unit="ms")],
    "naming_exception": [_metric(unit="", naming_exception={"reason": "", "rules": ["unit_ucum"]})],
    "true_unit": [_metric(true_unit="bananas")],
    "value_type": [_metric(value_type=None)],
    "export_flag": [_metric(replicated="yes")],
    "unresolved_ref": [_metric(attributes=[{"ref": "example.no_such_attribute"}])],
}


def test_rule_checker_accepts_the_control_registry(tmp_path):
    """The well-formed metric that the bad cases start from breaks no rule."""
    registry = gen.load_registry(_write_registry(tmp_path, {"metrics": [_metric()]}))
    assert gen.check_registry(registry, gen.load_schema()) == []


@pytest.mark.parametrize("rule", sorted(_BAD_CASES))
def test_rule_checker_flags_each_broken_rule(tmp_path, rule):
    """A registry that breaks one rule is reported with that rule's id."""
    registry = gen.load_registry(_write_registry(tmp_path, {"metrics": _BAD_CASES[rule]}))
    assert gen.schema_violations(registry, gen.load_schema()) == []
    assert rule in {v.rule for v in gen.rule_violations(registry)}


def test_rule_checker_flags_an_exception_that_declares_rules_not_broken(tmp_path):
    """A naming exception must list exactly the rules the metric breaks, not more."""
    exception = {"reason": "compatibility", "rules": ["unit_in_name", "unit_ucum"]}
    metric = _metric(unit="", naming_exception=exception)
    registry = gen.load_registry(_write_registry(tmp_path, {"metrics": [metric]}))
    violations = gen.rule_violations(registry)
    assert [v.rule for v in violations] == ["naming_exception"]
    assert "unit_in_name" in violations[0].message


def test_schema_check_flags_a_malformed_file(tmp_path):
    """A metric without a brief, or with an unknown instrument, fails schema validation."""
    bad = _metric(instrument="meter")
    del bad["brief"]
    registry = gen.load_registry(_write_registry(tmp_path, {"metrics": [bad]}))
    messages = [v.message for v in gen.schema_violations(registry, gen.load_schema())]
    assert any("'brief' is a required property" in m for m in messages), messages
    assert len(messages) >= 2


def test_schema_check_requires_the_file_format(tmp_path):
    """A registry file without file_format: definition/2 is reported."""
    registry_dir = tmp_path / "registry"
    registry_dir.mkdir()
    (registry_dir / "old.yaml").write_text(yaml.safe_dump({"metrics": [_metric()]}))
    registry = gen.load_registry(registry_dir)
    assert [v.rule for v in gen.schema_violations(registry, gen.load_schema())] == ["file_format"]


@pytest.mark.parametrize(
    "unit", ["1", "s", "ms", "us", "By", "GiBy", "KiBy", "%", "{token}", "{token}/s", "By/s", "s-1"]
)
def test_ucum_checker_accepts_ucum_units(unit):
    """The UCUM subset checker accepts the units OpenTelemetry metrics use."""
    assert gen.is_ucum_unit(unit)


@pytest.mark.parametrize("unit", ["", "GB", "gib", "sec", "seconds", "tokens/s", "{}", "ms ", "x"])
def test_ucum_checker_rejects_non_ucum_units(unit):
    """The UCUM subset checker rejects empty, misspelt and non-UCUM units."""
    assert not gen.is_ucum_unit(unit)


def test_generator_exits_2_and_writes_nothing_on_an_invalid_registry(tmp_path, capsys):
    """An invalid registry makes the generator exit 2, list the violation, and write nothing."""
    registry_dir = _write_registry(tmp_path, {"metrics": [_metric(unit="")]})
    out = tmp_path / "out"
    assert gen.main(["--registry-dir", str(registry_dir), "--output-dir", str(out)]) == 2
    assert "unit_ucum" in capsys.readouterr().err
    assert not out.exists()


# --- the generated code ---------------------------------------------------------------------


def test_generated_modules_are_not_stale(tmp_path):
    """Generating into a temporary directory reproduces the committed modules byte for byte."""
    assert gen.main(["--output-dir", str(tmp_path)]) == 0
    for name in gen.OUTPUTS.values():
        assert (tmp_path / name).read_text() == (GENERATED_DIR / name).read_text(), name
    assert gen.main(["--check"]) == 0


def test_check_exits_1_when_a_generated_module_is_stale(tmp_path, capsys):
    """--check exits 1 and names the file when a generated module differs from the registry."""
    for name in gen.OUTPUTS.values():
        shutil.copy(GENERATED_DIR / name, tmp_path / name)
    with (tmp_path / "metrics.py").open("a") as f:
        f.write("# edited by hand\n")
    assert gen.main(["--check", "--output-dir", str(tmp_path)]) == 1
    assert "metrics.py" in capsys.readouterr().out
    assert gen.main(["--check", "--output-dir", str(tmp_path / "missing")]) == 1


def test_generation_is_deterministic():
    """Two runs of the generator give identical output."""
    assert gen.generate() == gen.generate()


def test_generated_constants_equal_the_registry_names(registry):
    """Each constant holds its registry name, and the tables hold exactly the registry."""
    from otel_training.semconv import attributes, metrics

    metric_names = {m["name"] for m in registry.metrics}
    attribute_keys = {a["key"] for a in registry.attributes}
    for name in metric_names:
        assert getattr(metrics, gen.constant_name(name)) == name
    for key in attribute_keys:
        assert getattr(attributes, gen.constant_name(key)) == key
    assert set(metrics.METRICS) == metric_names
    assert set(attributes.ATTRIBUTES) == attribute_keys
    assert metrics.MEGATRON_TRAINING_LOSS == "megatron.training.loss"
    assert attributes.DL_RANK == "dl.rank"
    assert attributes.DL_WORLD_SIZE == "dl.world_size"
    assert metrics.MEGATRON_TRAINING_METRIC == attributes.MEGATRON_TRAINING_METRIC


def test_generated_events_are_the_registry_events(registry):
    """Each event name is a constant, and EVENTS holds exactly the registry's events with
    their attributes, each of which resolves (defined here or in OpenTelemetry)."""
    from otel_training.semconv import events

    names = {e["name"] for e in registry.events}
    assert names == set(events.EVENTS) == {"otel_training.hang.stalled"}
    for entry in registry.events:
        spec = events.EVENTS[entry["name"]]
        assert getattr(events, gen.constant_name(entry["name"])) == entry["name"]
        assert spec.attributes == tuple(r["ref"] for r in entry["attributes"])
        local = {a["key"] for a in registry.attributes} | set(gen.external_attributes(registry))
        assert set(spec.attributes) <= local


def test_metric_table_matches_the_registry(registry):
    """METRICS carries each metric's instrument, unit, description and exception from the YAML."""
    from otel_training.semconv.metrics import METRICS

    for metric in registry.metrics:
        spec = METRICS[metric["name"]]
        assert (spec.instrument, spec.unit, spec.description) == (
            metric["instrument"],
            metric["unit"],
            " ".join(metric["brief"].split()),
        )
        assert spec.true_unit == _ours(metric)["true_unit"]
        has_exception = "naming_exception" in _ours(metric)
        assert (spec.naming_exception == MEGATRON_REASON) is has_exception
    for name, (instrument, unit, description) in MEGATRON_METRICS.items():
        assert (METRICS[name].instrument, METRICS[name].unit) == (instrument, unit)
        assert METRICS[name].description == description


def test_replicated_and_heartbeat_flags_are_the_registry_annotations(registry):
    """METRICS says replicated / heartbeat exactly where the YAML annotates it; the sets are the
    values Megatron-LM reduces over data and tensor parallelism (loss averaged over the
    data-parallel group, the global grad norm, the scheduler's learning rate, a skip decided on
    every rank, norms of parameters every peer holds) and the hang signals of docs/health.md."""
    from otel_training.semconv.metrics import METRICS

    for metric in registry.metrics:
        spec = METRICS[metric["name"]]
        assert spec.replicated is (_ours(metric).get("replicated") is True), spec.name
        assert spec.heartbeat is (_ours(metric).get("heartbeat") is True), spec.name
    assert {n for n, s in METRICS.items() if s.replicated} == {
        "megatron.training.loss",
        "megatron.training.grad_norm",
        "megatron.training.learning_rate",
        "megatron.training.skipped_iters",
        "megatron.training.tensor.grad_norm",
        "megatron.training.tensor.param_norm",
        "megatron.training.tensor.grad_nonfinite",
        "megatron.training.tensor.update_ratio",
    }
    assert {n for n, s in METRICS.items() if s.heartbeat} == {
        "dl.training.progress.timestamp",
        "dl.training.progress.age",
        "dl.training.phase.elapsed",
    }


def test_every_public_name_is_importable():
    """Every name in otel_training.semconv.__all__ is importable from the package."""
    import otel_training.semconv as semconv

    assert len(semconv.__all__) == len(set(semconv.__all__))
    for name in semconv.__all__:
        assert getattr(semconv, name) is not None, name


def test_generated_files_carry_the_generated_header():
    """Each generated module starts with the do-not-edit header."""
    for name in gen.OUTPUTS.values():
        first = (GENERATED_DIR / name).read_text().splitlines()[0]
        assert first == "# GENERATED by scripts/generate_semconv.py from semconv/ — do not edit."


def test_factories_create_instruments_with_registry_unit_and_description(in_memory_meter):
    """create_* make instruments whose exported name, unit and description come from METRICS."""
    import otel_training.semconv as semconv

    for name, spec in semconv.METRICS.items():
        create = getattr(semconv, "create_" + gen.constant_name(name).lower())
        instrument = create(in_memory_meter.meter)
        if spec.instrument in ("counter", "updowncounter"):
            instrument.add(1)
        elif spec.instrument == "histogram":
            instrument.record(1.0)
        else:
            instrument.set(1.0)
    metrics = metrics_of(in_memory_meter.reader.get_metrics_data())
    exported = {m.name: (m.unit, m.description) for m in metrics}
    assert exported == {n: (s.unit, s.description) for n, s in semconv.METRICS.items()}


def test_generated_modules_pass_ruff():
    """The generated modules pass `ruff check` and `ruff format --check` with the repo config."""
    ruff = program_or_unavailable(str(ROOT / ".venv/bin/ruff"), "ruff", install="pip install ruff")
    files = [str(GENERATED_DIR / name) for name in gen.OUTPUTS.values()]
    for command in ([ruff, "check", *files], [ruff, "format", "--check", *files]):
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def test_json_of_generated_tables_round_trips():
    """The spec tables are frozen and contain only plain, JSON-serialisable values."""
    from dataclasses import FrozenInstanceError, asdict

    from otel_training.semconv import ATTRIBUTES, METRICS

    for table in (METRICS, ATTRIBUTES):
        plain = {n: asdict(s) for n, s in table.items()}
        assert json.loads(json.dumps(plain)) == json.loads(json.dumps(plain, sort_keys=True))
        back = json.loads(json.dumps(plain))  # JSON has no tuples: sequences come back as lists
        rebuilt = {
            n: type(s)(**{k: tuple(v) if isinstance(v, list) else v for k, v in back[n].items()})
            for n, s in table.items()
        }
        assert rebuilt == dict(table)
    with pytest.raises(TypeError):
        METRICS["x"] = METRICS["megatron.training.loss"]  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        METRICS["megatron.training.loss"].unit = "1"  # type: ignore[misc]


# --- spans ----------------------------------------------------------------------------------

# Megatron-LM's span names by group, read from its code (megatron/training/training.py,
# megatron/core/pipeline_parallel/p2p_communication.py, .../distributed_data_parallel.py,
# .../fine_grained_activation_offload.py), as issue 11 lists them.
MEGATRON_SPANS = {
    "job": {"megatron.startup", "megatron.train"},
    "model_init": {"megatron.startup.model_init"},
    "data_loading": {"megatron.startup.dataloader"},
    "step": {"megatron.train.iteration"},
    "forward_backward": {"megatron.train.iteration.forward_backward"},
    "optimizer": {"megatron.train.iteration.optimizer"},
    "checkpoint": {
        "megatron.checkpoint.save",
        "megatron.checkpoint.save.state_dict",
        "megatron.checkpoint.save.io_write",
        "megatron.checkpoint.save.finalize",
    },
    "load_checkpoint": {"megatron.checkpoint.load", "megatron.checkpoint.load.io_read"},
    "evaluate": {"megatron.evaluate", "megatron.evaluate.step"},
    "microbatch": {"megatron.microbatch.forward", "megatron.microbatch.backward"},
    "layer": {"megatron.layer.forward", "megatron.layer.self_attention", "megatron.layer.mlp"},
    "communication": {
        "megatron.p2p.send_forward",
        "megatron.p2p.recv_forward",
        "megatron.p2p.send_backward",
        "megatron.p2p.recv_backward",
        "megatron.grad_sync.start",
        "megatron.grad_sync.finish",
    },
    "activation_offload": {"megatron.activation.offload", "megatron.activation.reload"},
    "first_iteration": {"megatron.train.first_iteration"},
}
# Ours, in Megatron-LM's scheme, where it has no name.
OUR_SPANS = {
    "data_loading": {"megatron.train.iteration.data_loading"},
    "job": {"megatron.train.segment"},
}
# Megatron-LM's presets (megatron/core/telemetry/span_groups.py: MegatronSpanGroup._PRESETS),
# plus our custom group, on wherever anything is.
MEGATRON_PRESETS = {
    "default": {"job", "checkpoint", "evaluate", "first_iteration", "inference"},
    "per_step": {
        "job", "checkpoint", "evaluate", "model_init", "load_checkpoint", "step",
        "forward_backward", "optimizer", "communication", "data_loading", "first_iteration",
        "inference",
    },
    "all": {
        "job", "checkpoint", "evaluate", "model_init", "load_checkpoint", "step",
        "forward_backward", "optimizer", "microbatch", "layer", "communication",
        "activation_offload", "data_loading", "first_iteration", "trace_region", "inference",
    },
}  # fmt: skip
MEGATRON_PRESETS["profiling"] = MEGATRON_PRESETS["all"]
# Megatron-LM's span attributes (issue 11's list), all declared.
MEGATRON_SPAN_ATTRIBUTES = {
    "megatron.iteration",
    "megatron.skipped",
    "megatron.update_successful",
    "megatron.eval_iteration",
    "megatron.layer_number",
    "num_microbatches",
    "is_goodput_span",
}

# The Resource attributes Megatron-LM sets (megatron/training/global_vars.py:
# build_telemetry_resource_attrs) under the dl. names shared with NeMo Lens.
MEGATRON_RESOURCE_ATTRIBUTES = {
    "dl.local_rank",
    "dl.tensor_parallel.size",
    "dl.pipeline_parallel.size",
    "dl.data_parallel.size",
}


def test_resource_attributes_are_megatron_lms_and_in_the_resource_group(registry):
    """Megatron-LM's dl. Resource attributes are declared, in the training resource group."""
    keys = {a["key"] for a in registry.attributes}
    assert MEGATRON_RESOURCE_ATTRIBUTES <= keys
    (group,) = [g for g in registry.attribute_groups if g["id"] == "dl.training.resource"]
    assert MEGATRON_RESOURCE_ATTRIBUTES <= {a["ref"] for a in group["attributes"]}


def test_spans_are_megatron_lms_with_their_groups(registry):
    """The registry's spans are Megatron-LM's (and ours in its scheme), each in Megatron-LM's
    group; its presets are Megatron-LM's."""
    from otel_training.config import SPAN_GROUP_PRESETS

    declared: dict[str, set[str]] = {}
    for span in registry.spans:
        declared.setdefault(_ours(span)["group"], set()).add(span["type"])
    expected = {g: MEGATRON_SPANS.get(g, set()) | OUR_SPANS.get(g, set()) for g in declared}
    assert declared == expected
    assert set(MEGATRON_SPANS) <= set(declared)
    assert all(s["kind"] == "internal" and s["brief"].endswith(".") for s in registry.spans)
    for preset, groups in MEGATRON_PRESETS.items():
        assert SPAN_GROUP_PRESETS[preset] == groups | {"custom"}, preset
    assert SPAN_GROUP_PRESETS["none"] == frozenset()
    keys = {a["key"] for a in registry.attributes}
    assert MEGATRON_SPAN_ATTRIBUTES <= keys


def test_iteration_number_is_a_span_attribute_and_never_a_metric_attribute(registry):
    """megatron.iteration is required on the iteration span and on no metric."""
    iteration = next(s for s in registry.spans if s["type"] == "megatron.train.iteration")
    assert {"ref": "megatron.iteration", "requirement_level": "required"} in iteration["attributes"]
    metric_refs = {r.get("ref") for m in registry.metrics for r in m.get("attributes", [])}
    assert "megatron.iteration" not in metric_refs


def test_checkpoint_spans_carry_type_strategy_path_and_size(registry):
    """Checkpoint save and load spans reference type, strategy, path and size attributes."""
    wanted = {
        "megatron.checkpoint.type",
        "megatron.checkpoint.strategy",
        "megatron.checkpoint.path",
        "megatron.checkpoint.size",
    }
    for name in ("megatron.checkpoint.save", "megatron.checkpoint.load"):
        span = next(s for s in registry.spans if s["type"] == name)
        assert wanted <= {r["ref"] for r in span["attributes"]}, name
    types = {a["key"]: a["type"] for a in registry.attributes}
    assert [m["value"] for m in types["megatron.checkpoint.type"]["members"]] == [
        "global",
        "local",
    ]
    assert [m["value"] for m in types["megatron.checkpoint.strategy"]["members"]] == [
        "sync",
        "async",
    ]
    assert types["megatron.checkpoint.size"] == "int"


def test_generated_span_table_matches_the_registry(registry):
    """Span constants hold their names; SPANS, SPAN_GROUP_LEVELS and the presets hold what
    the registry and span_groups.yaml say."""
    from otel_training.semconv import spans

    groups = yaml.safe_load((ROOT / "semconv" / "span_groups.yaml").read_text())
    for span in registry.spans:
        assert getattr(spans, gen.constant_name(span["type"])) == span["type"]
        group = _ours(span)["group"]
        assert spans.SPANS[span["type"]].group == group
        assert spans.SPANS[span["type"]].level == groups["groups"][group]["level"]
    assert dict(spans.SPAN_GROUP_LEVELS) == {g: v["level"] for g, v in groups["groups"].items()}
    assert spans.SPAN_LEVELS == ("default", "per_step", "all")
    assert dict(spans.SPAN_PRESET_ALIASES) == {"profiling": "all"}
    assert spans.NVTX_ONLY_CANDIDATE_GROUPS == {
        "microbatch",
        "layer",
        "communication",
        "activation_offload",
    }
    save = spans.SPANS[spans.MEGATRON_CHECKPOINT_SAVE]
    assert save.required_attributes == ("megatron.checkpoint.type", "megatron.checkpoint.strategy")
    assert spans.SPANS[spans.MEGATRON_TRAIN_ITERATION].required_attributes == (
        "megatron.iteration",
    )


_GOOD_SPAN = {
    "type": "example.train.step",
    "kind": "internal",
    "name": {"note": "The literal example.train.step."},
    "stability": "development",
    "brief": "An example step.",
    "annotations": {"otel_training": {"group": "step"}},
}


def _span(**changes: Any) -> dict[str, Any]:
    span = copy.deepcopy(_GOOD_SPAN)
    for key, value in changes.items():
        if key == "group":
            span["annotations"]["otel_training"][key] = value
        else:
            span[key] = value
    return span


_BAD_SPAN_CASES = {
    "span_group": [_span(group="not_a_group")],
    "name_syntax": [_span(type="Example.Step")],
    "brief_period": [_span(brief="An example step")],
    "duplicate": [_span(), _span()],
}


def test_span_rule_checker_accepts_the_control_span(tmp_path):
    """The well-formed span that the bad span cases start from breaks no rule."""
    registry = gen.load_registry(_write_registry(tmp_path, {"spans": [_span()]}))
    assert gen.check_registry(registry, gen.load_schema()) == []


@pytest.mark.parametrize("rule", sorted(_BAD_SPAN_CASES))
def test_span_rule_checker_flags_each_broken_rule(tmp_path, rule):
    """A registry with a span that breaks one rule is reported with that rule's id."""
    registry = gen.load_registry(_write_registry(tmp_path, {"spans": _BAD_SPAN_CASES[rule]}))
    assert gen.schema_violations(registry, gen.load_schema()) == []
    assert rule in {v.rule for v in gen.rule_violations(registry)}


def test_span_groups_file_rejects_a_level_that_is_no_preset(tmp_path):
    """span_groups.yaml with a group at an unknown level, or a brief without a period, fails."""
    import semconv_spans

    bad = tmp_path / "groups.yaml"
    bad.write_text("levels: [default, all]\ngroups:\n  job: {level: sometimes, brief: A.}\n")
    with pytest.raises(ValueError, match="needs a lower-case name and a level"):
        semconv_spans.load_span_groups(bad)
    bad.write_text("levels: [default]\ngroups:\n  job: {level: default, brief: no period}\n")
    with pytest.raises(ValueError, match="must end with a period"):
        semconv_spans.load_span_groups(bad)


def test_rule_checker_flags_names_that_share_a_python_constant(tmp_path):
    """A span and a metric whose names map to the same constant are reported."""
    document = {
        "metrics": [_metric(name="example.train_step")],
        "spans": [_span(type="example.train.step"), _span(type="example.train_step")],
    }
    registry = gen.load_registry(_write_registry(tmp_path, document))
    assert "constant_collision" in {v.rule for v in gen.rule_violations(registry)}
