"""The plugin through Ray: verl's ``AgentLoopManager`` starts real ``AgentLoopWorker`` actors on loopback.

The workers get no code and no bridge setting: ``import verl`` in each actor loads
the plugin, and with verl's switch alone the bridge writes to its default
directory (the job's ``runtime_env`` only points ``XDG_STATE_HOME`` at a temporary
directory). The stand-ins (load balancer, scripted LLM server) and verl's
real ``RewardLoopWorker`` are Ray actors too.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import harness

import verl_otel_bridge as vob
from verl_otel_bridge.testing import capture_spans


def bridge_warnings() -> dict[int, list[str]]:
    """The verl plugin's default-destination WARNINGs in the Ray workers' own logs (``worker-*-<pid>.err``),
    by worker pid: what a user sees (Ray also forwards these lines to the driver's console)."""
    import ray

    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    found: dict[int, list[str]] = {}
    for log in logs.glob("worker-*.err"):
        said = [line for line in log.read_text(errors="replace").splitlines() if NO_DESTINATION in line]
        if said:
            found[int(log.stem.rsplit("-", 1)[1])] = said
    return found


NO_DESTINATION = "verl_otel_bridge: no destination is configured for spans"


def test_agent_loop_manager_on_ray_traces_every_trajectory_under_the_trainers_step(
    agent_loop_on_ray: Callable[[int], harness.RayAgentLoop], verl_files: dict[str, Path]
) -> None:
    import ray
    from verl.protocol import DataProto

    loop = agent_loop_on_ray(1)
    batch = DataProto.concat(
        [harness.make_batch(1, n=2, step=11, agent_name="tool_agent"), harness.make_batch(1, n=2, step=11, first=1)]
    )
    with capture_spans() as capture:
        with vob.span("training_step") as step_span:
            output = loop.manager.generate_sequences(batch)
        (driver_step,) = harness.records(capture.spans)
    assert len(output) == 4
    # Only verl's switch is set: the worker writes to the default directory, a private file of its own, and its
    # log says so once. Each generate_sequences exports its spans before it returns: nothing to wait for.
    ((pid, said),) = bridge_warnings().items()
    (run_dir,) = verl_files["spans"].iterdir()  # one run folder: the experiment and Ray's job id
    assert run_dir.name.startswith("exp-ray-job-")
    (path,) = (run_dir / "global_steps=11").iterdir()
    assert path.name.endswith(f"-{pid}-000000.jsonl.gz")
    assert len(said) == 1 and str(run_dir) in said[0] and f"verl-otel-bridge report {run_dir}" in said[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    spans = harness.worker_spans(verl_files["spans"])
    calls = ray.get(loop.server.get_calls.remote(), timeout=60)
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
