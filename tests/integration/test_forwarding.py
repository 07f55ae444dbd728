"""The bridge forwarding to the real RL-Insight 0.3.0, through its hub, checked at the OTLP receiver.

Every span the bridge makes (``session``, ``span``, ``record_span``, ``task``,
``turn``, ``traced`` and plain tracer spans) must reach RL-Insight's trace store
through ``rl_insight.trace_span`` and the monitor hub, unchanged: name, times to
the nanosecond, identity (``global_steps`` an integer), the bridge's own ids as
``otel.*`` attributes, and its status. What the bridge had is read from a copy
exporter (``exporter=["rl_insight", "memory"]``); what RL-Insight delivered is
read at the receiver standing in for Tempo.

In this process the session-scoped ``rl_insight_hub`` fixture already called
``rl_insight.init(project="p", experiment_name="e")``; so tests that must see
the bridge's *own* ``init`` run in a fresh child process.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import pytest
import stack
from otlp_receiver import ReceivedSpan
from stack import INIT_SPY_PREAMBLE, PythonChild, RlInsightHub, bridge_copy_exporter, drain, hex_ids
from threads import burst

import verl_otel_bridge as vob
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

pytestmark = pytest.mark.rl_insight("0.3.0")

T0 = 1_764_000_000_123_456_789  # an arbitrary time, to the nanosecond
#: Bound of every wait for spans to reach the receiver through the hub.
ARRIVAL_S = 60.0


def _plain(value: Any) -> Any:
    """Attribute values as the receiver decodes them (OpenTelemetry arrays -> lists)."""
    return list(value) if isinstance(value, tuple) else value


def hub_bridge(make_bridge: Callable[..., vob.Bridge], hub: RlInsightHub, **settings: Any) -> vob.Bridge:
    """A current bridge forwarding through RL-Insight's hub, with a memory copy of every span."""
    config: dict[str, Any] = {
        "exporter": ["rl_insight", "memory"],
        "rl_insight_transport": "hub",
        "rl_insight_server_url": hub.server.url,
        "project": "proj",
        "experiment_name": "exp",
        "schedule_delay_ms": 50,
    }
    config.update(settings)
    return make_bridge(**config)


def copies(bridge: vob.Bridge) -> list[Any]:
    """What the bridge had: the spans its memory copy received (after a flush)."""
    assert bridge.force_flush(30)
    return list(bridge_copy_exporter(bridge).get_finished_spans())


def expected_attributes(span: Any, *, init_labels: dict[str, str]) -> dict[str, Any]:
    """What RL-Insight should deliver for a bridge span, computed from the span alone."""
    attributes: dict[str, Any] = {"process_id": str(os.getpid()), **init_labels}
    attributes.update({key: _plain(value) for key, value in (span.attributes or {}).items()})
    attributes.update(hex_ids(span))
    attributes["otel.status_code"] = span.status.status_code.name
    if span.status.description:
        attributes["otel.status_description"] = span.status.description
    for event in span.events:
        if event.name == "exception":
            attributes["exception.type"] = event.attributes["exception.type"]
            attributes["exception.message"] = event.attributes["exception.message"]
            break
    return attributes


def by_span_id(received: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    ids = [span.attributes["otel.span_id"] for span in received]
    assert len(ids) == len(set(ids)), "a span arrived twice"
    return dict(zip(ids, received))


# --------------------------------------------------------------------------- every span kind


def test_every_kind_of_span_arrives_through_the_hub_exactly(
    rl_insight_hub: RlInsightHub, make_bridge: Callable[..., vob.Bridge], run_tag: str
) -> None:
    bridge = hub_bridge(make_bridge, rl_insight_hub)

    @vob.traced("traced.function")
    def traced_function() -> None:
        pass

    with vob.session(sample=run_tag, session="s 1/a", traj=2, uid="uid/7 x", global_steps=7, session_id="conv-1") as s:
        with vob.span("plain.span", note="hello", ratio=0.25, flags=[True, False]):
            vob.record_span("recorded", start_time_ns=T0, end_time_ns=T0 + 123_456_789, attributes={"tokens": 5})
        with vob.task("solve") as task:
            with vob.turn(0) as turn:
                turn.record(prompt_tokens=12, completion_tokens=3, finish_reason="tool_calls", tools=["search"])
            with s.turn(1, type="tool") as turn:
                turn.record(tools="search", tool_args={"q": "x"})
            task.set_result(status="success", reward=1.0, accuracy=0.5, finished=True, reward_posted=True)
        with bridge.tracer.start_as_current_span("tracer.span") as plain:
            plain.set_attribute("k", 1)
        traced_function()
        with pytest.raises(ValueError):
            with vob.span("raising.span"):
                raise ValueError("bad args")
        s.finish(status="success", runner_name="r", trajectories=[{"chain_id": 1, "reward_score": 1.0, "num_turns": 2}])

    had = copies(bridge)
    names = sorted(span.name for span in had)
    assert names == sorted(
        [
            "agent_session",
            "plain.span",
            "recorded",
            "agent_task",
            "agent_turn",
            "agent_turn",
            "tracer.span",
            "traced.function",
            "raising.span",
        ]
    )
    received = rl_insight_hub.receiver.wait_for(
        len(had), ARRIVAL_S, where=lambda s: s.attributes.get("sample") == run_tag
    )
    drain(bridge, rl_insight_hub.receiver)
    received = [s for s in rl_insight_hub.receiver.spans if s.attributes.get("sample") == run_tag]
    arrived = by_span_id(received)
    assert len(arrived) == len(had)

    session_copy = next(span for span in had if span.name == "agent_session")
    identity = {key: session_copy.attributes[key] for key in IDENTITY_KEYS}
    assert (
        identity["global_steps"] == 7
        and identity["state_lane_id"] == f"experiment=exp/sample={run_tag}/session=s 1/a/traj=2"
    )
    trace_id = format(session_copy.get_span_context().trace_id, "032x")
    for span in had:
        got = arrived[hex_ids(span)["otel.span_id"]]
        # name, times to the nanosecond, every attribute (identity, ids, status) exactly
        assert got.name == span.name
        assert (got.start_time_ns, got.end_time_ns) == (span.start_time, span.end_time), span.name
        assert got.attributes == expected_attributes(span, init_labels={"project": "p", "experiment_name": "e"}), (
            span.name
        )
        assert {key: got.attributes[key] for key in IDENTITY_KEYS} == identity
        assert type(got.attributes["global_steps"]) is int
        assert got.attributes["otel.trace_id"] == trace_id
        # the hub's path: every span re-created as a root span of RL-Insight's service
        assert got.parent_span_id is None
        assert got.resource["service.name"] == "rl_insight_monitor"

    recorded = arrived[hex_ids(next(s for s in had if s.name == "recorded"))["otel.span_id"]]
    assert (recorded.start_time_ns, recorded.end_time_ns) == (T0, T0 + 123_456_789)
    parent_of = {name: next(s for s in had if s.name == name) for name in ("plain.span", "agent_session", "agent_task")}
    assert recorded.attributes["otel.parent_span_id"] == hex_ids(parent_of["plain.span"])["otel.span_id"]
    task_got = next(s for s in received if s.name == "agent_task")
    assert task_got.attributes["otel.parent_span_id"] == hex_ids(parent_of["agent_session"])["otel.span_id"]
    assert (
        session_copy.parent is None
        and arrived[hex_ids(session_copy)["otel.span_id"]].attributes["otel.parent_span_id"] == ""
    )
    failed = next(s for s in received if s.name == "raising.span")
    assert failed.attributes["otel.status_code"] == "ERROR"
    assert (failed.attributes["exception.type"], failed.attributes["exception.message"]) == ("ValueError", "bad args")
    assert "bad args" in failed.attributes["otel.status_description"]
    assert {s.attributes["otel.status_code"] for s in received if s.name != "raising.span"} == {"UNSET"}

    counters = bridge.status()["counters"]
    assert counters["exported"] == {"rl_insight": len(had) + 1} and counters["fallback"] == 0  # + the drain span
    assert balance(counters) == 0
    assert bridge.status()["rl_insight_transport"] == "hub"


def test_one_agent_session_span_per_session_with_finish_fields(
    rl_insight_hub: RlInsightHub, make_bridge: Callable[..., vob.Bridge], run_tag: str
) -> None:
    bridge = hub_bridge(make_bridge, rl_insight_hub)
    with vob.session(sample=run_tag, session=0, global_steps=3) as s:
        with s.turn(0):
            pass
        s.finish(
            status="done",
            trajectories=[{"chain_id": 1, "reward_score": 0.5, "num_turns": 1}, {"chain_id": 2}],
            runner_name="runner",
            reward_source="rule",
            finished=True,
        )
    with vob.session(sample=run_tag, session=1, global_steps=3):
        pass  # finished by the block's end
    with pytest.raises(RuntimeError):
        with vob.session(sample=run_tag, session=2, global_steps=3):
            raise RuntimeError("boom")

    had = {span.attributes["session"]: span for span in copies(bridge) if span.name == "agent_session"}
    assert sorted(had) == ["0", "1", "2"]
    drain(bridge, rl_insight_hub.receiver)
    sessions = [
        s
        for s in rl_insight_hub.receiver.spans
        if s.attributes.get("sample") == run_tag and s.attributes.get("monitor.trace_source") == "session"
    ]
    assert sorted(s.attributes["session"] for s in sessions) == ["0", "1", "2"]  # exactly one each
    assert all(s.name == "agent_session" for s in sessions)
    got = {s.attributes["session"]: s for s in sessions}
    expected = {
        "0": {
            "status": "done",
            "runner_name": "runner",
            "num_trajectories": 2,
            "reward_source": "rule",
            "finished": True,
        },
        "1": {"status": "success", "runner_name": "", "num_trajectories": 0, "reward_source": "", "finished": ""},
        "2": {"status": "error", "runner_name": "", "num_trajectories": 0, "reward_source": "", "finished": ""},
    }
    for key, fields in expected.items():
        attributes = got[key].attributes
        assert {name: attributes[name] for name in fields} == fields, key
        assert (got[key].start_time_ns, got[key].end_time_ns) == (had[key].start_time, had[key].end_time)
        assert attributes["global_steps"] == 3 and attributes["otel.parent_span_id"] == ""
    assert got["2"].attributes["otel.status_code"] == "ERROR"
    assert json.loads(got["0"].attributes["monitor.trajectories"])[0] == {
        "chain_id": 1,
        "reward_score": 0.5,
        "num_turns": 1,
    }


# --------------------------------------------------------------------------- volume


BURST_THREADS = 8
BURST_SPANS = 5_000


def test_burst_of_5000_spans_from_8_threads_all_arrive_once(
    rl_insight_hub: RlInsightHub, make_bridge: Callable[..., vob.Bridge], run_tag: str
) -> None:
    # The queue must hold the whole burst: 8 threads end spans far faster than one
    # thread can make ~106 us Ray calls, and a full queue drops (by design, counted).
    bridge = hub_bridge(make_bridge, rl_insight_hub, max_queue_size=BURST_SPANS + 1_000)
    burst(bridge, BURST_SPANS, BURST_THREADS, burst_tag=run_tag)
    assert bridge.force_flush(120)
    counters = bridge.status()["counters"]
    assert balance(counters) == 0, counters
    assert (counters["ended"], counters["dropped"], counters["failed"], counters["fallback"]) == (BURST_SPANS, 0, 0, 0)
    assert counters["exported"] == {"rl_insight": BURST_SPANS}

    mine = lambda s: s.attributes.get("burst_tag") == run_tag  # noqa: E731
    rl_insight_hub.receiver.wait_for(BURST_SPANS, 180, where=mine)
    drain(bridge, rl_insight_hub.receiver)
    received = [s for s in rl_insight_hub.receiver.spans if mine(s)]
    assert len(received) == BURST_SPANS, f"{len(received)} arrived (duplicates?)"
    assert sorted(s.attributes["n"] for s in received) == list(range(BURST_SPANS))
    assert len({s.attributes["otel.span_id"] for s in received}) == BURST_SPANS
    had = {hex_ids(s)["otel.span_id"]: s for s in copies(bridge) if (s.attributes or {}).get("burst_tag") == run_tag}
    for span in received:
        original = had[span.attributes["otel.span_id"]]
        assert (span.name, span.start_time_ns, span.end_time_ns) == (
            original.name,
            original.start_time,
            original.end_time,
        )


# --------------------------------------------------------------------------- preconditions


def test_no_server_url_falls_back_with_a_warning_and_sends_nothing(
    rl_insight_hub: RlInsightHub,
    make_bridge: Callable[..., vob.Bridge],
    run_tag: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import rl_insight

    calls: list[str] = []
    real_trace_span = rl_insight.trace_span
    monkeypatch.setattr(rl_insight, "trace_span", lambda **kw: calls.append(kw["name"]) or real_trace_span(**kw))
    monkeypatch.setattr(rl_insight, "init", lambda *a, **kw: calls.append("init"))
    monkeypatch.delenv("RL_INSIGHT_SERVER_URL")
    caplog.set_level(logging.INFO, logger="verl_otel_bridge")
    bridge = make_bridge(exporter="rl_insight", project="proj", experiment_name="exp", schedule_delay_ms=50)
    for round_ in range(3):  # three separate exports, one warning
        with vob.session(sample=run_tag, session=round_, global_steps=round_):
            with vob.turn(0):
                pass
        assert bridge.force_flush(30)

    status = bridge.status()
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", "no_server_url")
    assert "RL_INSIGHT_SERVER_URL is not set" in status["detail"] and "rl-insight 0.3.0" in status["detail"]
    said = [r for r in caplog.records if "not usable" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "no_server_url" in said[0].getMessage() and "RL_INSIGHT_SERVER_URL" in said[0].getMessage()
    spans = bridge.memory_exporter.get_finished_spans()
    assert len(spans) == 6 and all(s.attributes["state_lane_id"].startswith("experiment=exp/") for s in spans)
    assert sorted(s.attributes["global_steps"] for s in spans if s.name == "agent_session") == [0, 1, 2]
    counters = status["counters"]
    assert (counters["fallback"], counters["exported"], balance(counters)) == (6, {}, 0)
    assert calls == []  # neither trace_span nor init was called
    # and RL-Insight's store got nothing: a marker sent directly after the bridge's exports arrives alone
    real_trace_span(name="marker", start_time_ns=T0, end_time_ns=T0 + 1, attributes={"sample": run_tag})
    rl_insight_hub.receiver.wait_for(1, ARRIVAL_S, where=lambda s: s.attributes.get("sample") == run_tag)
    assert [s.name for s in rl_insight_hub.receiver.spans if s.attributes.get("sample") == run_tag] == ["marker"]


_RAY_NOT_INITIALIZED = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
import rl_insight
import verl_otel_bridge as vob

calls = []
real_init = rl_insight.init
rl_insight.init = lambda *a, **kw: calls.append("init")
rl_insight.trace_span = lambda **kw: calls.append(kw["name"])
tag = sys.argv[1]
bridge = vob.configure(exporter="rl_insight", project="proj", experiment_name="exp", schedule_delay_ms=50)
for i in range(3):
    with vob.session(sample=tag, session=i, global_steps=5):
        with vob.span("work"):
            pass
    bridge.force_flush(30)
spans = bridge.memory_exporter.get_finished_spans()
report({"status": bridge.status(), "calls": calls, "ray_imported": "ray" in sys.modules,
        "identities": [dict(s.attributes) for s in spans]})
"""


def test_ray_not_initialized_falls_back_with_a_warning_and_sends_nothing(
    rl_insight_hub: RlInsightHub, run_tag: str
) -> None:
    # A fresh process with RL_INSIGHT_SERVER_URL set (inherited) but no ray.init().
    assert os.environ["RL_INSIGHT_SERVER_URL"] == rl_insight_hub.server.url
    with PythonChild(_RAY_NOT_INITIALIZED, args=[run_tag]) as child:
        result = child.result(timeout_s=120)
        done = child.finish()
    assert done.returncode == 0, done.stderr[-3000:]
    status = result["status"]
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", "ray_not_initialized")
    assert "Ray is not initialized" in status["detail"] and "rl-insight 0.3.0" in status["detail"]
    assert result["calls"] == []
    warnings = [line for line in done.stderr.splitlines() if "not usable" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING") and "ray_not_initialized" in warnings[0], warnings
    assert "Traceback" not in done.stderr
    assert len(result["identities"]) == 6
    assert all(a["global_steps"] == 5 and a["sample"] == run_tag for a in result["identities"])
    counters = status["counters"]
    assert (counters["fallback"], counters["exported"], balance(counters)) == (6, {}, 0)
    # the child exited after its flush: anything it had sent (OTLP directly) would be here by now
    assert not [s for s in rl_insight_hub.receiver.spans if s.attributes.get("sample") == run_tag]


# --------------------------------------------------------------------------- init, in a fresh process


_INIT_ONCE = (
    INIT_SPY_PREAMBLE
    + """

address, metrics_port, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ray.init(address=address, runtime_env={"env_vars": json.loads(sys.argv[4])})
settings = dict(exporter=["rl_insight", "memory"], rl_insight_transport="hub", project="proj-" + tag,
                experiment_name="exp-" + tag, schedule_delay_ms=20,
                rl_insight_config={"prometheus": {"metrics_report_port": metrics_port}})
first = vob.configure(**settings)
barrier = threading.Barrier(16, timeout=60)
def work(i):
    barrier.wait()
    for j in range(5):
        with vob.span("outside.session", tag=tag, i=i, j=j):
            first.force_flush(30)  # many exports, from many threads, while init may be running
    with vob.session(sample=tag, session=i, global_steps=i):
        with vob.turn(0):
            pass
threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
for t in threads: t.start()
for t in threads: t.join(120)
first.force_flush(60)
second = vob.configure(**settings)  # a second bridge in the same process
with vob.span("second.bridge", tag=tag):
    pass
second.force_flush(60)
report({"calls": calls, "warnings": caught, "status": second.status(), "first": first.status(),
        "init_calls": rl_insight_compat.init_calls(), "enabled": rl_insight.api._STATE.enabled,
        "labels": rl_insight.api._STATE.labels, "pid": __import__("os").getpid()})
wait_release()
"""
)


def test_bridge_runs_rl_insight_init_once_per_process_with_its_project(
    rl_insight_hub: RlInsightHub, run_tag: str
) -> None:
    metrics_port = stack.free_port()
    args = [rl_insight_hub.ray.gcs_address, str(metrics_port), run_tag, json.dumps(dict(rl_insight_hub.ray.env))]
    with PythonChild(_INIT_ONCE, args=args) as child:
        result = child.result(timeout_s=180)
        expected = 16 * 5 + 16 * 2 + 1
        mine = lambda s: s.attributes.get("tag") == run_tag or s.attributes.get("sample") == run_tag  # noqa: E731
        received = rl_insight_hub.receiver.wait_for(expected, ARRIVAL_S, where=mine)
        done = child.finish()
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(result["calls"]) == 1, result["calls"]
    call = result["calls"][0]
    assert call["args"] == []
    kwargs = call["kwargs"]
    assert (kwargs["project"], kwargs["experiment_name"]) == (f"proj-{run_tag}", f"exp-{run_tag}")
    assert kwargs["config"]["prometheus"] == {"metrics_report_port": metrics_port}
    assert kwargs["config"]["server"]["url"] == rl_insight_hub.server.url
    assert not [w for w in result["warnings"] if "more than once" in w], result["warnings"]
    assert "more than once" not in done.stderr
    assert result["init_calls"] == 1 and result["enabled"] is True
    assert result["labels"] == {"project": f"proj-{run_tag}", "experiment_name": f"exp-{run_tag}"}
    for status in (result["first"], result["status"]):
        assert status["reason"] == "ok" and balance(status["counters"]) == 0
    # every span arrived once; spans outside a session carry init's labels, so init used the configured names
    assert len(received) == expected
    outside = [s for s in received if s.name in ("outside.session", "second.bridge")]
    assert {(s.attributes["project"], s.attributes["experiment_name"]) for s in outside} == {
        (f"proj-{run_tag}", f"exp-{run_tag}")
    }
    assert {s.attributes["process_id"] for s in received} == {str(result["pid"])}


_VERSION_UNKNOWN = """
import importlib.metadata, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
real_version = importlib.metadata.version

def version(name):  # as when rl-insight is vendored or its dist-info is missing
    if name.replace("_", "-") == "rl-insight":
        raise importlib.metadata.PackageNotFoundError(name)
    return real_version(name)

importlib.metadata.version = version
import rl_insight
import verl_otel_bridge as vob

calls = []
rl_insight.init = lambda *a, **kw: calls.append("init")
rl_insight.trace_span = lambda **kw: calls.append(kw["name"])
bridge = vob.configure(exporter="rl_insight", schedule_delay_ms=50)
with vob.session(sample=0, session=0, global_steps=2):
    pass
bridge.force_flush(30)
report({"version": rl_insight.__version__, "status": bridge.status(), "calls": calls,
        "spans": len(bridge.memory_exporter.get_finished_spans())})
"""


def test_real_0_3_0_reporting_version_unknown_is_not_forwarded_to(rl_insight_hub: RlInsightHub) -> None:
    """The real 0.3.0 module says ``__version__ == "unknown"`` when its package metadata is missing."""
    with PythonChild(_VERSION_UNKNOWN) as child:
        result = child.result(timeout_s=120)
        done = child.finish()
    assert done.returncode == 0, done.stderr[-3000:]
    assert result["version"] == "unknown"
    status = result["status"]
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", "version_unparsable")
    assert status["detail"] == "rl_insight.__version__ is 'unknown', not a version (installed: None); requires >= 0.3.0"
    assert (status["rl_insight_version"], status["rl_insight_package_version"]) == ("unknown", None)
    assert status["rl_insight_installed"] is True
    assert result["calls"] == [] and result["spans"] == 1
    said = [line for line in done.stderr.splitlines() if "is not usable" in line]
    assert len(said) == 1 and said[0].startswith("WARNING") and "version_unparsable" in said[0]
