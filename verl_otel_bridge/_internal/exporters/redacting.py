"""A wrapper exporter that replaces the values of sensitive attributes before export."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.exporters.base import WrappingSpanExporter
from verl_otel_bridge._internal.protocol import INPUT, INPUT_APPENDED, REDACTED
from verl_otel_bridge._internal.records import replace_span

__all__ = ["REDACTED", "RedactingSpanExporter", "redact", "with_redaction"]


def redact(span: ReadableSpan, keys: frozenset[str]) -> ReadableSpan:
    """``span``, or a copy of it whose span and event attributes under ``keys`` are ``[REDACTED]``."""
    attributes = span.attributes or {}
    events = span.events
    if not keys.intersection(attributes) and not any(keys.intersection(e.attributes or {}) for e in events):
        return span
    return replace_span(
        span,
        attributes=_mask(attributes, keys),
        events=[Event(e.name, _mask(e.attributes or {}, keys), e.timestamp) for e in events],
    )


def _mask(attributes: Mapping[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    return {key: REDACTED if key in keys else value for key, value in attributes.items()}


class RedactingSpanExporter(WrappingSpanExporter):
    """Passes ``inner`` copies of the spans with the values of ``keys`` replaced by ``[REDACTED]``.

    Applies to span and event attributes. It sits at the top of the bridge's
    exporter chain, so no exporter (RL-Insight, fallback, memory) sees the
    original values. Spans without any of the keys are passed through as they are.
    """

    def __init__(self, inner: SpanExporter, keys: Iterable[str]) -> None:
        super().__init__(inner)
        self.keys = frozenset(keys)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([redact(span, self.keys) for span in spans])


def with_redaction(exporter: SpanExporter, keys: Iterable[str]) -> SpanExporter:
    """The top of an exporter chain: ``exporter`` behind a :class:`RedactingSpanExporter` when ``keys`` name any."""
    keys = tuple(keys)
    if INPUT in keys:  # a generate turn's input is stored in part under input.appended (protocol.md)
        keys += (INPUT_APPENDED,)
    return RedactingSpanExporter(exporter, keys) if keys else exporter
