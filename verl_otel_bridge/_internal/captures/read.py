"""Every reader's way into captures: which files a path names, and their records, in the order written.

:func:`find_captures` turns what a user names (a file, a run folder, a step folder,
the folder of runs, several of them) into capture files: ``*.jsonl`` and
``*.jsonl.gz`` at most :data:`MAX_DEPTH` folders down, in name order (so a
process's files of a step come in the order it wrote them), never through a link,
and with ``step`` only the files of that step's folder (``global_steps=<step>``)
plus files outside step folders, which may hold any step. Anything else met on
the way (other files, links, FIFOs, folders too deep) is skipped and said.

:class:`CaptureRecords` reads them (:mod:`.lines`: plain or gzip, bounded memory),
parses each line into a record, rebuilds the conversation
(:class:`~verl_otel_bridge._internal.conversation.Conversations`) and keeps what it
could not read: bad lines (counted, the first few named), and files that held no
record (empty, partial, unrelated), skipped and said, never fatal.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_otel_bridge._internal.captures.layout import compressed, is_capture_file, step_dir_name, step_of_dir
from verl_otel_bridge._internal.captures.lines import Line, LineReader, Position
from verl_otel_bridge._internal.conversation import Conversations
from verl_otel_bridge._internal.records import parse_record

#: Folders walked below a named folder at most: the folder of runs, a run, a step.
MAX_DEPTH = 3
#: Skipped files and bad lines named (all are counted).
MAX_LISTED = 20


@dataclass
class Found:
    """What :func:`find_captures` found: ``files`` to read, and the first skipped entries with why (all counted)."""

    files: list[Path] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    skipped_count: int = 0

    def skip(self, path: str | os.PathLike[str], why: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < MAX_LISTED:
            self.skipped.append((os.fspath(path), why))


def find_captures(
    paths: Sequence[str | os.PathLike[str]], *, step: int | None = None, newest_run: bool = False
) -> Found:
    """The capture files ``paths`` name (see the module docstring).

    A file named directly is read whatever its name; a path that does not exist is skipped.
    With ``newest_run``, a folder that holds several runs gives only the newest run's files
    (:func:`newest_run_in`); the other runs are skipped and said (steps of different runs are
    different steps: readers that aggregate by step must not mix them).
    """
    found = Found()
    for given in map(Path, paths):
        try:
            info = given.stat()
        except OSError as exc:
            found.skip(given, f"cannot be read ({exc.strerror or exc})")
            continue
        runs = newest_run_in(given) if newest_run and stat.S_ISDIR(info.st_mode) else None
        if runs is not None:
            newest, others = runs
            for other in others:
                found.skip(other, f"another run: only the newest, {newest.name}, is read (name a run folder)")
            _walk(newest, 1, step, found)
        elif stat.S_ISDIR(info.st_mode):
            _walk(given, 0, step, found)
        elif stat.S_ISREG(info.st_mode):
            found.files.append(given)
        else:
            found.skip(given, "not a regular file")
    return found


def newest_run_in(folder: Path) -> tuple[Path, list[Path]] | None:
    """``(the newest run, the other runs)`` when ``folder`` holds two runs or more, else None.

    A run is a folder holding step folders (``global_steps=<n>``); the newest is the one
    changed last (a new step's folder changes it), ties broken by name.
    """
    runs: list[tuple[float, str, Path]] = []
    try:
        with os.scandir(folder) as entries:
            children = [entry for entry in entries if entry.is_dir(follow_symlinks=False)]
        for child in children:
            with os.scandir(child.path) as inside:
                if any(step_of_dir(entry.name) is not False for entry in inside):
                    runs.append((child.stat(follow_symlinks=False).st_mtime, child.name, Path(child.path)))
    except OSError:
        return None  # unreadable: the walk says so
    if len(runs) < 2:
        return None
    runs.sort()
    return runs[-1][2], [path for _, _, path in runs[:-1]]


def _walk(folder: Path, depth: int, step: int | None, found: Found) -> None:
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as exc:
        found.skip(folder, f"cannot be listed ({exc.strerror or exc})")
        return
    wanted = step_dir_name(step) if step is not None else None
    for entry in entries:
        path = Path(entry.path)
        if entry.name.startswith("."):
            continue  # the budget's lock file, editors' and file systems' own files
        if entry.is_symlink():
            found.skip(path, "a symbolic link (not followed)")
        elif entry.is_dir(follow_symlinks=False):
            if wanted is not None and step_of_dir(entry.name) is not False and entry.name != wanted:
                continue  # another step's folder: not opened
            if depth + 1 > MAX_DEPTH:
                found.skip(path, f"a folder more than {MAX_DEPTH} levels down (name it to read it)")
            else:
                _walk(path, depth + 1, step, found)
        elif not entry.is_file(follow_symlinks=False):
            found.skip(path, "not a regular file")
        elif is_capture_file(entry.name):
            found.files.append(path)
        else:
            found.skip(path, "not a capture file (*.jsonl, *.jsonl.gz)")


@dataclass
class FileSummary:
    """One file read: its records, bad lines, and what stopped the reading early (a member cut short)."""

    path: str
    records: int = 0
    bad: int = 0
    problem: str | None = None


class CaptureRecords:
    """The records of ``files`` in order, the conversation rebuilt (see the module docstring).

    Iterate once. Afterwards (or during): ``summaries`` per file, ``bad_lines`` and the
    first ``bad_examples`` (``(file, line, problem)``), ``empty`` (files without a
    record, with why), ``records``. ``on_bytes(n)`` is called with the bytes read as
    reading goes (for a progress bar); ``rebuild``: rebuild the conversation.
    """

    def __init__(
        self,
        files: Sequence[str | os.PathLike[str]],
        *,
        rebuild: bool = True,
        on_bytes: Callable[[int], None] | None = None,
    ) -> None:
        self.files = [Path(f) for f in files]
        self.conversations = Conversations() if rebuild else None
        self.on_bytes = on_bytes
        self.summaries: list[FileSummary] = []
        self.bad_lines = 0
        self.bad_examples: list[tuple[str, int, str]] = []
        self.records = 0
        #: The size in bytes (uncompressed) and the number of the line of the record yielded last.
        self.last_size = self.last_line = 0

    @property
    def empty(self) -> list[tuple[str, str]]:
        """Files that held no span record, with why (empty, not a capture, cut short)."""
        return [(s.path, _why_empty(s)) for s in self.summaries if not s.records]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for path in self.files:
            summary = FileSummary(os.fspath(path))
            self.summaries.append(summary)
            yield from self._read(path, summary)

    def _read(self, path: Path, summary: FileSummary) -> Iterator[dict[str, Any]]:
        try:
            stream = open(path, "rb")  # noqa: SIM115 - closed below, after the generator's last record
        except OSError as exc:
            summary.problem = f"cannot be read ({exc.strerror or exc})"
            return
        with stream:
            reader = LineReader(stream, compressed=compressed(path))
            seen = 0
            try:
                for line in reader:
                    if self.on_bytes is not None:
                        self.on_bytes(reader.read_bytes - seen)
                        seen = reader.read_bytes
                    record = self._record(line, summary)
                    if record is not None:
                        self.last_size, self.last_line = line.size, line.number
                        yield record
            except OSError as exc:
                summary.problem = f"reading failed ({exc.strerror or exc})"
            if reader.problem is not None and summary.problem is None:
                summary.problem = reader.problem
            if self.on_bytes is not None:
                self.on_bytes(reader.read_bytes - seen)

    def _record(self, line: Line, summary: FileSummary) -> dict[str, Any] | None:
        record: dict[str, Any] | None
        problem: str | None
        if line.data is None:
            record, problem = None, "a line too long to read"
        elif not line.data.strip():
            return None
        else:
            record, problem = parse_record(line.data)
        if record is None:
            summary.bad += 1
            self.bad_lines += 1
            if len(self.bad_examples) < MAX_LISTED:
                self.bad_examples.append((summary.path, line.number, problem or "unreadable"))
            return None
        summary.records += 1
        self.records += 1
        record = {"attributes": {}, **record}
        if self.conversations is not None:
            attributes = record["attributes"]
            if isinstance(attributes, dict):
                changed = self.conversations.rebuilt(record.get("trace_id"), str(record.get("name")), attributes)
                if changed is not None:
                    record["attributes"] = changed
        return record


def _why_empty(summary: FileSummary) -> str:
    if summary.problem is not None:
        return summary.problem
    if summary.bad:
        return f"no span record ({summary.bad} lines that are not)"
    return "empty"


def follow(path: str | os.PathLike[str], position: Position = Position()) -> tuple[list[Line], Position]:  # noqa: B008
    """The complete lines of ``path`` added since ``position``, and the position to resume from (for a follower
    such as ``watch``: a gzip member or line still being written is left for the next call)."""
    with open(path, "rb") as stream:
        reader = LineReader(stream, compressed=compressed(path), position=position, final=False)
        lines = list(reader)
    return lines, reader.position


@dataclass
class ReadResult:
    """What :func:`read_records` found: good records and the bad lines (number, reason)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)


def read_records(path: str | os.PathLike[str]) -> ReadResult:
    """Every record of one capture file (plain or gzip), the conversation rebuilt; bad lines listed, not fatal.

    Holds the whole file's records: for tests and small files (the commands stream with :class:`CaptureRecords`).
    """
    reading = CaptureRecords([path])
    result = ReadResult(records=list(reading))
    summary = reading.summaries[0]
    bad = [(line, problem) for _file, line, problem in reading.bad_examples]
    if summary.problem is not None:
        bad.append((0, summary.problem))
    result.bad = bad
    return result
