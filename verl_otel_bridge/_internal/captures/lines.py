"""Complete lines of one capture file, plain JSON Lines or gzip members, from any position: bounded memory.

:class:`LineReader` reads a file from a :class:`Position` to its current end and
yields each complete line, then says where to resume (``reader.position``): a
follower (``watch``) calls it again with that position as the file grows; a final
reader (``show``, ``report``, ``replay``) reads once with ``final=True``.

- Plain files: a line is complete at its newline. ``final`` also yields a last line
  without one; otherwise it stays unread until its newline arrives.
- Gzip files (``*.gz``): a sequence of gzip members, as the capture writer ends one
  at every flush. Lines are yielded as they are decompressed; the position is the
  start of the member holding the next line plus how many of its lines were read,
  so a member still being written is resumed, not read twice. A member cut short
  (a writer killed mid-write) is read up to its last complete line and said in
  :attr:`LineReader.problem` when ``final``; a file that is not gzip stops there,
  said the same way.

Memory is bounded whatever the file holds: input is read and decompressed in
chunks of :data:`CHUNK_BYTES`, and a line longer than :data:`MAX_LINE_BYTES` is
skipped while it is read (yielded with ``data=None``), never held whole.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

#: A longer line is skipped, not held: above any record the bridge writes (attributes are cut at
#: ``max_attribute_length`` characters, 32,768 by default).
MAX_LINE_BYTES = 64 * 1024 * 1024
#: Bytes read, and decompressed, at a time.
CHUNK_BYTES = 1024 * 1024
_GZIP = 16 + zlib.MAX_WBITS


class Position(NamedTuple):
    """Where to resume reading a capture file (a named tuple: one is made per line read).

    Attributes:
        offset: the byte offset reading starts at: a line's start (plain), a gzip member's start.
        skip: lines of the member at ``offset`` already read (gzip; 0 for plain files).
        line: lines read before ``offset`` (and its ``skip``): the next line's number is ``line + 1``.
    """

    offset: int = 0
    skip: int = 0
    line: int = 0


#: A file's start.
START = Position()


class Line(NamedTuple):
    """One line: its 1-based ``number`` in the file, ``data`` without the newline (None when it was longer
    than :data:`MAX_LINE_BYTES` and skipped) and its ``size`` in bytes, newline included (uncompressed)."""

    number: int
    data: bytes | None
    size: int


class LineReader:
    """The complete lines of ``stream`` from ``position`` (see the module docstring).

    Attributes:
        position: where to resume after the lines read so far.
        problem: why reading stopped before the end (a member cut short, not gzip), or None.
        read_bytes: bytes read from the file so far (compressed, for a gzip file).
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        compressed: bool,
        position: Position = START,
        final: bool = True,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        self._stream = stream
        self._compressed = compressed
        self._offset, self._skip, self._line = position  # (three ints, not a Position per line read)
        self._final = final
        self._max = max_line_bytes
        self.problem: str | None = None
        self.read_bytes = 0

    @property
    def position(self) -> Position:
        """Where to resume after the lines read so far."""
        return Position(self._offset, self._skip, self._line)

    def __iter__(self) -> Iterator[Line]:
        self._stream.seek(self._offset)
        return self._gzip() if self._compressed else self._plain()

    def _read(self) -> bytes:
        chunk = self._stream.read(CHUNK_BYTES)
        self.read_bytes += len(chunk)
        return chunk

    def _plain(self) -> Iterator[Line]:
        splitter = _Splitter(self._max)
        offset, number = self._offset, self._line
        while chunk := self._read():
            for data, size in splitter.feed(chunk):
                offset, number = offset + size, number + 1
                self._offset, self._line = offset, number
                yield Line(number, data, size)
        if splitter.pending and self._final:
            data, size = splitter.rest()
            self._offset, self._line = offset + size, number + 1
            yield Line(number + 1, data, size)

    def _gzip(self) -> Iterator[Line]:
        splitter = _Splitter(self._max)
        start, skip, number = self._offset, self._skip, self._line
        ended = 0  # lines ended in the member at ``start``
        inflate = zlib.decompressobj(_GZIP)
        fed = 0  # input bytes given to ``inflate`` (its unconsumed tail included)
        data = self._read()
        while data:
            try:
                out = inflate.decompress(data, CHUNK_BYTES)
            except zlib.error as exc:
                self.problem = f"not gzip, or damaged at byte {start}: {exc}"
                return
            fed += len(data) - len(inflate.unconsumed_tail)
            for line, size in splitter.feed(out):
                ended += 1
                if ended <= skip:
                    continue
                number += 1
                self._offset, self._skip, self._line = start, ended, number
                yield Line(number, line, size)
            if inflate.eof:
                rest = inflate.unused_data
                start += fed - len(rest)
                self._offset, self._skip, self._line = start, 0, number
                skip = ended = fed = 0
                if rest and not rest.startswith(b"\x1f\x8b"):
                    self.problem = f"{len(rest)} bytes after the last gzip member at byte {start} are not gzip"
                    return
                inflate = zlib.decompressobj(_GZIP)
                data = rest or self._read()
            else:
                data = inflate.unconsumed_tail or self._read()
        if not self._final:
            return
        if fed:
            self.problem = f"the last gzip member (from byte {start}) is cut short; its complete lines were read"
        elif splitter.pending:  # a last line without its newline, in complete members: read as plain files read it
            line, size = splitter.rest()
            yield Line(number + 1, line, size)


class _Splitter:
    """Bytes in, complete lines out; a line longer than ``max_bytes`` is dropped while it arrives."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._held = bytearray()
        self._skipped = 0  # bytes of an overlong line dropped so far

    @property
    def pending(self) -> bool:
        return bool(self._held or self._skipped)

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes | None, int]]:
        start = 0
        find, limit = chunk.find, self._max
        while True:
            end = find(b"\n", start)
            if end < 0:
                self._hold(chunk, start, len(chunk))
                return
            if not self._held and not self._skipped and end - start <= limit:
                yield chunk[start:end], end - start + 1  # a whole line in this chunk: one copy
            else:
                self._hold(chunk, start, end)
                yield self._take(1)
            start = end + 1

    def rest(self) -> tuple[bytes | None, int]:
        return self._take(0)

    def _hold(self, chunk: bytes, start: int, end: int) -> None:
        if self._skipped:
            self._skipped += end - start
        elif len(self._held) + end - start > self._max:
            self._skipped = len(self._held) + end - start
            self._held.clear()
        else:
            self._held += chunk[start:end]

    def _take(self, newline: int) -> tuple[bytes | None, int]:
        if self._skipped:
            size, self._skipped = self._skipped + newline, 0
            return None, size
        data = bytes(self._held)
        self._held.clear()
        return data, len(data) + newline
