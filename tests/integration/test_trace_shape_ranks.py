"""Traces a trace store accepts (issue 17 item 1), from 16 ranks of one run as separate
processes (each its own ``RANK``/``WORLD_SIZE``, no collectives, forked from one interpreter so
the imports are paid once: about 2 s of CPU a budget) writing the embedded default's
files: no trace over the span budget, one rank per trace that holds an iteration, the job-level
spans of a segment in one job trace while it fits (linked shards when not), every step trace
linked to its job trace, and the report's one timeline per rank. Plus: a ratio-0.5 sampler in
two processes decides every trace alike, a segment's job and step traces together."""

from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from doc_rules import documents
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_training.report import load_run
from otel_training.report.chrome_trace import build_chrome_trace
from otel_training.testing import parse_otlp_json

WORLD = 16
ITERATIONS = 28
EVERY = 14  # an evaluation (3 steps) and a checkpoint save (3 stages) every 14 iterations
CHATTY_RANK = 5  # runs an unbounded user loop of phase() in iteration 5

# Forks WORLD ranks; each configures from its own RANK/WORLD_SIZE and runs the same program.
RANKS = """
import os, signal, sys, traceback
import otel_training as ot

world, iterations, every, chatty, probes = (int(a) for a in sys.argv[1:6])
# What becomes of rank 0 (the keeper of every shared trace of one shard): "killed:IT" (SIGKILL
# after iteration IT, its spans flushed) or "left:IT" (its run ends after iteration IT).
fate, _, fate_at = (sys.argv[6] if len(sys.argv) > 6 else "").partition(":")

def program(rank):
    with ot.training_run():
        with ot.startup():
            with ot.model_init():
                pass
            with ot.dataloader_init():
                pass
        with ot.checkpoint_load("/ckpt/iter_0", iteration=0):
            with ot.checkpoint_load_stage("io_read"):
                pass
        for it in range(1, iterations + 1):
            with ot.training_iteration(iteration=it):
                with ot.data_loading(iteration=it):
                    pass
                with ot.forward_backward(iteration=it, num_microbatches=2):
                    with ot.grad_sync("start"):
                        pass
                    with ot.grad_sync("finish"):
                        pass
                    if rank == chatty and it == 5:
                        for k in range(probes):
                            with ot.phase("myproject.probe", k=k):
                                pass
                with ot.optimizer_step(iteration=it):
                    pass
            if it % every == 0:
                with ot.evaluation(iteration=it):
                    for k in range(1, 4):
                        with ot.evaluation_step(eval_iteration=k):
                            pass
                with ot.checkpoint_save(f"/ckpt/iter_{it}", iteration=it):
                    for stage in ("state_dict", "io_write", "finalize"):
                        with ot.checkpoint_save_stage(stage):
                            pass
            if rank == 0 and fate and it == int(fate_at):
                if fate == "killed":
                    ot.force_flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                return

children = []
for rank in range(world):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
            ot.configure()
            program(rank)
            ot.shutdown()
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    children.append(pid)
killed = children[:1] if fate == "killed" else []
failed = [pid for pid in children if (os.waitpid(pid, 0)[1] != 0) != (pid in killed)]
sys.exit(1 if failed else 0)
"""


@dataclass
class _Span:
    rank: int
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict
    links: list[tuple[str, str]] = field(default_factory=list)


def _run_ranks(run_python, tmp_path: Path, budget: int, fate: str = "", **env: str) -> Path:
    """Runs the WORLD ranks with span budget ``budget`` (rank 0 meeting ``fate``, see RANKS);
    returns the run directory."""
    out = tmp_path / f"budget-{budget}"
    result = run_python(
        RANKS,
        args=[str(WORLD), str(ITERATIONS), str(EVERY), str(CHATTY_RANK), str(3 * budget), fate],
        env={
            "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out),
            "OTEL_PYTHON_TRAINING_RUN_ID": "ranks-of-one-run",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
            "OTEL_PYTHON_TRAINING_TRACE_SPAN_BUDGET": str(budget),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OMP_NUM_THREADS": "1",
            **env,
        },
        timeout_s=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (directory,) = [p for p in out.iterdir() if p.is_dir() and p.name != "latest"]
    return directory


def _spans(directory: Path) -> list[_Span]:
    spans = []
    for path in sorted(directory.glob("traces-rank*.jsonl")):
        for line in path.read_text().splitlines():
            request = parse_otlp_json(line, ExportTraceServiceRequest())
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value for a in resource_spans.resource.attributes}
                rank = resource["dl.rank"].int_value
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        spans.append(
                            _Span(
                                rank=rank,
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                attributes={
                                    a.key: getattr(a.value, a.value.WhichOneof("value"))
                                    for a in s.attributes
                                },
                                links=[
                                    (link.trace_id.hex(), link.span_id.hex()) for link in s.links
                                ],
                            )
                        )
    return spans


def _step_roots(segments: list[_Span]) -> list[_Span]:
    """The segment spans that root a rank's step trace: linked to the rank's segment span of
    the same segment (a segment span in the job trace links to the previous segment's)."""
    ids = {(s.trace_id, s.span_id): s for s in segments}
    return [
        s
        for s in segments
        if any(
            (target := ids.get(link)) is not None
            and target.rank == s.rank
            and target.attributes["otel_training.trace.segment"]
            == s.attributes["otel_training.trace.segment"]
            for link in s.links
        )
    ]


def _shards(budget: int, world: int, spans_per_rank: int) -> tuple[int, int]:
    """(K, R) by search, independently of trace_shape: the fewest shards whose ranks per shard
    times the spans a rank is planned for fits the budget."""
    for count in range(1, world + 1):
        ranks = -(-world // count)
        if ranks * spans_per_rank <= budget:
            return count, ranks
    return world, 1


# A job trace is planned for 7 spans per rank: the segment span, a save with its 3 stages and
# an evaluation with one step; a run trace for 6: the run, startup, model and data-loader
# building, a checkpoint load and its read.
JOB_SPANS, RUN_SPANS = 7, 6
JOB_LEVEL = {
    "megatron.train.segment", "megatron.evaluate", "megatron.evaluate.step",
    "megatron.checkpoint.save", "megatron.checkpoint.save.state_dict",
    "megatron.checkpoint.save.io_write", "megatron.checkpoint.save.finalize",
}  # fmt: skip


@documents("spans.md", "K = ⌈W / max(1, ⌊B / j⌋)⌉ shards of R = ⌈W / K⌉ consecutive ranks")
@documents("spans.md", "bounds every trace whatever the world size W and the span groups")
@documents("spans.md", "beyond, shard q > 0's segment spans link to shard 0's root")
@pytest.mark.parametrize(
    ("budget", "env"),
    [(400, {"OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS": "14"}), (60, {})],
    ids=["one job trace", "sharded"],
)
def test_sixteen_ranks_make_traces_within_the_budget(run_python, tmp_path, budget, env):
    """No trace holds more than the budget; a trace with an iteration holds one rank's spans;
    a segment's job-level spans of all ranks meet in one job trace while 16 x 7 fits the
    budget, else in linked shards of consecutive ranks; every step trace links to the rank's
    segment span in its segment's job trace; the report lays each rank out on one timeline."""
    directory = _run_ranks(run_python, tmp_path, budget, **env)
    spans = _spans(directory)
    assert {s.rank for s in spans} == set(range(WORLD))
    assert len({(s.trace_id, s.span_id) for s in spans}) == len(spans)
    probes = sum(1 for s in spans if s.name == "myproject.probe")
    assert probes == 3 * budget  # the unbounded loop ran, and not one span was lost

    by_trace = collections.defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
    assert max(len(members) for members in by_trace.values()) <= budget
    assert max(len(members) for members in by_trace.values()) > budget // 2  # filled, not idle
    segments = [s for s in spans if s.name == "megatron.train.segment"]
    roots = _step_roots(segments)
    segments = [s for s in segments if s not in roots]  # each rank's in the job trace
    shared = {s.trace_id for s in spans if s.name == "megatron.train"}
    shared |= {s.trace_id for s in segments}
    step_traces = set(by_trace) - shared  # each rank's own: its iterations, what had no room
    assert {s.trace_id for s in roots} == step_traces  # each rooted by a segment span
    for trace in step_traces:
        assert len({s.rank for s in by_trace[trace]}) == 1, trace
    for trace in shared:
        assert not any(s.name == "megatron.train.iteration" for s in by_trace[trace]), trace
    own = collections.Counter(by_trace[t][0].rank for t in step_traces)
    assert own[CHATTY_RANK] >= own[0] + 2  # the loop's 3 x budget spans made more step traces

    per_segment = collections.defaultdict(dict)
    for s in segments:
        per_segment[s.attributes["otel_training.trace.segment"]][s.rank] = s
    iterations_per_segment = min(
        int(env.get("OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS", 1000)), (budget - 1) // 4
    )
    assert sorted(per_segment) == list(range(-(-ITERATIONS // iterations_per_segment)))
    count, ranks = _shards(budget, WORLD, JOB_SPANS)
    assert (count > 1) == (budget == 60)
    for number, by_rank in per_segment.items():
        assert sorted(by_rank) == list(range(WORLD))
        job_traces = [by_rank[r].trace_id for r in range(WORLD)]
        expected = [job_traces[(r // ranks) * ranks] for r in range(WORLD)]
        assert job_traces == expected and len(set(job_traces)) == count, number
        shard0 = by_rank[0].trace_id
        for rank, segment in by_rank.items():
            if rank >= ranks:  # a later shard links to shard 0
                assert shard0 in {trace for trace, _ in segment.links}, (number, rank)
        for trace in set(job_traces):
            assert {s.name for s in by_trace[trace]} <= JOB_LEVEL, number
        if count == 1:  # it fits: every rank's save and evaluation is in the job trace
            for name in ("megatron.evaluate", "megatron.checkpoint.save"):
                found = {s.rank for s in by_trace[shard0] if s.name == name}
                assert found == set(range(WORLD)), (number, name)

    segment_of_span = {(s.rank, s.span_id): s for s in segments}
    anchors = {(g.trace_id, g.span_id) for g in segments}
    for trace in step_traces:
        linked = [link for s in by_trace[trace] for link in s.links if link in anchors]
        assert len(linked) == 1, trace  # its root links to the rank's segment span
        (link,) = linked
        rank = by_trace[trace][0].rank
        assert (rank, link[1]) in segment_of_span
        for s in by_trace[trace]:
            if s.name == "megatron.train.iteration":
                number = (s.attributes["megatron.iteration"] - 1) // iterations_per_segment
                assert per_segment[number][rank].span_id == link[1]

    run_count, run_ranks = _shards(budget, WORLD, RUN_SPANS)
    runs = sorted((s for s in spans if s.name == "megatron.train"), key=lambda s: s.rank)
    assert len({s.trace_id for s in runs}) == run_count
    assert [s.trace_id for s in runs] == [
        runs[(r // run_ranks) * run_ranks].trace_id for r in range(WORLD)
    ]

    # The report and `otel-training trace`: one timeline per rank, the iterations nested in the
    # rank's segment span on its first track, as before the traces were split.
    run = load_run(directory)
    assert sorted(run.ranks) == list(range(WORLD))
    document = build_chrome_trace(run)
    slices = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {r + 1 for r in range(WORLD)}
    for rank in range(WORLD):
        mine = [e for e in slices if e["pid"] == rank + 1]
        segment_tids = {e["tid"] for e in mine if e["name"] == "megatron.train.segment"}
        iteration_tids = {e["tid"] for e in mine if e["name"] == "megatron.train.iteration"}
        assert iteration_tids <= segment_tids, rank


SAMPLED = """
import json, os, sys
import otel_training as ot

decisions = []
for rank in (0, 1):
    pid = os.fork()
    if pid == 0:
        os.environ.update(RANK=str(rank), WORLD_SIZE="2")
        ot.configure()
        seen = []
        with ot.training_run() as run:
            seen.append(("run", run.span.get_span_context()))
            for it in range(1, 161):
                with ot.training_iteration(iteration=it) as step:
                    seen.append((f"step {it}", step.span.get_span_context()))
                if it % 8 == 0:
                    with ot.evaluation(iteration=it) as evaluation:
                        seen.append((f"job {it}", evaluation.span.get_span_context()))
        ot.shutdown()
        with open(sys.argv[1] + f"/rank{rank}.json", "w") as out:
            json.dump([(k, f"{c.trace_id:032x}", c.trace_flags.sampled) for k, c in seen], out)
        os._exit(0)
    os.waitpid(pid, 0)
"""


@documents("spans.md", "`H(part)` is SHA-256 of `otel-training/{run id}/{part}`")
@documents("spans.md", "Sampling is decided once per family, at the head, alike on every rank")
def test_a_ratio_sampler_decides_alike_in_two_processes(run_python, tmp_path):
    """traceidratio 0.5 on one run id in two processes: each keeps or drops its run trace and
    each segment's job and step traces alike (the step traces are per rank, the decisions the
    same), a segment's job and step traces together, as the family's low 64 trace-id bits
    decide: below 0.5 x 2^64, kept; both outcomes occur."""
    result = run_python(
        SAMPLED,
        args=[str(tmp_path)],
        env={
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.5",
            "OTEL_PYTHON_TRAINING_RUN_ID": "sampled-run",
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
            "OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS": "8",
            "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path / "out"),
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
        },
        timeout_s=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    decisions = [{key: sampled for key, _, sampled in seen} for seen in ranks]
    assert decisions[0] == decisions[1] and len(decisions[0]) == 1 + 160 + 20

    def family_low(family: str) -> int:  # independent of trace_shape
        digest = hashlib.sha256(f"otel-training/sampled-run/{family}".encode()).digest()
        return int.from_bytes(digest[8:16], "big")

    expected = {"run": family_low("run") < 2**63}
    for it in range(1, 161):
        expected[f"step {it}"] = family_low(f"segment/{(it - 1) // 8}") < 2**63
        if it % 8 == 0:
            expected[f"job {it}"] = expected[f"step {it}"]
    assert decisions[0] == expected
    assert {expected[f"job {it}"] for it in range(8, 161, 8)} == {True, False}
    for seen in ranks:
        for key, trace_id, _ in seen:
            family = "run" if key == "run" else f"segment/{(int(key.split()[1]) - 1) // 8}"
            assert int(trace_id[16:], 16) == family_low(family), key
    step_traces = [{t for k, t, _ in seen if k.startswith("step")} for seen in ranks]
    assert not step_traces[0] & step_traces[1]  # per rank, yet decided alike


@documents(
    "spans.md",
    "Every exported trace has exactly one root span, and no span names a parent in another trace",
)
@documents("spans.md", "a relation across traces is a span link")
@documents("spans.md", "A shared trace's root is the span of the shard's keeper")
@documents("spans.md", "every other rank's run or segment span names that id as its parent")
@documents("spans.md", "A step trace's root is the rank's own `megatron.train.segment` span")
@documents("spans.md", "a span that starts in a step trace for want of room in its parent's links")
@pytest.mark.parametrize(
    ("budget", "env"),
    [(400, {"OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS": "14"}), (60, {})],
    ids=["one job trace", "sharded"],
)
def test_every_trace_has_one_root_and_no_parent_in_another_trace(run_python, tmp_path, budget, env):
    """Over the 16 ranks' exported spans (a small budget: shards, many step traces, the chatty
    rank's overflow): every trace id has exactly one root span; no span's parent lies in
    another trace or is exported by no one; a shared trace's root is its keeper's (the shard's
    first rank) run or segment span; a probe that started in a step trace for want of room
    links to its real parent, the chatty rank's forward-backward."""
    directory = _run_ranks(run_python, tmp_path, budget, **env)
    spans = _spans(directory)
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    roots = collections.defaultdict(list)
    for s in spans:
        if not s.parent_span_id:
            roots[s.trace_id].append(s)
    traces = {s.trace_id for s in spans}
    assert len(traces) > 20
    assert {t: len(roots[t]) for t in traces} == {t: 1 for t in traces}
    astray = [s for s in spans if s.parent_span_id and (s.trace_id, s.parent_span_id) not in by_id]
    assert astray == []

    count, ranks = _shards(budget, WORLD, JOB_SPANS)
    run_count, run_ranks = _shards(budget, WORLD, RUN_SPANS)
    for trace, (root,) in roots.items():
        members = [s for s in spans if s.trace_id == trace]
        if root.name == "megatron.train":  # a run trace shard: its first rank keeps it
            assert root.rank % run_ranks == 0
        elif len({s.rank for s in members}) > 1:  # a job trace shard
            assert root.name == "megatron.train.segment" and root.rank % ranks == 0
        else:  # a step trace: the rank's own root, linked to its segment span
            assert root.name == "megatron.train.segment"
            (link,) = root.links
            assert by_id[link].name == "megatron.train.segment" and by_id[link].rank == root.rank
    moved = [s for s in spans if s.name == "myproject.probe" and s.links]
    assert moved  # the loop overflowed its iteration's step trace
    for probe in moved:
        (link,) = probe.links
        parent = by_id[link]
        assert parent.trace_id != probe.trace_id and parent.rank == CHATTY_RANK
        assert parent.name == "megatron.train.iteration.forward_backward"


def _member_ids(run_id: str, family: str, member: str) -> tuple[str, str]:
    """(trace id, span id) in hex of a derived trace's root, independently of trace_shape: the
    first 8 bytes of H(family/member) then bytes 8-16 of H(family); bytes 16-24 of
    H(family/member)."""

    def digest(part: str) -> bytes:
        return hashlib.sha256(f"otel-training/{run_id}/{part}".encode()).digest()

    member_digest = digest(f"{family}/{member}")
    return (member_digest[:8] + digest(family)[8:16]).hex(), member_digest[16:24].hex()


@documents("spans.md", "When the keeper does not end its span (it was killed, or hangs)")
@documents("spans.md", "a job trace of a segment that the keeper never opened")
@documents("spans.md", "the step trace it was filling has no root either")
@pytest.mark.parametrize("fate", ["killed:20", "left:14"])
def test_what_the_keeper_s_fate_leaves_without_a_root(run_python, tmp_path, fate):
    """Rank 0, the keeper of the run trace and of each segment's job trace (one shard each),
    SIGKILLed after iteration 20 (segment 1; its spans flushed first), or gone after iteration
    14 (its run ended): the traces left without a root are exactly those whose root it never
    exported: segment 1's job trace, and when it was killed, the run trace and its own step
    trace of segment 1. No trace has two roots; every other parent is exported in its trace."""
    directory = _run_ranks(
        run_python, tmp_path, 400, fate, OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS="14"
    )
    spans = _spans(directory)
    assert {s.rank for s in spans} == set(range(WORLD))
    ids = {(s.trace_id, s.span_id) for s in spans}
    missing = {
        (s.trace_id, s.parent_span_id)
        for s in spans
        if s.parent_span_id and (s.trace_id, s.parent_span_id) not in ids
    }
    run_id = "ranks-of-one-run"
    expected = {_member_ids(run_id, "segment/1", "shard/0")}
    if fate.startswith("killed"):
        expected.add(_member_ids(run_id, "run", "shard/0"))
        expected.add(_member_ids(run_id, "segment/1", "rank/0/part/0"))
    assert missing == expected
    roots = collections.Counter(s.trace_id for s in spans if not s.parent_span_id)
    traces = {s.trace_id for s in spans}
    assert {t for t in traces if roots[t] == 0} == {trace for trace, _ in expected}
    assert max(roots.values()) == 1
