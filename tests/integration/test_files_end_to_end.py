"""The embedded default's files when their world changes mid-run, in real processes: the run
directory removed, replaced by a file, a file size limit (RLIMIT_FSIZE), a full tmpfs (ENOSPC)
and a file system remounted read-only (EROFS). Each time: one warning naming the path and the
variable, writing resumes, the loss is what was written meanwhile and is said, and
`otel-training report` notes the gap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import support
from support import program_or_unavailable, unavailable

from otel_training.report import find_run_directory, load_job

CHILD = r"""
import json, logging, os, resource, shutil, subprocess, sys
import otel_training as ot

mode, copy_to = sys.argv[1], sys.argv[2]
telemetry = ot.configure()
log = logging.getLogger("train")
log.setLevel(logging.INFO)
log.addHandler(ot.logging_handler())
out = os.environ["OTEL_PYTHON_TRAINING_OUTPUT_DIR"]


def phase(first, pad=0):
    for it in (first, first + 1):
        with ot.training_iteration(iteration=it):
            pass
        ot.record_training_metrics(telemetry.meter, loss=1.0 / it, step_duration_ms=5.0)
        log.info("iteration %d%s", it, "x" * pad)
    telemetry.force_flush()


phase(1)
run_dir = telemetry.output_dir
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
filler = os.path.join(out, "filler")
if mode in ("removed", "file"):
    shutil.rmtree(run_dir)
    if mode == "file":
        with open(run_dir, "w") as handle:
            handle.write("a file where the run directory was\n")
elif mode == "fsize":
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
elif mode == "full":
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"x" * 65536)
                handle.flush()
        except OSError:
            pass
elif mode == "readonly":  # the output directory read-only, the run directory gone
    shutil.rmtree(run_dir)
    os.chmod(out, 0o555)
elif mode == "chmod":  # everything read-only: the open files are still written
    for path in [run_dir, *(os.path.join(run_dir, n) for n in os.listdir(run_dir))]:
        os.chmod(path, 0o555 if path == run_dir else 0o444)
# On a full tmpfs the last page of each file still has room: lines longer than a page fail.
phase(3, pad=8192 if mode == "full" else 0)
if mode == "file":
    os.remove(run_dir)
elif mode == "fsize":
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
elif mode == "full":
    os.remove(filler)
elif mode == "readonly":
    os.chmod(out, 0o755)
phase(5)
telemetry.shutdown()
if copy_to != "-":
    shutil.copytree(out, copy_to, symlinks=True)
"""

TMPFS = ("full",)
#: Modes that need file permissions to hold: root drops its capability to override them.
PERMISSIONS = ("readonly", "chmod")


def _tmpfs_wrapper(out: Path) -> list[str]:
    """``unshare`` into a mount namespace of our own with a 1 MiB tmpfs at ``out``."""
    unshare = program_or_unavailable("unshare", install="util-linux; for a private tmpfs")
    probe = subprocess.run(
        [unshare, "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {out} && echo ok"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.stdout.strip() != "ok":
        unavailable(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.strip()}")
    return [unshare, "-rm", "sh", "-c", f'mount -t tmpfs -o size=1m tmpfs {out} && exec "$@"', "-"]


def _as_owner_only() -> list[str]:
    """A prefix that runs the child without the capabilities that let root ignore file
    permissions (as root; empty for anyone else, whom permissions bind already)."""
    if os.geteuid() != 0:
        return []
    setpriv = program_or_unavailable("setpriv", install="util-linux; else root ignores permissions")
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]


def _run(tmp_path: Path, mode: str, run_python_env: dict[str, str]) -> tuple[Path, str]:
    out = tmp_path / "out"
    out.mkdir()
    copy = tmp_path / "copy"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    prefix = _tmpfs_wrapper(out) if mode in TMPFS else []
    owner = _as_owner_only() if mode in PERMISSIONS else []
    argv = [*prefix, *owner, sys.executable, str(script), mode, str(copy) if prefix else "-"]
    env = {
        **run_python_env,
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out),
        "OTEL_PYTHON_TRAINING_RUN_ID": f"files-{mode}",
        "OTEL_PYTHON_TRAINING_SPAN_GROUPS": "per_step",
    }
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return (copy if prefix else out), done.stderr


@pytest.fixture
def child_env(repo_root) -> dict[str, str]:
    return support.child_env(drop=("SLURM_", "RANK"))


def _iterations(run_dir: Path) -> list[int]:
    """The iterations whose span_end line is whole (a line cut where the disk filled stays
    cut, and the report's reader skips it)."""
    records = []
    for line in (run_dir / "spans-rank0.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return sorted(
        r["attributes"]["megatron.iteration"]
        for r in records
        if r["record"] == "span_end" and r["name"] == "megatron.train.iteration"
    )


def _gaps(run_dir: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for line in (run_dir / "gaps-rank0.jsonl").read_text().splitlines():
        record = json.loads(line)
        found.setdefault(record["file"], []).append(record)
    return found


FILES = ("metrics-rank0.jsonl", "traces-rank0.jsonl", "spans-rank0.jsonl", "logs-rank0.jsonl")


def test_a_removed_run_directory_is_recreated_with_one_warning(tmp_path, child_env):
    """rm -rf of the run directory mid-run: one warning naming it and the variable; all four
    files are written again in the recreated directory (iterations 3-6), each file's gap
    record counts the lines that went with it, and the report says so."""
    out, stderr = _run(tmp_path, "removed", child_env)
    run_dir = out / "files-removed"
    said = [line for line in stderr.splitlines() if "was removed" in line]
    assert len(said) == 1, stderr
    assert str(run_dir) in said[0] and f"OTEL_PYTHON_TRAINING_OUTPUT_DIR={out}" in said[0]
    assert _iterations(run_dir) == [3, 4, 5, 6]
    logs = (run_dir / "logs-rank0.jsonl").read_text()
    assert "iteration 6" in logs and "iteration 1" not in logs
    gaps = _gaps(run_dir)
    assert sorted(gaps) == sorted(FILES)
    assert all(g[0]["gone_lines"] >= 1 and g[0]["lost_lines"] == 0 for g in gaps.values())
    job = load_job(find_run_directory(out))
    assert sum("was removed" in note for note in job.latest.notes) == 4


def test_a_read_only_run_directory_keeps_its_open_files_written(tmp_path, child_env):
    """chmod a-w of the run directory and its files mid-run: the files stay open for writing,
    nothing is lost and nothing is said."""
    out, stderr = _run(tmp_path, "chmod", child_env)
    assert _iterations(out / "files-chmod") == [1, 2, 3, 4, 5, 6]
    assert "otel-training cannot write" not in stderr and "was removed" not in stderr
    assert not (out / "files-chmod" / "gaps-rank0.jsonl").exists()


@pytest.mark.parametrize("mode", ["fsize", "readonly", "file"])
def test_writes_that_fail_lose_only_what_was_written_meanwhile(tmp_path, child_env, mode):
    """A file size limit (EFBIG), the run directory removed under a read-only output directory
    (EACCES) or replaced by a file: one warning naming the path and the variable when writing
    starts to fail; writing resumes after; what is lost is the middle phase only (iterations
    3-4), counted per file in lines (spans and log records exactly), and the report notes
    it."""
    out, stderr = _run(tmp_path, mode, child_env)
    run_dir = out / f"files-{mode}"
    failing = [line for line in stderr.splitlines() if "otel-training cannot write" in line]
    assert len(failing) == 1, stderr
    assert str(run_dir) in failing[0] and f"OTEL_PYTHON_TRAINING_OUTPUT_DIR={out}" in failing[0]
    reason = {"fsize": "EFBIG", "readonly": "EACCES", "file": "E"}[mode]
    assert f"({reason}" in failing[0]
    resumed = [line for line in stderr.splitlines() if "writes again to" in line]
    assert {Path(line.split("writes again to ")[1].split(":")[0]).name for line in resumed} == set(
        FILES
    )
    removed_first = mode in ("readonly", "file")  # phase 1 went with the directory
    assert _iterations(run_dir) == ([5, 6] if removed_first else [1, 2, 5, 6])
    gaps = _gaps(run_dir)
    lost = {name: sum(g["lost_lines"] for g in records) for name, records in gaps.items()}
    assert set(lost) == set(FILES) and all(count >= 1 for count in lost.values())
    records = {name: sum(g["lost_records"] for g in found) for name, found in gaps.items()}
    assert records["traces-rank0.jsonl"] == 2 and records["logs-rank0.jsonl"] == 2
    if removed_first:
        assert all(sum(g["gone_lines"] for g in found) >= 1 for found in gaps.values())
    notes = load_job(find_run_directory(out)).latest.notes
    assert sum("could not be written between" in note for note in notes) == 4


def test_a_full_disk_drops_what_does_not_fit_and_resumes(tmp_path, child_env):
    """A real 1 MiB tmpfs filled up mid-run (ENOSPC), then freed: one warning naming the path
    and the variable; the logs and metrics that did not fit are counted as lost (the 2 log
    records exactly), writing resumes (iterations 5-6 on disk), the report notes each gap."""
    out, stderr = _run(tmp_path, "full", child_env)
    run_dir = out / "files-full"
    written = tmp_path / "out"  # where the process wrote (out is a copy of the tmpfs there)
    failing = [line for line in stderr.splitlines() if "otel-training cannot write" in line]
    assert len(failing) == 1, stderr
    assert str(written / "files-full") in failing[0] and "(ENOSPC" in failing[0]
    assert f"OTEL_PYTHON_TRAINING_OUTPUT_DIR={written}" in failing[0]
    assert {5, 6} <= set(_iterations(run_dir))
    gaps = _gaps(run_dir)
    assert sum(g["lost_records"] for g in gaps["logs-rank0.jsonl"]) == 2
    assert sum(g["lost_lines"] for g in gaps["metrics-rank0.jsonl"]) >= 1
    whole = []  # a line cut where the disk filled stays cut (the reader skips it)
    for line in (run_dir / "logs-rank0.jsonl").read_text().splitlines():
        try:
            whole.append(json.dumps(json.loads(line)))
        except ValueError:
            pass
    assert any("iteration 5" in line for line in whole)
    assert not any("iteration 3" in line for line in whole)
    notes = load_job(find_run_directory(out)).latest.notes
    assert sum("could not be written between" in note for note in notes) == len(gaps)
