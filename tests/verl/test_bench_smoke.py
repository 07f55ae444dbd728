"""bench/verl_overhead.py runs end to end (tiny counts); its figures are the benchmark's business, not a test's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "verl_overhead.py"


def test_verl_overhead_benchmark_runs_and_prints_its_table() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "1", "--prompts", "1", "--n", "1", "--latency-ms", "1", "--no-write"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `")]
    assert len(rows) == 12  # two loops x two latencies x wall, process CPU, caller CPU
    assert all(row.count("**") == 2 for row in rows)  # each with its plugin on / backend unset ratio
    assert "the plugin's pass-through" in done.stdout  # rollout_trace_op's cost per call
