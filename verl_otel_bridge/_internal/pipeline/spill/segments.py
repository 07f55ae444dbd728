"""The spill's files: created private, appended whole lines at a time, read back in order, deleted once read.

Each file (a segment) is created with :func:`~verl_otel_bridge._internal.private_files.open_private_new`
and used only through the descriptor kept from its creation: writes go to the
offset the store recorded (``pwrite``), reads come from the bytes it wrote
(``pread``). So a segment whose name was removed is still read to its end, and
a file planted under another name is never read. Whatever else happened to a
file (cut short, overwritten, unreadable), reading it ends: the spans written
there that could not be read back are reported ``lost``, never waited for.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.private_files import UnsafePathError, open_private_new, private_dir

logger = logging.getLogger(__name__)

_SEGMENT_NUMBERS = itertools.count()
#: One line read back at most; a longer run of bytes without a newline is not a line the bridge wrote.
MAX_LINE_BYTES = 32 * 1024 * 1024


@dataclass
class _Segment:
    path: Path
    fd: int
    size: int = 0  # bytes written (whole lines only)
    spans: int = 0  # spans (lines) written
    read: int = 0  # bytes the drain has read
    taken: int = 0  # lines the drain has taken


@dataclass
class Taken:
    """One read from the oldest file: its lines (one span each, unparsed) and the spans lost there."""

    path: Path
    lines: list[bytes] = field(default_factory=list)
    lost: int = 0
    why: str | None = None


class SegmentStore:
    """The files of one spill in ``directory``, at most ``max_bytes`` together, each at most a quarter of it."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._once = OnceLogger(logger)
        self._reset()
        reinit_after_fork(self._after_fork)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._segments: collections.deque[_Segment] = collections.deque()
        self._backlog = 0  # spans written and not taken
        self._in_flight = 0  # spans taken and not settled (see settle)
        self._checked: Path | None = None
        self._refused = False

    def _after_fork(self) -> None:
        # The child starts with no files: the parent's stay the parent's, and their
        # inherited descriptors are closed so the child can never write into them.
        for segment in self._segments:
            _close(segment.fd)
        self._reset()

    @property
    def backlog(self) -> int:
        """Spans written and not taken back yet."""
        return self._backlog

    def append(self, lines: Sequence[bytes], *, again: bool = False) -> int:
        """Write the leading ``lines`` that fit the cap, whole, to the newest file; how many were written.

        ``again``: these are spans taken from the spill being written back (the
        destination refused them again); they stop being in flight as they are written.
        """
        with self._lock:
            room = self.max_bytes - sum(segment.size for segment in self._segments)
            fit = 0
            for line in lines:
                room -= len(line)
                if room < 0:
                    break
                fit += 1
            if fit and not self._write(b"".join(lines[:fit]), fit):
                fit = 0
            self._backlog += fit
            if again:
                self._in_flight -= min(len(lines), self._in_flight)
        return fit

    def _write(self, data: bytes, spans: int) -> bool:
        segment = self._segments[-1] if self._segments else None
        if segment is None or (segment.size and segment.size + len(data) > self.max_bytes // 4):
            segment = self._new_segment()
            if segment is None:
                return False
        try:
            view, at = memoryview(data), segment.size
            while view:
                written = os.pwrite(segment.fd, view, at)
                view, at = view[written:], at + written
        except OSError as exc:
            try:
                os.ftruncate(segment.fd, segment.size)  # a batch is written whole or not at all
            except OSError:
                logger.warning("could not cut %s back after a failed write: it may end in a partial line", segment.path)
            self._log_error("write", segment.path, exc)
            return False
        segment.size += len(data)
        segment.spans += spans
        return True

    def _new_segment(self) -> _Segment | None:
        directory = self._private_directory()
        if directory is None:
            return None
        prefix = f"spill-{socket.gethostname()}-{os.getpid()}"
        while True:
            # Numbered across the process, so two bridges never share a file; an old
            # file of the same name (a reused pid) is skipped, never appended to.
            path = directory / f"{prefix}-{next(_SEGMENT_NUMBERS)}.jsonl"
            try:
                fd = open_private_new(path, os.O_RDWR)
            except FileExistsError:
                continue
            except OSError as exc:
                self._log_error("create", path, exc)
                return None
            segment = _Segment(path, fd)
            self._segments.append(segment)
            return segment

    def _private_directory(self) -> Path | None:
        if self._refused:
            return None
        if self._checked is not None:
            return self._checked
        try:
            self._checked = private_dir(self.directory)
        except UnsafePathError as exc:
            self._refused = True
            logger.warning(
                "refusing to spill into %s: %s; nothing is spilled (spans that would be are counted dropped). "
                "Set spill_dir to a directory of your own, or remove this one",
                self.directory,
                exc,
            )
            return None
        except OSError as exc:
            self._log_error("directory", Path(self.directory), exc)
            return None
        return self._checked

    def _log_error(self, what: str, path: Path, exc: OSError) -> None:
        self._once.log(f"{what}:{exc.errno}", logging.WARNING, "spill file %s: %s failed: %s", path, what, exc)

    def take(self, max_lines: int, max_bytes: int) -> Taken | None:
        """Up to ``max_lines`` lines (about ``max_bytes``) from the oldest file, None when there is none.

        A file read to its end, or that cannot be read further, is closed and deleted.
        """
        with self._lock:
            if not self._segments:
                return None
            segment = self._segments[0]
            start, end, left = segment.read, segment.size, segment.spans - segment.taken
        taken = Taken(segment.path)
        finished = False
        try:
            taken.lines, position, cut_short = _read_lines(segment.fd, start, end, min(max_lines, left), max_bytes)
        except OSError as exc:
            taken.why, position, finished = f"reading it failed: {exc}", end, True
        else:
            if cut_short:
                taken.why, finished = "it is shorter than what was written (cut or replaced)", True
        lines = min(len(taken.lines), left)
        with self._lock:
            segment.read = position
            segment.taken += lines
            finished = finished or segment.read >= segment.size or segment.taken >= segment.spans
            if finished:
                taken.lost = segment.spans - segment.taken
                self._segments.popleft()
            self._backlog -= lines + taken.lost
            self._in_flight += lines
        if finished:
            _close(segment.fd)
            try:
                segment.path.unlink(missing_ok=True)
            except OSError as exc:
                self._log_error("delete", segment.path, exc)
        return taken

    def settle(self) -> None:
        """The spans taken last are sent (or counted failed): no longer in flight."""
        with self._lock:
            self._in_flight = 0

    def status(self) -> tuple[list[str], int, int]:
        """The files (oldest first), their bytes written, and the spans not sent yet (in the files or in flight)."""
        with self._lock:
            files = [str(s.path) for s in self._segments]
            return files, sum(s.size for s in self._segments), self._backlog + self._in_flight

    def close(self) -> None:
        """Close the files' descriptors; the files stay, for replay."""
        with self._lock:
            for segment in self._segments:
                _close(segment.fd)
                segment.fd = -1


def _read_lines(fd: int, start: int, end: int, max_lines: int, max_bytes: int) -> tuple[list[bytes], int, bool]:
    """Whole lines of ``fd`` in ``[start, end)``: the lines, where they end, and whether the file ended early.

    At most ``max_lines`` lines, and no more than ``max_bytes`` unless the first
    line alone is longer (up to :data:`MAX_LINE_BYTES`; a longer run is returned
    as one line, which no reader can parse).
    """
    lines: list[bytes] = []
    position = start
    while position < end and len(lines) < max_lines and position - start < max_bytes:
        want = min(end - position, max_bytes - (position - start))
        block = os.pread(fd, want, position)
        cut = block.rfind(b"\n")
        if cut < 0 and len(block) == want and not lines:
            # One line longer than the batch's bytes: read it alone.
            want = min(end - position, MAX_LINE_BYTES)
            block = os.pread(fd, want, position)
            cut = block.find(b"\n")
            if cut < 0 and len(block) < want:
                return lines, position, True
            line = block if cut < 0 else block[: cut + 1]
            lines.append(line)
            position += len(line)
            continue
        if cut < 0:
            if len(block) < want:
                return lines, position, True
            break  # the next line does not fit this batch: it starts the next one
        for raw in block[: cut + 1].split(b"\n")[:-1]:
            if len(lines) >= max_lines:
                return lines, position, False
            lines.append(raw + b"\n")
            position += len(raw) + 1
        if len(block) < want:
            return lines, position, True
    return lines, position, False


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            logger.debug("closing a spill file's descriptor failed", exc_info=True)
