"""Appends one JSON line per span to a file (format: :mod:`verl_otel_bridge._internal.records`)."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import BinaryIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge._internal.config import ConfigError
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.private_files import make_dirs, open_private_output
from verl_otel_bridge._internal.records import RecordLines

logger = logging.getLogger(__name__)

_OPEN_ON_FIRST_EXPORT: ContextVar[bool] = ContextVar("verl_otel_bridge.jsonl.open_on_first_export", default=False)


@contextmanager
def opened_on_first_export() -> Iterator[None]:
    """JSON Lines exporters made inside open their file on the first export (the export thread), not now.

    For a bridge made at span time (from the environment, by the first span): opening
    a file may block (a FIFO nobody reads, a hung network mount), and the caller's
    thread must never wait on the filesystem. A path that cannot be opened is then
    logged at the first export, and its spans are counted failed.
    """
    token = _OPEN_ON_FIRST_EXPORT.set(True)
    try:
        yield
    finally:
        _OPEN_ON_FIRST_EXPORT.reset(token)


class JsonlSpanExporter(SpanExporter):
    """Writes spans to ``path`` as JSON Lines, appending, flushed after every batch.

    The file is opened at construction so an unwritable path fails at
    ``configure()``, not at the first span (inside :func:`opened_on_first_export`:
    at the first export, on the export thread). ``~`` is expanded, and ``{pid}`` in
    ``path`` becomes the process id, so one ``VERL_OTEL_BRIDGE_JSONL_PATH`` in a
    Ray ``runtime_env`` gives every worker a file of its own.

    A batch is written whole or not at all: a write that fails part-way (a full
    disk, a file-size limit) is cut back to the last whole line, the batch is
    reported failed, and the error is logged when it happens (once per kind), so
    the file holds exactly the spans counted as exported.

    Raises:
        ConfigError: ``path`` cannot be opened for appending (key ``jsonl_path``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._given = os.fspath(path)
        self.path = Path(self._given.replace("{pid}", str(os.getpid()))).expanduser()
        self._file: BinaryIO | None = None
        self._closed = False
        self._once = OnceLogger(logger)
        self._lines = RecordLines()
        self._new_lock()
        reinit_after_fork(self._new_lock)
        if not _OPEN_ON_FIRST_EXPORT.get():
            self._file = self._open()

    def _open(self) -> BinaryIO:
        try:
            make_dirs(self.path.parent)
            # Unbuffered, so one batch is one write(2) in append mode and a forked
            # child inherits no half-written buffer (nor the buffer's lock).
            return os.fdopen(open_private_output(self.path), "ab", buffering=0)
        except OSError as exc:
            raise ConfigError(
                f"verl_otel_bridge: jsonl_path={self._given!r} cannot be opened for appending: {exc}", "jsonl_path"
            ) from exc

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(map(self._lines.line, spans)).encode("utf-8")
        with self._lock:
            if self._file is None and not self._closed:
                try:
                    self._file = self._open()
                except ValueError as exc:
                    self._once.log("open", logging.WARNING, "%s; its spans are counted as failed", exc)
            if self._file is None:
                return SpanExportResult.FAILURE
            fd = self._file.fileno()
            start = _end_of(fd)
            try:
                view = memoryview(data)
                while view:  # a regular file may take a large write in parts
                    view = view[self._file.write(view) :]
            except OSError as exc:
                kept = _cut_back(fd, start)
                self._once.log(
                    f"write:{exc.errno}",
                    logging.WARNING,
                    "writing %d spans to %s failed (%s: %s); %s; they are counted as failed",
                    len(spans),
                    self.path,
                    errno.errorcode.get(exc.errno or 0, "error"),
                    exc.strerror or exc,
                    "the file was cut back to its last whole line" if kept else "the file may end in a partial line",
                )
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None


def _end_of(fd: int) -> int | None:
    """Where an appended write starts (None for a pipe or a socket)."""
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        return None


def _cut_back(fd: int, size: int | None) -> bool:
    """Truncate the file to ``size``, dropping a partly written batch; False if that was not possible."""
    if size is None:
        return False
    try:
        os.ftruncate(fd, size)
    except OSError:
        return False
    return True
