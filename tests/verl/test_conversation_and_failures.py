"""On verl 0.9.1's real agent loops: the conversation as text, failed tool calls, a failing call's spans,
and verl's own ``rollout_trace_op`` with backend ``otel``."""

from __future__ import annotations

import json
import socket
import types
from pathlib import Path
from typing import Any

import harness
import pytest
import torch
from test_plugin import run, tools_config
from transformers import AutoTokenizer

import verl_otel_bridge as vob
from verl_otel_bridge._internal.verl import tracing
from verl_otel_bridge._internal.vocabulary import Translator, generic_span
from verl_otel_bridge.testing import SpanCapture, capture_spans
from verl_otel_bridge.verl.plugin import SWITCH_ENV

#: The scripted model's first answer in the tool loop: one call of each tool of ``harness.TOOL_CALLS``.
TOOL_ANSWER = "".join(
    f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>" for name, args in harness.TOOL_CALLS
)


def tool_loop(verl_files: dict[str, Path], capture: SpanCapture, **config: Any) -> list[Any]:
    """One tool-loop trajectory of prompt 0 (``[tools] question 0``): its spans."""
    run(tools_config(verl_files, **config), verl_files["model"], harness.make_batch(1, agent_name="tool_agent"))
    assert capture.bridge.force_flush(30)
    return capture.spans


def turns(spans: list[Any], turn_type: str) -> list[Any]:
    return sorted(
        (s for s in spans if s.name == "agent_turn" and s.attributes["type"] == turn_type),
        key=lambda s: s.attributes["turn"],
    )


# --------------------------------------------------------------------------- the conversation


def otlp_view(spans: list[Any]) -> dict[tuple[str, Any], dict[str, Any]]:
    """What ``exporter: otlp`` sends for ``spans`` (each LLM call's whole input rebuilt), by (name, turn)."""
    parts = Translator().batch(spans)
    return {(s.name, p["attributes"].get("turn")): p["attributes"] for s, p in zip(spans, parts, strict=True)}


def test_token2text_stores_the_conversation_once_and_otlp_gets_it_whole(verl_files: dict[str, Path]) -> None:
    with capture_spans() as capture:
        spans = tool_loop(verl_files, capture, token2text=True)
    (session,) = [s for s in spans if s.name == "agent_session"]
    assert not {"input", "output"} & set(session.attributes)  # rebuilt from the turns by readers and otlp
    first, last = turns(spans, "generate")
    assert first.attributes["input"] == "<|im_start|>user\n[tools] question 0<|im_end|>\n<|im_start|>assistant\n"
    assert first.attributes["content"] == TOOL_ANSWER
    assert "input" not in last.attributes and last.attributes["input.after_turn"] == first.attributes["turn"]
    appended = last.attributes["input.appended"]
    assert appended.startswith("<|im_start|>tool") and "42" in appended  # only the tool replies and template text
    assert last.attributes["content"] == harness.FINAL_ANSWER
    tools = {t.attributes["tools"]: t for t in turns(spans, "tool")}
    assert tools["add_numbers"].attributes["content"] == "42"

    # What exporter: otlp sends: each LLM call's whole input; the session's first input and last output.
    sent = otlp_view(spans)
    whole = first.attributes["input"] + TOOL_ANSWER + appended
    assert sent[("agent_turn", last.attributes["turn"])]["input.value"] == whole
    tokenizer = AutoTokenizer.from_pretrained(verl_files["model"])  # the rebuilt text is the prompt verl sent
    assert len(tokenizer(whole, add_special_tokens=False).input_ids) == last.attributes["prompt_tokens"]
    otlp = sent[("agent_session", None)]
    assert (otlp["input.value"], otlp["output.value"]) == (first.attributes["input"], harness.FINAL_ANSWER)
    chat = sent[("agent_turn", last.attributes["turn"])]
    assert json.loads(chat["gen_ai.output.messages"])[0]["parts"][0]["content"] == harness.FINAL_ANSWER
    assert chat["output.value"] == harness.FINAL_ANSWER and "input.appended" not in chat
    tool = generic_span(tools["add_numbers"]).attributes
    assert (tool["gen_ai.tool.call.result"], json.loads(tool["input.value"])) == ("42", {"a": 40, "b": 2})


def test_without_token2text_no_text_is_recorded(verl_files: dict[str, Path]) -> None:
    with capture_spans() as capture:
        spans = tool_loop(verl_files, capture)
    (session,) = [s for s in spans if s.name == "agent_session"]
    assert not {"input", "output"} & set(session.attributes)
    for turn in turns(spans, "generate"):
        assert not {"input", "output", "content"} & set(turn.attributes)
        assert turn.attributes["completion_tokens"] > 0
    assert all(t.attributes["content"] for t in turns(spans, "tool"))  # verl's own tool results, as before


def test_record_text_turns_the_conversation_on_by_itself(verl_files: dict[str, Path]) -> None:
    with capture_spans(record_text=True) as capture:
        spans = tool_loop(verl_files, capture)
    assert [t.attributes["content"] for t in turns(spans, "generate")] == [TOOL_ANSWER, harness.FINAL_ANSWER]
    assert otlp_view(spans)[("agent_session", None)]["output.value"] == harness.FINAL_ANSWER


def test_text_is_cut_and_redacted_like_every_attribute(verl_files: dict[str, Path]) -> None:
    with capture_spans(record_text=True, max_attribute_length=12) as capture:
        spans = tool_loop(verl_files, capture)
    first, last = turns(spans, "generate")
    assert (
        last.attributes["content"].startswith(harness.FINAL_ANSWER[:12]) and "truncated" in last.attributes["content"]
    )
    assert first.attributes["input"].startswith("<|im_start|>") and "truncated" in first.attributes["input"]
    assert "truncated" in otlp_view(spans)[("agent_turn", last.attributes["turn"])]["input.value"]
    # redacting `input` redacts what a turn stores of its input, and the input rebuilt from it
    with capture_spans(record_text=True, redact_attributes=["input"]) as capture:
        spans = tool_loop(verl_files, capture)
    first, last = turns(spans, "generate")
    assert first.attributes["input"] == last.attributes["input.appended"] == "[REDACTED]"
    sent = otlp_view(spans)
    assert sent[("agent_turn", last.attributes["turn"])]["input.value"] == "[REDACTED]"
    assert sent[("agent_session", None)]["input.value"] == "[REDACTED]"


# --------------------------------------------------------------------------- failed tool calls


def test_a_failed_tool_call_ends_its_turn_in_error_and_is_counted(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = [("base_raising", {"x": 1}), ("divide", {"a": 1, "b": 0}), ("no_such_tool", {"x": 1}), *harness.TOOL_CALLS]
    monkeypatch.setattr(harness.verl_cpu, "TOOL_CALLS", calls)
    with capture_spans() as capture:
        spans = tool_loop(verl_files, capture)
    tools = {t.attributes["tools"]: t for t in turns(spans, "tool")}
    failed = {name: (t.status.status_code.name, t.attributes.get("error.type")) for name, t in tools.items()}
    assert failed == {
        "base_raising": ("ERROR", "tool_exception"),  # a BaseTool whose execute raises
        "divide": ("ERROR", "tool_exception"),  # a function tool that raises
        "no_such_tool": ("ERROR", "unknown_tool"),
        "base_default": ("UNSET", None),
        "base_override": ("UNSET", None),
        "add_numbers": ("UNSET", None),
    }
    assert tools["base_raising"].status.description == "Error executing tool 'base_raising': the raising tool broke"
    assert tools["divide"].attributes["content"].startswith("Error executing tool 'divide': ")
    (session,) = [s for s in spans if s.name == "agent_session"]
    # verl's trajectory went on (the model saw the error texts) and scored: its status stays verl's
    assert (session.attributes["status"], session.attributes["failed_tool_calls"]) == ("success", 3)
    assert session.attributes["reward_score"] == 1.0 and session.status.status_code.name == "UNSET"


def test_a_tool_exception_leaving_verl_fails_turn_and_session_and_its_spans_are_on_disk_when_it_raises(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(harness.verl_cpu, "TOOL_CALLS", [("base_broken_release", {"x": 1})])
    path = tmp_path / "spans.jsonl"
    # The export timer would not fire within the test: only the end of generate_sequences writes them.
    vob.configure(exporter="jsonl", jsonl_path=str(path), schedule_delay_ms=3_600_000)
    config = tools_config(verl_files)
    with pytest.raises(ConnectionError, match="sandbox is gone"):
        run(config, verl_files["model"], harness.make_batch(1, agent_name="tool_agent"))
    spans = {s["name"]: s for s in map(json.loads, path.read_text().splitlines()) if s["name"] != "agent_turn"}
    tools = [json.loads(line) for line in path.read_text().splitlines() if '"type": "tool"' in line]
    assert sorted(spans) == ["agent_session", "agent_task"]
    (tool,) = tools
    assert tool["status"]["code"] == "ERROR" and tool["attributes"]["error.type"] == "ConnectionError"
    assert spans["agent_session"]["attributes"]["status"] == "error"


def test_spans_of_a_failing_call_are_on_disk_when_it_raises(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def failing(self: Any, **kwargs: Any) -> Any:
        raise OSError("the LLM server died")

    monkeypatch.setattr(harness.ScriptedServer, "generate", failing)
    path = tmp_path / "spans.jsonl"
    vob.configure(exporter="jsonl", jsonl_path=str(path), schedule_delay_ms=3_600_000)
    with pytest.raises(OSError, match="server died"):
        run(harness.make_config(verl_files["model"]), verl_files["model"], harness.make_batch(2))
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(s["name"] for s in written) == ["agent_session"] * 2 + ["agent_task"] * 2 + ["agent_turn"] * 2
    assert all(s["status"]["code"] == "ERROR" for s in written)


def test_a_call_that_succeeds_never_waits_for_a_server_that_never_answers(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waiting for the send would hold the call until `run`'s 120 s bound: both timeouts are an hour.
    monkeypatch.setattr(tracing, "FLUSH_TIMEOUT_S", 3600.0)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3600")
    with socket.socket() as silent:  # connections complete in the kernel's backlog; nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        bridge = vob.configure(
            exporter="otlp",
            otlp_endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}/v1/traces",
            schedule_delay_ms=3_600_000,
            shutdown_timeout_s=1.0,
        )
        output, _server = run(harness.make_config(verl_files["model"]), verl_files["model"], harness.make_batch(2))
        assert len(output) == 2
        status = bridge.status()
        assert status["counters"]["ended"] == 6 and status["pending"]["queued"] == 0  # handed to the export thread
        vob.shutdown()


# --------------------------------------------------------------------------- verl's own rollout tracing


def counting_inspect(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Count the ``inspect.signature`` calls of verl's ``rollout_trace_op`` (its per-call work starts there)."""
    import inspect

    import verl.utils.rollout_trace as rollout_trace

    seen: list[Any] = []

    def signature(func: Any) -> inspect.Signature:
        seen.append(func)
        return inspect.signature(func)

    fake = types.SimpleNamespace(**{name: getattr(inspect, name) for name in dir(inspect) if not name.startswith("_")})
    fake.signature = signature
    monkeypatch.setattr(rollout_trace, "inspect", fake)
    return seen


def test_with_backend_otel_verls_rollout_trace_op_does_no_work(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = counting_inspect(monkeypatch)
    with capture_spans() as capture:
        run(tools_config(verl_files), verl_files["model"], harness.make_batch(2, agent_name="tool_agent"))
        assert capture.bridge.force_flush(30) and len(capture.sessions()) == 2
    assert seen == []
    from verl.utils.rollout_trace import RolloutTraceConfig

    RolloutTraceConfig.reset()
    run(
        tools_config(verl_files, backend="not-otel"),
        verl_files["model"],
        harness.make_batch(2, agent_name="tool_agent"),
    )
    assert len(seen) > 2  # another backend: verl's own wrapper runs as it always did


def test_verls_output_is_the_same_with_the_plugin_on_and_without_a_backend(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.utils.rollout_trace import RolloutTraceConfig

    outputs = []
    for backend, switch in (("otel", "1"), (None, "0")):
        monkeypatch.setenv(SWITCH_ENV, switch)
        RolloutTraceConfig.reset()
        config = tools_config(verl_files, backend=backend, token2text=True)
        with capture_spans():
            outputs.append(run(config, verl_files["model"], harness.make_batch(2, agent_name="tool_agent"))[0])
    traced, plain = outputs
    assert sorted(traced.batch.keys()) == sorted(plain.batch.keys())
    for key in plain.batch.keys():
        assert torch.equal(traced.batch[key], plain.batch[key]), key
    assert sorted(traced.non_tensor_batch) == sorted(plain.non_tensor_batch)
    for key, values in plain.non_tensor_batch.items():
        assert repr(traced.non_tensor_batch[key].tolist()) == repr(values.tolist()), key
