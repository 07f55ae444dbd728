"""The ``jsonl`` destination: a capture directory when ``capture_dir`` is set, else one file, ``jsonl_path``.

The capture directory (a folder per run and per step, gzip files that rotate, a
disk budget) is :class:`~verl_otel_bridge._internal.exporters.capture_dir.CaptureDir`;
the one file is :class:`JsonlFile`, appended to (format:
:mod:`verl_otel_bridge._internal.records`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.captures.doctor import check_capture_dir
from verl_otel_bridge._internal.captures.files import AppendFile, CutBack
from verl_otel_bridge._internal.captures.layout import compressed
from verl_otel_bridge._internal.captures.run import run_folder
from verl_otel_bridge._internal.config import BridgeConfig, ConfigError
from verl_otel_bridge._internal.exporters.capture_dir import CaptureDir
from verl_otel_bridge._internal.exporters.destination import Destination, Outcome
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.private_files import make_dirs, open_private_output
from verl_otel_bridge._internal.records import RecordLines
from verl_otel_bridge._internal.status import Where

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


def build(config: BridgeConfig, counts: SpanCounts) -> Destination:
    """The ``jsonl`` destination ``config`` asks for: the run folder ``capture_dir/<run>`` (:mod:`.run` names it;
    the disk budget's removals counted in ``counts``), else the one file ``jsonl_path``.

    Raises:
        ConfigError: the file or the run folder cannot be used (key ``jsonl_path`` or ``capture_dir``).
    """
    if config.capture_dir is None:
        return JsonlFile(config.jsonl_path, counts)
    return CaptureDir(
        run_folder(config),
        counts,
        rotate_bytes=config.capture_rotate_bytes,
        budget_bytes=config.capture_max_bytes,
        open_now=not _OPEN_ON_FIRST_EXPORT.get(),
    )


def check(config: BridgeConfig, environ: Mapping[str, str], timeout_s: float) -> dict[str, object]:
    """``doctor``'s check: whether the capture directory, or ``jsonl_path``, can be written, without writing."""
    if config.capture_dir is not None:
        return check_capture_dir(config)
    path = Path(config.jsonl_path.replace("{pid}", str(os.getpid()))).expanduser().absolute()
    if path.exists():
        writable = path.is_file() and os.access(path, os.W_OK)
    else:  # the destination creates the missing directories: the nearest existing one must take them
        nearest = next((p for p in path.parents if p.exists()), Path("/"))
        writable = nearest.is_dir() and os.access(nearest, os.W_OK | os.X_OK)
    return {"ok": writable, "detail": f"appended to {path}" if writable else f"{path} cannot be written"}


class JsonlFile:
    """Writes spans to ``path`` as JSON Lines, appending, flushed after every batch; gzip-compressed (a member per
    batch) when ``path`` ends in ``.gz``.

    The file is opened at construction so an unwritable path fails at
    ``configure()``, not at the first span (inside :func:`opened_on_first_export`:
    at the first export, on the export thread). ``~`` is expanded, and ``{pid}`` in
    ``path`` becomes the process id, so one ``VERL_OTEL_BRIDGE_JSONL_PATH`` in a
    Ray ``runtime_env`` gives every worker a file of its own.

    A batch is written whole or not at all: a write that fails part-way (a full
    disk, a file-size limit) is cut back to the last whole batch, the batch is
    refused, and the error is logged when it happens (once per kind), so
    the file holds exactly the spans counted as exported.

    Raises:
        ConfigError: ``path`` cannot be opened for appending (key ``jsonl_path``).
    """

    def __init__(self, path: str | os.PathLike[str], counts: SpanCounts | None = None) -> None:
        self._given = os.fspath(path)
        self.path = Path(self._given.replace("{pid}", str(os.getpid()))).expanduser()
        self._file: AppendFile | None = None
        self._closed = False
        self._last_error: str | None = None
        self._once = OnceLogger(logger)
        self._lines = RecordLines(counts)  # a value JSON cannot carry is replaced, counted ``converted``
        self._new_lock()
        reinit_after_fork(self._new_lock)
        if not _OPEN_ON_FIRST_EXPORT.get():
            self._file = self._open()

    def _open(self) -> AppendFile:
        try:
            make_dirs(self.path.parent)
            return AppendFile(open_private_output(self.path), self.path, compressed=compressed(self.path))
        except OSError as exc:
            raise ConfigError(
                f"verl_otel_bridge: jsonl_path={self._given!r} cannot be opened for appending: {exc}", "jsonl_path"
            ) from exc

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        """Append ``spans``, whole or not at all."""
        data = "".join(map(self._lines.line, spans)).encode("utf-8")
        with self._lock:
            if self._file is None and not self._closed:
                try:
                    self._file = self._open()
                except ValueError as exc:
                    self._last_error = str(exc)
                    self._once.log("open", logging.WARNING, "%s; its spans are counted as failed", exc)
            if self._file is None:
                return Outcome.refusing(spans, self._last_error or f"{self.path} is closed")
            try:
                self._file.append(data)
            except CutBack as exc:
                self._last_error = exc.last_error
                self._once.log(
                    f"write:{exc.errno}", logging.WARNING, "%s; they are counted as failed", exc.warning(len(spans))
                )
                return Outcome.refusing(spans, self._last_error)
        self._last_error = None
        return Outcome(len(spans))

    def flush(self, timeout_s: float) -> bool:
        return True

    def where(self) -> Where:
        return {"endpoint": None, "path": str(self.path), "last_error": self._last_error}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None
