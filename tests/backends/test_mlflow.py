"""The simulated agent loop, sent with ``exporter: otlp``, read back through ``mlflow.search_traces``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import mlflow
import pytest
from conftest import ARRIVAL_S, Mlflow, assert_loopback_listeners, doctor, screenshot, send_agent_loop
from mlflow.entities import TraceState
from simulated import Sent
from stack import wait_until

EXPERIMENT = "verl-otel-bridge-mlflow"


def search(server: Mlflow, filter_string: str | None = None) -> list[Any]:
    mlflow.set_tracking_uri(server.server.url)
    return list(
        mlflow.search_traces(
            locations=[server.experiment_id], filter_string=filter_string, return_type="list", max_results=500
        )
    )


@pytest.fixture(scope="module")
def received(mlflow_server: Mlflow) -> tuple[Sent, list[Any]]:
    sent, status = send_agent_loop(
        mlflow_server.traces_endpoint, EXPERIMENT, headers=f"x-mlflow-experiment-id={mlflow_server.experiment_id}"
    )
    assert status["counters"]["failed"] == 0 and status["exporters"]["otlp"]["last_error"] is None, status

    def arrived() -> list[Any] | None:
        traces = search(mlflow_server)
        spans = sum(len(t.data.spans) for t in traces)
        return traces if spans == sent.spans else None

    traces = wait_until(arrived, ARRIVAL_S, interval_s=0.5, message=f"MLflow did not show {sent.spans} spans")
    return sent, traces


def test_every_mlflow_listener_is_loopback_only(mlflow_server: Mlflow) -> None:
    listeners = assert_loopback_listeners(mlflow_server.server)
    assert {ip for ip, _ in listeners} == {"127.0.0.1"}


def test_one_session_per_conversation_with_its_user(received: Any) -> None:
    sent, traces = received
    sessions = Counter(t.info.trace_metadata.get("mlflow.trace.session") for t in traces)
    assert sessions == dict.fromkeys(sent.conversations, 1)
    users = {
        t.info.trace_metadata.get("mlflow.trace.session"): t.info.trace_metadata.get("mlflow.trace.user")
        for t in traces
    }
    assert all(user and user.startswith("uid-") for user in users.values()), users


def test_every_span_has_a_type(received: Any) -> None:
    sent, traces = received
    types = Counter((s.name, s.attributes.get("type"), s.span_type) for t in traces for s in t.data.spans)
    per = len(sent.conversations)
    assert types == {
        ("agent_session", None, "AGENT"): per,
        ("agent_task", None, "CHAIN"): per,
        ("agent_turn", "generate", "CHAT_MODEL"): 2 * per,
        ("agent_turn", "tool", "TOOL"): per,
        ("tool_call", None, "CHAIN"): per,
        ("reward_model", None, "EVALUATOR"): per,
    }


def test_token_totals_equal_what_was_sent(received: Any) -> None:
    sent, traces = received
    usage = [t.info.token_usage for t in traces]
    assert sum(u["input_tokens"] for u in usage) == sent.prompt_tokens
    assert sum(u["output_tokens"] for u in usage) == sent.completion_tokens
    assert sum(u["total_tokens"] for u in usage) == sent.prompt_tokens + sent.completion_tokens


def test_request_response_and_tool_results_show(received: Any) -> None:
    _, traces = received
    for trace in traces:
        # MLflow previews the root span's input.value / output.value as JSON
        assert json.loads(trace.info.request_preview).startswith("What is 6 x 7?"), trace.info
        assert json.loads(trace.info.response_preview) in ("6 x 7 = 42", "I cannot tell."), trace.info
        for span in trace.data.spans:
            if span.name in ("agent_session", "agent_task", "agent_turn"):
                assert span.inputs is not None and span.outputs is not None, (span.name, span.attributes)
        tool = next(s for s in trace.data.spans if s.span_type == "TOOL")
        assert str(tool.outputs).startswith("42"), tool.outputs


def test_the_failed_session_is_an_error_trace(received: Any) -> None:
    sent, traces = received
    states = {t.info.trace_metadata["mlflow.trace.session"]: t.info.state for t in traces}
    assert {cid for cid, state in states.items() if state == TraceState.ERROR} == set(sent.failed)
    assert all(state == TraceState.OK for cid, state in states.items() if cid not in sent.failed)


def test_reward_is_filterable(mlflow_server: Mlflow, received: Any) -> None:
    sent, _ = received
    wanted = max(sent.rewards.values())
    found = search(mlflow_server, f"tag.reward = '{wanted}'")
    expected = {cid for cid, reward in sent.rewards.items() if reward == wanted}
    assert {t.info.trace_metadata["mlflow.trace.session"] for t in found} == expected
    assert 0 < len(expected) < len(sent.rewards)


def test_doctor_passes_with_the_experiment_header(mlflow_server: Mlflow, monkeypatch: pytest.MonkeyPatch) -> None:
    code, report, text = doctor(
        monkeypatch, mlflow_server.traces_endpoint, f"x-mlflow-experiment-id={mlflow_server.experiment_id}"
    )
    assert code == 0, text
    assert report["route"]["local"]["detail"].endswith("accepts OTLP export requests")


def test_doctor_fails_with_mlflows_own_reason_and_the_fix(
    mlflow_server: Mlflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report, text = doctor(monkeypatch, mlflow_server.traces_endpoint, "")
    assert code == 1
    detail = report["route"]["local"]["detail"]
    assert "answered 422 " in detail and "x-mlflow-experiment-id" in detail, detail
    fix = "export OTEL_EXPORTER_OTLP_HEADERS=x-mlflow-experiment-id=<experiment id>"
    assert report["hints"] == [f"MLflow needs the experiment to store traces in: {fix}"]
    assert fix in " ".join(text.split()) and "NOT OK" in text


@pytest.mark.parametrize(
    ("headers", "refusal"),
    [("", "x-mlflow-experiment-id"), ("x-mlflow-experiment-id=987654", "RESOURCE_DOES_NOT_EXIST")],
    ids=["no-header", "unknown-experiment"],
)
def test_status_shows_mlflows_refusal(mlflow_server: Mlflow, headers: str, refusal: str) -> None:
    sent, status = send_agent_loop(mlflow_server.traces_endpoint, "refused", headers=headers)
    otlp = status["exporters"]["otlp"]
    assert otlp["endpoint"] == mlflow_server.traces_endpoint
    assert f"{otlp['endpoint']} answered 4" in otlp["last_error"] and refusal in otlp["last_error"], otlp
    # Refused batches are kept in the spill, to be sent again once the endpoint takes them.
    assert (otlp["exported"], otlp["failed"], otlp["spilled"]) == (0, 0, sent.spans)


#: MLflow's UI keeps its onboarding state in localStorage (``<key>_v<version>``, JSON values, read
#: from MLflow 3.17.2's bundle): the "Detect issues" guidance popup, and the assistant panel it
#: opens by itself on a local server's first visit.
MLFLOW_SEEN = {
    "mlflow.detectIssues.guidanceShown_v1": "true",
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
    "mlflow.assistant.panelOpen_v1": "false",
}


def reward_column(experiment_id: str) -> dict[str, str]:
    """The traces table with the trace tag ``reward`` as a column of its own (hidden by default)
    instead of the ``Tags`` column (one tag of each trace and a count of the others), and narrower
    input and output columns, so that the reward fits in the window beside them.

    MLflow 3.17.2's traces table keeps the user's column choices in localStorage:
    ``mlflow.traces-v4.columns.<experiment id>_v4`` maps a column id (``tag:<key>`` for a trace
    tag) to whether it shows, ``mlflow.traces-v4.column-sizes.<experiment id>_v3`` to its width.
    """
    return {
        f"mlflow.traces-v4.columns.{experiment_id}_v4": json.dumps({"tags": False, "tag:reward": True}),
        f"mlflow.traces-v4.column-sizes.{experiment_id}_v3": json.dumps({"input": 300, "output": 160}),
    }


def test_screenshot_of_the_traces_view(mlflow_server: Mlflow, received: Any, tmp_path: Path) -> None:
    sent, _ = received
    cid = max(sent.rewards, key=sent.rewards.__getitem__)
    url = f"{mlflow_server.server.url}/#/experiments/{mlflow_server.experiment_id}/traces"
    shot = screenshot(
        url,
        "mlflow-traces",
        tmp_path,
        # a session's request, response and reward, in one row of the table
        shows=[sent.inputs[cid], sent.outputs[cid], str(sent.rewards[cid])],
        within='[role="row"], tr',
        hides=["Detect Issues in Your Traces", "Ask questions about your"],
        local_storage={**MLFLOW_SEEN, **reward_column(mlflow_server.experiment_id)},
    )
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
