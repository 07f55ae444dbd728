"""The destinations' own failure paths: a raising fallback, a raising primary, a flush with a hung exporter.

(A raising RL-Insight, a slow or hung one at run time and at shutdown: ``test_reliability.py``.)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import SpanCounts, balance
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge._internal.exporters.sdk import SdkExporter
from verl_otel_bridge._internal.pipeline.chain import ExportChain, Named
from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter
from verl_otel_bridge.testing import SpanCapture

from .fake_rl_insight import usable_rl_insight
from .helpers import WAIT_S, assert_balanced, wait_until

#: RL-Insight through ``trace_span`` (the path these tests inject failures into).
RL_INSIGHT = {"exporter": "rl_insight", "rl_insight_transport": "hub"}


class RaisingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise OSError("disk full")

    def shutdown(self) -> None:
        pass


class TakesSome:
    """A primary that takes the first ``takes`` spans of each batch (counted ``exported.primary``)."""

    def __init__(self, takes: int, *, raises: bool = False) -> None:
        self.takes, self.raises = takes, raises
        self.flushed = self.shut = False

    def send(self, spans: Sequence[ReadableSpan]) -> Outcome:
        if self.raises:
            raise ConnectionError("primary down")
        return Outcome(min(self.takes, len(spans)), refused=spans[self.takes :])

    def flush(self, timeout_s: float) -> bool:
        self.flushed = True
        return True

    def close(self) -> None:
        self.shut = True

    def where(self) -> Any:
        return {"endpoint": None, "path": None, "last_error": None}


@pytest.mark.parametrize(
    ("takes", "raises", "fallback_raises", "result", "counted"),
    [
        (5, False, False, SpanExportResult.SUCCESS, {"exported.primary": 5, "fallback": 0, "failed": 0}),
        (2, False, False, SpanExportResult.SUCCESS, {"exported.primary": 2, "fallback": 3, "failed": 0}),
        (2, False, True, SpanExportResult.FAILURE, {"exported.primary": 2, "fallback": 0, "failed": 3}),
        (0, True, False, SpanExportResult.SUCCESS, {"exported.primary": 0, "fallback": 5, "failed": 0}),
    ],
)
def test_the_chain_sends_what_the_primary_could_not_take_to_the_fallback_and_counts_each_span_once(
    takes: int, raises: bool, fallback_raises: bool, result: SpanExportResult, counted: dict[str, int]
) -> None:
    counts = SpanCounts()
    primary = TakesSome(takes, raises=raises)
    fallback = SdkExporter(RaisingExporter()) if fallback_raises else BoundedMemorySpanExporter(10)
    chain = ExportChain(Named("primary", primary), counts, fallback=Named("memory", fallback))
    spans = [ReadableSpan(name=f"s{i}") for i in range(5)]
    assert (SpanExportResult.SUCCESS if chain.export(spans) else SpanExportResult.FAILURE) is result
    assert {key: counts.get(key) for key in counted} == counted
    if isinstance(fallback, BoundedMemorySpanExporter):
        assert [s.name for s in fallback.get_finished_spans()] == [s.name for s in spans[5 - counted["fallback"] :]]
    chain.flush(1.0)
    assert primary.flushed
    chain.close()
    assert primary.shut


def _ten_spans(bridge: Bridge) -> None:
    """A session and ten spans in it."""
    with bridge.session(sample=1, session=1):
        for i in range(10):
            with bridge.span(f"s{i}"):
                pass


def test_raising_fallback_counts_failed(monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]) -> None:
    monkeypatch.setattr(BoundedMemorySpanExporter, "send", RaisingExporter.export)
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


def test_the_chain_turns_a_destinations_exception_into_failed() -> None:
    counts = SpanCounts()
    chain = ExportChain(Named("x", SdkExporter(RaisingExporter())), counts)
    assert chain.export([object(), object()]) is False  # type: ignore[list-item]
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
    assert getattr(bridge, flush)(timeout_s=0.3) is False
    assert not gate.is_set()  # it returned while the exporter is still hung


def test_flush_queued_need_not_wait_for_a_server_that_never_answers(make_bridge: Callable[..., Bridge]) -> None:
    with socket.socket() as silent:  # connections complete in the kernel's backlog; nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}/v1/traces"
        bridge = make_bridge(exporter="otlp", otlp_endpoint=endpoint, schedule_delay_ms=3_600_000)
        for _ in range(3):
            with bridge.span("s"):
                pass
        assert bridge.flush_queued(timeout_s=WAIT_S, wait_for_network=False) is True  # handed to the export thread
        assert bridge.status()["pending"]["queued"] == 0
        assert bridge.flush_queued(timeout_s=0.3) is False  # sent: never
        bridge.shutdown(timeout_s=0.5)

    # Closing the socket resets the abandoned request: that late batch is then counted again (spilled or
    # failed, and no longer dropped) on the export thread, after the export returns.
    def recounted() -> bool:
        counters = bridge.status()["counters"]
        return counters["dropped"] == 0 and balance(counters) == 0

    wait_until(recounted, what="the late batch counted again, every span in one bucket")
    counters = bridge.status()["counters"]
    assert counters["ended"] == 3 and counters["exported"] == {}
    assert counters["failed"] + counters["spilled"] == 3  # counted, not lost silently


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
