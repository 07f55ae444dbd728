"""The base of every exporter that wraps another one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from opentelemetry.sdk.trace.export import SpanExporter


class LeavesOut(Protocol):
    """An exporter that can send a batch while leaving some of its spans out (e.g. one it cannot encode)."""

    def take_left_out(self) -> int:
        """How many spans of the last ``export`` were left out while the rest were sent; resets to 0."""
        ...


def left_out_reader(exporter: SpanExporter) -> Callable[[], int]:
    """``exporter``'s :meth:`LeavesOut.take_left_out`, or one that says 0 for exporters that send all or nothing.

    Looked up once, when a wrapper is made: a protocol check per batch would cost
    more than the batch itself for the inline ``memory`` and ``none`` exporters.
    """
    take: Callable[[], int] | None = getattr(exporter, "take_left_out", None)
    return take if callable(take) else _nothing_left_out


def _nothing_left_out() -> int:
    return 0


class WrappingSpanExporter(SpanExporter):
    """Holds ``inner`` and forwards ``force_flush`` and ``shutdown`` to it; subclasses override ``export``."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
