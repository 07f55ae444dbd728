"""The ``console`` destination: spans on a stream (stdout by default), as readable lines or as JSON records."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TextIO

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporters.console_text import SpanText
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.records import RecordLines
from verl_otel_bridge._internal.status import Where


class Console:
    """Writes spans to ``out`` (default: ``sys.stdout`` as it is when built) as ``format`` says: ``text``, the
    lines of :class:`~verl_otel_bridge._internal.exporters.console_text.SpanText` (colours when ``out`` is a
    terminal and ``NO_COLOR`` is unset; the sessions it still holds are written when it is closed), or
    ``json``, the bridge's record, one per line. A stream that cannot be written refuses the batch."""

    def __init__(self, out: TextIO | None = None, format: str = "text", counts: SpanCounts | None = None) -> None:
        self._out = out if out is not None else sys.stdout
        self._text = (
            SpanText(colour=_is_terminal(self._out) and not os.environ.get("NO_COLOR")) if format == "text" else None
        )
        self._records = RecordLines(counts)  # a value JSON cannot carry is replaced, counted ``converted``
        self._lock = threading.Lock()
        self._last_error: str | None = None

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        with self._lock:
            lines = self._text.lines(spans) if self._text is not None else [self._records.line(s) for s in spans]
            if not self._write(lines):
                return Outcome.refusing(spans, self._last_error or "the stream cannot be written")
        return Outcome(len(spans))

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        if self._text is not None:
            with self._lock:
                self._write(self._text.rest())

    def where(self) -> Where:
        return {"endpoint": None, "path": str(getattr(self._out, "name", "<stream>")), "last_error": self._last_error}

    def _write(self, lines: list[str]) -> bool:
        if not lines:
            return True
        try:
            self._out.write("".join(lines))
            self._out.flush()
        except (OSError, ValueError) as exc:  # a closed pipe or stream
            self._last_error = f"writing to {getattr(self._out, 'name', 'the stream')} failed: {exc}"
            return False
        self._last_error = None
        return True


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal
        return False


def build(config: BridgeConfig, counts: SpanCounts) -> Console:
    """The ``console`` destination: standard output, in ``console_format``."""
    return Console(format=config.console_format, counts=counts)


def check(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> dict[str, object]:
    """``doctor``'s check: always usable."""
    detail = (
        "one JSON line per span on standard output"
        if config.console_format == "json"
        else "readable lines on standard output, a session's spans together when it ends"
    )
    return {"ok": True, "detail": detail}
