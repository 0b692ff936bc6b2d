"""Reads the files of one job, all of its attempts, into :mod:`otel_training.health.evidence`.

The embedded default's files of every run directory of the job (``docs/health.md``, "Which
files"): per rank R, ``metrics-rank{R}.jsonl`` (the ledger's ``dl.training.*`` at each export,
and the device clocks and temperatures), ``spans-rank{R}.jsonl`` (phase spans, truncations,
``stacks`` records), ``traces-rank{R}.jsonl`` where a rank has no span lines, and the
modification time of each of a rank's files (``logs-rank{R}.jsonl`` too). Span lines of older
versions, without the attempt and creation time in their resource, go to the process of the
same run and rank that was alive at their time.

**Last evidence of life** of a process: its latest record (a metric export, a span start or
end, a stacks record), or the modification time of its rank's files when that is later by at
most one export interval plus one second (a file copied later does not move it further).

Nothing here raises on a file: what cannot be read is a note.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from otel_training.health import ledger as _ledger
from otel_training.health.evidence import Job, PhaseSpan, Process, Sample
from otel_training.report.attempts import creation_unix_s, job_key
from otel_training.report.rundir import (
    RunFile,
    default_output_directory,
    find_run_directory,
    run_files,
)

__all__ = ["job_directories", "read_job"]

PHASES = _ledger.PHASES
_PHASE_INDEX = {name: i for i, name in enumerate(PHASES)}
_DELTA = (1, "AGGREGATION_TEMPORALITY_DELTA")
#: Span phases kept per process (the step's inner phases are not needed: the ledger has them).
_KEPT = frozenset(
    {
        _ledger.STARTUP,
        _ledger.CHECKPOINT_LOAD,
        _ledger.CHECKPOINT_SAVE,
        _ledger.EVALUATE,
        _ledger.WARMUP,
        _ledger.ITERATION,
    }
)
#: The span names read: those of the phases kept, and the run's and its segments' (whose open
#: start lines tell a process that never shut down).
_SPAN_NAMES = frozenset(
    name.encode() for name, phase in _ledger.PHASE_OF_SPAN.items() if phase in _KEPT
) | {b"megatron.train", b"megatron.train.segment"}
#: A span line's name, read without parsing the line (a ``stacks`` record has none).
_NAME = re.compile(rb'"name":\s*"([^"\\]*)"')
#: The last lines of a span file are read whatever their span.
_TAIL_LINES = 64


def _last_line(path: Path, limit: int = 1 << 20) -> bytes | None:
    """The last complete line of a file (a torn tail skipped), reading at most ``limit``
    bytes from the end."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            start = max(0, size - limit)
            handle.seek(start)
            tail = handle.read()
    except OSError:
        return None
    lines = tail.split(b"\n")
    if start > 0:
        lines = lines[1:]
    for line in reversed(lines[:-1] if not tail.endswith(b"\n") else lines):
        if line.strip():
            return line
    return None


def _directory_job(directory: Path) -> str | None:
    """The job of the newest process whose lines are in ``directory`` (from the last line of a
    span file, else the first of a metrics file)."""
    files = run_files(directory)
    spans = sorted((f for f in files if f.signal == "spans"), key=lambda f: -_mtime(f.path))
    for file in spans:
        line = _last_line(file.path)
        if line is None:
            continue
        try:
            record = orjson.loads(line)
            key = job_key(record.get("resource") or {})
        except (ValueError, AttributeError):
            continue
        if key:
            return key
    for file in (f for f in files if f.signal == "metrics"):
        try:
            with open(file.path, "rb") as handle:
                line = handle.readline()
            document = orjson.loads(line)
            resource = _attributes(document["resourceMetrics"][0]["resource"]["attributes"])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
        key = job_key(resource)
        if key:
            return key
    return None


def job_directories(
    directory: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str | None, list[Path]]:
    """The job that ``directory`` shows, and all of its run directories.

    ``directory`` is a run directory, or an output directory (its ``latest`` link or newest
    run is taken, as ``otel-training report`` takes it); by default the environment's output
    directory. The job is that run's ``dl.job.id`` (else its run id without ``-a{N}``); its run
    directories are that one and every sibling whose newest process belongs to the same job.

    Returns:
        ``(job, directories)``, the directories in name order.

    Raises:
        RunNotFoundError: when ``directory`` holds no run.
    """
    base = Path(directory) if directory is not None else default_output_directory(environ)
    run_directory = find_run_directory(base, environ)
    key = _directory_job(run_directory)
    found = {run_directory.resolve()}
    parent = run_directory.parent
    if key is not None:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            entries = []
        for entry in entries:
            try:
                if not entry.is_dir() or entry.name == "latest":
                    continue
            except OSError:
                continue
            path = Path(entry.path).resolve()
            if path in found or not run_files(path):
                continue
            if _directory_job(path) == key:
                found.add(path)
    return key, sorted(found, key=lambda p: p.name)


# -- reading ---------------------------------------------------------------------------------


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _any_value(value: Mapping[str, Any]) -> Any:
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        v = value["doubleValue"]
        return float(v) if not isinstance(v, str) else _float(v)
    if "boolValue" in value:
        return bool(value["boolValue"])
    return None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv["key"]: _any_value(kv.get("value") or {}) for kv in pairs or ()}


def _number(point: Mapping[str, Any]) -> float | None:
    value = point.get("asDouble")
    if value is not None:
        return float(value) if not isinstance(value, str) else _float(value)
    value = point.get("asInt")
    if value is not None:
        return float(int(value))
    return None


_IDENTITY = ("dl.run.id", "dl.run.attempt", "process.creation.time", "dl.rank")


class _Reader:
    """Collects processes from the files of one job."""

    def __init__(self, job: str | None) -> None:
        self.job = job
        self.processes: dict[tuple, Process] = {}
        self.unplaced: dict[tuple, Process] = {}  # span lines without a creation time
        self.notes: list[str] = []
        self.bytes_read = 0
        self.other_jobs: set[str] = set()
        # per (directory, file rank): the processes that wrote there
        self.writers: dict[tuple[Path, int], set[tuple]] = {}
        # phase.time of processes exported with delta temporality: running totals
        self._delta_totals: dict[int, list[float]] = {}
        # the process of each (file, resource identity) seen
        self._cache: dict[tuple, Process | None] = {}
        # per process (by id): its phase spans by span id, and the ids of spans still open
        self._spans: dict[int, dict[str, PhaseSpan]] = {}
        self._open: dict[int, set[str]] = {}

    def process(self, resource: Mapping[str, Any], file: RunFile) -> Process | None:
        cache_key = (
            id(file),
            resource.get("dl.run.id"),
            resource.get("dl.run.attempt"),
            resource.get("process.creation.time"),
            resource.get("dl.rank"),
            resource.get("dl.job.id"),
        )
        if cache_key in self._cache:
            return self._cache[cache_key]
        process = self._process(resource, file)
        self._cache[cache_key] = process
        return process

    def _process(self, resource: Mapping[str, Any], file: RunFile) -> Process | None:
        key = job_key(resource)
        if self.job is not None and key is not None and key != self.job:
            self.other_jobs.add(key)
            return None
        rank = resource.get("dl.rank")
        if not isinstance(rank, int):
            rank = file.rank
        attempt = resource.get("dl.run.attempt")
        identity = (
            resource.get("dl.run.id"),
            attempt if isinstance(attempt, int) else None,
            resource.get("process.creation.time"),
            rank,
        )
        table = self.processes if identity[2] is not None else self.unplaced
        process = table.get(identity)
        if process is None:
            process = table[identity] = Process(
                rank=rank,
                run_id=None if identity[0] is None else str(identity[0]),
                job_id=None if resource.get("dl.job.id") is None else str(resource["dl.job.id"]),
                attempt=identity[1],
                created_s=creation_unix_s(identity[2]),
                resource=dict(resource),
            )
        process.directories.add(file.path.parent)
        self.writers.setdefault((file.path.parent, file.rank), set()).add(identity)
        return process

    # -- metrics --------------------------------------------------------------------------

    def metrics_line(self, document: Mapping[str, Any], file: RunFile) -> None:
        for block in document["resourceMetrics"]:
            resource = _attributes((block.get("resource") or {}).get("attributes"))
            process = self.process(resource, file)
            if process is None:
                continue
            if len(resource) >= len(process.resource):
                process.resource = resource
            sample = self.sample(block, process)
            if sample is not None:
                process.samples.append(sample)
                process.see(sample.time_s)

    def sample(self, block: Mapping[str, Any], process: Process) -> Sample | None:
        time_ns = None
        phase_s: list[float] | None = None
        delta = False
        sample = Sample(0.0)
        clocks: list[float] = []
        temperatures: list[float] = []
        for scope in block.get("scopeMetrics", ()):
            for metric in scope.get("metrics", ()):
                name = metric.get("name", "")
                if not (name.startswith("dl.") or name == "hw.temperature"):
                    continue
                data = metric.get("gauge") or metric.get("sum")
                if data is None:
                    continue
                points = data.get("dataPoints", ())
                if not points:
                    continue
                if time_ns is None:
                    time_ns = int(points[0]["timeUnixNano"])
                if name == "dl.training.phase.time":
                    phase_s = [0.0] * len(PHASES)
                    delta = data.get("aggregationTemporality") in _DELTA
                    for point in points:
                        phase = _point_phase(point)
                        value = _number(point)
                        if phase is not None and value is not None:
                            phase_s[phase] = value
                elif name == "dl.training.phase.elapsed":
                    for point in points:
                        value = _number(point) or 0.0
                        if value > sample.open_s or sample.open_phase is None and value >= 0:
                            phase = _point_phase(point)
                            if phase is not None and (value > 0 or sample.open_phase is None):
                                sample.open_phase, sample.open_s = PHASES[phase], value
                elif name == "dl.training.progress.iteration":
                    value = _number(points[0])
                    sample.iteration = None if value is None else int(value)
                elif name == "dl.training.progress.timestamp":
                    sample.progress_s = _number(points[0])
                elif name == "dl.training.checkpoint.iteration":
                    for point in points:
                        operation = _attributes(point.get("attributes")).get(
                            "megatron.checkpoint.operation"
                        )
                        value = _number(point)
                        if value is None:
                            continue
                        if operation == "save":
                            sample.saved_iteration = int(value)
                        elif operation == "load":
                            sample.loaded_iteration = int(value)
                elif name == "dl.training.checkpoint.age":
                    sample.checkpoint_age_s = _number(points[0])
                elif name == "dl.gpu.clock.speed":
                    for point in points:
                        attributes = _attributes(point.get("attributes"))
                        if attributes.get("dl.gpu.clock.domain") == "sm":
                            value = _number(point)
                            if value is not None:
                                clocks.append(value)
                elif name == "hw.temperature":
                    temperatures.extend(v for v in map(_number, points) if v is not None)
        if time_ns is None:
            return None
        sample.time_s = time_ns / 1e9
        if phase_s is not None:
            if delta:
                key = id(process)
                totals = self._delta_totals.setdefault(key, [0.0] * len(PHASES))
                for i, value in enumerate(phase_s):
                    totals[i] += value
                phase_s = list(totals)
            sample.phase_s = tuple(phase_s)
        if clocks:
            sample.sm_clock_hz = sum(clocks) / len(clocks)
        if temperatures:
            sample.temperature_c = sum(temperatures) / len(temperatures)
        return sample

    # -- spans ----------------------------------------------------------------------------

    def span_line(self, record: Mapping[str, Any], file: RunFile) -> None:
        kind = record.get("record")
        resource = record.get("resource") or {}
        if "dl.rank" not in resource and isinstance(record.get("rank"), int):
            resource = {**resource, "dl.rank": record["rank"]}
        process = self.process(resource, file)
        if process is None:
            return
        if kind == "stacks":
            time_s = int(record.get("time_ns") or 0) / 1e9
            process.see(time_s)
            process.stacks.append(dict(record))
            return
        if kind not in ("span_start", "span_end"):
            return
        start_s = int(record["start_time_ns"]) / 1e9
        end_ns = record.get("end_time_ns") if kind == "span_end" else None
        end_s = None if end_ns is None else int(end_ns) / 1e9
        process.see(start_s if end_s is None else end_s)
        span_id = record.get("span_id") or ""
        attributes = record.get("attributes") or {}
        status = record.get("status")
        description = record.get("status_description") or ""
        truncated = attributes.get("otel_training.span.truncated") is True
        if truncated and isinstance(description, str) and description.startswith("truncated: "):
            process.signal = description[len("truncated: ") :]
        if kind == "span_start":
            self._open.setdefault(id(process), set()).add(span_id)
        else:
            self._open.setdefault(id(process), set()).discard(span_id)
        phase = _ledger.PHASE_OF_SPAN.get(record.get("name"), _ledger.NO_PHASE)
        if phase not in _KEPT:
            return
        spans = self._spans.setdefault(id(process), {})
        span = spans.get(span_id)
        if span is None:
            iteration = attributes.get("megatron.iteration")
            span = spans[span_id] = PhaseSpan(
                name=record["name"],
                phase=phase,
                start_s=start_s,
                iteration=iteration if isinstance(iteration, int) else None,
            )
        if end_s is not None:
            span.end_s = end_s
            span.truncated = truncated
            span.failed = status == "ERROR" and not truncated

    def traces_line(self, document: Mapping[str, Any], file: RunFile) -> None:
        for block in document["resourceSpans"]:
            resource = _attributes((block.get("resource") or {}).get("attributes"))
            for scope in block.get("scopeSpans", ()):
                for item in scope.get("spans", ()):
                    status = item.get("status") or {}
                    code = status.get("code")
                    record = {
                        "record": "span_end",
                        "name": item.get("name"),
                        "span_id": item.get("spanId"),
                        "start_time_ns": item["startTimeUnixNano"],
                        "end_time_ns": item.get("endTimeUnixNano"),
                        "status": "ERROR" if code in (2, "STATUS_CODE_ERROR") else "UNSET",
                        "status_description": status.get("message"),
                        "attributes": _attributes(item.get("attributes")),
                        "resource": resource,
                    }
                    self.span_line(record, file)

    # -- files ----------------------------------------------------------------------------

    def read(self, file: RunFile) -> None:
        decode = {
            "metrics": self.metrics_line,
            "spans": self.span_line,
            "traces": self.traces_line,
        }.get(file.signal)
        if decode is None:
            return
        bad = torn = 0
        try:
            with open(file.path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            self.notes.append(f"{file.path.name} could not be read ({error.strerror or error}).")
            return
        self.bytes_read += len(data)
        lines = data.split(b"\n")
        last = len(lines) - 1
        # Span lines of the steps' inner phases say nothing the ledger does not: skipped unread
        # (but the last lines, whatever they are: the last evidence of life).
        skip_before = last - _TAIL_LINES if file.signal == "spans" else -1
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            if i < skip_before and b'"span_' in raw[:40]:
                found = _NAME.search(raw, 0, 400)
                if found is not None and found[1] not in _SPAN_NAMES:
                    continue
            try:
                decode(orjson.loads(raw), file)
            except orjson.JSONDecodeError:
                if i == last:
                    torn += 1
                else:
                    bad += 1
            except (KeyError, TypeError, ValueError, AttributeError, IndexError):
                bad += 1
        if bad:
            self.notes.append(f"{file.path.name}: {bad} unreadable lines skipped.")

    def collect(self) -> _Part:
        """What this reader found, its spans in their processes (picklable: a worker
        process's result)."""
        for table in (self.processes, self.unplaced):
            for process in table.values():
                process.spans = list(self._spans.get(id(process), {}).values())
                process.open_spans = len(self._open.get(id(process), ()))
        return _Part(
            self.processes, self.unplaced, self.writers, self.notes, self.bytes_read,
            self.other_jobs,
        )  # fmt: skip


@dataclass
class _Part:
    """What the files read held: processes by identity (and those of span lines without a
    creation time), who wrote where, notes."""

    processes: dict[tuple, Process]
    unplaced: dict[tuple, Process]
    writers: dict[tuple[Path, int], set[tuple]]
    notes: list[str]
    bytes_read: int
    other_jobs: set[str]

    def merge(self, other: _Part) -> None:
        """Adds ``other`` (another file's) to this one."""
        for mine, theirs in ((self.processes, other.processes), (self.unplaced, other.unplaced)):
            for identity, process in theirs.items():
                known = mine.get(identity)
                if known is None:
                    mine[identity] = process
                else:
                    _absorb(known, process)
        for key, identities in other.writers.items():
            self.writers.setdefault(key, set()).update(identities)
        self.notes += other.notes
        self.bytes_read += other.bytes_read
        self.other_jobs |= other.other_jobs

    def finish(self, mtimes: Mapping[tuple[Path, int], float]) -> list[Process]:
        """The processes, span lines without a creation time given to the process alive at
        their time, each with its last evidence of life."""
        processes = list(self.processes.values())
        by_identity = dict(self.processes)
        for identity, loose in self.unplaced.items():
            home = _home(loose, processes)
            if home is None:
                processes.append(loose)
                by_identity[identity] = loose
                continue
            by_identity[identity] = home
            _absorb(home, loose)
        for process in processes:
            process.spans.sort(key=lambda s: s.start_s)
            process.samples.sort(key=lambda s: s.time_s)
            process.stacks.sort(key=lambda r: r.get("time_ns") or 0)
            process.alive_s = process.last_s
        # A file's modification time is the last evidence of life of its newest writer.
        for (directory, rank), identities in self.writers.items():
            mtime = mtimes.get((directory, rank))
            writers = [by_identity[i] for i in identities if i in by_identity]
            if mtime is None or not writers:
                continue
            newest = max(writers, key=lambda p: (p.start_s or 0.0, p.last_s or 0.0))
            if newest.last_s is None:
                continue
            if 0 < mtime - newest.last_s <= newest.export_interval_s + 1.0:
                newest.alive_s = max(newest.alive_s or 0.0, mtime)
        return processes


def _absorb(process: Process, other: Process) -> None:
    """Adds what ``other`` (the same process, from another file) holds to ``process``."""
    process.samples += other.samples
    process.spans += other.spans
    process.stacks += other.stacks
    process.open_spans += other.open_spans
    process.signal = process.signal or other.signal
    process.directories |= other.directories
    if len(other.resource) > len(process.resource):
        process.resource = other.resource
    for time_s in (other.first_s, other.last_s):
        if time_s is not None:
            process.see(time_s)


def _home(loose: Process, processes: list[Process]) -> Process | None:
    """The process of the same run and rank alive at the loose lines' time."""
    candidates = [
        p
        for p in processes
        if p.rank == loose.rank
        and p.run_id == loose.run_id
        and (loose.attempt is None or p.attempt == loose.attempt)
    ]
    if not candidates:
        return None
    at = loose.first_s if loose.first_s is not None else 0.0
    started = [p for p in candidates if (p.start_s or 0.0) <= at]
    pool = started or candidates
    return max(pool, key=lambda p: p.start_s or 0.0)


def _point_phase(point: Mapping[str, Any]) -> int | None:
    for kv in point.get("attributes") or ():
        if kv.get("key") == "dl.training.phase":
            return _PHASE_INDEX.get((kv.get("value") or {}).get("stringValue"))
    return None


#: From this many bytes of files, :func:`read_job` reads files in worker processes.
PARALLEL_BYTES = 64 * 2**20


def _read_file(file: RunFile, job: str | None) -> _Part:
    """Reads one file; the unit of work of a worker process."""
    reader = _Reader(job)
    reader.read(file)
    return reader.collect()


def _read_all(files: list[RunFile], job: str | None, workers: int) -> list[_Part]:
    if workers <= 1 or len(files) <= 1:
        return [_read_file(file, job) for file in files]
    import concurrent.futures
    import multiprocessing
    import threading

    # fork is quick and safe while this process has no other thread; spawn otherwise.
    single = threading.active_count() == 1
    method = "fork" if single and "fork" in multiprocessing.get_all_start_methods() else "spawn"
    order = sorted(range(len(files)), key=lambda i: -_size(files[i].path))  # largest first
    results: list[Any] = [None] * len(files)
    try:
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=min(workers, len(files)), mp_context=multiprocessing.get_context(method)
        ) as pool:
            futures = {pool.submit(_read_file, files[i], job): i for i in order}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = future.result()
    except (OSError, RuntimeError, concurrent.futures.process.BrokenProcessPool):
        return [_read_file(file, job) for file in files]  # no processes here: in this one
    return results


def read_job(
    directories: Iterable[Path], job: str | None = None, *, workers: int | None = None
) -> Job:
    """Reads the rank files of ``directories`` into the processes of ``job`` (lines of other
    jobs in the same files are skipped, with a note). Never raises.

    Args:
        directories: The job's run directories.
        job: Its key (:func:`otel_training.report.attempts.job_key`); ``None``: every line.
        workers: Processes that read files side by side; default: the CPU count when the
            files hold more than :data:`PARALLEL_BYTES`, else 1 (this process).
    """
    directories = list(directories)
    mtimes: dict[tuple[Path, int], float] = {}
    chosen: list[RunFile] = []
    for directory in directories:
        files = run_files(directory)
        span_ranks = {f.rank for f in files if f.signal == "spans" and _size(f.path) > 0}
        for file in files:
            mtime = _mtime(file.path)
            key = (file.path.parent, file.rank)
            mtimes[key] = max(mtimes.get(key, 0.0), mtime)
            if file.signal == "traces" and file.rank in span_ranks:
                continue  # the span lines say the same, and the starts of open spans
            if file.signal in ("metrics", "spans", "traces"):
                chosen.append(file)
    if workers is None:
        total = sum(_size(f.path) for f in chosen)
        workers = (os.cpu_count() or 1) if total > PARALLEL_BYTES else 1
    merged = _Part({}, {}, {}, [], 0, set())
    for part in _read_all(chosen, job, workers):
        merged.merge(part)
    job_result = Job(job, directories, merged.finish(mtimes), merged.notes, merged.bytes_read)
    if merged.other_jobs:
        names = sorted(merged.other_jobs)
        job_result.notes.append(
            f"Lines of {len(names)} other job(s) in the same files were skipped "
            f"({', '.join(names[:3])}{'...' if len(names) > 3 else ''})."
        )
    if not job_result.processes:
        job_result.notes.append("No process of this job was found in the files.")
    return job_result


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
