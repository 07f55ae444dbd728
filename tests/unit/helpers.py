"""Small helpers shared by the unit tests."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from otlp_receiver import OtlpReceiver

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

#: Upper bound for any wait on another thread; never reached when things work.
WAIT_S = 10.0
#: A plausible span time in nanoseconds.
T0 = 1_700_000_000_123_456_789

#: ``record_span`` times it refuses: (start, end, a phrase of the one WARNING for this kind).
INVALID_TIMES: list[tuple[Any, Any, str]] = [
    (T0, T0 - 1, "end before start"),
    (-5, T0, "negative time"),
    (T0, -1, "negative time"),
    (int(time.time()), int(time.time()) + 1, "look like seconds or milliseconds"),
    (time.time(), time.time() + 0.5, "look like seconds or milliseconds"),
    (int(time.time() * 1000), int(time.time() * 1000) + 5, "look like seconds or milliseconds"),
    (str(T0), T0, "integer nanoseconds"),
    (None, T0, "integer nanoseconds"),
    (T0, [T0], "integer nanoseconds"),
    (True, T0, "integer nanoseconds"),
    (math.nan, T0, "integer nanoseconds"),
    (T0, math.inf, "integer nanoseconds"),
    (-math.inf, T0, "integer nanoseconds"),
]

#: The ``start_receiver`` fixture: ``start_receiver(**options)`` is an :class:`OtlpReceiver`, stopped after the test.
StartReceiver = Callable[..., OtlpReceiver]

#: On a test that forks a process with the bridge's threads running, on purpose: Python 3.12+
#: warns that such a child may deadlock; what the child may touch is what the test checks.
forks_on_purpose = pytest.mark.filterwarnings(
    r"ignore:This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks:DeprecationWarning"
)


def wait_until(predicate: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def identity_of(span: ReadableSpan | Mapping[str, Any]) -> dict[str, Any]:
    """The identity keys present on a span (SDK span or forwarded attribute dict)."""
    attributes = span if isinstance(span, Mapping) else dict(span.attributes or {})
    return {key: attributes[key] for key in IDENTITY_KEYS if key in attributes}


def finished(bridge: Bridge) -> list[ReadableSpan]:
    """Flush ``bridge`` and return what its memory exporter (primary or fallback) holds."""
    assert bridge.force_flush(WAIT_S)
    assert bridge.memory_exporter is not None
    return list(bridge.memory_exporter.get_finished_spans())


def named(spans: Iterable[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"expected one {name!r}, got {[s.name for s in spans]}"
    return found[0]


def assert_balanced(bridge: Bridge) -> dict[str, Any]:
    """Flush and check every ended span landed in exactly one bucket; returns the counters."""
    bridge.force_flush(WAIT_S)
    counters = bridge.status()["counters"]
    assert balance(counters) == 0, counters
    return counters


def span_count(bridge: Bridge) -> int:
    return bridge.status()["counters"]["ended"]


class _CountingEvent(threading.Event):
    """An event that counts the waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def waits_while_idle(worker: Any, window_s: float = 0.5) -> int:
    """How many times ``worker``'s thread (an export queue, a spill drain: its wake-up event is ``_wake``) waits
    over ``window_s`` with nothing to do: 1 when it blocks until woken, more when it spins."""
    counting = _CountingEvent()
    original, worker._wake = worker._wake, counting
    original.set()  # the thread, blocked on the old event, goes round once and then waits on this one
    wait_until(lambda: counting.waits >= 1, what="the thread to wait again")
    threading.Event().wait(window_s)  # an idle stretch, observed: not a synchronisation
    return counting.waits
