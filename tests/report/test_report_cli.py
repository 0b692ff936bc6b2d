"""The report and trace subcommands of the otel-training command; every command (report, trace,
health) reads each file of a job once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from doc_rules import documents  # noqa: E402
from health_sim import job_resource, simulated, write_process  # noqa: E402
from report_files import key_value, span_lines, write_lines, write_real_metrics  # noqa: E402

from otel_training import cli  # noqa: E402
from otel_training.semconv.spans import MEGATRON_TRAIN  # noqa: E402

T0 = 1_796_000_000 * 10**9


@pytest.fixture
def run_dir(tmp_path):
    """An output directory holding one run directory (the embedded default's layout)."""
    directory = tmp_path / "out" / "run-1"
    directory.mkdir(parents=True)
    write_real_metrics(
        directory / "metrics-rank0.jsonl", [{"step_duration_ms": [50.0, 60.0], "loss": 2.0}] * 3
    )
    write_lines(
        directory / "spans-rank0.jsonl", span_lines(MEGATRON_TRAIN, "1" * 16, None, T0, T0 + 10**9)
    )
    return directory


def test_report_writes_the_page_and_says_where(run_dir, tmp_path, capsys):
    """``report DIR --output FILE``: exit 0, the absolute path and a file:// URL printed."""
    output = tmp_path / "r.html"
    assert cli.main(["report", str(run_dir.parent), "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert str(output.absolute()) in out and output.absolute().as_uri() in out
    assert output.read_text().startswith("<!DOCTYPE html>")


def test_trace_writes_the_trace_and_says_how_to_open_it(run_dir, tmp_path, capsys):
    """``trace DIR --output FILE``: exit 0, a trace-event file, Perfetto named."""
    output = tmp_path / "t.json"
    assert cli.main(["trace", str(run_dir), "-o", str(output)]) == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out
    events = json.loads(output.read_text())["traceEvents"]
    assert [e["name"] for e in events if e["ph"] == "X"] == [MEGATRON_TRAIN]


def test_the_default_directory_is_the_environment_output_dir(
    run_dir, tmp_path, monkeypatch, capsys
):
    """Without DIR, OTEL_PYTHON_TRAINING_OUTPUT_DIR is read (its newest run)."""
    monkeypatch.setenv("OTEL_PYTHON_TRAINING_OUTPUT_DIR", str(run_dir.parent))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["trace"]) == 0
    assert (tmp_path / "trace.json").is_file()


@pytest.mark.parametrize("command", ["report", "trace"])
def test_no_run_is_exit_2_with_one_line(command, tmp_path, capsys):
    """No run found: exit status 2 and one line on stderr, no traceback."""
    assert cli.main([command, str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run found" in err and "Traceback" not in err


def test_notes_go_to_stderr(run_dir, tmp_path, capsys):
    """Notes on the files (here: a torn last line) are printed on stderr, the run still reported."""
    with open(run_dir / "metrics-rank0.jsonl", "a") as handle:
        handle.write('{"resourceMetrics": [')
    assert cli.main(["trace", str(run_dir), "-o", str(tmp_path / "t.json")]) == 0
    assert "note: metrics-rank0.jsonl: the last line is cut" in capsys.readouterr().err


def test_trace_needs_neither_torch_nor_plotly(run_dir, tmp_path):
    """The trace command imports neither torch nor plotly (nor jinja2)."""
    code = (
        "import sys; from otel_training import cli; "
        f"status = cli.main(['trace', {str(run_dir)!r}, '-o', {str(tmp_path / 't.json')!r}]); "
        "print(sorted(m for m in ('torch', 'plotly', 'jinja2') if m in sys.modules), status)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[] 0"


def test_notes_and_paths_reach_the_terminal_as_text(tmp_path, capsys):
    """A span name with a terminal escape sequence, a direction override and 5,000 characters,
    in a directory whose name has an undecodable byte: the note on stderr shows them escaped
    and cut, stdout names the directory with the byte as \\xff; nothing raises."""
    import os

    from report_files import span_record

    directory = tmp_path / os.fsdecode(b"run-\xff-\x1b[31mred")
    directory.mkdir()
    name = "\x1b]0;pwned\x07 \u202eevil " + "x" * 5_000
    write_lines(
        directory / "spans-rank0.jsonl", [span_record("span_start", name, "1" * 16, None, T0)]
    )
    assert cli.main(["report", str(directory), "-o", str(tmp_path / "r.html")]) == 0
    captured = capsys.readouterr()
    note = next(line for line in captured.err.splitlines() if "never ended" in line)
    assert "\\x1b]0;pwned\\x07 \\u202eevil xxx" in note and "\x1b" not in captured.err
    assert len(note) <= 1_000 and "more characters]" in note
    assert "run-\\xff-\\x1b[31mred" in captured.out and "\x1b" not in captured.out


#: A child that counts, through Python's audit hook (every ``open``, whoever calls it), how often
#: each file of the job is opened while one command runs; prints the counts as JSON.
_COUNT_OPENS = """
import collections, json, os, sys
from pathlib import Path
root, argv = Path(sys.argv[1]), sys.argv[2:]
opens = collections.Counter()
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = Path(os.fsdecode(args[0]))
        if path.is_relative_to(root) and "-rank" in path.name:
            opens[str(path.relative_to(root))] += 1
sys.addaudithook(hook)
from otel_training import cli
status = cli.main(argv)
print(json.dumps({"status": status, "opens": opens}))
"""


def _killed_job(out: Path) -> None:
    """Job "job" in two run directories of two ranks each: attempt 0 killed inside a step (its
    span lines end with an open span, so its OTLP traces are read too), attempt 1 complete;
    every file the embedded default writes (metrics, spans, traces, logs)."""
    for attempt in (0, 1):
        directory = out / f"run-a{attempt}"
        for rank in (0, 1):
            created = f"2027-01-15T08:0{attempt}:00.000Z"
            attrs = job_resource(rank, attempt, created, f"run-a{attempt}", "job")
            sim = simulated(1_800_000_000.0 + 60 * attempt)
            if attempt == 0:
                sim.begin_step(0.5)
            write_process(directory, sim, attrs)
            span = {
                "traceId": "cd" * 16, "spanId": f"{rank + 1:016x}", "name": "megatron.evaluate",
                "kind": 1, "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 10**6),
            }  # fmt: skip
            document = {"resourceSpans": [{
                "resource": {"attributes": [key_value(k, v) for k, v in attrs.items()]},
                "scopeSpans": [{"scope": {"name": "otel_training"}, "spans": [span]}],
            }]}  # fmt: skip
            write_lines(directory / f"traces-rank{rank}.jsonl", [json.dumps(document)])
            write_lines(directory / f"logs-rank{rank}.jsonl", ['{"resourceLogs": []}'])


@pytest.mark.slow
@documents("report.md", "each open and decode every file of the job once")
@pytest.mark.parametrize("command", ["report", "trace", "health"])
def test_each_file_of_the_job_is_read_once_per_command(command, tmp_path):
    """report, trace and health on a 2-attempt job in two run directories: each file of the
    job is opened once (counted by an audit hook, whatever opens it), traces of complete span
    lines and (for health) logs not at all; only finding the job's other directory opens one
    file of it once more (to read its last line)."""
    out = tmp_path / "out"
    _killed_job(out)
    argv = [command, str(out)] + (
        ["--json"] if command == "health" else ["-o", str(tmp_path / "x")]
    )
    result = subprocess.run(
        [sys.executable, "-c", _COUNT_OPENS, str(out), *argv],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["status"] == 0
    expected = {}
    for directory in ("run-a0", "run-a1"):
        for rank in (0, 1):
            expected[f"{directory}/metrics-rank{rank}.jsonl"] = 1
            expected[f"{directory}/spans-rank{rank}.jsonl"] = 1
            expected[f"{directory}/traces-rank{rank}.jsonl"] = 1 if directory == "run-a0" else 0
            expected[f"{directory}/logs-rank{rank}.jsonl"] = 0 if command == "health" else 1
    opens = found["opens"]
    extra = {
        name: opens.get(name, 0) - count
        for name, count in expected.items()
        if opens.get(name, 0) != count
    }
    assert set(opens) <= set(expected)
    assert len(extra) == 1, extra  # run-a1 is shown; run-a0 is found by its newest span line
    ((name, more),) = extra.items()
    assert name.startswith("run-a0/spans-rank") and more == 1


@pytest.mark.slow
def test_python_dash_m_runs_the_command_and_a_closed_pipe_ends_quietly(run_dir):
    """`python -m otel_training health DIR` is the command; with its reader gone before it
    writes (`... | head -0`), it ends with status 1 and nothing on stderr (no BrokenPipeError
    traceback, no "Exception ignored" at exit)."""
    result = subprocess.run(
        [sys.executable, "-m", "otel_training", "health", str(run_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(("Healthy: ", "Attention: ", "Problem: ", "Unknown: "))
    child = subprocess.Popen(
        [sys.executable, "-m", "otel_training", "health", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child.stdout.close()  # the reader is gone before the first write
    stderr = child.stderr.read().decode()
    child.stderr.close()
    assert child.wait(120) == 1 and stderr == ""
