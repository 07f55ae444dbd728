"""Failure paths: a raising or slow RL-Insight, a raising fallback, a hung exporter at shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.exporters import BoundedMemorySpanExporter, CountingSpanExporter
from verl_otel_bridge._internal.exporters.fallback import FallbackSpanExporter
from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter
from verl_otel_bridge.testing import SpanCapture

from .fake_rl_insight import usable_rl_insight
from .helpers import WAIT_S, assert_balanced, identity_of, run_threads, wait_until

#: RL-Insight through ``trace_span`` (the path these tests inject failures into).
RL_INSIGHT = {"exporter": "rl_insight", "rl_insight_transport": "hub"}


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event fakes block on; always opened at teardown (before bridges are shut down)."""
    event = threading.Event()
    yield event
    event.set()


class RaisingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise OSError("disk full")

    def shutdown(self) -> None:
        pass


class TakesSome:
    """A primary that takes the first ``takes`` spans of each batch (counted ``exported.primary``)."""

    def __init__(self, takes: int, counts: SpanCounts, *, raises: bool = False) -> None:
        self.takes, self.counts, self.raises = takes, counts, raises
        self.flushed = self.shut = False

    def deliver(self, spans: Sequence[ReadableSpan]) -> Sequence[ReadableSpan]:
        if self.raises:
            raise ConnectionError("primary down")
        self.counts.add("exported.primary", min(self.takes, len(spans)))
        return spans[self.takes :]

    def force_flush(self, timeout_millis: int) -> bool:
        self.flushed = True
        return True

    def shutdown(self) -> None:
        self.shut = True


@pytest.mark.parametrize(
    ("takes", "raises", "fallback_raises", "result", "counted"),
    [
        (5, False, False, SpanExportResult.SUCCESS, {"exported.primary": 5, "fallback": 0, "failed": 0}),
        (2, False, False, SpanExportResult.SUCCESS, {"exported.primary": 2, "fallback": 3, "failed": 0}),
        (2, False, True, SpanExportResult.FAILURE, {"exported.primary": 2, "fallback": 0, "failed": 3}),
        (0, True, False, SpanExportResult.SUCCESS, {"exported.primary": 0, "fallback": 5, "failed": 0}),
    ],
)
def test_the_fallback_wrapper_sends_what_the_primary_could_not_take_and_counts_each_span_once(
    takes: int, raises: bool, fallback_raises: bool, result: SpanExportResult, counted: dict[str, int]
) -> None:
    counts = SpanCounts()
    primary = TakesSome(takes, counts, raises=raises)
    fallback = RaisingExporter() if fallback_raises else BoundedMemorySpanExporter(10)
    exporter = FallbackSpanExporter(primary, fallback, counts, "memory")
    spans = [ReadableSpan(name=f"s{i}") for i in range(5)]
    assert exporter.export(spans) is result
    assert {key: counts.get(key) for key in counted} == counted
    if isinstance(fallback, BoundedMemorySpanExporter):
        assert [s.name for s in fallback.get_finished_spans()] == [s.name for s in spans[5 - counted["fallback"] :]]
    exporter.force_flush(1000)
    assert primary.flushed
    exporter.shutdown()
    assert primary.shut


def _ten_spans(bridge: Bridge, boom_at: int | None = None) -> dict[str, Any]:
    with bridge.session(sample=1, session=1) as session:
        for i in range(10):
            with bridge.span("boom" if i == boom_at else f"s{i}"):
                pass
    return session.identity.to_dict()


def test_trace_span_raising_sends_the_rest_of_the_batch_to_fallback(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    fake = usable_rl_insight(monkeypatch)

    def hook(call: dict[str, Any]) -> None:
        if call["name"] == "boom":
            raise RuntimeError("hub actor died")

    fake.hook = hook
    # one batch: the worker only wakes on flush
    bridge = make_bridge(**RL_INSIGHT, schedule_delay_ms=600_000, max_export_batch_size=64)
    identity = _ten_spans(bridge, boom_at=3)
    counters = assert_balanced(bridge)  # no exception reached us, and every span is accounted for

    assert [call.name for call in fake.calls] == ["s0", "s1", "s2"]
    fallback = bridge.memory_exporter.get_finished_spans()
    assert [span.name for span in fallback] == ["boom", "s4", "s5", "s6", "s7", "s8", "s9", "agent_session"]
    assert all(identity_of(span) == identity for span in fallback)
    assert (counters["exported"], counters["fallback"], counters["failed"]) == ({"rl_insight": 3}, 8, 0)
    assert sum("hub actor died" in r.getMessage() for r in caplog.records) == 1

    # the next batch goes to RL-Insight again; the warning is not repeated
    _ten_spans(bridge, boom_at=0)
    counters = assert_balanced(bridge)
    assert counters["exported"] == {"rl_insight": 3} and counters["fallback"] == 8 + 11
    _ten_spans(bridge)
    counters = assert_balanced(bridge)
    assert counters["exported"] == {"rl_insight": 3 + 11}
    assert sum("hub actor died" in r.getMessage() for r in caplog.records) == 1


def test_raising_fallback_counts_failed(monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]) -> None:
    monkeypatch.setattr(BoundedMemorySpanExporter, "export", RaisingExporter.export)
    bridge = make_bridge(exporter="rl_insight")  # unusable (not installed): everything goes to the fallback
    _ten_spans(bridge)
    counters = assert_balanced(bridge)
    assert (counters["failed"], counters["fallback"], counters["exported"]) == (11, 0, {})


def test_rl_insight_exporter_with_raising_fallback_never_raises(otel_spans: SpanCapture) -> None:
    with otel_spans.bridge.session(sample=0, session=0):
        pass
    counts = SpanCounts()
    exporter = RLInsightSpanExporter(RaisingExporter(), config=BridgeConfig.resolve(environ={}), counts=counts)
    assert exporter.export(otel_spans.spans) is SpanExportResult.FAILURE
    assert (counts.get("failed"), counts.get("fallback")) == (1, 0)


def test_counting_exporter_turns_exceptions_into_failed() -> None:
    counts = SpanCounts()
    exporter = CountingSpanExporter(RaisingExporter(), counts, "exported.x")
    assert exporter.export([object(), object()]) is SpanExportResult.FAILURE  # type: ignore[list-item]
    assert (counts.get("failed"), counts.get("exported.x")) == (2, 0)


def test_slow_exporter_and_tiny_queue_drop_instead_of_blocking(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], gate: threading.Event
) -> None:
    fake = usable_rl_insight(monkeypatch)
    fake.hook = lambda call: gate.wait()  # the exporter is stuck on its first batch until the gate opens
    bridge = make_bridge(
        **RL_INSIGHT, max_queue_size=4, max_export_batch_size=1, schedule_delay_ms=0, spill_max_bytes=0
    )

    def end_spans() -> None:
        for i in range(1000):
            with bridge.span("s", i=i):
                pass

    # A caller that waited for the stuck exporter would never finish; the bound only keeps a failure from hanging.
    assert run_threads([end_spans], timeout_s=60.0) == [], "ending spans raised"
    counters = bridge.status()["counters"]
    assert counters["ended"] == 1000
    assert counters["dropped"] >= 1000 - 4 - 2  # at most the queue plus one batch in flight got through
    gate.set()
    bridge.shutdown(timeout_s=WAIT_S)
    counters = bridge.status()["counters"]
    assert counters["dropped"] + counters["exported"]["rl_insight"] == 1000
    assert assert_balanced(bridge)["failed"] == 0


def test_shutdown_with_a_hung_exporter_returns_in_time(
    monkeypatch: pytest.MonkeyPatch,
    make_bridge: Callable[..., Bridge],
    gate: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = usable_rl_insight(monkeypatch)
    entered = threading.Event()

    def hang(call: dict[str, Any]) -> None:
        entered.set()
        gate.wait()  # until teardown

    fake.hook = hang
    bridge = make_bridge(**RL_INSIGHT, schedule_delay_ms=0)
    for _ in range(5):
        with bridge.span("s"):
            pass
    wait_until(entered.is_set, what="the exporter to be called")

    started = time.monotonic()
    bridge.shutdown(timeout_s=1)
    elapsed = time.monotonic() - started

    assert elapsed < 3, f"shutdown(timeout_s=1) took {elapsed:.1f} s"
    assert "abandoned" in caplog.text
    assert bridge.status()["counters"]["dropped"] >= 1  # the queued spans, counted


@pytest.mark.parametrize("flush", ["force_flush", "flush_queued"])
def test_a_flush_with_a_hung_exporter_times_out(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], gate: threading.Event, flush: str
) -> None:
    fake = usable_rl_insight(monkeypatch)
    fake.hook = lambda call: gate.wait()
    bridge = make_bridge(**RL_INSIGHT, schedule_delay_ms=0)
    with bridge.span("s"):
        pass
    started = time.monotonic()
    assert getattr(bridge, flush)(timeout_s=0.3) is False
    assert time.monotonic() - started < 2


def test_flush_queued_returns_once_the_ended_spans_are_written(
    make_bridge: Callable[..., Bridge], tmp_path: Path
) -> None:
    path = tmp_path / "spans.jsonl"
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path), schedule_delay_ms=3_600_000)  # no timer export
    for _ in range(3):
        with bridge.span("s"):
            pass
    assert not path.read_text()
    assert bridge.flush_queued(timeout_s=WAIT_S) is True
    assert len(path.read_text().splitlines()) == 3
