"""Appends one JSON line per span to a file (format: :mod:`verl_otel_bridge.records`)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge.forks import reinit_after_fork
from verl_otel_bridge.records import span_to_record


class JsonlSpanExporter(SpanExporter):
    """Writes spans to ``path`` as JSON Lines, appending, flushed after every batch.

    The file is opened at construction so an unwritable path fails at
    ``configure()``, not at the first span. ``~`` is expanded, and ``{pid}`` in
    ``path`` becomes the process id, so one ``VERL_OTEL_BRIDGE_JSONL_PATH`` in a
    Ray ``runtime_env`` gives every worker a file of its own.

    Raises:
        ValueError: ``path`` cannot be opened for appending.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.fspath(path).replace("{pid}", str(os.getpid()))).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Unbuffered, so one batch is one write(2) in append mode and a forked
            # child inherits no half-written buffer (nor the buffer's lock).
            self._file: BinaryIO | None = self.path.open("ab", buffering=0)
        except OSError as exc:
            raise ValueError(
                f"verl_otel_bridge: jsonl_path={str(path)!r} cannot be opened for appending: {exc}"
            ) from exc
        self._new_lock()
        reinit_after_fork(self._new_lock)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_to_record(span), ensure_ascii=False) + "\n" for span in spans)
        data = lines.encode("utf-8")
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            try:
                view = memoryview(data)
                while view:  # a regular file may take a large write in parts
                    view = view[self._file.write(view) :]
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
