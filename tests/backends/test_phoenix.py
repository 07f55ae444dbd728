"""The simulated agent loop, sent with ``exporter: otlp``, read back through Phoenix's GraphQL API."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import ARRIVAL_S, Phoenix, assert_loopback_listeners, doctor, screenshot, send_agent_loop
from simulated import Sent
from stack import wait_until

PROJECT = "verl-otel-bridge-phoenix"
PROJECT_QUERY = """
query ($filter: String) { projects { edges { node { id name traceCount tokenCountPrompt tokenCountCompletion
  sessions(first: 1000) { edges { node { sessionId numTraces tokenUsage { prompt completion total }
    rootSpan: traces(first: 10) { edges { node { traceId rootSpan { statusCode } } } } } } }
  spans(first: 1000, filterCondition: $filter) { edges { node { name spanKind statusCode statusMessage parentId
    attributes input { value } output { value } } } } } } } }
"""


# Only the span list while waiting: Phoenix caches aggregates (token counts) and invalidates
# them after inserts asynchronously, so asking for them before every span is in can read stale ones.
ARRIVED_QUERY = "{ projects { edges { node { name spans(first: 1000) { edges { node { id } } } } } } }"


def project(phoenix: Phoenix, filter: str | None = None, query: str = PROJECT_QUERY) -> dict[str, Any] | None:
    data = phoenix.graphql(query, **({"filter": filter} if query is PROJECT_QUERY else {}))
    return next((e["node"] for e in data["projects"]["edges"] if e["node"]["name"] == PROJECT), None)


def spans_of(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(e["node"], attributes=json.loads(e["node"]["attributes"])) for e in node["spans"]["edges"]]


@pytest.fixture(scope="module")
def received(phoenix: Phoenix) -> tuple[Sent, dict[str, Any], list[dict[str, Any]]]:
    sent, status = send_agent_loop(f"{phoenix.server.url}/v1/traces", PROJECT)
    assert status["counters"]["failed"] == 0 and status["exporters"]["otlp"]["last_error"] is None, status

    def arrived() -> bool:
        node = project(phoenix, query=ARRIVED_QUERY)
        return node is not None and len(node["spans"]["edges"]) == sent.spans

    wait_until(arrived, ARRIVAL_S, interval_s=0.5, message=f"Phoenix did not show {sent.spans} spans")
    node = project(phoenix)
    assert node is not None
    return sent, node, spans_of(node)


def test_every_phoenix_listener_is_loopback_only(phoenix: Phoenix) -> None:
    listeners = assert_loopback_listeners(phoenix.server)
    ports = {port for _, port in listeners}
    assert phoenix.grpc_port in ports  # the gRPC listener Phoenix binds to [::] ...
    assert {ip for ip, port in listeners if port == phoenix.grpc_port} <= {"::", "0.0.0.0", "::1", "127.0.0.1"}
    assert ports == {int(phoenix.server.url.rsplit(":", 1)[1]), phoenix.grpc_port}  # ... and nothing else


def test_spans_land_in_the_project_with_one_session_per_conversation(received: Any) -> None:
    sent, node, _ = received
    sessions = {e["node"]["sessionId"]: e["node"] for e in node["sessions"]["edges"]}
    assert set(sessions) == set(sent.conversations)
    assert all(session["numTraces"] == 1 for session in sessions.values())
    assert node["traceCount"] == len(sent.conversations)


def test_every_span_has_a_kind(received: Any) -> None:
    _, _, spans = received
    kinds = Counter((s["name"], s["attributes"].get("type"), s["spanKind"]) for s in spans)
    per = len(received[0].conversations)
    assert kinds == {
        ("agent_session", None, "agent"): per,
        ("agent_task", None, "chain"): per,
        ("agent_turn", "generate", "llm"): 2 * per,
        ("agent_turn", "tool", "tool"): per,
        ("tool_call", None, "chain"): per,
        ("reward_model", None, "evaluator"): per,
    }


def test_token_totals_equal_what_was_sent(received: Any) -> None:
    sent, node, _ = received
    assert (node["tokenCountPrompt"], node["tokenCountCompletion"]) == (sent.prompt_tokens, sent.completion_tokens)
    usage = [e["node"]["tokenUsage"] for e in node["sessions"]["edges"]]
    assert sum(u["prompt"] for u in usage) == sent.prompt_tokens
    assert sum(u["total"] for u in usage) == sent.prompt_tokens + sent.completion_tokens


def test_inputs_outputs_and_chat_messages_show(received: Any) -> None:
    _, _, spans = received
    for span in spans:
        if span["name"] in ("agent_session", "agent_task", "agent_turn"):
            assert span["input"] and span["input"]["value"], span
            assert span["output"] and span["output"]["value"], span
    generate = [s for s in spans if s["attributes"].get("type") == "generate"]
    # Phoenix keeps the GenAI messages as sent; its chat view reads them
    assert all(s["attributes"]["gen_ai"]["input"]["messages"] for s in generate)
    assert all(s["attributes"]["gen_ai"]["output"]["messages"] for s in generate)
    tools = [s for s in spans if s["attributes"].get("type") == "tool"]
    assert all(s["attributes"]["gen_ai"]["tool"]["call"]["result"].startswith("42") for s in tools)


def test_the_failed_session_is_an_error_trace(received: Any) -> None:
    sent, node, spans = received
    roots = {s["attributes"]["session"]["id"]: s for s in spans if s["parentId"] is None}
    assert set(roots) == set(sent.conversations)
    errors = {cid for cid, root in roots.items() if root["statusCode"] == "ERROR"}
    assert errors == set(sent.failed)
    assert roots[sent.failed[0]]["statusMessage"] == "session finished with status 'failed'"
    failed_session = next(e["node"] for e in node["sessions"]["edges"] if e["node"]["sessionId"] == sent.failed[0])
    assert [t["node"]["rootSpan"]["statusCode"] for t in failed_session["rootSpan"]["edges"]] == ["ERROR"]


def test_reward_is_filterable(phoenix: Phoenix, received: Any) -> None:
    sent, _, _ = received
    node = project(phoenix, "metadata['reward'] > 0.5")
    assert node is not None
    high = {cid for cid, reward in sent.rewards.items() if reward > 0.5}
    assert high and len(high) < len(sent.rewards)
    found = Counter((s["name"], s["attributes"]["session"]["id"]) for s in spans_of(node))
    assert found == {(name, cid): 1 for cid in high for name in ("agent_session", "agent_task", "reward_model")}


def test_doctor_passes_against_phoenix(phoenix: Phoenix, monkeypatch: pytest.MonkeyPatch) -> None:
    code, report, text = doctor(monkeypatch, f"{phoenix.server.url}/v1/traces", "")
    assert code == 0, text
    assert report["route"]["local"]["detail"].endswith("accepts OTLP export requests")


def test_screenshot_of_the_sessions_view(phoenix: Phoenix, received: Any, tmp_path: Path) -> None:
    sent, node, _ = received
    cid = next(iter(sent.conversations))
    shot = screenshot(
        f"{phoenix.server.url}/projects/{node['id']}/sessions",
        "phoenix-sessions",
        tmp_path,
        # a session's first input, last output and user, in one row of the table
        shows=[sent.inputs[cid][:15], sent.outputs[cid], "uid-0"],
        within='[role="row"], tr',
    )
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_screenshot_of_a_sessions_trace_with_its_reward(phoenix: Phoenix, received: Any, tmp_path: Path) -> None:
    sent, node, _ = received
    cid = max(sent.rewards, key=sent.rewards.__getitem__)  # the first of the best sessions
    session = next(e["node"] for e in node["sessions"]["edges"] if e["node"]["sessionId"] == cid)
    [trace] = [t["node"]["traceId"] for t in session["rootSpan"]["edges"]]
    # Phoenix opens a trace on its root span: the session's input, output and metadata (the reward)
    shot = screenshot(
        f"{phoenix.server.url}/projects/{node['id']}/traces/{trace}",
        "phoenix-trace",
        tmp_path,
        shows=[sent.inputs[cid], sent.outputs[cid], "reward", str(sent.rewards[cid])],
    )
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
