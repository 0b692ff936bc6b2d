"""Every relative link of the README and of docs/ resolves: the file or directory exists, and a
``#fragment`` names a heading of the page it points to (as GitHub makes heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The heading anchors of a markdown page, as GitHub spells them: lower case, spaces to
    hyphens, punctuation but hyphens and underscores dropped, repeats numbered."""
    found: set[str] = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower().replace("`", "")).replace(" ", "-")
        anchor, n = slug, 1
        while anchor in found:
            anchor, n = f"{slug}-{n}", n + 1
        found.add(anchor)
    return found


def links(page: Path) -> list[str]:
    """The relative link targets of a page, outside code blocks."""
    text = _FENCE.sub("", page.read_text())
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_anchor_rule():
    """GitHub's anchors: punctuation dropped, code marks too, repeats numbered."""
    page = ROOT / "README.md"
    assert "quick-start" in anchors(page) and "run-health" in anchors(page)
    assert "the-readmes-crash-walk" in anchors(ROOT / "docs" / "health.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    """Each relative link of the page names an existing path, and its fragment a heading."""
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment}")
    assert not broken, broken
