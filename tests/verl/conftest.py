"""Fixtures for the tests against real verl (``nox -s verl``): verl's agent loop on CPU, Ray on loopback,
and the integration suite's real RL-Insight stack (its fixtures are reused, not copied)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))  # `import stack`

import harness
import stack

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

#: What the Ray workers get through the job's runtime_env: the two-line recipe of docs/verl.md.
WORKER_PREFIX = "VERL_OTEL_BRIDGE_"


@pytest.fixture(scope="session")
def verl_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model directory, tool files and the directory Ray workers write their JSONL spans to."""
    root = tmp_path_factory.mktemp("verl")
    sys.path.insert(0, str(root))  # verl imports the tool classes by module name
    tools_yaml, function_tools = harness.build_tools(root)
    spans = root / "spans"
    spans.mkdir()
    return {
        "root": root,
        "model": harness.build_model_dir(root),
        "tools_yaml": tools_yaml,
        "function_tools": function_tools,
        "spans": spans,
    }


@pytest.fixture(scope="session")
def ray_local(verl_files: dict[str, Path]) -> Iterator[stack.RayLoopback]:
    """Ray on loopback, shared with the RL-Insight hub; workers configure their bridge from this environment."""
    worker_env = {
        "PYTHONPATH": os.pathsep.join([str(verl_files["root"]), str(HERE)]),  # tool modules; the stand-ins
        f"{WORKER_PREFIX}EXPORTER": "jsonl",
        f"{WORKER_PREFIX}JSONL_PATH": str(verl_files["spans"] / "worker-{pid}.jsonl"),
    }
    # Ray's processes inherit the driver's environment: leave out any VERL_OTEL_BRIDGE_* of the caller's
    # (a stray one would change or, unknown, be rejected by the workers' bridges).
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(WORKER_PREFIX)]:
            patch.delenv(name)
        with stack.ray_loopback({**integration.HUB_ENV, **worker_env}) as ray_info:
            yield ray_info


@pytest.fixture(autouse=True)
def _clean_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a fresh verl process would: no bridge, verl's trace config not yet initialised,
    no ``VERL_OTEL_BRIDGE_*`` (the Ray workers' variables stay theirs) and the plugin switch unset."""
    import verl_otel_bridge as vob
    from verl_otel_bridge.rl_insight import compat as rl_insight_compat
    from verl_otel_bridge.verl.plugin import SWITCH_ENV

    for name in [n for n in os.environ if n.startswith(WORKER_PREFIX)]:
        monkeypatch.delenv(name)
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
