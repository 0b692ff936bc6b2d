"""Megatron-LM's span names, one trace across ranks and the logs signal, in a real two-rank
torchrun job on gloo against a real OTLP receiver."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap

from rank_jobs import torchrun_args
from support import child_env, gloo_or_unavailable

from otel_training.semconv import spans as names

JOB = textwrap.dedent(
    """
    import logging
    import torch
    import torch.distributed as dist
    import otel_training as ot
    from otel_training.semconv.attributes import MEGATRON_SKIPPED, MEGATRON_UPDATE_SUCCESSFUL

    dist.init_process_group("gloo")
    log = logging.getLogger("train")
    log.setLevel(logging.INFO)
    log.addHandler(ot.logging_handler())
    with ot.training_run():
        with ot.startup():
            with ot.model_init():
                weight = torch.ones(4)
            with ot.dataloader_init():
                pass
        with ot.checkpoint_load("/ckpt/start", iteration=0):
            with ot.checkpoint_load_stage("io_read"):
                pass
        for it in range(1, 5):
            with ot.training_iteration(iteration=it) as step:
                with ot.data_loading(iteration=it):
                    batch = torch.ones(4) * it
                with ot.forward_backward(iteration=it, num_microbatches=2):
                    for _ in range(2):
                        with ot.microbatch("forward"):
                            with ot.layer("forward", layer_number=1):
                                with ot.layer("self_attention", layer_number=1):
                                    pass
                                with ot.layer("mlp", layer_number=1):
                                    pass
                        with ot.microbatch("backward"):
                            pass
                    with ot.p2p("send_forward"), ot.p2p("recv_forward"):
                        pass
                    with ot.p2p("send_backward"), ot.p2p("recv_backward"):
                        pass
                    with ot.grad_sync("start"):
                        grad = batch.clone()
                        dist.all_reduce(grad)
                    with ot.grad_sync("finish"):
                        pass
                with ot.optimizer_step(iteration=it) as update:
                    with ot.activation_offload("offload"), ot.activation_offload("reload"):
                        pass
                    update.set_attribute(MEGATRON_UPDATE_SUCCESSFUL, True)
                step.set_attribute(MEGATRON_SKIPPED, False)
                if it == 3:
                    log.info("loss spike at iteration %d", it)
        with ot.evaluation(iteration=4):
            with ot.evaluation_step(eval_iteration=1):
                pass
        with ot.checkpoint_save("/ckpt/iter_4", iteration=4):
            for stage in ("state_dict", "io_write", "finalize"):
                with ot.checkpoint_save_stage(stage):
                    pass
    dist.barrier()
    dist.destroy_process_group()
    ot.shutdown()
    """
)


def _run(tmp_path, receiver, **env: str) -> None:
    gloo_or_unavailable()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    full_env = child_env({**receiver.env("grpc"), "OTEL_METRICS_EXPORTER": "none", **env})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *torchrun_args(tmp_path / "logs", str(script)),
        ],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


MEGATRON_NAMES = {
    names.MEGATRON_TRAIN, names.MEGATRON_STARTUP, names.MEGATRON_STARTUP_MODEL_INIT,
    names.MEGATRON_STARTUP_DATALOADER, names.MEGATRON_TRAIN_ITERATION,
    names.MEGATRON_TRAIN_ITERATION_FORWARD_BACKWARD, names.MEGATRON_TRAIN_ITERATION_OPTIMIZER,
    names.MEGATRON_CHECKPOINT_SAVE, names.MEGATRON_CHECKPOINT_SAVE_STATE_DICT,
    names.MEGATRON_CHECKPOINT_SAVE_IO_WRITE, names.MEGATRON_CHECKPOINT_SAVE_FINALIZE,
    names.MEGATRON_CHECKPOINT_LOAD, names.MEGATRON_CHECKPOINT_LOAD_IO_READ,
    names.MEGATRON_EVALUATE, names.MEGATRON_EVALUATE_STEP, names.MEGATRON_MICROBATCH_FORWARD,
    names.MEGATRON_MICROBATCH_BACKWARD, names.MEGATRON_LAYER_FORWARD,
    names.MEGATRON_LAYER_SELF_ATTENTION, names.MEGATRON_LAYER_MLP,
    names.MEGATRON_P2P_SEND_FORWARD, names.MEGATRON_P2P_RECV_FORWARD,
    names.MEGATRON_P2P_SEND_BACKWARD, names.MEGATRON_P2P_RECV_BACKWARD,
    names.MEGATRON_GRAD_SYNC_START, names.MEGATRON_GRAD_SYNC_FINISH,
    names.MEGATRON_ACTIVATION_OFFLOAD, names.MEGATRON_ACTIVATION_RELOAD,
    names.MEGATRON_TRAIN_FIRST_ITERATION,
}  # fmt: skip
# Ours, in Megatron-LM's scheme.
OUR_NAMES = {names.MEGATRON_TRAIN_SEGMENT, names.MEGATRON_TRAIN_ITERATION_DATA_LOADING}


def test_two_ranks_share_traces_by_segment_and_logs_carry_span_ids(tmp_path, otlp_receiver):
    """Two ranks on gloo, every span group on, segments of 2 iterations: every span name is
    Megatron-LM's (or ours in its scheme); both ranks' run spans share one trace, their segment
    spans, evaluation and save one job trace per segment, and each rank's iterations of a
    segment a step trace of its own that links to the rank's segment span; consecutive
    segments are linked; a log line inside an iteration arrives with that span's ids and the
    rank's resource."""
    _run(
        tmp_path,
        otlp_receiver,
        OTEL_PYTHON_TRAINING_SPAN_GROUPS="all",
        OTEL_PYTHON_TRAINING_TRACE_SEGMENT_ITERATIONS="2",
        OTEL_LOGS_EXPORTER="otlp",
    )
    spans = otlp_receiver.spans()
    assert {s.name for s in spans} == MEGATRON_NAMES | OUR_NAMES
    rank_of = {s.span_id: s.resource_attributes["dl.rank"] for s in spans}
    assert set(rank_of.values()) == {0, 1}
    assert len({s.resource_attributes["dl.run.id"] for s in spans}) == 1
    assert len(rank_of) == len(spans)  # ranks that seed alike still get distinct span ids

    runs = [s for s in spans if s.name == names.MEGATRON_TRAIN]
    assert len(runs) == 2 and len({s.trace_id for s in runs}) == 1
    keeper, other = sorted(runs, key=lambda s: rank_of[s.span_id])
    assert not keeper.parent_span_id and other.parent_span_id == keeper.span_id  # rank 0's root
    iterations = [s for s in spans if s.name == names.MEGATRON_TRAIN_ITERATION]
    by_segment = collections.defaultdict(set)
    for span in iterations:
        key = ((span.attributes["megatron.iteration"] - 1) // 2, rank_of[span.span_id])
        by_segment[key].add(span.trace_id)
    assert {key: len(ids) for key, ids in by_segment.items()} == {
        (segment, rank): 1 for segment in (0, 1) for rank in (0, 1)
    }
    assert len(set().union(*by_segment.values())) == 4  # a step trace per rank and segment
    steps = set().union(*by_segment.values())
    roots = [s for s in spans if s.name == names.MEGATRON_TRAIN_SEGMENT and s.trace_id in steps]
    assert len(roots) == 4 and {s.trace_id for s in roots} == steps  # each step trace's root
    segments = [
        s for s in spans if s.name == names.MEGATRON_TRAIN_SEGMENT and s.trace_id not in steps
    ]
    assert len(segments) == 4
    job = {}
    for segment in segments:
        job.setdefault(segment.attributes["otel_training.trace.segment"], set()).add(
            segment.trace_id
        )
    assert {number: len(ids) for number, ids in job.items()} == {0: 1, 1: 1}
    assert not set().union(*job.values()) & set().union(*by_segment.values())
    assert runs[0].trace_id not in set().union(*job.values(), *by_segment.values())
    for name in (names.MEGATRON_EVALUATE, names.MEGATRON_CHECKPOINT_SAVE):
        assert {s.trace_id for s in spans if s.name == name} == job[1], name
    for (number, rank), (trace,) in by_segment.items():
        (segment,) = [
            s
            for s in segments
            if rank_of[s.span_id] == rank and s.attributes["otel_training.trace.segment"] == number
        ]
        links = [link[:2] for s in spans if s.trace_id == trace for link in s.links]
        assert links == [(segment.trace_id, segment.span_id)]  # the step trace's root's
    for rank in (0, 1):
        first, second = sorted(
            (s for s in segments if rank_of[s.span_id] == rank),
            key=lambda s: s.attributes["otel_training.trace.segment"],
        )
        run = next(s for s in runs if rank_of[s.span_id] == rank)
        assert [link[1] for link in second.links] == [first.span_id, run.span_id]

    (record_rank0, record_rank1) = sorted(
        (r for r in otlp_receiver.logs() if "loss spike" in str(r.body)),
        key=lambda r: r.resource_attributes["dl.rank"],
    )
    for rank, record in ((0, record_rank0), (1, record_rank1)):
        (third,) = [
            s
            for s in iterations
            if rank_of[s.span_id] == rank and s.attributes["megatron.iteration"] == 3
        ]
        assert (record.trace_id, record.span_id) == (third.trace_id, third.span_id)
        assert record.resource_attributes["dl.world_size"] == 2


def test_megatron_variables_select_groups_and_the_exporting_rank(tmp_path, otlp_receiver):
    """MEGATRON_OTEL_SPAN_GROUPS=per_step and MEGATRON_OTEL_EXPORT_STRATEGY=single_rank, as
    in Megatron-LM: only the last rank exports, and only the per_step groups' spans."""
    _run(
        tmp_path,
        otlp_receiver,
        MEGATRON_OTEL_SPAN_GROUPS="per_step",
        MEGATRON_OTEL_EXPORT_STRATEGY="single_rank",
    )
    spans = otlp_receiver.spans()
    assert {s.resource_attributes["dl.rank"] for s in spans} == {1}
    per_step_only = {
        names.MEGATRON_MICROBATCH_FORWARD,
        names.MEGATRON_MICROBATCH_BACKWARD,
        names.MEGATRON_LAYER_FORWARD,
        names.MEGATRON_LAYER_SELF_ATTENTION,
        names.MEGATRON_LAYER_MLP,
        names.MEGATRON_ACTIVATION_OFFLOAD,
        names.MEGATRON_ACTIVATION_RELOAD,
    }
    assert {s.name for s in spans} == (MEGATRON_NAMES | OUR_NAMES) - per_step_only
