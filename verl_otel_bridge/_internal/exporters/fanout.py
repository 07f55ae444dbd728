"""A wrapper exporter that sends copies of every batch to extra exporters."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.accounting import SpanCounts, copied
from verl_otel_bridge._internal.exporters.base import export_guarded

logger = logging.getLogger(__name__)


class FanOutSpanExporter(SpanExporter):
    """Exports to ``primary`` (its result is the result) and a copy to each of ``copies``.

    Copies are counted apart from the accounting equation, as
    ``copies.<name>`` when accepted and ``copies_failed.<name>`` when not, so a
    failing secondary never hides or double-counts the primary's outcome.
    """

    def __init__(self, primary: SpanExporter, copies: dict[str, SpanExporter], counts: SpanCounts) -> None:
        self.primary = primary
        self.copies = copies
        self.counts = counts

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for name, exporter in self.copies.items():
            ok = export_guarded(exporter, spans, name) is SpanExportResult.SUCCESS
            self.counts.add(copied(name, ok=ok), len(spans))
        return self.primary.export(spans)

    def shutdown(self) -> None:
        for exporter in (*self.copies.values(), self.primary):
            try:
                exporter.shutdown()
            except Exception:
                logger.exception("shutting down %s failed", type(exporter).__name__)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        results = [exporter.force_flush(timeout_millis) for exporter in (*self.copies.values(), self.primary)]
        return all(results)
