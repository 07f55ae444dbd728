"""A wrapper exporter that counts what its inner exporter accepted."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge.accounting import FAILED, SpanCounts
from verl_otel_bridge.exporters.base import WrappingSpanExporter, left_out_reader

logger = logging.getLogger(__name__)


class CountingSpanExporter(WrappingSpanExporter):
    """Counts accepted spans under ``key`` and refused or raised ones under ``failed``.

    Spans an exporter left out of a batch it otherwise sent (see
    :class:`~verl_otel_bridge.exporters.base.LeavesOut`) count as failed, the rest
    as accepted. Never raises: an exception from the inner exporter becomes ``FAILURE``.
    """

    def __init__(self, inner: SpanExporter, counts: SpanCounts, key: str) -> None:
        super().__init__(inner)
        self._left_out = left_out_reader(inner)
        self.counts = counts
        self.key = key

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:
            logger.exception("%s exporter raised on %d spans", self.key, len(spans))
            result = SpanExportResult.FAILURE
        accepted = len(spans) - self._left_out() if result is SpanExportResult.SUCCESS else 0
        self.counts.add(self.key, accepted)
        self.counts.add(FAILED, len(spans) - accepted)
        return result
