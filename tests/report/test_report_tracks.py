"""report.tracks: spans of one rank laid out so that each track nests strictly."""

from __future__ import annotations

from pathlib import Path

from otel_training.report.run import RankTelemetry, Run, Span
from otel_training.report.tracks import place_spans


def _span(span_id, start, end, parent=None, name="s"):
    return Span(0, name, "t" * 32, span_id, parent, start, end)


def _run(spans, last_ns=None):
    run = Run(Path("."), spans=spans)
    run.ranks[0] = RankTelemetry(0)
    run.ranks[0].see(min(s.start_ns for s in spans))
    if last_ns is not None:
        run.ranks[0].see(last_ns)
    return run


def test_nested_spans_share_a_track_at_their_depth():
    """Children inside their parent go on its track, one level deeper; siblings alike."""
    spans = [
        _span("a", 0, 100),
        _span("b", 10, 40, "a"),
        _span("c", 40, 90, "a"),
        _span("d", 12, 20, "b"),
    ]
    placed = {p.span.span_id: (p.track, p.depth) for p in place_spans(_run(spans), spans)}
    assert placed == {"a": (0, 0), "b": (0, 1), "c": (0, 1), "d": (0, 2)}


def test_overlapping_spans_that_do_not_nest_get_another_track():
    """A span that outlives its parent, or overlaps a sibling, moves to a track of its own."""
    spans = [
        _span("a", 0, 100),
        _span("b", 50, 150, "a"),
        _span("c", 10, 60, "a"),
        _span("d", 20, 30, "a"),
    ]
    placements = place_spans(_run(spans), spans)
    placed = {p.span.span_id: (p.track, p.depth) for p in placements}
    assert placed["a"] == (0, 0) and placed["c"] == (0, 1)
    assert placed["d"][0] != 0 and placed["b"][0] != 0  # d overlaps c; b outlives a
    by_track = {}
    for p in placements:
        by_track.setdefault(p.track, []).append((p.start_ns, p.end_ns))
    for intervals in by_track.values():  # strictly nested or disjoint on every track
        for i, (s1, e1) in enumerate(intervals):
            for s2, e2 in intervals[i + 1 :]:
                assert e1 <= s2 or e2 <= s1 or (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)


def test_an_open_span_lasts_until_the_rank_last_time():
    """A span without an end is laid out to the last time seen on its rank."""
    spans = [_span("a", 0, None), _span("b", 5, 8, "a")]
    placements = place_spans(_run(spans, last_ns=70), spans)
    assert [(p.span.span_id, p.end_ns, p.depth) for p in placements] == [("a", 70, 0), ("b", 8, 1)]
