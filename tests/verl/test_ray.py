"""The plugin through Ray: verl's ``AgentLoopManager`` starts real ``AgentLoopWorker`` actors on loopback.

The workers get no code: ``import verl`` in each actor loads the plugin, and the
bridge configures itself from verl's config and the job's ``runtime_env``
(``VERL_OTEL_BRIDGE_EXPORTER=jsonl``, a per-process ``JSONL_PATH``), the recipe
of docs/verl.md. The stand-ins (load balancer, scripted LLM server) and verl's
real ``RewardLoopWorker`` are Ray actors too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import harness
import stack

import verl_otel_bridge as vob
from verl_otel_bridge.testing import capture_spans


def worker_spans(spans_dir: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for path in sorted(spans_dir.glob("worker-*.jsonl")) for line in path.read_text().splitlines()
    ]


def test_agent_loop_manager_on_ray_traces_every_trajectory_under_the_trainers_step(
    ray_local: stack.RayLoopback, verl_files: dict[str, Path]
) -> None:
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.workers.rollout.llm_server import LLMServerClient

    config = harness.make_config(
        verl_files["model"], tools=(verl_files["tools_yaml"], verl_files["function_tools"]), num_workers=1
    )
    server = ray.remote(num_cpus=0)(harness.ScriptedServer).remote(str(verl_files["model"]))
    balancer = ray.remote(num_cpus=0)(harness.LoadBalancer).remote(server)
    reward = ray.remote(num_cpus=0)(RewardLoopWorker).remote(config)
    manager = AgentLoopManager.create(
        config,
        llm_client=LLMServerClient(config, load_balancer_handle=balancer),
        reward_loop_worker_handles=[reward],
    )
    batch = DataProto.concat(
        [harness.make_batch(1, n=2, step=11, agent_name="tool_agent"), harness.make_batch(1, n=2, step=11, first=1)]
    )
    with capture_spans() as capture:
        with vob.span("training_step") as step_span:
            output = manager.generate_sequences(batch)
        (driver_step,) = harness.records(capture.spans)
    assert len(output) == 4
    # each generate_sequences exports its spans before it returns: nothing to wait for
    spans = worker_spans(verl_files["spans"])
    calls = ray.get(server.get_calls.remote(), timeout=60)
    groups = harness.by_trajectory(spans)
    assert sorted(groups) == [("100", "0"), ("100", "1"), ("101", "0"), ("101", "1")]
    for (sample, session), group in groups.items():
        tool_agent = sample == "100"
        harness.check_trajectory(
            group,
            identity={
                "sample": sample,
                "session": session,
                "traj": "0",
                "global_steps": 11,
                "uid": f"uid-{int(sample) - 100}",
                "project": "proj",
                "experiment_name": "exp",
                "_parent": driver_step["span_id"],
            },
            agent_name="tool_agent" if tool_agent else "single_turn_agent",
            generate_calls=harness.calls_of(calls, sample),
            tool_names=[name for name, _ in harness.TOOL_CALLS] if tool_agent else [],
        )
    # the workers' sessions are children of the trainer's span, in its trace
    assert {s["trace_id"] for s in spans} == {format(step_span.get_span_context().trace_id, "032x")}
