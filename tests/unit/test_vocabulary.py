"""The generic vocabulary ``exporter: otlp`` sends, and failed sessions as error spans."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from opentelemetry.trace import StatusCode

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.protocol import GENERIC_IDENTITY_KEYS, IDENTITY_KEYS
from verl_otel_bridge._internal.vocabulary import conversation_id, generic_span
from verl_otel_bridge.testing import capture_spans


def agent_loop(bridge: Bridge) -> None:
    with bridge.session(sample=1, session=2, global_steps=3, uid="u7", project="p", experiment_name="e") as s:
        vob.record_io(input="question")
        with s.task("solve") as task:
            with s.turn(0, type="generate", input="question") as turn:
                turn.record(prompt_tokens=10, completion_tokens=4, content="answer", finish_reason="stop")
            with s.turn(1, type="tool") as turn:
                turn.record(tools="calc", tool_args={"x": 1})
                vob.record_io(output={"value": 42})
            with s.turn(2, type="tool") as turn:
                turn.record(tools="calc", tool_args={"x": 2}, content="43")  # the verl plugin's way
            task.set_result(status="success", reward=0.75)
        with bridge.span("plain"):
            pass
        bridge.record_span(
            "reward_model", start_time_ns=2 * 10**18, end_time_ns=2 * 10**18 + 5, attributes={"reward": 1}
        )
        vob.record_io(output="answer", span=s.span)
        s.finish(status="success", trajectories=[{"chain_id": 0, "reward_score": 0.75, "num_turns": 2}])


@pytest.fixture
def translated() -> list:
    with capture_spans() as capture:
        agent_loop(capture.bridge)
        native = capture.spans
    assert len(native) == 7  # session, task, three turns, plain, reward_model
    return [(span, generic_span(span)) for span in native]


def test_no_key_shadows_a_dotted_key_and_the_identity_stays_complete(translated: list) -> None:
    for native, span in translated:
        keys = set(span.attributes)
        shadowing = {k for k in keys if any(other.startswith(k + ".") for other in keys)}
        assert not shadowing, (span.name, shadowing)
        for key in IDENTITY_KEYS:
            assert span.attributes[GENERIC_IDENTITY_KEYS.get(key, key)] == native.attributes[key], (span.name, key)
        assert span.attributes["session.id"] == "project=p/experiment=e/global_steps=3/sample=1/session=2/traj=0"
        assert span.attributes["gen_ai.conversation.id"] == span.attributes["session.id"]
        assert span.attributes["user.id"] == "u7"
        assert span.resource.attributes["openinference.project.name"] == "p"


def test_kinds_inputs_outputs_tokens_and_reward(translated: list) -> None:
    by_name = {(s.name, s.attributes.get("type")): s for _, s in translated if s.attributes.get("turn") != 2}
    kinds = {key: s.attributes.get("openinference.span.kind") for key, s in by_name.items()}
    assert kinds == {
        ("agent_session", None): "AGENT",
        ("agent_task", None): "CHAIN",
        ("agent_turn", "generate"): None,  # gen_ai.operation.name=chat: the backends' own LLM kind
        ("agent_turn", "tool"): "TOOL",
        ("plain", None): "CHAIN",
        ("reward_model", None): "EVALUATOR",
    }
    session = by_name["agent_session", None]
    assert (session.attributes["input.value"], session.attributes["output.value"]) == ("question", "answer")
    assert json.loads(session.attributes["metadata"]) == {"reward": 0.75}
    assert session.attributes["mlflow.traceTag.reward"] == "0.75"
    chat = by_name["agent_turn", "generate"]
    assert json.loads(chat.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "question"}]}
    ]
    assert json.loads(chat.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "answer"}], "finish_reason": "stop"}
    ]
    assert [chat.attributes[f"llm.token_count.{k}"] for k in ("prompt", "completion", "total")] == [10, 4, 14]
    tool = by_name["agent_turn", "tool"]
    assert tool.attributes["gen_ai.tool.call.result"] == '{"value": 42}'
    assert tool.attributes["input.value"] == '{"x": 1}' and tool.attributes["input.mime_type"] == "application/json"
    (content_tool,) = [s for _, s in translated if s.attributes.get("turn") == 2]
    assert (content_tool.attributes["gen_ai.tool.call.result"], content_tool.attributes["output.value"]) == ("43", "43")
    task = by_name["agent_task", None]
    assert [(e.name, dict(e.attributes)) for e in task.events] == [
        ("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": 0.75})
    ]
    assert "input" not in task.attributes and "session" not in task.attributes


def test_translation_is_idempotent(translated: list) -> None:
    for _, span in translated:
        again = generic_span(span)
        assert dict(again.attributes) == dict(span.attributes)
        assert len(again.events) == len(span.events)


def test_spans_outside_a_session_get_no_session(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory")
    with bridge.span("alone"):
        pass
    span = generic_span(bridge.memory_exporter.get_finished_spans()[0])
    assert conversation_id(span.attributes) is None and "session.id" not in span.attributes
    assert span.attributes["openinference.span.kind"] == "CHAIN"


@pytest.mark.parametrize("status", ["failed", "error", "cancelled", "Timeout"])
def test_a_failed_session_ends_as_an_error_span(make_bridge: Callable[..., Bridge], status: str) -> None:
    bridge = make_bridge(exporter="memory")
    with bridge.session(sample=0, session=0) as s:
        s.finish(status=status)
    (span,) = bridge.memory_exporter.get_finished_spans()
    assert (span.status.status_code, span.status.description) == (
        StatusCode.ERROR,
        f"session finished with status {status!r}",
    )


def test_an_exception_keeps_its_own_description_and_success_stays_unset(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory")
    with pytest.raises(ValueError), bridge.session(sample=0, session=0):
        raise ValueError("boom")
    with bridge.session(sample=0, session=1) as s, s.task("t") as task:
        task.set_result(status="failed", error="tool crashed")
    with bridge.session(sample=0, session=2):
        pass
    spans = {(s.name, s.attributes["session"]): s.status for s in bridge.memory_exporter.get_finished_spans()}
    assert spans["agent_session", "0"].description == "ValueError: boom"
    assert (spans["agent_task", "1"].status_code, spans["agent_task", "1"].description) == (
        StatusCode.ERROR,
        "tool crashed",
    )
    assert spans["agent_session", "1"].status_code is StatusCode.UNSET  # finished as success
    assert spans["agent_session", "2"].status_code is StatusCode.UNSET


def test_a_callers_plain_key_that_a_dotted_key_nests_under_moves_aside(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory")
    with bridge.session(sample=0, session=0), bridge.turn(0, llm="vllm") as turn:
        turn.record(prompt_tokens=3, completion_tokens=1)
    turn_span = next(s for s in bridge.memory_exporter.get_finished_spans() if s.name == "agent_turn")
    sent = generic_span(turn_span).attributes
    assert "llm" not in sent and sent["llm.value"] == "vllm" and sent["llm.token_count.total"] == 4


class RecordingSender:
    """An OTLP sender that keeps the request bodies instead of posting them."""

    endpoint, timeout_s = "http://127.0.0.1:1/v1/traces", 1.0

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def send(self, body: bytes, *, deadline: float | None = None) -> bytes:
        self.bodies.append(body)
        return b""

    def scrub(self, text: str) -> str:
        return text


def test_otlp_gets_the_translation_beside_the_spans_and_sends_what_a_copy_would(translated: list) -> None:
    """The ``otlp`` destination sends each span with its translated parts instead of a translated copy."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from verl_otel_bridge._internal.otlp.encoding import SpanEncoder
    from verl_otel_bridge._internal.otlp.exporter import OtlpDestination
    from verl_otel_bridge._internal.otlp.exporter import translated as translating
    from verl_otel_bridge._internal.records import replace_span
    from verl_otel_bridge._internal.vocabulary import Translator

    sender = RecordingSender()
    destination = OtlpDestination(sender, describe=translating("p"))  # type: ignore[arg-type]
    native = [span for span, _ in translated]
    assert destination.send(native).accepted == len(native)
    (body,) = sender.bodies
    translate = Translator("p")  # one translator: translated spans share its resources, as the destination's do
    copies = SpanEncoder().encode([replace_span(span, **translate(span)) for span in native])  # type: ignore[arg-type]
    assert ExportTraceServiceRequest.FromString(body) == ExportTraceServiceRequest.FromString(copies)


def test_a_span_that_cannot_be_translated_goes_out_as_it_is(
    translated: list, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from verl_otel_bridge._internal import vocabulary
    from verl_otel_bridge._internal.otlp.exporter import OtlpDestination
    from verl_otel_bridge._internal.otlp.exporter import translated as translating

    real = vocabulary.generic_parts

    def fails_on_tasks(span, *args, **kwargs):  # type: ignore[no-untyped-def]
        if span.name == "agent_task":
            raise RuntimeError("odd span")
        return real(span, *args, **kwargs)

    monkeypatch.setattr(vocabulary, "generic_parts", fails_on_tasks)
    sender = RecordingSender()
    native = [span for span, _ in translated]
    assert OtlpDestination(sender, describe=translating(None)).send(native).accepted == len(native)  # type: ignore[arg-type]
    (body,) = sender.bodies
    received = [
        span
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    by_id = {span.context.span_id: span for span in native}
    assert sorted(span.name for span in received) == sorted(span.name for span in native)
    for sent in received:
        original = by_id[int.from_bytes(sent.span_id, "big")]
        keys = {attribute.key for attribute in sent.attributes}
        if original.name == "agent_task":
            assert keys == set(original.attributes)  # as it was
        else:
            assert "session.index" in keys  # translated
    assert any("exported untranslated" in record.getMessage() for record in caplog.records)


def test_the_identity_key_is_renamed_and_of_a_key_and_its_new_name_the_later_one_wins() -> None:
    from verl_otel_bridge._internal.vocabulary import renamed

    assert renamed({"session": "3", "turn": 1}) == {"session.index": "3", "turn": 1}
    assert renamed({"session": "3", "session.index": "9"}) == {"session.index": "9"}
    assert renamed({"session.index": "9", "session": "3"}) == {"session.index": "3"}
    given = {"session": "3"}
    renamed(given)
    assert given == {"session": "3"}  # a copy
