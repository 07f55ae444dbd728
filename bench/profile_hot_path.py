"""Where the bridge's per-span time goes, next to bare OpenTelemetry (variants b1 and a of bench/run.py).

Two views:

1. cProfile of N spans of ``a`` and of ``b1``: calls per span and own time per span
   for every function, and the functions whose call counts differ (what the
   bridge adds or removes). cProfile inflates small Python calls, so read its
   times as proportions, not absolutes.
2. The pieces the bridge adds, timed in isolation with ``timeit`` (best of
   several repeats, in µs per call), next to the pieces of ``a`` they replace.

Usage::

    python bench/profile_hot_path.py            # both views
    python bench/profile_hot_path.py --spans 50000 --top 25
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import timeit
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run


def _profile(variant: run.Variant, spans: int) -> tuple[dict[tuple[str, int, str], tuple[int, float]], float]:
    variant.block(2000, array("q"), "warm")
    variant.settle()
    profiler = cProfile.Profile()
    out = array("q")
    profiler.enable()
    variant.block(spans, out, "profile")
    profiler.disable()
    variant.settle()
    stats = pstats.Stats(profiler)
    table = {}
    for func, (_cc, nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        table[func] = (nc, tt)
    total = sum(tt for _, tt in table.values())
    return table, total


def _name(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    short = filename
    for marker in ("site-packages/", "verl_otel_bridge/", "lib/python3"):
        if marker in filename:
            short = filename.split(marker, 1)[1]
            break
    return f"{short}:{line}({name})" if line else name


def cprofile_view(spans: int, top: int) -> None:
    variants = {v.key: v for v in run.micro_variants("/dev/null")}
    a, a_total = _profile(variants["a"], spans)
    b, b_total = _profile(variants["b1"], spans)
    print(
        f"cProfile, {spans} spans each: total own time per span a {a_total / spans * 1e6:.1f} µs, "
        f"b1 {b_total / spans * 1e6:.1f} µs (ratio {b_total / a_total:.3f}; profiler-inflated)\n"
    )
    for label, table in (("a", a), ("b1", b)):
        print(f"top {top} by own time, {label}:  calls/span  own µs/span  function")
        for func, (nc, tt) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"  {nc / spans:8.2f}  {tt / spans * 1e6:8.3f}  {_name(func)}")
        print()
    print("functions whose calls per span differ (b1 minus a):  d calls/span  d own µs/span  function")
    rows = []
    for func in set(a) | set(b):
        na, ta = a.get(func, (0, 0.0))
        nb, tb = b.get(func, (0, 0.0))
        if abs(nb - na) / spans >= 0.5:
            rows.append(((tb - ta) / spans * 1e6, (nb - na) / spans, func))
    for dt, dn, func in sorted(rows, key=lambda r: -abs(r[0])):
        print(f"  {dn:+8.2f}  {dt:+8.3f}  {_name(func)}")
    for v in variants.values():
        v.close()


def pieces_view(number: int) -> None:
    """Time the bridge's own per-span pieces in isolation."""
    from opentelemetry import context as context_api
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.trace import TracerProvider

    from verl_otel_bridge import Bridge, BridgeConfig
    from verl_otel_bridge._internal.attributes import set_clean_attributes
    from verl_otel_bridge._internal.identity import current_identity
    from verl_otel_bridge._internal.pipeline.processors import stamped

    bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="none"))
    bare = TracerProvider(shutdown_on_exit=False).get_tracer("bench")
    identity_attrs = dict(run.IDENTITY)
    results: list[tuple[str, float]] = []

    def best(stmt: Any, label: str) -> None:
        per_call = min(timeit.repeat(stmt, number=number, repeat=7)) / number * 1e6
        results.append((label, per_call))

    with bridge.session(**run.SESSION_ARGS):
        identity = current_identity()
        assert identity is not None
        with bridge.span("probe") as probe_span:
            span = probe_span
        live = bare.start_span("live")
        own = bridge.clean_attributes({"turn": 3, "type": "generate", "prompt_tokens": 512, "bench_tag": "x"})
        export = bridge._processor
        best(
            lambda: {**identity_attrs, "turn": 3, "type": "generate", "prompt_tokens": 512, "bench_tag": "x"},
            "a: caller builds the 13-key attribute dict",
        )
        best(
            lambda: bridge.clean_attributes({"turn": 3, "type": "generate", "prompt_tokens": 512, "bench_tag": "x"}),
            "b: kwargs dict + clean_attributes (4 keys)",
        )
        best(current_identity, "b: current_identity()")
        best(
            lambda: set_clean_attributes(live, own, identity.attributes),
            "b: IdentitySpanProcessor.on_start's hand-off: 4 + 9 clean attributes set whole",
        )
        best(lambda: stamped(span, identity), "b: stamped() check (spans of other tracers)")
        best(lambda: export.on_start(span), "b: ExportSpanProcessor.on_start (lock-free count)")
        best(lambda: export.chain.export([span]), "b: inline export: list + the export chain + discard + count")
        token = context_api.attach(trace_api.set_span_in_context(span))
        context_api.detach(token)

        def generator_cm() -> None:
            with bare.start_as_current_span("x"):
                pass

        def manual() -> None:
            s = bare.start_span("x")
            t = context_api.attach(trace_api.set_span_in_context(s))
            context_api.detach(t)
            s.end()

        best(generator_cm, "both: start_as_current_span + end, no attributes (generator context managers)")
        best(manual, "      the same done by hand: start_span, attach, detach, end")
    bridge.shutdown()
    print(f"\npieces, best of 7 x {number} calls, µs per call:")
    for label, us in results:
        print(f"  {us:7.3f}  {label}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=30_000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--number", type=int, default=20_000, help="calls per timeit repeat")
    args = parser.parse_args()
    sys.modules.setdefault("rl_insight", None)  # type: ignore[arg-type]  # b4 as in run.py
    cprofile_view(args.spans, args.top)
    pieces_view(args.number)
    return 0


if __name__ == "__main__":
    sys.exit(main())
