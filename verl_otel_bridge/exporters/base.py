"""The base of every exporter that wraps another one."""

from __future__ import annotations

from opentelemetry.sdk.trace.export import SpanExporter


class WrappingSpanExporter(SpanExporter):
    """Holds ``inner`` and forwards ``force_flush`` and ``shutdown`` to it; subclasses override ``export``."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
