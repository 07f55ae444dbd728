"""A driver and Ray actors tracing one training step as one trace, printed as one span tree.

The driver (the "trainer") opens a span for the step and one session per
sample; each session hands its trajectory to an agent-loop worker, a Ray actor
in another process, together with a carrier from ``propagation.inject()``. The
worker continues the trace and the session identity with
``propagation.attach(carrier, flush=True)`` and records its turns. Nothing
talks to a model: the "LLM" and the tool sleep for a moment.

The workers never call ``configure()``: ``runtime_env={"env_vars": ...}``
tells their bridges to write JSON Lines (one file per process, named after the
pid). At the end the driver merges all files and prints the tree.

Run it on one machine (Ray stays on 127.0.0.1)::

    python examples/ray_agent_loop.py            # spans in a temporary directory
    python examples/ray_agent_loop.py --out DIR  # keep them in DIR

Needs ``pip install ray`` (RL-Insight 0.2.0+ brings it along).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Keep Ray on loopback: read when ray is first imported, so set before the import.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
os.environ.update(LOOPBACK_ENV)

try:
    import ray
except ImportError:
    sys.exit("This example needs Ray: pip install ray")

import verl_otel_bridge as vob  # noqa: E402 - after the loopback settings above
from verl_otel_bridge.propagation import attach, flush_actors, inject  # noqa: E402
from verl_otel_bridge.testing import render_tree  # noqa: E402

WAIT_S = 120.0  # bound of every wait on the workers


@ray.remote(num_cpus=0)
class AgentLoopWorker:
    """Runs trajectories; its bridge configures itself from the environment on first use."""

    def run_trajectory(self, carrier: dict[str, str], prompt: str, seed: int) -> dict[str, Any]:
        """One trajectory: up to three turns, maybe a tool call, then a reward."""
        rng = random.Random(seed)  # noqa: S311 - a simulation, not cryptography
        # flush=True: this call's spans are exported before the driver gets the result,
        # so they survive ray.kill/ray.shutdown, which end actors without atexit.
        with attach(carrier, flush=True), vob.task("solve", worker_pid=os.getpid()) as task:
            turns = 0
            for turn in range(3):
                turns += 1
                with vob.turn(turn) as generate:
                    time.sleep(rng.uniform(0.002, 0.01))
                    wants_tool = turn < 2 and rng.random() < 0.6
                    generate.record(
                        prompt_tokens=len(prompt) + 40 * turn,
                        completion_tokens=rng.randint(10, 120),
                        finish_reason="tool_calls" if wants_tool else "stop",
                        tools="calculator" if wants_tool else None,
                    )
                if not wants_tool:
                    break
                with vob.turn(turn, type="tool", tool="calculator"):
                    time.sleep(0.003)
            reward = round(rng.random(), 3)
            task.set_result(status="success", reward=reward, finished=True)
        return {"pid": os.getpid(), "turns": turns, "reward": reward}


async def run_session(worker: Any, sample: int, step: int) -> dict[str, Any]:
    """The driver's side of one session: identity and span here, the trajectory on a worker."""
    with vob.session(sample=sample, session=0, global_steps=step, uid=f"uid-{sample}") as session:
        carrier = inject()  # plain dict[str, str]: the trace context and the session identity
        result = await asyncio.wait_for(worker.run_trajectory.remote(carrier, f"prompt {sample}", sample), WAIT_S)
        session.finish(status="success", runner_name="ray_agent_loop", reward_source="rule")
    return result


async def training_step(workers: list[Any], step: int, samples: int) -> list[dict[str, Any]]:
    with vob.span("training_step", step=step, samples=samples):
        return await asyncio.gather(*(run_session(workers[i % len(workers)], i, step) for i in range(samples)))


def read_spans(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for the JSONL files (default: a temporary one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ray_agent_loop-"))
    out.mkdir(parents=True, exist_ok=True)

    worker_env = {
        **LOOPBACK_ENV,
        "VERL_OTEL_BRIDGE_EXPORTER": "jsonl",  # a real run would leave "auto" (RL-Insight when usable)
        "VERL_RL_INSIGHT_ENABLE": "0",
        "VERL_OTEL_BRIDGE_JSONL_PATH": str(out / "worker-{pid}.jsonl"),  # {pid}: one file per worker process
    }
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": worker_env},
        log_to_driver=False,
    )
    try:
        vob.configure(exporter="jsonl", jsonl_path=str(out / "driver.jsonl"), rl_insight_enable=False)
        workers = [AgentLoopWorker.remote() for _ in range(args.workers)]
        results = asyncio.run(training_step(workers, step=1, samples=args.samples))
        # Belt and braces before ray.shutdown(): flush whatever the workers recorded outside attach().
        flushed = flush_actors(workers, timeout_s=30)
    finally:
        ray.shutdown()
        vob.shutdown()

    spans = read_spans(out)
    processes = {os.getpid()} | {r["pid"] for r in results}
    print(render_tree(spans))
    print(
        f"\n{len(spans)} spans from {len(processes)} processes, one trace: "
        f"{len({s['trace_id'] for s in spans}) == 1}; workers flushed: {flushed}; files in {out}"
    )


if __name__ == "__main__":
    main()
