"""Every definition and rule of the parts of the documentation listed in ``PARTS`` is named by a
test that checks it (``@documents(doc, fragment)``, tests/doc_rules.py), and every name a test
gives is still in its document: a rule reworded, removed or added without its test fails here.

A part's rules are its sentences, each list item's and each table row's: a table row is one rule
(the row of a formula or an instrument), a sentence of a list item is one, a fenced code block is
an example, not a rule. A sentence that states no rule is kept out by ``NOT_RULES``, with why."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@dataclass(frozen=True)
class Part:
    """A checked part of a document.

    Attributes:
        doc: ``docs/<doc>``, or ``README.md`` (the repository's).
        heading: The title of a heading of any level; the part runs to the next heading.
        lead: Only the paragraph that opens with this bold lead-in (``Ids.`` for ``**Ids.**``)
            and those after it up to the next paragraph with a bold lead-in.
    """

    doc: str
    heading: str
    lead: str | None = None

    def __str__(self) -> str:
        return f"{self.doc}: {self.heading}" + (f" / {self.lead}" if self.lead else "")


#: The parts whose every sentence is a rule with a test.
PARTS = (
    Part("limits.md", "One rule for every string"),
    Part("limits.md", "Requests a receiver accepts"),
    Part("limits.md", "Network: proxies and certificates"),
    Part("health.md", "Goodput"),
    Part("health.md", "Hangs"),
    Part("health.md", "Stragglers"),
    Part("health.md", "Incidents"),
    Part("spans.md", "Traces across ranks", "The budget."),
    Part("spans.md", "Traces across ranks", "Ids."),
    Part("spans.md", "Traces across ranks", "Sampling"),
    Part("spans.md", "Run, attempt and job"),
    Part("device-metrics.md", "Instruments"),
    Part("README.md", "Metrics"),
)

#: Sentences of the parts that state no rule a test could check: (doc, their start, why).
NOT_RULES: tuple[tuple[str, str, str], ...] = (
    (
        "health.md",
        "Defined in one module, `otel_training.health.goodput`.",
        "where the definition lives, which no behaviour shows; the rules follow it",
    ),
    (
        "health.md",
        "Defined in one module, `otel_training.health.straggler`.",
        "where the definition lives, which no behaviour shows; the rules follow it",
    ),
    (
        "health.md",
        "Defined in one module, `otel_training.health.incidents`.",
        "where the definition lives, which no behaviour shows",
    ),
    (
        "health.md",
        "Measured on 4,096 simulated ranks with a hang",
        "a measurement of time, which no test asserts (tests never assert wall-clock times)",
    ),
    (
        "health.md",
        "5 is NVRx's safety factor",
        "where the numbers of the threshold table come from; the table's rows are tested",
    ),
    (
        "README.md",
        "The registry and its generated constants",
        "a link to where the registry is described, not a rule of the metrics",
    ),
)

_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[^\n]*$", re.S | re.M)
_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+")
_SENTENCE_END = re.compile(r"(?<=[.])(?<!e\.g\.)(?<!i\.e\.)(?<!etc\.)\s+(?=[A-Za-z`(\d*])")


def _path(doc: str) -> Path:
    return ROOT / doc if doc == "README.md" else ROOT / "docs" / doc


@cache
def _text(doc: str) -> str:
    return _path(doc).read_text()


def _flat(text: str) -> str:
    """Markdown as plain running text: one space between words, bold marks gone."""
    text = re.sub(r"\s+", " ", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"\1", text).strip()


def units(markdown: str) -> list[str]:
    """The rules a piece of markdown states: the sentences of its paragraphs and list items,
    and its table rows (not a table's header), each as plain running text; code blocks and
    pieces of three words or fewer (a bold lead-in that only names the rule) left out."""
    found: list[str] = []
    block: list[str] = []

    def close() -> None:
        if block:
            found.extend(_SENTENCE_END.split(_flat(" ".join(block))))
            block.clear()

    lines = _FENCE.sub("", markdown).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|"):
            close()
            following = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.match(r"\|\s*:?-", line) and not re.match(r"\|\s*:?-", following):
                found.append(_flat(line.strip("| ")))
        elif not line.strip() or line.startswith("#") or _ITEM.match(line):
            close()
            if line.strip():
                block.append(_ITEM.sub("", line) if _ITEM.match(line) else line)
        else:
            block.append(line)
    close()
    return [unit for unit in found if len(unit.split()) > 3]


def part_text(document: str, part: Part) -> str:
    """The markdown of ``part`` in ``document``.

    Raises:
        LookupError: if the heading (or the lead-in) is not there exactly once.
    """
    document = _FENCE.sub("", document)
    headings = re.findall(rf"^#+ {re.escape(part.heading)}\n", document, re.M)
    if len(headings) != 1:
        raise LookupError(f"{part}: {len(headings)} headings so titled")
    body = document.split(headings[0], 1)[1]
    body = re.split(r"^#", body, maxsplit=1, flags=re.M)[0]
    if part.lead is None:
        return body
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", body)]
    starts = [i for i, p in enumerate(paragraphs) if p.startswith(f"**{part.lead}**")]
    if len(starts) != 1:
        raise LookupError(f"{part}: {len(starts)} paragraphs so led")
    kept = [paragraphs[starts[0]]]
    for paragraph in paragraphs[starts[0] + 1 :]:
        if paragraph.startswith("**"):
            break
        kept.append(paragraph)
    return "\n\n".join(kept)


def rules(part: Part) -> list[str]:
    """The rule sentences of ``part``, less those of ``NOT_RULES``."""
    excluded = [start for doc, start, _ in NOT_RULES if doc == part.doc]
    return [
        unit
        for unit in units(part_text(_text(part.doc), part))
        if not any(unit.startswith(_flat(start)) for start in excluded)
    ]


@dataclass(frozen=True)
class Mark:
    """One ``@documents(doc, fragment)`` on a function of a test file."""

    doc: str
    fragment: str
    file: str
    function: str


@cache
def marks() -> tuple[Mark, ...]:
    """Every ``@documents`` of the test sources, read from their syntax trees: on functions
    and classes at the top of a module and on the methods of its classes. One anywhere else
    (a test nested in a function) is a mark of function ``<not read>``, which fails."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        source = path.read_text()
        if "@documents(" not in source:
            continue
        name = str(path.relative_to(TESTS))
        tree = ast.parse(source)
        nodes = [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]
        in_file = []
        for node in nodes:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and isinstance(decorator.func, ast.Name)
                    and decorator.func.id == "documents"
                ):
                    doc, fragment = (ast.literal_eval(arg) for arg in decorator.args)
                    in_file.append(Mark(doc, fragment, name, node.name))
        written = len(re.findall(r"^[ \t]*@documents\(", source, re.M))
        found.extend(in_file)
        found.extend(Mark("", "", name, "<not read>") for _ in range(written - len(in_file)))
    return tuple(found)


@cache
def _doc_units(doc: str) -> tuple[str, ...]:
    return tuple(units(_text(doc)))


def test_every_named_rule_is_still_in_its_document():
    """A fragment a test names is in one sentence (or table row) of its document, word for
    word: a rule reworded or removed fails the tests that check it until they are looked at
    again."""
    missing = []
    for mark in marks():
        if not _path(mark.doc).is_file():
            missing.append(f"{mark.file}::{mark.function}: no document {mark.doc}")
            continue
        fragment = _flat(mark.fragment)
        if not any(fragment in unit for unit in _doc_units(mark.doc)):
            missing.append(f"{mark.file}::{mark.function}: {mark.doc}: {mark.fragment!r}")
    assert not missing, "\n".join(missing)


def test_every_mark_is_on_a_test():
    """``@documents`` marks tests (a function named test_*), nothing else."""
    assert marks()
    assert [m for m in marks() if not m.function.startswith("test_")] == []


@pytest.mark.parametrize("part", PARTS, ids=str)
def test_every_rule_of_the_part_has_a_test(part):
    """Each rule sentence of the part is named by at least one test."""
    fragments = [_flat(m.fragment) for m in marks() if m.doc == part.doc]
    untested = [rule for rule in rules(part) if not any(f in rule for f in fragments)]
    assert not untested, "\n".join(untested)


@pytest.mark.parametrize("part", PARTS, ids=str)
def test_the_part_is_found(part):
    """The part this module checks exists once and holds rules (a renamed section fails)."""
    assert len(rules(part)) >= 2


def test_every_exclusion_is_a_sentence_of_a_checked_part():
    """A sentence kept out as no rule is still there, in a checked part, and says why."""
    for doc, start, why in NOT_RULES:
        parts = [part_text(_text(doc), part) for part in PARTS if part.doc == doc]
        sentences = [unit for text in parts for unit in units(text)]
        assert any(u.startswith(_flat(start)) for u in sentences), (doc, start)
        assert len(why.split()) >= 3, start


def test_the_reader_splits_sentences_items_and_rows_and_finds_parts():
    """Sentences, list items and table rows are rules; a header, a code block and a bold
    lead-in are not; a heading not found raises."""
    document = (
        "# Doc\n\n## Rules\n\n**Lead.** The first rule holds here. The second one holds too, "
        "e.g. always.\n\n- **A** = one thing: a list item\n- another item that is long\n\n"
        "| name | value |\n|---|---|\n| `x` | x is the first one |\n\n```\nnot a rule at all\n```\n"
        "**Other.** Not in the lead part.\n\n## Next\n\nElsewhere, not in the part.\n"
    )
    assert units(part_text(document, Part("x.md", "Rules"))) == [
        "The first rule holds here.",
        "The second one holds too, e.g. always.",
        "A = one thing: a list item",
        "another item that is long",
        "`x` | x is the first one",
        "Not in the lead part.",
    ]
    assert units(part_text(document, Part("x.md", "Rules", "Lead."))) == [
        "The first rule holds here.",
        "The second one holds too, e.g. always.",
        "A = one thing: a list item",
        "another item that is long",
        "`x` | x is the first one",
    ]
    with pytest.raises(LookupError):
        part_text(document, Part("x.md", "Rules renamed"))
    with pytest.raises(LookupError):
        part_text(document, Part("x.md", "Rules", "Gone."))
