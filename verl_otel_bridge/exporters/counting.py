"""A wrapper exporter that counts what its inner exporter accepted."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge.accounting import SpanCounts

logger = logging.getLogger("verl_otel_bridge.exporters")


class CountingSpanExporter(SpanExporter):
    """Counts accepted spans under ``key`` and refused or raised ones under ``failed``.

    Never raises: an exception from the inner exporter becomes ``FAILURE``.
    """

    def __init__(self, inner: SpanExporter, counts: SpanCounts, key: str) -> None:
        self.inner = inner
        self.counts = counts
        self.key = key

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            logger.exception("%s exporter raised on %d spans", self.key, len(spans))
            result = SpanExportResult.FAILURE
        self.counts.add(self.key if result is SpanExportResult.SUCCESS else "failed", len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
