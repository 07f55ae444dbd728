"""Whole-process CPU per span in the agent-loop pattern, per exporter.

Sessions of 8 spans (the session, a task, six turns with their details recorded),
made back to back on one thread, then flushed: the process's CPU time
(``time.process_time_ns``: the caller and every bridge thread) from the first span
until the exporter holds all of them, divided by the spans. Exporters ``none``,
``jsonl`` (to a file in a temporary directory) and ``otlp`` (to an OTLP/HTTP
receiver in a process of its own, as a collector would be; its CPU is not counted).
Rounds alternate the exporters, a fresh bridge each, and the medians are reported.

Two baselines run in the same rounds: the bare OpenTelemetry SDK making the same
sessions (the identity written by hand on every span, a ``BatchSpanProcessor``),
with an exporter that does nothing (``otel_none``: what the SDK's spans alone cost)
and with OpenTelemetry's own ``OTLPSpanExporter`` (protobuf over HTTP) to the same
receiver (``otel_otlp``, when ``opentelemetry-exporter-otlp-proto-http`` is installed,
as in the ``bench`` extra).

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Tracer
from otlp_receiver import OtlpReceiverProcess  # tests/otlp_receiver.py

from verl_otel_bridge import Bridge, BridgeConfig

try:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
except ImportError:  # not in the unit tests' environment (the smoke run): that baseline is left out
    OTLPSpanExporter = None

SPANS_PER_SESSION = 8
TURNS = SPANS_PER_SESSION - 2
EXPORTERS = ("none", "jsonl", "otlp")
#: The bare SDK, same sessions: its exporter does nothing, or is OpenTelemetry's OTLP/HTTP one.
BASELINES = ("otel_none", "otel_otlp") if OTLPSpanExporter is not None else ("otel_none",)


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


def make_bare_sessions(tracer: Tracer, sessions: int, step: int) -> None:
    """:func:`make_sessions` with the bare SDK: the identity the bridge would stamp, written on every span."""
    for s in range(sessions):
        identity: dict[str, Any] = {
            "project": "",
            "experiment_name": "default",
            "sample": f"s{s}",
            "session": str(s % 4),
            "traj": "0",
            "state_lane_id": f"experiment=default/sample=s{s}/session={s % 4}/traj=0",
            "uid": f"u{s}",
            "global_steps": step,
            "session_id": f"x{s}",
        }
        task_attributes = {**identity, "task": "math", "dataset": "gsm8k"}
        with (
            tracer.start_as_current_span("agent_session", attributes=identity),
            tracer.start_as_current_span("agent_task", attributes=task_attributes) as task,
        ):
            for turn in range(TURNS):
                attributes = {**identity, "turn": turn, "type": "generate" if turn % 2 == 0 else "tool"}
                with tracer.start_as_current_span("agent_turn", attributes=attributes) as span:
                    span.set_attributes({"prompt_tokens": 512, "completion_tokens": 64, "finish_reason": "stop"})
            task.set_attributes({"status": "success", "reward": 1.0})


class _NoOpExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def one_bare_round(baseline: str, spans: int, receiver: OtlpReceiverProcess, step: int) -> dict[str, Any]:
    """A fresh bare ``TracerProvider`` with ``baseline``'s exporter: CPU µs per span until all are exported."""
    otlp = baseline == "otel_otlp"
    exporter = OTLPSpanExporter(endpoint=receiver.url) if otlp else _NoOpExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    # A queue for the whole round: with its default 2,048 the SDK drops what the exporter has not taken yet
    # (a slower exporter loses spans of the round); the bridge's queue spills instead.
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=spans))
    received_before = receiver.span_count
    sessions = spans // SPANS_PER_SESSION
    gc.collect()
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    make_bare_sessions(provider.get_tracer("bench"), sessions, step)
    flushed = provider.force_flush(120_000)
    cpu = time.process_time_ns() - cpu0
    wall = time.perf_counter_ns() - wall0
    provider.shutdown()
    made = sessions * SPANS_PER_SESSION
    received = receiver.span_count - received_before if otlp else None
    assert flushed, f"{baseline}: flush did not finish"
    assert received in (None, made), f"{baseline}: the receiver holds {received} of {made} spans"
    return {"cpu_us_per_span": cpu / made / 1000, "wall_us_per_span": wall / made / 1000, "spans": made}


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
    arms = EXPORTERS + BASELINES
    per: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}

    def once(name: str, count: int, directory: str, step: int) -> dict[str, Any]:
        if name in BASELINES:
            return one_bare_round(name, count, receiver, step)
        return one_round(name, count, directory, receiver, step)

    try:
        with tempfile.TemporaryDirectory() as directory:
            for name in arms:
                once(name, min(spans, 4000), directory, 0)
            for r in range(rounds):
                order = arms[r % len(arms) :] + arms[: r % len(arms)]
                for name in order:
                    per[name].append(once(name, spans, directory, r + 1))
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
            f"{name:9} {result['cpu_us_per_span']:7.1f} µs CPU/span (rounds {result['cpu_us_per_span_rounds']}), "
            f"{result['wall_us_per_span']:6.1f} µs wall/span, {result['spans']} spans"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
