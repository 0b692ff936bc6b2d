"""The NVTX recorder of the tests: a small NVTX v3 injection library (``recorder.c``), built
with the C compiler at test time, that appends every NVTX call of a process to a JSON-lines
file. ``build()`` compiles it; ``environment()`` names it for a child process (NVTX reads
``NVTX_INJECTION64_PATH`` at its first call, so it must be set before the child starts);
``read()`` and ``ranges()`` turn the file into records and matched ranges."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("recorder.c")


def build(directory: Path) -> Path:
    """Compiles the recorder into ``directory`` (a skip without a C compiler, a failure
    under ``CI=true``).

    Raises:
        subprocess.CalledProcessError: when the compiler rejects the source.
    """
    from support import build_shared_library

    return build_shared_library(
        SOURCE,
        directory / "libnvtx_recorder.so",
        "-O2", "-Wall", "-Wextra", "-Werror", "-pthread",
    )  # fmt: skip


def environment(library: Path, output: Path) -> dict[str, str]:
    """The variables that make a child process load the recorder and write to ``output``."""
    return {"NVTX_INJECTION64_PATH": str(library), "NVTX_RECORDER_OUTPUT": str(output)}


def read(output: Path) -> list[dict]:
    """The records written so far, in order (none when the file does not exist)."""
    if not output.exists():
        return []
    return [json.loads(line) for line in output.read_text().splitlines() if line]


@dataclass
class Range:
    """One start/end range: its id, message, domain, category name, colour and threads."""

    id: int
    message: str
    domain: str
    category: str | None
    color: int
    start_tid: int
    end_tid: int | None
    start_index: int
    end_index: int | None


def ranges(records: list[dict]) -> list[Range]:
    """Start/end ranges in start order, matched by id.

    Raises:
        AssertionError: when an id ends twice or ends without a start.
    """
    categories = {(r["domain"], r["category"]): r["name"] for r in records if r["op"] == "category"}
    found: dict[int, Range] = {}
    for index, record in enumerate(records):
        if record["op"] == "start":
            assert record["id"] not in found, f"range id {record['id']} started twice"
            found[record["id"]] = Range(
                id=record["id"],
                message=record["message"],
                domain=record["domain"],
                category=categories.get((record["domain"], record["category"])),
                color=record["color"],
                start_tid=record["tid"],
                end_tid=None,
                start_index=index,
                end_index=None,
            )
        elif record["op"] == "end":
            assert record["id"] in found, f"range id {record['id']} ended without a start"
            assert found[record["id"]].end_index is None, f"range {record['id']} ended twice"
            found[record["id"]].end_tid = record["tid"]
            found[record["id"]].end_index = index
    return list(found.values())


def assert_balanced(records: list[dict]) -> list[Range]:
    """Every range started was ended exactly once, and no push/pop range was used."""
    matched = ranges(records)
    assert [r.message for r in matched if r.end_index is None] == []
    assert [r["op"] for r in records if r["op"] in ("push", "pop")] == []
    return matched
