"""Fixtures for the tests against real verl (``nox -s verl``): verl's agent loop on CPU, Ray on loopback,
and the integration suite's real RL-Insight stack (its fixtures are reused, not copied)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))  # `import stack`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `import otlp_receiver`

import harness
import stack

from verl_otel_bridge._internal.config import environment_variables
from verl_otel_bridge._internal.verl import destination

HERE = Path(__file__).resolve().parent

_spec = importlib.util.spec_from_file_location("integration_conftest", HERE.parent / "integration" / "conftest.py")
assert _spec is not None and _spec.loader is not None
integration = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(integration)

# The integration suite's RL-Insight stack: one receiver, discovery server and hub per session.
otlp_receiver = integration.otlp_receiver
rl_insight_server = integration.rl_insight_server
rl_insight_hub = integration.rl_insight_hub
run_tag = integration.run_tag

#: The bridge's variables, which no test inherits from the caller.
WORKER_PREFIX = "VERL_OTEL_BRIDGE_"
#: OpenTelemetry's variables that choose the verl plugin's destination (verl_otel_bridge._internal.verl.destination).
DESTINATION_ENVS = (*environment_variables("exporter")[1:], *environment_variables("otlp_endpoint")[1:])


@pytest.fixture(scope="session")
def verl_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model directory, tool files, and the state directory of the Ray workers (``XDG_STATE_HOME``), whose
    default span directory (``spans``, made by the workers' bridges) they write to."""
    root = tmp_path_factory.mktemp("verl")
    sys.path.insert(0, str(root))  # verl imports the tool classes by module name
    tools_yaml, function_tools = harness.build_tools(root)
    state = root / "state"
    return {
        "root": root,
        "model": harness.build_model_dir(root),
        "tools_yaml": tools_yaml,
        "function_tools": function_tools,
        "state": state,
        "spans": destination.default_dir({"XDG_STATE_HOME": str(state)}),
    }


@pytest.fixture(scope="session")
def ray_local(verl_files: dict[str, Path]) -> Iterator[stack.RayLoopback]:
    """Ray on loopback, shared with the RL-Insight hub. The workers get no bridge setting: only verl's switch,
    so they write to the default directory (under their ``XDG_STATE_HOME``, a temporary one)."""
    worker_env = {
        # tool modules; the stand-ins (examples/verl_cpu.py) Ray's actors are made of
        "PYTHONPATH": os.pathsep.join([str(verl_files["root"]), str(HERE), str(harness.EXAMPLES)]),
        "XDG_STATE_HOME": str(verl_files["state"]),
    }
    # Ray's processes inherit the driver's environment: leave out any VERL_OTEL_BRIDGE_* of the caller's
    # (a stray one would change or, unknown, be rejected by the workers' bridges).
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(WORKER_PREFIX) or n in DESTINATION_ENVS]:
            patch.delenv(name)
        with stack.ray_loopback({**integration.HUB_ENV, **worker_env}) as ray_info:
            yield ray_info


@pytest.fixture(scope="session")
def agent_loop_on_ray(
    ray_local: stack.RayLoopback, verl_files: dict[str, Path]
) -> Callable[[int], harness.RayAgentLoop]:
    """``agent_loop_on_ray(num_workers)``: verl's ``AgentLoopManager`` starting that many ``AgentLoopWorker``
    actors on the loopback Ray, with the stand-ins (scripted LLM server, load balancer) and verl's real
    ``RewardLoopWorker`` as Ray actors too."""
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.workers.rollout.llm_server import LLMServerClient

    def start(num_workers: int) -> harness.RayAgentLoop:
        config = harness.make_config(
            verl_files["model"], tools=(verl_files["tools_yaml"], verl_files["function_tools"]), num_workers=num_workers
        )
        server = ray.remote(num_cpus=0)(harness.ScriptedServer).remote(str(verl_files["model"]))
        balancer = ray.remote(num_cpus=0)(harness.LoadBalancer).remote(server)
        reward = ray.remote(num_cpus=0)(RewardLoopWorker).remote(config)
        manager = AgentLoopManager.create(
            config,
            llm_client=LLMServerClient(config, load_balancer_handle=balancer),
            reward_loop_worker_handles=[reward],
        )
        return harness.RayAgentLoop(config=config, manager=manager, server=server)

    return start


@pytest.fixture(autouse=True)
def _clean_process_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test starts as a fresh verl process would: no bridge, verl's trace config not yet initialised,
    no ``VERL_OTEL_BRIDGE_*`` nor OpenTelemetry destination (the Ray workers' variables stay theirs), the
    plugin switch unset, and a state directory of its own (the plugin's default span directory is in it)."""
    import verl_otel_bridge as vob
    from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
    from verl_otel_bridge.verl.plugin import SWITCH_ENV

    for name in [n for n in os.environ if n.startswith(WORKER_PREFIX) or n in DESTINATION_ENVS]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    monkeypatch.setattr(rl_insight_compat._INIT, "said", set())
    vob.shutdown()
    _reset_rollout_trace()
    yield
    vob.shutdown()
    _reset_rollout_trace()


def _reset_rollout_trace() -> None:
    from verl.utils.rollout_trace import RolloutTraceConfig

    RolloutTraceConfig.reset()
