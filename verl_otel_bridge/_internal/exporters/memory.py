"""The ``memory`` destination: an in-memory exporter that keeps only the most recent spans."""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.status import MEMORY_HINT, Where


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

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        """Keep ``spans`` (the oldest kept ones make room); refused once closed."""
        if self._closed:
            return Outcome.refusing(spans, "the memory exporter is shut down")
        with self._spans_lock:
            self._spans.extend(spans)
        return Outcome(len(spans))

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS if not self.send(spans).refused else SpanExportResult.FAILURE

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        """The kept spans, oldest first."""
        with self._spans_lock:
            return tuple(self._spans)

    def clear(self) -> None:
        """Forget every kept span."""
        with self._spans_lock:
            self._spans.clear()

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        """Refuse further spans; the kept ones stay readable."""
        self._closed = True

    def shutdown(self) -> None:
        self.close()

    def where(self) -> Where:
        return {"endpoint": None, "path": None, "last_error": None}


def build(config: BridgeConfig, counts: SpanCounts) -> BoundedMemorySpanExporter:
    """The ``memory`` destination of ``config``."""
    return BoundedMemorySpanExporter(config.memory_max_spans)


def check(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> dict[str, object]:
    """``doctor``'s check: always usable."""
    return {"ok": True, "detail": f"kept in this process only (the newest {config.memory_max_spans}); {MEMORY_HINT}"}
