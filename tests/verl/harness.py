"""What the tests on real verl check of a traced trajectory, over the CPU stand-ins of ``examples/verl_cpu.py``
(re-exported here: ``harness.make_worker``, ``harness.ScriptedServer``, ...)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: The example a verl user runs: verl's agent loop on CPU with the plugin's switch (tests/verl/test_example.py).
EXAMPLE = EXAMPLES / "verl_agent_loop.py"
sys.path.insert(0, str(EXAMPLES))

# The stand-ins, said once, in the example a verl user runs (a test changes the script in ``verl_cpu``).
import verl_cpu  # noqa: E402
from verl_cpu import (  # noqa: E402 - found on the path set above
    FINAL_ANSWER,
    OVERRIDE_TEXT,
    TOOL_CALLS,
    LoadBalancer,
    ScriptedServer,
    build_model_dir,
    build_tools,
    make_batch,
    make_config,
    make_worker,
)

__all__ = [
    "EXAMPLE",
    "EXAMPLES",
    "FINAL_ANSWER",
    "OVERRIDE_TEXT",
    "TOOL_CALLS",
    "LoadBalancer",
    "RayAgentLoop",
    "ScriptedServer",
    "build_model_dir",
    "build_tools",
    "by_trajectory",
    "calls_of",
    "check_trajectory",
    "make_batch",
    "make_config",
    "make_worker",
    "records",
    "user_environment",
    "verl_cpu",
    "worker_spans",
]


@dataclass(frozen=True)
class RayAgentLoop:
    """verl's ``AgentLoopManager`` with its ``AgentLoopWorker`` actors on Ray (the ``agent_loop_on_ray`` fixture)."""

    config: Any
    """The verl config they were made with (:func:`make_config`)."""
    manager: Any
    server: Any
    """The :class:`ScriptedServer` actor behind the load balancer (``get_calls`` says what it was asked)."""


def worker_spans(spans_dir: Path) -> list[dict[str, Any]]:
    """The records the Ray workers' bridges wrote to their (default) span directory: its run folders, step
    folders and gzip files, as every reader reads them (the conversation rebuilt)."""
    from verl_otel_bridge._internal.captures.read import CaptureRecords, find_captures

    return list(CaptureRecords(find_captures([spans_dir]).files))


def user_environment(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without any bridge, OpenTelemetry or verl logging setting (a user who set only
    verl's switch), with a state directory of its own under ``tmp_path``."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("VERL_OTEL_", "OTEL_", "VERL_LOGGING_LEVEL", "VERL_RL_INSIGHT"))
    }
    return {**kept, "XDG_STATE_HOME": str(tmp_path / "state")}


def records(spans: Sequence[Any]) -> list[dict[str, Any]]:
    """Finished spans as the JSONL exporter writes them (one dict per span)."""
    from verl_otel_bridge._internal.records import span_to_record

    return [span_to_record(span) for span in spans]


def by_trajectory(spans: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Span records grouped by (sample, session) of their identity."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for span in spans:
        attributes = span["attributes"]
        groups.setdefault((attributes["sample"], attributes["session"]), []).append(span)
    return groups


def check_trajectory(
    spans: Sequence[Mapping[str, Any]],
    *,
    identity: Mapping[str, Any],
    agent_name: str,
    generate_calls: Sequence[Mapping[str, int]],
    tool_names: Sequence[str] = (),
) -> Mapping[str, Any]:
    """What every traced trajectory must be: returns its session span record."""
    (session,) = [s for s in spans if s["name"] == "agent_session"]
    assert session["parent_span_id"] == identity.get("_parent")  # the trainer's span, when it sent one
    for span in spans:
        for key, value in identity.items():
            if not key.startswith("_"):
                assert span["attributes"][key] == value, (span["name"], key, span["attributes"])
        assert span["trace_id"] == session["trace_id"], "a trajectory is one trace"
    attributes = session["attributes"]
    assert (attributes["agent_name"], attributes["validate"]) == (agent_name, identity.get("_validate", False))
    assert attributes["reward_score"] == 1.0 and attributes["reward_extra_info"] == '{"acc": 1.0}'
    assert attributes["status"] == "success" and attributes["num_turns"] >= 2
    assert {"verl.generate_sequences", "verl.tool_calls", "verl.compute_score"} <= set(attributes)
    (task,) = [s for s in spans if s["name"] == "agent_task"]
    assert task["parent_span_id"] == session["span_id"] and task["attributes"]["task_name"] == agent_name
    turns = sorted((s for s in spans if s["name"] == "agent_turn"), key=lambda s: s["attributes"]["turn"])
    assert [t["attributes"]["turn"] for t in turns] == list(range(len(turns)))
    assert all(t["parent_span_id"] == task["span_id"] for t in turns)
    generates = [t["attributes"] for t in turns if t["attributes"]["type"] == "generate"]
    assert [(g["prompt_tokens"], g["completion_tokens"]) for g in generates] == [
        (c["prompt_tokens"], c["completion_tokens"]) for c in generate_calls
    ]
    assert all(g["finish_reason"] == "completed" and g["server.address"] == "server-0" for g in generates)
    assert all(g["cached_tokens"] == 4 for g in generates)
    tools = [t["attributes"] for t in turns if t["attributes"]["type"] == "tool"]
    assert sorted(t["tools"] for t in tools) == sorted(tool_names)
    return session


def calls_of(calls: Sequence[Mapping[str, Any]], sample: str) -> list[Mapping[str, Any]]:
    """Of a :class:`ScriptedServer`'s ``calls``: those one trajectory of ``sample`` made, in order
    (its rollouts call alike)."""
    calls = [c for c in calls if c["sample"] == sample]
    ordered: dict[int, Mapping[str, Any]] = {}
    for call in calls:
        assert ordered.setdefault(call["round"], call) == call, "rollouts of one prompt differ"
    return [ordered[r] for r in sorted(ordered)]
