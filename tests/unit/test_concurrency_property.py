"""docs/reliability.md, "Identity never crosses sessions" and "One rl_insight.init per process".

Hypothesis generates plans: threads (1..16), each running sessions directly or in
asyncio tasks, with spans, turns, tasks, recorded spans, nested sessions, child
tasks, hand-offs to other threads and yield points in between. Running a plan
with every thread released at once must never mix identities: each span carries
the identity of the session it was made in, which is also the identity of its
nearest ``agent_session`` ancestor (followed through parent ids), and no span is
lost or duplicated.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from threads import run_threads

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge.testing import capture_spans

from .fake_rl_insight import usable_rl_insight
from .helpers import WAIT_S, identity_of

T0 = 1_700_000_000_000_000_000
EXPECT = "test.expect_sample"  # what the test itself says the span's session is

# -- plans -----------------------------------------------------------------------------
#
# A step is a tuple: ("span", depth) | ("turn",) | ("task",) | ("record",) | ("await",) |
# ("yield",) | ("child",) | ("handoff",) | ("nested", [steps]). A session is a list of
# steps; a worker is ("sync", [sessions]) or ("async", [[sessions] per asyncio task]).

LEAF_STEPS = st.one_of(
    st.tuples(st.just("span"), st.integers(0, 3)),
    st.sampled_from([("turn",), ("task",), ("record",), ("await",), ("yield",), ("child",), ("handoff",)]),
)
SESSION = st.lists(st.one_of(LEAF_STEPS, st.tuples(st.just("nested"), st.lists(LEAF_STEPS, max_size=3))), max_size=6)
SESSIONS = st.lists(SESSION, min_size=1, max_size=3)
WORKER = st.one_of(
    st.tuples(st.just("sync"), SESSIONS),
    st.tuples(st.just("async"), st.lists(SESSIONS, min_size=1, max_size=3)),
)
PLAN = st.lists(WORKER, min_size=1, max_size=16)


@dataclass
class Run:
    """What running a plan produced: how many spans each session made, and any error."""

    ids: Iterator[int] = field(default_factory=itertools.count)
    made: Counter[int] = field(default_factory=Counter)
    errors: list[BaseException] = field(default_factory=list)
    sessions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_session(self) -> int:
        with self.lock:
            self.sessions += 1
            return next(self.ids)

    def count(self, sample: int) -> None:
        with self.lock:
            self.made[sample] += 1


def _leaf(step: tuple[Any, ...], sample: int, run: Run) -> None:
    """The synchronous part of a step: spans made in the current context for session ``sample``."""
    kind = step[0]
    if kind == "span":
        _nested_spans(step[1], sample, run)
    elif kind == "turn":
        with vob.turn(1, **{EXPECT: sample}):
            run.count(sample)
    elif kind == "task":
        with vob.task("tool", **{EXPECT: sample}) as task:
            task.set_result(status="ok")
            run.count(sample)
    elif kind == "record":
        vob.record_span("recorded", start_time_ns=T0, end_time_ns=T0 + 1, attributes={EXPECT: sample})
        run.count(sample)
    elif kind == "yield":
        time.sleep(0)  # let another thread run here


def _nested_spans(depth: int, sample: int, run: Run) -> None:
    with vob.span(f"depth{depth}", **{EXPECT: sample}):
        run.count(sample)
        if depth:
            _nested_spans(depth - 1, sample, run)


def run_sync_session(steps: list[Any], run: Run, pool: concurrent.futures.Executor) -> None:
    sample = run.new_session()
    with vob.session(sample=sample, session=sample % 7, traj=sample % 3, uid=f"u{sample}", **{}):
        run.count(sample)  # the agent_session span itself
        for step in steps:
            if step[0] == "nested":
                run_sync_session(step[1], run, pool)
            elif step[0] in ("child", "handoff"):  # another thread, with this context
                ctx = contextvars.copy_context()
                pool.submit(ctx.run, _nested_spans, 0, sample, run).result(timeout=WAIT_S)
            else:
                _leaf(step, sample, run)


async def run_async_session(steps: list[Any], run: Run) -> None:
    sample = run.new_session()
    with vob.session(sample=sample, session=sample % 7, traj=sample % 3, uid=f"u{sample}"):
        run.count(sample)
        for step in steps:
            kind = step[0]
            if kind == "nested":
                await run_async_session(step[1], run)
            elif kind == "await":
                await asyncio.sleep(0)
            elif kind == "child":  # an asyncio task started inside the session
                await asyncio.wait_for(asyncio.create_task(_async_child(sample, run)), WAIT_S)
            elif kind == "handoff":  # a worker thread, as ``asyncio.to_thread`` copies the context
                await asyncio.wait_for(asyncio.to_thread(_nested_spans, 1, sample, run), WAIT_S)
            else:
                _leaf(step, sample, run)


async def _async_child(sample: int, run: Run) -> None:
    await asyncio.sleep(0)
    with vob.span("child", **{EXPECT: sample}):
        run.count(sample)
        await asyncio.sleep(0)


def run_plan(plan: list[Any]) -> tuple[Run, list[ReadableSpan]]:
    """Run every worker of ``plan`` in its own thread, all released at once; the spans they made."""
    run = Run()
    start = threading.Barrier(len(plan), timeout=WAIT_S)

    def worker(kind: str, body: list[Any], pool: concurrent.futures.Executor) -> None:
        try:
            start.wait()
            if kind == "sync":
                for steps in body:
                    run_sync_session(steps, run, pool)
            else:

                async def main() -> None:
                    tasks = [asyncio.create_task(_sessions(sessions, run)) for sessions in body]
                    await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S * 3)

                asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            run.errors.append(exc)

    with capture_spans() as capture, concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert not run_threads((lambda k=kind, b=body: worker(k, b, pool) for kind, body in plan), WAIT_S * 6)
        spans = capture.spans
        counters = capture.bridge.status()["counters"]
    assert not run.errors, run.errors
    assert balance(counters) == 0 and counters["ended"] == len(spans), counters
    return run, spans


async def _sessions(sessions: list[Any], run: Run) -> None:
    for steps in sessions:
        await run_async_session(steps, run)
        await asyncio.sleep(0)


def check_identities(run: Run, spans: list[ReadableSpan]) -> None:
    by_id = {span.context.span_id: span for span in spans}
    assert len(by_id) == len(spans), "a span was exported twice"
    seen: Counter[int] = Counter()
    for span in spans:
        session = span
        while session.name != "agent_session":
            assert session.parent is not None, f"{span.name} has no agent_session ancestor"
            session = by_id[session.parent.span_id]
        identity = identity_of(span)
        assert identity == identity_of(session), (span.name, identity, identity_of(session))
        sample = int(identity["sample"])
        if span is not session:
            assert span.attributes[EXPECT] == sample, (span.name, span.attributes[EXPECT], sample)
        assert identity["state_lane_id"] == f"experiment=default/sample={sample}/session={sample % 7}/traj={sample % 3}"
        assert identity["uid"] == f"u{sample}"
        seen[sample] += 1
    assert seen == run.made, "spans were lost or attributed to the wrong session"
    assert len(seen) == run.sessions


# -- the property ------------------------------------------------------------------------


def _explicit_plan() -> list[Any]:
    """16 threads, 8 of them with 4 asyncio tasks each: 1,024 sessions with every kind of step."""
    steps = [
        ("span", 2),
        ("await",),
        ("turn",),
        ("yield",),
        ("child",),
        ("record",),
        ("task",),
        ("handoff",),
        ("nested", [("span", 0), ("await",), ("turn",)]),
    ]
    sync_worker = ("sync", [steps] * 32)  # 32 sessions + 32 nested ones
    async_worker = ("async", [[steps] * 8] * 4)  # 4 tasks x (8 + 8 nested)
    return [sync_worker, async_worker] * 8


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(plan=PLAN)
def test_random_interleavings_never_mix_identities(plan: list[Any]) -> None:
    run, spans = run_plan(plan)
    check_identities(run, spans)


def test_a_thousand_sessions_across_16_threads_and_asyncio_tasks() -> None:
    plan = _explicit_plan()
    assert len(plan) == 16
    run, spans = run_plan(plan)
    assert run.sessions >= 1000
    check_identities(run, spans)


# -- one rl_insight.init per process -----------------------------------------------------


@pytest.fixture
def many_bridges() -> Iterator[Callable[..., Bridge]]:
    made: list[Bridge] = []

    def make(**settings_: Any) -> Bridge:
        bridge = Bridge(vob.BridgeConfig.resolve(environ={}, **settings_))
        made.append(bridge)
        return bridge

    yield make
    for bridge in made:
        bridge.shutdown(timeout_s=2)


def test_exactly_one_rl_insight_init_with_64_threads_exporting_at_once(
    monkeypatch: pytest.MonkeyPatch, many_bridges: Callable[..., Bridge]
) -> None:
    threads = 64
    fake = usable_rl_insight(monkeypatch)
    fake.init_delay_s = 0.05  # the real init creates a Ray actor: slow, which widens the race
    # Every export thread stops right before ``ensure_initialized`` until all 64 are there.
    at_the_gate = threading.Barrier(threads, timeout=WAIT_S)
    real_check = rl_insight_compat.check_runtime
    gated: set[int] = set()

    def check_runtime(probe: Any, server_url: Any) -> Any:
        result = real_check(probe, server_url)
        if threading.get_ident() not in gated:
            gated.add(threading.get_ident())
            at_the_gate.wait()
        return result

    monkeypatch.setattr(rl_insight_compat, "check_runtime", check_runtime)
    bridges = [
        many_bridges(
            exporter="rl_insight",
            rl_insight_transport="hub",
            schedule_delay_ms=600_000,
            project="p",
            experiment_name="e",
        )
        for _ in range(threads)
    ]
    for i, bridge in enumerate(bridges):
        with bridge.session(sample=i, session=0):
            pass
    flushed: list[bool] = []
    assert not run_threads(((lambda b=b: flushed.append(b.force_flush(WAIT_S))) for b in bridges), WAIT_S * 2)

    assert flushed == [True] * threads and not at_the_gate.broken
    assert len(fake.init_calls) == 1, fake.init_calls
    assert fake.init_calls[0]["project"] == "p" and fake.init_calls[0]["experiment_name"] == "e"
    assert rl_insight_compat.init_calls() == 1
    assert sorted(int(call.attributes["sample"]) for call in fake.calls) == list(range(threads))
    assert fake.ignored == 0  # no span was forwarded before RL-Insight was on
    for bridge in bridges:
        counters = bridge.status()["counters"]
        assert counters["exported"] == {"rl_insight": 1} and balance(counters) == 0, counters
