"""Identity follows work into threads with ``vob.propagate_to_threads()``; what is lost without it is counted."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge

WAIT_S = 30.0


def in_thread(work: Callable[[], None]) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()


class _Subclass(threading.Thread):
    def __init__(self, work: Callable[[], None]) -> None:
        super().__init__()
        self.work = work

    def run(self) -> None:  # its own run, as many thread classes have
        self.work()


def in_thread_subclass(work: Callable[[], None]) -> None:
    thread = _Subclass(work)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()


def in_pool(work: Callable[[], None]) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        pool.submit(work).result(WAIT_S)


def in_pool_map(work: Callable[[], None]) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda _: work(), range(1), timeout=WAIT_S))


def in_executor(work: Callable[[], None]) -> None:
    async def main() -> None:
        await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, work), WAIT_S)

    # The loop (and its default executor) is created inside the session, as an agent loop's is.
    asyncio.run(main())


HAND_OFFS = {
    "threading.Thread": in_thread,
    "Thread subclass with its own run": in_thread_subclass,
    "ThreadPoolExecutor.submit": in_pool,
    "ThreadPoolExecutor.map": in_pool_map,
    "loop.run_in_executor": in_executor,
}


@pytest.fixture
def propagating() -> Iterator[None]:
    vob.propagate_to_threads()
    try:
        yield
    finally:
        vob.propagate_to_threads(False)


@pytest.fixture
def bridge(make_bridge: Callable[..., Bridge]) -> Bridge:
    made = make_bridge(exporter="memory")
    vob.set_bridge(made)
    return made


def handed_off(bridge: Bridge, hand_off: Callable[[Callable[[], None]], None]) -> dict[str, object]:
    """Run a span through ``hand_off`` inside a session; what the thread saw and the span carried."""
    seen: dict[str, object] = {}

    def work() -> None:
        identity = vob.current_identity()
        seen["identity"] = identity.uid if identity is not None else None
        with vob.span("in_thread"):
            pass

    with vob.session(sample=3, session=0, uid="u-thread", global_steps=7):
        hand_off(work)
    spans = {span.name: span for span in bridge.memory_exporter.get_finished_spans()}  # type: ignore[union-attr]
    session, span = spans["agent_session"], spans["in_thread"]
    seen["uid"] = span.attributes.get("uid")  # type: ignore[union-attr]
    seen["state_lane_id"] = span.attributes.get("state_lane_id")  # type: ignore[union-attr]
    seen["same_trace"] = span.context.trace_id == session.context.trace_id  # type: ignore[union-attr]
    seen["parent_is_session"] = span.parent is not None and span.parent.span_id == session.context.span_id  # type: ignore[union-attr]
    seen["expected_lane"] = session.attributes.get("state_lane_id")  # type: ignore[union-attr]
    return seen


@pytest.mark.parametrize("hand_off", HAND_OFFS.values(), ids=HAND_OFFS.keys())
def test_with_the_switch_identity_and_parent_follow_work_into_the_thread(
    bridge: Bridge, propagating: None, hand_off: Callable[[Callable[[], None]], None]
) -> None:
    seen = handed_off(bridge, hand_off)
    assert seen["identity"] == "u-thread"
    assert seen["uid"] == "u-thread"
    assert seen["state_lane_id"] == seen["expected_lane"]
    assert seen["same_trace"] and seen["parent_is_session"]
    assert bridge.status()["counters"].get("identity_lost", 0) == 0


@pytest.mark.parametrize("hand_off", HAND_OFFS.values(), ids=HAND_OFFS.keys())
def test_without_the_switch_the_thread_runs_outside_the_session(
    bridge: Bridge, hand_off: Callable[[Callable[[], None]], None]
) -> None:
    seen = handed_off(bridge, hand_off)
    assert seen["identity"] is None and seen["uid"] is None
    assert not seen["same_trace"]


def test_the_switch_is_idempotent_and_undone(bridge: Bridge) -> None:
    start, submit = threading.Thread.start, ThreadPoolExecutor.submit
    vob.propagate_to_threads()
    vob.propagate_to_threads()
    try:
        assert threading.Thread.start.__wrapped__ is start  # type: ignore[attr-defined]
        assert ThreadPoolExecutor.submit.__wrapped__ is submit  # type: ignore[attr-defined]
    finally:
        vob.propagate_to_threads(False)
    assert threading.Thread.start is start and ThreadPoolExecutor.submit is submit
    vob.propagate_to_threads(False)
    assert threading.Thread.start is start


def test_each_task_runs_in_the_context_it_was_submitted_in(bridge: Bridge, propagating: None) -> None:
    """A pool's worker thread is reused: each task still sees its own submitter's session, none another's."""
    seen: list[tuple[str, str | None]] = []

    def work(expected: str) -> None:
        identity = vob.current_identity()
        seen.append((expected, identity.uid if identity is not None else None))

    with ThreadPoolExecutor(max_workers=1) as pool:
        for uid in ("a", "b", "c"):
            with vob.session(sample=uid, session=0, uid=uid):
                pool.submit(work, uid).result(WAIT_S)
        pool.submit(work, "outside").result(WAIT_S)
    assert seen == [("a", "a"), ("b", "b"), ("c", "c"), ("outside", None)]


def test_a_pool_worker_started_in_a_session_keeps_nothing_of_it(bridge: Bridge) -> None:
    """The worker thread outlives the session that happened to start it: once the switch is off again,
    its tasks run as without it (no identity, no stale parent), not in that session's context."""
    seen: list[tuple[str | None, bool]] = []

    def work() -> None:
        identity = vob.current_identity()
        seen.append(
            (identity.uid if identity is not None else None, otel_trace.get_current_span().get_span_context().is_valid)
        )

    with ThreadPoolExecutor(max_workers=1) as pool:
        vob.propagate_to_threads()
        try:
            with vob.session(sample=0, session=0, uid="first"):
                pool.submit(work).result(WAIT_S)  # starts the worker
        finally:
            vob.propagate_to_threads(False)
        with vob.session(sample=1, session=0, uid="second"):
            pool.submit(work).result(WAIT_S)
    assert seen == [("first", True), (None, False)]


def test_copy_context_and_resume_carry_identity_without_the_switch(bridge: Bridge) -> None:
    """The two ways the docs show for code that does not turn the switch on."""
    uids: list[str | None] = []

    def record() -> None:
        identity = vob.current_identity()
        uids.append(identity.uid if identity is not None else None)

    with vob.session(sample=1, session=0, uid="copied") as s, ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(contextvars.copy_context().run, record).result(WAIT_S)
        handed = s.identity.to_dict()

        def resumed() -> None:
            with vob.resume(handed):
                record()

        pool.submit(resumed).result(WAIT_S)
    assert uids == ["copied", "copied"]


def test_a_span_whose_parent_is_in_a_session_but_it_is_not_is_counted(
    bridge: Bridge, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenTelemetry's context handed over by hand (as OpenTelemetry's docs show) carries the parent, not the
    identity: the span is counted as ``identity_lost`` and one WARNING names the fix."""

    def otel_only(work: Callable[[], None]) -> None:
        captured = otel_context.get_current()

        def attached() -> None:
            token = otel_context.attach(captured)
            try:
                work()
            finally:
                otel_context.detach(token)

        in_pool(attached)

    with caplog.at_level(logging.WARNING, logger="verl_otel_bridge"):
        for _ in range(2):
            seen = handed_off(bridge, otel_only)
    assert seen["same_trace"] and seen["uid"] is None
    status = bridge.status()
    assert status["counters"]["identity_lost"] == 2
    assert "identity_lost 2" in str(status)
    warnings = [r.getMessage() for r in caplog.records if "identity_lost" in r.getMessage()]
    assert len(warnings) == 1 and "propagate_to_threads()" in warnings[0]


def test_spans_outside_sessions_and_progress_records_are_not_counted(make_bridge: Callable[..., Bridge]) -> None:
    """A span under a parent without identity, a root span and a span given its identity are not lost."""
    made = make_bridge(exporter="memory")
    with made.span("outer"), made.span("inner"):
        pass
    with made.session(sample=0, session=0) as s:
        identity_attributes = dict(s.identity.attributes)

    def explicit() -> None:
        with made.tracer.start_as_current_span("given", context=None, attributes=identity_attributes):
            pass

    with made.session(sample=0, session=1):
        captured = otel_context.get_current()
    token = otel_context.attach(captured)
    try:
        explicit()
    finally:
        otel_context.detach(token)
    assert made.status()["counters"].get("identity_lost", 0) == 0


def test_opentelemetry_threading_instrumentation_carries_the_parent_not_the_identity(bridge: Bridge) -> None:
    """Why the switch is the bridge's own: OpenTelemetry's ``ThreadingInstrumentor`` hands over its own context
    only. Its spans are counted as lost; with the switch as well, they carry the identity."""
    threading_instrumentation = pytest.importorskip("opentelemetry.instrumentation.threading")
    instrumentor = threading_instrumentation.ThreadingInstrumentor()
    instrumentor.instrument()
    try:
        seen = handed_off(bridge, in_pool)
        assert seen["parent_is_session"] and seen["uid"] is None
        assert bridge.status()["counters"]["identity_lost"] == 1
        vob.propagate_to_threads()
        try:
            seen = handed_off(bridge, in_pool)
        finally:
            vob.propagate_to_threads(False)
        assert seen["parent_is_session"] and seen["uid"] == "u-thread"
        assert bridge.status()["counters"]["identity_lost"] == 1
    finally:
        instrumentor.uninstrument()


def test_the_bridges_own_threads_keep_no_callers_context(make_bridge: Callable[..., Bridge], propagating: None) -> None:
    """The progress thread starts when the first session opens: with the switch on it still must not run in the
    context it was started from (here inside a ``resume()``), or it would stamp that identity on every session's
    progress records."""
    made = make_bridge(exporter="memory", progress_interval_s=0.05)
    elsewhere = {"experiment_name": "default", "sample": "elsewhere", "session": "0", "uid": "elsewhere"}
    with made.resume(elsewhere), made.session(sample="first", session=0, uid="first"):
        with made.session(sample="second", session=0, uid="second"):
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                made.force_flush(5)
                records = [s for s in made.memory_exporter.get_finished_spans() if s.name == "agent_session.progress"]  # type: ignore[union-attr]
                if {r.attributes["sample"] for r in records} >= {"first", "second"}:  # type: ignore[index]
                    break
                time.sleep(0.01)  # polling with a bound, not synchronisation
    by_sample = {(r.attributes["sample"], r.attributes["uid"]) for r in records}  # type: ignore[index]
    assert by_sample == {("first", "first"), ("second", "second")}
