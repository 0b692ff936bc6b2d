"""Attempts of a job in real processes: real `torchrun --max-restarts=1` jobs on gloo whose
worker fails once, SLURM's requeue count, and reruns with no counter at all; each attempt's
files apart, `otel-training report` and `trace` showing every attempt in order, and export
policies that stay the same across a restart."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from otlp_receiver import free_port
from support import child_env, gloo_or_unavailable, import_or_unavailable

from otel_training.report import find_run_directory, load_job
from otel_training.report.rundir import newest_resource

WORKER = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    import otel_training as ot

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's store outlives an attempt: a prefix per attempt keeps gloo from meeting the
    # previous attempt's addresses there (otherwise the restart fails now and then).
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"attempt-{attempt}", store), rank=rank, world_size=world
    )
    fail_at = int(os.environ.get("FAIL_AT", "0"))
    telemetry = ot.configure()
    with ot.training_run():
        for it in range(1, 5):
            with ot.training_iteration(iteration=it):
                with ot.forward_backward(iteration=it):
                    grad = torch.ones(2) * it
                    dist.all_reduce(grad)
                with ot.optimizer_step(iteration=it):
                    pass
            ot.record_training_metrics(telemetry.meter, loss=1.0 / it, step_duration_ms=5.0)
            if attempt == 0 and it == fail_at and rank == 1:
                telemetry.shutdown()
                os._exit(3)  # the worker dies; torchrun restarts the whole group once
    dist.barrier()
    dist.destroy_process_group()
    telemetry.shutdown()
    """
)


RDZV_ID = "attempts-job"


def _torchrun(root: Path, nproc: int, *extra: str, **env: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=nproc`` of :data:`WORKER` with c10d rendezvous (id
    :data:`RDZV_ID`, the way multi-node jobs run: restarts meet in a new round) on 127.0.0.1,
    writing to ``root/out``."""
    import_or_unavailable("torch")
    gloo_or_unavailable()
    script = root / "worker.py"
    script.write_text(WORKER)
    full_env = child_env(
        {
            "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(root / "out"),
            "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
        },
        drop=("TORCHELASTIC_", "SLURM_", "MEGATRON_OTEL_", "NEMO_LENS_"),
        **env,
    )
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *extra,
        f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id={RDZV_ID}",
        f"--log-dir={root / 'logs'}",
        "--redirects=1",
        str(script),
    ]
    done = subprocess.run(
        argv, env=full_env, cwd=root, capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _run_dirs(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir() and not p.is_symlink())


def _resources(directory: Path) -> dict[int, dict]:
    """The resource of each rank's last metrics line in ``directory``."""
    found = {}
    for path in directory.glob("metrics-rank*.jsonl"):
        line = path.read_text().splitlines()[-1]
        pairs = json.loads(line)["resourceMetrics"][0]["resource"]["attributes"]
        resource = {p["key"]: next(iter(p["value"].values())) for p in pairs}
        found[int(resource["dl.rank"])] = resource
    return found


@pytest.fixture(scope="module")
def restarted(tmp_path_factory) -> Path:
    """A two-rank job whose rank 1 fails at iteration 2 of attempt 0; torchrun restarts it."""
    root = tmp_path_factory.mktemp("restart")
    _torchrun(root, 2, "--max-restarts=1", FAIL_AT="2")
    return root / "out"


def test_a_restart_writes_each_attempt_into_its_own_directory(restarted):
    """Two run directories, -a0 and -a1, each with both ranks' files; one dl.job.id, the
    attempt on the resource, four different service.instance.id, attempt 1 started later."""
    directories = _run_dirs(restarted)
    assert [d.name[-3:] for d in directories] == ["-a0", "-a1"]
    resources = [_resources(d) for d in directories]
    assert [sorted(r) for r in resources] == [[0, 1], [0, 1]]
    every = [r for by_rank in resources for r in by_rank.values()]
    assert {r["dl.job.id"] for r in every} == {RDZV_ID}
    assert [d.name for d in directories] == [f"{RDZV_ID}-a0", f"{RDZV_ID}-a1"]
    assert [{r["dl.run.attempt"] for r in by_rank.values()} for by_rank in resources] == [
        {"0"},
        {"1"},
    ]  # OTLP/JSON writes 64-bit integers as strings
    assert len({r["service.instance.id"] for r in every}) == 4
    first = max(r["process.creation.time"] for r in resources[0].values())
    second = min(r["process.creation.time"] for r in resources[1].values())
    assert first < second


def test_each_attempt_has_traces_of_its_own_shared_by_its_ranks(restarted):
    """The segment spans of both ranks of an attempt share their job trace; each rank's
    iterations are in a step trace of its own whose low 64 bits are the job trace's (one
    sampling decision); the two attempts' trace ids differ (derived from each attempt's run
    id)."""
    traces = []
    for directory in _run_dirs(restarted):
        ids = {}
        for rank in (0, 1):
            lines = (directory / f"spans-rank{rank}.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines]
            for name in ("megatron.train.segment", "megatron.train.iteration"):
                ids[rank, name] = {r["trace_id"] for r in records if r.get("name") == name}
        (step0,), (step1,) = ids[0, "megatron.train.iteration"], ids[1, "megatron.train.iteration"]
        # A rank's segment spans: its span in the job trace, and the root of its step trace.
        (job,) = ids[0, "megatron.train.segment"] - {step0}
        assert ids[1, "megatron.train.segment"] - {step1} == {job}
        assert len({job, step0, step1}) == 3
        assert step0[16:] == step1[16:] == job[16:]
        traces.append({job, step0, step1})
    assert not traces[0] & traces[1]


@pytest.mark.parametrize("given", ["output", "first attempt"])
def test_report_and_trace_show_every_attempt_in_order(restarted, tmp_path, given, run_python):
    """Given the output directory or the first attempt's directory, `report` and `trace` show
    both attempts, labelled attempt 0 then attempt 1, not merged."""
    import_or_unavailable("plotly")
    directory = restarted if given == "output" else _run_dirs(restarted)[0]
    job = load_job(find_run_directory(directory))
    assert job.labels == ["attempt 0", "attempt 1"] and job.ordered_by == "attempt"
    assert [sorted(r.ranks) for r in job.runs] == [[0, 1], [0, 1]]
    trace = run_python(
        module="otel_training.cli", args=("trace", str(directory), "-o", str(tmp_path / "t.json"))
    )
    assert trace.returncode == 0, trace.stderr
    assert "2 attempts" in trace.stdout and "attempt 0, attempt 1" in trace.stderr
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    order = sorted(
        (e["args"]["sort_index"], names[e["pid"]])
        for e in events
        if e["name"] == "process_sort_index"
    )
    assert [name for _, name in order] == [
        "attempt 0 · rank 0",
        "attempt 0 · rank 1",
        "attempt 1 · rank 0",
        "attempt 1 · rank 1",
    ]
    report = run_python(
        module="otel_training.cli",
        args=("report", str(directory), "-o", str(tmp_path / "r.html")),
        timeout_s=120,
    )
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.html").read_text()
    assert page.index('id="a1-summary"') < page.index('id="a2-summary"')
    assert re.search(r"attempt 0 · <span class=\"id\">[^<]*-a0</span>", page)
    assert re.search(r"attempt 1 · <span class=\"id\">[^<]*-a1</span>", page)


def test_sampling_exports_from_the_same_single_rank_in_every_attempt(tmp_path):
    """Four ranks, Megatron-LM's sampled strategy at 1 % (no rank's md5 score is below it):
    exactly one rank exports, the same one in both attempts; the three others say so naming
    Megatron-LM's variables, not ours."""
    done = _torchrun(
        tmp_path,
        4,
        "--max-restarts=1",
        FAIL_AT="2",
        MEGATRON_OTEL_EXPORT_STRATEGY="sampled",
        MEGATRON_OTEL_EXPORT_SAMPLE_RATE="0.01",
        OTEL_PYTHON_TRAINING_PRINT_ALL_RANKS="true",  # each silent rank's own line
    )
    exported = [sorted(_resources(d)) for d in _run_dirs(tmp_path / "out")]
    assert len(exported) == 2 and exported[0] == exported[1] and len(exported[0]) == 1
    said = [
        line
        for line in done.stderr.splitlines()
        if "telemetry: none from rank" in line
        and "MEGATRON_OTEL_EXPORT_STRATEGY=sampled, MEGATRON_OTEL_EXPORT_SAMPLE_RATE=0.01" in line
    ]
    assert len(said) == 3 * 2  # three ranks, two attempts
    assert "OTEL_PYTHON_TRAINING_EXPORT_RANKS" not in done.stderr


def test_a_policy_that_selects_no_rank_says_so_once_on_every_rank(tmp_path):
    """EXPORT_RANKS=5 in a world of 2: each rank warns once, naming the variable; no file."""
    done = _torchrun(tmp_path, 2, OTEL_PYTHON_TRAINING_EXPORT_RANKS="5")
    said = [line for line in done.stderr.splitlines() if "no rank of this job exports" in line]
    assert len(said) == 2 and all("OTEL_PYTHON_TRAINING_EXPORT_RANKS=5" in s for s in said)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.jsonl"))


_PLAIN = (
    "import otel_training as ot\n"
    "t = ot.configure()\n"
    "with ot.training_run():\n"
    "    for it in (1, 2):\n"
    "        with ot.training_iteration(iteration=it):\n"
    "            pass\n"
    "t.shutdown()\n"
)


def test_slurm_requeues_are_ordered_by_their_count(tmp_path, run_python):
    """Two processes of one SLURM job, requeue 1 run before requeue 0: two directories, shown
    as attempt 0 then attempt 1 (the count decides, not the start time)."""
    slurm = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path / "out"),
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
    }
    for count in ("1", "0"):
        done = run_python(_PLAIN, env={**slurm, "SLURM_RESTART_COUNT": count})
        assert done.returncode == 0, done.stderr
    assert [d.name for d in _run_dirs(tmp_path / "out")] == [
        "slurm-4242.0-a0",
        "slurm-4242.0-a1",
    ]
    job = load_job(find_run_directory(tmp_path / "out"))
    assert job.job_id == "4242" and job.labels == ["attempt 0", "attempt 1"]
    assert job.runs[0].created_s > job.runs[1].created_s  # requeue 0 ran second


def test_reruns_without_a_counter_are_ordered_by_process_start(tmp_path, run_python):
    """Two processes given the same run id and no restart counter share one directory; the
    report tells them apart (service.instance.id) and orders them by process.creation.time."""
    env = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path / "out"),
        "OTEL_PYTHON_TRAINING_RUN_ID": "exp-1",
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
    }
    for _ in range(2):
        done = run_python(_PLAIN, env=env)
        assert done.returncode == 0, done.stderr
    (directory,) = _run_dirs(tmp_path / "out")
    assert directory.name == "exp-1" and newest_resource(directory)["dl.job.id"] == "exp-1"
    job = load_job(directory)
    assert job.ordered_by == "process.creation.time"
    assert job.labels == ["run 1 of 2", "run 2 of 2"]
    assert job.runs[0].created_s < job.runs[1].created_s
    iterations = [[s for s in r.spans if s.name == "megatron.train.iteration"] for r in job.runs]
    assert [len(spans) for spans in iterations] == [2, 2]


def _shift_spans(source: Path, target: Path, rank: int, shift_ns: int) -> None:
    """A copy of the run directory ``source`` at ``target`` with every time stamp of
    ``rank``'s span lines moved by ``shift_ns`` (as a host whose clock is off writes them)."""
    shutil.copytree(source, target)
    path = target / f"spans-rank{rank}.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        for key in ("start_time_ns", "end_time_ns"):
            if record.get(key) is not None:
                record[key] += shift_ns
        for event in record.get("events") or ():
            event["time_ns"] += shift_ns
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")


def test_a_rank_whose_clock_is_off_is_named_in_a_real_jobs_files(restarted, tmp_path):
    """The real two-rank job (an all-reduce each iteration): its ranks' clocks agree; with
    rank 1's span stamps moved 300 ms later, rank 1 is named, 300 ms ahead of rank 0."""
    directory = _run_dirs(restarted)[1]
    assert load_job(directory).latest.clock_offsets == []
    _shift_spans(directory, tmp_path / directory.name, 1, 300_000_000)
    (offset,) = load_job(tmp_path / directory.name).latest.clock_offsets
    assert (offset.rank, offset.reference) == (1, 0)
    assert offset.offset_ms == pytest.approx(300, abs=20)
