"""Debian's chromium as the tests run it: headless, no network of its own, a fresh profile each time.

Shared by ``tests/browser`` (the HTML report) and ``tests/backends`` (the screenshots).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

#: Set by nox (``_chromium_env`` in noxfile.py) when chromium could not be installed, saying why.
UNAVAILABLE_ENV = "VERL_OTEL_CHROMIUM_UNAVAILABLE"
#: Without the background-networking flags chromium keeps trying to reach hosts this machine cannot.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def command(profile: Path) -> list[str]:
    """``chromium`` with :data:`FLAGS` and ``profile`` as its user data directory; skips the test without chromium."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(os.environ.get(UNAVAILABLE_ENV) or "chromium is not installed: apt-get install chromium")
    return [found, *FLAGS, f"--user-data-dir={profile}"]
