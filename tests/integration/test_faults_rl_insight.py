"""Faults inside RL-Insight 0.3.0 itself, with the real stack: the bridge must never raise
into the caller, must account for every span (``balance(...) == 0`` after a flush) and
must say what went wrong in ``status()``.

Faults that need a fresh process (a broken import, a failing ``rl_insight.init``, a
hub of its own to kill or to start while the server is down) run in a child process;
children that need Ray attach to the session's cluster as a new Ray job, which gets
its own RL-Insight hub actor, so the session's hub is never touched.

What RL-Insight itself does in these cases (0.3.0, observed here):

* ``trace_span`` is fire-and-forget (``actor.apply_event.remote``): after the hub
  actor died it still returns normally, and the span is gone. The bridge therefore
  asks the hub to confirm each batch (``get_status``, ordered after the batch's
  events) and sends a batch it cannot confirm to the fallback.
* A hub that started while the discovery server was down logs "Failed to fetch
  RL-Insight server services", reports ``otel_traces_enabled=False`` from
  ``get_status()``, still counts every event in ``events_applied`` and drops every
  span, for the life of its Ray job (it never asks the server again). ``trace_span``
  returns normally throughout.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest
from otlp_receiver import ReceivedSpan
from stack import (
    DiscoveryServer,
    PythonChild,
    RlInsightHub,
    free_port,
    run_python,
)

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import balance

pytestmark = pytest.mark.rl_insight("0.3.0")

#: Bound of every wait for spans, children and flushes.
TIMEOUT_S = 60.0


def make_bridge(server_url: str, transport: str = "hub", **settings: Any) -> Bridge:
    """A bridge asking for RL-Insight explicitly, with the in-memory fallback."""
    return Bridge(
        BridgeConfig.resolve(
            environ={},
            exporter="rl_insight",
            fallback="memory",
            rl_insight_transport=transport,
            rl_insight_server_url=server_url,
            project="p",
            experiment_name="e",
            **{"schedule_delay_ms": 20, **settings},
        )
    )


def tagged(receiver_spans: list[ReceivedSpan], tag: str) -> list[ReceivedSpan]:
    return [s for s in receiver_spans if s.attributes.get("tag") == tag]


# ------------------------------------------------------------- child processes

#: Shared by the children: build a bridge, emit tagged spans, summarise the outcome.
CHILD_COMMON = """
import json, os, sys, time
from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import balance

TAG = sys.argv[1]

def attach_ray():
    import ray
    ray.init(address=sys.argv[2], runtime_env={"env_vars": json.loads(sys.argv[3])})
    return ray

def make_bridge(**settings):
    return Bridge(BridgeConfig.resolve(
        environ={}, exporter="rl_insight", fallback="memory",
        rl_insight_server_url=os.environ["RL_INSIGHT_SERVER_URL"], project="p",
        rl_insight_config={"prometheus": {"metrics_report_port": int(sys.argv[4])}},
        schedule_delay_ms=20, **settings))

def emit(bridge, phase, n):
    for i in range(n):
        with bridge.span("fault." + phase, tag=TAG, phase=phase, i=i):
            pass

def summary(bridge):
    status = bridge.status()
    fallback = bridge.memory_exporter.get_finished_spans() if bridge.memory_exporter else ()
    return {"status": status, "balance": balance(status["counters"]),
            "fallback": [[s.attributes.get("phase"), s.attributes.get("i")] for s in fallback]}

def hub_actor(ray):
    job = ray.get_runtime_context().get_job_id()
    return ray.get_actor("RLInsightMonitorHub_" + job, namespace="rl-insight-monitor")
"""


def ray_child(hub: RlInsightHub, code: str, tag: str, server_url: str) -> PythonChild:
    """A child attached to the session's Ray cluster (its own Ray job, so its own hub)."""
    return PythonChild(
        CHILD_COMMON + code,
        env={"RL_INSIGHT_SERVER_URL": server_url},
        args=[tag, hub.ray.gcs_address, json.dumps(dict(hub.ray.env)), str(free_port())],
    )


def finish(child: PythonChild) -> None:
    """Release the child and check it exited cleanly (nothing raised to the caller)."""
    done = child.finish(timeout_s=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]


# ------------------------------------------------------------ import raises

_IMPORT_BROKEN = """
import importlib.abc, json, sys
BLOCK, KIND, URL = sys.argv[1], sys.argv[2], sys.argv[3]

class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == BLOCK or name.startswith(BLOCK + "."):
            if KIND == "missing":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            raise RuntimeError(f"simulated broken install while importing {name}")
        return None

sys.meta_path.insert(0, Broken())
from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.accounting import balance

config = BridgeConfig.resolve(environ={}, exporter="rl_insight", rl_insight_server_url=URL, schedule_delay_ms=10)
bridge = Bridge(config)
for n in range(10):
    with bridge.session(sample="s", session=str(n)) as session:
        with session.turn(0):
            pass
flushed = bridge.force_flush(30)
status = bridge.status()
print("RESULT " + json.dumps({
    "flushed": flushed, "status": status, "balance": balance(status["counters"]),
    "fallback_spans": len(bridge.memory_exporter.get_finished_spans()),
}, default=str))
bridge.shutdown()
"""


@pytest.mark.parametrize(
    ("block", "kind", "says"),
    [
        ("rl_insight", "raise", "RuntimeError: simulated broken install while importing rl_insight"),
        # rl_insight/__init__ imports lazily: a missing dependency surfaces when
        # rl_insight.trace_span is first read (rl_insight.api imports omegaconf).
        ("omegaconf", "missing", "ModuleNotFoundError: No module named 'omegaconf'"),
    ],
)
def test_import_rl_insight_raising(block: str, kind: str, says: str) -> None:
    result = run_python(_IMPORT_BROKEN, args=[block, kind, "http://127.0.0.1:9"], timeout_s=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    outcome = json.loads(next(line[7:] for line in result.stdout.splitlines() if line.startswith("RESULT ")))
    status, counters = outcome["status"], outcome["status"]["counters"]
    assert outcome["flushed"] is True
    assert status["reason"] == "import_failed", status
    assert says in status["detail"], status["detail"]
    assert status["rl_insight_package_version"] == "0.3.0" and status["rl_insight_installed"] is True
    assert status["exporter"] == "memory (fallback)"
    assert outcome["balance"] == 0 and counters["ended"] == 20, counters
    assert counters["fallback"] == outcome["fallback_spans"] == 20, counters
    assert "RL-Insight is not usable (import_failed)" in result.stderr  # a WARNING says so


# -------------------------------------------------------------- init raises

_INIT_RAISES = """
ray = attach_ray()
import rl_insight, rl_insight.api
calls = []

def broken_init(*args, **kwargs):
    calls.append(kwargs)
    raise RuntimeError("simulated init failure")

rl_insight.init = broken_init
bridge = make_bridge(rl_insight_transport="auto", experiment_name="init-raises", max_export_batch_size=10)
emit(bridge, "first", 25)
first = bridge.force_flush(30)
emit(bridge, "second", 25)
second = bridge.force_flush(30)
report({"flushed": [first, second], "init_calls": len(calls), "enabled": rl_insight.api._STATE.enabled,
        **summary(bridge)})
bridge.shutdown()
"""


def test_rl_insight_init_raising(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    with ray_child(rl_insight_hub, _INIT_RAISES, run_tag, rl_insight_hub.server.url) as child:
        outcome = child.result(0, timeout_s=TIMEOUT_S * 2)
        finish(child)
    status, counters = outcome["status"], outcome["status"]["counters"]
    assert outcome["flushed"] == [True, True]
    assert outcome["init_calls"] == 1  # once per process, not once per batch
    assert outcome["enabled"] is False
    assert status["reason"] == "init_failed", status
    assert "rl_insight.init raised RuntimeError: simulated init failure" in status["detail"]
    assert status["exporter"] == "memory (fallback)"
    assert outcome["balance"] == 0 and counters["ended"] == 50, counters
    assert counters["fallback"] == len(outcome["fallback"]) == 50 and not counters["exported"], counters
    assert not tagged(rl_insight_hub.receiver.spans, run_tag)


# -------------------------------------------------- trace_span raises sometimes


def test_trace_span_raising_on_some_calls(
    rl_insight_hub: RlInsightHub, run_tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl_insight

    real = rl_insight.trace_span
    calls = Counter[str]()

    def flaky(**kwargs: Any) -> None:
        calls["all"] += 1
        if calls["all"] % 7 == 3:
            calls["raised"] += 1
            raise RuntimeError("simulated trace_span failure")
        real(**kwargs)

    monkeypatch.setattr(rl_insight, "trace_span", flaky)
    bridge = make_bridge(rl_insight_hub.server.url, max_export_batch_size=10)
    try:
        for i in range(100):
            with bridge.span("fault.flaky", tag=run_tag, i=i):
                pass  # nothing raised here, whatever trace_span does
        assert bridge.force_flush(TIMEOUT_S)
        status = bridge.status()
        fallback = bridge.memory_exporter.get_finished_spans()
    finally:
        bridge.shutdown()
    counters = status["counters"]
    assert balance(counters) == 0 and counters["ended"] == 100, counters
    assert calls["raised"] >= 1 and counters["rl_insight_errors"] == calls["raised"], (calls, counters)
    assert counters["exported"]["rl_insight"] + counters["fallback"] == 100, counters
    assert status["reason"] == "ok" and status["exporter"] == "rl_insight", status  # RL-Insight stays usable
    received = rl_insight_hub.receiver.wait_for(
        counters["exported"]["rl_insight"], timeout_s=TIMEOUT_S, where=lambda s: s.attributes.get("tag") == run_tag
    )
    # Each span went exactly one way: through RL-Insight or to the fallback.
    via_hub = Counter(s.attributes["i"] for s in received)
    via_fallback = Counter(s.attributes["i"] for s in fallback)
    assert max(via_hub.values()) == 1 and max(via_fallback.values()) == 1
    assert len(via_fallback) == counters["fallback"]
    assert set(via_hub).isdisjoint(via_fallback) and set(via_hub) | set(via_fallback) == set(range(100))


# ------------------------------------------------------------ hub killed

_HUB_KILLED = """
ray = attach_ray()
bridge = make_bridge(rl_insight_transport="hub", experiment_name="hub-killed", max_export_batch_size=10)
emit(bridge, "before", 30)
report({"flushed": bridge.force_flush(30), **summary(bridge)})
wait_release()  # the test saw the "before" spans at the receiver

hub = hub_actor(ray)
ray.kill(hub)
deadline = time.monotonic() + 30
while True:  # until Ray reports the actor dead (bounded)
    try:
        ray.get(hub.get_status.remote(), timeout=5)
    except ray.exceptions.RayActorError:
        break
    if time.monotonic() > deadline:
        raise SystemExit("the hub actor did not die")
    time.sleep(0.05)

import rl_insight
rl_insight.trace_span(name="probe", start_time_ns=1, end_time_ns=2, attributes={"tag": TAG})  # returns normally
emit(bridge, "after", 30)  # nothing raised here either
report({"flushed": bridge.force_flush(30), **summary(bridge)})
bridge.shutdown()
"""


def test_hub_actor_killed_mid_run(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    receiver = rl_insight_hub.receiver
    with ray_child(rl_insight_hub, _HUB_KILLED, run_tag, rl_insight_hub.server.url) as child:
        before = child.result(0, timeout_s=TIMEOUT_S * 2)
        assert before["flushed"] and before["status"]["counters"]["exported"] == {"rl_insight": 30}, before
        receiver.wait_for(30, timeout_s=TIMEOUT_S, where=lambda s: s.attributes.get("tag") == run_tag)
        child.release()
        after = child.result(1, timeout_s=TIMEOUT_S * 2)
        finish(child)
    status, counters = after["status"], after["status"]["counters"]
    assert after["flushed"] is True
    assert after["balance"] == 0 and counters["ended"] == 60, counters
    # The spans after the kill did not vanish: the hub could not confirm them, so
    # they went to the fallback, and status() says why.
    assert counters["exported"] == {"rl_insight": 30}, counters
    assert counters["fallback"] == 30, counters
    assert sorted(after["fallback"]) == [["after", i] for i in range(30)]
    assert status["reason"] == "hub_unavailable", status
    assert "ActorDiedError" in status["detail"], status["detail"]
    assert status["exporter"] == "memory (fallback)"
    arrived = Counter(s.attributes.get("phase") for s in tagged(receiver.spans, run_tag))
    assert arrived == Counter({"before": 30}), arrived


# --------------------------------------------------- discovery down at start

_DISCOVERY_DOWN = """
ray = attach_ray()
bridge = make_bridge(rl_insight_transport="auto", experiment_name="discovery-down", max_export_batch_size=10)
emit(bridge, "down", 20)
flushed = bridge.force_flush(30)
import rl_insight, rl_insight.api
for i in range(5):  # RL-Insight's own API, directly: returns normally
    rl_insight.trace_span(name="fault.direct", start_time_ns=time.time_ns(), end_time_ns=time.time_ns(),
                          attributes={"tag": TAG, "phase": "direct", "i": i})
# Asked through trace_span's own handle, so the answer comes after those 5 events.
hub = ray.get(rl_insight.api._STATE.client._actor.get_status.remote(), timeout=30)
report({"flushed": flushed, "hub": hub, **summary(bridge)})
wait_release()  # the test started the discovery server

deadline = time.monotonic() + 60
while bridge.status()["rl_insight_transport"] != "otlp":  # discovery is retried with backoff
    if time.monotonic() > deadline:
        raise SystemExit("the bridge never switched to otlp")
    emit(bridge, "switching", 1)
    bridge.force_flush(30)
    time.sleep(0.1)
with bridge.session(sample=TAG, session="up") as session:
    with session.turn(0):
        emit(bridge, "up", 5)
report({"flushed": bridge.force_flush(30), **summary(bridge)})
bridge.shutdown()
"""


def test_discovery_server_down_at_start(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    receiver = rl_insight_hub.receiver
    server = DiscoveryServer(otlp_port=receiver.port)  # not started: nothing listens on its port
    try:
        with ray_child(rl_insight_hub, _DISCOVERY_DOWN, run_tag, server.url) as child:
            down = child.result(0, timeout_s=TIMEOUT_S * 2)
            server.start()
            child.release()
            up = child.result(1, timeout_s=TIMEOUT_S * 2)
            finish(child)
    finally:
        server.close()

    # RL-Insight: its hub started without a trace endpoint and drops every span,
    # while trace_span returned normally and events_applied counted them.
    assert down["hub"]["otel_traces_enabled"] is False, down["hub"]
    assert down["hub"]["events_applied"] >= 5, down["hub"]  # it got them, and dropped them
    # The bridge: discovery failure reported, hub used, and the hub's silence caught.
    status, counters = down["status"], down["status"]["counters"]
    assert down["flushed"] is True
    assert status["rl_insight_transport"] == "hub", status
    assert (
        "discovery at" in status["exporters"]["rl_insight"]["last_error"]
        and "failed" in status["exporters"]["rl_insight"]["last_error"]
    ), status
    assert status["reason"] == "hub_no_traces", status
    assert down["balance"] == 0 and counters["fallback"] == 20 and not counters["exported"], counters

    # After the server came back, the bridge rediscovered it and went direct.
    status, counters = up["status"], up["status"]["counters"]
    assert up["flushed"] is True and up["balance"] == 0, counters
    assert status["rl_insight_transport"] == "otlp" and status["exporters"]["rl_insight"]["last_error"] is None, status
    assert counters["exported"]["rl_insight_otlp"] >= 7, counters  # 5 "up" spans + turn + session
    assert counters["fallback"] == counters["ended"] - counters["exported"]["rl_insight_otlp"], counters
    assert {phase for phase, _ in up["fallback"]} <= {"down", "switching"}
    up_spans = receiver.wait_for(
        5, timeout_s=TIMEOUT_S, where=lambda s: s.attributes.get("tag") == run_tag and s.attributes.get("phase") == "up"
    )
    assert all(s.parent_span_id for s in up_spans)  # real parent links: the direct path
    assert not [s for s in tagged(receiver.spans, run_tag) if s.attributes.get("phase") in ("down", "direct")]


# ------------------------------------------------------------ slow RL-Insight

BURSTS, BURST = 30, 100


def _end_bursts(bridge: Bridge, tag: str) -> None:
    """Bursts of spans on the caller's thread, a bounded pause between."""
    for burst in range(BURSTS):
        for i in range(BURST):
            with bridge.span("fault.slow", tag=tag, burst=burst, i=i):
                pass
        bridge.force_flush(0.2)  # pacing: lets a healthy exporter drain; a stuck one cannot


def test_a_stuck_rl_insight_fills_the_queue_but_never_holds_the_caller(
    rl_insight_hub: RlInsightHub, run_tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl_insight

    real = rl_insight.trace_span
    released = threading.Event()

    def stuck(**kwargs: Any) -> None:
        released.wait(TIMEOUT_S)  # RL-Insight answers nothing until the test releases it
        real(**kwargs)

    monkeypatch.setattr(rl_insight, "trace_span", stuck)
    bridge = make_bridge(rl_insight_hub.server.url, max_queue_size=256, max_export_batch_size=64)
    try:
        done = threading.Event()
        caller = threading.Thread(target=lambda: (_end_bursts(bridge, run_tag), done.set()), daemon=True)
        caller.start()
        # A caller that waited for RL-Insight could not end its spans while it is stuck;
        # the bound only keeps a failure from hanging.
        ended_while_stuck = done.wait(TIMEOUT_S / 2)
        while_stuck = bridge.status()["counters"]
        released.set()
        caller.join(TIMEOUT_S)
        assert ended_while_stuck, "the caller's spans waited for a stuck RL-Insight"
        assert bridge.force_flush(TIMEOUT_S)
        counters = bridge.status()["counters"]
    finally:
        released.set()
        bridge.shutdown()
    # The queue filled: the rest went to the spill (or, past it, were dropped), all counted.
    assert while_stuck["ended"] == BURSTS * BURST, while_stuck
    assert while_stuck["spilled"] + while_stuck["dropped"] > 0, while_stuck
    assert balance(counters) == 0 and counters["ended"] == BURSTS * BURST, counters
    assert counters["exported"]["rl_insight"] + counters["spilled"] + counters["dropped"] == counters["ended"], counters
