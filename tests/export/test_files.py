"""The embedded default's files: a directory per run, no symlink followed, no torn line
glued to."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

import otel_training as ot
from otel_training import configuration as setup
from otel_training.export import files


def test_run_directory_names_are_safe_and_latest_points_at_the_newest(tmp_path):
    """Odd run ids give a safe name; latest follows the newest run."""
    assert files.run_directory_name("slurm-123.4") == "slurm-123.4"
    assert files.run_directory_name("../../etc") == "_.._etc"
    assert files.run_directory_name("a/b\udcff c") == "a_b__c"
    assert files.run_directory_name("..") == "run"
    assert files.run_directory_name("X.run.X") == "X.run.X"
    out = tmp_path / "out"  # not the working directory: latest is made next to the runs
    first = files.run_directory(str(out), "run-a")
    second = files.run_directory(str(out), "run-b")
    assert os.readlink(out / "latest") == "run-b"
    assert Path(first).is_dir() and (out / "latest").resolve() == Path(second)
    assert sorted(p.name for p in out.iterdir()) == ["latest", "run-a", "run-b"]
    assert not (tmp_path / "latest").exists()


def test_open_append_never_follows_a_planted_symlink(tmp_path):
    """A symlink at the file's path is refused: its target is not touched."""
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / "metrics-rank0.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        files.open_append(str(tmp_path / "metrics-rank0.jsonl"))
    assert target.read_text() == "precious\n"


def test_a_planted_symlink_warns_and_falls_back(tmp_path, monkeypatch, caplog):
    """configure() with a symlink planted at this run's metrics file: one warning naming it,
    the default directory is used instead, the symlink's target stays untouched."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "chosen"
    target = tmp_path / "victim"
    target.write_text("precious\n")
    env = {"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(out), "OTEL_PYTHON_TRAINING_RUN_ID": "r1"}
    (out / "r1").mkdir(parents=True)
    (out / "r1" / "metrics-rank0.jsonl").symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        telemetry = setup.configure(environ=env)
    ot.record_training_metrics(telemetry.meter, loss=1.0)
    assert telemetry.shutdown()
    assert target.read_text() == "precious\n"
    warnings = [r.getMessage() for r in caplog.records if "a symlink is there" in r.getMessage()]
    assert len(warnings) == 1 and "metrics-rank0.jsonl" in warnings[0]
    fallback = tmp_path / "otel-training-telemetry" / "r1" / "metrics-rank0.jsonl"
    assert json.loads(fallback.read_text().splitlines()[-1])["resourceMetrics"]


def test_a_torn_last_line_is_not_glued_to(tmp_path):
    """A run appending to a file a killed run left mid-line starts on a fresh line: the torn
    tail stays alone and every new line parses."""
    env = {
        "OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path),
        "OTEL_PYTHON_TRAINING_RUN_ID": "resumed",
        "OTEL_METRICS_EXPORTER": "otlp_json_file",
    }
    run = tmp_path / "resumed"
    run.mkdir()
    for name in ("metrics-rank0.jsonl", "traces-rank0.jsonl", "spans-rank0.jsonl"):
        (run / name).write_text('{"complete": 1}\n{"torn": "mid-li')
    telemetry = setup.configure(environ=env)
    ot.record_training_metrics(telemetry.meter, loss=1.0)
    with ot.training_run():
        pass
    assert telemetry.shutdown()
    for name in ("metrics-rank0.jsonl", "traces-rank0.jsonl", "spans-rank0.jsonl"):
        lines = (run / name).read_text().splitlines()
        assert lines[:2] == ['{"complete": 1}', '{"torn": "mid-li'], name
        assert len(lines) > 2 and all(json.loads(line) for line in lines[2:]), name


def test_two_runs_never_share_a_file(tmp_path):
    """Two runs in one output directory write two directories; latest is the second."""
    env = {"OTEL_PYTHON_TRAINING_OUTPUT_DIR": str(tmp_path), "OTEL_METRICS_EXPORTER": "none"}
    first = setup.configure(environ={**env, "OTEL_PYTHON_TRAINING_RUN_ID": "one"})
    second = setup.configure(environ={**env, "OTEL_PYTHON_TRAINING_RUN_ID": "two"})
    assert first.output_dir != second.output_dir
    assert (tmp_path / "latest").resolve() == Path(second.output_dir)
    second.shutdown()


def _stream(directory: Path, name: str = "metrics-rank0.jsonl") -> files.AppendStream:
    return files.AppendStream(
        str(directory / name),
        what=name.split("-")[0],
        setting="OTEL_PYTHON_TRAINING_OUTPUT_DIR=/somewhere",
        identity={"dl.run.id": "r", "dl.rank": 0},
    )


def _write(stream: files.AppendStream, *lines: str) -> None:
    for line in lines:
        stream.write(line + "\n")
    stream.flush()


def _outage(stream: files.AppendStream, run: Path) -> None:
    """One outage: the run directory replaced by a file for a write ("lost"), then back for
    the next ("kept")."""
    shutil.rmtree(run)
    run.write_text("x")
    _write(stream, "lost")
    run.unlink()
    _write(stream, "kept")


def test_a_removed_directory_is_recreated_once_for_all_its_files(tmp_path, caplog):
    """Two files of one run directory, the directory removed: both are written again there,
    one warning for the directory (naming it and the variable), a gap record per file with
    the lines that went with it."""
    run = tmp_path / "out" / "run-1"
    run.mkdir(parents=True)
    metrics, spans = _stream(run), _stream(run, "spans-rank0.jsonl")
    _write(metrics, "m1", "m2")
    _write(spans, "s1")
    shutil.rmtree(run)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        _write(metrics, "m3")
        _write(spans, "s2")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and str(run) in said[0] and "OUTPUT_DIR=/somewhere" in said[0]
    assert (run / "metrics-rank0.jsonl").read_text() == "m3\n"
    assert (run / "spans-rank0.jsonl").read_text() == "s2\n"
    gaps = [json.loads(line) for line in (run / "gaps-rank0.jsonl").read_text().splitlines()]
    assert {(g["file"], g["gone_lines"], g["lost_lines"]) for g in gaps} == {
        ("metrics-rank0.jsonl", 2, 0),
        ("spans-rank0.jsonl", 1, 0),
    }
    assert gaps[0]["resource"] == {"dl.run.id": "r", "dl.rank": 0}
    metrics.close()
    spans.close()


def test_failed_writes_are_counted_said_twice_and_recorded(tmp_path, caplog):
    """The run directory replaced by a file: each write is dropped and counted (records too),
    one warning when it starts, one with the count when writing works again; a gap record."""
    run = tmp_path / "run-2"
    run.mkdir()
    stream = _stream(run, "traces-rank0.jsonl")
    _write(stream, "t1")
    shutil.rmtree(run)
    run.write_text("not a directory\n")
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        for batch in range(3):
            stream.records(5)
            _write(stream, f"lost{batch}")
        assert stream.lost_lines == 3 and stream.lost_records == 15
        run.unlink()
        _write(stream, "t2")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "cannot write traces" in said[0] and "cannot be recreated" in said[0]
    assert "writes again" in said[1] and "3 lines (15 spans)" in said[1]
    assert (run / "traces-rank0.jsonl").read_text() == "t2\n"
    (gap,) = [json.loads(line) for line in (run / "gaps-rank0.jsonl").read_text().splitlines()]
    assert (gap["lost_lines"], gap["lost_records"], gap["gone_lines"]) == (3, 15, 1)
    assert gap["from_unix_ns"] <= gap["to_unix_ns"]
    stream.close()


def test_a_flapping_directory_warns_a_bounded_number_of_times(tmp_path, caplog):
    """Ten outages of one file: at most MAX_OUTAGE_WARNINGS announced (two lines each), then a
    total at close."""
    run = tmp_path / "run-3"
    run.mkdir()
    stream = _stream(run)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        for _ in range(10):
            _outage(stream, run)
        stream.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 * files.MAX_OUTAGE_WARNINGS + 1
    assert "10 lines" in said[-1] and "10 outages" in said[-1]


def test_open_append_writes_utf8_lines_after_what_was_there(tmp_path):
    """open_append: a new file is created 0644 (umask 022), UTF-8 text goes after the file's
    last complete line, what cannot be encoded is written as a backslash escape, lines end in
    \\n, and closing the stream closes its file."""
    old_umask = os.umask(0o022)
    try:
        stream = files.open_append(str(tmp_path / "new.jsonl"))
    finally:
        os.umask(old_umask)
    assert (tmp_path / "new.jsonl").stat().st_mode & 0o777 == 0o644
    stream.write("é\n\ud800\n")
    stream.close()
    assert (tmp_path / "new.jsonl").read_bytes() == b"\xc3\xa9\n\\ud800\n"
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b'{"a": 1}\n{"b"')
    with files.open_append(str(torn)) as again:
        fd = again.fileno()
        again.write("x\n")
    assert torn.read_bytes() == b'{"a": 1}\n{"b"\nx\n'
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with the stream
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with files.open_append(str(empty)) as stream:
        stream.write("y\n")
    assert empty.read_bytes() == b"y\n"


def test_an_append_stream_after_close_writes_nothing_and_has_no_file(tmp_path):
    """After close(): closed, writes are dropped, fileno() raises EBADF; close() again is
    harmless."""

    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run)
    assert stream.writable() and not stream.closed
    assert stream.fileno() >= 0
    _write(stream, "a")
    stream.close()
    stream.close()
    assert stream.closed
    assert stream.write("b\n") == 2
    stream.flush()
    with pytest.raises(OSError) as raised:
        stream.fileno()
    assert raised.value.errno == errno.EBADF
    assert (run / "metrics-rank0.jsonl").read_text() == "a\n"


def test_gap_records_say_whose_file_what_and_why(tmp_path):
    """A gap record names itself, the file, its signal and the reason with the errno's name;
    a file not named {signal}-rank{R}.jsonl goes to gaps-rank0.jsonl under what it holds."""

    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run, "spans-rank3.jsonl")
    other = files.AppendStream(str(run / "odd.log"), what="notes", setting="S")
    _write(stream, "s1")
    _write(other, "n1")
    shutil.rmtree(run)
    run.write_text("x")
    for current in (stream, other):
        current.records(2)
        _write(current, "lost", "lost too")
    run.unlink()
    _write(stream, "s2")
    _write(other, "n2")
    (gap,) = [json.loads(line) for line in (run / "gaps-rank3.jsonl").read_text().splitlines()]
    assert {k: gap[k] for k in ("record", "file", "signal", "lost_lines", "lost_records")} == {
        "record": "gap",
        "file": "spans-rank3.jsonl",
        "signal": "spans",
        "lost_lines": 2,
        "lost_records": 2,
    }
    assert gap["reason"] == f"EEXIST: {os.strerror(errno.EEXIST)}"  # makedirs over a file
    assert gap["resource"] == {"dl.run.id": "r", "dl.rank": 0}
    (odd,) = [json.loads(line) for line in (run / "gaps-rank0.jsonl").read_text().splitlines()]
    assert (odd["file"], odd["signal"], odd["lost_lines"]) == ("odd.log", "notes", 2)
    assert (run / "odd.log").read_text() == "n2\n"
    stream.close()
    other.close()


def test_a_directory_failing_for_several_files_is_announced_once_per_outage(tmp_path, caplog):
    """Two files of a directory that fails: one warning when it starts (by the first file),
    each file's recovery said once; when the directory fails again after both recovered, it
    is announced again."""
    run = tmp_path / "run"
    run.mkdir()
    metrics, logs = _stream(run), _stream(run, "logs-rank0.jsonl")
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        for outage in range(2):
            shutil.rmtree(run)
            run.write_text("x")
            logs.records(1)
            _write(metrics, "lost")
            _write(logs, "lost")
            run.unlink()
            _write(metrics, f"m{outage}")
            _write(logs, f"l{outage}")
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" ", 2)[1] for m in said] == ["cannot", "writes", "writes"] * 2, said
    assert "1 lines (1 log records)" in said[2] and "1 lines could" in said[1]
    assert (run / "logs-rank0.jsonl").read_text() == "l1\n"
    metrics.close()
    logs.close()


def test_closing_during_an_outage_says_what_was_lost(tmp_path, caplog):
    """A stream closed while its directory still fails: one warning that it stopped with
    writes failing and how many lines were lost, and the gap is recorded when possible."""
    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run)
    shutil.rmtree(run)
    run.write_text("x")
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        _write(stream, "lost", "lost")
        stream.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "stopped writing, with writes failing" in said[1]
    assert "2 lines could not be written" in said[1]
    assert stream.lost_lines == 2


def test_a_write_cut_short_keeps_whole_lines_and_starts_the_next_on_a_new_line(tmp_path):
    """A write that fails part-way (the file size limit, EFBIG): the lines that reached the
    file whole count as written, the rest as lost with all the write's records, and the next
    write begins with a newline, so no line is glued to the torn one."""
    import resource
    import signal

    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run)
    _write(stream, "0123456789")  # 11 bytes
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (30, limits[1]))
        stream.records(3)
        _write(stream, "abcdefghi", "jklmnopqrstuvwxyz")  # 10 + 18 bytes: the second is cut
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert (stream.lines_written, stream.lost_lines, stream.lost_records) == (2, 1, 3)
    _write(stream, "next")
    text = (run / "metrics-rank0.jsonl").read_text()
    assert text == "0123456789\nabcdefghi\njklmnopqr\nnext\n"
    assert stream.lines_written == 3
    stream.close()


def test_text_that_cannot_be_encoded_is_written_as_backslash_escapes(tmp_path):
    """A lone surrogate in what is written reaches the file as a backslash escape (UTF-8 for
    everything else), through an AppendStream and through open_append alike; never a raise."""
    stream = _stream(tmp_path)
    _write(stream, "a\udcffb é")
    stream.close()
    assert (tmp_path / "metrics-rank0.jsonl").read_bytes() == "a\\udcffb é\n".encode()
    with files.open_append(str(tmp_path / "plain.jsonl")) as plain:
        plain.write("c\udcffd é\n")
    assert (tmp_path / "plain.jsonl").read_bytes() == "c\\udcffd é\n".encode()


def test_each_removal_is_a_gap_record_of_what_went_and_the_counts_add_up(tmp_path):
    """A directory removed twice: each recreation appends one gap record, exactly: no start
    time, the lines that went with the file, nothing lost, the reason (the first record went
    with the second removal); gone_lines adds up."""
    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run)
    for lines in (["a", "b"], ["c"]):
        _write(stream, *lines)
        shutil.rmtree(run)
        _write(stream, "after")
        _write(stream)  # nothing queued: no write, no record
    gaps = [json.loads(line) for line in (run / "gaps-rank0.jsonl").read_text().splitlines()]
    assert [gap.pop("to_unix_ns") > 0 for gap in gaps] == [True]
    assert gaps == [
        {
            "record": "gap",
            "file": "metrics-rank0.jsonl",
            "signal": "metrics",
            "from_unix_ns": None,
            "lost_lines": 0,
            "lost_records": 0,
            "gone_lines": 2,  # "c" and "after" were in the second directory
            "reason": "the file was removed (its directory deleted?) and recreated",
            "resource": {"dl.run.id": "r", "dl.rank": 0},
        }
    ]
    assert stream.gone_lines == 4 and stream.lost_lines == 0  # 2 lines each time
    stream.close()


def test_a_gap_record_is_ascii_json_whatever_the_identity_holds(tmp_path):
    """The gap file is ASCII JSON: non-ASCII identity values escaped, values JSON cannot take
    written as their str()."""
    run = tmp_path / "run"
    run.mkdir()
    stream = files.AppendStream(
        str(run / "logs-rank1.jsonl"), what="logs", setting="S",
        identity={"host.name": "hôte", "raw": b"\xff"},
    )  # fmt: skip
    _write(stream, "l")
    shutil.rmtree(run)
    _write(stream, "l2")
    raw = (run / "gaps-rank1.jsonl").read_bytes()
    assert raw.isascii()
    assert json.loads(raw)["resource"] == {"host.name": "hôte", "raw": "b'\\xff'"}
    stream.close()


def test_the_reason_of_a_failure_names_the_errno():
    """An OSError's reason: its errno's name and text; the text alone without a known errno."""

    assert files._reason(OSError(errno.ENOSPC, "No space left")) == "ENOSPC: No space left"
    assert files._reason(OSError(99999, "odd")) == "odd"
    assert files._reason(OSError("plain")) == "plain"


def test_a_directory_is_failing_while_any_of_its_files_fails():
    """Two files of a directory fail: the first to fail announces it; the directory stays
    failing until both recovered; then a new failure is announced again."""
    directory = "/nowhere/run"
    assert files._first_to_fail(directory) is True
    assert files._first_to_fail(directory) is False
    files._recovered(directory)
    assert files._first_to_fail(directory) is False  # the other file still fails
    files._recovered(directory)
    files._recovered(directory)
    assert directory not in files._failing
    assert files._first_to_fail(directory) is True
    files._recovered(directory)
    files._recovered("/never/failed")  # a recovery of what never failed: nothing
    assert files._failing.get(directory) is None and "/never/failed" not in files._failing


def test_a_file_is_opened_close_on_exec_and_never_through_a_symlink(tmp_path):
    """The descriptor is close-on-exec (a child process does not inherit it) and opened with
    O_NOFOLLOW: a symlink at the path fails with ELOOP, for open_append and AppendStream."""
    import fcntl

    stream = _stream(tmp_path)
    assert fcntl.fcntl(stream.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    stream.close()
    with files.open_append(str(tmp_path / "plain.jsonl")) as plain:
        assert fcntl.fcntl(plain.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "plain.jsonl")
    with pytest.raises(OSError) as raised:
        _stream(tmp_path, "link.jsonl")
    assert raised.value.errno == errno.ELOOP


class _FailingOs:
    """``os`` as ``files`` sees it, with failures the test plans: ``writes`` is what each
    ``os.write`` does in turn (a byte count written, or an errno raised; then real writes),
    ``fail`` maps other functions to an errno they raise while listed."""

    def __init__(self, monkeypatch, writes=(), **fail: int) -> None:
        self.writes = list(writes)
        self.fail = dict(fail)
        monkeypatch.setattr(files, "os", self)

    def __getattr__(self, name):
        if name in self.fail:
            code = self.fail[name]

            def failing(*args, **kwargs):
                raise OSError(code, os.strerror(code))

            return failing
        return getattr(os, name)

    def write(self, fd, data) -> int:
        if not self.writes:
            return os.write(fd, data)
        step = self.writes.pop(0)
        if step < 0:
            raise OSError(-step, os.strerror(-step))
        return os.write(fd, bytes(data[:step]))


def test_writes_cut_at_any_byte_keep_whole_lines_and_never_glue_two(tmp_path, monkeypatch):
    """Part-way failures, planned byte by byte: the lines that reached the file whole count
    as written, the rest as lost (with the write's records only while a line was lost); a
    torn line is ended by the next write's leading newline, exactly once; a write that got
    nothing out changes nothing; a short os.write is continued where it stopped."""

    run = tmp_path / "run"
    run.mkdir()
    path = run / "metrics-rank0.jsonl"
    stream = _stream(run)
    plan = _FailingOs(monkeypatch, writes=[2, 2, -errno.ENOSPC])
    stream.records(2)
    stream.records(3)
    _write(stream, "", "ab", "cd")  # an empty line; 2 + 2 bytes get out: "\\nab\\n"
    assert path.read_text() == "\nab\n"
    assert (stream.lines_written, stream.lost_lines, stream.lost_records) == (2, 1, 5)
    plan.writes = [-errno.ENOSPC]  # nothing gets out: the file still ends on a whole line
    _write(stream, "ef")
    assert (stream.lines_written, stream.lost_lines, stream.lost_records) == (2, 2, 5)
    plan.writes = [4, -errno.ENOSPC]  # "gh" and half of "ijk" get out: torn
    _write(stream, "gh", "ijk")
    assert path.read_text() == "\nab\ngh\ni"
    assert (stream.lines_written, stream.lost_lines) == (3, 3)
    plan.writes = [1, -errno.ENOSPC]  # only the newline that ends the torn line
    _write(stream, "lm")
    assert path.read_text() == "\nab\ngh\ni\n"
    plan.writes = [2, -errno.EFBIG]  # "no" of "no\\npq\\n": torn again
    _write(stream, "no", "pq")
    plan.writes = [3, -errno.EFBIG]  # the leading newline and "xy" of "\\nxy\\nzz\\n"
    _write(stream, "xy", "zz")
    assert path.read_text() == "\nab\ngh\ni\nno\nxy"
    assert (stream.lines_written, stream.lost_lines) == (3, 8)
    _write(stream, "rs")
    assert path.read_text() == "\nab\ngh\ni\nno\nxy\nrs\n"
    assert stream.lines_written == 4
    stream.records(4)  # a failed write whose only line got out loses no record
    plan.writes = [4, -errno.ENOSPC]
    stream.write("tu\nvw")  # no newline at the end: one line, which got out
    stream.flush()
    assert (stream.lines_written, stream.lost_lines, stream.lost_records) == (5, 8, 5)
    stream.close()


def test_a_write_without_a_newline_is_one_line_and_records_reset_with_each_flush(tmp_path):
    """Text without a newline counts as one line; records said before a flush with nothing
    queued are forgotten; records said twice add up."""

    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run)
    stream.write("no newline")
    stream.flush()
    assert stream.lines_written == 1
    stream.records(7)
    stream.flush()  # nothing queued: the 7 go
    shutil.rmtree(run)
    run.write_text("x")
    stream.records(2)
    stream.records(3)
    stream.write("lost\n")
    stream.flush()
    assert (stream.lost_lines, stream.lost_records) == (1, 5)
    run.unlink()
    stream.close()


def test_a_removed_directory_that_cannot_be_recreated_counts_what_went(
    tmp_path, monkeypatch, caplog
):
    """The directory removed and not recreatable: the warning says it was removed with the
    lines it held; when it can be made again, one gap record has the lost and the gone lines
    of the outage, and gone_lines counts them once. A plain full disk says nothing of a
    removal."""

    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run)
    _write(stream, "a", "b", "c")
    shutil.rmtree(run)
    plan = _FailingOs(monkeypatch, makedirs=errno.EROFS)
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        stream.records(2)
        _write(stream, "lost")
        del plan.fail["makedirs"]
        _write(stream, "d")
    said = [r.getMessage() for r in caplog.records]
    assert "it was removed, with the 3 lines it held, and cannot be recreated" in said[0]
    assert "1 lines (2 records) could not be written" in said[1]
    (gap,) = [json.loads(line) for line in (run / "gaps-rank0.jsonl").read_text().splitlines()]
    assert (gap["lost_lines"], gap["lost_records"], gap["gone_lines"]) == (1, 2, 3)
    assert stream.gone_lines == 3 and (run / "metrics-rank0.jsonl").read_text() == "d\n"
    caplog.clear()
    plan.writes = [-errno.ENOSPC]
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        _write(stream, "full")
        _write(stream, "e")
    assert "(ENOSPC: No space left on device; the directory is set by" in (
        caplog.records[0].getMessage()
    )
    assert stream.gone_lines == 3  # the second outage took nothing with it
    stream.close()
    fresh = _stream(tmp_path, "logs-rank0.jsonl")
    plan.writes = [-errno.EDQUOT]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="otel_training"):
        _write(fresh, "over quota")
    (said,) = caplog.records
    assert f"(EDQUOT: {os.strerror(errno.EDQUOT)}; the directory is set by" in said.getMessage()
    fresh.close()


def test_closing_a_removed_stream_that_never_recovered_counts_its_lines_once(tmp_path, monkeypatch):
    """A stream whose directory was removed and never made again, closed: the lines that went
    with it count once in gone_lines and in the outage's gap record (written where the
    directory stands again by then)."""

    run = tmp_path / "run"
    run.mkdir()
    stream = _stream(run, "spans-rank2.jsonl")
    _write(stream, "a", "b")
    shutil.rmtree(run)
    _FailingOs(monkeypatch, makedirs=errno.EROFS)
    _write(stream, "lost")
    run.mkdir()  # made by someone else: the gap can be written there
    stream.close()
    assert stream.gone_lines == 2
    (gap,) = [json.loads(line) for line in (run / "gaps-rank2.jsonl").read_text().splitlines()]
    assert (gap["lost_lines"], gap["gone_lines"]) == (1, 2)
    assert gap["signal"] == "spans"


def test_a_gap_record_names_the_signal_of_its_file_name(tmp_path):
    """The signal of a gap record is the one in the file's name ({signal}-rank{R}.jsonl),
    whatever the stream says it holds; the record goes to that rank's gaps file."""
    run = tmp_path / "run"
    run.mkdir()
    stream = files.AppendStream(str(run / "traces-rank5.jsonl"), what="span data", setting="S")
    _write(stream, "t")
    shutil.rmtree(run)
    _write(stream, "t2")
    (gap,) = [json.loads(line) for line in (run / "gaps-rank5.jsonl").read_text().splitlines()]
    assert (gap["signal"], gap["file"]) == ("traces", "traces-rank5.jsonl")
    stream.close()


def test_a_recovery_names_the_records_of_each_signal(tmp_path, caplog):
    """The recovery warning counts lost records as spans (traces), log records (logs) or
    records (anything else)."""
    said = {}
    for name, noun in (("traces", "spans"), ("logs", "log records"), ("metrics", "records")):
        run = tmp_path / name
        run.mkdir()
        stream = _stream(run, f"{name}-rank0.jsonl")
        shutil.rmtree(run)
        run.write_text("x")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="otel_training"):
            stream.records(2)
            _write(stream, "lost")
            run.unlink()
            _write(stream, "kept")
        said[name] = caplog.records[-1].getMessage()
        assert f"1 lines (2 {noun}) could not be written" in said[name], said
        stream.close()


def test_the_total_at_close_comes_only_beyond_the_warned_outages(tmp_path, caplog):
    """Exactly MAX_OUTAGE_WARNINGS outages: each warned, no total at close; one more: the
    total at close."""
    for outages, total in ((files.MAX_OUTAGE_WARNINGS, 0), (files.MAX_OUTAGE_WARNINGS + 1, 1)):
        run = tmp_path / f"run{outages}"
        run.mkdir()
        stream = _stream(run)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="otel_training"):
            for _ in range(outages):
                _outage(stream, run)
            stream.close()
        totals = [r for r in caplog.records if "outages in all" in r.getMessage()]
        assert len(totals) == total


def test_a_failed_open_closes_its_descriptor_and_raises_the_error(tmp_path, monkeypatch):
    """When the file opens but cannot be read or completed (fstat, pread, the newline after a
    torn line), its descriptor is closed and that OSError is raised."""

    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b"half")
    opened = []
    real_open = os.open

    def open_and_note(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        opened.append(fd)
        return fd

    for failing in ("fstat", "pread"):
        plan = _FailingOs(monkeypatch, **{failing: errno.EIO})
        monkeypatch.setattr(plan, "open", open_and_note, raising=False)
        for opener in (files.open_append, lambda p: _stream(tmp_path, "torn.jsonl")):
            with pytest.raises(OSError) as raised:
                opener(str(torn))
            assert raised.value.errno == errno.EIO
            with pytest.raises(OSError):
                os.fstat(opened[-1])  # closed
    plan = _FailingOs(monkeypatch, writes=[-errno.ENOSPC])
    monkeypatch.setattr(plan, "open", open_and_note, raising=False)
    with pytest.raises(OSError):
        files.open_append(str(torn))
    with pytest.raises(OSError):
        os.fstat(opened[-1])


def test_latest_is_replaced_safely_whatever_was_left_there(tmp_path, monkeypatch):
    """A staging link left by a process of the same pid is replaced; when latest cannot be
    replaced (a directory stands there), the run directory is still made and the staging
    link is cleaned up."""
    out = tmp_path / "out"
    out.mkdir()
    staged = out / f".latest.{os.getpid()}"
    staged.symlink_to("stale")
    files.run_directory(str(out), "run-a")
    assert os.readlink(out / "latest") == "run-a" and not os.path.lexists(staged)
    blocked = tmp_path / "blocked"
    (blocked / "latest" / "inside").mkdir(parents=True)
    directory = files.run_directory(str(blocked), "run-b")
    assert Path(directory).is_dir()
    assert not os.path.lexists(blocked / f".latest.{os.getpid()}")
    assert (blocked / "latest").is_dir()


def test_fileno_of_a_closed_stream_says_it_is_not_open(tmp_path):
    """fileno() after close raises EBADF, saying the file is not open."""
    stream = _stream(tmp_path)
    stream.close()
    with pytest.raises(OSError, match="^\\[Errno 9\\] the file is not open$"):
        stream.fileno()
