"""Bursts, spill and sampling: what the bridge delivers and what it costs the caller.

Measured in one run, on one machine, against one loopback OTLP/HTTP receiver (tests/otlp_receiver.py) in this
process (it decodes every request with ``opentelemetry-proto`` and counts span ids):

* **sampling**: the caller's cost per span of agent-loop sessions (a task and eight
  turns each) with ``session_sample_rate`` 0.5 vs 1 (exporter ``none``, so only the
  bridge's own work is timed), rounds alternating; the ratio of the medians;
* **bursts**: 20,000 and 100,000 spans ended by 8 threads at once at default settings,
  ``exporter: otlp``: spans lost (made minus received once), duplicates, time until
  the receiver holds all of them, and how many went through the spill;
* **memory**: peak RSS growth of a subprocess making 200 spans with 200,000-element
  token-id lists while the receiver is down, at the default bounds and at
  ``max_queue_bytes`` 64 MiB;
* **spill**: spans per second written to the spill while the receiver is down, and
  drained once it is back;
* **estimate**: the cost of :func:`~verl_otel_bridge._internal.pipeline.queue.span_size` per span.

    python bench/noloss.py [--smoke] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import report  # bench/report.py
from otlp_receiver import OtlpReceiver
from threads import burst as burst_in_threads

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.pipeline.queue import span_size


def _await(receiver: OtlpReceiver, spans: int, timeout_s: float = 300) -> None:
    """Wait (bounded) for ``spans`` spans; short of them after ``timeout_s``, the results say how many are lost."""
    with contextlib.suppress(AssertionError):
        receiver.wait_for(spans, timeout_s)


def _delivered(receiver: OtlpReceiver, made: int) -> dict[str, int]:
    """Spans made but never received, and spans received more than once."""
    ids = Counter(span.span_id for span in receiver.spans)
    return {"lost": made - len(ids), "duplicates": sum(ids.values()) - len(ids)}


def _last_arrival_s(receiver: OtlpReceiver, since_ns: int | None = None) -> float:
    """Seconds from ``since_ns`` (``perf_counter_ns``; default: the first arrival) to the last arrival."""
    arrivals = [request.received_ns for request in receiver.requests] or [0]
    return (max(arrivals) - (min(arrivals) if since_ns is None else since_ns)) / 1e9


def _close(bridge: Bridge, receiver: OtlpReceiver) -> dict[str, Any]:
    """Flush (bounded), shut the bridge down and stop the receiver; the bridge's counters after the flush."""
    bridge.force_flush(60)
    counters: dict[str, Any] = bridge.status()["counters"]
    bridge.shutdown(timeout_s=10)
    receiver.stop()
    return counters


def _wait(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)  # polling a bound condition, not timing anything
    return condition()


def _bridge(**settings: Any) -> Bridge:
    return Bridge(BridgeConfig.resolve(environ={}, **settings))


# -- sampling: caller cost ----------------------------------------------------------


def _session_cost_ns(bridge: Bridge, sessions: int, offset: int) -> float:
    started = time.perf_counter_ns()
    for number in range(sessions):
        uid = f"prompt-{(offset + number) // 4}"
        with bridge.session(sample=str(offset + number), session="0", uid=uid, global_steps=1) as session:
            with session.task("solve") as task:
                for turn in range(8):
                    with session.turn(turn):
                        pass
                task.set_result(reward=1.0)
            session.finish(status="success")
    return (time.perf_counter_ns() - started) / (sessions * 10)  # session + task + 8 turns


def sampling_cost(rounds: int, sessions: int) -> dict[str, Any]:
    off = _bridge(exporter="none")
    on = _bridge(exporter="none", session_sample_rate=0.5, session_keep_slowest=0.05, session_keep_reward_extremes=0.05)
    _session_cost_ns(off, sessions, 0)
    _session_cost_ns(on, sessions, 0)
    costs: dict[str, list[float]] = {"off": [], "on": []}
    for round_number in range(rounds):
        offset = (round_number + 1) * sessions
        for key, bridge in (("off", off), ("on", on)) if round_number % 2 else (("on", on), ("off", off)):
            costs[key].append(_session_cost_ns(bridge, sessions, offset))
    counters = on.status()["counters"]
    off.shutdown(timeout_s=5)
    on.shutdown(timeout_s=5)
    median_off, median_on = statistics.median(costs["off"]), statistics.median(costs["on"])
    return {
        "us_per_span_off": round(median_off / 1000, 2),
        "us_per_span_on": round(median_on / 1000, 2),
        "ratio_on_over_off": round(median_on / median_off, 3),
        "kept_fraction": round(1 - counters["sampled_out"] / max(1, counters["ended"]), 3),
    }


# -- bursts ---------------------------------------------------------------------------


def burst(spans: int, threads: int = 8) -> dict[str, Any]:
    receiver = OtlpReceiver()
    bridge = _bridge(exporter="otlp", otlp_endpoint=receiver.url)
    started = time.perf_counter_ns()
    made = burst_in_threads(bridge, spans, threads, timeout_s=600)
    produced = (time.perf_counter_ns() - started) / 1e9
    _await(receiver, made)
    delivered = _last_arrival_s(receiver, since_ns=started)
    counters = _close(bridge, receiver)
    return {
        "spans": made,
        **_delivered(receiver, made),
        "caller_s": round(produced, 2),
        "delivered_s": round(delivered, 2),
        "spilled_on_the_way": counters.get("spill_written", 0),
        "dropped": counters["dropped"],
    }


# -- memory ------------------------------------------------------------------------------

#: The script that measures it, in a process of its own (shared with tests/unit/test_noloss.py).
RSS_PROBE = Path(__file__).resolve().parents[1] / "tests" / "token_ids_rss.py"


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def memory(spans: int, spill_dir: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    endpoint = f"http://127.0.0.1:{_closed_port()}/v1/traces"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VERL_OTEL_BRIDGE_"))}
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "2"
    for label, extra in (("default bounds", {}), ("max_queue_bytes 64 MiB", {"max_queue_bytes": 64 * 2**20})):
        settings = {"otlp_endpoint": endpoint, "spill_dir": os.path.join(spill_dir, label.replace(" ", "_")), **extra}
        done = subprocess.run(
            [sys.executable, str(RSS_PROBE), json.dumps(settings), str(spans)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            results[label] = {"error": done.stderr[-1500:]}
            continue
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        counters = measured["counters"]
        results[label] = {
            "peak_rss_growth_mib": round(measured["growth"] / 2**20, 1),
            "spilled": counters["spilled"],
            "dropped": counters["dropped"],
            "converted": counters["converted"],
        }
    return results


# -- spill write and drain rates -------------------------------------------------------------


def spill_rates(spans: int, spill_dir: str) -> dict[str, Any]:
    """Write rate: the caller's spans until all are in the spill; drain rate: first to last drained arrival."""
    port = _closed_port()
    bridge = _bridge(
        exporter="otlp",
        otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces",
        otlp_timeout_s=1.0,  # a batch tried on the down receiver gives up after a second
        spill_dir=spill_dir,
        spill_after_s=0.05,
        spill_probe_s=0.2,
        schedule_delay_ms=10,
    )
    # While down: the first batches wait out the sender; after spill_after_s, batches go straight to the spill.
    with bridge.span("down"):
        pass
    _wait(lambda: bridge.status()["counters"].get("spill_written", 0) == 1, timeout_s=60)
    started = time.monotonic()
    for n in range(spans):
        with bridge.span("spilled", n=n, payload="x" * 200):
            pass
    _wait(lambda: bridge.status()["counters"].get("spill_written", 0) >= spans + 1, timeout_s=300)
    write_s = time.monotonic() - started
    spill = bridge.status()["spill"]
    receiver = OtlpReceiver(port)
    _await(receiver, spans + 1)
    drain_s = _last_arrival_s(receiver)
    counters = _close(bridge, receiver)
    return {
        "spans": spans,
        "spill_mib": round(spill["bytes"] / 2**20, 1),
        "write_spans_per_s": round(spans / write_s),
        "drain_spans_per_s": round(spans / drain_s) if drain_s else None,
        **_delivered(receiver, spans + 1),
        "dropped": counters["dropped"],
    }


def estimate_cost(count: int) -> dict[str, Any]:
    bridge = _bridge(exporter="memory", memory_max_spans=count)
    with bridge.session(sample="0", session="0", uid="u", global_steps=1):
        for i in range(count):
            with bridge.span("tool", i=i, name_of="search", tokens=[1, 2, 3, 4], ok=True):
                pass
    spans = bridge.memory_exporter.get_finished_spans() if bridge.memory_exporter else ()
    started = time.perf_counter_ns()
    for span in spans:
        span_size(span)
    cost = (time.perf_counter_ns() - started) / max(1, len(spans))
    attributes = len(spans[0].attributes or {}) if spans else 0
    bridge.shutdown(timeout_s=5)
    return {"us_per_span": round(cost / 1000, 2), "attributes_per_span": attributes}


def run(smoke: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="vob-noloss-") as tmp:
        return {
            "sampling": sampling_cost(rounds=3 if smoke else 9, sessions=50 if smoke else 400),
            "bursts": [burst(n) for n in ((2_000,) if smoke else (20_000, 100_000))],
            "memory": memory(20 if smoke else 200, tmp),
            "spill": spill_rates(2_000 if smoke else 50_000, os.path.join(tmp, "rates")),
            "estimate": estimate_cost(1_000 if smoke else 20_000),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny counts, a few seconds")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results = run(args.smoke)
    report.emit(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
