"""A wrapper exporter that replaces the values of sensitive attributes before export."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge.records import replace_span

#: What a redacted value becomes.
REDACTED = "[REDACTED]"


class RedactingSpanExporter(SpanExporter):
    """Passes ``inner`` copies of the spans with the values of ``keys`` replaced by ``[REDACTED]``.

    Applies to span and event attributes. It sits at the top of the bridge's
    exporter chain, so no exporter (RL-Insight, fallback, memory) sees the
    original values. Spans without any of the keys are passed through as they are.
    """

    def __init__(self, inner: SpanExporter, keys: Iterable[str]) -> None:
        self.inner = inner
        self.keys = frozenset(keys)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([self.redact(span) for span in spans])

    def redact(self, span: ReadableSpan) -> ReadableSpan:
        """``span``, or a copy of it with the values of ``keys`` replaced."""
        attributes = span.attributes or {}
        events = span.events
        if not self.keys.intersection(attributes) and not any(
            self.keys.intersection(e.attributes or {}) for e in events
        ):
            return span
        return replace_span(
            span,
            attributes=self._mask(attributes),
            events=[Event(e.name, self._mask(e.attributes or {}), e.timestamp) for e in events],
        )

    def _mask(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        return {key: REDACTED if key in self.keys else value for key, value in attributes.items()}

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
