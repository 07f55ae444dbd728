"""Follow captures as they are written: the capture files under the given paths (found again at each poll,
:func:`~verl_otel_bridge._internal.captures.read.find_captures`) and, in each, the complete lines appended
since the last poll (:class:`~verl_otel_bridge._internal.captures.lines.LineReader`, resumed from where it
stopped).

A line cut short, or a gzip member still being written, waits for the rest; a file
that shrank was replaced and is read again from its start; a file that cannot be read
(not gzip, damaged) stops being followed and is said. Each poll reads at most
:data:`READ_LIMIT` bytes of a file, so catching up on a large capture goes in steps.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from verl_otel_bridge._internal.captures.layout import compressed
from verl_otel_bridge._internal.captures.lines import Line, LineReader, Position
from verl_otel_bridge._internal.captures.read import find_captures, newest_run_in

#: Bytes read from one file per poll at most (the rest waits for the next poll).
READ_LIMIT = 4 << 20


class Tail:
    """One file, read from where the last :meth:`read` stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.position = Position()
        #: Why the file is no longer followed (not gzip, damaged, unreadable), or "".
        self.broken = ""
        #: Whether the last read stopped at its limit (more is there already).
        self.more = False

    def read(self, limit: int = READ_LIMIT) -> list[Line]:
        """The complete lines written since the last call (``data`` None: a line too long to read)."""
        self.more = False
        if self.broken:
            return []
        lines: list[Line] = []
        try:
            with open(self.path, "rb") as stream:
                if os.fstat(stream.fileno()).st_size < self.position.offset:  # replaced: read it again
                    self.position = Position()
                reader = LineReader(stream, compressed=compressed(self.path), position=self.position, final=False)
                for line in reader:
                    lines.append(line)
                    if reader.read_bytes >= limit:
                        self.more = True
                        break
                self.position = reader.position
                if reader.problem is not None:
                    self.broken = reader.problem
        except FileNotFoundError:
            return lines
        except OSError as exc:
            self.broken = f"cannot be read ({exc.strerror or exc})"
        return lines


@dataclass(frozen=True)
class Lines:
    """What one poll found in one file: its new complete lines."""

    path: Path
    lines: list[Line]


class Follower:
    """Every capture file under ``paths``, followed; :meth:`poll` gives what was appended since the last poll.

    A folder that holds several runs is followed as its newest run when the follower is made
    (:func:`~verl_otel_bridge._internal.captures.read.newest_run_in`; ``others`` lists the runs
    left out): a step of one run is not a step of another, and a run started later is not
    switched to in the middle of a view.
    """

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths: list[Path] = []
        self.others: list[Path] = []
        for path in paths:
            runs = newest_run_in(path) if path.is_dir() else None
            self.paths.append(runs[0] if runs is not None else path)
            self.others += runs[1] if runs is not None else []
        self.tails: dict[Path, Tail] = {}

    def poll(self, limit: int = READ_LIMIT) -> Iterator[Lines]:
        """New lines of every file (files that appeared since the last poll are read from their start)."""
        for path in find_captures(self.paths).files:
            tail = self.tails.get(path)
            if tail is None:
                tail = self.tails[path] = Tail(path)
            lines = tail.read(limit)
            if lines:
                yield Lines(path, lines)

    @property
    def behind(self) -> bool:
        """Whether the last poll left bytes unread in a file (it stopped at its limit)."""
        return any(tail.more for tail in self.tails.values())

    @property
    def broken(self) -> dict[str, str]:
        """The files that cannot be followed (path -> why): unreadable, not gzip, damaged."""
        return {os.fspath(tail.path): tail.broken for tail in self.tails.values() if tail.broken}
