"""Spans of one rank laid out on tracks as a timeline shows them: strictly nested per track.

Perfetto and ``chrome://tracing`` nest the complete events of one thread by containment, so a
thread's slices must form a proper stack. Spans may overlap without nesting (an asynchronous
checkpoint on another thread, a span that outlives its parent), so each span goes to the track
of its parent when it sits inside it on top of that track's stack, else to the first track that
is idle at its start, else to a new track. The nesting depth on its track is its row.

A rank's step trace is rooted by a ``megatron.train.segment`` span of its own, linked to the
rank's segment span in the job trace (``docs/spans.md``): it nests under the rank's segment
span of the same number (``otel_training.trace.segment``) placed last (the job trace's, or the
root of the step trace before), so the iterations nest under their segment on one timeline;
the segment span's own children nest through it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from otel_training.report.run import Run, Span
from otel_training.semconv.attributes import OTEL_TRAINING_TRACE_SEGMENT
from otel_training.semconv.spans import MEGATRON_TRAIN_SEGMENT

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
    segments: dict[object, str] = {}  # segment number: the last segment span placed
    under: dict[str, str] = {}  # a step trace's root: the segment span it nests under
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
        parent_id = span.parent_span_id
        if span.name == MEGATRON_TRAIN_SEGMENT:
            number = span.attributes.get(OTEL_TRAINING_TRACE_SEGMENT)
            last = segments.get(number)
            segments[number] = span.span_id
            if last is not None and parent_id not in track_of:
                parent_id = under[span.span_id] = last  # under the segment's previous one
        parent_track = track_of.get(parent_id) if parent_id else None
        if parent_track is not None:
            stack = stacks[parent_track]
            top = stack[-1][1] if stack else None
            while top != parent_id and top in under:  # a step trace's root: see through it
                top = under[top]
            if stack and top == parent_id and stack[-1][0] >= end_ns:
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
