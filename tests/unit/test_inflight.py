"""Open sessions while they run: ``status()["open_sessions"]``, progress records, the watchdog, shutdown."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import pytest

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.protocol import (
    IDENTITY_KEYS,
    PROGRESS_ELAPSED_S,
    PROGRESS_IDLE_S,
    PROGRESS_LAST_SPAN,
    PROGRESS_SPAN_NAME,
    PROGRESS_TURN,
    PROGRESS_TURNS,
    SESSION_SPAN_NAME,
)

from .helpers import WAIT_S, assert_balanced, finished, forks_on_purpose, identity_of, wait_until

QUIET = {"progress_interval_s": 0, "straggler_factor": 0}


def progress_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "verl-otel-bridge-progress"]


def progress_spans(bridge: Bridge) -> list[object]:
    memory = bridge.memory_exporter
    assert memory is not None
    return [s for s in memory.get_finished_spans() if s.name == PROGRESS_SPAN_NAME]


def test_status_lists_the_open_sessions_oldest_first_with_turn_and_last_span(
    make_bridge: Callable[..., Bridge],
) -> None:
    bridge = make_bridge(exporter="memory", **QUIET)
    assert bridge.status()["open_sessions"] == {"count": 0, "oldest": []}
    first = bridge.start_session(sample=1, session=0, global_steps=3, uid="u1", session_id="conv-1")
    with bridge.resume(first.identity), bridge.turn(0), bridge.turn(1, type="tool"), bridge.span("search"):
        second = bridge.start_session(sample=2, session=5, global_steps=3)
        open_sessions = bridge.status()["open_sessions"]
    assert open_sessions["count"] == 2
    oldest, newer = open_sessions["oldest"]
    assert (oldest["uid"], oldest["sample"], oldest["session"], oldest["global_steps"]) == ("u1", "1", "0", 3)
    assert {k: oldest[k] for k in IDENTITY_KEYS} == first.identity.to_dict()  # the whole identity
    assert (oldest["turn"], oldest["turns"], oldest["last_span"]) == (1, 2, "search")
    assert oldest["age_s"] >= newer["age_s"] >= 0 and oldest["idle_s"] >= 0
    assert (newer["sample"], newer["turns"], newer["last_span"]) == ("2", 0, SESSION_SPAN_NAME)
    first.span.end()
    second.span.end()
    assert bridge.status()["open_sessions"]["count"] == 0
    assert not progress_threads()  # both features off: no thread at all


def test_a_session_open_longer_than_the_interval_exports_progress_while_it_runs(
    make_bridge: Callable[..., Bridge],
) -> None:
    bridge = make_bridge(exporter="memory", progress_interval_s=0.05, straggler_factor=0)
    with bridge.session(sample=4, session=2, global_steps=7, uid="slow") as s:
        with s.turn(0):
            pass
        with s.turn(1, type="tool"), bridge.span("tool_call"):
            wait_until(lambda: len(progress_spans(bridge)) >= 2, what="two progress records while the session runs")
        session_span_id = s.span.get_span_context().span_id
    records = progress_spans(bridge)
    assert bridge.status()["counters"]["progress"] == len(records) >= 2
    for record in records:
        attributes = dict(record.attributes)
        assert record.parent is not None and record.parent.span_id == session_span_id
        assert identity_of(record) == identity_of(s.span)
        assert attributes[PROGRESS_LAST_SPAN] == "tool_call"
        assert (attributes[PROGRESS_TURNS], attributes[PROGRESS_TURN]) == (2, 1)
        assert attributes[PROGRESS_ELAPSED_S] >= 0.05 and attributes[PROGRESS_IDLE_S] >= 0
    elapsed = [dict(r.attributes)[PROGRESS_ELAPSED_S] for r in records]
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[0]
    assert bridge.status()["open_sessions"]["count"] == 0
    assert_balanced(bridge)


def test_shutdown_ends_open_sessions_as_unfinished_counts_them_and_keeps_the_accounting(
    make_bridge: Callable[..., Bridge],
) -> None:
    bridge = make_bridge(exporter="memory", progress_interval_s=0.05)
    hung = bridge.start_session(sample=9, session=1, global_steps=2, uid="hangs")
    with bridge.resume(hung.identity), bridge.turn(0):
        pass
    wait_until(lambda: progress_spans(bridge), what="a progress record")
    assert progress_threads()
    bridge.shutdown(timeout_s=2)
    assert not progress_threads()
    memory = bridge.memory_exporter
    assert memory is not None
    session_span = next(s for s in memory.get_finished_spans() if s.name == SESSION_SPAN_NAME)
    assert session_span.attributes["status"] == "unfinished"
    counters = assert_balanced(bridge)
    assert counters["unfinished"] == 1
    assert counters["ended"] == counters["started"]  # the open session was ended, so it was exported


def test_watchdog_logs_once_per_step_the_sessions_far_slower_than_the_median(
    make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="verl_otel_bridge._internal.inflight")
    bridge = make_bridge(exporter="memory", progress_interval_s=0.02, straggler_factor=3)
    slow = bridge.start_session(sample=0, session=3, global_steps=5, uid="laggard")
    other_step = bridge.start_session(sample=1, session=0, global_steps=6)
    for session in range(3):
        with bridge.session(sample=2, session=session, global_steps=5):
            pass
    with bridge.resume(slow.identity), bridge.span("generate"):

        def warned() -> list[str]:
            return [r.getMessage() for r in caplog.records if "median" in r.getMessage()]

        wait_until(warned, what="the watchdog's warning")
        ticks = bridge.status()["counters"]["progress"]
        wait_until(lambda: bridge.status()["counters"]["progress"] >= ticks + 3, what="three more ticks")
    assert len(warned()) == 1
    message = warned()[0]
    assert message.startswith("step 5: 1 sessions open longer than 3 x")
    assert slow.identity.state_lane_id in message and "'laggard'" in message and "'generate'" in message
    assert other_step.identity.state_lane_id not in message  # step 6 has no finished sessions, no median
    slow.span.end()
    other_step.span.end()


def test_odd_global_steps_values_never_reach_the_caller(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory", progress_interval_s=0.05, straggler_factor=2)
    for steps in ({"epoch": 1}, [1, 2], None, 3.5):
        with bridge.session(sample=0, session=0, global_steps=steps) as s, s.turn(0):
            pass
    assert bridge.status()["open_sessions"]["count"] == 0
    assert len([s for s in finished(bridge) if s.name == SESSION_SPAN_NAME]) == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@forks_on_purpose
def test_a_forked_child_starts_with_no_open_sessions_and_reports_its_own(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory", progress_interval_s=0.05)
    parent_session = bridge.start_session(sample=1, session=1, global_steps=1)
    wait_until(progress_threads, what="the parent's progress thread")
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            fresh = bridge.status()["open_sessions"]["count"] == 0 and not progress_threads()
            with bridge.session(sample=2, session=2, global_steps=1) as s:
                wait_until(lambda: progress_spans(bridge), what="a progress record in the child")
            mine = {r.parent.span_id for r in progress_spans(bridge)}  # type: ignore[attr-defined]
            code = 0 if fresh and s.span.get_span_context().span_id in mine else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + WAIT_S * 3
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        assert time.monotonic() < deadline, "the forked child did not exit"
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the child saw the parent's sessions or exported no progress"
    assert bridge.status()["open_sessions"]["count"] == 1  # the parent still has its own
    parent_session.span.end()
