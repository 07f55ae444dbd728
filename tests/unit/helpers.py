"""Small helpers shared by the unit tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge import Bridge
from verl_otel_bridge.accounting import balance
from verl_otel_bridge.identity import IDENTITY_KEYS

#: Upper bound for any wait on another thread; never reached when things work.
WAIT_S = 10.0


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
