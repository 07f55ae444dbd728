"""The destination, counted like any exporter, that spills the batches it refuses instead of failing them."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.exporters.counting import CountingSpanExporter
from verl_otel_bridge._internal.pipeline.spill.health import Health
from verl_otel_bridge._internal.pipeline.spill.settings import FROM_DESTINATION
from verl_otel_bridge._internal.pipeline.spill.spill import Spill


class SpillingSpanExporter(CountingSpanExporter):
    """The destination, counted as ``key``; a batch it refuses is spilled instead of failed.

    Once it has refused every batch for ``spill_after_s``, batches go straight to
    the spill without waiting out the sender's retries; the drain thread then tries
    one spilled batch every ``spill_probe_s``, and the first one accepted brings
    the destination back for everyone.
    """

    def __init__(self, inner: SpanExporter, counts: SpanCounts, key: str, spill: Spill) -> None:
        super().__init__(inner, counts, key)
        self.spill = spill
        self.health = spill.health or Health(spill.settings.after_s, spill.settings.probe_s)
        spill.health = self.health
        spill.drains[FROM_DESTINATION] = self.send

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # While down, only the drain thread tries the destination (waiting out the
        # sender there holds up no queue); what the export thread gets, it spills.
        if self.health.should_try() or self.spill.on_drain_thread():
            return self.send(spans)
        return self._spill(spans)

    def send(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Try the destination with ``spans`` (whatever its health); spill them if it refuses."""
        return super().export(spans)

    def accepted(self) -> None:
        self.health.succeeded()
        self.spill.wake_drain()

    def refused(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.health.failed()
        return self._spill(spans)

    def _spill(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS if self.spill.write(spans, FROM_DESTINATION) else SpanExportResult.FAILURE
