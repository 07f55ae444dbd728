"""What ``vob.propagate_to_threads()`` costs, next to bare OpenTelemetry and its ``ThreadingInstrumentor``.

Three questions, each answered by variants timed in the same rounds (order alternating,
the garbage collector off, best round reported, and the median over rounds of each
ratio to its baseline):

* code that starts no thread: a span inside a session with the switch off and on,
  against bare OpenTelemetry (own provider, the identity written by hand);
* a hand-off to a thread pool (``submit(fn).result()``, ``fn`` making one span): the
  bridge with the switch, against bare OpenTelemetry with and without
  ``ThreadingInstrumentor`` (which carries the current span only);
* a nested span outside any session: the bridge with its ``identity_lost`` check on and
  off (the check runs only for spans with a parent, outside sessions).

Both the bridge and bare OpenTelemetry export inline to a discard exporter, so the
caller's work is what is timed. Needs ``opentelemetry-instrumentation-threading``.

Usage::

    python bench/thread_context.py                # 30 rounds
    python bench/thread_context.py --rounds 5 --spans 500 --tasks 200
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from opentelemetry.instrumentation.threading import ThreadingInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge, BridgeConfig

ATTRIBUTES = {"turn": 3, "type": "generate", "prompt_tokens": 512}


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def per_op(fn: Callable[[int], None], n: int) -> float:
    """µs per operation of ``fn(n)``, the garbage collector off."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        fn(n)
        return (time.perf_counter() - started) / n * 1e6
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--spans", type=int, default=2_000)
    parser.add_argument("--tasks", type=int, default=500)
    args = parser.parse_args()

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Discard()))
    tracer = provider.get_tracer("bench")
    bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="none", progress_interval_s=0))
    with bridge.session(sample=0, session=0, global_steps=1) as s:
        identity = dict(s.identity.attributes)
    instrumentor = ThreadingInstrumentor()

    def otel_spans(n: int) -> None:
        with tracer.start_as_current_span("session", attributes=identity):
            for _ in range(n):
                with tracer.start_as_current_span("generate", attributes={**ATTRIBUTES, **identity}):
                    pass

    def bridge_spans(n: int) -> None:
        with bridge.session(sample=0, session=0, global_steps=1):
            for _ in range(n):
                with bridge.span("generate", **ATTRIBUTES):
                    pass

    def otel_task() -> None:
        with tracer.start_as_current_span("generate", attributes={**ATTRIBUTES, **identity}):
            pass

    def bridge_task() -> None:
        with bridge.span("generate", **ATTRIBUTES):
            pass

    # A pool per run: a worker thread started under one variant's patches keeps them.
    def otel_hand_offs(n: int) -> None:
        with ThreadPoolExecutor(max_workers=1) as pool, tracer.start_as_current_span("session", attributes=identity):
            for _ in range(n):
                pool.submit(otel_task).result()

    def bridge_hand_offs(n: int) -> None:
        with ThreadPoolExecutor(max_workers=1) as pool, bridge.session(sample=0, session=0, global_steps=1):
            for _ in range(n):
                pool.submit(bridge_task).result()

    def nested_outside(n: int) -> None:
        with bridge.span("outer"):
            for _ in range(n):
                with bridge.span("generate", **ATTRIBUTES):
                    pass

    identity_processor = bridge._identity_processor
    check = identity_processor._on_lost_identity

    # name -> (what to set up, the timed function, operations)
    cases: dict[str, tuple[Callable[[], None], Callable[[int], None], int]] = {
        "no thread: bare OpenTelemetry span": (lambda: None, otel_spans, args.spans),
        "no thread: bridge span, switch off": (lambda: vob.propagate_to_threads(False), bridge_spans, args.spans),
        "no thread: bridge span, switch on": (vob.propagate_to_threads, bridge_spans, args.spans),
        "pool: bare OpenTelemetry, no propagation": (lambda: None, otel_hand_offs, args.tasks),
        "pool: bare OpenTelemetry + ThreadingInstrumentor": (instrumentor.instrument, otel_hand_offs, args.tasks),
        "pool: bridge, switch off": (lambda: vob.propagate_to_threads(False), bridge_hand_offs, args.tasks),
        "pool: bridge, switch on": (vob.propagate_to_threads, bridge_hand_offs, args.tasks),
        "nested outside sessions: bridge, check off": (
            lambda: setattr(identity_processor, "_on_lost_identity", None),
            nested_outside,
            args.spans,
        ),
        "nested outside sessions: bridge, check on": (
            lambda: setattr(identity_processor, "_on_lost_identity", check),
            nested_outside,
            args.spans,
        ),
    }

    def reset() -> None:
        vob.propagate_to_threads(False)
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
        identity_processor._on_lost_identity = check

    runs: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 else reversed(names):
            set_up, fn, n = cases[name]
            set_up()
            try:
                runs[name].append(per_op(fn, n))
            finally:
                reset()
    bridge.shutdown()

    def ratio(name: str, baseline: str) -> float:
        return statistics.median(a / b for a, b in zip(runs[name], runs[baseline], strict=True))

    baselines = {
        "no thread: bridge span, switch off": "no thread: bare OpenTelemetry span",
        "no thread: bridge span, switch on": "no thread: bare OpenTelemetry span",
        "pool: bare OpenTelemetry + ThreadingInstrumentor": "pool: bare OpenTelemetry, no propagation",
        "pool: bridge, switch off": "pool: bare OpenTelemetry + ThreadingInstrumentor",
        "pool: bridge, switch on": "pool: bare OpenTelemetry + ThreadingInstrumentor",
        "nested outside sessions: bridge, check on": "nested outside sessions: bridge, check off",
    }
    print(f"{args.rounds} rounds; µs per span (no thread, nested) or per hand-off (pool)")
    print(f"{'variant':<52}{'best µs':>9}{'median µs':>11}  median ratio to")
    for name in names:
        line = f"{name:<52}{min(runs[name]):>9.2f}{statistics.median(runs[name]):>11.2f}"
        if name in baselines:
            line += f"  {ratio(name, baselines[name]):.3f} x {baselines[name]}"
        print(line)
    print(
        "switch on / off, no thread: "
        f"{ratio('no thread: bridge span, switch on', 'no thread: bridge span, switch off'):.3f}; "
        f"pool: {ratio('pool: bridge, switch on', 'pool: bridge, switch off'):.3f}"
    )


if __name__ == "__main__":
    main()
