"""The ``console`` destination: one line per span on a stream (standard output by default)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.records import RecordLines
from verl_otel_bridge._internal.status import Where


class Console:
    """Writes ``render(span)`` for each span to ``out`` (default: ``sys.stdout`` as it is when built)."""

    def __init__(self, out: TextIO | None = None, render: Callable[[ReadableSpan], str] | None = None) -> None:
        self._out = out if out is not None else sys.stdout
        self._render = render if render is not None else RecordLines().line
        self._lock = threading.Lock()
        self._last_error: str | None = None

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        text = "".join(map(self._render, spans))
        out = self._out
        try:
            with self._lock:
                out.write(text)
                out.flush()
        except (OSError, ValueError) as exc:  # a closed pipe or stream
            self._last_error = f"writing to {getattr(out, 'name', 'the stream')} failed: {exc}"
            return Outcome.refusing(spans, self._last_error)
        self._last_error = None
        return Outcome(len(spans))

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass

    def where(self) -> Where:
        return {"endpoint": None, "path": str(getattr(self._out, "name", "<stream>")), "last_error": self._last_error}


def build(config: BridgeConfig, counts: SpanCounts) -> Console:
    """The ``console`` destination: standard output."""
    return Console()


def check(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> dict[str, object]:
    """``doctor``'s check: always usable."""
    return {"ok": True, "detail": "one JSON line per span on standard output"}
