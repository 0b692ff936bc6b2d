"""Attempts by membership (docs/health.md "Attempts and the job"): an elastic shrink or grow
keeps torchrun's restart count, yet its processes are another cohort, another attempt."""

from __future__ import annotations

import pytest
from doc_rules import documents
from test_health_goodput import run_attempt

from otel_training.health import goodput
from otel_training.health.evidence import attempts
from otel_training.health.hang import HangPolicy
from otel_training.report.health import JobHealth, assess, format_text

T0 = 1_800_000_000.0


def cohort(start: float, world: int, *, load: int | None, last: int, cut_s=None, attempt=0):
    """``world`` ranks of one cohort, each with dl.world_size, all ended at the same time."""
    sims = [
        run_attempt(start + 0.01 * r, attempt, load=load, last=last, cut_s=cut_s, rank=r)
        for r in range(world)
    ]
    end = max(s.now for s in sims)
    for sim in sims:
        sim.process.resource["dl.world_size"] = world
        sim.advance(end - sim.now)
        sim.end()
    return [s.process for s in sims]


def health_of(processes, now_s) -> JobHealth:
    from otel_training.health.evidence import Job

    return assess(Job("job", [], processes), now_s=now_s, policy=HangPolicy())


@documents("health.md", "a change of world size or of the set of processes starts a new attempt")
@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4)])
def test_an_elastic_membership_change_is_a_new_attempt(before, after):
    """Shrink 4 -> 2 (a node lost) and grow 2 -> 4 under the same restart count: two attempts
    (0 and 0.1), each with only its own ranks; the gap between them is downtime, the steps
    after the restored one lost; no rank of the ended cohort is silent or stalled later."""
    first = cohort(T0, before, load=None, last=45, cut_s=0.05)
    restart = max(p.alive_s for p in first) + 3.0
    second = cohort(restart, after, load=40, last=80)
    found = attempts(first + second)
    assert [(a.number, a.cohort, a.label) for a in found] == [(0, 0, "0"), (0, 1, "0.1")]
    assert [sorted(p.rank for p in a.processes) for a in found] == [
        list(range(before)), list(range(after)),
    ]  # fmt: skip
    health = health_of(first + second, now_s=max(p.alive_s for p in second) + 1.0)
    one, two = health.account.attempts
    assert one.ranks == list(range(before)) and two.ranks == list(range(after))
    assert (one.world_size, two.world_size) == (before, after)
    assert one.buckets["downtime"] == pytest.approx(restart - max(p.alive_s for p in first))
    assert one.lost_iterations == (41, 45) and two.resumed_from == 40
    assert one.ended == "killed" and two.ended == "completed"
    for item in health.attempts:  # nobody of the other cohort silent, stalled, straggling
        assert item.hang is not None and not item.hang.silent_ranks
        assert not item.hang.stalled_ranks and not item.stragglers.stragglers
    document = health.to_json()["attempts"]
    assert [(a["attempt"], a["cohort"], a["world_size"]) for a in document] == [
        (0, 0, before), (0, 1, after),
    ]  # fmt: skip
    assert "attempt 0.1" in format_text(health)


def test_without_counters_a_grow_is_told_by_its_start_after_the_end():
    """No attempt number, one run id: the cohorts split on the world size, and a process that
    starts after all of the first cohort ended begins the next even at the same size."""
    first = cohort(T0, 2, load=None, last=30, attempt=None)
    restart = max(p.alive_s for p in first) + 2.0
    same_size = cohort(restart, 2, load=20, last=40, attempt=None)
    restart2 = max(p.alive_s for p in same_size) + 2.0
    grown = cohort(restart2, 4, load=40, last=50, attempt=None)
    found = attempts(first + same_size + grown)
    assert [sorted(p.rank for p in a.processes) for a in found] == [[0, 1], [0, 1], [0, 1, 2, 3]]
    assert [a.number for a in found] == [0, 1, 2] and not any(a.numbered for a in found)
    account = goodput.account(found)
    assert account.attempts[0].lost_iterations == (21, 30)
    assert account.attempts[1].lost_iterations is None  # resumed at 40, its last step
