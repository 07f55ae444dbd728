"""The ``verl.plugins`` entry point on verl 0.9.1's real agent loops, in-process (``AgentLoopWorker.generate_sequences``).

Each test builds verl's worker with the CPU harness and a trace backend, runs one
batch and reads what the current bridge exported.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness
import pytest

import verl_otel_bridge as vob
from verl_otel_bridge._internal import current
from verl_otel_bridge._internal.verl import install, wrapping
from verl_otel_bridge.testing import capture_spans
from verl_otel_bridge.verl.plugin import SWITCH_ENV


def run(config: Any, model_dir: Path, batch: Any) -> tuple[Any, harness.ScriptedServer]:
    """verl's worker built and run in one event loop (its reward worker keeps the loop it was made in)."""

    async def main() -> tuple[Any, harness.ScriptedServer]:
        worker, server = harness.make_worker(config, model_dir)
        return await worker.generate_sequences(batch), server

    return asyncio.run(asyncio.wait_for(main(), 120))


def tools_config(verl_files: dict[str, Path], **kwargs: Any) -> Any:
    return harness.make_config(
        verl_files["model"], tools=(verl_files["tools_yaml"], verl_files["function_tools"]), **kwargs
    )


def identity(sample: str, session: int, *, step: int = 3, project: str = "proj", experiment: str = "exp") -> dict:
    return {
        "project": project,
        "experiment_name": experiment,
        "sample": sample,
        "session": str(session),
        "traj": "0",
        "uid": f"uid-{int(sample) - 100}",
        "global_steps": step,
        "state_lane_id": f"experiment={experiment}/sample={sample}/session={session}/traj=0",
    }


# --------------------------------------------------------------------------- loading


def test_import_verl_loads_the_plugin_and_the_plugin_imports_no_verl_module() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="verl.plugins") if e.name == "verl_otel_bridge"]
    assert entry.value == "verl_otel_bridge.verl.plugin"
    probe = (
        "import sys, verl_otel_bridge.verl.plugin as p; "
        "print(sorted(m for m in sys.modules if m == 'verl' or m.startswith('verl.')))"
    )
    alone = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert alone.stdout.strip() == "[]"
    probe = (
        "import sys, inspect, verl; print('verl_otel_bridge.verl.plugin' in sys.modules); "
        "from verl.experimental.agent_loop.agent_loop import AgentLoopWorker as W; "
        "from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop as T; "
        "from verl.workers.rollout.llm_server import LLMServerClient as C; "
        "print([getattr(vars(k)[m], '__verl_otel_bridge_patched__', False) and inspect.iscoroutinefunction(getattr(k, m)) "
        "for k, m in ((W, '_run_agent_loop'), (W, 'generate_sequences'), (T, '_call_tool'), (C, 'generate'))])"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.split() == ["True", "[True,", "True,", "True,", "True]"], loaded.stderr[-2000:]


# --------------------------------------------------------------------------- what a trajectory records


def test_single_turn_loop_one_session_per_trajectory(verl_files: dict[str, Path]) -> None:
    config = harness.make_config(verl_files["model"])
    config.actor_rollout_ref.rollout.trace.project_name = "trace-proj"  # verl's RolloutTraceConfig wins
    config.actor_rollout_ref.rollout.trace.experiment_name = "trace-exp"
    with capture_spans() as capture:
        output, server = run(config, verl_files["model"], harness.make_batch(2, n=2, step=7))
        assert capture.bridge.force_flush(30)
        spans = harness.records(capture.spans)
    assert len(output) == 4 and output.batch["rm_scores"].sum().item() == 4.0  # verl's own result is intact
    groups = harness.by_trajectory(spans)
    assert sorted(groups) == [("100", "0"), ("100", "1"), ("101", "0"), ("101", "1")]
    for (sample, session), group in groups.items():
        session_span = harness.check_trajectory(
            group,
            identity=identity(sample, int(session), step=7, project="trace-proj", experiment="trace-exp"),
            agent_name="single_turn_agent",
            generate_calls=harness.calls_of(server.calls, sample),
        )
        assert session_span["attributes"]["response_length"] == server.calls[0]["completion_tokens"]
        assert len(group) == 3  # session, the loop's run, one generate turn
    assert len({g[0]["trace_id"] for g in groups.values()}) == 4
    assert sum(len([s for s in g if s["name"] == "agent_turn"]) for g in groups.values()) == len(server.calls)


def test_tool_loop_one_turn_per_call_and_per_tool_of_every_kind(verl_files: dict[str, Path]) -> None:
    with capture_spans() as capture:
        _, server = run(
            tools_config(verl_files),
            verl_files["model"],
            harness.make_batch(2, n=1, agent_name="tool_agent", validate=True),
        )
        assert capture.bridge.force_flush(30)
        spans = harness.records(capture.spans)
    groups = harness.by_trajectory(spans)
    assert sorted(groups) == [("100", "0"), ("101", "0")]
    for (sample, _), group in groups.items():
        calls = harness.calls_of(server.calls, sample)
        assert len(calls) == 2  # tool calls, then the answer
        harness.check_trajectory(
            group,
            identity={**identity(sample, 0), "_validate": True},
            agent_name="tool_agent",
            generate_calls=calls,
            tool_names=[name for name, _ in harness.TOOL_CALLS],
        )
        tools = {s["attributes"]["tools"]: s["attributes"] for s in group if s["attributes"].get("type") == "tool"}
        assert {name: json.loads(t["tool_args"]) for name, t in tools.items()} == dict(harness.TOOL_CALLS)
        assert tools["base_default"]["content"] == "Updated the tool state."  # BaseTool.execute itself
        assert (tools["base_override"]["content"], tools["base_override"]["tool_reward"]) == (
            harness.OVERRIDE_TEXT,
            0.5,
        )
        assert json.loads(tools["base_override"]["tool_metrics"]) == {"calls": 1}
        assert tools["add_numbers"]["content"] == "42"  # the function tool
        assert all(t["latency_ms"] >= 0 and t["gen_ai.operation.name"] == "execute_tool" for t in tools.values())


def test_long_tool_response_is_bounded_like_every_attribute(verl_files: dict[str, Path]) -> None:
    with capture_spans(max_attribute_length=16) as capture:
        run(tools_config(verl_files), verl_files["model"], harness.make_batch(1, agent_name="tool_agent"))
        assert capture.bridge.force_flush(30)
    (default,) = [s for s in capture.by_name("agent_turn") if s.attributes.get("tools") == "base_default"]
    assert str(default.attributes["content"]).startswith("Updated ") and "truncated" in str(
        default.attributes["content"]
    )


# --------------------------------------------------------------------------- when nothing is traced


def test_backend_unset_makes_no_span_and_no_bridge(verl_files: dict[str, Path]) -> None:
    output, server = run(
        harness.make_config(verl_files["model"], backend=None), verl_files["model"], harness.make_batch(2)
    )
    assert len(output) == 2 and len(server.calls) == 2
    assert current.current_bridge() is None


def test_another_backend_is_left_alone(verl_files: dict[str, Path]) -> None:
    with capture_spans() as capture:
        run(harness.make_config(verl_files["model"], backend="not-otel"), verl_files["model"], harness.make_batch(1))
        assert capture.bridge.force_flush(30)
        assert capture.spans == []


def test_switch_forces_tracing_on_or_off(verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH_ENV, "1")
    with capture_spans() as capture:
        run(harness.make_config(verl_files["model"], backend=None), verl_files["model"], harness.make_batch(1))
        assert capture.bridge.force_flush(30)
        assert len(capture.sessions()) == 1
    from verl.utils.rollout_trace import RolloutTraceConfig

    RolloutTraceConfig.reset()
    monkeypatch.setenv(SWITCH_ENV, "0")
    with capture_spans() as capture:
        run(harness.make_config(verl_files["model"]), verl_files["model"], harness.make_batch(1))
        assert capture.bridge.force_flush(30)
        assert capture.spans == []


def test_verls_sampling_is_honoured(verl_files: dict[str, Path]) -> None:
    config = harness.make_config(verl_files["model"], max_samples=1)
    with capture_spans() as capture:
        _, server = run(config, verl_files["model"], harness.make_batch(3, n=2))
        assert capture.bridge.force_flush(30)
        spans = harness.records(capture.spans)
    assert len(server.calls) == 6  # every trajectory ran...
    groups = harness.by_trajectory(spans)
    (sample,) = {sample for sample, _ in groups}  # ...one prompt, with all its rollouts, was traced
    assert sorted(groups) == [(sample, "0"), (sample, "1")]
    assert len(spans) == 6


def test_untraced_trajectory_makes_no_span(verl_files: dict[str, Path]) -> None:
    """``trace=False`` (what verl's sampling passes): the wrapped ``_run_agent_loop`` runs with no span."""
    config = harness.make_config(verl_files["model"])

    async def main() -> Any:
        worker, _ = harness.make_worker(config, verl_files["model"])
        batch = harness.make_batch(1)
        kwargs = {k: v[0] for k, v in batch.non_tensor_batch.items()}
        info = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}
        return await worker._run_agent_loop({"temperature": 1.0}, info, trace=False, **kwargs)

    with capture_spans() as capture:
        output = asyncio.run(asyncio.wait_for(main(), 120))
        assert capture.bridge.force_flush(30)
        assert output.reward_score == 1.0 and capture.spans == []


# --------------------------------------------------------------------------- configuration and failures


def test_a_worker_without_bridge_configures_one_from_verls_config_and_environment(
    verl_files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "spans.jsonl"
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "jsonl")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(path))
    config = harness.make_config(verl_files["model"], project="trainer-proj", experiment="trainer-exp")
    run(config, verl_files["model"], harness.make_batch(1, step=5))
    bridge = current.current_bridge()
    assert bridge is not None and (bridge.config.project, bridge.config.experiment_name) == (
        "trainer-proj",
        "trainer-exp",
    )
    assert bridge.config.exporter == "jsonl"
    # generate_sequences exported its spans before returning (Ray ends workers without atexit)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(s["name"] for s in lines) == ["agent_session", "agent_task", "agent_turn"]
    assert {s["attributes"]["global_steps"] for s in lines} == {5}


def test_a_bad_bridge_setting_fails_the_worker_at_start(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "nowhere")
    with pytest.raises(ValueError, match="exporter"):
        harness.make_worker(harness.make_config(verl_files["model"]), verl_files["model"])


def test_an_instrumentation_error_is_logged_once_and_verl_runs_unchanged(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Any, **kwargs: Any) -> Any:
        raise RuntimeError("instrumentation bug")

    monkeypatch.setattr(wrapping, "_once", wrapping.OnceLogger(wrapping.logger))
    caplog.set_level(logging.WARNING, logger="verl_otel_bridge")
    with capture_spans() as capture:
        monkeypatch.setattr(type(capture.bridge), "session", broken)
        output, _ = run(harness.make_config(verl_files["model"]), verl_files["model"], harness.make_batch(2))
        assert capture.bridge.force_flush(30)
        assert capture.spans == []
    assert output.batch["rm_scores"].sum().item() == 2.0
    said = [r for r in caplog.records if "instrumentation bug" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


def test_verls_own_exception_passes_through_and_marks_the_session(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Boom(Exception):
        pass

    async def failing(self: Any, **kwargs: Any) -> Any:
        raise Boom("server down")

    monkeypatch.setattr(harness.ScriptedServer, "generate", failing)
    with capture_spans() as capture:
        with pytest.raises(Boom, match="server down"):
            run(harness.make_config(verl_files["model"]), verl_files["model"], harness.make_batch(1))
        assert capture.bridge.force_flush(30)
        (session,) = capture.sessions()
        (turn,) = capture.by_name("agent_turn")
    assert session.attributes["status"] == "error" and session.status.status_code.name == "ERROR"
    assert turn.status.status_code.name == "ERROR"


def test_unknown_verl_method_is_logged_once_and_left_unwrapped(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    module = types.ModuleType("verl.experimental.agent_loop.agent_loop")

    class AgentLoopWorker:
        async def _run_agent_loop(self, sampling_params: Any, info: Any) -> None:  # renamed parameters
            return None

    module.AgentLoopWorker = AgentLoopWorker  # type: ignore[attr-defined]
    monkeypatch.setattr(wrapping, "_once", wrapping.OnceLogger(wrapping.logger))
    caplog.set_level(logging.WARNING, logger="verl_otel_bridge")
    install.install(module)
    assert not hasattr(vars(AgentLoopWorker)["_run_agent_loop"], wrapping.PATCHED)
    assert inspect.iscoroutinefunction(AgentLoopWorker._run_agent_loop)
    (said,) = [r for r in caplog.records if "is not the method the verl plugin knows" in r.getMessage()]
    assert "trajectory" in said.getMessage()


def test_jsonl_status_is_visible(verl_files: dict[str, Path], tmp_path: Path) -> None:
    """What a user checks first: the worker's ``status()`` names its exporter."""
    vob.configure(exporter="jsonl", jsonl_path=str(tmp_path / "s.jsonl"))
    run(harness.make_config(verl_files["model"]), verl_files["model"], harness.make_batch(1))
    status = vob.status()
    assert status["exporter"] == "jsonl" and status["counters"]["ended"] == 3
