"""What leaves the process is bounded and always encodes: one rule for every string. A leaf
layer (``tests/test_import_layers.py``), so that every layer may apply the rule: it may import
only ``otel_training._log_once``, ``otel_training.clock``, ``otel_training.semconv``,
OpenTelemetry and its own modules, and imports OpenTelemetry's API and SDK and its own modules
alone.

Every string that otel-training hands to an exporter or writes to a file goes through one
function, :func:`safe_text`, so that one odd value never costs a batch, a line or a request.
That covers span names, status descriptions, event names, attribute keys and values (of spans,
events, links, log records, metric points and exemplars), log bodies, severity texts and event
names, metric names, units and descriptions, instrumentation scope names, versions, schema URLs
and attributes, and resource keys, values and schema URLs:

1. **Any string.** A name or key that is not a ``str`` becomes its ``str()`` (``<TypeName>`` if
   that raises). Lone surrogates, which no UTF-8 encoder accepts, become backslash escapes:
   U+DC80..U+DCFF, what ``os.fsdecode`` makes of an undecodable byte of a file name, as
   ``\\xNN`` (the byte, as Python writes bytes); any other lone surrogate as ``\\uDXXX``. The
   rest of the value is kept as it is; control characters stay (every encoder escapes them).
2. **Bounded values.** A string value is cut to the value-length limit, in characters after
   escaping: ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` for spans,
   ``OTEL_LOGRECORD_ATTRIBUTE_VALUE_LENGTH_LIMIT`` for logs, else
   ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else :data:`DEFAULT_VALUE_LENGTH`. Names and keys are
   cut to :data:`MAX_NAME_LENGTH`. A cut string ends with :func:`cut_marker` (``...[N characters
   cut]``) and is still no longer than the limit.
3. **Bounded records.** All strings and values of one span or log record together are bounded
   by :data:`RECORD_BUDGET_BYTES` of their worst-case JSON size (:func:`json_cost`): when a
   record is larger, its longest strings are cut further, alike; if that is not enough, events
   beyond what fits are dropped (exception events kept first), then items of sequences, then
   attributes. So a span JSON line stays under 1 MiB (the collector's filelog receiver's
   default) and one span under 1 MiB of protobuf.
4. **Any number.** Integers outside int64 (all OTLP carries) become floats; sequences keep at
   most :data:`MAX_SEQUENCE_LENGTH` items.

:func:`bounded_span` applies rules 1-4 to a finished span, :func:`bounded_log_record` to a log
record (its body and attribute values may also be bytes, maps and nested lists:
:func:`bounded_any`), :func:`bounded_metrics_data` to a collection of metrics; each also bounds
the record's instrumentation scope (:func:`bounded_scope`) and resource
(:func:`bounded_resource`). They run on an exporter's thread, never on the training thread.
Nothing here raises.

The modules, each importing the ones it uses directly (never through this ``__init__``), the
lower first:

- :mod:`~otel_training.export.limits.strings`: the string rule (rules 1, 2 and 4):
  :func:`safe_text`, :func:`bounded_value`, :func:`bounded_attributes`, :func:`bounded_any`,
  the cut marker, :class:`Limits` and the sizes;
- :mod:`~otel_training.export.limits.cost`: the cost model, rule 3's measure: worst-case JSON
  bytes of a string, a value, a record, a scope or a resource (:func:`json_cost`,
  :func:`span_cost`, :func:`log_record_cost`, :func:`metric_point_cost`...);
- :mod:`~otel_training.export.limits.fit`: rule 3's cuts, alike for every signal: strings cut
  alike, then sequences' items, then attributes dropped;
- :mod:`~otel_training.export.limits.scopes`: instrumentation scopes and resources, each bounded
  once (:func:`bounded_scope`, :func:`bounded_resource`);
- :mod:`~otel_training.export.limits.spans`, :mod:`~otel_training.export.limits.logs`,
  :mod:`~otel_training.export.limits.metrics`: each signal within its budget
  (:func:`bounded_span`, :func:`bounded_log_record`, :func:`bounded_metrics_data`).

Every name of theirs that other modules use is importable from here too
(``otel_training.export.limits.safe_text``). A module reads the names it imports from its own
namespace: a test that patches one patches it in each module that reads it.
"""

from __future__ import annotations

from otel_training.export.limits.cost import (
    any_cost,
    json_cost,
    log_record_cost,
    metric_point_cost,
    scope_cost,
    span_cost,
)
from otel_training.export.limits.logs import bounded_log_record
from otel_training.export.limits.metrics import bounded_metrics_data
from otel_training.export.limits.scopes import bounded_resource, bounded_scope
from otel_training.export.limits.spans import bounded_span
from otel_training.export.limits.strings import (
    DEFAULT_LIMITS,
    DEFAULT_VALUE_LENGTH,
    GROUP_BUDGET_BYTES,
    MAX_NAME_LENGTH,
    MAX_SEQUENCE_LENGTH,
    MAX_VALUE_DEPTH,
    RECORD_BUDGET_BYTES,
    Limits,
    bounded_any,
    bounded_attributes,
    bounded_value,
    cut_marker,
    plain,
    python_number,
    safe_text,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_VALUE_LENGTH",
    "GROUP_BUDGET_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_SEQUENCE_LENGTH",
    "MAX_VALUE_DEPTH",
    "RECORD_BUDGET_BYTES",
    "Limits",
    "any_cost",
    "bounded_any",
    "bounded_attributes",
    "bounded_log_record",
    "bounded_metrics_data",
    "bounded_resource",
    "bounded_scope",
    "bounded_span",
    "bounded_value",
    "cut_marker",
    "json_cost",
    "log_record_cost",
    "metric_point_cost",
    "plain",
    "python_number",
    "safe_text",
    "scope_cost",
    "span_cost",
]

# Read through the package beyond __all__: metric_cost by the exporters, private names by the
# tests (``import name as name``: a re-export).
from otel_training.export.limits.cost import _LOG_RECORD_COST as _LOG_RECORD_COST
from otel_training.export.limits.cost import _METRIC_COST as _METRIC_COST
from otel_training.export.limits.cost import _attributes_cost as _attributes_cost
from otel_training.export.limits.cost import _char_cost as _char_cost
from otel_training.export.limits.cost import _events_cost as _events_cost
from otel_training.export.limits.cost import _plain_bound as _plain_bound
from otel_training.export.limits.cost import _quick_bound as _quick_bound
from otel_training.export.limits.cost import _wide_by_scan as _wide_by_scan
from otel_training.export.limits.cost import _wide_by_size as _wide_by_size
from otel_training.export.limits.cost import metric_cost as metric_cost
from otel_training.export.limits.fit import _fewer_items as _fewer_items
from otel_training.export.limits.fit import _fit_attributes as _fit_attributes
from otel_training.export.limits.fit import _water_level as _water_level
from otel_training.export.limits.logs import _fit_log_record as _fit_log_record
from otel_training.export.limits.spans import _fewer_events as _fewer_events
from otel_training.export.limits.strings import _ESCAPES as _ESCAPES
from otel_training.export.limits.strings import _any_needs_work as _any_needs_work
from otel_training.export.limits.strings import _cut as _cut
from otel_training.export.limits.strings import _escaped_length as _escaped_length
