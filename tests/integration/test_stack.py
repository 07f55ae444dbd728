"""The integration stack itself, checked against the real rl-insight (no bridge).

Each rl-insight case (none, 0.1.0, 0.2.0, 0.3.0) runs at least one test here.
"""

from __future__ import annotations

import gzip
import http.client
import importlib
import importlib.util
import inspect
import json
import os
import re
import time
from types import SimpleNamespace
from typing import Any

import pytest
from otlp_receiver import OtlpReceiver
from stack import (
    LOOPBACK,
    DiscoveryServer,
    RlInsightHub,
    free_port,
    installed_rl_insight_version,
    listening_addresses,
    run_python,
    wait_until,
)

# ------------------------------------------------------------ every environment


def test_environment_matches_declared_case(rl_insight_case: str) -> None:
    assert installed_rl_insight_version() == rl_insight_case


def _export_body(n: int, tag: str, first: int = 0) -> bytes:
    """A serialized ExportTraceServiceRequest with ``n`` spans of every value type."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value="t"))
    scope = resource_spans.scope_spans.add()
    for i in range(first, first + n):
        span = scope.spans.add(
            name=f"s{i}",
            trace_id=i.to_bytes(16, "big"),
            span_id=(i + 1).to_bytes(8, "big"),
            parent_span_id=b"\x01" * 8 if i % 2 else b"",
            start_time_unix_nano=1_000 + i,
            end_time_unix_nano=2_000 + i,
        )
        span.status.code = Status.STATUS_CODE_ERROR
        span.status.message = "boom"
        span.attributes.extend(
            [
                KeyValue(key="tag", value=AnyValue(string_value=tag)),
                KeyValue(key="i", value=AnyValue(int_value=i)),
                KeyValue(key="f", value=AnyValue(double_value=0.5)),
                KeyValue(key="b", value=AnyValue(bool_value=True)),
            ]
        )
        array = span.attributes.add(key="xs").value.array_value
        array.values.add(string_value="a")
        array.values.add(string_value="b")
    return request.SerializeToString()


def _post(port: int, body: bytes, encoding: str = "") -> int:
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
    headers = {"Content-Type": "application/x-protobuf"}
    if encoding:
        headers["Content-Encoding"] = encoding
    try:
        connection.request("POST", "/v1/traces", body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read()
        assert response.status != 200 or answer == b""  # an empty ExportTraceServiceResponse
        return response.status
    finally:
        connection.close()


def test_receiver_decodes_plain_and_gzip_exports() -> None:
    with OtlpReceiver() as receiver:
        assert _post(receiver.port, _export_body(2, "plain")) == 200
        assert _post(receiver.port, gzip.compress(_export_body(2, "gz", first=2)), "gzip") == 200
        spans = receiver.wait_for(4, timeout_s=5)
    assert [s.name for s in spans] == ["s0", "s1", "s2", "s3"]
    odd = spans[1]
    assert odd.trace_id == (1).to_bytes(16, "big").hex()
    assert odd.span_id == (2).to_bytes(8, "big").hex()
    assert odd.parent_span_id == "01" * 8 and spans[0].parent_span_id is None
    assert (odd.start_time_ns, odd.end_time_ns) == (1_001, 2_001)
    assert odd.attributes == {"tag": "plain", "i": 1, "f": 0.5, "b": True, "xs": ["a", "b"]}
    assert (odd.status_code, odd.status_message) == (2, "boom")
    assert odd.resource == {"service.name": "t"}
    assert spans[3].attributes["tag"] == "gz"


def test_receiver_answers_before_decoding_and_takes_15k_spans_over_one_connection() -> None:
    """The handler only stores bodies (decoding waits for a reader), so a burst is answered as it comes."""
    body = _export_body(512, "load")
    with OtlpReceiver() as receiver:
        assert _post(receiver.port, b"\xff not protobuf") == 200  # accepted unread: decoded only when spans are read
        connection = http.client.HTTPConnection(LOOPBACK, receiver.port, timeout=5)
        for _ in range(30):  # 15,360 spans over one keep-alive connection
            connection.request("POST", "/v1/traces", body=body)
            response = connection.getresponse()
            response.read()
            assert response.status == 200
        connection.close()
        spans = receiver.wait_for(30 * 512, timeout_s=30)
        assert len(receiver.decode_errors) == 1 and receiver.request_count == 31
    assert len(spans) == 15_360 and {span.attributes["tag"] for span in spans} == {"load"}


def test_receiver_failure_mode_and_timeout_message() -> None:
    with OtlpReceiver() as receiver:
        receiver.status = 503
        assert _post(receiver.port, _export_body(1, "x")) == 503
        assert receiver.rejected_count == 1 and receiver.spans == []
        with pytest.raises(AssertionError, match=r"waiting for 1 spans; 0 matching of 0"):
            receiver.wait_for(1, timeout_s=0.2)
        receiver.status = 200
        _post(receiver.port, _export_body(3, "y"))
        assert len(receiver.wait_for(3, timeout_s=5)) == 3
        receiver.clear()
        assert receiver.spans == []


# ----------------------------------------------------------------- per version


@pytest.mark.rl_insight("none")
def test_none_has_no_rl_insight() -> None:
    assert importlib.util.find_spec("rl_insight") is None


@pytest.mark.rl_insight("0.1.0")
def test_0_1_0_is_installed_but_cannot_be_imported() -> None:
    # The 0.1.0 wheel ships rl_insight/__init__.py importing .parser, but not parser.
    with pytest.raises(ModuleNotFoundError) as raised:
        importlib.import_module("rl_insight")
    assert raised.value.name == "rl_insight.parser"


@pytest.mark.rl_insight("0.2.0")
def test_0_2_0_has_online_api_without_trace_span() -> None:
    import rl_insight

    assert not hasattr(rl_insight, "__version__")
    assert not hasattr(rl_insight, "trace_span")
    assert not hasattr(rl_insight, "agent_loop_session")
    assert importlib.util.find_spec("rl_insight.agent_loop") is None
    for name in ("init", "finish", "metric_gauge", "trace_op", "trace_state"):
        assert callable(getattr(rl_insight, name)), name


@pytest.mark.rl_insight("0.3.0")
def test_0_3_0_surface() -> None:
    import rl_insight

    assert rl_insight.__version__ == "0.3.0"
    parameters = inspect.signature(rl_insight.trace_span).parameters
    assert list(parameters) == ["name", "start_time_ns", "end_time_ns", "attributes"]
    assert all(p.kind is p.KEYWORD_ONLY for p in parameters.values())
    assert callable(rl_insight.agent_loop_session)


@pytest.mark.rl_insight("0.2.0", "0.3.0")
def test_discovery_server_advertises_receiver_and_can_stop(
    otlp_receiver: OtlpReceiver,
) -> None:
    with DiscoveryServer(otlp_port=otlp_receiver.port) as server:
        assert server.services() == {
            "status": "ok",
            "otlp_port": otlp_receiver.port,
            "prometheus_port": None,
            "grafana_port": None,
        }
        assert listening_addresses(server.port) == {LOOPBACK}
        server.stop()
        assert not server.running
        with pytest.raises(OSError):
            server.services(timeout_s=1)
        server.start()  # comes back on the same port
        assert server.services()["otlp_port"] == otlp_receiver.port
    with DiscoveryServer(otlp_port=None) as server:
        assert server.services()["otlp_port"] is None


# ------------------------------------------------------- 0.3.0, end to end


@pytest.mark.rl_insight("0.3.0")
def test_ray_and_hub_listen_on_loopback_only(rl_insight_hub: RlInsightHub) -> None:
    assert rl_insight_hub.ray.gcs_address.startswith(f"{LOOPBACK}:")
    assert listening_addresses(rl_insight_hub.metrics_port) == {LOOPBACK}


@pytest.mark.rl_insight("0.3.0")
def test_trace_span_delivers_exact_spans(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    import rl_insight

    base = time.time_ns()
    sent: dict[str, tuple[int, int, dict[str, Any]]] = {}
    for i in range(200):
        attributes = {"tag": run_tag, "i": i, "ratio": i / 8, "ok": i % 2 == 0, "xs": [i, i + 1]}
        start, end = base + i * 1_000_000, base + i * 1_000_000 + 123_456
        rl_insight.trace_span(name=f"stack.span.{i}", start_time_ns=start, end_time_ns=end, attributes=attributes)
        sent[f"stack.span.{i}"] = (start, end, attributes)

    spans = rl_insight_hub.receiver.wait_for(200, timeout_s=30, where=lambda s: s.attributes.get("tag") == run_tag)
    assert len(spans) == 200
    assert {s.name for s in spans} == set(sent)
    labels = {"process_id": str(os.getpid()), "project": "p", "experiment_name": "e"}
    for span in spans:
        start, end, attributes = sent[span.name]
        assert (span.start_time_ns, span.end_time_ns) == (start, end)
        assert span.attributes == {**labels, **attributes}
        assert span.parent_span_id is None  # every trace_span is a root span
        assert span.resource["service.name"] == "rl_insight_monitor"
        assert span.status_code == 0
    assert len({s.trace_id for s in spans}) == 200


@pytest.mark.rl_insight("0.3.0")
def test_agent_loop_session_publishes_gauges_and_session_span(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    import rl_insight

    session = rl_insight.agent_loop_session(experiment_name="e", sample=run_tag, session="s0", global_steps=3)
    session.finish(
        trajectories=[SimpleNamespace(chain_id=1, reward_score=1.0, num_turns=2)],
        status="success",
        runner_name="runner",
    )

    sample = f'sample="{run_tag}"'
    pattern = re.compile(r"^rl_insight_monitor_agent_loop_session_info\{.*" + sample + r".*\} 1\.0$", re.MULTILINE)
    line = wait_until(
        lambda: pattern.search(rl_insight_hub.metrics()),
        20.0,
        interval_s=0.2,
        message="agent_loop_session_info gauge never appeared at the hub's /metrics",
    ).group(0)
    for label in ('experiment_name="e"', 'project="p"', 'global_steps="3"', 'session="s0"'):
        assert label in line

    (span,) = rl_insight_hub.receiver.wait_for(1, timeout_s=20, where=lambda s: s.attributes.get("sample") == run_tag)
    assert span.name == "agent_session"
    assert span.start_time_ns == session.start_ns <= span.end_time_ns
    assert span.attributes["monitor.trace_source"] == "session"
    assert span.attributes["global_steps"] == 3  # an int stays an int
    assert span.attributes["project"] == ""  # the identity's project overrides init's "p"
    assert span.attributes["state_lane_id"] == f"experiment=e/sample={run_tag}/session=s0/traj=0"
    assert span.attributes["num_trajectories"] == 1


@pytest.mark.rl_insight("0.3.0")
def test_second_init_is_ignored_with_a_warning(rl_insight_hub: RlInsightHub) -> None:
    import rl_insight
    import rl_insight.api

    with pytest.warns(RuntimeWarning, match="more than once"):
        rl_insight.init(project="other")
    assert rl_insight.api._STATE.labels["project"] == "p"


_INIT_WITHOUT_RAY = """
import json, os, rl_insight, rl_insight.api as api
os.environ["RL_INSIGHT_SERVER_URL"] = "http://127.0.0.1:9"
rl_insight.init(project="p")
s = api._STATE
print(json.dumps([s.enabled, s.client is None, s.conf is not None, s.labels]))
"""


@pytest.mark.rl_insight("0.3.0")
def test_init_without_ray_stays_disabled_but_keeps_config() -> None:
    result = run_python(_INIT_WITHOUT_RAY, timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == '[false, true, true, {"project": "p"}]'
    assert "Ray is not initialized; monitoring is disabled" in result.stderr


_CLIENT_OF_SESSION_CLUSTER = """
import json, sys, time, ray, rl_insight
from rl_insight.client.ray_monitor_client import _current_job_actor_name
address, metrics_port, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ray.init(address=address, runtime_env={"env_vars": json.loads(sys.argv[4])})
rl_insight.init(project="p", experiment_name="sub", config={"prometheus": {"metrics_report_port": metrics_port}})
rl_insight.trace_span(name="lost", start_time_ns=1, end_time_ns=2, attributes={"tag": tag})
hub = ray.get_actor(_current_job_actor_name(), namespace="rl-insight-monitor")
print(json.dumps(ray.get(hub.get_status.remote(), timeout=60)))
"""


@pytest.mark.rl_insight("0.3.0")
def test_hub_started_while_server_is_down_drops_spans_silently(rl_insight_hub: RlInsightHub, run_tag: str) -> None:
    # A new Ray job (a fresh process attached to the session cluster) gets its
    # own hub, which asks the discovery server once, at creation.
    with DiscoveryServer(otlp_port=rl_insight_hub.receiver.port) as server:
        server.stop()
        result = run_python(
            _CLIENT_OF_SESSION_CLUSTER,
            env={"RL_INSIGHT_SERVER_URL": server.url},
            args=[
                rl_insight_hub.ray.gcs_address,
                str(free_port()),
                run_tag,
                json.dumps(dict(rl_insight_hub.ray.env)),
            ],
            timeout_s=120,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    status = json.loads(result.stdout.strip().splitlines()[-1])
    assert status["otel_traces_enabled"] is False
    assert status["events_applied"] == 1  # the span reached the hub and was dropped there
    assert not [s for s in rl_insight_hub.receiver.spans if s.attributes.get("tag") == run_tag]
    assert "Failed to fetch RL-Insight server services" in result.stderr
