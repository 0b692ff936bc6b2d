"""Reading environment variables with one policy: a bad value logs one warning, then the
default. The primitives that :mod:`otel_training.config` and :mod:`otel_training.config.identity`
build on; nothing here raises on a value.

Warnings never show what may be a secret: header values and URL userinfo are left out by the
callers (:func:`redact_url`), and a malformed entry is named by its position.
"""

from __future__ import annotations

import logging
import math
import urllib.parse
from collections.abc import Mapping

from otel_training._log_once import LogOnce

_logger = logging.getLogger("otel_training.config")


def show(value: object) -> str:
    """A value as a warning writes it: whole floats without ``.0``, strings quoted."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def redact_url(url: str) -> str:
    """``url`` without its userinfo (``http://user:secret@host`` -> ``http://host``). Never
    raises: a value that does not parse is shown only by its scheme."""
    try:
        parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if parts.username is None and parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port is not None else "")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return (
            url.split("://", 1)[0] + "://(unparsable URL)" if "://" in url else "(unparsable URL)"
        )


class EnvReader:
    """Typed reads of one mapping of variables; each unusable value warns once per reader."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._env = environ
        self._said = LogOnce(_logger)

    def warn(self, message: str, *args: object) -> None:
        """Logs a warning once per reader (generic variables are read for several signals)."""
        self._said.say(message, *args)

    def raw(self, name: str) -> str | None:
        """The stripped value of ``name``; ``None`` when unset or blank."""
        value = self._env.get(name)
        if value is None or not value.strip():
            return None
        return value.strip()

    def first(self, *names: str) -> tuple[str, str | None]:
        """The first of ``names`` that is set, and its value; else the last name and None."""
        for name in names:
            raw = self.raw(name)
            if raw is not None:
                return name, raw
        return names[-1], None

    def reject(self, name: str, raw: str, default: object, why: str) -> None:
        """The one warning of the policy: ``name=raw why; using default instead``."""
        if default is None:
            self.warn("%s=%r %s; ignoring it.", name, raw, why)
        else:
            self.warn("%s=%r %s; using %s instead.", name, raw, why, show(default))

    def boolean(self, name: str, default: bool) -> bool:
        """``true``/``false``, case-insensitive, surrounding blanks ignored."""
        raw = self.raw(name)
        if raw is None:
            return default
        lowered = raw.lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
        self.reject(name, raw, default, "is not 'true' or 'false'")
        return default

    def positive(
        self,
        name: str,
        default: float,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        why_maximum: str = "",
    ) -> float:
        """A finite number > 0; below ``minimum`` it is raised to it, above ``maximum`` (or
        not a positive number) the default is used; each with one warning."""
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            self.reject(name, raw, default, "is not a number")
            return default
        if not math.isfinite(value) or value <= 0:
            self.reject(name, raw, default, "must be a finite number greater than zero")
            return default
        if maximum is not None and value > maximum:
            self.reject(name, raw, default, f"is above {show(maximum)}{why_maximum}")
            return default
        if minimum is not None and value < minimum:
            self.warn("%s=%r is below %s; using %s.", name, raw, show(minimum), show(minimum))
            return minimum
        return value

    def positive_int(self, name: str, default: int) -> int:
        """A whole number > 0 (see :meth:`positive`)."""
        value = self.positive(name, float(default))
        if value != int(value):
            self.reject(name, show(value), default, "must be a whole number")
            return default
        return int(value)

    def non_negative_int(self, name: str) -> int | None:
        """A whole number >= 0, or ``None`` when unset or unusable (one warning)."""
        raw = self.raw(name)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            self.reject(name, raw, None, "is not a whole number")
            return None
        if value < 0:
            self.reject(name, raw, None, "is negative")
            return None
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        """One of ``choices``, case-insensitive."""
        raw = self.raw(name)
        if raw is None:
            return default
        if raw.lower() in choices:
            return raw.lower()
        self.reject(name, raw, default, f"is not one of {', '.join(choices)}")
        return default
