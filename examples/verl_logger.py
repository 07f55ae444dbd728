"""verl's RLInsightLogger API, served by the bridge (the two-line switch in docs/verl.md).

Run: ``python examples/verl_logger.py``. Like verl's class it acts only with
``VERL_RL_INSIGHT_ENABLE=1`` (set here). Without RL-Insight the spans land in the
local fallback and the degraded features are counted in ``status()``.
"""

from __future__ import annotations

import json
import os
import time

import verl_otel_bridge as vob
from verl_otel_bridge.testing import render_tree
from verl_otel_bridge.verl import RLInsightLogger


def main() -> None:
    os.environ.setdefault(RLInsightLogger.ENABLE_ENV, "1")  # what verl sets for trainer.logger=[..., rl_insight]
    config = {"trainer": {"project_name": "demo", "experiment_name": "facade", "logger": ["console", "rl_insight"]}}
    RLInsightLogger.init("demo", "facade", config)
    for step in range(2):
        with RLInsightLogger.trace_state("generate_sequences", state_lane_id=RLInsightLogger.rollout_state_lane_id(0)):
            session = RLInsightLogger.agent_loop_session(sample=0, session=step, global_steps=step, uid="u0")
            start = time.time_ns()
            end = start + 1_500_000
            RLInsightLogger.trace_span(
                "gateway_generation", start_time_ns=start, end_time_ns=end, attributes={**session.identity, "turn": 0}
            )
            session.finish(trajectories=[], status="success", runner_name="facade-demo")
        RLInsightLogger.log({"actor/loss": 0.5 - step / 10, "note": "not a number"}, step=step)
    bridge = vob.get_bridge()
    bridge.force_flush()
    if bridge.memory_exporter is not None:
        print(render_tree(bridge.memory_exporter.get_finished_spans()))
    print(json.dumps(bridge.status(), indent=2, default=str))
    RLInsightLogger.finish()


if __name__ == "__main__":
    main()
