"""``NvtxSpanProcessor``: every span mirrored as an NVTX range, for Nsight Systems timelines.

One NVTX *start/end* range per span (``nvtxDomainRangeStartEx`` / ``nvtxDomainRangeEnd``),
keyed by the span id, never a push/pop range: span processors run on the thread that starts or
ends the span, and spans may end on another thread than the one that started them, or out of
LIFO order (DESIGN.md section 7). A push/pop stack is per thread and strictly nested; start/end
ranges are process-wide and may overlap, so they stay balanced in every such case.

The ranges are in one NVTX domain (``otel_training`` by default), with one NVTX category and one
colour per span group (``job``, ``step``, ``checkpoint``...), and the span name as message.

No NVTX call is made at all when the ``nvtx`` module is missing, when the processor is disabled
(``OTEL_PYTHON_TRAINING_NVTX=false``), or when the ``nvtx`` package is disabled by its own
``NVTX_DISABLE`` variable (which its domain API does not honour by itself). Without a tool such
as Nsight Systems attached, the ``nvtx`` package hands out a dummy domain, and the processor
then does nothing either. Nothing here branches on what NVTX returns: a range id is stored and
given back, whatever it is.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_training._log_once import LogOnce
from otel_training.config import CUSTOM_SPAN_GROUP, DEFAULT_NVTX_DOMAIN
from otel_training.semconv.spans import SPANS

__all__ = ["GROUP_COLORS", "NvtxSpanProcessor"]

_logger = logging.getLogger(__name__)

#: ARGB colour of the ranges of each span group (a colour-blind-safe palette).
GROUP_COLORS: Mapping[str, int] = {
    "job": 0xFF4C72B0,
    "model_init": 0xFF8C8C8C,
    "checkpoint": 0xFFDD8452,
    "load_checkpoint": 0xFFE5AE38,
    "evaluate": 0xFF8172B3,
    "first_iteration": 0xFF2CA02C,
    "step": 0xFF55A868,
    "forward_backward": 0xFF64B5CD,
    "optimizer": 0xFFC44E52,
    "data_loading": 0xFFCCB974,
    "microbatch": 0xFF91BFDB,
    "layer": 0xFFB8B8E6,
    "communication": 0xFFDA8BC3,
    "activation_offload": 0xFFA6761D,
    "trace_region": 0xFF999999,
    "inference": 0xFF17BECF,
    CUSTOM_SPAN_GROUP: 0xFF937860,
}

#: At most this many distinct span names get their own registered NVTX message; the ranges of
#: further names share the message ``(more span names)``, so memory stays bounded.
MAX_MESSAGES = 1024
_OVERFLOW_MESSAGE = "(more span names)"

_live: weakref.WeakSet[NvtxSpanProcessor] = weakref.WeakSet()


def end_ranges_now(span_id: int) -> None:
    """Ends, in every live processor, the range of the span ``span_id`` now.

    For a span whose end is deferred (its phase exited, but the span ends later on another
    thread, once device values it carries reach the host): the NVTX range closes when the phase
    exits, and the processor's ``on_end`` later finds nothing to end. Never raises.
    """
    for processor in list(_live):
        processor._end(span_id)


class NvtxSpanProcessor(SpanProcessor):
    """Mirrors every span as an NVTX start/end range keyed by its span id.

    Args:
        domain: Name of the NVTX domain of the ranges.
        enabled: ``False`` makes the processor inert: no NVTX call at all.
        colors: ARGB colour per span group, replacing :data:`GROUP_COLORS` entries.

    The group of a span is its group in the registry (``otel_training.semconv.SPANS``), or
    ``custom`` for any other name. ``on_start`` and ``on_end`` run on the thread that starts or
    ends the span; they never raise (a failure is logged once and the span is skipped). The
    constructor imports ``nvtx`` and creates the domain; it raises nothing either.
    """

    def __init__(
        self,
        domain: str = DEFAULT_NVTX_DOMAIN,
        *,
        enabled: bool = True,
        colors: Mapping[str, int] | None = None,
    ) -> None:
        self._domain = None
        self._domain_name = domain
        self._ranges: dict[int, object] = {}
        self._event_attributes: dict[str, object] = {}
        self._colors = {**GROUP_COLORS, **(colors or {})}
        self._failed = LogOnce(_logger, exc_info=True)
        if not enabled:
            return
        try:
            import nvtx
        except ImportError:
            return
        try:
            if not nvtx.enabled():  # NVTX_DISABLE is set
                return
            domain_object = nvtx.get_domain(domain)
            if isinstance(domain_object, nvtx.Domain):  # else: no tool attached, a dummy
                self._domain = domain_object
                _live.add(self)
        except Exception:
            _logger.warning("NVTX is unavailable; spans are not mirrored as ranges", exc_info=True)

    @property
    def active(self) -> bool:
        """True when ranges are being recorded: nvtx imports, is enabled, and a tool (such as
        Nsight Systems) is attached to the process."""
        return self._domain is not None

    @property
    def domain(self) -> str:
        """The name of the NVTX domain."""
        return self._domain_name

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        domain = self._domain
        if domain is None:
            return
        try:
            name = span.name
            attributes = self._event_attributes.get(name)
            if attributes is None:
                attributes = self._attributes_for(domain, name)
            self._ranges[span.context.span_id] = domain.start_range(attributes)
        except Exception:
            self._fail()

    def on_end(self, span: ReadableSpan) -> None:
        if self._domain is not None:
            self._end(span.context.span_id)

    def _end(self, span_id: int) -> None:
        range_id = self._ranges.pop(span_id, None)
        if range_id is None:
            return
        try:
            self._domain.end_range(range_id)
        except Exception:
            self._fail()

    def shutdown(self) -> None:
        """Ends the ranges of spans still open, so that every range is balanced, and stops."""
        domain = self._domain
        if domain is None:
            return
        for span_id in list(self._ranges):
            self._end(span_id)
        self._domain = None
        _live.discard(self)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def range_attributes(self, name: str, group: str) -> tuple[object | None, object | None]:
        """(domain, event attributes) for NVTX-only phases of ``name`` in ``group``: the
        processor's domain and the same message, colour and category its span ranges get;
        ``(None, None)`` when no tool is attached. Never raises."""
        domain = self._domain
        if domain is None:
            return None, None
        try:
            return domain, self._attributes_for(domain, name, group)
        except Exception:
            self._fail()
            return None, None

    def _attributes_for(self, domain, name: str, group: str | None = None):
        # No lock: two threads that race here both build the same attributes, and one wins.
        if group is None:
            spec = SPANS.get(name)
            group = spec.group if spec is not None else CUSTOM_SPAN_GROUP
        if len(self._event_attributes) >= MAX_MESSAGES:
            name, group = _OVERFLOW_MESSAGE, CUSTOM_SPAN_GROUP
            attributes = self._event_attributes.get(name)
            if attributes is not None:
                return attributes
        attributes = domain.get_event_attributes(
            message=name,
            color=self._colors.get(group, GROUP_COLORS[CUSTOM_SPAN_GROUP]),
            category=group,
        )
        self._event_attributes[name] = attributes
        return attributes

    def _fail(self) -> None:
        self._failed("range", "an NVTX range call failed; continuing")
