"""What tracking open sessions (``verl_otel_bridge._internal.inflight``) costs on the caller's thread.

The same bridge, with and without its ``InflightSessions`` processor on the
provider (swapped for a processor that does nothing in the "without" runs, through
the SDK's private processor tuple: a benchmark may, the library does not), exporter ``none`` so only the
hot path is timed. Many short rounds, each timing both (in alternating order,
the garbage collector off), so a load spike on the shared machine spoils a
round, not a variant; reported in µs per operation: the best round of each,
and the median over rounds of the paired difference (with - without).

Usage::

    python bench/inflight_cost.py              # 40 rounds of 2,000 spans and 500 sessions
    python bench/inflight_cost.py --rounds 100 --spans 5000
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import SpanProcessor

from verl_otel_bridge import Bridge, BridgeConfig


def bridge() -> Bridge:
    # Progress records off: the background thread's work is not the caller's cost.
    return Bridge(BridgeConfig.resolve(environ={}, exporter="none", progress_interval_s=0, straggler_factor=3))


def set_inflight(b: Bridge, on: bool) -> None:
    b._provider._active_span_processor._span_processors[0].inflight = (  # type: ignore[union-attr]
        b._inflight if on else SpanProcessor()
    )


def per_op(fn: Callable[[int], None], n: int) -> float:
    started = time.perf_counter()
    fn(n)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--spans", type=int, default=2_000)
    parser.add_argument("--sessions", type=int, default=500)
    args = parser.parse_args()
    b = bridge()

    def spans_in_a_session(n: int) -> None:
        with b.session(sample=0, session=0, global_steps=1):
            for _ in range(n):
                with b.span("tool_call"):
                    pass

    def turns_in_a_session(n: int) -> None:
        with b.session(sample=0, session=0, global_steps=1):
            for i in range(n):
                with b.turn(i):
                    pass

    def spans_outside_sessions(n: int) -> None:
        for _ in range(n):
            with b.span("tool_call"):
                pass

    def sessions(n: int) -> None:
        for i in range(n):
            with b.session(sample=i, session=0, global_steps=1):
                pass

    cases = {
        "span in a session": (spans_in_a_session, args.spans),
        "turn in a session": (turns_in_a_session, args.spans),
        "span outside sessions": (spans_outside_sessions, args.spans),
        "empty session": (sessions, args.sessions),
    }
    runs: dict[tuple[str, bool], list[float]] = {(name, on): [] for name in cases for on in (False, True)}
    for round_ in range(args.rounds):
        for on in (False, True) if round_ % 2 else (True, False):
            set_inflight(b, on)
            for name, (fn, n) in cases.items():
                gc.collect()
                gc.disable()
                try:
                    runs[name, on].append(per_op(fn, n))
                finally:
                    gc.enable()
    set_inflight(b, True)
    b.shutdown()
    print(f"{'operation':<24}{'best without µs':>16}{'best with µs':>14}{'median added µs':>17}")
    for name in cases:
        off, on_ = runs[name, False], runs[name, True]
        added = statistics.median(w - o for w, o in zip(on_, off, strict=True))
        print(f"{name:<24}{min(off):>16.2f}{min(on_):>14.2f}{added:>17.2f}")


if __name__ == "__main__":
    main()
