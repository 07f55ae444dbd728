"""Any OpenTelemetry ``SpanExporter`` as a destination (a fallback given to ``RLInsightSpanExporter``)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.status import Where


class SdkExporter:
    """Sends through ``exporter.export``: ``SUCCESS`` took the batch, anything else refused it."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        if self.exporter.export(spans) is SpanExportResult.SUCCESS:
            return Outcome(len(spans))
        return Outcome.refusing(spans, f"{type(self.exporter).__name__} did not take the batch")

    def flush(self, timeout_s: float) -> bool:
        return self.exporter.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        self.exporter.shutdown()

    def where(self) -> Where:
        endpoint = getattr(self.exporter, "endpoint", None)
        error = getattr(self.exporter, "last_error", None)
        return {
            "endpoint": endpoint if isinstance(endpoint, str) else None,
            "path": None,
            "last_error": error if isinstance(error, str) else None,
        }
