"""report.attempts: job, attempt and process of a resource by otel-training's names and by
Megatron-LM's (megatron/training/global_vars.py, build_telemetry_resource_attrs)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from report_files import resource_attributes, span_record, write_lines

from otel_training.config.identity import attempt_run_id
from otel_training.pipeline.resource import iso8601
from otel_training.report import load_job
from otel_training.report.attempts import creation_unix_s, identity_of, job_key

MS = 1_000_000
T0 = 1_800_000_000_000_000_000


def test_ours_first():
    """dl.job.id, dl.run.id, dl.run.attempt, service.instance.id, process.creation.time."""
    identity = identity_of(
        {
            "dl.job.id": "j",
            "dl.run.id": "j-a2",
            "dl.run.attempt": 2,
            "service.instance.id": "j-a2-rank0-0badf00d",
            "process.creation.time": "2026-12-01T09:11:43.120Z",
            "nemo.lens.job_uuid": "ignored",
            "nvrx.cycle": "7",
        }
    )
    assert (identity.job_id, identity.run_id, identity.attempt, identity.order) == (
        "j",
        "j-a2",
        2,
        (2,),
    )
    assert identity.instance == "j-a2-rank0-0badf00d"
    expected = datetime(2026, 12, 1, 9, 11, 43, 120000, tzinfo=timezone.utc).timestamp()
    assert identity.created_s == pytest.approx(expected)


@pytest.mark.parametrize(
    ("resource", "job", "run", "attempt", "order"),
    [
        # A requeued SLURM job under torchrun: Megatron-LM's uuids and both counters.
        (
            {"nemo.lens.job_uuid": "J", "nemo.lens.run_uuid": "R", "slurm.job.id": "77",
             "slurm.restart_count": "1", "slurm.torchelastic.restart_count": "0"},
            "J", "R", None, (1, 0),
        ),
        # An array element without the uuids: {array}_{task}, as squeue writes it.
        (
            {"slurm.job.id": "105", "slurm.array.job_id": "100", "slurm.array.task_id": "5",
             "nemo.run.id": "105", "slurm.restart_count": "3"},
            "100_5", "105", 3, (3, 0),
        ),
        # NVRx's cycle wins over the counters.
        (
            {"slurm.job.id": "9", "nvrx.cycle": "4", "slurm.torchelastic.restart_count": "1"},
            "9", None, 4, (4,),
        ),
        # Nothing that counts.
        ({"slurm.job.id": "9", "process.creation.time": "not a time"}, "9", None, None, None),
    ],
)  # fmt: skip
def test_megatron_names(resource, job, run, attempt, order):
    """Megatron-LM's wire names give the job, the attempt's run and its order."""
    identity = identity_of(resource)
    assert (identity.job_id, identity.run_id, identity.attempt, identity.order) == (
        job,
        run,
        attempt,
        order,
    )


def test_creation_time_tolerates_what_is_not_a_time():
    """ISO 8601 with Z or an offset parses; anything else is None."""
    assert creation_unix_s("1970-01-01T00:00:01.500Z") == 1.5
    assert creation_unix_s("1970-01-01T01:00:01+01:00") == 1.0
    assert creation_unix_s(None) is None and creation_unix_s("yesterday") is None


@pytest.mark.parametrize("unix_s", [0.0, 1.5, 1_800_000_000.123, 4_102_444_799.999])
def test_creation_time_reads_what_the_resource_writes(unix_s):
    """The parser is the inverse of resource.iso8601 (to its milliseconds)."""
    assert creation_unix_s(iso8601(unix_s)) == pytest.approx(unix_s, abs=5e-4)


@pytest.mark.parametrize(
    "resource, job",
    [
        ({"dl.job.id": "j", "dl.run.id": attempt_run_id("r", 3)}, "j"),
        ({"dl.run.id": attempt_run_id("r", 3)}, "r"),
        ({"dl.run.id": attempt_run_id("r-a1", 12)}, "r-a1"),  # only the last suffix
        ({"dl.run.id": "r"}, "r"),
        ({"slurm.job.id": "4242", "dl.run.id": "r-a0"}, "4242"),  # Megatron-LM's, as the report
        ({"service.instance.id": "x"}, None),
    ],
)
def test_the_job_of_a_resource(resource, job):
    """job_key: the job id identity_of reads, else the run id without the suffix that
    identity.attempt_run_id appends."""
    assert job_key(resource) == job


def _megatron_run(rank: int, run_uuid: str, requeues: int, restarts: int, start_ns: int) -> str:
    resource = {
        key: value
        for key, value in resource_attributes(rank, 1, run_uuid).items()
        if not key.startswith("dl.run") and key != "service.instance.id"
    }
    resource.update(
        {
            "nemo.lens.job_uuid": "job-uuid",
            "nemo.lens.run_uuid": run_uuid,
            "slurm.restart_count": str(requeues),
            "slurm.torchelastic.restart_count": str(restarts),
        }
    )
    line = span_record(
        "span_end", "megatron.train", run_uuid[:16].ljust(16, "0"), None, start_ns,
        start_ns + 10 * MS, rank=rank, world_size=1, run_id=run_uuid,
    )  # fmt: skip
    record = json.loads(line)
    record["resource"] = resource
    return json.dumps(record)


def test_megatron_attempts_in_one_directory_are_ordered_by_requeue_then_restart(tmp_path):
    """Three incarnations of one Megatron-LM job in one set of files, written out of order:
    shown as three attempts ordered (0, 1), (1, 0), (1, 1), each labelled by its counters."""
    write_lines(
        tmp_path / "spans-rank0.jsonl",
        [
            _megatron_run(0, "run-c", 1, 1, T0 + 3000 * MS),
            _megatron_run(0, "run-a", 0, 1, T0 + 1000 * MS),
            _megatron_run(0, "run-b", 1, 0, T0 + 2000 * MS),
        ],
    )
    job = load_job(tmp_path)
    assert job.job_id == "job-uuid" and job.ordered_by == "attempt"
    assert [r.run_id for r in job.runs] == ["run-a", "run-b", "run-c"]
    assert job.labels == [
        "requeue 0, restart 1",
        "requeue 1, restart 0",
        "requeue 1, restart 1",
    ]
