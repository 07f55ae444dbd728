"""The benchmark cannot rot: ``bench/run.py --smoke`` runs in a subprocess and produces every row it can.

The smoke mode uses tiny counts and asserts no thresholds; the rows for verl's
direct RL-Insight calls (d) and the bridge forwarding to RL-Insight (e) need
``rl_insight``, ``ray`` and ``opentelemetry-proto``, so they are expected exactly
when those import in a fresh interpreter (the unit environment has none of them,
so there they must be reported as skipped, with a reason).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "bench" / "run.py"

#: Rows every smoke run produces: bare OpenTelemetry, the bridge four ways, disabled two ways, the timer.
ALWAYS = ("a", "b1", "b2", "b3", "b4", "c1", "c2", "timer")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VERL_OTEL_BRIDGE_"))}
    for name in ("RL_INSIGHT_SERVER_URL", "VERL_RL_INSIGHT_ENABLE"):
        env.pop(name, None)
    return env


def _stack_importable() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import rl_insight, ray, opentelemetry.proto"],
        capture_output=True,
        timeout=120,
        env=_clean_env(),
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.timeout(300)
def test_bench_smoke_produces_every_row_it_can(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN), "--smoke", "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
        env=_clean_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, f"bench/run.py --smoke exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    results = json.loads((tmp_path / "results.json").read_text())
    variants, skipped = results["variants"], results["skipped"]

    for key in ALWAYS:
        assert key in variants, f"row {key} missing; skipped: {skipped}"
        row = variants[key]
        assert row["n"] > 0 and row["median_us"] > 0 and row["p99_us"] >= row["median_us"], row
    for key, check in results["checks"].items():
        if key.endswith("_attributes_equal_a"):
            assert check is True, f"{key}: the bridge's span and the bare span carry different attributes"

    if _stack_importable():
        for key in ("d", "e"):
            assert key in variants, f"rl_insight imports here but row {key} is missing: {skipped}"
            delivery = variants[key]["delivery"]
            assert delivery["bursts"] and delivery["bursts"][0]["received"] > 0, delivery
        capacity = variants["e"]["capacity"]
        assert capacity["rounds"] and capacity["rounds"][0]["received"] > 0, capacity
    else:
        for key in ("d", "e"):
            assert key not in variants and skipped.get(key), f"row {key}: neither measured nor skipped with a reason"

    memory = results["memory"]
    assert memory["spans"] > 0 and memory["rss_end_mb"] > 0, memory
    export_cpu = results["export_cpu"]
    assert {"none", "jsonl", "otlp", "otel_none"} <= set(export_cpu), export_cpu  # otel_otlp with the bench extra
    assert all(row["spans"] > 0 and row["cpu_us_per_span"] > 0 for row in export_cpu.values()), export_cpu
    slow = results["slow_destination"]
    assert slow["p50_ratio_slow_over_healthy"] > 0 and slow["p99_ratio_slow_over_healthy"] > 0, slow
    assert all(c["ended"] > 0 and c["failed"] == 0 for c in slow["counters"].values()), slow
    assert results["targets"] and all(t["met"] is None for t in results["targets"]), "smoke runs assess no target"

    markdown = (tmp_path / "performance.md").read_text()
    assert "### Behind a slow destination" in markdown and "| slow |" in markdown
    for key in ALWAYS:
        assert f"| {key} |" in markdown


@pytest.mark.timeout(120)
def test_thread_context_bench_runs_every_variant() -> None:
    """``bench/thread_context.py`` (the figures of docs/concepts.md's threads section) with tiny counts."""
    pytest.importorskip("opentelemetry.instrumentation.threading")
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "thread_context.py"), "--rounds", "2", "--spans", "20", "--tasks", "5"],
        capture_output=True,
        text=True,
        timeout=100,
        env=_clean_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for variant in ("switch off", "switch on", "ThreadingInstrumentor", "check on"):
        assert variant in proc.stdout, proc.stdout
    assert "switch on / off, no thread:" in proc.stdout
