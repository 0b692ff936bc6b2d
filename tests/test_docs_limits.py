"""Every rule of docs/limits.md's sections on strings and sizes is named by a test that checks
it (``@documents("limits.md", fragment)``, tests/doc_rules.py), and every such name is still in
the document."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DOC = (TESTS.parent / "docs" / "limits.md").read_text()
#: The sections whose every sentence is a rule with a test.
SECTIONS = (
    "One rule for every string",
    "Requests a receiver accepts",
    "Network: proxies and certificates",
)
_MARK = re.compile(r'@documents\(\s*"limits\.md",\s*"((?:[^"\\]|\\.)*)"\s*\)')


def _flat(text: str) -> str:
    """Markdown as plain running text: one space between words, list numbers and bold marks
    gone."""
    text = re.sub(r"\n\s*(\d+\.\s+)?", " ", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"\1", text).strip()


def _rules() -> list[str]:
    """The sentences of the checked sections, without the bold lead-in of each numbered rule
    (``Any string.``), which only names it."""
    sentences = []
    for title in SECTIONS:
        body = DOC.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
        for sentence in re.split(r"(?<=[.])\s+(?=[A-Z`(\d])", _flat(body)):
            if len(sentence.split()) > 3:
                sentences.append(sentence)
    return sentences


def _fragments() -> dict[str, list[str]]:
    """Fragment -> test files that name it."""
    found: dict[str, list[str]] = {}
    for path in TESTS.rglob("*.py"):
        for fragment in _MARK.findall(path.read_text()):
            fragment = ast.literal_eval(f'"{fragment}"')
            found.setdefault(fragment, []).append(path.name)
    return found


def test_every_named_rule_is_still_in_the_document():
    """A fragment a test names is in docs/limits.md, word for word: a rule reworded or
    removed fails the tests that check it until they are looked at again."""
    flat = _flat(DOC)
    missing = [f for f in _fragments() if _flat(f) not in flat]
    assert not missing, missing


def test_every_rule_of_the_sections_has_a_test():
    """Each sentence of the sections on strings and sizes is named by at least one test."""
    fragments = [_flat(f) for f in _fragments()]
    untested = [rule for rule in _rules() if not any(f in rule for f in fragments)]
    assert not untested, "\n".join(untested)


def test_the_sections_are_found():
    """The sections this module checks exist and hold rules (a renamed section fails)."""
    assert len(_rules()) >= 20
