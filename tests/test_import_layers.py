"""The package's imports: no circle between modules, and none from a lower layer to a higher one.

Every module of ``src/otel_training`` is parsed with :mod:`ast` (nothing is imported): each
``import`` and ``from ... import`` counts, at the top, inside a function or class, and under
``if TYPE_CHECKING:`` (a type-only import is an arrow all the same). :data:`LAYERS` is the one
place the layers are written; a module belongs to the layer of the most specific entry that
names it (the module itself, else its nearest package written ``pkg.*``), and a module that no
entry names fails the test, so a new one is placed on purpose. Regrouping the package into
subpackages changes this table and nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "otel_training"

#: Bottom to top: a module may import modules of its own layer and of the layers below, never
#: one above. Each entry is a module (``otel_training.clock``) or a package and everything in it
#: (``otel_training.semconv.*``, the package's ``__init__`` included).
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "leaves",
        "names and rules every layer shares: the clock, warn-once, the former module paths, "
        "semantic conventions, the string rule and cost model of the limits",
        (
            "otel_training._log_once",
            "otel_training._moved",
            "otel_training.clock",
            "otel_training.export.limits",
            "otel_training.export.limits.*",
            "otel_training.semconv.*",
        ),
    ),
    (
        "health definitions",
        "run health as definitions over recorded facts (ledger, hang, straggler, goodput), "
        "read at run time and by the report alike",
        ("otel_training.health.*",),
    ),
    (
        "config",
        "the settings: the variables' declarations, their one parser, the rank's identity",
        ("otel_training.config.*",),
    ),
    (
        "sdk",
        "building one pipeline: per-signal factories, processors, exporters, files, network, "
        "resource, lifecycle, the training instruments and the trace's shape",
        (
            "otel_training._providers",
            "otel_training.export.*",
            "otel_training.health.metrics",
            "otel_training.health.watchdog",
            "otel_training.logs.*",
            "otel_training.metrics.*",
            "otel_training.pipeline.*",
            "otel_training.trace.*",
        ),
    ),
    (
        "api",
        "what a training script calls: configure(), the phase spans, the package's names",
        (
            "otel_training",
            "otel_training.phases.*",
            "otel_training.configuration",
            "otel_training.spans",
        ),
    ),
    (
        "instrumentation",
        "built on the API: tensor metrics and the frameworks' callbacks",
        ("otel_training.integrations.*", "otel_training.tensor.*"),
    ),
    (
        "report",
        "reads what a run left on disk: the report, the trace, otel-training health",
        ("otel_training.report.*",),
    ),
    (
        "tools",
        "on top: the command line, the demo, the helpers for tests",
        (
            "otel_training.__main__",
            "otel_training.cli",
            "otel_training.demo.*",
            "otel_training.testing",
        ),
    ),
)


def _modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, whether it is a package)."""
    found = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _known(name: str, modules: dict) -> str | None:
    """``name``, or the nearest package above it, that is a module of ours; else ``None``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (anywhere in its text)."""
    modules = _modules(src)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        here = module if is_package else module.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(_known(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    # ``from pkg import sub`` imports the module pkg.sub; otherwise a name of pkg.
                    submodule = f"{source}.{alias.name}"
                    targets.add(submodule if submodule in modules else _known(source, modules))
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (most specific entry).

    Raises:
        LookupError: when no entry names it.
    """
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for index, (_, _, entries) in enumerate(LAYERS):
        for entry in entries:
            if entry.endswith(".*"):
                package = entry[:-2]
                matches = module == package or module.startswith(package + ".")
            else:
                matches = module == entry
            if matches and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    if best is None:
        raise LookupError(f"{module} is in no layer of tests/test_import_layers.py's LAYERS")
    return best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a module of a higher layer, as ``a (layer) -> b (layer)``."""
    found = []
    for module in sorted(graph):
        for target in sorted(graph[module]):
            if layer_of(target) > layer_of(module):
                found.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) -> "
                    f"{target} ({LAYERS[layer_of(target)][0]})"
                )
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two modules or more (Tarjan's
    algorithm), sorted; a module that imports itself is not one (``import_graph`` drops it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_every_module_has_a_layer():
    """Each module of the package is named by the table, so a new one is placed on purpose."""
    for module in _modules():
        layer_of(module)


def test_each_entry_of_the_table_names_a_module():
    """An entry that names no module (one renamed or removed) is taken out of the table."""
    modules = _modules()
    for _, _, entries in LAYERS:
        for entry in entries:
            assert entry.removesuffix(".*") in modules, entry


def test_no_import_circle():
    """No module imports, through any chain, a module that imports it back."""
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_runs_up_the_layers():
    """No module imports one of a higher layer."""
    found = upward_imports(import_graph())
    assert not found, "imports up the layers:\n" + "\n".join(found)


def test_the_checks_see_imports_in_functions_and_type_checking_blocks(tmp_path):
    """An upward import, a function-level import and a type-only import are each seen; a
    relative ``from . import`` resolves to the module it names."""
    package = tmp_path / PACKAGE
    (package / "semconv").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "semconv" / "__init__.py").write_text("from . import spans\n")
    (package / "semconv" / "spans.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from otel_training import cli\n"
    )
    (package / "cli.py").write_text("def main():\n    from .semconv.spans import X\n")
    graph = import_graph(tmp_path)
    assert graph == {
        "otel_training": set(),
        "otel_training.semconv": {"otel_training.semconv.spans"},
        "otel_training.semconv.spans": {"otel_training.cli"},
        "otel_training.cli": {"otel_training.semconv.spans"},
    }
    assert upward_imports(graph) == [
        "otel_training.semconv.spans (leaves) -> otel_training.cli (tools)"
    ]
    assert circles(graph) == [["otel_training.cli", "otel_training.semconv.spans"]]


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("otel_training.semconv", "leaves"),
        ("otel_training.health.ledger", "health definitions"),
        ("otel_training.health.watchdog", "sdk"),
        ("otel_training.phases._phase", "api"),
        ("otel_training", "api"),
    ],
)
def test_the_most_specific_entry_decides(module, layer):
    """A module's own entry wins over its package's; a package is in its ``pkg.*`` layer."""
    assert LAYERS[layer_of(module)][0] == layer


#: The most modules the package's root may hold (issue 28: the rest is grouped by concern).
MAX_ROOT_MODULES = 10


def test_the_root_holds_few_modules():
    root = sorted(path.name for path in (SRC / PACKAGE).glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_every_folder_says_what_it_may_import():
    """Each package's docstring says its concern and its layer, pointing at :data:`LAYERS`."""
    modules = _modules()
    quiet = [
        name
        for name, (path, is_package) in modules.items()
        if is_package
        and name != PACKAGE
        and "tests/test_import_layers.py"
        not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert quiet == []
