"""The main job: a simulated multi-turn agent loop traced through verl-otel-bridge.

Several samples run concurrently, each with a few sessions; every session runs
one task made of generation turns, some of which call tools. Nothing here talks to a model: the
"LLM" and the tools are stand-ins that sleep for a moment. Run it with
``make demo``, ``verl-otel-bridge demo`` or ``python examples/agent_loop.py``.

With the default configuration (``exporter: auto``) the spans go to RL-Insight
when it is installed, reachable and Ray is running; otherwise to the local
in-memory fallback, which this script prints as a tree.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping

import verl_otel_bridge as vob
from verl_otel_bridge.tree import render_tree

TOOLS = ("search", "calculator", "python")


async def fake_llm(rng: random.Random, turn: int) -> dict[str, object]:
    """Pretend to generate: returns token counts and maybe a tool call."""
    await asyncio.sleep(rng.uniform(0.002, 0.01))
    wants_tool = turn < 2 and rng.random() < 0.7
    return {
        "prompt_tokens": rng.randint(50, 400),
        "completion_tokens": rng.randint(10, 200),
        "finish_reason": "tool_calls" if wants_tool else "stop",
        "tool": rng.choice(TOOLS) if wants_tool else None,
    }


@vob.traced("tool_call")
async def run_tool(name: str, args: Mapping[str, object]) -> str:
    """A tool's own work; ``traced`` makes it a span inside whatever session is current."""
    await asyncio.sleep(0.003)
    return f"{name} result for {json.dumps(args)}"


async def agent_session(sample: int, session: int, global_steps: int, rng: random.Random) -> float:
    """One session: a task of up to three generation turns, with tool turns in between."""
    with vob.session(
        sample=sample,
        session=session,
        global_steps=global_steps,
        uid=f"uid-{sample}",
        session_id=f"conv-{sample}-{session}",
    ) as s:
        turn_index = 0
        with s.task("solve") as task:
            for _ in range(3):
                with s.turn(turn_index, type="generate") as turn:
                    out = await fake_llm(rng, turn_index)
                    turn.record(
                        prompt_tokens=int(out["prompt_tokens"]),  # type: ignore[call-overload]
                        completion_tokens=int(out["completion_tokens"]),  # type: ignore[call-overload]
                        finish_reason=str(out["finish_reason"]),
                        tools=str(out["tool"]) if out["tool"] else None,
                    )
                turn_index += 1
                if out["tool"] is None:
                    break
                args = {"query": f"s{sample}/t{turn_index}"}
                with s.turn(turn_index, type="tool") as turn:
                    turn.record(tools=str(out["tool"]), tool_args=args)
                    await run_tool(str(out["tool"]), args)
                turn_index += 1
            reward = round(rng.random(), 3)
            task.set_result(status="success", reward=reward, finished=True, reward_posted=True)
        # Work timed elsewhere (here: a reward model call measured by another component).
        end = time.time_ns()
        vob.record_span("reward_model", start_time_ns=end - 2_000_000, end_time_ns=end, attributes={"reward": reward})
        s.finish(
            status="success",
            trajectories=[{"chain_id": 1, "reward_score": reward, "num_turns": turn_index}],
            runner_name="demo",
            reward_source="rule",
            finished=True,
        )
        return reward


async def run() -> None:
    """Run six concurrent sessions on the current bridge, then print the span tree and ``status()``."""
    rng = random.Random(7)  # noqa: S311 - simulated model outputs, not security
    bridge = vob.get_bridge()  # default configuration, from the environment
    rewards = await asyncio.gather(
        *(agent_session(sample, session, 1, rng) for sample in range(3) for session in range(2))
    )
    bridge.force_flush()
    status = bridge.status()
    print(f"{len(rewards)} sessions done; spans went to: {status['exporter']} ({status['detail']})\n")
    if bridge.memory_exporter is not None and bridge.memory_exporter.get_finished_spans():
        print(render_tree(bridge.memory_exporter.get_finished_spans()))
    print("\nstatus():")
    print(json.dumps(status, indent=2, default=str))
    vob.shutdown()


def main() -> None:
    """Entry point of ``make demo`` and ``verl-otel-bridge demo``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(run())


if __name__ == "__main__":
    main()
