"""report.clocks: ranks whose clocks disagree, measured from span lines where one rank's stamps
are offset by a known amount (and a straggler that is not)."""

from __future__ import annotations

import random

import pytest
from report_files import span_record, write_lines

from otel_training.report import build_chrome_trace, load_run

MS = 1_000_000
T0 = 1_800_000_000_000_000_000
ITERATIONS = 8


def _write_rank(directory, rank, world, *, offset_ms=0.0, slow_optimizer_ms=0.0, seed=0):
    """Iterations 1..8 as a synchronous data-parallel rank records them: data loading, then
    forward-backward ending at the all-reduce (the same moment on every rank, +-1 ms), then
    the optimizer step; every stamp moved by ``offset_ms`` (this rank's clock)."""
    jitter = random.Random(seed * 1000 + rank)
    lines = []
    shift = int(offset_ms * MS)
    for it in range(1, ITERATIONS + 1):
        start = T0 + it * 200 * MS + int(jitter.uniform(-1, 1) * MS)
        synced = T0 + it * 200 * MS + 120 * MS + int(jitter.uniform(-1, 1) * MS)
        end = synced + 30 * MS + int(slow_optimizer_ms * MS) + int(jitter.uniform(-1, 1) * MS)
        spans = [
            ("megatron.train.iteration", "00", start, end),
            ("megatron.train.iteration.forward_backward", "aa", start, synced),
            ("megatron.train.iteration.optimizer", "bb", synced, end),
        ]
        for name, tag, begin, finish in spans:
            lines.append(
                span_record(
                    "span_end",
                    name,
                    f"{rank:02x}{it:012x}{tag}",
                    None,
                    begin + shift,
                    finish + shift,
                    rank=rank,
                    world_size=world,
                    attributes={"megatron.iteration": it},
                )
            )
    write_lines(directory / f"spans-rank{rank}.jsonl", lines)


def test_a_rank_whose_clock_is_behind_is_named_and_a_straggler_is_not(tmp_path):
    """Three ranks: rank 2 stamps everything 250 ms early, rank 1's optimizer step takes
    80 ms longer. Rank 2 is named, about 250 ms behind the others; rank 1 (late at the
    iteration's end only) is not; nothing is shifted."""
    _write_rank(tmp_path, 0, 3)
    _write_rank(tmp_path, 1, 3, slow_optimizer_ms=80)
    _write_rank(tmp_path, 2, 3, offset_ms=-250)
    run = load_run(tmp_path)
    (offset,) = run.clock_offsets
    assert offset.rank == 2 and offset.offset_ms == pytest.approx(-250, abs=3)
    assert offset.reference is None and offset.iterations == ITERATIONS
    (note,) = [n for n in run.notes if "clock" in n]
    assert "Rank 2's clock seems 250 ms behind the other ranks'" in note
    assert "not shifted" in note
    earliest = min(s.start_ns for s in run.spans if s.rank == 2)
    assert abs(earliest - (T0 + 200 * MS - 250 * MS)) <= MS  # as stamped: not shifted back
    trace = build_chrome_trace(run)
    labels = {
        e["pid"]: e["args"]["labels"] for e in trace["traceEvents"] if e["name"] == "process_labels"
    }
    assert "clock -250 ms" in labels[3] and "clock" not in labels[1] + labels[2]
    assert trace["otherData"]["notes"] == [note]


@pytest.mark.parametrize("offset_ms", [400.0, -35.0])
def test_two_ranks_offset_by_a_known_amount(tmp_path, offset_ms):
    """Two ranks, rank 1's stamps moved by a known amount: measured against rank 0 within a
    few ms."""
    _write_rank(tmp_path, 0, 2, seed=1)
    _write_rank(tmp_path, 1, 2, offset_ms=offset_ms, seed=1)
    (offset,) = load_run(tmp_path).clock_offsets
    assert (offset.rank, offset.reference) == (1, 0)
    assert offset.offset_ms == pytest.approx(offset_ms, abs=3)


def test_ranks_that_agree_are_not_named(tmp_path):
    """Synchronised ranks with a millisecond of jitter and a straggler: no clock is named."""
    for rank in range(4):
        _write_rank(tmp_path, rank, 4, slow_optimizer_ms=60 if rank == 3 else 0, seed=2)
    run = load_run(tmp_path)
    assert run.clock_offsets == [] and not any("clock" in n for n in run.notes)
