"""The report's session columns on verl 0.9.1's real multi-turn tool loop: ``turns`` is verl's own
``num_turns``, ``ctx tok`` the final context and ``gen tok`` the generated tokens as the LLM server
counted them (not sums of every call's prompt, not the turn spans)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import harness
from click.testing import CliRunner
from test_plugin import run, tools_config

from verl_otel_bridge.cli.app import build_cli
from verl_otel_bridge.report import build_report
from verl_otel_bridge.testing import capture_spans


def test_report_counts_turns_as_verl_and_tokens_as_the_server(verl_files: dict[str, Path], tmp_path: Path) -> None:
    with capture_spans() as capture:
        output, server = run(
            tools_config(verl_files), verl_files["model"], harness.make_batch(2, n=1, agent_name="tool_agent")
        )
        assert capture.bridge.force_flush(30)
        records = harness.records(capture.spans)
    capture_file = tmp_path / "capture.jsonl"
    capture_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    verl_turns = [int(n) for n in output.non_tensor_batch["__num_turns__"]]  # verl's, one per row, in batch order

    (step,) = build_report([capture_file], top=10).steps
    sessions = {s.sample: s for s in step.slowest}
    assert sorted(sessions) == ["100", "101"]
    text = CliRunner().invoke(build_cli(), ["report", str(capture_file)]).output
    for row, sample in enumerate(("100", "101")):
        calls = harness.calls_of(server.calls, sample)
        assert len(calls) == 2  # the tool calls, then the answer on the grown context
        session = sessions[sample]
        context = calls[-1]["prompt_tokens"] + calls[-1]["completion_tokens"]
        generated = sum(c["completion_tokens"] for c in calls)
        assert (session.turns, session.context_tokens, session.generated_tokens) == (
            verl_turns[row],
            context,
            generated,
        )
        # what the column counted before: the turn spans, 2 generate and 3 tool turns; verl counts the prompt
        # and the tool round as one turn each: 1 + 2 + 1 (docs/cli.md says so)
        assert (session.turn_spans, session.turns) == (5, 4)
        # the slowest-sessions table prints them under turns, ctx tok and gen tok
        line = next(line for line in text.splitlines() if re.match(rf"\s*uid-{row}\s+{sample}\s", line))
        assert line.split()[4] == str(verl_turns[row]) and line.split()[7:9] == [str(context), str(generated)], line
