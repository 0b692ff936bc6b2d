"""The tensor observer: sites and canonical names, scoped hooks, schedules from the environment
and from Python, the commit point, and no scalar reads on the training thread (case A6)."""

from __future__ import annotations

import logging

import pytest
from support import import_or_unavailable

torch = import_or_unavailable("torch")

from torch import nn  # noqa: E402

from otel_training.tensor import (  # noqa: E402
    DEFAULT_SCHEDULE,
    FamilyValues,
    Final,
    SiteKind,
    TensorMetric,
    TensorMetricGauges,
    TensorObserver,
    canonical_name,
    default_layer_of,
    layer_attributes,
    parse_schedule,
)

FAMILY = "megatron.training.tensor.activation_rms"
GRAD_FAMILY = "megatron.training.tensor.grad_norm"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(4)
        self.attn = nn.Linear(4, 4)
        self.mlp = nn.Linear(4, 4)
        self.gate = nn.Linear(4, 3, bias=False)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        h = self.ln(x)
        self.gate(h)
        return x + self.drop(self.mlp(self.attn(h)))


class Net(nn.Module):
    def __init__(self, n: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(n)])
        self.out = nn.Linear(4, 5)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class Recording(TensorMetric):
    """Counts forward observations; publishes their number."""

    def __init__(self, name: str = "recording", kinds=frozenset({SiteKind.ACTIVATION})) -> None:
        self.name, self.kinds, self.families = name, kinds, (FAMILY,)
        self.observed: list[str] = []

    def prepare_forward(self, site, tensor):
        self.observed.append(site.name)
        return torch.linalg.vector_norm(tensor)

    def start(self, rows, axes):
        count = float(len(rows.sites))
        return Final(
            rows.values,
            lambda host: [FamilyValues(FAMILY, (layer_attributes("global"),), [count])],
        )


@pytest.fixture
def meter(in_memory_meter):
    return in_memory_meter.meter


@pytest.mark.parametrize(
    ("name", "canonical", "layer"),
    [
        (
            "module.module.decoder.layers.3.mlp.linear_fc1.weight",
            "decoder.layers.3.mlp.linear_fc1.weight",
            "decoder.layers.3",
        ),
        (
            "_orig_mod.model.layers.11.self_attn.q_proj.weight",
            "model.layers.11.self_attn.q_proj.weight",
            "decoder.layers.11",
        ),
        (
            "transformer.h.0._checkpoint_wrapped_module.attn.c_attn.bias",
            "transformer.h.0.attn.c_attn.bias",
            "decoder.layers.0",
        ),
        ("_fsdp_wrapped_module.blocks.2.mlp", "blocks.2.mlp", "decoder.layers.2"),
        (
            "encoder.layer.5.output.dense.weight",
            "encoder.layer.5.output.dense.weight",
            "encoder.layers.5",
        ),
        ("embedding.word_embeddings.weight", "embedding.word_embeddings.weight", None),
        ("module", "", None),
    ],
)
def test_canonical_names_drop_wrappers_and_layers_are_numbered(name, canonical, layer):
    """Wrapper components are dropped; the first layers.N/blocks.N/h.N/layer.N names the layer."""
    assert canonical_name(name) == canonical
    assert default_layer_of(canonical) == layer


def test_layer_offset_numbers_the_layers_of_a_pipeline_stage():
    """layer_offset shifts layer numbers (the first layer of this stage)."""
    assert default_layer_of("decoder.layers.0.mlp", offset=8) == "decoder.layers.8"


def test_sites_are_found_per_kind_and_norms_are_not_activations(meter):
    """Residual = layer outputs; activations = non-norm children; router = Linear gate."""
    observer = TensorObserver(
        Net(), "activation_rms:1,residual_rms:1,router:1,logits_norm:1,grad_norm:1", meter=meter
    )
    by_kind: dict[str, list[str]] = {}
    for site in observer.sites:
        by_kind.setdefault(site.kind.value, []).append(site.name)
    assert by_kind["residual"] == ["blocks.0", "blocks.1"]
    assert sorted(by_kind["activation"]) == [
        f"blocks.{i}.{name}" for i in (0, 1) for name in ("attn", "gate", "mlp")
    ]
    assert by_kind["router"] == ["blocks.0.gate", "blocks.1.gate"]
    assert by_kind["logits"] == ["output"]
    assert len(by_kind["grad"]) == len(list(observer._models[0].parameters()))


def test_no_hook_is_installed_for_commit_time_metrics_only(meter):
    """A schedule of parameter/gradient metrics adds no forward hook."""
    model = Net()
    TensorObserver(model, "grad_norm:1,param_norm:1,update_ratio:5", meter=meter)
    assert not any(m._forward_hooks for m in model.modules())


def test_hooks_observe_only_in_due_steps_and_only_between_begin_and_commit(meter):
    """A metric every 3 steps sees the forward passes of steps 3 and 6 only; eval passes none."""
    model = Net()
    metric = Recording()
    observer = TensorObserver(model, {metric: 3}, meter=meter)
    x = torch.randn(2, 4)
    for step in range(1, 7):
        observer.begin_step(step)
        model(x)
        model(x)  # a second micro-batch
        observer.commit()
        model(x)  # evaluation, outside the step
    assert len(metric.observed) == 2 * 2 * 6  # 2 due steps x 2 micro-batches x 6 sites
    assert observer.executor.stats.due_steps == 2


def test_two_observers_are_scoped_independently(meter):
    """A step that is due for one observer's metric does not wake another observer's hooks."""
    model = Net()
    every, never = Recording("every"), Recording("never")
    first = TensorObserver(model, {every: 1}, meter=meter)
    second = TensorObserver(model, {never: 1000}, meter=meter)
    first.begin_step(1)
    second.begin_step(1)
    model(torch.randn(1, 4))
    second.commit()
    first.commit()
    assert every.observed and not never.observed


def test_commit_without_begin_step_advances_the_step(meter):
    """commit() alone runs the commit-time metrics that are due at the next step."""
    observer = TensorObserver(Net(), "param_norm:2", meter=meter)
    observer.commit()
    observer.commit()
    assert observer.step == 2 and observer.executor.stats.due_steps == 1


def test_observe_feeds_tensors_that_no_module_outputs(meter):
    """observe() hands a tensor to the due forward metrics, as a hook would."""
    metric = Recording(kinds=frozenset({SiteKind.ROUTER}))
    observer = TensorObserver(Net(), {metric: 1}, meter=meter)
    observer.begin_step()
    observer.observe("module.decoder.layers.2.mlp.router", "router", torch.randn(6, 4), top_k=2)
    observer.commit()
    site = next(s for s in observer.sites if s.name == "decoder.layers.2.mlp.router")
    assert (site.layer, site.top_k) == ("decoder.layers.2", 2)
    assert metric.observed == ["decoder.layers.2.mlp.router"]
    observer.observe("decoder.layers.2.mlp.router", "router", torch.randn(6, 4))  # no step
    assert len(metric.observed) == 1


def test_close_removes_the_hooks_and_the_gauge_source(meter):
    """After close() the model has no hooks and the gauges no longer follow the observer (its
    last values are retired, kept until the next source)."""
    model = Net()
    observer = TensorObserver(model, "activation_rms:1", meter=meter)
    gauges = TensorMetricGauges.for_meter(meter)
    sources = len(gauges._sources)
    observer.close()
    assert not any(m._forward_hooks for m in model.modules())
    assert len(gauges._sources) == sources - 1


# -- schedules ------------------------------------------------------------------------------


def test_schedule_comes_from_the_environment_when_not_given(monkeypatch, meter):
    """OTEL_PYTHON_TRAINING_TENSOR_METRICS sets the schedule; bad entries are skipped."""
    monkeypatch.setenv(
        "OTEL_PYTHON_TRAINING_TENSOR_METRICS", "grad_norm:5, nope:3, router:x, residual_rms:50"
    )
    observer = TensorObserver(Net(), meter=meter)
    assert observer.schedule == (("grad_norm", 5), ("residual_rms", 50))


def test_each_bad_environment_entry_logs_one_warning_naming_it(monkeypatch, caplog):
    """The config policy: one warning per unusable entry, naming it."""
    from otel_training import config

    env = {"OTEL_PYTHON_TRAINING_TENSOR_METRICS": "grad_norm:0,bogus:1,grad_norm:5,param_norm:2"}
    with caplog.at_level(logging.WARNING, logger="otel_training.config"):
        assert config.tensor_metric_schedule(env) == (("grad_norm", 5), ("param_norm", 2))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "'grad_norm:0'" in messages[0] and "'bogus:1'" in messages[1]
    assert config.load(env).tensor_metrics == (("grad_norm", 5), ("param_norm", 2))


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("none", ()), ("OFF", ()), ("bogus:1", None), ("router:10", (("router", 10),))],
)
def test_environment_values_none_unset_and_unusable(value, expected):
    """Unset or unusable means the observer's default; none means no tensor metric."""
    from otel_training import config

    env = {} if value is None else {"OTEL_PYTHON_TRAINING_TENSOR_METRICS": value}
    assert config.tensor_metric_schedule(env) == expected


def test_default_schedule_when_nothing_is_configured(meter):
    """Without a schedule in code or in the environment the default applies."""
    assert TensorObserver(Net(), meter=meter).schedule == DEFAULT_SCHEDULE


def test_python_schedules_take_strings_mappings_and_custom_metrics(meter):
    """A string, a mapping and (metric, interval) pairs all work; a custom metric keeps its name."""
    assert parse_schedule(" grad_norm:1 , router:20 ") == (("grad_norm", 1), ("router", 20))
    assert parse_schedule("none") == ()
    for bad in ("grad_norm:²", "grad_norm:" + "1" * 5_000):  # never int()'s own error
        with pytest.raises(ValueError, match="is not NAME:INTERVAL"):
            parse_schedule(bad)
    custom = Recording()
    observer = TensorObserver(Net(), [("param_norm", 4), (custom, 2)], meter=meter)
    assert observer.schedule == (("param_norm", 4), ("recording", 2))
    assert observer.metrics[1] is custom


@pytest.mark.parametrize(
    "schedule",
    [
        "grad_norm",
        "grad_norm:0",
        "unknown:3",
        {"grad_norm": 1.5},
        [("grad_norm", 1), ("grad_norm", 2)],
    ],
)
def test_malformed_schedules_in_code_raise(schedule, meter):
    """The constructor raises ValueError for a schedule it cannot use."""
    with pytest.raises(ValueError):
        TensorObserver(Net(), schedule, meter=meter)


def test_a_metric_reading_commit_time_and_forward_sites_is_refused(meter):
    """A metric must read either parameters/gradients or forward tensors."""
    mixed = Recording(kinds=frozenset({SiteKind.GRAD, SiteKind.ACTIVATION}))
    with pytest.raises(ValueError, match="both"):
        TensorObserver(Net(), {mixed: 1}, meter=meter)


# -- case A6: no scalar reads on the training thread ------------------------------------------


def test_the_training_thread_reads_no_scalar_and_copies_to_host_once_per_due_step(
    monkeypatch, meter
):
    """begin_step, forward hooks and commit make no .item()/float()/bool(); one host copy."""
    model = Net()
    observer = TensorObserver(
        model,
        "grad_norm:1,param_norm:1,grad_nonfinite:1,activation_rms:1,activation_max_abs:1,"
        "residual_rms:1,logits_norm:1,router:1,update_ratio:1",
        meter=meter,
    )
    reads: list[str] = []
    for method in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy"):
        original = getattr(torch.Tensor, method)

        def counting(self, *args, _name=method, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counting)
    for step in (1, 2, 3):
        observer.begin_step(step)
        model(torch.randn(3, 4)).square().mean().backward()
        observer.commit()
    monkeypatch.undo()
    assert reads == ["numpy"] * 3  # the single host buffer of each due step, nothing else
    assert observer.executor.stats.host_copies == 3


def test_gradients_kept_in_main_grad_are_read(meter):
    """A parameter whose gradient lives in .main_grad (Megatron-LM's DDP) is read from there."""
    model = Net(n=1)
    for param in model.parameters():
        param.main_grad = torch.full_like(param, 2.0)
    observer = TensorObserver(model, "grad_norm:1", meter=meter)
    observer.commit()
    values = {
        a["megatron.training.layer"]: v
        for a, v in observer.executor.published.observe("megatron.training.tensor.grad_norm")
    }
    total = 2.0 * sum(p.numel() for p in model.parameters()) ** 0.5
    assert values["global"] == pytest.approx(total)


# -- modules that change after the observer was built ---------------------------------------


class Wrapper(nn.Module):
    """An adapter put in a layer's place (the layer lives on as ``.inner``)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.inner(x) * self.scale


def _replace(model):
    model.blocks[1] = Block()


def _append(model):
    model.blocks.append(Block())


def _insert(model):
    model.blocks.insert(0, Block())


def _delete(model):
    del model.blocks[0]


def _wrap(model):
    model.blocks[0] = Wrapper(model.blocks[0])


def _new_parameter(model):
    model.blocks[1].mlp.weight = nn.Parameter(torch.randn(4, 4))


def _layer_grad_norms(model) -> dict[str, float]:
    squares: dict[str, float] = {}
    for name, param in model.named_parameters():
        layer = default_layer_of(canonical_name(name))
        if layer is not None and param.grad is not None:
            squares[layer] = squares.get(layer, 0.0) + float(param.grad.double().square().sum())
    return {layer: value**0.5 for layer, value in squares.items()}


@pytest.mark.parametrize(
    "change", [_replace, _append, _insert, _delete, _wrap, _new_parameter], ids=lambda f: f.__name__
)
def test_a_model_changed_after_construction_is_followed(change, meter, caplog):
    """After a layer is replaced, added, inserted, removed or wrapped, or a parameter replaced,
    per-layer gradient norms and activation statistics cover exactly the layers the model has
    now (no stale 0.0), and the global norm equals torch's clip_grad_norm_ total."""
    torch.manual_seed(0)
    model = Net(n=3)
    observer = TensorObserver(model, "grad_norm:1,activation_rms:1", meter=meter)
    store = observer.executor.published
    x = torch.randn(5, 4)

    def step() -> None:
        observer.begin_step()
        model(x).square().mean().backward()
        observer.commit()

    step()
    model.zero_grad(set_to_none=True)
    change(model)
    with caplog.at_level(logging.INFO, logger="otel_training.tensor.observer"):
        step()
    grads = {a["megatron.training.layer"]: v for a, v in store.observe(GRAD_FAMILY)}
    expected = _layer_grad_norms(model)
    total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"), 2.0))
    assert grads.pop("global") == pytest.approx(total, rel=1e-5)
    assert grads.keys() == expected.keys()
    for layer, value in expected.items():
        assert value > 0 and grads[layer] == pytest.approx(value, rel=1e-5), layer
    layers = {a["megatron.training.layer"] for a, _ in store.observe(FAMILY)} - {"global"}
    assert layers == set(expected)
    assert sum("the model changed" in r.getMessage() for r in caplog.records) == 1


def test_refresh_finds_changes_made_behind_pytorchs_back(meter):
    """A module written straight into _modules is followed after refresh()."""
    torch.manual_seed(0)
    model = Net(n=2)
    observer = TensorObserver(model, "grad_norm:1", meter=meter)
    model.blocks._modules["1"] = Block()  # no registration hook, no size change
    observer.refresh()
    observer.begin_step()
    model(torch.randn(3, 4)).sum().backward()
    observer.commit()
    values = {
        a["megatron.training.layer"]: v for a, v in observer.executor.published.observe(GRAD_FAMILY)
    }
    total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"), 2.0))
    assert values["global"] == pytest.approx(total, rel=1e-5)


def test_an_unchanged_model_is_not_searched_again(meter, monkeypatch):
    """Building other modules elsewhere marks the watch, but the sites are kept as they are."""
    model = Net(n=2)
    observer = TensorObserver(model, "grad_norm:1,activation_rms:1", meter=meter)
    handles = list(observer._handles)
    nn.Linear(3, 3)  # any module anywhere goes through the registration hooks
    observer.begin_step()
    model(torch.randn(2, 4)).sum().backward()
    observer.commit()
    assert all(a is b for a, b in zip(observer._handles, handles, strict=True))
    assert not observer._watch.changed()


def test_a_disabled_sdk_makes_the_observer_inert():
    """With a no-op meter (OTEL_SDK_DISABLED) no hook is installed and nothing is computed."""
    from opentelemetry.metrics import NoOpMeter

    model = Net()
    observer = TensorObserver(model, "grad_norm:1,activation_rms:1", meter=NoOpMeter("off"))
    assert not any(m._forward_hooks for m in model.modules())
    assert observer.begin_step() is False
    model(torch.randn(2, 4)).sum().backward()
    observer.commit()
    assert observer.executor.stats.due_steps == 0 and observer.step == 1


# -- the second time (issue 15 item 11) ---------------------------------------------------------

PARAM_FAMILY = "megatron.training.tensor.param_norm"


def _filled(value: float) -> Net:
    model = Net()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)
    return model


def _global_param_norm(model: nn.Module) -> float:
    return float(
        torch.linalg.vector_norm(
            torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])
        )
    )


def _one_step(observer: TensorObserver, model: nn.Module) -> None:
    observer.begin_step(1)
    model(torch.ones(2, 4)).sum().backward()
    observer.commit()
    observer.flush()


def _process_wide_registrations() -> tuple[int, int, int]:
    """What an observer registers beyond its model: module registration hooks (both kinds) and
    flush hooks of the pipeline."""
    from torch.nn.modules import module as registry

    from otel_training import configuration as setup

    return (
        len(registry._global_module_registration_hooks),
        len(registry._global_parameter_registration_hooks),
        len(setup._flush_hooks),
    )


@pytest.mark.parametrize(
    "meters",
    [("proxy", "proxy"), ("pipeline", "pipeline"), ("proxy", "pipeline"), ("pipeline", "proxy")],
)
def test_a_second_observer_records_exactly_as_the_first(meters):
    """Observer, close, new observer on another model in one process, through
    otel_training.get_meter() (a new proxy each call) or the pipeline's own meter in any mix:
    each exports its own model's norms, and the first leaves no hook, flush hook or value."""
    import otel_training
    from otel_training import testing

    telemetry = testing.configure_in_memory()
    meter_of = {"proxy": otel_training.get_meter, "pipeline": lambda: telemetry.meter}
    before = _process_wide_registrations()
    found = []
    for kind, fill in zip(meters, (0.5, 2.0)):
        model = _filled(fill)
        observer = TensorObserver(model, "param_norm:1", meter=meter_of[kind]())
        _one_step(observer, model)
        found.append({p.attributes["megatron.training.layer"]: p.value
                      for _, p in telemetry.points(PARAM_FAMILY)})  # fmt: skip
        observer.close()
        assert not any(m._forward_hooks for m in model.modules())
        assert _process_wide_registrations() == before
        expected = _global_param_norm(model)
        assert found[-1]["global"] == pytest.approx(expected, rel=1e-6), kind
    assert found[0]["global"] != pytest.approx(found[1]["global"])
    assert set(found[0]) == set(found[1])  # the same series, the second's values only


def test_a_closed_observer_keeps_its_last_values_until_the_next_one_starts():
    """After close() the final collection still has the last values; the next observer on the
    meter drops them, and until its first step exports nothing stale."""
    from otel_training import testing

    telemetry = testing.configure_in_memory()
    model = _filled(0.5)
    first = TensorObserver(model, "param_norm:1", meter=telemetry.meter)
    _one_step(first, model)
    first.close()
    (value,) = [p.value for _, p in telemetry.points(PARAM_FAMILY)
                if p.attributes["megatron.training.layer"] == "global"]  # fmt: skip
    assert value == pytest.approx(_global_param_norm(model), rel=1e-6)
    second = TensorObserver(_filled(2.0), "param_norm:1", meter=telemetry.meter)
    assert telemetry.points(PARAM_FAMILY) == []
    second.close()


def test_observers_through_the_proxy_follow_a_new_configure():
    """An observer built on otel_training.get_meter() before a second configure() exports into
    the new pipeline, once, and no longer into the first."""
    import otel_training
    from otel_training import testing

    first = testing.configure_in_memory()
    model = _filled(0.5)
    observer = TensorObserver(model, "param_norm:1", meter=otel_training.get_meter())
    _one_step(observer, model)
    assert len(first.points(PARAM_FAMILY)) > 0
    second = testing.configure_in_memory()
    layers = [p.attributes["megatron.training.layer"] for _, p in second.points(PARAM_FAMILY)]
    assert sorted(layers) == sorted(set(layers)) and "global" in layers
    observer.close()
