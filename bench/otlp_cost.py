"""Cost per span of ``exporter: otlp``: encoding, and encoding plus sending, before and after one OTLP path.

Before: OpenTelemetry's ``OTLPSpanExporter`` (``opentelemetry-exporter-otlp-proto-http``,
a dependency the ``otlp`` extra does without). After: the package's ``otlp`` destination
(its encoder and urllib3 sender). Both export the same agent-loop spans, made by a
bridge (identity attributes on every span), in batches of 512 to one loopback
OTLP/HTTP receiver in this process (tests/otlp_receiver.py), alternating round by round so that both see
the same machine load. Prints medians over the rounds (µs per span) and the ratios.

    python bench/otlp_cost.py [--rounds 15] [--batch 512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.otlp.encoding import SpanEncoder
from verl_otel_bridge._internal.otlp.exporter import OtlpDestination
from verl_otel_bridge._internal.otlp.sender import OtlpHttpSender
from verl_otel_bridge._internal.otlp.settings import SenderSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import run  # bench/run.py: the benchmark's span shapes
from otlp_receiver import OtlpReceiver  # tests/otlp_receiver.py


def agent_loop_spans(count: int) -> list[ReadableSpan]:
    """``count`` spans of sessions with four turns each, as a bridge makes them (bench/run.py's identity)."""
    bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="memory", memory_max_spans=count + 10))
    made = 0
    while made < count:
        identity = {**run.SESSION_ARGS, "sample": made, "uid": f"u-{made}", "session_id": f"sess-{made}"}
        with bridge.session(**identity):
            for turn in range(4):
                with bridge.span(run.SPAN_NAME, **{**run.SPAN_ATTRIBUTES, "turn": turn}):
                    pass
        made += 5
    assert bridge.memory_exporter is not None
    spans = list(bridge.memory_exporter.get_finished_spans())[:count]
    bridge.shutdown()
    return spans


def _per_span_us(run: Callable[[], object], spans: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / spans * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args(argv)

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    receiver = OtlpReceiver()
    batch = agent_loop_spans(args.batch)
    attributes = statistics.median(len(span.attributes or {}) for span in batch)
    before: SpanExporter = OTLPSpanExporter(endpoint=receiver.url)
    after = OtlpDestination(OtlpHttpSender(receiver.url, SenderSettings()))
    ours = SpanEncoder()
    measures: dict[str, Callable[[], object]] = {
        "encode, before (OpenTelemetry)": lambda: encode_spans(batch).SerializePartialToString(),
        "encode, after (verl_otel_bridge.otlp)": lambda: ours.encode(batch),
        "export = encode + send, before": lambda: before.export(batch),
        "export = encode + send, after": lambda: after.send(batch),
    }
    # warm up: connections, encoder memo
    assert before.export(batch) is SpanExportResult.SUCCESS and after.send(batch).accepted == len(batch)
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(args.rounds):
        for name, measure in measures.items():
            samples[name].append(_per_span_us(measure, len(batch)))
    print(f"{len(batch)} agent-loop spans per batch (median {attributes:.0f} attributes), {args.rounds} rounds")
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, value in medians.items():
        low, high = min(samples[name]), max(samples[name])
        print(f"  {name:40s} {value:7.2f} µs/span  (range {low:.2f}-{high:.2f})")
    encode_ratio = medians["encode, before (OpenTelemetry)"] / medians["encode, after (verl_otel_bridge.otlp)"]
    export_ratio = medians["export = encode + send, before"] / medians["export = encode + send, after"]
    print(f"  before/after: encoding {encode_ratio:.1f}x, export {export_ratio:.1f}x")
    before.shutdown()
    after.close()
    receiver.stop()


if __name__ == "__main__":
    main()
