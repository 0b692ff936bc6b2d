"""Spans of one rank laid out on tracks as a timeline shows them: strictly nested per track.

Perfetto and ``chrome://tracing`` nest the complete events of one thread by containment, so a
thread's slices must form a proper stack. Spans may overlap without nesting (an asynchronous
checkpoint on another thread, a span that outlives its parent), so each span goes to the track
of its parent when it sits inside it on top of that track's stack, else to the first track that
is idle at its start, else to a new track. The nesting depth on its track is its row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from otel_training.report.run import Run, Span

__all__ = ["Placement", "place_spans"]


@dataclass
class Placement:
    """Where one span goes.

    Attributes:
        span: The span.
        track: Its track (thread) on the rank, from 0.
        depth: Its nesting depth on the track, from 0.
        start_ns: Its start.
        end_ns: Its end; for a span that never ended, the last time seen on its rank.
    """

    span: Span
    track: int
    depth: int
    start_ns: int
    end_ns: int


def place_spans(run: Run, spans: Iterable[Span]) -> list[Placement]:
    """Lays out the spans of ONE rank (see the module docstring).

    Returns:
        One placement per span, parents before their children (by start, longer first).
        Never raises.
    """
    items = [(span.start_ns, run.span_end_ns(span), i, span) for i, span in enumerate(spans)]
    items.sort(key=lambda item: (item[0], -item[1], item[2]))
    stacks: list[list[tuple[int, str]]] = []  # per track: (end_ns, span_id) of open slices
    track_of: dict[str, int] = {}
    placements = []
    for start_ns, end_ns, _, span in items:
        for stack in stacks:
            while (
                stack
                and stack[-1][0] <= start_ns
                and not (
                    stack[-1][0] == start_ns == end_ns  # an empty child at its parent's end
                )
            ):
                stack.pop()
        track = None
        parent_track = track_of.get(span.parent_span_id) if span.parent_span_id else None
        if parent_track is not None:
            stack = stacks[parent_track]
            if stack and stack[-1][1] == span.parent_span_id and stack[-1][0] >= end_ns:
                track = parent_track
        if track is None:
            track = next((t for t, stack in enumerate(stacks) if not stack), None)
        if track is None:
            stacks.append([])
            track = len(stacks) - 1
        stacks[track].append((end_ns, span.span_id))
        track_of[span.span_id] = track
        placements.append(Placement(span, track, len(stacks[track]) - 1, start_ns, end_ns))
    return placements
