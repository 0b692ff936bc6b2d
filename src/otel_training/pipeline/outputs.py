"""The embedded default's files of one pipeline: each signal's ``{signal}-rank{R}.jsonl`` in this
run's directory, where it is opened, what happens when it cannot be, and how its lines count the
records they hold.

The directory and the stream are :mod:`otel_training.export.files`'; this module decides which
directory a pipeline tries, in which order, and what each failure says.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from otel_training import config
from otel_training.config import variables as ev
from otel_training.export import files

__all__ = ["Outputs", "counted"]

_logger = logging.getLogger("otel_training")


def _with_default(base: str) -> list[str]:
    """``base``, then the default output directory if that is another."""
    return [base] if base == config.DEFAULT_OUTPUT_DIR else [base, config.DEFAULT_OUTPUT_DIR]


class Outputs:
    """The embedded default's files of one pipeline: each in this run's directory
    (:mod:`otel_training.export.files`), opened without following symlinks, with a fallback, written
    through :class:`otel_training.export.files.AppendStream` (which survives the directory being
    removed, filled or made read-only mid-run)."""

    def __init__(
        self, settings: config.Settings, identity: Mapping[str, Any] | None = None
    ) -> None:
        self._settings = settings
        self._identity = dict(identity or {})
        self._run_dirs: dict[str, str | OSError] = {}
        self.files: list[TextIO] = []
        self.run_dir: str | None = None

    def _run_dir(self, base: str) -> str:
        found = self._run_dirs.get(base)
        if found is None:
            try:
                found = files.run_directory(base, self._settings.identity.run_id or "run")
            except OSError as error:
                found = error
            self._run_dirs[base] = found
        if isinstance(found, OSError):
            raise found
        return found

    def _setting(self, base: str | None, fallback: bool) -> str:
        """The variable that chose the directory, as a message shows it."""
        output_dir = self._settings.output_dir
        if base is not None:
            return f"{ev.OTEL_PYTHON_TRAINING_JSONLOG_DIR}={base}"
        if fallback:
            return (
                f"the default {config.DEFAULT_OUTPUT_DIR}, as "
                f"{ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR}={output_dir} could not be used"
            )
        if output_dir == config.DEFAULT_OUTPUT_DIR:
            return f"{ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR}, unset: the default {output_dir}"
        return f"{ev.OTEL_PYTHON_TRAINING_OUTPUT_DIR}={output_dir}"

    def open(self, signal_name: str, base: str | None = None) -> tuple[TextIO | None, str | None]:
        """This rank's file of ``signal_name`` (``{signal}-rank{R}.jsonl``) in the run's
        directory inside ``base`` (a directory the user named: no fallback), else inside the
        output directory, falling back to the default one, then to no file; each failure
        logs one warning naming the path tried and the variable that set it. Never raises."""
        bases = [base] if base is not None else _with_default(self._settings.output_dir)
        file_name = f"{signal_name}-rank{self._settings.identity.rank}.jsonl"
        for i, candidate in enumerate(bases):
            path = os.path.join(candidate, file_name)
            setting = self._setting(base, fallback=i > 0)
            try:
                directory = self._run_dir(candidate)
                path = os.path.join(directory, file_name)
                stream = files.AppendStream(
                    path,
                    what="span JSON lines" if signal_name == "spans" else signal_name,
                    setting=setting,
                    identity=self._identity,
                )
            except OSError as error:
                why = "a symlink is there" if error.errno == errno.ELOOP else error
                _logger.warning(
                    "otel-training cannot write %s to %s (%s; the directory is set by %s); %s.",
                    signal_name,
                    path,
                    why,
                    setting,
                    "trying the default directory"
                    if i + 1 < len(bases)
                    else f"{signal_name} are not written to a file",
                )
                continue
            self.files.append(stream)  # type: ignore[arg-type]
            if base is None and self.run_dir is None:
                self.run_dir = directory
            return stream, path  # type: ignore[return-value]
        return None, None


class _Counted:
    """A file exporter (one line per export) whose stream, an
    :class:`otel_training.export.files.AppendStream`, is told how many records each export holds, so
    that a line that cannot be written is counted in spans or log records too."""

    def __init__(self, exporter: Any, stream: Any) -> None:
        self._exporter = exporter
        self._records = stream.records

    def export(self, batch: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        self._records(len(batch))
        return self._exporter.export(batch, *args, **kwargs)

    def force_flush(self, *args: Any, **kwargs: Any) -> bool:
        return self._exporter.force_flush(*args, **kwargs)

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self._exporter.shutdown(*args, **kwargs)


def counted(exporter: Any, stream: Any) -> Any:
    """``exporter`` wrapped in :class:`_Counted` when ``stream`` can count records."""
    return _Counted(exporter, stream) if hasattr(stream, "records") else exporter
