"""GaugePublisher: session gauges on their own thread, never blocking, always accounted for."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.rl_insight.gauges import GaugePublisher

from .helpers import wait_until


class _Gate:
    """A publish function that records items and, while closed, waits (bounded) to be opened."""

    def __init__(self) -> None:
        self.published: list[int] = []
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def __call__(self, item: int) -> None:
        self.entered.set()
        self.open.wait(10)
        if item < 0:
            raise RuntimeError("publish bug")
        self.published.append(item)


@pytest.fixture
def gate() -> Iterator[_Gate]:
    gate = _Gate()
    yield gate
    gate.open.set()  # never leave a publisher thread waiting


def test_items_are_published_in_order_and_flush_waits_for_them(gate: _Gate) -> None:
    publisher = GaugePublisher(gate, SpanCounts())
    for item in range(20):
        publisher.submit(item)
    assert publisher.flush(10)
    assert gate.published == list(range(20))
    publisher.shutdown()


def test_submit_does_not_wait_for_a_slow_publish_and_flush_is_bounded(gate: _Gate) -> None:
    publisher = GaugePublisher(gate, SpanCounts())
    gate.open.clear()
    publisher.submit(1)
    assert gate.entered.wait(10)
    publisher.submit(2)  # returns although the thread is stuck in publish(1)
    assert publisher.flush(0.05) is False
    gate.open.set()
    assert publisher.flush(10) and gate.published == [1, 2]
    publisher.shutdown()


def test_a_full_queue_drops_and_counts(gate: _Gate, caplog: pytest.LogCaptureFixture) -> None:
    counts = SpanCounts()
    publisher = GaugePublisher(gate, counts, max_pending=2)
    gate.open.clear()
    publisher.submit(0)
    assert gate.entered.wait(10)  # 0 is being published; 1 and 2 fill the queue
    for item in (1, 2, 3, 4):
        publisher.submit(item)
    assert counts.snapshot()["session_gauges_dropped"] == 2
    assert sum("2 sessions are already waiting" in r.getMessage() for r in caplog.records) == 1
    gate.open.set()
    assert publisher.flush(10) and gate.published == [0, 1, 2]
    publisher.shutdown()


def test_an_escaped_error_is_counted_and_the_thread_goes_on(gate: _Gate) -> None:
    counts = SpanCounts()
    publisher = GaugePublisher(gate, counts)
    for item in (1, -1, 2):
        publisher.submit(item)
    assert publisher.flush(10)
    assert gate.published == [1, 2]
    assert counts.snapshot()["session_gauges_failed"] == 1
    publisher.shutdown()


def test_after_shutdown_nothing_is_published_and_the_thread_ends(gate: _Gate) -> None:
    counts = SpanCounts()
    publisher = GaugePublisher(gate, counts)
    gate.open.clear()
    publisher.submit(1)
    assert gate.entered.wait(10)
    publisher.submit(2)  # waiting when shutdown comes: dropped, not published
    thread = publisher._thread
    assert thread is not None
    publisher.shutdown()
    publisher.submit(3)  # after shutdown: dropped at once
    gate.open.set()
    thread.join(10)
    assert not thread.is_alive()
    assert gate.published == [1]
    assert counts.snapshot()["session_gauges_dropped"] == 2


def test_no_thread_until_the_first_session() -> None:
    publisher = GaugePublisher(lambda item: None, SpanCounts())
    assert publisher._thread is None and publisher.flush(0)
    publisher.submit(1)
    wait_until(lambda: publisher.flush(0), what="the first item published")
    publisher.shutdown()
