"""What a slow trace destination costs the caller: per-span latency behind a healthy vs a slow OTLP endpoint.

Two bridges with ``exporter: otlp`` and default settings otherwise, each sending to
an OTLP/HTTP receiver of its own in a process of its own (tests/otlp_receiver.py):
one answers at once, the other waits ``--delay-ms`` before each answer, as an
RL-Insight collector (or its Tempo) that cannot keep up does. The caller's time for
``with bridge.span(...)`` (bench/run.py's span) is taken span by span, alternating between the two bridges
(the order swaps each round), so that a scheduler or GC pause lands on both alike.
Per round: p50 and p99 of each side and their slow/healthy ratios; reported: the
medians over the rounds of those paired ratios, and each bridge's counters (a slow
destination fills the queue: the rest spill, or past the spill are dropped, all counted).

    python bench/slow_destination.py [--rounds 9] [--spans 2000] [--delay-ms 200] [--json OUT] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import report  # bench/report.py
import run  # bench/run.py: the measured span
from otlp_receiver import OtlpReceiverProcess  # tests/otlp_receiver.py

from verl_otel_bridge import Bridge, BridgeConfig

SIDES = ("healthy", "slow")


def _quantile(latencies: list[int], q: int) -> float:
    return statistics.quantiles(latencies, n=100)[q - 1]


def one_round(bridges: dict[str, Bridge], spans: int, order: tuple[str, ...]) -> dict[str, list[int]]:
    """``spans`` spans on each bridge, alternating span by span in ``order``: each side's latencies (ns)."""
    latencies: dict[str, list[int]] = {side: [] for side in order}
    clock = time.perf_counter_ns
    name, attributes = run.SPAN_NAME, run.SPAN_ATTRIBUTES
    for _ in range(spans):
        for side in order:
            bridge = bridges[side]
            started = clock()
            with bridge.span(name, **attributes):
                pass
            latencies[side].append(clock() - started)
    return latencies


def measure(rounds: int, spans: int, warm_up: int, delay_ms: float, spill_dir: str) -> dict[str, Any]:
    receivers = {"healthy": OtlpReceiverProcess(), "slow": OtlpReceiverProcess(delay_s=delay_ms / 1000)}
    bridges = {
        side: Bridge(
            BridgeConfig.resolve(
                environ={}, exporter="otlp", otlp_endpoint=receiver.url, spill_dir=f"{spill_dir}/{side}"
            )
        )
        for side, receiver in receivers.items()
    }
    try:
        one_round(bridges, warm_up, SIDES)  # imports, connections, caches
        per_round: list[dict[str, Any]] = []
        for r in range(rounds):
            latencies = one_round(bridges, spans, SIDES if r % 2 == 0 else SIDES[::-1])
            quantiles = {side: {"p50": _quantile(x, 50), "p99": _quantile(x, 99)} for side, x in latencies.items()}
            per_round.append(
                {
                    **{f"{side}_{q}_us": round(v / 1000, 2) for side in SIDES for q, v in quantiles[side].items()},
                    "p50_ratio": quantiles["slow"]["p50"] / quantiles["healthy"]["p50"],
                    "p99_ratio": quantiles["slow"]["p99"] / quantiles["healthy"]["p99"],
                }
            )
        counters = {side: bridge.status()["counters"] for side, bridge in bridges.items()}
    finally:
        for bridge in bridges.values():
            bridge.shutdown(timeout_s=5)
        for receiver in receivers.values():
            receiver.stop()
    return {
        "spans_per_round": spans,
        "rounds": rounds,
        "delay_ms": delay_ms,
        "p50_ratio_slow_over_healthy": round(statistics.median(r["p50_ratio"] for r in per_round), 3),
        "p99_ratio_slow_over_healthy": round(statistics.median(r["p99_ratio"] for r in per_round), 3),
        **{
            f"{side}_{q}_us": round(statistics.median(r[f"{side}_{q}_us"] for r in per_round), 2)
            for side in SIDES
            for q in ("p50", "p99")
        },
        "per_round": [{k: round(v, 3) for k, v in r.items()} for r in per_round],
        "counters": {
            side: {key: c[key] for key in ("ended", "exported", "spilled", "dropped", "failed")}
            for side, c in counters.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--spans", type=int, default=2000, help="spans per bridge per round")
    parser.add_argument("--delay-ms", type=float, default=200.0, help="the slow receiver's delay per request")
    parser.add_argument("--smoke", action="store_true", help="tiny counts, a few seconds; no figure means anything")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    rounds, spans, warm_up = (2, 200, 20) if args.smoke else (args.rounds, args.spans, 200)
    with tempfile.TemporaryDirectory(prefix="vob-slow-destination-") as spill_dir:
        results = measure(rounds, spans, warm_up, args.delay_ms, spill_dir)
    report.emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
