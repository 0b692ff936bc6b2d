"""The hang watchdog: when this rank suspects a hang, its threads' Python stacks, once.

``configure()`` starts one :class:`Watchdog` thread per process (``otel-training-watchdog``, a
daemon) for a pipeline that records; shutdown stops it. About once a second (a quarter of the
hang floor when that is shorter) it reads the ledger (:data:`otel_training.health.ledger.
LEDGER`, a few microseconds, no lock) and compares the progress age with the hang threshold H
for the phase open now (:meth:`otel_training.health.hang.HangPolicy.threshold_s`, with this
rank's median step from its own readings and the longest occurrence of that phase, which the
ledger measures exactly when it closes), and notes in the progress record that it is alive (a
heartbeat: one store). When the age exceeds H, before it writes anything it reads the progress
records of the other processes of its attempt in its run directory (the peers of its node, all
ranks on a shared file system: a few 4 KiB files) and applies :func:`otel_training.health.hang.
stalled` to them all: while a peer is paused (in a checkpoint save, load, evaluation, startup or
warm-up within that phase's H, and alive), this rank waits for it and is not stalled; its hang
age runs from the end of the peer's pause. It then reads them again only when the verdict could
have changed (:func:`otel_training.health.hang.unchanged_for_s`). When the rank is stalled, it
writes every thread's Python stack once per stall (until the rank progresses again; 8 stalls at
most per process):

- as an OpenTelemetry log record (severity WARN), the event ``otel_training.hang.stalled``, on
  the pipeline's logger, with the trace context of the newest span still open,
  ``dl.training.phase``, ``megatron.iteration``, ``otel_training.hang.progress_age``,
  ``otel_training.hang.threshold``, when the stall began and how long until this check found
  it (``otel_training.hang.began``, ``otel_training.hang.time_to_detect``: the incident as
  this rank sees it, :mod:`otel_training.health.incidents`), ``thread.id``, ``thread.name``
  and ``code.stacktrace`` of the training thread, every stack in its body;
- as a ``stacks`` record in the span JSON lines (``docs/health.md``);
- and one ``logging`` warning naming where.

It never touches the training thread: the stacks come from ``sys._current_frames()`` on its own
thread, the ledger is read without a lock. A rank whose training thread holds the GIL (a long C
call) or is stopped cannot run it either; ``otel-training health`` names such a rank from the
outside (it goes silent). A forked child (a DataLoader worker) runs no watchdog. Nothing here
raises.
"""

from __future__ import annotations

import collections
import fnmatch
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Final

from otel_training import clock
from otel_training._log_once import LogOnce
from otel_training.health import hang as _hang
from otel_training.health import ledger as _ledger
from otel_training.health import record as _record

__all__ = ["Watchdog", "start", "stop"]

_logger = logging.getLogger("otel_training.health")

#: Stalls per process whose stacks are written at most.
MAX_DUMPS: Final = 8
#: Threads whose stacks one record holds at most (the training thread first).
MAX_THREADS: Final = 64
#: Step samples kept for the median step.
_SAMPLES: Final = 64
_STEP_TIME = tuple(_ledger.PHASES.index(p) for p in _hang.STEP_TIME_PHASES)


def thread_stacks(training_ident: int | None = None, *, skip: int | None = None) -> list[dict]:
    """Every thread's Python stack now: ``{"name", "id", "daemon", "training", "stack"}``
    each, the training thread (``training_ident``) first, ``skip`` left out. Any thread;
    never raises."""
    try:
        frames = sys._current_frames()
    except Exception:  # pragma: no cover - CPython has it
        return []
    threads = {t.ident: t for t in threading.enumerate()}
    found = []
    for ident, frame in frames.items():
        if ident == skip:
            continue
        thread = threads.get(ident)
        try:
            stack = "".join(traceback.format_stack(frame))
        except Exception:
            stack = "(the stack could not be formatted)"
        found.append(
            {
                "name": thread.name if thread is not None else f"thread {ident}",
                "id": ident,
                "daemon": bool(thread.daemon) if thread is not None else None,
                "training": ident == training_ident,
                "stack": stack,
            }
        )
    found.sort(key=lambda t: (not t["training"], str(t["name"])))
    return found[:MAX_THREADS]


class Watchdog:
    """Watches one ledger for a stall (see the module docstring).

    Args:
        policy: The hang thresholds.
        emit: Called with each ``stacks`` record (a dict), on the watchdog's thread.
        ledger: The ledger to watch (default: this process's).
        period_s: Seconds between readings (default: ``min(1, floor / 4)``, at least 0.05).
    """

    def __init__(
        self,
        policy: _hang.HangPolicy,
        emit: Callable[[dict[str, Any]], object],
        *,
        ledger: _ledger.Ledger | None = None,
        period_s: float | None = None,
    ) -> None:
        self.policy = policy
        self.emit = emit
        self.ledger = ledger if ledger is not None else _ledger.LEDGER
        self.period_s = (
            period_s if period_s is not None else max(0.05, min(1.0, policy.floor_s / 4))
        )
        self.dumps = 0
        self._steps: collections.deque[tuple[float, float]] = collections.deque(maxlen=_SAMPLES)
        self._dumped_for: tuple | None = None
        self._quiet: tuple[tuple, float] | None = None  # (stall, Unix seconds): peers excuse it
        self._identity: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._failed = LogOnce(_logger, exc_info=True)

    # -- the peers -------------------------------------------------------------------------

    def peers(self, now_s: float, median_step_s: float | None = None) -> list[_hang.RankState]:
        """The other processes of this rank's attempt as :func:`otel_training.health.hang.
        stalled` sees them at ``now_s`` (Unix seconds), from their progress records in this
        rank's run directory: the files of the same ``dl.run.id`` and ``dl.run.attempt``, not
        this process's, of a process that shut down neither cleanly nor before this one was
        created. A peer's threshold takes ``median_step_s`` (this rank's: the ranks of a
        synchronous job share their step time) and the longest phases its record holds; in a
        pause, its pause age runs from its latest evidence of life (its last transition or its
        watchdog's heartbeat). Empty without a record of its own. Runs on the caller's thread
        (the watchdog's): a directory listing and a read of 4 KiB per record; never raises."""
        path = self.ledger.record_path
        if path is None:
            return []
        identity = self._own_identity(path)
        if not identity:
            return []
        directory = os.path.dirname(path)
        try:
            names = fnmatch.filter(os.listdir(directory), _record.FILE_GLOB)
        except OSError:
            return []
        created = self.ledger.created_unix_s
        found = []
        for name in names:
            other = os.path.join(directory, name)
            if other == path:
                continue
            record = _record.read(other)
            if record is None or record.shutdown_s is not None:
                continue
            theirs = record.identity
            if theirs.get("dl.run.id") != identity.get("dl.run.id") or theirs.get(
                "dl.run.attempt"
            ) != identity.get("dl.run.attempt"):
                continue
            alive = record.last_evidence_s
            if alive < created:  # it ended before this process began: no peer of it
                continue
            phase = _ledger.PHASES[record.open_phase]
            progress = record.progress_s if record.progress_s is not None else record.created_s
            if phase in _hang.PAUSE_PHASES:
                pause_age: float | None = max(0.0, now_s - alive)
            elif record.pause_end_s is not None:
                pause_age = max(0.0, now_s - record.pause_end_s)
            else:
                pause_age = None
            rank = theirs.get("dl.rank")
            found.append(
                _hang.RankState(
                    rank if isinstance(rank, int) else -1,
                    phase,
                    max(0.0, now_s - progress),
                    self.policy.threshold_s(
                        phase, median_step_s, record.longest_s.get(record.open_phase)
                    ),
                    record.iteration,
                    pause_age_s=pause_age,
                    open_s=record.open_s + max(0.0, now_s - record.time_s),
                )
            )
        return found

    def _own_identity(self, path: str) -> dict[str, Any]:
        identity = self._identity
        if identity is None:
            record = _record.read(path)
            identity = record.identity if record is not None else {}
            if record is not None:
                self._identity = identity
        return identity

    # -- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the thread (once)."""
        if self._thread is not None:
            return
        thread = threading.Thread(target=self._run, name="otel-training-watchdog", daemon=True)
        self._thread = thread
        thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stops the thread and waits for it up to ``timeout_s`` seconds. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Its thread is alive (in this process)."""
        return self._thread is not None and self._thread.is_alive() and self._pid == os.getpid()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check()
            except Exception:
                self._failed("check", "the hang watchdog failed a check")

    # -- one reading -----------------------------------------------------------------------

    def _own_ident(self) -> int | None:
        """The watchdog thread's id when it is the caller (its own stack is left out)."""
        thread = self._thread
        return thread.ident if thread is threading.current_thread() else None

    def median_step_s(self) -> float | None:
        """This rank's median step, seconds, from the watchdog's readings."""
        return _hang.median_step_s(self._steps)

    def check(self) -> dict[str, Any] | None:
        """One reading: returns (and emits) the ``stacks`` record when the rank is stalled
        (:func:`otel_training.health.hang.stalled`, its peers' pauses applied) and has not
        written one for this stall, else ``None``. Runs on the calling thread (the watchdog's);
        reads the peers' records only while this rank alone would be stalled. Raises only what
        ``emit`` raises."""
        ledger = self.ledger
        reading = ledger.read()
        ledger.heartbeat()
        times = reading.phase_time_s
        phase = reading.open_phase
        if reading.iteration is not None and times["warmup"] > 0 and phase != "warmup":
            total = sum(times[_ledger.PHASES[i]] for i in _STEP_TIME)
            if not self._steps or reading.iteration != self._steps[-1][0]:
                self._steps.append((float(reading.iteration), total))
        median = self.median_step_s()
        threshold = self.policy.threshold_s(phase, median, reading.longest_s.get(phase))
        own = _hang.RankState(
            -1,
            phase,
            reading.age_s,
            threshold,
            reading.iteration,
            pause_age_s=reading.pause_age_s,
            open_s=reading.open_s,
        )
        if not _hang.stalled(own):
            return None
        stall = (reading.progress_unix_s, reading.iteration)
        if stall == self._dumped_for or self.dumps >= MAX_DUMPS:
            return None
        now = ledger._unix()
        quiet = self._quiet
        if quiet is not None and quiet[0] == stall and now < quiet[1]:
            return None  # a peer's pause excused this stall, and nothing can have changed
        peers = self.peers(now, median)
        if not _hang.stalled(own, peers):
            self._quiet = (stall, now + _hang.unchanged_for_s(own, peers))
            return None
        self._quiet = None
        self._dumped_for = stall
        self.dumps += 1
        # the incident as this rank sees it (docs/health.md, "Incidents"): its hang age counts
        # from its last progress or the end of its attempt's last pause it can see
        hang_age = _hang.hang_age_s(own, _hang.pause_age_s([own, *peers]))
        record = {
            "record": "stacks",
            "time_ns": clock.now_ns(),
            "reason": "hang_suspected",
            "phase": phase,
            "open_s": reading.open_s,
            "progress_age_s": reading.age_s,
            "threshold_s": threshold,
            "began_s": now - hang_age,
            "time_to_detect_s": hang_age,
            "iteration": reading.iteration,
            "threads": thread_stacks(self.ledger._thread, skip=self._own_ident()),
        }
        self.emit(record)
        return record


# -- the process's watchdog, following the configured pipeline ---------------------------------

_lock = threading.Lock()
_current: tuple[Watchdog, object] | None = None


def start(telemetry: Any) -> Watchdog | None:
    """Starts this process's watchdog for ``telemetry`` (an
    :class:`otel_training.configuration.Telemetry` that records), replacing the one of an earlier
    pipeline. Returns it, or ``None`` when ``telemetry`` does not record. Never raises."""
    global _current
    try:
        if not telemetry.recording:
            return None
        watchdog = Watchdog(telemetry.settings.hang, _Sink(telemetry))
        with _lock:
            previous, _current = _current, (watchdog, telemetry)
        if previous is not None:
            previous[0].stop(0.0)
        watchdog.start()
        return watchdog
    except Exception:
        _logger.warning("the hang watchdog could not start", exc_info=True)
        return None


def stop(telemetry: Any = None) -> None:
    """Stops the watchdog (only if it follows ``telemetry``, when given). Never raises."""
    global _current
    with _lock:
        current = _current
        if current is None or (telemetry is not None and current[1] is not telemetry):
            return
        _current = None
    current[0].stop()


def current() -> Watchdog | None:
    """The running watchdog of this process, or ``None``."""
    found = _current
    return None if found is None else found[0]


def _after_fork_in_child() -> None:
    global _current
    _current = None  # its thread is the parent's; a child runs none


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Sink:
    """Writes a ``stacks`` record where the pipeline writes: the span JSON lines, a log record
    with the trace context of the newest open span, a ``logging`` warning."""

    def __init__(self, telemetry: Any) -> None:
        self.telemetry = telemetry

    def __call__(self, record: dict[str, Any]) -> None:
        telemetry = self.telemetry
        where = []
        span = _newest_open_span(telemetry)
        context = span.get_span_context() if span is not None else None
        if context is not None and context.is_valid:
            record["trace_id"] = f"{context.trace_id:032x}"
            record["span_id"] = f"{context.span_id:016x}"
        span_lines = getattr(telemetry, "span_lines", None)
        if span_lines is not None:
            try:
                resource = getattr(telemetry.tracer_provider, "resource", None)
                span_lines.write_record(record, resource)
                where.append(str(span_lines.path))
            except Exception:
                _logger.debug("could not write the stacks record", exc_info=True)
        try:
            if _emit_log(telemetry, record, span):
                where.append("the log records")
        except Exception:
            _logger.debug("could not emit the stacks log record", exc_info=True)
        _logger.warning(
            "otel-training: no progress for %.1f s in %s (hang threshold %.1f s): the Python "
            "stacks of %d threads are in %s",
            record["progress_age_s"],
            record["phase"],
            record["threshold_s"],
            len(record["threads"]),
            " and ".join(where) or "no file (no span lines, no logs exporter)",
        )


def _newest_open_span(telemetry: Any) -> Any:
    open_spans = getattr(telemetry, "open_spans", None)
    if open_spans is None:
        return None
    try:
        spans = list(open_spans.spans.copy())  # one step under the GIL
    except Exception:
        return None
    return spans[-1] if spans else None


def _emit_log(telemetry: Any, record: dict[str, Any], span: Any) -> bool:
    from opentelemetry import _logs as logs_api
    from opentelemetry._logs import LogRecord, SeverityNumber
    from opentelemetry.semconv._incubating.attributes.thread_attributes import (
        THREAD_ID,
        THREAD_NAME,
    )
    from opentelemetry.semconv.attributes.code_attributes import CODE_STACKTRACE

    from otel_training.logs.bridge import link_to_span
    from otel_training.semconv.attributes import (
        DL_TRAINING_PHASE,
        MEGATRON_ITERATION,
        OTEL_TRAINING_HANG_BEGAN,
        OTEL_TRAINING_HANG_PROGRESS_AGE,
        OTEL_TRAINING_HANG_THRESHOLD,
        OTEL_TRAINING_HANG_TIME_TO_DETECT,
    )
    from otel_training.semconv.events import OTEL_TRAINING_HANG_STALLED

    provider = telemetry.logger_provider
    if isinstance(provider, logs_api.NoOpLoggerProvider):
        return False
    threads = record["threads"]
    body = [
        f"no progress for {record['progress_age_s']:.1f} s in {record['phase']} (hang threshold "
        f"{record['threshold_s']:.1f} s); Python stacks of {len(threads)} threads:"
    ]
    for thread in threads:
        mark = " (training thread)" if thread["training"] else ""
        body.append(f"\nthread {thread['name']} ({thread['id']}){mark}:\n{thread['stack']}")
    attributes: dict[str, Any] = {
        DL_TRAINING_PHASE: record["phase"],
        OTEL_TRAINING_HANG_PROGRESS_AGE: float(record["progress_age_s"]),
        OTEL_TRAINING_HANG_THRESHOLD: float(record["threshold_s"]),
        OTEL_TRAINING_HANG_BEGAN: float(record["began_s"]),
        OTEL_TRAINING_HANG_TIME_TO_DETECT: float(record["time_to_detect_s"]),
    }
    if record.get("iteration") is not None:
        attributes[MEGATRON_ITERATION] = int(record["iteration"])
    if threads:
        attributes[THREAD_ID] = int(threads[0]["id"])
        attributes[THREAD_NAME] = str(threads[0]["name"])
        attributes[CODE_STACKTRACE] = threads[0]["stack"]
    log_record = LogRecord(
        timestamp=int(record["time_ns"]),
        observed_timestamp=time.time_ns(),
        severity_text="WARN",
        severity_number=SeverityNumber.WARN,
        body="".join(body),
        attributes=attributes,
        event_name=OTEL_TRAINING_HANG_STALLED,
    )
    context = span.get_span_context() if span is not None else None
    provider.get_logger("otel_training.health").emit(link_to_span(log_record, context))
    return True
