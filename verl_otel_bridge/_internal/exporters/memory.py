"""An in-memory exporter that keeps only the most recent spans."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from verl_otel_bridge._internal.forks import reinit_after_fork


class BoundedMemorySpanExporter(InMemorySpanExporter):
    """An ``InMemorySpanExporter`` holding at most ``max_spans`` spans (oldest evicted).

    A drop-in for tests (``get_finished_spans()``, ``clear()``) that is also
    safe as the default fallback of a week-long run.
    """

    def __init__(self, max_spans: int = 10_000) -> None:
        super().__init__()
        self.max_spans = max_spans
        self._spans: collections.deque[ReadableSpan] = collections.deque(maxlen=max_spans)
        self._closed = False
        self._new_lock()
        reinit_after_fork(self._new_lock)

    def _new_lock(self) -> None:
        self._spans_lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        with self._spans_lock:
            self._spans.extend(spans)
        return SpanExportResult.SUCCESS

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        """The kept spans, oldest first."""
        with self._spans_lock:
            return tuple(self._spans)

    def clear(self) -> None:
        """Forget every kept span."""
        with self._spans_lock:
            self._spans.clear()

    def shutdown(self) -> None:
        """Refuse further spans; the kept ones stay readable."""
        self._closed = True
