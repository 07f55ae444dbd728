"""Every span inside a session carries the whole identity; nothing leaks between sessions."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import Any

from threads import run_threads

import verl_otel_bridge as vob
from verl_otel_bridge._internal.identity import IDENTITY_KEYS
from verl_otel_bridge.testing import SpanCapture

from .helpers import WAIT_S, identity_of

IDENTITY = {"sample": 4, "session": 2, "traj": 1, "uid": "u-1", "global_steps": 9, "session_id": "sid"}


def test_every_kind_of_span_inside_a_session_carries_the_identity(otel_spans: SpanCapture) -> None:
    bridge = otel_spans.bridge

    @bridge.traced("traced_sync")
    def sync_step() -> int:
        return 1

    @vob.traced("module_traced_sync")
    def module_sync_step() -> int:
        return 2

    @bridge.traced
    async def traced_async() -> int:
        await asyncio.sleep(0)
        return 3

    async def in_task() -> None:
        await asyncio.sleep(0)
        with bridge.span("in_task"):
            await asyncio.sleep(0)

    async def main() -> Any:
        with bridge.session(**IDENTITY, project="p", experiment_name="e") as session:
            with bridge.span("outer"):
                with bridge.span("nested"):
                    with bridge.span("deeper"):
                        pass
            bridge.record_span(
                "recorded", start_time_ns=1_700_000_000_000_000_000, end_time_ns=1_700_000_000_000_000_001
            )
            with bridge.tracer.start_as_current_span("plain_otel"):
                pass
            vob.record_span(
                "module_recorded", start_time_ns=1_700_000_000_000_000_000, end_time_ns=1_700_000_000_000_000_001
            )
            with vob.span("module_span"):
                pass
            assert sync_step() == 1 and module_sync_step() == 2 and await traced_async() == 3
            await asyncio.wait_for(asyncio.create_task(in_task()), WAIT_S)
            return session

    session = asyncio.run(main())
    expected = session.identity.to_dict()
    names = {span.name for span in otel_spans.spans}
    assert names == {
        "agent_session",
        "outer",
        "nested",
        "deeper",
        "recorded",
        "plain_otel",
        "module_recorded",
        "module_span",
        "traced_sync",
        "module_traced_sync",
        "in_task",
        "test_every_kind_of_span_inside_a_session_carries_the_identity.<locals>.traced_async",
    }
    for span in otel_spans.spans:
        assert identity_of(span) == expected, span.name
        otel_spans.assert_identity(span, expected)


def test_spans_outside_sessions_carry_no_identity(otel_spans: SpanCapture) -> None:
    bridge = otel_spans.bridge
    with bridge.span("before"):
        pass
    with bridge.session(sample=0, session=0):
        pass
    with bridge.span("after"):
        pass
    bridge.record_span("recorded_after", start_time_ns=1_700_000_000_000_000_000, end_time_ns=1_700_000_000_000_000_000)
    for name in ("before", "after", "recorded_after"):
        attributes = dict(otel_spans.one(name).attributes or {})
        assert not set(attributes) & set(IDENTITY_KEYS), name
    assert vob.current_identity() is None


def test_current_identity_inside_and_after_a_session(otel_spans: SpanCapture) -> None:
    with vob.session(sample=1, session=2) as outer:
        assert vob.current_identity() == outer.identity
        with vob.session(sample=1, session=3) as inner:
            assert vob.current_identity() == inner.identity
        assert vob.current_identity() == outer.identity
    assert vob.current_identity() is None


def _check_each_trace_has_one_identity(capture: SpanCapture, expected_sessions: int) -> None:
    """Spans are grouped by trace (each session is a root); all must carry their own session's identity."""
    by_trace: dict[int, list[Any]] = defaultdict(list)
    for span in capture.spans:
        by_trace[span.context.trace_id].append(span)
    assert len(by_trace) == expected_sessions
    for spans in by_trace.values():
        (root,) = [span for span in spans if span.name == "agent_session"]
        ids = {span.context.span_id: span for span in spans}
        for span in spans:
            assert identity_of(span) == identity_of(root), (span.name, identity_of(span), identity_of(root))
            # the worker tags each span with who made it; the identity must agree
            if "who" in (span.attributes or {}):
                assert span.attributes["who"] == root.attributes["state_lane_id"]
            # parent chain stays inside the session's trace and ends at its agent_session span
            node = span
            while node.parent is not None:
                node = ids[node.parent.span_id]
            assert node is root


def test_100_concurrent_asyncio_sessions_are_isolated(otel_spans: SpanCapture) -> None:
    bridge = otel_spans.bridge

    async def one_session(i: int) -> None:
        with bridge.session(sample=i, session=i % 7, traj=i % 3, global_steps=i) as session:
            lane = session.identity.state_lane_id
            for turn in range(3):
                with bridge.span("turn", who=lane, turn=turn):
                    await asyncio.sleep(0)
                    with bridge.span("tool", who=lane):
                        await asyncio.sleep(0)
                await asyncio.sleep(0)
            child = asyncio.create_task(_child(lane))
            await asyncio.sleep(0)
            await child

    async def _child(lane: str) -> None:
        with bridge.span("child_task", who=lane):
            await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(one_session(i) for i in range(100))), WAIT_S)

    asyncio.run(main())
    assert len(otel_spans.spans) == 100 * (1 + 3 * 2 + 1)
    _check_each_trace_has_one_identity(otel_spans, 100)


def test_threads_running_sessions_are_isolated(otel_spans: SpanCapture) -> None:
    bridge = otel_spans.bridge
    start = threading.Barrier(8, timeout=WAIT_S)

    def worker(t: int) -> None:
        start.wait()
        for k in range(10):
            with bridge.session(sample=f"t{t}", session=k) as session:
                lane = session.identity.state_lane_id
                with bridge.span("step", who=lane):
                    with bridge.span("inner", who=lane):
                        pass

    assert not run_threads(lambda t=t: worker(t) for t in range(8))
    assert vob.current_identity() is None  # nothing leaked into the main thread
    _check_each_trace_has_one_identity(otel_spans, 80)
