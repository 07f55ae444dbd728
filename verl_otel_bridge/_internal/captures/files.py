"""One private capture file, appended to a batch at a time: whole or not at all, plain or one gzip member per batch.

A batch is one ``write(2)`` in append mode (looped only if the file system takes
it in parts). Compressed, each batch is a complete gzip member, so every flush
leaves a file any gzip reader reads to its end, and a process killed with SIGKILL
leaves at most a last member cut short, which the bridge's readers skip
(:mod:`verl_otel_bridge._internal.captures.lines`). A write that fails part-way (a
full disk, a file-size limit) is cut back to the previous batch's end, so the file
holds exactly the batches reported written.
"""

from __future__ import annotations

import errno
import os
import zlib
from pathlib import Path

#: zlib's level for capture files: about the size of level 6 on span records, at a fraction of its CPU
#: (bench/capture_volume.py measures both).
COMPRESS_LEVEL = 3
_GZIP = 16 + zlib.MAX_WBITS


def gzip_member(data: bytes, level: int = COMPRESS_LEVEL) -> bytes:
    """``data`` as one complete gzip member (no name, modification time 0)."""
    packer = zlib.compressobj(level, zlib.DEFLATED, _GZIP)
    return packer.compress(data) + packer.flush()


class AppendFile:
    """An open capture file (descriptor ``fd``, opened for appending) that takes whole batches of lines.

    Attributes:
        path: where it is.
        compressed: each batch is written as a gzip member.
        size: its size in bytes after the last batch (as far as this process knows).
    """

    def __init__(self, fd: int, path: Path, *, compressed: bool) -> None:
        self.fd = fd
        self.path = path
        self.compressed = compressed
        self.size = _end_of(fd) or 0

    def append(self, lines: bytes) -> int:
        """Write ``lines`` (whole JSON lines) as one batch; the bytes written.

        Raises:
            CutBack: the write failed; the file was cut back to its size before it (``kept``
                says whether that worked: a pipe cannot be cut back).
        """
        data = gzip_member(lines) if self.compressed else lines
        start = _end_of(self.fd)
        try:
            view = memoryview(data)
            while view:  # a regular file may take a large write in parts
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            raise CutBack(exc, self.path, _cut_back(self.fd, start)) from exc
        self.size = (start if start is not None else self.size) + len(data)
        return len(data)

    def removed(self) -> bool:
        """Whether the file has been removed from its folder (another process's disk budget)."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    def close(self) -> None:
        os.close(self.fd)


class CutBack(OSError):
    """A batch that could not be written to ``path``; the file was cut back to its end before it when ``kept``."""

    def __init__(self, error: OSError, path: Path, kept: bool) -> None:
        super().__init__(error.errno, error.strerror)
        self.error = error
        self.path = path
        self.kept = kept

    @property
    def last_error(self) -> str:
        """What a destination's ``last_error`` says."""
        return f"writing to {self.path} failed: {self.strerror or self.error}"

    def warning(self, count: int) -> str:
        """The WARNING's text for a batch of ``count`` spans: what failed, why, and what the file holds now."""
        code = errno.errorcode.get(self.errno or 0, "error")
        held = "the file was cut back to its last whole batch" if self.kept else "it may end in a partial batch"
        return f"writing {count} spans to {self.path} failed ({code}: {self.strerror or self.error}); {held}"


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
