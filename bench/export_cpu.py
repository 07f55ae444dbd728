"""Whole-process CPU per span in the agent-loop pattern, per exporter.

Sessions of 8 spans (the session, a task, six turns with their details recorded),
made back to back on one thread, then flushed: the process's CPU time
(``time.process_time_ns``: the caller and every bridge thread) from the first span
until the exporter holds all of them, divided by the spans. Exporters ``none``,
``jsonl`` (to a file in a temporary directory) and ``otlp`` (to an OTLP/HTTP
receiver in a process of its own, as a collector would be; its CPU is not counted).
Rounds alternate the exporters, a fresh bridge each, and the medians are reported.

    python bench/export_cpu.py [--spans 40000] [--rounds 3] [--json OUT] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from otlp_receiver import OtlpReceiverProcess  # tests/otlp_receiver.py

from verl_otel_bridge import Bridge, BridgeConfig

SPANS_PER_SESSION = 8
TURNS = SPANS_PER_SESSION - 2
EXPORTERS = ("none", "jsonl", "otlp")


def make_sessions(bridge: Bridge, sessions: int, step: int) -> None:
    """``sessions`` agent-loop sessions of :data:`SPANS_PER_SESSION` spans each."""
    for s in range(sessions):
        with (
            bridge.session(sample=f"s{s}", session=s % 4, traj=0, uid=f"u{s}", global_steps=step, session_id=f"x{s}"),
            bridge.task("math", dataset="gsm8k") as task,
        ):
            for turn in range(TURNS):
                with bridge.turn(turn, type="generate" if turn % 2 == 0 else "tool") as handle:
                    handle.record(prompt_tokens=512, completion_tokens=64, finish_reason="stop")
            task.set_result(status="success", reward=1.0)


def one_round(exporter: str, spans: int, directory: str, receiver: OtlpReceiverProcess, step: int) -> dict[str, Any]:
    """A fresh bridge with ``exporter``: CPU µs per span until all ``spans`` are exported."""
    options: dict[str, Any] = {"exporter": exporter, "progress_interval_s": 0}
    if exporter == "jsonl":
        options["jsonl_path"] = f"{directory}/spans-{step}.jsonl"
    if exporter == "otlp":
        options["otlp_endpoint"] = receiver.url
    bridge = Bridge(BridgeConfig.resolve(environ={}, **options))
    received_before = receiver.span_count
    sessions = spans // SPANS_PER_SESSION
    gc.collect()
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    make_sessions(bridge, sessions, step)
    flushed = bridge.force_flush(120.0)
    cpu = time.process_time_ns() - cpu0
    wall = time.perf_counter_ns() - wall0
    counters = bridge.status()["counters"]
    bridge.shutdown()
    made = sessions * SPANS_PER_SESSION
    received = receiver.span_count - received_before if exporter == "otlp" else None
    assert flushed, f"{exporter}: flush did not finish"
    assert counters["ended"] == made and counters["dropped"] == 0 and counters["failed"] == 0, counters
    assert received in (None, made), f"otlp: the receiver holds {received} of {made} spans"
    return {"cpu_us_per_span": cpu / made / 1000, "wall_us_per_span": wall / made / 1000, "spans": made}


def measure(spans: int, rounds: int) -> dict[str, Any]:
    """:data:`EXPORTERS` alternating for ``rounds`` rounds (one untimed warm-up round first)."""
    receiver = OtlpReceiverProcess()
    per: dict[str, list[dict[str, Any]]] = {name: [] for name in EXPORTERS}
    try:
        with tempfile.TemporaryDirectory() as directory:
            for name in EXPORTERS:
                one_round(name, min(spans, 4000), directory, receiver, 0)
            for r in range(rounds):
                order = EXPORTERS[r % len(EXPORTERS) :] + EXPORTERS[: r % len(EXPORTERS)]
                for name in order:
                    per[name].append(one_round(name, spans, directory, receiver, r + 1))
    finally:
        receiver.stop()
    return {
        name: {
            "cpu_us_per_span": statistics.median(x["cpu_us_per_span"] for x in results),
            "cpu_us_per_span_rounds": [round(x["cpu_us_per_span"], 1) for x in results],
            "wall_us_per_span": statistics.median(x["wall_us_per_span"] for x in results),
            "spans": results[0]["spans"],
            "rounds": len(results),
        }
        for name, results in per.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help="800 spans, one round: checks the harness")
    args = parser.parse_args(argv)
    results = measure(800, 1) if args.smoke else measure(args.spans, args.rounds)
    for name, result in results.items():
        print(
            f"{name:6} {result['cpu_us_per_span']:7.1f} µs CPU/span (rounds {result['cpu_us_per_span_rounds']}), "
            f"{result['wall_us_per_span']:6.1f} µs wall/span, {result['spans']} spans"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
