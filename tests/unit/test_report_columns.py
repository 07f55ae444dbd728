"""What the report's figures mean: the straggler rule's floor, the token and turn columns, and one
aggregation fed in any order and in pieces giving the same answers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from verl_otel_bridge._internal.report.aggregate import ReportBuilder
from verl_otel_bridge._internal.stragglers import StragglerRule
from verl_otel_bridge.cli.app import build_cli
from verl_otel_bridge.report import build_report

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def record(name: str, lane: str, start: int, end: int, step: int = 1, **attributes: Any) -> dict[str, Any]:
    number = random.getrandbits(60)
    return {
        "name": name,
        "trace_id": f"{number:032x}",
        "span_id": f"{number:016x}",
        "parent_span_id": None,
        "start_time_ns": start,
        "end_time_ns": end,
        "kind": "INTERNAL",
        "status": {"code": "UNSET", "description": None},
        "attributes": {"state_lane_id": lane, "global_steps": step, "uid": f"u-{lane}", **attributes},
        "events": [],
        "resource": {},
        "scope": "verl_otel_bridge",
    }


def flat(text: str) -> str:
    """Terminal output with its wrapping undone."""
    return " ".join(text.split())


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def sessions(durations_ns: list[int]) -> list[dict[str, Any]]:
    return [record("agent_session", f"s{i}", T0, T0 + d, status="success") for i, d in enumerate(durations_ns)]


def test_a_session_of_milliseconds_is_never_a_straggler_however_far_from_the_median(tmp_path: Path) -> None:
    # Sessions of 0.1 ms and one of 2 ms: 20 x the median, and no step was ever held up by it.
    capture = write(tmp_path / "fast.jsonl", sessions([MS // 10] * 9 + [2 * MS]))
    (step,) = build_report([capture]).steps
    assert step.max_s == pytest.approx(0.002) and step.stragglers == []
    result = CliRunner().invoke(build_cli(), ["report", str(capture)])
    assert result.exit_code == 0 and "straggler:" not in result.output
    assert "a straggler is a finished session longer than 3 x its step's median and longer than 1 s" in flat(
        result.output
    )
    # The floor is an option: at 1 ms the 2 ms session is one again.
    low = CliRunner().invoke(build_cli(), ["report", str(capture), "--straggler-min-s", "0.001"])
    assert low.exit_code == 0 and "straggler: uid 'u-s9' sample session : 0.002 s, 20 x the median" in flat(low.output)


def test_the_ratio_still_decides_above_the_floor(tmp_path: Path) -> None:
    capture = write(tmp_path / "slow.jsonl", sessions([2000 * MS] * 9 + [5000 * MS, 7000 * MS]))
    (step,) = build_report([capture]).steps
    assert [s.state_lane_id for s in step.stragglers] == ["s10"]  # 7 s > 3 x 2 s; 5 s is not
    assert StragglerRule(3, 1).limit_s(0.1) == 1 and StragglerRule(3, 1).limit_s(2) == 6
    assert StragglerRule(0, 1).limit_s(2) is None  # factor 0: off


def verl_session(lane: str, calls: list[tuple[int, int]], num_turns: int | None, tools: int) -> list[dict[str, Any]]:
    """A multi-turn trajectory as the verl plugin writes it: a generate turn per server call (prompt and
    completion tokens as the server counted them), tool turns between them, the session with num_turns."""
    out, turn = [], 0
    for prompt, completion in calls:
        out.append(
            record(
                "agent_turn",
                lane,
                T0,
                T0 + MS,
                turn=turn,
                type="generate",
                prompt_tokens=prompt,
                completion_tokens=completion,
            )
        )
        turn += 1
        if tools:
            tools -= 1
            out.append(record("agent_turn", lane, T0 + MS, T0 + 2 * MS, turn=turn, type="tool", tools="search"))
            turn += 1
    extra = {} if num_turns is None else {"num_turns": num_turns}
    out.append(record("agent_session", lane, T0, T0 + 10 * MS, status="success", **extra))
    return out


def test_tokens_say_final_context_and_generated_and_turns_count_as_verl_counts(tmp_path: Path) -> None:
    # Three calls on a growing context: 100 -> 100+20+30 (a tool's answer) -> 150+25+40.
    calls = [(100, 20), (150, 25), (215, 30)]
    capture = write(
        tmp_path / "multi.jsonl",
        verl_session("verl", calls, num_turns=6, tools=2) + verl_session("plain", calls, num_turns=None, tools=2),
    )
    (step,) = build_report([capture], top=5).steps
    by_lane = {s.state_lane_id: s for s in step.slowest}
    verl, plain = by_lane["verl"], by_lane["plain"]
    assert (verl.context_tokens, verl.generated_tokens) == (245, 75)  # not 540, the sum of every call's prompt
    assert (verl.turns, verl.turn_spans) == (6, 5)  # verl's num_turns; the spans are 3 generate + 2 tool
    assert (plain.turns, plain.turn_spans) == (5, 5)  # without num_turns: the turn spans
    assert step.generated_tokens == 150
    text = flat(CliRunner().invoke(build_cli(), ["report", str(capture)]).output)
    assert "ctx tok" in text and "gen tok" in text and "turns: verl's num_turns when the session records it" in text


def test_trajectories_num_turns_count_when_the_session_has_none(tmp_path: Path) -> None:
    trajectories = json.dumps([{"chain_id": 0, "num_turns": 3}, {"chain_id": 1, "num_turns": 4}])
    capture = write(
        tmp_path / "t.jsonl", [record("agent_session", "a", T0, T0 + MS, **{"monitor.trajectories": trajectories})]
    )
    (step,) = build_report([capture]).steps
    assert step.slowest[0].turns == 7


def test_one_aggregation_fed_in_pieces_and_any_order_answers_as_the_whole(tmp_path: Path) -> None:
    rng = random.Random(3)
    records = []
    for step in (1, 2):
        for i in range(30):
            duration = int(rng.lognormvariate(0, 1) * 1000 * MS)
            lane = f"s{i}"
            records += verl_session(lane, [(100, 10 + i)], num_turns=2, tools=1)
            records[-1] = record("agent_session", lane, T0, T0 + duration, step=step, status="success", num_turns=2)
            for r in records[-3:]:
                r["attributes"]["global_steps"] = step
                r["attributes"]["uid"] = f"uid-{i % 4}"
    whole = build_report([write(tmp_path / "whole.jsonl", records)])
    rng.shuffle(records)
    builder = ReportBuilder()
    for r in records:
        builder.add(r)
    for step in whole.steps:
        assert builder.step_report(step.step) == step
