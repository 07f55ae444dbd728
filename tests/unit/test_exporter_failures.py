"""The exporters' own failure paths: a raising fallback, the counting wrapper, a flush with a hung exporter.

(A raising RL-Insight, a slow or hung one at run time and at shutdown: ``test_reliability.py``.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.exporters import BoundedMemorySpanExporter, CountingSpanExporter
from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter
from verl_otel_bridge.testing import SpanCapture

from .fake_rl_insight import usable_rl_insight
from .helpers import WAIT_S, assert_balanced

#: RL-Insight through ``trace_span`` (the path these tests inject failures into).
RL_INSIGHT = {"exporter": "rl_insight", "rl_insight_transport": "hub"}


class RaisingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise OSError("disk full")

    def shutdown(self) -> None:
        pass


def _ten_spans(bridge: Bridge) -> None:
    """A session and ten spans in it."""
    with bridge.session(sample=1, session=1):
        for i in range(10):
            with bridge.span(f"s{i}"):
                pass


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
