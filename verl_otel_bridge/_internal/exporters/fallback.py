"""A wrapper exporter: a primary destination, and a fallback exporter for what the primary cannot take."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.accounting import FAILED, FALLBACK, SpanCounts
from verl_otel_bridge._internal.exporters.base import export_guarded

logger = logging.getLogger(__name__)


class Primary(Protocol):
    """A destination that may be unavailable for some spans of a batch, and says which."""

    def deliver(self, spans: Sequence[ReadableSpan]) -> Sequence[ReadableSpan]:
        """Send ``spans``, counting those it took; return those it could not take (for the fallback)."""
        ...

    def force_flush(self, timeout_millis: int) -> bool:
        """Wait (bounded) for work still in flight; False if it did not finish in time."""
        ...

    def shutdown(self) -> None:
        """Stop the destination's threads and connections."""
        ...


class FallbackSpanExporter(SpanExporter):
    """Hands each batch to ``primary``, and what it could not take to ``fallback``.

    The primary counts what it took; this counts what the fallback accepted as
    ``fallback`` and what it refused or raised on as ``failed``, so each span lands in
    one bucket. A primary that raises is unavailable for the whole batch. Never raises.
    """

    def __init__(self, primary: Primary, fallback: SpanExporter, counts: SpanCounts, fallback_name: str) -> None:
        self.primary = primary
        self.fallback = fallback
        self.counts = counts
        self.fallback_name = fallback_name

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            left = self.primary.deliver(spans)
        except Exception:
            logger.exception(
                "the primary exporter raised on %d spans; they go to the %s exporter", len(spans), self.fallback_name
            )
            left = spans
        if not left:
            return SpanExportResult.SUCCESS
        result = export_guarded(self.fallback, left, f"{self.fallback_name} (fallback)")
        self.counts.add(FALLBACK if result is SpanExportResult.SUCCESS else FAILED, len(left))
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flushed = self.primary.force_flush(timeout_millis)
        return self.fallback.force_flush(timeout_millis) and flushed

    def shutdown(self) -> None:
        self.primary.shutdown()
        self.fallback.shutdown()
