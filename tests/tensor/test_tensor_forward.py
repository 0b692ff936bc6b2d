"""Forward observation on real training stacks: under torch.compile (fullgraph included, counted
graph breaks and compiled graphs) and with activation checkpointing (reentrant and not): the
statistics equal those of the plain eager model, or a warning says why they are missing."""

from __future__ import annotations

import logging
import math

import pytest
from support import import_or_unavailable, new_in_memory_meter

torch = import_or_unavailable("torch")

from torch import nn  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from otel_training.tensor import (  # noqa: E402
    FamilyValues,
    Final,
    SiteKind,
    TensorMetric,
    TensorObserver,
    layer_attributes,
)

pytestmark = pytest.mark.slow  # torch.compile

P = "megatron.training.tensor."
FORWARD = "activation_rms:2,activation_max_abs:3,residual_rms:2,logits_norm:2,router:2"


class Block(nn.Module):
    """A pre-norm block with a dense softly-routed MLP (no data-dependent shapes, so that
    torch.compile with fullgraph=True can trace it) and optional activation checkpointing."""

    def __init__(self, width: int = 8, experts: int = 3) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.Linear(width, width)
        self.router = nn.Linear(width, experts, bias=False)
        self.mlp = nn.Linear(width, width)
        self.top_k = 2
        self.checkpointing: bool | None = None  # None: off; else use_reentrant

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn(self.norm(x))
        gate = self.router(h).softmax(-1).max(-1, keepdim=True).values
        return x + gate * torch.tanh(self.mlp(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointing is None:
            return self._forward(x)
        return checkpoint(self._forward, x, use_reentrant=self.checkpointing)


class Net(nn.Module):
    def __init__(self, layers: int = 2, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _meter():
    return new_in_memory_meter("forward").meter


def _inputs(micro_batches: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(6, 4, generator=generator) for _ in range(micro_batches)]


def _train(model, forward, observer, steps: int = 6) -> dict[int, dict]:
    """Runs ``steps`` optimizer steps with 1 to 3 micro-batches each; returns, per step, every
    published family as {attributes: value}."""
    published = {}
    for step in range(1, steps + 1):
        observer.begin_step(step)
        for x in _inputs(step % 3 + 1):
            forward(x).square().mean().backward()
        observer.commit()
        store = observer.executor.published
        published[step] = {
            family: {tuple(a.values()): v for a, v in store.observe(family)}
            for family in store.families
            if store.step(family) == step
        }
        model.zero_grad(set_to_none=True)
    return published


def _run(schedule: str, *, compile_backend: str | None = None, checkpointing=None, seed=0):
    torch.manual_seed(seed)
    model = Net()
    for layer in model.layers:
        layer.checkpointing = checkpointing
    observer = TensorObserver(model, schedule, meter=_meter())
    counter = None
    forward = model
    if compile_backend is not None:
        counter = CompileCounterWithBackend(compile_backend)
        forward = torch.compile(model, backend=counter, fullgraph=True)
    published = _train(model, forward, observer)
    observer.close()
    return published, counter


def _assert_same(expected: dict, found: dict) -> None:
    assert found.keys() == expected.keys()
    for step, families in expected.items():
        assert found[step].keys() == families.keys(), step
        for family, values in families.items():
            assert found[step][family].keys() == values.keys(), (step, family)
            for key, value in values.items():
                assert found[step][family][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (
                    step,
                    family,
                    key,
                )


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


# -- torch.compile ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_statistics_equal_eager_ones_without_graph_breaks(backend):
    """Under torch.compile(fullgraph=True) every due step publishes the values of the eager
    model, with no graph break; due steps with 1, 2 or 3 micro-batches share their graphs."""
    eager, _ = _run(FORWARD + ",grad_norm:2")
    compiled, counter = _run(FORWARD + ",grad_norm:2", compile_backend=backend)
    _assert_same(eager, compiled)
    assert dict(counters["graph_break"]) == {}
    # Due sets over steps 1-6: {}, {rms, residual, logits, router}, {max_abs}, {...}, {},
    # {all}: four forward graphs of the model, whatever the number of micro-batches.
    assert compiled[2][P + "activation_rms"] and compiled[3][P + "activation_max_abs"]
    assert counter.frame_count <= 4 + 4  # the model's forward, and the top-level hook's frame


def test_a_step_with_no_forward_metric_due_compiles_without_observation_or_break():
    """A step where only commit-time metrics are due runs a graph that holds no observation:
    explain() finds one graph, no break, and no observer operator in it."""
    torch.manual_seed(0)
    model = Net()
    observer = TensorObserver(model, "activation_rms:2,grad_norm:1", meter=_meter())
    observer.begin_step(1)  # activation_rms is not due at step 1
    explanation = torch._dynamo.explain(model)(_inputs(1)[0])
    observer.commit()
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    code = "\n".join(graph.code for graph in explanation.graphs)
    assert "record_observation" not in code and "linalg_vector_norm" not in code
    observer.begin_step(2)  # due: the observation is part of the one graph
    explanation = torch._dynamo.explain(model)(_inputs(1)[0])
    observer.commit()
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    assert "record_observation" in "\n".join(graph.code for graph in explanation.graphs)


class UntraceableRms(TensorMetric):
    """A custom activation metric marked as not traceable."""

    name = "untraceable"
    kinds = frozenset({SiteKind.ACTIVATION})
    families = (P + "activation_rms",)
    traceable = False

    def prepare_forward(self, site, tensor):
        return torch.linalg.vector_norm(tensor)

    def start(self, rows, axes):
        return Final(
            rows.values,
            lambda host: [
                FamilyValues(self.families[0], (layer_attributes("global"),), [float(host[0])])
            ],
        )


def test_an_untraceable_metric_under_compile_is_skipped_with_one_warning(caplog):
    """Its values are unavailable while compiled, and one warning says so."""
    torch.manual_seed(0)
    model = Net()
    observer = TensorObserver(model, {UntraceableRms(): 1}, meter=_meter())
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with caplog.at_level(logging.WARNING, logger="otel_training.tensor"):
        for step in (1, 2, 3):
            observer.begin_step(step)
            compiled(_inputs(1)[0]).sum().backward()
            observer.commit()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("untraceable is not traceable" in m for m in messages) == 1
    assert observer.executor.published.observe(P + "activation_rms") == []


def test_hooks_missing_from_a_graph_compiled_before_the_observer_are_reported(caplog):
    """A model compiled and run before the observer was built never calls its hooks: the
    due metric's absence is logged once instead of passing silently."""
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="eager")
    compiled(_inputs(1)[0])  # traced now, without the observer's hooks
    observer = TensorObserver(model, "activation_rms:1", meter=_meter())
    with caplog.at_level(logging.WARNING, logger="otel_training.tensor"):
        for step in (1, 2):
            observer.begin_step(step)
            compiled(_inputs(1)[0]).sum().backward()
            observer.commit()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("activation_rms was due at step 1 but saw no tensor" in m for m in messages) == 1


# -- activation checkpointing -------------------------------------------------------------------


class Counting(TensorMetric):
    """Counts the observations of activation and residual sites (one per forward pass)."""

    name = "counting"
    kinds = frozenset({SiteKind.ACTIVATION, SiteKind.RESIDUAL})
    families = (P + "activation_rms",)

    def __init__(self) -> None:
        self.seen: list[str] = []

    def prepare_forward(self, site, tensor):
        self.seen.append(site.name)
        return torch.linalg.vector_norm(tensor)

    def start(self, rows, axes):
        count = float(len(rows.sites))
        return Final(
            rows.values,
            lambda host: [FamilyValues(self.families[0], (layer_attributes("global"),), [count])],
        )


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_recomputed_forwards_are_not_observed_twice(reentrant):
    """With torch.utils.checkpoint the statistics (forward and gradient) equal those without
    checkpointing, and each forward site is observed once per micro-batch."""
    schedule = FORWARD + ",grad_norm:2,param_norm:2"
    plain, _ = _run(schedule)
    checkpointed, _ = _run(schedule, checkpointing=reentrant)
    _assert_same(plain, checkpointed)

    counts = {}
    for checkpointing in (None, reentrant):
        torch.manual_seed(0)
        model = Net()
        for layer in model.layers:
            layer.checkpointing = checkpointing
        metric = Counting()
        observer = TensorObserver(model, {metric: 1}, meter=_meter())
        observer.begin_step(1)
        for x in _inputs(2):
            model(x).square().mean().backward()
        observer.commit()
        counts[checkpointing] = sorted(metric.seen)
    assert counts[reentrant] == counts[None]
    assert len(counts[None]) == 2 * 2 * 4  # micro-batches x layers x (residual + 3 children)


def test_a_forward_inside_backward_is_a_recomputation_and_not_observed():
    """The test behind it: the autograd engine runs a backward pass on this thread."""
    from otel_training.tensor._forward import in_backward

    seen = []
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: seen.append(in_backward()) or grad)
    y.sum().backward()
    assert seen == [True] and in_backward() is False
    assert math.isclose(float(x.grad.sum()), 6.0)
