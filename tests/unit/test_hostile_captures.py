"""Captures written by anyone: every reader counts what it cannot read and goes on, and nothing reaches a terminal raw.

The readers are ``report`` (text and HTML), ``show`` and ``replay``; the spill's drain
reads the same lines (tests/unit/test_spill_files.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.captures.read import read_records
from verl_otel_bridge._internal.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge._internal.pipeline.chain import ExportChain, Named
from verl_otel_bridge._internal.report.html import render_html
from verl_otel_bridge._internal.report.text import renderables
from verl_otel_bridge._internal.tree import render_tree
from verl_otel_bridge.cli.app import build_cli
from verl_otel_bridge.cli.replay import replay_records
from verl_otel_bridge.report import build_report

GOOD = {
    "name": "agent_session",
    "trace_id": "0" * 31 + "1",
    "span_id": "0" * 15 + "1",
    "parent_span_id": None,
    "start_time_ns": 1_700_000_000_000_000_000,
    "end_time_ns": 1_700_000_001_000_000_000,
    "kind": "INTERNAL",
    "status": {"code": "OK", "description": None},
    "attributes": {"state_lane_id": "s0", "global_steps": 1, "uid": "u", "status": "success"},
    "events": [],
    "resource": {},
    "scope": "verl_otel_bridge",
}
DEEP = b"[" * 100_000 + b"\n"


def cli(*args: str) -> Any:
    return CliRunner().invoke(build_cli(), list(args))


def capture(path: Path, *lines: bytes | dict[str, Any]) -> Path:
    path.write_bytes(b"".join(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n" for line in lines))
    return path


def test_a_deeply_nested_line_is_one_bad_line_for_every_reader(tmp_path: Path) -> None:
    path = capture(tmp_path / "deep.jsonl", GOOD, DEEP, GOOD | {"span_id": "0" * 15 + "2"})
    read = read_records(path)
    assert (len(read.records), [n for n, _ in read.bad]) == (2, [2])
    assert "nested too deeply" in read.bad[0][1]
    assert build_report([path]).bad_lines == 1
    summary = replay_records(
        [path],
        ExportChain(Named("memory", BoundedMemorySpanExporter()), counts := SpanCounts()),
        counts,
        batch_size=10,
    )
    assert (summary.read, summary.bad_lines, summary.exported) == (2, 1, 2)
    for command in (("show", str(path)), ("report", str(path))):
        result = cli(*command)
        assert result.exit_code == 0, result.output
        assert "1 bad lines" in result.output


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
FIELDS = (
    "name",
    "trace_id",
    "span_id",
    "parent_span_id",
    "start_time_ns",
    "end_time_ns",
    "kind",
    "status",
    "events",
    "resource",
    "scope",
)
ATTRIBUTES = (
    "state_lane_id",
    "global_steps",
    "uid",
    "sample",
    "session",
    "status",
    "reward",
    "turn",
    "type",
    "monitor.trajectories",
    "prompt_tokens",
    "server.address",
    "error",
    "elapsed_s",
    "turns",
    "last_span",
    "training.phase",
    "metric.timing_s/gen",
)
NAMES = (
    "agent_session",
    "agent_turn",
    "agent_task",
    "agent_session.progress",
    "training_step",
    "training_step.metrics",
    "x",
)


@st.composite
def hostile_records(draw: st.DrawFn) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(json.dumps(GOOD))
    record["name"] = draw(st.sampled_from(NAMES))
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        record[key] = draw(json_values)
    for key in draw(st.lists(st.sampled_from(ATTRIBUTES), max_size=5)):
        record["attributes"][key] = draw(json_values)
    if draw(st.booleans()):
        record["parent_span_id"] = record["span_id"]  # a span of its own parent
    return record


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(hostile_records(), min_size=1, max_size=4))
def test_report_show_and_replay_never_crash_on_any_json_value_in_any_field(
    tmp_path: Path, records: list[dict[str, Any]]
) -> None:
    path = capture(tmp_path / "any.jsonl", *records)
    built = build_report([path])
    renderables(built)
    render_html(built)
    read = read_records(path)
    render_tree(read.records)
    counts = SpanCounts()
    summary = replay_records(
        [path], ExportChain(Named("memory", BoundedMemorySpanExporter()), counts), counts, batch_size=2
    )
    assert summary.read + summary.bad_lines == len(records)
    for command in (("show", str(path)), ("report", str(path))):
        result = cli(*command)
        if read.records:
            assert result.exit_code == 0, (command, result.output, result.exception)
        else:  # no line is a span record: not a capture, said as the command's error
            assert result.exit_code == 1 and "no span record" in result.output, (command, result.output)


HOSTILE_TEXT = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b]0;owned\x07\u202eevil\x9b31m\r"


def test_control_characters_in_span_text_are_escaped_in_report_and_show(tmp_path: Path) -> None:
    hostile = json.loads(json.dumps(GOOD))
    hostile["status"] = {"code": "ERROR", "description": HOSTILE_TEXT}
    hostile["attributes"].update(uid=HOSTILE_TEXT, tool_output=HOSTILE_TEXT)
    path = capture(tmp_path / "hostile.jsonl", hostile)
    for command in (("show", str(path)), ("report", str(path))):
        result = cli(*command)
        assert result.exit_code == 0, result.output
        assert not any(ch in result.output for ch in "\x1b\x07\x9b\r\u202e"), (command, result.output)
        assert "\\x1b]52;c;cHduZWQ=" in result.output
