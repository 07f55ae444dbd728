"""A wrapper exporter that counts what its inner exporter accepted."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.accounting import FAILED, SpanCounts
from verl_otel_bridge._internal.exporters.base import WrappingSpanExporter, export_guarded, left_out_reader


class CountingSpanExporter(WrappingSpanExporter):
    """Counts accepted spans under ``key`` and refused or raised ones under ``failed``.

    Spans an exporter left out of a batch it otherwise sent (see
    :class:`~verl_otel_bridge._internal.exporters.base.LeavesOut`) count as failed, the rest
    as accepted. Never raises: an exception from the inner exporter becomes ``FAILURE``.
    """

    def __init__(self, inner: SpanExporter, counts: SpanCounts, key: str) -> None:
        super().__init__(inner)
        self._left_out = left_out_reader(inner)
        self.counts = counts
        self.key = key

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = export_guarded(self.inner, spans, self.key)
        if result is not SpanExportResult.SUCCESS:
            return self.refused(spans)
        left_out = self._left_out()
        self.counts.add(self.key, len(spans) - left_out)
        self.counts.add(FAILED, left_out)
        self.accepted()
        return result

    def accepted(self) -> None:
        """Called after the inner exporter took a batch (and it was counted); for subclasses."""

    def refused(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """What happens to a batch the inner exporter refused or raised on: counted ``failed``, here."""
        self.counts.add(FAILED, len(spans))
        return SpanExportResult.FAILURE
