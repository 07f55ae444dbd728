"""The ``jsonl`` exporter's capture directory: a run folder, a folder per step, gzip files that rotate.

See :mod:`verl_otel_bridge._internal.captures.layout` for the names. Each export
writes the batch's spans of each step into this process's open file of that step's
folder, as one gzip member per file (:mod:`verl_otel_bridge._internal.captures.files`), the batch whole or not at
all: a write that fails cuts every file of the batch back and the batch is refused
(it is then spilled, or counted failed). Past ``rotate_bytes`` a file is closed and the
next one begun; a few files stay open (a late span of an older step opens a new
file there). A file another process's disk budget removed (:mod:`verl_otel_bridge._internal.captures.budget`) is
noticed before each write, and the spans go to a new file.

Folders are made ``0700`` and files ``0600`` (:mod:`verl_otel_bridge._internal.private_files`),
never reached through a link.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.captures.budget import RunBudget
from verl_otel_bridge._internal.captures.files import AppendFile, CutBack
from verl_otel_bridge._internal.captures.layout import file_name, step_dir_name
from verl_otel_bridge._internal.config import ConfigError
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.private_files import open_private_new, private_dir
from verl_otel_bridge._internal.protocol import GLOBAL_STEPS
from verl_otel_bridge._internal.records import RecordLines
from verl_otel_bridge._internal.status import Where

logger = logging.getLogger(__name__)

#: Files kept open at once (steps come one after another; a late span of an older step reopens one).
MAX_OPEN_FILES = 4
#: Names tried per step folder before giving up (another process of the same host and pid left them).
_MAX_TRIES = 1000


class CaptureDir:
    """The ``jsonl`` destination with ``capture_dir``: writes spans into ``run_dir`` as the capture layout says
    (see the module docstring).

    ``open_now``: make the run folder now, so a folder that cannot be used fails at
    ``configure()`` (a bridge made at span time makes it at the first export, on the
    export thread). ``budget_bytes``: the run folder's disk budget (None: derived from
    the free space, see :mod:`verl_otel_bridge._internal.captures.budget`; 0: none); its
    removals are counted in ``counts``.

    Raises:
        ConfigError: with ``open_now``, ``run_dir`` cannot be made private (key ``capture_dir``).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        counts: SpanCounts,
        *,
        rotate_bytes: int,
        budget_bytes: int | None = None,
        open_now: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir).expanduser()
        self.rotate_bytes = rotate_bytes
        self.budget = RunBudget(self.run_dir, budget_bytes)
        self.budget.counts = counts
        self._lines = RecordLines(counts)  # a value JSON cannot carry is replaced, counted ``converted``
        self._once = OnceLogger(logger)
        self._ready = False
        self._closed = False
        self._last_error: str | None = None
        self._new_state()
        reinit_after_fork(self._new_state)
        if open_now:
            self._prepare()

    def _new_state(self) -> None:
        # Also after a fork: the child writes files of its own (its pid is in their names).
        self._lock = threading.Lock()
        self._open: OrderedDict[str, AppendFile] = OrderedDict()
        self._next: dict[str, int] = {}

    @property
    def detail(self) -> str:
        """Where spans go, for ``status()["detail"]`` and ``doctor``."""
        return f"gzip JSON Lines in {self.run_dir}/global_steps=<n>/ ({self.budget.describe()})"

    def _prepare(self) -> None:
        try:
            private_dir(self.run_dir)
            self.budget.start()
        except OSError as exc:
            raise ConfigError(
                f"verl_otel_bridge: capture_dir: the run folder {self.run_dir} cannot be used: {exc}", "capture_dir"
            ) from exc
        self._ready = True

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        """Write ``spans`` into their steps' files, the batch whole or not at all."""
        groups: dict[str, list[str]] = {}
        line = self._lines.line
        for span in spans:
            attributes = span.attributes
            step = attributes.get(GLOBAL_STEPS) if attributes else None
            groups.setdefault(step_dir_name(step), []).append(line(span))
        with self._lock:
            if self._closed:
                return Outcome.refusing(spans, f"the capture directory {self.run_dir} is closed")
            try:
                if not self._ready:
                    self._prepare()
                written = self._write(groups, len(spans))
            except (OSError, ValueError) as exc:
                self._once.log(
                    f"write:{type(exc).__name__}:{getattr(exc, 'errno', None)}",
                    logging.WARNING,
                    "writing %d spans into %s failed (%s); they are counted as failed or spilled",
                    len(spans),
                    self.run_dir,
                    exc,
                )
                self._last_error = f"writing into {self.run_dir} failed: {exc}"
                return Outcome.refusing(spans, self._last_error)
        if written is None:
            return Outcome.refusing(spans, self._last_error or f"writing into {self.run_dir} failed")
        self._last_error = None
        self.budget.wrote(written)
        return Outcome(len(spans))

    def _write(self, groups: dict[str, list[str]], count: int) -> int | None:
        """Each group into its step's file; every file cut back and None if any write failed."""
        done: list[tuple[AppendFile, int]] = []
        written = 0
        with self.budget.writing():
            for step, lines in groups.items():
                file = self._file(step)
                before = file.size
                try:
                    written += file.append("".join(lines).encode("utf-8", "surrogatepass"))
                except CutBack as exc:
                    for other, size in done:
                        _truncate(other, size)
                    self._last_error = exc.last_error
                    self._once.log(
                        f"append:{exc.errno}",
                        logging.WARNING,
                        "%s; they are counted as failed or spilled",
                        exc.warning(count),
                    )
                    return None
                done.append((file, before))
        return written

    def _file(self, step: str) -> AppendFile:
        """This process's open file of step folder ``step``: a new one when there is none, it grew past
        ``rotate_bytes`` or it was removed."""
        file = self._open.get(step)
        if file is not None:
            if file.size < self.rotate_bytes and not file.removed():
                self._open.move_to_end(step)
                return file
            file.close()
            del self._open[step]
        folder = private_dir(self.run_dir / step)
        counter = self._next.get(step, 0)
        for _ in range(_MAX_TRIES):
            path = folder / file_name(counter)
            counter += 1
            try:
                fd = open_private_new(path)
            except FileExistsError:
                continue
            self._next[step] = counter
            if len(self._next) > 4 * MAX_OPEN_FILES * _MAX_TRIES:
                self._next.clear()  # bounded: a counter forgotten only costs a few tries
            file = self._open[step] = AppendFile(fd, path, compressed=True)
            while len(self._open) > MAX_OPEN_FILES:
                self._open.popitem(last=False)[1].close()
            return file
        raise OSError(errno.EEXIST, f"{_MAX_TRIES} file names taken in {folder}")

    def flush(self, timeout_s: float) -> bool:
        return True  # every batch is written when send returns

    def where(self) -> Where:
        return {"endpoint": None, "path": str(self.run_dir), "last_error": self._last_error}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            while self._open:
                self._open.popitem()[1].close()
        self.budget.close()


def _truncate(file: AppendFile, size: int) -> None:
    try:
        os.ftruncate(file.fd, size)
        file.size = size
    except OSError:
        logger.warning("%s could not be cut back to its last whole batch", file.path)
