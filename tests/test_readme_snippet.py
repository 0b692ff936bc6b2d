"""The README's training-loop snippet is examples/train_loop.py's marked region, word for word."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "# [readme-snippet-start]\n", "# [readme-snippet-end]\n"


def _example_region() -> str:
    text = (ROOT / "examples" / "train_loop.py").read_text()
    assert text.count(START) == 1 and text.count(END) == 1, "one pair of markers"
    return text.split(START, 1)[1].split(END, 1)[0]


def _readme_loop_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use it in your training loop\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```\n", section, re.DOTALL)
    assert match, "the section has a python block"
    return match.group(1)


def test_readme_loop_snippet_is_the_example_region():
    """The first code block of "Use it in your training loop" equals the example's region."""
    block, region = _readme_loop_block(), _example_region()
    diff = "".join(
        difflib.unified_diff(
            region.splitlines(True), block.splitlines(True), "examples/train_loop.py", "README.md"
        )
    )
    assert block == region, diff
