"""Tests that check a rule of the documentation say which: ``@documents(doc, fragment)``.

``fragment`` is a verbatim piece of one sentence (or table row) of the rule in ``docs/<doc>``,
or in the repository's ``README.md`` (whitespace, line breaks and bold marks aside).
``tests/test_doc_rules.py`` reads these marks from the sources: each fragment must still be in
its document (a rule reworded without its tests fails), and each rule sentence of the parts it
lists must be named by at least one test. Not a test module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["documents"]

_F = TypeVar("_F", bound=Callable)


def documents(doc: str, fragment: str) -> Callable[[_F], _F]:
    """Marks a test as one that checks the rule of ``docs/<doc>`` (or ``README.md``) whose
    sentence contains ``fragment``."""

    def mark(test: _F) -> _F:
        test.__dict__.setdefault("documents", []).append((doc, fragment))
        return test

    return mark
