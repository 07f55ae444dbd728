"""Fault classes found by adversarial use: each test provokes the fault, then checks what must hold.

Every test ends with the accounting invariant (``assert_balanced``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import INVALID_SPAN, StatusCode, get_current_span

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.config import resolve_leniently
from verl_otel_bridge._internal.identity import current_identity

from .helpers import WAIT_S, StartReceiver, assert_balanced, finished

Make = Callable[..., Bridge]


class UnprintableError(Exception):
    """An exception whose ``__str__`` raises, as some C extensions' errors do."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


# -- class 2: exceptions pass through untouched, every span ends ---------------------------


def _raise_inside(bridge: Bridge, kind: str, exc: BaseException) -> None:
    if kind == "span":
        with bridge.span("work"):
            raise exc
    elif kind == "session":
        with bridge.session(sample=0, session=0):
            raise exc
    elif kind == "task":
        with bridge.session(sample=0, session=0), bridge.task("t"):
            raise exc
    elif kind == "turn":
        with bridge.session(sample=0, session=0), bridge.turn(0):
            raise exc
    else:

        @bridge.traced
        def work() -> None:
            raise exc

        work()


@pytest.mark.parametrize("kind", ["span", "session", "task", "turn", "traced"])
def test_an_exception_whose_str_raises_reaches_the_caller_unchanged(make_bridge: Make, kind: str) -> None:
    bridge = make_bridge(exporter="memory")
    exc = UnprintableError()
    with pytest.raises(UnprintableError) as caught:
        _raise_inside(bridge, kind, exc)
    assert caught.value is exc
    counters = assert_balanced(bridge)
    assert counters["started"] == counters["ended"] > 0
    errors = [s for s in finished(bridge) if s.status.status_code is StatusCode.ERROR]
    assert errors and all("UnprintableError" in (s.status.description or "") for s in errors)
    assert all(any(e.name == "exception" for e in s.events) for s in errors)


def test_one_span_scope_entered_inside_itself_makes_two_spans_and_ends_both(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory")
    scope = bridge.span("reused")
    with scope as outer, scope as inner:
        assert inner is not outer
    with bridge.span("after") as after:
        pass
    spans = finished(bridge)
    assert sorted(s.name for s in spans) == ["after", "reused", "reused"]
    assert after.parent is None  # no stale parent left behind by the reused scope  # type: ignore[attr-defined]
    counters = assert_balanced(bridge)
    assert counters["started"] == counters["ended"] == 3


# -- class 3: identity restore never raises and never leaves an identity behind -------------


def test_two_sessions_left_in_entry_order_leave_no_identity(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory")
    first = bridge.session(sample="a", session=0, uid="first")
    second = bridge.session(sample="b", session=0, uid="second")
    first.__enter__()
    second.__enter__()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first.__exit__(None, None, None)
        assert current_identity() is not None and current_identity().uid == "second"  # type: ignore[union-attr]
        second.__exit__(None, None, None)
    assert current_identity() is None
    assert get_current_span() is INVALID_SPAN  # no ended session left behind as the parent
    assert any("out of order" in str(w.message) for w in said)
    with bridge.span("later"):
        pass
    later = [s for s in finished(bridge) if s.name == "later"]
    assert "uid" not in (later[0].attributes or {}) and later[0].parent is None
    assert_balanced(bridge)


def test_interleaved_generators_holding_sessions_leave_no_identity(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory")

    def rollout(sample: str) -> Iterator[int]:
        with bridge.session(sample=sample, session=0, uid=sample):
            yield 1
            yield 2

    a, b = rollout("a"), rollout("b")
    next(a)
    next(b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        a.close()
        assert current_identity() is not None and current_identity().uid == "b"  # type: ignore[union-attr]
        b.close()
    assert current_identity() is None and get_current_span() is INVALID_SPAN
    assert_balanced(bridge)


def test_async_generator_session_closed_from_another_task_does_not_raise(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory")

    async def rollout() -> AsyncIterator[int]:
        with bridge.session(sample=0, session=0, uid="gen"):
            yield 1
            yield 2

    async def main() -> None:
        gen = rollout()
        async for _ in gen:
            break
        closer = asyncio.get_running_loop().create_task(gen.aclose())
        await closer  # finalised in another task's context: must not raise ValueError
        assert current_identity() is None or current_identity().uid != "gen"  # type: ignore[union-attr]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        asyncio.run(main())
    counters = assert_balanced(bridge)
    assert counters["started"] == counters["ended"] == 1


@contextmanager
def _resumed(bridge: Bridge, uid: str) -> Iterator[None]:
    with bridge.session(sample=uid, session=0, uid=uid) as s, bridge.resume(s.identity):
        yield


def test_nested_resume_left_out_of_order_restores_nothing_stale(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory")
    outer = _resumed(bridge, "outer")
    inner = _resumed(bridge, "inner")
    outer.__enter__()
    inner.__enter__()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outer.__exit__(None, None, None)
        inner.__exit__(None, None, None)
    assert current_identity() is None and get_current_span() is INVALID_SPAN
    assert_balanced(bridge)


# -- class 1: exit is bounded whatever the exporter does -----------------------------------

STUCK_WRITER = r"""
import os, sys, time
import verl_otel_bridge as vob

fifo = sys.argv[1]
os.mkfifo(fifo)
reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads: writes block once the pipe is full
bridge = vob.configure(exporter="jsonl", jsonl_path=fifo, shutdown_timeout_s=2, schedule_delay_ms=10, environ={})
for i in range(400):
    with vob.span("big", payload="x" * 2000):
        pass
time.sleep(0.5)  # let the export thread block in write(2) (an unbounded wait would hang this script, not pass it)
exit_mode = sys.argv[2]
if exit_mode == "shutdown":
    vob.shutdown()
    print("dropped", bridge.status()["counters"]["dropped"], flush=True)
else:
    print("exiting", flush=True)  # the atexit hook shuts the bridge down
"""


@pytest.mark.parametrize("exit_mode", ["shutdown", "interpreter-exit"])
def test_shutdown_and_exit_are_bounded_when_a_write_blocks_in_the_kernel(tmp_path: Path, exit_mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", STUCK_WRITER, str(tmp_path / "fifo"), exit_mode],
        capture_output=True,
        text=True,
        timeout=60,  # the fault is a process that never ends: bounded
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # shutdown_timeout_s=2 bounds shutdown: the stuck batch is given up at that deadline, not waited for
    assert "did not finish within 2.0 s" in done.stderr, done.stderr[-2000:]
    if exit_mode == "shutdown":
        _, dropped = done.stdout.split()[-2:]
        assert int(dropped) > 0  # the stuck batch and what was queued behind it are counted, not silently lost
    assert "abandoned" in done.stderr


# -- class 7: files hold exactly what was counted, and errors are said when they happen -----

SIZE_LIMITED = r"""
import json, logging, resource, signal, sys
import verl_otel_bridge as vob

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")
path, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write(2) fails with EFBIG instead of a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
bridge = vob.configure(
    exporter="jsonl", jsonl_path=path, max_export_batch_size=7, schedule_delay_ms=0, spill_max_bytes=0, environ={}
)
for batch in range(12):
    for i in range(7):
        with vob.span("s", batch=batch, i=i, payload="y" * 300):
            pass
    assert bridge.force_flush(10)
    print("flushed", batch, file=sys.stderr, flush=True)
print(json.dumps(bridge.status()["counters"]))
bridge.shutdown()
"""


def test_a_write_that_fails_part_way_leaves_whole_lines_that_match_the_counters(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", SIZE_LIMITED, str(path), "12000"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counters = json.loads(done.stdout.strip().splitlines()[-1])
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # ends with a whole line
    records = [json.loads(line) for line in lines[:-1]]  # every line parses
    assert len(records) == counters["exported"]["jsonl"] > 0
    assert counters["failed"] == counters["ended"] - len(records) > 0
    assert balance(counters) == 0
    # Said at the first failure, before later batches were flushed, not only in the shutdown summary.
    warning = done.stderr.index("writing 7 spans to")
    assert "EFBIG" in done.stderr[warning : warning + 300]
    assert warning < done.stderr.rindex("flushed 11")


# -- class 5: a worker's settings never vanish together -----------------------------------


def test_one_inconsistent_worker_setting_is_left_out_alone(caplog: pytest.LogCaptureFixture) -> None:
    environ = {
        "VERL_OTEL_BRIDGE_REDACT_ATTRIBUTES": "content,reasoning",
        "VERL_OTEL_BRIDGE_PROJECT": "p",
        "VERL_OTEL_BRIDGE_MAX_QUEUE_SIZE": "64",
        "VERL_OTEL_BRIDGE_MAX_EXPORT_BATCH_SIZE": "512",  # larger than the queue: inconsistent
    }
    config, problems = resolve_leniently(environ)
    assert config.redact_attributes == ("content", "reasoning") and config.project == "p"
    assert config.max_queue_size == 64 and config.max_export_batch_size == 64  # the batch fitted to the queue
    assert len(problems) == 1 and "VERL_OTEL_BRIDGE_MAX_EXPORT_BATCH_SIZE" in problems[0]


def test_a_worker_whose_jsonl_path_is_a_directory_keeps_its_privacy_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "jsonl")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(tmp_path))  # a directory
    monkeypatch.setenv("VERL_OTEL_BRIDGE_REDACT_ATTRIBUTES", "content")
    bridge = vob.get_bridge()  # made as a span would make it: the file is opened on the export thread
    assert bridge.config.redact_attributes == ("content",) and bridge.config.exporter == "jsonl"
    with caplog.at_level(logging.WARNING, logger="verl_otel_bridge"):
        with vob.session(sample=0, session=0), vob.turn(0) as turn:
            turn.record(content="a private prompt")
        bridge.shutdown()
    assert any("jsonl_path" in r.getMessage() and "cannot be opened" in r.getMessage() for r in caplog.records), (
        caplog.text
    )
    assert bridge.status()["counters"]["spilled"] == 2  # refused by the file: kept in the spill, redacted
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "a private prompt" not in written and "[REDACTED]" in written


def test_a_misspelled_privacy_setting_exports_nothing() -> None:
    environ = {"VERL_OTEL_BRIDGE_REDACT_ATTRIBUTE": "content", "VERL_OTEL_BRIDGE_PROJECT": "p"}  # no final S
    config, problems = resolve_leniently(environ)
    assert config.enabled is False
    assert any("redact_attributes" in problem and "nothing is exported" in problem for problem in problems)


def test_a_misspelled_other_setting_is_left_out_alone() -> None:
    config, problems = resolve_leniently({"VERL_OTEL_BRIDGE_PROJEKT": "p", "VERL_OTEL_BRIDGE_EXPORTER": "memory"})
    assert config.enabled is True and config.exporter == "memory" and config.project is None
    assert len(problems) == 1 and "Did you mean 'project'" in problems[0]


# -- class 6: numbers accepted at configure() are numbers that work -------------------------


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"shutdown_timeout_s": float("nan")}, "shutdown_timeout_s"),
        ({"shutdown_timeout_s": float("inf")}, "shutdown_timeout_s"),
        ({"shutdown_timeout_s": 1e12}, "shutdown_timeout_s"),
        ({"schedule_delay_ms": 10**13}, "schedule_delay_ms"),
        ({"reminder_interval_s": float("nan")}, "reminder_interval_s"),
        ({"max_queue_size": 1.9}, "max_queue_size"),
        ({"exporter": {"memory", "console"}}, "exporter"),
    ],
)
def test_numbers_that_would_fail_later_raise_at_configure(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        BridgeConfig.resolve(environ={}, **settings)


def test_a_huge_schedule_delay_from_the_environment_is_refused_at_configure() -> None:
    with pytest.raises(ValueError, match="OTEL_BSP_SCHEDULE_DELAY"):
        BridgeConfig.resolve(environ={"OTEL_BSP_SCHEDULE_DELAY": str(10**13)})


def test_a_failed_configure_leaves_the_previous_bridge_in_place() -> None:
    first = vob.configure(exporter="memory", environ={})
    with pytest.raises(ValueError):
        vob.configure(exporter="memory", shutdown_timeout_s=float("nan"))
    assert vob.get_bridge() is first
    first.shutdown()


# -- class 8: secrets never in a repr, a log line or an error --------------------------------


def test_secrets_in_rl_insight_config_are_masked_in_repr() -> None:
    config = BridgeConfig.resolve(
        environ={}, rl_insight_config={"server": {"url": "http://u:hunter22@h:1", "api_token": "tok-123456"}}
    )
    shown = repr(config)
    assert "hunter22" not in shown and "tok-123456" not in shown and "***" in shown


def test_a_malformed_rl_insight_config_variable_is_never_echoed(caplog: pytest.LogCaptureFixture) -> None:
    raw = '{"server": {"token": "tok-secret-987"'  # cut short: not JSON
    with pytest.raises(ValueError) as caught:
        BridgeConfig.resolve(environ={"VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG": raw})
    assert "tok-secret-987" not in str(caught.value) and "VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG" in str(caught.value)
    _, problems = resolve_leniently({"VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG": raw})
    assert problems and all("tok-secret-987" not in p for p in problems)


# -- class 9: span-time calls never raise into the caller ----------------------------------


class RaisingMapping(dict[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise KeyError("no")

    def items(self) -> Any:
        raise RuntimeError("no items either")


class RaisingTrajectory:
    @property
    def reward_score(self) -> float:
        raise RuntimeError("lazy reward failed")

    num_turns = 3


def test_span_time_calls_with_odd_arguments_do_not_raise(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory")
    now = time.time_ns()
    bridge.record_span("pairs", start_time_ns=now, end_time_ns=now + 1, attributes=[("a", 1)])  # type: ignore[arg-type]
    bridge.record_span("raising", start_time_ns=now, end_time_ns=now + 1, attributes=RaisingMapping(x=1))
    with bridge.session(sample=0, session=0) as session:
        with bridge.span("tool", name="search") as tool:  # `name` is an attribute here, not the span name
            pass
        with bridge.task("t", name="other"), bridge.turn(1, turn="ignored"):
            pass
        session.finish(status="success", trajectories=[RaisingTrajectory()])
    spans = {s.name: s for s in finished(bridge)}
    assert spans["pairs"].attributes["a"] == 1  # type: ignore[index]
    assert "x" not in (spans["raising"].attributes or {})
    assert tool.attributes["name"] == "search"  # type: ignore[attr-defined]
    assert spans["agent_task"].attributes["name"] == "other"  # type: ignore[index]
    assert spans["agent_turn"].attributes["turn"] == 1  # type: ignore[index]
    assert json.loads(spans["agent_session"].attributes["monitor.trajectories"]) == [{"num_turns": 3}]  # type: ignore[index]
    assert_balanced(bridge)


# -- class 4 (identity part): identity values are bounded like every attribute ---------------


def test_a_huge_identity_value_is_truncated_like_any_attribute(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory", max_attribute_length=1000)
    with bridge.session(sample="x" * 1_000_000, session=0, uid="u" * 5000) as session, bridge.span("inside"):
        pass
    assert len(session.identity.sample) < 1100 and len(session.identity.uid) < 1100
    for span in finished(bridge):
        assert all(len(v) < 5000 for v in (span.attributes or {}).values() if isinstance(v, str)), span.name
    assert_balanced(bridge)


# -- class 10: SIGTERM flushes within a bound, then the process stops as it would have -------

TERMINATED = r"""
import os, signal, sys
import verl_otel_bridge as vob

path, mode = sys.argv[1], sys.argv[2]
if mode == "own-handler":
    def own(signum, frame):
        print("own handler ran", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, own)
vob.configure(
    exporter="jsonl", jsonl_path=path, schedule_delay_ms=600_000,  # every span waits in the queue:
    max_queue_size=4096, max_export_batch_size=4096,  # neither the delay nor a full batch wakes the export
    handle_sigterm=mode != "opt-out", environ={},
)
for i in range(1500):
    with vob.span("queued", i=i):
        pass
open_session = vob.session(sample="open", session=0)
open_session.__enter__()  # still open when the signal arrives
os.kill(os.getpid(), signal.SIGTERM)
signal.pause()  # never reached with a handler that exits
"""


@pytest.mark.parametrize("mode", ["default", "own-handler", "opt-out"])
def test_sigterm_flushes_queued_spans_then_hands_over(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "spans.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", TERMINATED, str(path), mode], capture_output=True, text=True, timeout=60
    )
    lines = path.read_text().splitlines() if path.exists() else []
    if mode == "opt-out":  # the fault, as it was for everyone: the queue dies with the process
        assert done.returncode == -signal.SIGTERM and lines == []
        return
    queued = [line for line in lines if '"name": "queued"' in line]
    assert len(queued) == 1500, done.stderr[-2000:]
    if mode == "default":
        assert done.returncode == -signal.SIGTERM  # still dies of SIGTERM, as without the bridge
        (session,) = [json.loads(line) for line in lines if '"name": "agent_session"' in line]
        assert session["attributes"]["status"] == "unfinished"  # the process is dying: open sessions are ended
    else:
        assert done.returncode == 3 and "own handler ran" in done.stdout  # the application goes on: only flushed


# -- class 4: one bad span never poisons its batch; out-of-range numbers are converted --------


def test_record_span_refuses_a_time_otlp_cannot_carry(make_bridge: Make) -> None:
    bridge = make_bridge(exporter="memory")
    now = time.time_ns()
    bridge.record_span("far future", start_time_ns=now, end_time_ns=10**30)
    assert bridge.status()["counters"]["invalid"] == 1 and finished(bridge) == []


def test_a_span_the_encoder_cannot_encode_is_left_out_alone(start_receiver: StartReceiver, make_bridge: Make) -> None:
    sink = start_receiver()
    bridge = make_bridge(exporter="otlp", otlp_endpoint=sink.url, max_export_batch_size=512, schedule_delay_ms=60_000)
    tracer = bridge.tracer
    for i in range(511):
        with bridge.span("fine", i=i):
            pass
    bad = tracer.start_span("set straight on the SDK span")
    bad.end(end_time=10**30)  # past what OTLP's fixed64 carries
    assert bridge.force_flush(WAIT_S)
    counters = assert_balanced(bridge)
    assert counters["exported"]["otlp"] == 511 and counters["failed"] == 1
    assert len(sink.spans) == 511


def test_integers_beyond_int64_are_converted_and_counted(start_receiver: StartReceiver, make_bridge: Make) -> None:
    sink = start_receiver()
    bridge = make_bridge(exporter="otlp", otlp_endpoint=sink.url)
    with bridge.session(sample=0, session=0, global_steps=2**70), bridge.span("big", value=2**70, ok=7):
        pass
    assert bridge.force_flush(WAIT_S)
    counters = assert_balanced(bridge)
    assert counters["exported"]["otlp"] == 2 and counters["converted"] >= 2
    received = {span.name: span for span in sink.spans}
    assert received["big"].attributes["value"] == str(2**70) and received["big"].attributes["ok"] == 7
    assert received["agent_session"].attributes["global_steps"] == str(2**70)
