"""Directories and files only the current user can read or change, never reached through a link.

A directory the bridge writes into must be the user's own: created ``0700`` when
missing, and when it exists, a real directory (not a symbolic link) owned by the
effective user with no group or other permission bits. Any other existing
directory is refused (:class:`UnsafePathError`), never used or changed: another
user who made it first could read what is written there, or plant links and files
in it. Inside such a directory no other user can add, rename or remove entries,
so files checked here stay what they were.

Files are created ``0600`` with ``O_EXCL | O_NOFOLLOW`` (an existing name, or a
link, fails instead of being followed) and opened for reading with
``O_NOFOLLOW``, then checked to be regular files the user owns. Every descriptor
is close-on-exec.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

#: Permission bits of a private directory and of a private file.
DIRECTORY_MODE = 0o700
FILE_MODE = 0o600

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePathError(OSError):
    """A path the bridge will not use: a link, not the user's, or open to other users (the message says which)."""


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` (``~`` expanded) as a directory private to the current user, created ``0700`` if missing.

    Missing parents are created ``0700`` too (as the XDG base-directory spec asks of
    ``~/.local/state``); existing parents are used as they are.

    Raises:
        UnsafePathError: ``path`` exists and is a link, not a directory, owned by
            another user, or has group or other permission bits.
        OSError: it cannot be created.
    """
    directory = Path(path).expanduser()
    make_dirs(directory)
    check_private_dir(directory)
    return directory


def make_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each ``0700``; existing ones are left as they are.

    ``os.makedirs`` and ``Path.mkdir(parents=True)`` apply the mode to the last
    directory only: the parents they create get ``0777`` less the umask (``0755``).
    """
    missing: list[Path] = []
    while not os.path.lexists(directory) and directory.parent != directory:
        missing.append(directory)
        directory = directory.parent
    for created in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process: checked by the caller
            os.mkdir(created, DIRECTORY_MODE)


def check_private_dir(directory: Path) -> None:
    """Raise :class:`UnsafePathError` unless ``directory`` is a real directory of the user's own, at most ``0700``."""
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(f"{directory} is a symbolic link, not a directory")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(f"{directory} is not a directory")
    _check_owner_and_mode(directory, info, "directory", DIRECTORY_MODE)


def open_private_new(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """Create ``path`` as a new ``0600`` file and return its descriptor (opened with ``flags``).

    Raises:
        FileExistsError: the name exists (a file or a link: neither is followed).
        OSError: it cannot be created.
    """
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, FILE_MODE)


def open_private_output(path: str | os.PathLike[str], *, truncate: bool = False) -> int:
    """Open ``path`` for appending (or, with ``truncate``, for writing anew), creating it ``0600``.

    For a path the user names (``jsonl_path``, ``report --html``): an existing file of
    the user's own is used as it is, a link is never followed, a regular file another
    user owns is refused, and opening never waits (a FIFO nobody reads fails at once).
    Returns the descriptor.

    Raises:
        UnsafePathError: a link, or a regular file another user owns.
        OSError: it cannot be opened.
    """

    def check(info: os.stat_result) -> None:
        if stat.S_ISREG(info.st_mode) and info.st_uid != os.geteuid():
            raise UnsafePathError(f"{path} belongs to another user (uid {info.st_uid})")

    return _open_unfollowed(path, os.O_WRONLY | (os.O_TRUNC if truncate else os.O_APPEND) | os.O_CREAT, check)


def open_private_read(path: str | os.PathLike[str]) -> int:
    """Open the existing ``path`` for reading; only a regular file of the user's own with no group or other bits.

    Raises:
        UnsafePathError: a link (not followed), not a regular file, another user's, or open to others.
        OSError: it cannot be opened (e.g. ``FileNotFoundError``).
    """

    def check(info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(f"{path} is not a regular file")
        _check_owner_and_mode(Path(path), info, "file", FILE_MODE)

    return _open_unfollowed(path, os.O_RDONLY, check)


def _open_unfollowed(path: str | os.PathLike[str], flags: int, check: Callable[[os.stat_result], None]) -> int:
    """Open ``path`` with ``flags`` (a new file ``0600``), never through a link and never waiting, then ``check``
    what was opened; the descriptor (blocking again), closed if ``check`` raises."""
    nonblock = getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | nonblock, FILE_MODE)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafePathError(f"{path} is a symbolic link") from exc
        raise
    try:
        check(os.fstat(fd))
        if nonblock:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_owner_and_mode(path: Path, info: os.stat_result, what: str, allowed: int) -> None:
    user = os.geteuid()
    if info.st_uid != user:
        raise UnsafePathError(f"{path}: the {what} belongs to uid {info.st_uid}, not to this user (uid {user})")
    extra = stat.S_IMODE(info.st_mode) & ~allowed
    if extra:
        raise UnsafePathError(
            f"{path}: the {what} has mode {stat.S_IMODE(info.st_mode):04o}, open to other users "
            f"(allowed: {allowed:04o}; fix with chmod {allowed:o} {path})"
        )
