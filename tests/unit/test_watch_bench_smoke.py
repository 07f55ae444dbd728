"""``bench/watch_follow.py`` cannot rot: a short, slow run in a subprocess prints its figures (no thresholds)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "watch_follow.py"


def test_the_watch_benchmark_runs_and_prints_cpu_lag_and_memory() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--rate", "1000", "--seconds", "8", "--sessions-per-step", "50"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"CPU: [\d.]+% of one core; largest lag -?[\d.]+ s of writing", done.stdout), done.stdout
    assert re.search(r"RSS \(MiB\): \d+ s: \d+", done.stdout), done.stdout
