"""The bridge with OpenTelemetry's own exporters and configuration, end to end on loopback.

* ``exporter="otlp"`` sends straight to any OTLP/HTTP collector (here the
  stack's receiver), in every case environment: the otlp extra is part of the
  test extra, RL-Insight is not involved.
* (0.3.0) ``exporter=["rl_insight", "jsonl"]``: every span reaches RL-Insight's
  trace store *and* the JSONL file.
* (0.3.0) ``OTEL_TRACES_EXPORTER=rl_insight`` in a fresh process that runs the
  SDK's auto-configuration: spans from a plain OpenTelemetry tracer reach the
  receiver through RL-Insight. The child attaches to the session's Ray cluster
  (its own Ray job, so its own hub) and stays alive until its spans arrived.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import stack
from otlp_receiver import OtlpReceiver, ReceivedSpan
from stack import PythonChild, RlInsightHub, bridge_copy_exporter, drain

import verl_otel_bridge as vob
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.identity import IDENTITY_KEYS
from verl_otel_bridge._internal.protocol import GENERIC_IDENTITY_KEYS
from verl_otel_bridge._internal.vocabulary import conversation_id

#: Bound of every wait for spans at a receiver.
ARRIVAL_S = 60.0
#: Bound of a child's run, Ray attach and RL-Insight import included.
CHILD_S = 180.0
T0 = 1_764_000_000_123_456_789


def agent_loop(bridge: vob.Bridge, tag: str) -> None:
    """A small session with every kind of span: the bridge API, ``record_span`` and a plain tracer span."""
    with vob.session(sample=tag, session=0, global_steps=4, uid="u-1"):
        with vob.task("solve"):
            for turn in range(2):
                with vob.turn(turn) as handle:
                    handle.record(prompt_tokens=10 + turn, completion_tokens=2)
                    with vob.span("tool.call", tool="search"):
                        vob.record_span("recorded", start_time_ns=T0, end_time_ns=T0 + 1_000, attributes={"n": turn})
        with bridge.tracer.start_as_current_span("plain.tracer.span"):
            pass


def by_id(spans: list[ReceivedSpan], key: str | None = None) -> dict[str, ReceivedSpan]:
    """Received spans by span id (their own, or the ``key`` attribute); fails on duplicates."""
    ids = [s.span_id if key is None else s.attributes[key] for s in spans]
    assert len(ids) == len(set(ids)), "a span arrived twice"
    return dict(zip(ids, spans))


def hex_id(value: int, width: int = 16) -> str:
    return format(value, f"0{width}x")


# --------------------------------------------------------------------------- 5. exporter="otlp"


@pytest.mark.parametrize("endpoint_from", ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "otlp_endpoint"])
def test_otlp_exporter_delivers_every_span_with_identity_parents_and_resource(
    endpoint_from: str,
    fresh_otlp_receiver: OtlpReceiver,
    make_bridge: Callable[..., vob.Bridge],
    monkeypatch: pytest.MonkeyPatch,
    run_tag: str,
) -> None:
    monkeypatch.setenv("NO_PROXY", stack.LOOPBACK)  # the OTLP exporter honours *_proxy variables
    monkeypatch.setenv("no_proxy", stack.LOOPBACK)
    settings: dict[str, Any] = {
        "exporter": ["otlp", "memory"],
        "service_name": "trainer-otlp",
        "project": "proj",
        "experiment_name": "exp",
        "schedule_delay_ms": 50,
    }
    environ: dict[str, str] = {}
    if endpoint_from == "otlp_endpoint":
        settings["otlp_endpoint"] = fresh_otlp_receiver.url
    else:  # OpenTelemetry's variable, as its own exporter reads it
        environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = fresh_otlp_receiver.url
    bridge = make_bridge(environ=environ, **settings)
    agent_loop(bridge, run_tag)
    assert bridge.force_flush(30)
    had = {hex_id(s.context.span_id): s for s in bridge_copy_exporter(bridge).get_finished_spans()}
    assert len(had) == 1 + 1 + 2 * 3 + 1  # session, task, 2 x (turn, tool.call, recorded), plain

    fresh_otlp_receiver.wait_for(len(had), ARRIVAL_S)
    received = by_id(fresh_otlp_receiver.spans)
    assert set(received) == set(had)
    session = next(s for s in had.values() if s.name == "agent_session")
    identity = {key: session.attributes[key] for key in IDENTITY_KEYS}
    assert identity["sample"] == run_tag and identity["global_steps"] == 4
    # exporter otlp speaks the generic vocabulary: the identity complete, `session` as `session.index`
    sent_identity = {GENERIC_IDENTITY_KEYS.get(key, key): value for key, value in identity.items()}
    conversation = conversation_id(session.attributes)
    assert conversation == f"project=proj/experiment=exp/global_steps=4/sample={run_tag}/session=0/traj=0"
    for span_id, span in had.items():
        got = received[span_id]
        assert got.name == span.name
        assert (got.start_time_ns, got.end_time_ns) == (span.start_time, span.end_time), span.name
        assert got.trace_id == hex_id(session.context.trace_id, 32)
        # real parent ids, not flattened
        assert got.parent_span_id == (hex_id(span.parent.span_id) if span.parent is not None else None), span.name
        assert {key: got.attributes[key] for key in sent_identity} == sent_identity, span.name
        assert "session" not in got.attributes and got.attributes["session.id"] == conversation, span.name
        assert type(got.attributes["global_steps"]) is int
        # the bridge's resource
        assert got.resource["service.name"] == "trainer-otlp"
        assert got.resource["telemetry.sdk.name"] == "opentelemetry"
    recorded = [s for s in received.values() if s.name == "recorded"]
    assert {(s.start_time_ns, s.end_time_ns) for s in recorded} == {(T0, T0 + 1_000)}
    assert all(received[s.parent_span_id].name == "tool.call" for s in recorded)
    assert fresh_otlp_receiver.decode_errors == []

    counters = bridge.status()["counters"]
    assert counters["exported"] == {"otlp": len(had)} and counters["copies.memory"] == len(had)
    assert balance(counters) == 0 and counters["fallback"] == 0 and counters["failed"] == 0


# --------------------------------------------------------------------------- 6. rl_insight + jsonl


@pytest.mark.rl_insight("0.3.0")
@pytest.mark.parametrize("transport", ["hub", "otlp"])
def test_rl_insight_and_jsonl_each_get_every_span(
    transport: str,
    rl_insight_hub: RlInsightHub,
    make_bridge: Callable[..., vob.Bridge],
    tmp_path: Path,
    run_tag: str,
) -> None:
    path = tmp_path / "copies.jsonl"
    bridge = make_bridge(
        exporter=["rl_insight", "jsonl"],
        jsonl_path=str(path),
        rl_insight_transport=transport,
        rl_insight_server_url=rl_insight_hub.server.url,
        project="proj",
        experiment_name="exp",
        schedule_delay_ms=50,
    )
    agent_loop(bridge, run_tag)
    assert bridge.force_flush(30)
    mine = lambda s: s.attributes.get("sample") == run_tag  # noqa: E731
    expected = 9
    rl_insight_hub.receiver.wait_for(expected, ARRIVAL_S, where=mine)
    drain(bridge, rl_insight_hub.receiver)  # nothing else of ours is still on its way
    received = by_id([s for s in rl_insight_hub.receiver.spans if mine(s)], "otel.span_id")
    in_file = {r["span_id"]: r for r in map(json.loads, path.read_text().splitlines())}
    in_file = {k: r for k, r in in_file.items() if r["attributes"].get("sample") == run_tag}

    assert len(in_file) == expected
    assert set(received) == set(in_file)
    for span_id, record in in_file.items():
        got = received[span_id]
        assert got.name == record["name"]
        assert (got.start_time_ns, got.end_time_ns) == (record["start_time_ns"], record["end_time_ns"])
        assert got.attributes["otel.trace_id"] == record["trace_id"]
        assert got.attributes["otel.parent_span_id"] == (record["parent_span_id"] or "")
        assert {k: got.attributes[k] for k in IDENTITY_KEYS} == {k: record["attributes"][k] for k in IDENTITY_KEYS}
        assert got.resource["service.name"] == "rl_insight_monitor"  # as RL-Insight's hub sends it
        if transport == "otlp":  # straight to the trace store: real parent links
            assert got.parent_span_id == record["parent_span_id"]
    status = bridge.status()
    counters = status["counters"]
    forwarded = "rl_insight" if transport == "hub" else "rl_insight_otlp"
    assert status["rl_insight_transport"] == transport and status["reason"] == "ok", status
    assert counters["exported"] == {forwarded: expected + 1}, counters  # + the drain span
    assert counters["copies.jsonl"] == expected + 1 and counters["fallback"] == 0 and balance(counters) == 0


# --------------------------------------------------------------------------- 7. OTEL_TRACES_EXPORTER


_AUTOCONFIGURED_CHILD = """
import json, sys
import ray

tag, address, ray_env = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ray.init(address=address, runtime_env={"env_vars": ray_env})

from opentelemetry.sdk._configuration import _OTelSDKConfigurator
_OTelSDKConfigurator().configure()
from opentelemetry import trace

provider = trace.get_tracer_provider()
exporters = [getattr(p, "span_exporter", None) for p in provider._active_span_processor._span_processors]
tracer = trace.get_tracer("my.app")
made = []
with tracer.start_as_current_span("request", attributes={"tag": tag}) as root:
    for i in range(3):
        with tracer.start_as_current_span("step", attributes={"tag": tag, "i": i}) as step:
            pass
        made.append(step)
made.append(root)
provider.shutdown()  # flushes the SDK's batch processor into the exporter
spans = [{"name": s.name, "span_id": format(s.context.span_id, "016x"), "trace_id": format(s.context.trace_id, "032x"),
          "parent_span_id": format(s.parent.span_id, "016x") if s.parent else "",
          "start": s.start_time, "end": s.end_time} for s in made]
report({"exporters": [type(e).__module__ + "." + type(e).__qualname__ for e in exporters],
        "status": exporters[0].status(), "spans": spans})
wait_release()  # the hub actor of this Ray job lives as long as this process
"""


@pytest.mark.rl_insight("0.3.0")
@pytest.mark.parametrize("transport", ["hub", "auto"])
def test_otel_traces_exporter_rl_insight_forwards_plain_tracer_spans(
    transport: str, rl_insight_hub: RlInsightHub, run_tag: str
) -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "rl_insight",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "RL_INSIGHT_SERVER_URL": rl_insight_hub.server.url,
        "VERL_OTEL_BRIDGE_PROJECT": f"proj-{run_tag}",
        "VERL_OTEL_BRIDGE_EXPERIMENT_NAME": f"exp-{run_tag}",
        "VERL_OTEL_BRIDGE_RL_INSIGHT_TRANSPORT": transport,
        "VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG": json.dumps({"prometheus": {"metrics_report_port": stack.free_port()}}),
        **stack.RAY_LOOPBACK_ENV,
    }
    args = [run_tag, rl_insight_hub.ray.gcs_address, json.dumps(dict(rl_insight_hub.ray.env))]
    mine = lambda s: s.attributes.get("tag") == run_tag  # noqa: E731
    with PythonChild(_AUTOCONFIGURED_CHILD, env=env, args=args) as child:
        result = child.result(timeout_s=CHILD_S)
        rl_insight_hub.receiver.wait_for(4, ARRIVAL_S, where=mine)
        done = child.finish(timeout_s=60)
    assert done.returncode == 0, done.stderr[-4000:]
    assert result["exporters"] == ["verl_otel_bridge._internal.rl_insight.exporter.RLInsightSpanExporter"]
    status = result["status"]
    assert status["reason"] == "ok" and status["exporter"] == "rl_insight", status
    assert status["rl_insight_transport"] == ("hub" if transport == "hub" else "otlp"), status
    forwarded = "rl_insight" if transport == "hub" else "rl_insight_otlp"
    assert status["counters"]["exported"] == {forwarded: 4} and status["counters"]["fallback"] == 0, status

    received = by_id([s for s in rl_insight_hub.receiver.spans if mine(s)], "otel.span_id")
    made = {s["span_id"]: s for s in result["spans"]}
    assert set(received) == set(made)
    for span_id, span in made.items():
        got = received[span_id]
        assert got.name == span["name"]
        assert (got.start_time_ns, got.end_time_ns) == (span["start"], span["end"])
        assert got.attributes["otel.trace_id"] == span["trace_id"]
        assert got.attributes["otel.parent_span_id"] == span["parent_span_id"]
        # rl_insight.init ran in the child with the project and experiment from the environment
        assert (got.attributes["project"], got.attributes["experiment_name"]) == (f"proj-{run_tag}", f"exp-{run_tag}")
        assert got.resource["service.name"] == "rl_insight_monitor"
        if transport == "auto":  # the direct path keeps real parent links
            assert (got.parent_span_id or "") == span["parent_span_id"]
    assert sorted(s["name"] for s in made.values()) == ["request", "step", "step", "step"]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
