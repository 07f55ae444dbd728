"""A disk budget shared by every process writing into one run folder: past it, whole oldest steps go.

The run folder's lock file (:data:`~.layout.LOCK_NAME`) holds the budget in bytes:
``capture_max_bytes`` when set, else a quarter of the space free on that file system
when the first process of the run made the file, so every process of the run, on
every node, keeps to the same number. ``0`` turns the budget off.

Each process counts the bytes it writes; every :data:`CHECK_INTERVAL_S` seconds
(or sooner, after writing a hundredth of the budget) its export thread checks,
unless another process did within that interval: under the lock, held exclusively,
it adds up the sizes of the step folders and, while they exceed the budget,
removes the folder of the oldest step, never the newest one and never the folder
of spans without a step. Each removal is one WARNING naming the step and is counted
in ``status()["counters"]`` (``capture_steps_removed``, ``capture_bytes_removed``).
Writers hold the lock shared while they write, so no file is removed under a
write; a file removed between two writes is noticed before the next one
(:meth:`~.files.AppendFile.removed`), which goes to a new file.

Nothing here runs on the caller's thread, and a budget that cannot be kept (a file
system without locks, a folder that cannot be read) is said once and never stops
the spans from being written.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.captures.layout import LOCK_NAME, step_of_dir
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.private_files import open_private_new, open_private_read

logger = logging.getLogger(__name__)

#: The share of the free space a run may take when ``capture_max_bytes`` is unset.
FREE_SPACE_SHARE = 4
#: How often one process checks the budget at most (and the processes of a run together, by the lock file's time).
CHECK_INTERVAL_S = 10.0
#: Counter names in ``status()["counters"]``.
STEPS_REMOVED, BYTES_REMOVED = "capture_steps_removed", "capture_bytes_removed"


class RunBudget:
    """The disk budget of ``run_dir`` as one process sees it (see the module docstring)."""

    def __init__(self, run_dir: Path, configured: int | None) -> None:
        self.run_dir = run_dir
        self.configured = configured
        self.max_bytes: int | None = configured
        self.counts: SpanCounts | None = None
        self._fd: int | None = None
        self._since = 0
        self._last = 0.0
        self._once = OnceLogger(logger)
        self._locks = True
        self._checking = threading.Lock()

    def describe(self) -> str:
        """The budget in words, for ``doctor`` and ``status()["detail"]``."""
        if self.max_bytes == 0:
            return "no disk budget"
        if self.max_bytes is None:
            return "disk budget: a quarter of the free space"
        source = "capture_max_bytes" if self.configured else "a quarter of the free space at the run's start"
        return f"disk budget {self.max_bytes} bytes, {source}"

    def start(self) -> None:
        """Open (the first process: create) the run's lock file and read the budget from it.

        Raises:
            OSError: the lock file cannot be made or is not a private regular file.
        """
        if self._fd is not None:
            return
        path = self.run_dir / LOCK_NAME
        try:
            fd = open_private_new(path, os.O_RDWR)
        except FileExistsError:
            fd = open_private_read(path)
            self._fd = fd
            if self.max_bytes is None:
                self.max_bytes = _read_budget(fd) or _derived(self.run_dir)
            return
        self._fd = fd
        if self.max_bytes is None:
            self.max_bytes = _derived(self.run_dir)
        os.write(fd, f"{self.max_bytes}\n".encode())

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the lock shared while writing, so no step is removed under the write."""
        locked = self._lock(fcntl.LOCK_SH)
        try:
            yield
        finally:
            if locked:
                self._unlock()

    def wrote(self, size: int) -> None:
        """Count ``size`` bytes written; check the budget when it is due (never raises)."""
        if not self.max_bytes or self._fd is None:
            return
        self._since += size
        now = time.monotonic()
        if self._since < self.max_bytes // 100 and now - self._last < CHECK_INTERVAL_S:
            return
        self._since, self._last = 0, now
        try:
            self.check()
        except Exception as exc:  # noqa: BLE001 - the budget never stops spans from being written
            self._once.log(
                f"check:{type(exc).__name__}",
                logging.WARNING,
                "checking the disk budget of %s failed: %r",
                self.run_dir,
                exc,
            )

    def check(self, *, force: bool = False) -> list[int]:
        """Remove whole oldest steps while the run folder exceeds the budget; the steps removed.

        Skipped (unless ``force``) when any process of the run checked within :data:`CHECK_INTERVAL_S`.
        """
        if not self.max_bytes or self._fd is None or not self._checking.acquire(blocking=False):
            return []
        try:
            if not self._lock(fcntl.LOCK_EX):
                return []
            try:
                if not force and time.time() - os.fstat(self._fd).st_mtime < CHECK_INTERVAL_S:
                    return []
                os.utime(self._fd)
                return self._remove_over_budget(self.max_bytes)
            finally:
                self._unlock()
        finally:
            self._checking.release()

    def _remove_over_budget(self, budget: int) -> list[int]:
        steps, total = step_sizes(self.run_dir)
        removed: list[int] = []
        numbered = sorted(step for step in steps if isinstance(step, int))
        for step in numbered[:-1]:  # never the newest step
            if total <= budget:
                break
            size, _files = steps[step]
            shutil.rmtree(self.run_dir / f"global_steps={step}", ignore_errors=True)
            total -= size
            removed.append(step)
            if self.counts is not None:
                self.counts.add(STEPS_REMOVED, 1)
                self.counts.add(BYTES_REMOVED, size)
            logger.warning(
                "disk budget: removed step %s of %s (%d bytes): the run folder held more than its budget of %d "
                "bytes (capture_max_bytes; whole oldest steps are removed, see docs/protocol.md)",
                step,
                self.run_dir,
                size,
                budget,
            )
        return removed

    def _lock(self, how: int) -> bool:
        if self._fd is None or not self._locks:
            return False
        try:
            fcntl.flock(self._fd, how)
        except OSError as exc:
            self._locks = False
            logger.warning(
                "the file system of %s does not lock files (%s): its disk budget is kept without a lock",
                self.run_dir,
                exc,
            )
            return False
        return True

    def _unlock(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def step_sizes(run_dir: Path) -> tuple[dict[int | None, tuple[int, int]], int]:
    """Per step folder of ``run_dir`` (None: spans without a step) its bytes and files, and the total bytes.

    Links and anything but regular files are not counted (and never followed).
    """
    steps: dict[int | None, tuple[int, int]] = {}
    total = 0
    with os.scandir(run_dir) as entries:
        for entry in entries:
            step = step_of_dir(entry.name)
            if step is False or not entry.is_dir(follow_symlinks=False):
                continue
            size = files = 0
            with contextlib.suppress(OSError), os.scandir(entry.path) as inside:
                for item in inside:
                    info = item.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        size += info.st_size
                        files += 1
            steps[step] = (size, files)
            total += size
    return steps, total


def _derived(run_dir: Path) -> int:
    """A quarter of the space free to this user on ``run_dir``'s file system (at least 1 byte)."""
    info = os.statvfs(run_dir)
    return max(1, info.f_bavail * info.f_frsize // FREE_SPACE_SHARE)


def _read_budget(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
