"""Instrumentation scopes and resources: few objects, each bounded once.

:func:`bounded_scope` and :func:`bounded_resource` apply rules 1, 2 and 4 of
:mod:`otel_training.export.limits` to a scope's or a resource's strings and fit it, all
together, under :data:`~otel_training.export.limits.strings.GROUP_BUDGET_BYTES` (rule 3). The
bounding of spans, log records and metrics calls them for each record's scope and resource; the
result is kept by the object and the value-length limit, so that the records that share a scope
or a resource check it once.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_training.export.limits.cost import _group_cost, scope_cost
from otel_training.export.limits.fit import _fit_attributes
from otel_training.export.limits.strings import (
    DEFAULT_VALUE_LENGTH,
    GROUP_BUDGET_BYTES,
    _is_clean_name,
    _needs_work,
    _safe_name,
    bounded_attributes,
)

__all__ = ["bounded_resource", "bounded_scope"]

# By (id, value-length limit): one resource is bounded for each signal's limit.
_BOUNDED: dict[tuple[int, int | None], tuple[Any, Any]] = {}
_MAX_BOUNDED = 1024


def _remember(original: Any, limit: int | None, bounded: Any) -> Any:
    if len(_BOUNDED) >= _MAX_BOUNDED:
        _BOUNDED.clear()
    # The original is held, so its id is not reused while it is here.
    _BOUNDED[(id(original), limit)] = (original, bounded)
    return bounded


def bounded_scope(
    scope: InstrumentationScope | None, limit: int | None = DEFAULT_VALUE_LENGTH
) -> InstrumentationScope | None:
    """An instrumentation scope with its name, version and schema URL as names (rules 1-2 at
    :data:`MAX_NAME_LENGTH`), its attributes bounded and, all together, under
    :data:`GROUP_BUDGET_BYTES` (rule 3); the same object when nothing needed a change
    (checked once per scope object). Never raises."""
    if scope is None:
        return None
    known = _BOUNDED.get((id(scope), limit))
    if known is not None and known[0] is scope:
        return known[1]
    try:
        name, version, schema_url = scope.name, scope.version, scope.schema_url
        attributes = scope.attributes
        if (
            _is_clean_name(name)
            and (version is None or _is_clean_name(version))
            and (schema_url is None or _is_clean_name(schema_url))
            and not _needs_work(attributes, limit)
            and scope_cost(scope) <= GROUP_BUDGET_BYTES
        ):
            return _remember(scope, limit, scope)
        name = _safe_name(name)
        version = None if version is None else _safe_name(version)
        schema_url = None if schema_url is None else _safe_name(schema_url)
        attributes = _fit_attributes(
            dict(bounded_attributes(attributes, limit) or {}),
            GROUP_BUDGET_BYTES - _group_cost(name, version, schema_url),
        )
        bounded = InstrumentationScope(name, version, schema_url, attributes)
    except Exception:  # a scope that cannot even be read: named for what it is
        bounded = InstrumentationScope("<unreadable scope>")
    return _remember(scope, limit, bounded)


def bounded_resource(resource: Resource | None, limit: int | None = DEFAULT_VALUE_LENGTH) -> Any:
    """A resource with its keys, values and schema URL after rules 1, 2 and 4, all together
    under :data:`GROUP_BUDGET_BYTES` (rule 3); the same object when nothing needed a change
    (checked once per resource object). Never raises."""
    if resource is None:
        return None
    known = _BOUNDED.get((id(resource), limit))
    if known is not None and known[0] is resource:
        return known[1]
    try:
        attributes = resource.attributes
        schema_url = resource.schema_url
        if (
            not _needs_work(attributes, limit)
            and (schema_url is None or _is_clean_name(schema_url))
            and scope_cost(resource) <= GROUP_BUDGET_BYTES
        ):
            return _remember(resource, limit, resource)
        schema_url = None if schema_url is None else _safe_name(schema_url)
        attributes = _fit_attributes(
            dict(bounded_attributes(attributes, limit) or {}),
            GROUP_BUDGET_BYTES - _group_cost(schema_url),
        )
        bounded = Resource(attributes, schema_url)
    except Exception:
        bounded = Resource({})
    return _remember(resource, limit, bounded)
