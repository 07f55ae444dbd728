"""A Ray cluster of two nodes on this machine (``ray.cluster_utils.Cluster``, loopback only) running verl's
``AgentLoopManager`` with one ``AgentLoopWorker`` per node: ``python two_nodes.py shared|default ROOT``.

Each node's processes get a state directory of their own (``ROOT/node-<i>``), as two machines would:
the default span directory is node-local. ``shared`` sets ``VERL_OTEL_BRIDGE_CAPTURE_DIR=ROOT/shared``
in the job's runtime env (and on this driver, as verl's TaskRunner gets it); ``default`` sets nothing.
Prints one line, ``RESULT {"trajectories": n}``. Used by ``test_captures.py``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOPBACK = "127.0.0.1"
ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "NO_PROXY": LOOPBACK,
    "no_proxy": LOOPBACK,
}
os.environ.update(ENV)  # before anything imports ray
sys.path.insert(0, str(HERE))

import harness  # noqa: E402

CAPTURE_DIR_ENV = "VERL_OTEL_BRIDGE_CAPTURE_DIR"


def main(mode: str, root: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.workers.rollout.llm_server import LLMServerClient

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")
    sys.path.insert(0, str(root))
    model = harness.build_model_dir(root)
    tools = harness.build_tools(root)
    job_env = {**ENV, "PYTHONPATH": os.pathsep.join([str(root), str(HERE), str(harness.EXAMPLES)])}
    if mode == "shared":
        job_env[CAPTURE_DIR_ENV] = os.environ[CAPTURE_DIR_ENV] = str(root / "shared")
    nodes = [{"XDG_STATE_HOME": str(root / f"node-{i}")} for i in range(2)]
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": LOOPBACK, "env_vars": nodes[0]},
    )
    try:
        cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK, env_vars=nodes[1])
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, runtime_env={"env_vars": job_env}, _node_ip_address=LOOPBACK)
        config = harness.make_config(model, tools=tools, num_workers=2)
        server = ray.remote(num_cpus=0)(harness.ScriptedServer).remote(str(model))
        balancer = ray.remote(num_cpus=0)(harness.LoadBalancer).remote(server)
        reward = ray.remote(num_cpus=0)(RewardLoopWorker).remote(config)
        manager = AgentLoopManager.create(
            config,
            llm_client=LLMServerClient(config, load_balancer_handle=balancer),
            reward_loop_worker_handles=[reward],
        )
        batch = DataProto.concat(
            [harness.make_batch(2, n=2, step=5, agent_name="tool_agent"), harness.make_batch(2, n=2, step=5, first=2)]
        )
        output = manager.generate_sequences(batch)
        print("RESULT " + json.dumps({"trajectories": len(output)}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
