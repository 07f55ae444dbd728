"""docs/reliability.md, "Guarantees": faults a training run meets, and what the bridge promises under them.

RL-Insight faults use the fake modules of ``fake_rl_insight.py`` (the real
releases' versions of these faults are in ``tests/integration``). Every fault
test ends by checking the accounting invariant: after a flush, each ended span
is in exactly one bucket (``balance(...) == 0``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import OtlpReceiver
from threads import run_threads

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.records import REDACTED

from .fake_rl_insight import install_broken_rl_insight, usable_rl_insight
from .helpers import (
    WAIT_S,
    StartReceiver,
    assert_balanced,
    finished,
    forks_on_purpose,
    identity_of,
    wait_until,
    waits_while_idle,
)

#: RL-Insight through ``trace_span``, the path the faults are injected into.
HUB = {"exporter": "rl_insight", "rl_insight_transport": "hub"}
#: Queued spans wait for a flush (or shutdown): tests decide when batches happen.
MANUAL = {"schedule_delay_ms": 600_000}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # every logger: the bridge's, OpenTelemetry's, urllib's...
    return caplog


def end_spans(bridge: Bridge, count: int, prefix: str = "s") -> None:
    for i in range(count):
        with bridge.span(f"{prefix}{i}", i=i):
            pass


def session_of(bridge: Bridge, spans: int, boom_at: int | None = None, sample: int = 0) -> dict[str, Any]:
    """One session with ``spans`` child spans (the one at ``boom_at`` named ``boom``); its identity."""
    with bridge.session(sample=sample, session=0) as session:
        for i in range(spans):
            with bridge.span("boom" if i == boom_at else f"s{i}"):
                pass
    return session.identity.to_dict()


def messages(logs: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in logs.records if text in r.getMessage()]


# -- RL-Insight faults ---------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        ImportError("libcudart.so.12: cannot open shared object file"),
        ModuleNotFoundError("No module named 'prometheus_client'", name="prometheus_client"),
        RuntimeError("ray version mismatch"),
    ],
    ids=["ImportError", "missing-dependency", "RuntimeError"],
)
def test_import_rl_insight_raising_sends_spans_to_the_fallback(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], logs: pytest.LogCaptureFixture, exc: Exception
) -> None:
    install_broken_rl_insight(monkeypatch, exc)
    bridge = make_bridge(**HUB)
    for sample in range(3):
        identity = session_of(bridge, 4, sample=sample)
        assert bridge.force_flush(WAIT_S)
    spans = finished(bridge)
    assert len(spans) == 3 * 5 and identity_of(spans[-1]) == identity
    status = bridge.status()
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", "import_failed")
    assert str(exc) in status["detail"] and "0.3.0" in status["detail"]  # what failed, what is installed
    unusable = messages(logs, "RL-Insight is not usable")
    assert len(unusable) == 1 and unusable[0].levelno == logging.WARNING
    assert str(exc) in unusable[0].getMessage()
    counters = assert_balanced(bridge)
    assert (counters["fallback"], counters["failed"], counters["exported"]) == (15, 0, {})


def test_init_raising_sends_spans_to_the_fallback_and_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], logs: pytest.LogCaptureFixture
) -> None:
    fake = usable_rl_insight(monkeypatch)
    calls: list[dict[str, Any]] = []

    def broken_init(**kwargs: Any) -> None:
        calls.append(kwargs)
        raise RuntimeError("failed to create the hub actor")

    monkeypatch.setattr(fake.module, "init", broken_init)
    bridge = make_bridge(**HUB, project="p", experiment_name="e")
    for sample in range(3):
        session_of(bridge, 4, sample=sample)
        assert bridge.force_flush(WAIT_S)

    assert len(calls) == 1 and calls[0]["project"] == "p" and calls[0]["experiment_name"] == "e"
    assert fake.calls == [] and fake.ignored == 0  # nothing forwarded into a disabled RL-Insight
    status = bridge.status()
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", "init_failed")
    assert "failed to create the hub actor" in status["detail"]
    assert len(messages(logs, "RL-Insight is not usable")) == 1
    counters = assert_balanced(bridge)
    assert (counters["fallback"], counters["failed"]) == (15, 0)


def test_trace_span_raising_sends_the_rest_of_its_batch_to_the_fallback_and_later_batches_retry(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], logs: pytest.LogCaptureFixture
) -> None:
    fake = usable_rl_insight(monkeypatch)
    raised: list[str] = []

    def hook(call: dict[str, Any]) -> None:
        if call["name"] == "boom":
            raised.append(call["name"])
            raise ConnectionError("hub actor unreachable")

    fake.hook = hook
    bridge = make_bridge(**HUB, **MANUAL, max_export_batch_size=64)
    fallback = bridge.memory_exporter
    assert fallback is not None

    # batch 1: the 4th span raises -> s0..s2 reach RL-Insight, boom..agent_session go to the fallback
    identity = session_of(bridge, 8, boom_at=3, sample=1)
    assert bridge.force_flush(WAIT_S)
    assert [c.name for c in fake.calls] == ["s0", "s1", "s2"]
    assert [s.name for s in fallback.get_finished_spans()] == ["boom", "s4", "s5", "s6", "s7", "agent_session"]
    assert all(identity_of(s) == identity for s in fallback.get_finished_spans())

    # batch 2: healthy again -> all of it to RL-Insight (the failure did not switch RL-Insight off)
    session_of(bridge, 8, sample=2)
    assert bridge.force_flush(WAIT_S)
    assert len(fake.calls) == 3 + 9 and len(fallback.get_finished_spans()) == 6

    # batch 3: the first call raises -> the whole batch to the fallback; batch 4 is forwarded again
    session_of(bridge, 8, boom_at=0, sample=3)
    assert bridge.force_flush(WAIT_S)
    session_of(bridge, 8, sample=4)
    assert bridge.force_flush(WAIT_S)
    assert len(fake.calls) == 3 + 9 + 9 and len(fallback.get_finished_spans()) == 6 + 9
    assert raised == ["boom", "boom"]

    warnings = messages(logs, "hub actor unreachable")
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING  # once per exception type
    counters = assert_balanced(bridge)
    assert counters["exported"] == {"rl_insight": 21} and (counters["fallback"], counters["failed"]) == (15, 0)
    assert bridge.status()["reason"] == "ok"


# -- the queue: a slow or hung exporter never holds the caller -----------------------


def test_a_stuck_exporter_with_a_tiny_queue_drops_counted_and_never_holds_the_caller(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], gate: threading.Event
) -> None:
    """The exporter is stuck on its first span until the gate opens: the caller's spans all end meanwhile,
    the queue keeps what it holds and refuses the rest, each one counted."""
    fake = usable_rl_insight(monkeypatch)
    fake.hook = lambda call: gate.wait(WAIT_S)
    bridge = make_bridge(**HUB, max_queue_size=8, max_export_batch_size=1, schedule_delay_ms=1, spill_max_bytes=0)
    made = 2000

    # A caller that waited for the stuck exporter would never finish; the bound only keeps a failure from hanging.
    assert run_threads([lambda: end_spans(bridge, made)]) == [], "ending spans raised"
    counters = bridge.status()["counters"]
    assert counters["ended"] == made
    assert counters["dropped"] >= made - 8 - 2  # at most the queue plus one batch in flight got through
    gate.set()  # the exporter comes back: what was queued is delivered, nothing else
    bridge.shutdown(timeout_s=WAIT_S)
    counters = bridge.status()["counters"]
    assert balance(counters) == 0, counters
    assert counters["dropped"] + counters["exported"]["rl_insight"] == made and counters["failed"] == 0
    # drop policy: the *new* span is refused and queued ones are kept, so the first 8 all got through
    delivered = sorted(c.attributes["i"] for c in fake.calls)
    assert len(delivered) == counters["exported"]["rl_insight"]
    assert delivered[:8] == list(range(8)), delivered[:20]


def test_shutdown_with_an_exporter_that_hangs_forever_is_bounded_and_counts_the_abandoned(
    monkeypatch: pytest.MonkeyPatch,
    make_bridge: Callable[..., Bridge],
    gate: threading.Event,
    logs: pytest.LogCaptureFixture,
) -> None:
    fake = usable_rl_insight(monkeypatch)
    entered = threading.Event()

    def hang(call: dict[str, Any]) -> None:
        entered.set()
        gate.wait()  # forever, as far as the bridge knows (released at teardown)

    fake.hook = hang
    bridge = make_bridge(**HUB, max_export_batch_size=10, schedule_delay_ms=10)
    end_spans(bridge, 10)  # one full batch: the worker takes it and hangs inside the exporter
    wait_until(entered.is_set, what="the exporter to be called")
    # The caller is not held by the hung exporter (which would hold it forever; the bound only keeps a failure
    # from hanging).
    assert run_threads([lambda: end_spans(bridge, 25, prefix="late")]) == []
    assert bridge.force_flush(timeout_s=0.2) is False  # a flush says it could not finish

    bridge.shutdown(timeout_s=2)
    assert not gate.is_set()  # it returned while the exporter still hangs...
    assert messages(logs, "did not finish within 2.0 s")  # ...having waited its whole deadline for it

    counters = bridge.status()["counters"]
    assert counters["ended"] == 35
    assert counters["dropped"] == 35 and counters["exported"] == {}  # queued and in flight: abandoned
    assert balance(counters) == 0, counters
    assert len(messages(logs, "abandoned")) == 1
    summary = messages(logs, "verl_otel_bridge shut down")
    assert len(summary) == 1 and summary[0].levelno == logging.WARNING and "dropped=35" in summary[0].getMessage()
    with bridge.span("after-shutdown"):  # spans after shutdown still never raise
        pass


def test_a_hung_batch_that_returns_after_shutdown_is_not_counted_twice(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], gate: threading.Event
) -> None:
    fake = usable_rl_insight(monkeypatch)
    entered = threading.Event()

    def hang(call: dict[str, Any]) -> None:
        entered.set()
        gate.wait(WAIT_S)

    fake.hook = hang
    bridge = make_bridge(**HUB, max_export_batch_size=5, schedule_delay_ms=10)
    end_spans(bridge, 5)
    wait_until(entered.is_set, what="the exporter to be called")
    bridge.shutdown(timeout_s=0.2)
    assert bridge.status()["counters"]["dropped"] == 5
    gate.set()  # the exporter comes back after all
    wait_until(lambda: bridge.status()["counters"]["exported"].get("rl_insight") == 5, what="the late export")
    wait_until(lambda: balance(bridge.status()["counters"]) == 0, what="the late batch to be uncounted from dropped")
    assert bridge.status()["counters"]["dropped"] == 0


def test_zero_schedule_delay_does_not_spin_the_export_thread(
    make_bridge: Callable[..., Bridge], tmp_path: Path
) -> None:
    """``schedule_delay_ms=0`` (``OTEL_BSP_SCHEDULE_DELAY=0``) exports at once, without burning a core when idle."""
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(tmp_path / "s.jsonl"), schedule_delay_ms=0)
    end_spans(bridge, 5)
    wait_until(lambda: balance(bridge.status()["counters"]) == 0, what="spans exported without a flush")
    assert bridge.pipeline.queue is not None
    assert waits_while_idle(bridge.pipeline.queue) == 1  # one wait, not a spin
    end_spans(bridge, 5)
    wait_until(lambda: bridge.status()["counters"]["exported"].get("jsonl") == 10, what="the next spans, unflushed")
    assert_balanced(bridge)


def test_warn_once_registry_is_capped(make_bridge: Callable[..., Bridge], logs: pytest.LogCaptureFixture) -> None:
    """A stream of distinct attribute keys cannot grow the warn-once registry (or the log) without bound."""
    bridge = make_bridge(exporter="memory", memory_max_spans=10)
    for i in range(3000):
        with bridge.span("s", **{f"key_{i}": [i, "mixed"]}):
            pass
    conversions = messages(logs, "value converted")
    assert 1000 <= len(conversions) <= 1025, len(conversions)  # 1,024 keys, then one overflow line
    assert len(finished(bridge)) == 10  # and the in-memory exporter keeps only the newest spans
    counters = assert_balanced(bridge)
    assert counters["converted"] == 3000 and counters["exported"] == {"memory": 3000}


# -- process lifecycle ------------------------------------------------------------------


EXIT_SCRIPT = """
import atexit, json, sys
import verl_otel_bridge as vob
from verl_otel_bridge._internal.accounting import balance

# atexit runs handlers last-in first-out: this one runs after the bridge's own shutdown (its final account)
atexit.register(lambda: print("COUNTERS " + json.dumps(vob.status()["counters"])))
vob.configure(exporter="jsonl", jsonl_path=sys.argv[1], schedule_delay_ms=60000, shutdown_timeout_s=10)
with vob.session(sample=0, session=0):
    for i in range(99):
        with vob.span(f"span-{i}"):
            pass
assert vob.status()["pending"]["queued"] == 100, vob.status()  # nothing exported yet: all of it waits for exit
{exit}
"""


@pytest.mark.parametrize("how", ["end-of-script", "sys.exit"])
def test_spans_ended_just_before_a_normal_exit_are_exported(tmp_path: Path, how: str) -> None:
    path = tmp_path / "spans.jsonl"
    script = EXIT_SCRIPT.replace("{exit}", "sys.exit(0)" if how == "sys.exit" else "")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VERL_", "RL_INSIGHT_"))}
    result = subprocess.run(
        [sys.executable, "-c", script, str(path)], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    names = [json.loads(line)["name"] for line in path.read_text().splitlines()]
    assert sorted(names) == sorted([f"span-{i}" for i in range(99)] + ["agent_session"])
    counters = json.loads(result.stdout.split("COUNTERS ", 1)[1])
    assert balance(counters) == 0 and counters["exported"] == {"jsonl": 100}, counters


def _wait_child(pid: int, timeout_s: float) -> int:
    """The child's exit code; kills it and fails if it has not exited within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        threading.Event().wait(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child {pid} did not exit within {timeout_s} s")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@forks_on_purpose
def test_fork_child_exports_its_spans_and_the_parents_queue_is_exported_once(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    bridge = vob.configure(exporter="jsonl", jsonl_path=str(path), schedule_delay_ms=600_000, max_queue_size=4096)
    end_spans(bridge, 50, prefix="parent-")
    assert bridge.status()["pending"]["queued"] == 50  # queued in the parent, not yet exported

    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            child = vob.get_bridge()
            fresh = child.status()["counters"]["ended"] == 0 and child.status()["pending"]["queued"] == 0
            end_spans(child, 30, prefix="child-")
            counters = child.status()["counters"]
            vob.shutdown(timeout_s=10)
            counters = child.status()["counters"]
            ok = fresh and counters["exported"] == {"jsonl": 30} and balance(counters) == 0
            code = 0 if ok else 3
        finally:
            os._exit(code)

    assert _wait_child(pid, timeout_s=30) == 0, "the child's counters were not fresh, or its spans were not exported"
    end_spans(bridge, 5, prefix="parent-after-")
    assert bridge.force_flush(WAIT_S)
    names = [json.loads(line)["name"] for line in path.read_text().splitlines()]
    expected = [f"parent-{i}" for i in range(50)] + [f"child-{i}" for i in range(30)]
    expected += [f"parent-after-{i}" for i in range(5)]
    assert sorted(names) == sorted(expected)  # each exactly once
    counters = assert_balanced(bridge)
    assert counters["exported"] == {"jsonl": 55}


# -- secrets and sockets -----------------------------------------------------------------


def test_redacted_attributes_never_reach_any_exporter(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], tmp_path: Path
) -> None:
    secret = "patient-record-4711"
    keys = ("content", "tool_args", "gen_ai.tool.call.arguments", "api_key")

    def traffic(bridge: Bridge) -> None:
        with bridge.session(sample=0, session=0) as session:
            with session.turn(0) as turn:
                turn.record(content=secret, tool_args={"q": secret}, prompt_tokens=3)
                turn.span.add_event("tool_call", {"api_key": secret, "tool": "search"})
            with bridge.span("call", api_key=secret, kept="visible") as span:
                span.set_attribute("content", secret)
            try:
                with bridge.span("failing", content=secret):
                    raise ValueError("boom")
            except ValueError:
                pass

    def check(spans: list[Any]) -> None:
        assert len(spans) == 4
        for span in spans:
            attributes = dict(span.attributes or {})
            assert secret not in repr(attributes) and secret not in repr([e.attributes for e in span.events])
        call = next(s for s in spans if s.name == "call")
        assert (call.attributes["api_key"], call.attributes["content"], call.attributes["kept"]) == (
            REDACTED,
            REDACTED,
            "visible",
        )
        turn = next(s for s in spans if s.name == "agent_turn")
        assert turn.events[0].attributes["api_key"] == REDACTED and turn.events[0].attributes["tool"] == "search"
        assert turn.attributes["prompt_tokens"] == 3

    # memory as the primary exporter
    memory = make_bridge(exporter="memory", redact_attributes=keys)
    traffic(memory)
    check(finished(memory))
    assert_balanced(memory)

    # the fallback behind an unusable RL-Insight (not installed)
    fallback = make_bridge(exporter="rl_insight", redact_attributes=keys)
    traffic(fallback)
    check(finished(fallback))
    assert assert_balanced(fallback)["fallback"] == 4

    # a JSONL copy next to memory
    path = tmp_path / "copy.jsonl"
    both = make_bridge(exporter=["memory", "jsonl"], jsonl_path=str(path), redact_attributes=keys)
    traffic(both)
    check(finished(both))
    text = path.read_text()
    assert len(text.splitlines()) == 4 and secret not in text and REDACTED in text
    assert assert_balanced(both)["copies.jsonl"] == 4

    # RL-Insight itself
    fake = usable_rl_insight(monkeypatch)
    forwarded = make_bridge(**HUB, redact_attributes=keys)
    traffic(forwarded)
    assert assert_balanced(forwarded)["exported"] == {"rl_insight": 4}
    assert len(fake.calls) == 4 and secret not in repr(fake.calls)


@pytest.fixture
def otlp_sink(start_receiver: StartReceiver) -> OtlpReceiver:
    return start_receiver()


SECRET = "s3cret"


def _assert_no_secret(bridge: Bridge, logs: pytest.LogCaptureFixture) -> None:
    shown = {
        "status()": repr(bridge.status()),
        "repr(bridge)": repr(bridge),
        "repr(config)": repr(bridge.config),
        "str(config)": str(bridge.config),
        "logs": logs.text + "\n".join(r.getMessage() for r in logs.records),
    }
    leaks = [where for where, text in shown.items() if SECRET in text]
    assert not leaks, {where: shown[where] for where in leaks}


def test_credentials_stay_out_of_status_reprs_and_logs(
    monkeypatch: pytest.MonkeyPatch, logs: pytest.LogCaptureFixture, otlp_sink: OtlpReceiver
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer {SECRET}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_sink.url)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", f"http://user:{SECRET}@rl-insight.internal:8265")
    bridge = vob.configure(exporter="otlp", schedule_delay_ms=50)
    assert SECRET in (bridge.config.rl_insight_server_url or "")  # the value is there to be used...
    session_of(bridge, 3)
    assert bridge.force_flush(WAIT_S)
    _assert_no_secret(bridge, logs)  # ...but is never shown
    vob.shutdown(timeout_s=WAIT_S)  # the shutdown summary too
    _assert_no_secret(bridge, logs)
    assert otlp_sink.requests and otlp_sink.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    counters = bridge.status()["counters"]
    assert balance(counters) == 0 and counters["exported"] == {"otlp": 4}, counters


@pytest.mark.parametrize(
    "server_url",
    [f"http://user:{SECRET}@127.0.0.1:1", f"http://user:{SECRET}@rl-insight"],
    ids=["with-port", "without-port"],
)
def test_rl_insight_server_password_stays_out_of_status_and_logs(
    monkeypatch: pytest.MonkeyPatch, logs: pytest.LogCaptureFixture, server_url: str
) -> None:
    """The OTLP transport's discovery at RL-Insight's server fails; its error is shown without the password."""
    fake = usable_rl_insight(monkeypatch)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", server_url)
    bridge = vob.configure(exporter="rl_insight", rl_insight_transport="auto", **MANUAL)
    session_of(bridge, 3)
    assert bridge.force_flush(WAIT_S)
    status = bridge.status()
    assert status["exporters"]["rl_insight"]["last_error"], status  # discovery failed, and says so...
    _assert_no_secret(bridge, logs)  # ...without the password
    counters = assert_balanced(bridge)
    assert counters["exported"] == {"rl_insight": 4} and counters["failed"] == 0  # the hub took them
    assert len(fake.calls) == 4
    vob.shutdown(timeout_s=WAIT_S)
    _assert_no_secret(bridge, logs)


def _listening_socket_inodes() -> set[str]:
    """Inodes of TCP sockets in LISTEN state (``0A``) that this process holds."""
    own = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        match = re.fullmatch(r"socket:\[(\d+)\]", target)
        if match:
            own.add(match.group(1))
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":
                listening.add(fields[9])
    return own & listening


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_the_bridge_opens_no_listening_socket(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], otlp_sink: OtlpReceiver, tmp_path: Path
) -> None:
    before = _listening_socket_inodes()
    assert before, "the test's own OTLP sink should be listening (is /proc/net/tcp readable?)"
    fake = usable_rl_insight(monkeypatch)  # RL-Insight, with the otlp transport's discovery attempt
    bridges = [
        make_bridge(exporter="rl_insight", rl_insight_transport="auto", **MANUAL),
        make_bridge(exporter=["memory", "jsonl", "console"], jsonl_path=str(tmp_path / "s.jsonl")),
        make_bridge(exporter="otlp", otlp_endpoint=otlp_sink.url, **MANUAL),
        make_bridge(
            exporter="rl_insight", rl_insight_enable=True, fallback="jsonl", jsonl_path=str(tmp_path / "f.jsonl")
        ),
    ]
    for bridge in bridges:
        session_of(bridge, 3)
        assert bridge.force_flush(WAIT_S)
        assert_balanced(bridge)
    assert fake.calls and otlp_sink.requests
    assert _listening_socket_inodes() == before


# -- monitoring that is off keeps saying so ------------------------------------------------


def test_unusable_rl_insight_is_reminded_after_the_interval(
    make_bridge: Callable[..., Bridge], logs: pytest.LogCaptureFixture
) -> None:
    interval = 0.2
    bridge = make_bridge(exporter="rl_insight", reminder_interval_s=interval, **MANUAL)  # rl_insight not installed

    def exported_and_logged(text: str) -> list[logging.LogRecord]:
        with bridge.span("s"):
            pass
        assert bridge.force_flush(WAIT_S)  # each flush is one export: the reminder is checked there
        return messages(logs, text)

    wait_until(lambda: exported_and_logged("RL-Insight is not usable"), what="the first log line")
    first = messages(logs, "RL-Insight is not usable")[0]
    assert messages(logs, "still not usable") == []  # not before the interval
    wait_until(lambda: exported_and_logged("still not usable"), timeout_s=5, what="the reminder")
    reminder = messages(logs, "still not usable")[0]
    assert reminder.created - first.created >= interval * 0.9
    assert reminder.levelno == logging.WARNING and "not_installed" in reminder.getMessage()
    assert re.search(r"\d+ spans sent to the memory exporter", reminder.getMessage())
    wait_until(lambda: len(exported_and_logged("still not usable")) >= 2, timeout_s=5, what="a second reminder")
    reminders = messages(logs, "still not usable")
    assert reminders[1].created - reminders[0].created >= interval * 0.9
    assert len(messages(logs, "RL-Insight is not usable")) == 1  # the first line is not repeated
    assert bridge.status()["reason"] == "not_installed"
    assert_balanced(bridge)


def test_spans_ending_in_other_threads_during_shutdown_are_all_accounted_for(
    make_bridge: Callable[..., Bridge], tmp_path: Path
) -> None:
    """A span ended while ``shutdown()`` runs is exported, or refused and counted as dropped: never neither."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # preempt threads as often as possible: races show up
    try:
        for attempt in range(6):
            bridge = make_bridge(exporter="jsonl", jsonl_path=str(tmp_path / f"{attempt}.jsonl"), schedule_delay_ms=1)
            stop = threading.Event()
            started = threading.Barrier(5, timeout=WAIT_S)

            def produce(
                bridge: Bridge = bridge, stop: threading.Event = stop, started: threading.Barrier = started
            ) -> None:
                started.wait()
                while not stop.is_set():
                    with bridge.span("racing"):
                        pass

            threads = [threading.Thread(target=produce) for _ in range(4)]
            for thread in threads:
                thread.start()
            started.wait()
            wait_until(lambda b=bridge: b.status()["counters"]["ended"] > 200, what="spans being ended")
            bridge.shutdown(timeout_s=WAIT_S)
            stop.set()
            for thread in threads:
                thread.join(timeout=WAIT_S)
            assert not any(thread.is_alive() for thread in threads)
            counters = bridge.status()["counters"]
            assert balance(counters) == 0, (attempt, counters)
            lines = len((tmp_path / f"{attempt}.jsonl").read_text().splitlines())
            assert lines == counters["exported"]["jsonl"], (attempt, lines, counters)
    finally:
        sys.setswitchinterval(switch)
