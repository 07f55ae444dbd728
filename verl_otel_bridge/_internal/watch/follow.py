"""Follow captures as they are written: the files under the given paths (found again at each poll) and,
in each, the complete lines appended since the last poll.

A line cut short (the writer is mid-write, or a gzip member is not complete yet) waits
for the rest; a file that shrank was replaced and is read again from its start. Plain
``*.jsonl`` and gzip ``*.jsonl.gz`` files (several members, each ending at a flush) are
followed alike. :class:`Tail` is the only part that knows how a file is read.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The file names followed in a directory (any depth: a run's ``global_steps=<n>`` folders too).
SUFFIXES = (".jsonl", ".jsonl.gz")
#: Bytes read from one file per poll at most (the rest waits for the next poll).
READ_CHUNK = 4 << 20
#: A line longer than this is not one the bridge wrote: it is skipped, counted as one bad line.
MAX_LINE_BYTES = 64 << 20


class Tail:
    """One file, read from where the last :meth:`read` stopped; gives complete lines only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0
        self.broken = ""
        self._gzip = path.name.endswith(".gz")
        self._inflate = self._new_inflater()
        self._pending = b""
        self._skipping = False
        self.overlong = 0
        #: Whether the last read stopped at its limit (more is there already).
        self.more = False

    def _new_inflater(self) -> zlib._Decompress | None:
        return zlib.decompressobj(wbits=31) if self._gzip else None

    def read(self, limit: int = READ_CHUNK) -> list[bytes]:
        """The complete lines written since the last call (at most ``limit`` new bytes of the file read)."""
        if self.broken:
            return []
        try:
            with open(self.path, "rb") as stream:
                size = os.fstat(stream.fileno()).st_size
                if size < self.offset:  # replaced or truncated: read it again
                    self.offset, self._pending, self._inflate = 0, b"", self._new_inflater()
                stream.seek(self.offset)
                raw = stream.read(limit)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                return []
            self.broken = f"cannot read it ({exc.strerror or exc})"
            return []
        self.offset += len(raw)
        self.more = len(raw) == limit
        try:
            data = self._decode(raw)
        except zlib.error as exc:
            self.broken = f"not gzip data at byte {self.offset} ({exc})"
            return []
        return self._split(data)

    def _decode(self, raw: bytes) -> bytes:
        inflate = self._inflate
        if inflate is None:
            return raw
        out = [inflate.decompress(raw)]
        while inflate.eof and inflate.unused_data:  # the next gzip member
            rest = inflate.unused_data
            inflate = self._inflate = zlib.decompressobj(wbits=31)
            out.append(inflate.decompress(rest))
        if inflate.eof:
            self._inflate = zlib.decompressobj(wbits=31)
        return b"".join(out)

    def _split(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        chunk = self._pending + data
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self._pending = chunk
            self._bound_pending()
            return []
        self._pending = chunk[cut + 1 :]
        lines = chunk[:cut].split(b"\n")
        if self._skipping:  # the rest of an overlong line
            lines = lines[1:]
            self._skipping = False
        self.lines += len(lines)
        self._bound_pending()
        return lines

    def _bound_pending(self) -> None:
        if len(self._pending) > MAX_LINE_BYTES:
            self._pending = b""
            if not self._skipping:
                self.overlong += 1
                self._skipping = True


@dataclass(frozen=True)
class Lines:
    """What one poll found in one file: its new complete lines, the number of the first, and how many lines
    longer than :data:`MAX_LINE_BYTES` were skipped."""

    path: Path
    first_number: int
    lines: list[bytes]
    skipped: int = 0


def capture_paths(paths: Sequence[Path]) -> list[Path]:
    """The files ``paths`` name now: a file as it is, a directory as every capture file under it, sorted."""
    found: list[Path] = []
    for given in paths:
        if given.is_dir():
            for root, dirs, files in os.walk(given):
                dirs.sort()
                found.extend(Path(root, name) for name in sorted(files) if name.endswith(SUFFIXES))
        elif given.exists():
            found.append(given)
    return found


class Follower:
    """Every capture file under ``paths``, followed; :meth:`poll` gives what was appended since the last poll."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.tails: dict[Path, Tail] = {}

    def poll(self, limit: int = READ_CHUNK) -> Iterator[Lines]:
        """New lines of every file (files that appeared since the last poll are read from their start)."""
        for path in capture_paths(self.paths):
            tail = self.tails.get(path)
            if tail is None:
                tail = self.tails[path] = Tail(path)
            first, overlong = tail.lines + 1, tail.overlong
            lines = tail.read(limit)
            if lines or tail.overlong > overlong:
                yield Lines(path, first, lines, tail.overlong - overlong)

    @property
    def broken(self) -> dict[str, str]:
        """The files that cannot be followed (path -> why): unreadable, or not gzip data."""
        return {os.fspath(tail.path): tail.broken for tail in self.tails.values() if tail.broken}

    @property
    def behind(self) -> bool:
        """Whether the last poll left bytes unread in a file (it stopped at its limit)."""
        return any(tail.more for tail in self.tails.values())
