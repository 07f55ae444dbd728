"""The ``console`` exporter: spans on a stream (stdout by default), as readable lines or as JSON records."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import TextIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult

from verl_otel_bridge._internal.exporters.console_text import SpanText
from verl_otel_bridge._internal.records import RecordLines


def console_exporter(out: TextIO | None = None, format: str = "text") -> SpanExporter:
    """The console exporter writing ``format``: ``text`` (:class:`TextConsoleSpanExporter`) or ``json``
    (OpenTelemetry's console exporter writing the bridge's record, one per line)."""
    stream = out if out is not None else sys.stdout
    if format == "json":
        return ConsoleSpanExporter(out=stream, formatter=RecordLines().line)
    return TextConsoleSpanExporter(stream)


class TextConsoleSpanExporter(SpanExporter):
    """Writes the lines of :class:`~verl_otel_bridge._internal.exporters.console_text.SpanText` (colours when
    ``out`` is a terminal and ``NO_COLOR`` is unset); at shutdown, the sessions it still holds."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._text = SpanText(colour=_is_terminal(out) and not os.environ.get("NO_COLOR"))
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._write(self._text.lines(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._write(self._text.rest())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def _write(self, lines: list[str]) -> None:
        if lines:
            self._out.write("".join(lines))
            self._out.flush()


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal
        return False
