"""The ``console`` exporter for people: one line per span, a session's spans together and indented by depth,
a summary line per session, colours only on a terminal, nothing raw from a span; JSON by a setting."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.exporter_names import destination_module
from verl_otel_bridge._internal.exporters import console_text
from verl_otel_bridge._internal.exporters.console import Console

from .helpers import wait_until
from .test_hostile_captures import HOSTILE_TEXT

ROOT = Path(__file__).resolve().parents[2]


class ToolError(RuntimeError):
    """A tool that fails."""


def two_sessions(bridge: Bridge) -> None:
    """Two sessions of step 3 whose spans end interleaved; the second's search tool fails."""
    first = bridge.start_session(sample=0, session=0, global_steps=3, uid="uid-0")
    second = bridge.start_session(sample=1, session=0, global_steps=3, uid="uid-1")
    for s in (first, second):
        with bridge.resume(s.identity), s.task("solve") as task:
            with s.turn(0) as t:
                t.record(prompt_tokens=120, completion_tokens=30, finish_reason="tool_calls", tools="search")
            try:
                with s.turn(1, type="tool", tools="search"), bridge.span("tool_call"):
                    if s is second:
                        raise ToolError("search failed: sandbox timed out")
            except ToolError:
                pass
            with s.turn(2) as t:
                t.record(prompt_tokens=180, completion_tokens=25, finish_reason="stop")
            task.set_result(status="success", reward=1.0 if s is first else 0.0)
    for s in (first, second):
        s.finish(status="success", trajectories=[{"chain_id": 0, "reward_score": 1.0, "num_turns": 4}])
        s.span.end()


def masked(text: str) -> list[str]:
    """Durations as ``#``: what stays from run to run."""
    return [re.sub(r"\d+\.\d+ (ms|s)\b", "# ms", line) for line in text.strip().splitlines()]


def test_a_sessions_spans_come_together_indented_by_depth_with_a_summary_line(
    make_bridge: Callable[..., Bridge], capsys: pytest.CaptureFixture[str]
) -> None:
    bridge = make_bridge(exporter="console")
    two_sessions(bridge)
    bridge.shutdown()
    out = capsys.readouterr().out
    assert masked(out) == masked(_docs_block())  # docs/cli.md shows this output
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[:7]] == [
        "agent_session",
        "agent_task",
        "agent_turn",
        "agent_turn",
        "tool_call",
        "agent_turn",
        "──",
    ]
    assert [len(line) - len(line.lstrip()) for line in lines[:6]] == [0, 2, 4, 4, 6, 4]
    assert "tokens 120+30 tools=search finish_reason=tool_calls" in lines[2]
    assert lines[6].startswith("── session uid=uid-0 sample=0 session=0 global_steps=3: success, ")
    assert lines[6].endswith(", 4 turns, 55 tokens generated, reward 1, 0 errors")
    assert "ERROR ToolError: search failed: sandbox timed out  tools=search" in lines[10]
    assert lines[13].endswith(", 4 turns, 55 tokens generated, reward 0, 2 errors")


def _docs_block() -> str:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    found = re.search(r"test_a_sessions_spans_come_together[^>]*-->\n```text\n(.*?)```", page, re.S)
    assert found is not None, "docs/cli.md lost the console's output"
    return found.group(1)


def test_progress_records_print_at_once_and_a_session_prints_when_it_ends(
    make_bridge: Callable[..., Bridge], capsys: pytest.CaptureFixture[str]
) -> None:
    bridge = make_bridge(exporter="console", progress_interval_s=0.05, schedule_delay_ms=10)
    s = bridge.start_session(sample=7, session=1, global_steps=2, uid="uid-7")
    with bridge.resume(s.identity), bridge.span("tool_call"):
        printed: list[str] = []

        def progress() -> bool:
            printed.append(capsys.readouterr().out)
            return "agent_session.progress" in "".join(printed)

        wait_until(progress, what="a progress line")
    shown = "".join(printed)
    assert re.search(
        r"^\.\.\. agent_session\.progress .* uid=uid-7 open [\d.]+ s, turn -, in tool_call for", shown, re.M
    )
    assert "tool_call" not in shown.replace("in tool_call", "")  # held until the session ends
    s.span.end()
    bridge.shutdown()
    rest = capsys.readouterr().out
    assert re.search(r"^  tool_call ", rest, re.M) and "── session uid=uid-7" in rest


def test_held_sessions_are_bounded(monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]) -> None:
    monkeypatch.setattr(console_text, "MAX_HELD_SESSIONS", 2)
    monkeypatch.setattr(console_text, "MAX_HELD_SPANS", 3)
    bridge = make_bridge(exporter="memory")
    sessions = [bridge.start_session(sample=i, session=0, global_steps=1) for i in range(3)]
    for s in sessions:
        with bridge.resume(s.identity):
            for n in range(5):
                with bridge.span(f"work-{n}"):
                    pass
    assert bridge.force_flush(30) and bridge.memory_exporter is not None
    text = console_text.SpanText()
    early = "".join(text.lines(bridge.memory_exporter.get_finished_spans()))
    assert early.count("── session") == 1 and "not ended yet" in early and "2 more spans not shown" in early
    rest = "".join(text.rest())
    assert rest.count("── session") == 2


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _one_session_with(bridge: Bridge, text: str) -> None:
    with bridge.session(sample=0, session=0, global_steps=1, uid=text) as s:
        try:
            with s.turn(0, type="tool", tools=text):
                raise ToolError(text)
        except ToolError:
            pass


@pytest.mark.parametrize("no_color", [False, True])
def test_colours_only_on_a_terminal_and_never_raw_text_from_a_span(
    make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch, no_color: bool
) -> None:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    bridge = make_bridge(exporter="memory")
    _one_session_with(bridge, HOSTILE_TEXT)
    assert bridge.memory_exporter is not None
    spans = bridge.memory_exporter.get_finished_spans()
    for stream, coloured in ((Terminal(), not no_color), (io.StringIO(), False)):
        Console(stream).send(spans)
        out = stream.getvalue()
        styles = re.findall(r"\x1b\[\d+m", out)
        assert bool(styles) == coloured
        bare = re.sub(r"\x1b\[\d+m", "", out)
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", bare), bare
        assert "\\x1b]52;c;cHduZWQ=" in bare


def test_the_json_form_stays_by_a_setting(
    make_bridge: Callable[..., Bridge], capsys: pytest.CaptureFixture[str]
) -> None:
    bridge = make_bridge(exporter="console", console_format="json")
    two_sessions(bridge)
    bridge.shutdown()
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 12 and {r["name"] for r in records} >= {"agent_session", "agent_turn", "tool_call"}


def test_doctor_says_what_the_console_prints() -> None:
    checks = {
        fmt: destination_module("console").check(BridgeConfig.resolve(environ={}, console_format=fmt), {}, 1.0)
        for fmt in ("text", "json")
    }
    assert "readable lines" in checks["text"]["detail"] and "JSON" in checks["json"]["detail"]


def test_spans_whose_parents_form_a_cycle_are_printed_once_not_dropped() -> None:
    """``replay --to console`` of a capture whose ids repeat: spans caught in a cycle of parents still print."""
    identity = {"state_lane_id": "lane-0", "global_steps": 1}

    def span(name: str, span_id: int, parent_id: int | None) -> ReadableSpan:
        parent = SpanContext(1, parent_id, is_remote=False) if parent_id is not None else None
        context = SpanContext(1, span_id, is_remote=False)
        return ReadableSpan(name=name, context=context, parent=parent, attributes=identity, start_time=1, end_time=2)

    spans = [span("first", 2, 3), span("second", 3, 2), span("agent_session", 1, None)]
    lines = console_text.SpanText().lines(spans)
    assert [line.split()[0] for line in lines[:-1]] == ["agent_session", "first", "second"]
    assert lines[-1].startswith("── session")
