"""The base of every exporter that wraps another one."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from opentelemetry.sdk.trace.export import SpanExporter


@runtime_checkable
class LeavesOut(Protocol):
    """An exporter that can send a batch while leaving some of its spans out (e.g. one it cannot encode)."""

    def take_left_out(self) -> int:
        """How many spans of the last ``export`` were left out while the rest were sent; resets to 0."""
        ...


def left_out(exporter: SpanExporter) -> int:
    """:meth:`LeavesOut.take_left_out` of ``exporter``, 0 for exporters that send all or nothing."""
    return exporter.take_left_out() if isinstance(exporter, LeavesOut) else 0


class WrappingSpanExporter(SpanExporter):
    """Holds ``inner`` and forwards ``force_flush`` and ``shutdown`` to it; subclasses override ``export``."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
