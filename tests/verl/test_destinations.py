"""verl's traced trajectories in the exporters a user configures with no code: OTLP and RL-Insight.

The worker has no bridge; it builds one from verl's config and the environment
when verl constructs it, as a Ray worker does. Spans are read back from the OTLP
wire (decoded with ``opentelemetry-proto`` by the integration suite's receiver).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import harness
import pytest
import stack
from otlp_receiver import OtlpReceiver, ReceivedSpan
from stack import RlInsightHub

from verl_otel_bridge._internal import current
from verl_otel_bridge._internal.protocol import GENERIC_IDENTITY_KEYS

#: OTLP destinations get the generic vocabulary, where an identity key may be renamed
#: (``session`` -> ``session.index``): read back under the native names.
NATIVE_KEYS = {generic: native for native, generic in GENERIC_IDENTITY_KEYS.items()}


def as_record(span: ReceivedSpan) -> dict[str, Any]:
    return {
        "name": span.name,
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "attributes": {NATIVE_KEYS.get(key, key): value for key, value in span.attributes.items()},
    }


def run(config: Any, model_dir: Path, batch: Any) -> harness.ScriptedServer:
    async def main() -> harness.ScriptedServer:
        worker, server = harness.make_worker(config, model_dir)
        await worker.generate_sequences(batch)
        return server

    return asyncio.run(asyncio.wait_for(main(), 120))


@pytest.fixture
def fresh_otlp_receiver() -> Any:
    with OtlpReceiver() as receiver:
        yield receiver


def test_otlp_exporter_receives_each_trajectorys_tree(
    verl_files: dict[str, Path], fresh_otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert stack.listening_addresses(fresh_otlp_receiver.port) == {"127.0.0.1"}
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "otlp")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_OTLP_ENDPOINT", fresh_otlp_receiver.url)
    config = harness.make_config(verl_files["model"], tools=(verl_files["tools_yaml"], verl_files["function_tools"]))
    server = run(config, verl_files["model"], harness.make_batch(1, n=2, step=4, agent_name="tool_agent"))
    # generate_sequences flushed before returning: everything is there already, the wait only bounds decoding
    received = [as_record(s) for s in fresh_otlp_receiver.wait_for(14, 30)]
    assert len(received) == 14  # 2 trajectories x (session, task, 2 generate, 3 tool turns)
    for (sample, session), group in harness.by_trajectory(received).items():
        harness.check_trajectory(
            group,
            identity={"sample": sample, "session": session, "traj": "0", "global_steps": 4, "uid": "uid-0"},
            agent_name="tool_agent",
            generate_calls=harness.calls_of(server.calls, sample),
            tool_names=[name for name, _ in harness.TOOL_CALLS],
        )
    bridge = current.current_bridge()
    assert bridge is not None and bridge.status()["counters"]["exported"] == {"otlp": 14}


def test_rl_insight_receives_each_trajectory_when_verl_logs_to_it(
    rl_insight_hub: RlInsightHub, verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, run_tag: str
) -> None:
    """``trainer.logger`` with ``rl_insight`` (verl then sets ``VERL_RL_INSIGHT_ENABLE=1``): the worker's bridge
    forwards to RL-Insight, whose trace store (the stack's OTLP receiver) gets every span with its identity."""
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    config = harness.make_config(verl_files["model"], project=f"proj-{run_tag}", experiment=f"exp-{run_tag}")
    config.trainer.logger = ["console", "rl_insight"]
    run(config, verl_files["model"], harness.make_batch(2, step=9))
    bridge = current.current_bridge()
    assert bridge is not None and bridge.status()["reason"] == "ok", bridge.status() if bridge else None
    received = rl_insight_hub.receiver.wait_for(6, 60, where=lambda s: s.attributes.get("project") == f"proj-{run_tag}")
    assert sorted(s.name for s in received) == ["agent_session"] * 2 + ["agent_task"] * 2 + ["agent_turn"] * 2
    for span in received:
        assert span.attributes["experiment_name"] == f"exp-{run_tag}" and span.attributes["global_steps"] == 9
    sessions = {s.attributes["sample"]: s.attributes for s in received if s.name == "agent_session"}
    assert sorted(sessions) == ["100", "101"]
    assert all(a["reward_score"] == 1.0 and a["uid"] == f"uid-{int(k) - 100}" for k, a in sessions.items())
