"""Metrics within their budget: :func:`bounded_metrics_data` applies rules 1, 2 and 4 of
:mod:`otel_training.export.limits` to a collection of metrics (names, units and descriptions,
point and exemplar attributes, integer points beyond int64 saturated), their scopes and
resources, and fits each point to the record budget, its exemplars dropped first.
"""

from __future__ import annotations

from typing import Any

from otel_training.export.limits.cost import (
    _POINT_COST,
    _attributes_cost,
    metric_point_cost,
)
from otel_training.export.limits.fit import _fit_attributes
from otel_training.export.limits.scopes import bounded_resource, bounded_scope
from otel_training.export.limits.strings import (
    _INT64_MAX,
    _INT64_MIN,
    DEFAULT_LIMITS,
    Limits,
    _is_clean_name,
    _needs_work,
    _safe_name,
    bounded_attributes,
)

__all__ = ["bounded_metrics_data"]


def bounded_metrics_data(
    data: Any, limits: Limits = DEFAULT_LIMITS, saturated: list[str] | None = None
) -> Any:
    """A ``MetricsData`` after rules 1, 2 and 4: resources and scopes bounded
    (:func:`bounded_resource`, :func:`bounded_scope`), metric names, units and descriptions
    as names (cut at 1,024 characters), point and exemplar attributes bounded, and integer
    points beyond int64 saturated at its ends (the name of each such metric is appended to
    ``saturated``). The same object when nothing needed a change. Runs on the reader's thread;
    never raises (data that cannot even be read is returned as it is)."""
    try:
        if not _metrics_need_work(data, limits):
            return data
        return _bounded_metrics_data(data, limits, saturated)
    except Exception:
        return data


def _metrics_need_work(data: Any, limits: Limits) -> bool:
    limit, budget = limits.value_length, limits.record_budget_bytes
    for resource_metrics in data.resource_metrics:
        if bounded_resource(resource_metrics.resource, limit) is not resource_metrics.resource:
            return True
        for scope_metrics in resource_metrics.scope_metrics:
            if bounded_scope(scope_metrics.scope, limit) is not scope_metrics.scope:
                return True
            for metric in scope_metrics.metrics:
                if not (
                    _is_clean_name(metric.name)
                    and _is_clean_name(metric.unit or "")
                    and _is_clean_name(metric.description or "")
                ):
                    return True
                for point in metric.data.data_points:
                    if _needs_work(point.attributes, limit):
                        return True
                    value = getattr(point, "value", None)
                    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
                        return True
                    for exemplar in point.exemplars:
                        if _needs_work(exemplar.filtered_attributes, limit):
                            return True
                    if metric_point_cost(point) > budget:
                        return True
    return False


def _bounded_metrics_data(data: Any, limits: Limits, saturated: list[str] | None) -> Any:
    import dataclasses

    from opentelemetry.sdk.metrics.export import MetricsData

    limit, budget = limits.value_length, limits.record_budget_bytes

    def point(p: Any, metric_name: str) -> Any:
        changes: dict[str, Any] = {}
        attributes = bounded_attributes(p.attributes, limit)
        cost = metric_point_cost(p)
        if cost > budget:
            # The attributes (the series) fit the budget without the exemplars, which go
            # first (below) when the point with them is still over it.
            exemplars_cost = sum(
                _POINT_COST + _attributes_cost(e.filtered_attributes) for e in p.exemplars
            )
            attributes = _fit_attributes(
                dict(attributes or {}),
                budget - (cost - exemplars_cost - _attributes_cost(p.attributes)),
            )
        if attributes is not p.attributes:
            changes["attributes"] = attributes
        value = getattr(p, "value", None)
        if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
            changes["value"] = _INT64_MAX if value > 0 else _INT64_MIN
            if saturated is not None:
                saturated.append(metric_name)
        exemplars = p.exemplars
        if exemplars:
            changes["exemplars"] = [
                dataclasses.replace(
                    e, filtered_attributes=bounded_attributes(e.filtered_attributes, limit)
                )
                for e in exemplars
            ]
            if metric_point_cost(dataclasses.replace(p, **changes)) > budget:
                changes["exemplars"] = []  # a point over its budget keeps its value
        return dataclasses.replace(p, **changes) if changes else p

    resources = []
    for resource_metrics in data.resource_metrics:
        scopes = []
        for scope_metrics in resource_metrics.scope_metrics:
            metrics = []
            for metric in scope_metrics.metrics:
                name = _safe_name(metric.name)
                metrics.append(
                    dataclasses.replace(
                        metric,
                        name=name,
                        description=_safe_name(metric.description or ""),
                        unit=_safe_name(metric.unit or ""),
                        data=dataclasses.replace(
                            metric.data,
                            data_points=[point(p, name) for p in metric.data.data_points],
                        ),
                    )
                )
            scopes.append(
                dataclasses.replace(
                    scope_metrics, scope=bounded_scope(scope_metrics.scope, limit), metrics=metrics
                )
            )
        resources.append(
            dataclasses.replace(
                resource_metrics,
                resource=bounded_resource(resource_metrics.resource, limit),
                scope_metrics=scopes,
            )
        )
    return MetricsData(resource_metrics=resources)
