"""Where a capture directory keeps what: the names of run folders, step folders and files.

::

    <capture_dir>/<run>/global_steps=<n>/<host>-<pid>-<k>.jsonl.gz
    <capture_dir>/<run>/global_steps=__HIVE_DEFAULT_PARTITION__/<host>-<pid>-<k>.jsonl.gz   (spans without a step)
    <capture_dir>/<run>/.verl_otel_bridge.lock                                              (the disk budget's lock)

One folder per run, in it one folder per training step named Hive-style
(``key=value``), so DuckDB, Polars, Spark and ClickHouse read a run as a data set
partitioned by ``global_steps`` as it is; Hive's own name for a missing value holds
the spans that have no integer step. ``<k>`` counts the files one process wrote into
that step folder (a file is closed at ``capture_rotate_bytes`` and the next one opened).
"""

from __future__ import annotations

import os
import re
import socket

#: The partition key of a step folder, the identity key ``global_steps``.
STEP_KEY = "global_steps"
#: What Hive, Spark, Arrow and DuckDB read as a missing partition value: the folder of spans without a step.
NO_STEP = "__HIVE_DEFAULT_PARTITION__"
#: The suffix of a compressed capture file, and of a plain one.
GZ_SUFFIX, PLAIN_SUFFIX = ".jsonl.gz", ".jsonl"
#: The lock file in a run folder (also holds the run's disk budget in bytes).
LOCK_NAME = ".verl_otel_bridge.lock"
#: The widest ``<k>`` is written with, so file names sort in the order they were written.
_COUNTER_DIGITS = 6

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STEP_DIR = re.compile(rf"{STEP_KEY}=(-?[0-9]+|{NO_STEP})")


def safe_name(text: str, fallback: str, limit: int = 100) -> str:
    """``text`` as one path component: runs of other characters than ``A-Za-z0-9._-`` become ``_``, never
    empty, ``.`` or ``..``, at most ``limit`` characters."""
    name = _UNSAFE.sub("_", text).strip("._")[:limit]
    return name or fallback


def step_dir_name(step: object) -> str:
    """The folder of ``step``: ``global_steps=<n>`` for an integer, the no-step folder for anything else."""
    if isinstance(step, int) and not isinstance(step, bool):
        return f"{STEP_KEY}={step}"
    return f"{STEP_KEY}={NO_STEP}"


def step_of_dir(name: str) -> int | bool | None:
    """The step a folder name stands for: an int, None for the no-step folder, False for any other name."""
    found = _STEP_DIR.fullmatch(name)
    if found is None:
        return False
    value = found[1]
    return None if value == NO_STEP else int(value)


def host_name() -> str:
    """This machine's name as a file name part."""
    return safe_name(socket.gethostname(), "host", 64)


def file_name(counter: int, *, compressed: bool = True, pid: int | None = None) -> str:
    """This process's ``counter``-th file name in a step folder: ``<host>-<pid>-<k>.jsonl.gz``."""
    suffix = GZ_SUFFIX if compressed else PLAIN_SUFFIX
    return f"{host_name()}-{os.getpid() if pid is None else pid}-{counter:0{_COUNTER_DIGITS}d}{suffix}"


def is_capture_file(name: str) -> bool:
    """Whether a file name is a capture's (``*.jsonl`` or ``*.jsonl.gz``)."""
    return name.endswith((GZ_SUFFIX, PLAIN_SUFFIX))


def compressed(path: str | os.PathLike[str]) -> bool:
    """Whether the capture file ``path`` is gzip-compressed (by its name)."""
    return os.fspath(path).endswith(".gz")
