"""verl's own agent loop on CPU, traced by the plugin with only the switch set, ending with ``report`` on its spans.

verl 0.9.1's real ``AgentLoopWorker`` runs a batch of ``ToolAgentLoop`` trajectories
(three tool calls, then the answer) and ``SingleTurnAgentLoop`` ones, scored by
verl's real ``RewardLoopWorker``; only the LLM server is a stand-in answering from
a script (``examples/verl_cpu.py``: no GPU, no weights). The one bridge setting is
verl's ``actor_rollout_ref.rollout.trace.backend=otel``: with no destination
configured, the worker writes its spans to the default directory (one file per
process) and says so in one WARNING. Then ``verl-otel-bridge report`` reads that
directory.

Needs verl 0.9.1 (with ``cachetools``, ``uvicorn``, ``fastapi``) and the ``cli``
extra; ``nox -s verl`` runs it (``tests/verl/test_example.py``)::

    python examples/verl_agent_loop.py [--prompts 2] [--rollouts 2] [--token2text]

``VERL_OTEL_BRIDGE_EXPORTER`` and the other variables of docs/verl.md choose another
destination; ``report`` runs only when the spans went to JSON Lines.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import verl_cpu

import verl_otel_bridge as vob
from verl_otel_bridge._internal.captures.run import run_folder
from verl_otel_bridge.cli.app import main as cli_main


async def rollout(config: Any, model_dir: Path, batch: Any) -> Any:
    """One ``generate_sequences`` call, as verl's ``AgentLoopManager`` makes on each worker."""
    worker, _server = verl_cpu.make_worker(config, model_dir)
    return await worker.generate_sequences(batch)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prompts", type=int, default=2, help="prompts per agent loop (default 2)")
    parser.add_argument("--rollouts", type=int, default=2, help="rollouts per prompt, verl's n (default 2)")
    parser.add_argument("--token2text", action="store_true", help="verl's actor_rollout_ref.rollout.trace.token2text")
    args = parser.parse_args(argv)

    from verl.protocol import DataProto

    with tempfile.TemporaryDirectory(prefix="verl-cpu-") as scratch:
        root = Path(scratch)
        sys.path.insert(0, str(root))  # verl imports the tool classes by module name
        model_dir = verl_cpu.build_model_dir(root)
        config = verl_cpu.make_config(
            model_dir, backend="otel", tools=verl_cpu.build_tools(root), token2text=args.token2text
        )
        batch = DataProto.concat(
            [
                verl_cpu.make_batch(args.prompts, n=args.rollouts, step=1, agent_name="tool_agent"),
                verl_cpu.make_batch(args.prompts, n=args.rollouts, step=1, first=args.prompts),
            ]
        )
        output = asyncio.run(rollout(config, model_dir, batch))
    print(f"verl generated {len(output)} trajectories; mean reward {output.batch['rm_scores'].sum(-1).mean():.2f}")

    bridge = vob.get_bridge()
    status = bridge.status()
    if not status["counters"]["ended"]:
        print("no spans: the plugin did not trace (is VERL_OTEL_TRACE=0 or VERL_USE_EXTERNAL_PLUGINS set?)")
        return
    print(f"spans: {status['exporter']} ({status['detail']}); exported {status['counters']['exported']}")
    place = run_folder(bridge.config) if bridge.config.capture_dir and "jsonl" in bridge.config.exporters else None
    vob.shutdown()
    if place is not None:
        print(f"\n$ verl-otel-bridge report {place}")
        cli_main(["report", str(place)])


if __name__ == "__main__":
    main()
