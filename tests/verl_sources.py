"""verl's published packages as source trees, fetched once per machine and never installed.

``wheel_source("0.9.1")`` is the directory holding the unpacked wheel's ``verl/``
(``pip download --no-deps verl==X``); ``sdist_source("0.9.1")`` the unpacked source
distribution (``pip download --no-binary :all: --no-deps``), which also has verl's own
``tests/``. Both are kept in ``$VERL_OTEL_VERL_SOURCES`` (default
``~/.cache/verl-otel-bridge/verl-sources``, beside the nox environments); a lock
makes concurrent checkouts fetch each package once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

#: The published verl releases the plugin supports (from ``targets.OLDEST_VERL``), each checked by the source contract.
VERSIONS = ("0.8.0", "0.9.0", "0.9.1")
CACHE = Path(
    os.environ.get("VERL_OTEL_VERL_SOURCES", str(Path.home() / ".cache" / "verl-otel-bridge" / "verl-sources"))
)
#: pip's longest wait for the package index.
DOWNLOAD_TIMEOUT_S = 600


def wheel_source(version: str) -> Path:
    """The directory that holds ``verl/`` of verl ``version``'s wheel."""
    return _cached(f"wheel-{version}", ["--only-binary", ":all:", f"verl=={version}"], _unzip)


def sdist_source(version: str) -> Path:
    """The unpacked source distribution of verl ``version`` (``verl/``, ``tests/``, ``pyproject.toml``)."""
    return _cached(f"sdist-{version}", ["--no-binary", ":all:", f"verl=={version}"], _untar)


def _cached(name: str, pip_args: list[str], unpack: Callable[[Path, Path], None]) -> Path:
    target = CACHE / name
    done = target / ".complete"
    if done.is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return target
        with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
            downloads = Path(scratch) / "download"
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(downloads), *pip_args],
                check=True,
                timeout=DOWNLOAD_TIMEOUT_S,
            )
            (archive,) = downloads.iterdir()
            unpacked = Path(scratch) / "unpacked"
            unpack(archive, unpacked)
            shutil.rmtree(target, ignore_errors=True)
            unpacked.rename(target)
        done.touch()
    return target


def _unzip(archive: Path, into: Path) -> None:
    with zipfile.ZipFile(archive) as wheel:
        wheel.extractall(into)


def _untar(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as sdist:
        (top,) = {member.name.split("/")[0] for member in sdist.getmembers()}
        sdist.extractall(into.parent / "tar", filter="data")
    (into.parent / "tar" / top).rename(into)


def fetch_all() -> list[Path]:
    """Every source the tests read: each supported release's wheel and 0.9.1's source distribution."""
    return [*map(wheel_source, VERSIONS), sdist_source(VERSIONS[-1])]


if __name__ == "__main__":  # nox -s verl fetches them before its tests run where only loopback is reachable
    for path in fetch_all():
        print(path)
