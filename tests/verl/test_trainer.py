"""The plugin on verl's trainer: one trace per training step, with verl's own ``marked_timer`` and ``Tracking``.

verl's ``RayPPOTrainer.fit`` needs GPU workers for its actor, critic and reference
models; what it does around them runs here for real: ``marked_timer`` as imported
into ``verl.trainer.ppo.ray_trainer`` (the name ``fit`` calls), verl's ``Tracking``
made as ``fit`` makes it and logging each step as ``fit`` does, and in ``gen`` a real
``AgentLoopManager.generate_sequences`` whose ``AgentLoopWorker`` Ray actors run the
trajectories (the ``agent_loop_on_ray`` fixture, as in ``test_ray.py``). The phases inside ``step`` are the ones that
run on CPU (``gen``, ``reward``, ``adv`` with verl's own GRPO advantage); the model
updates are not run.

``CAPTURE_DIR=tests/browser/fixtures nox -s verl -- -k training_steps`` refreshes the
capture ``tests/browser`` renders (and docs/verl.md's picture is taken from).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
import pytest
from click.testing import CliRunner

from verl_otel_bridge._internal.report.html import render_html
from verl_otel_bridge._internal.verl import install, wrapping
from verl_otel_bridge.cli import app as cli
from verl_otel_bridge.report import build_report
from verl_otel_bridge.testing import capture_spans
from verl_otel_bridge.verl.plugin import SWITCH_ENV

#: Set to a directory to keep the capture of the two-step run there (see the module docstring).
CAPTURE_DIR_ENV = "CAPTURE_DIR"
CAPTURE_NAME = "verl-training-steps.jsonl"
STEPS = (1, 2)
#: verl's timers this test runs per step, as ``fit`` nests them: ``step`` holds the middle three.
TOP_PHASES = ("start_profile", "step", "stop_profile")
STEP_PHASES = ("gen", "reward", "adv")


def run_step(manager: Any, logger: Any, global_steps: int) -> dict[str, Any]:
    """One training step as ``RayPPOTrainer.fit`` runs it, minus the GPU phases; returns the metrics logged."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.metric_utils import compute_timing_metrics
    from verl.trainer.ppo.ray_trainer import marked_timer
    from verl.trainer.ppo.reward import extract_reward

    timing_raw: dict[str, float] = {}
    batch = DataProto.concat(
        [
            harness.make_batch(1, n=2, step=global_steps, agent_name="tool_agent"),
            harness.make_batch(1, n=2, step=global_steps, first=1),
        ]
    )
    with marked_timer("start_profile", timing_raw):
        pass
    with marked_timer("step", timing_raw):
        with marked_timer("gen", timing_raw, color="red"):
            output = manager.generate_sequences(batch)
            timing_raw.update(output.meta_info["timing"])
            output.meta_info.pop("timing", None)
        with marked_timer("reward", timing_raw, color="yellow"):
            reward_tensor, _ = extract_reward(output)
        with marked_timer("adv", timing_raw, color="brown"):
            advantages, _ = compute_grpo_outcome_advantage(
                token_level_rewards=reward_tensor,
                response_mask=output.batch["response_mask"],
                index=batch.non_tensor_batch["uid"],  # fit unions the batch (with uid) into the output
            )
    with marked_timer("stop_profile", timing_raw):
        pass
    metrics = {
        "training/global_step": global_steps,
        "critic/score/mean": reward_tensor.sum(-1).mean(),  # a torch scalar, as verl's metrics often are
        "critic/advantages/max": advantages.max().item(),
        **compute_timing_metrics(batch=output, timing_raw=timing_raw),
    }
    logger.log(data=metrics, step=global_steps)
    return metrics


@pytest.fixture(scope="module")
def training_steps(
    agent_loop_on_ray: Callable[[int], harness.RayAgentLoop],
    verl_files: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """Two steps on Ray: the trainer's spans (records), the workers' spans of those steps, the metrics logged."""
    from omegaconf import OmegaConf
    from verl.utils.tracking import Tracking

    loop = agent_loop_on_ray(2)
    config = loop.config
    with capture_spans() as capture:
        # as RayPPOTrainer.fit makes it
        logger = Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=[],
            config=OmegaConf.to_container(config, resolve=True),
        )
        logged = {step: run_step(loop.manager, logger, step) for step in STEPS}
        assert capture.bridge.force_flush(30)
        driver = harness.records(capture.spans)
    traces = {r["trace_id"] for r in driver}
    workers = [r for r in harness.worker_spans(verl_files["spans"]) if r["trace_id"] in traces]
    capture_file = tmp_path_factory.mktemp("training-steps") / CAPTURE_NAME
    lines = [json.dumps(r, sort_keys=True) for r in sorted(driver + workers, key=lambda r: r["start_time_ns"])]
    capture_file.write_text("\n".join(lines) + "\n")
    if os.environ.get(CAPTURE_DIR_ENV):
        kept = Path(os.environ[CAPTURE_DIR_ENV]) / CAPTURE_NAME
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(capture_file.read_text())
    yield {"driver": driver, "workers": workers, "logged": logged, "capture": capture_file}


def test_training_steps_one_trace_per_step_with_phases_sessions_under_gen_and_metrics(
    training_steps: dict[str, Any],
) -> None:
    driver, workers, logged = training_steps["driver"], training_steps["workers"], training_steps["logged"]
    steps = [r for r in driver if r["name"] == "training_step"]
    assert sorted(s["attributes"]["global_steps"] for s in steps) == list(STEPS)
    assert len({s["trace_id"] for s in steps}) == len(STEPS)  # one trace per step
    for step in steps:
        global_steps = step["attributes"]["global_steps"]
        assert step["parent_span_id"] is None  # the root of its trace
        assert (step["attributes"]["project"], step["attributes"]["experiment_name"]) == ("proj", "exp")
        mine = [r for r in driver if r["trace_id"] == step["trace_id"]]
        phases = {r["name"]: r for r in mine if "training.phase" in r["attributes"]}
        assert sorted(phases) == sorted(TOP_PHASES + STEP_PHASES)
        assert all(phases[name]["parent_span_id"] == step["span_id"] for name in TOP_PHASES)
        assert all(phases[name]["parent_span_id"] == phases["step"]["span_id"] for name in STEP_PHASES)
        assert all(r["attributes"]["training.phase"] == name for name, r in phases.items())
        # every session of the step ran on a Ray worker, under gen, in the step's trace
        sessions = [r for r in workers if r["name"] == "agent_session" and r["trace_id"] == step["trace_id"]]
        assert sorted((s["attributes"]["sample"], s["attributes"]["session"]) for s in sessions) == [
            ("100", "0"),
            ("100", "1"),
            ("101", "0"),
            ("101", "1"),
        ]
        assert {s["parent_span_id"] for s in sessions} == {phases["gen"]["span_id"]}
        assert {s["attributes"]["global_steps"] for s in sessions} == {global_steps}
        gen = phases["gen"]
        assert all(
            gen["start_time_ns"] <= s["start_time_ns"] <= s["end_time_ns"] <= gen["end_time_ns"] for s in sessions
        )
        # the metrics verl logged, queryable on the step's trace
        records = [r for r in mine if r["name"] == "training_step.metrics"]
        assert records and all(r["parent_span_id"] == step["span_id"] for r in records)
        metrics = {k: v for r in records for k, v in r["attributes"].items() if k.startswith("metric.")}
        expected = logged[global_steps]
        assert set(metrics) == {f"metric.{key}" for key in expected}
        assert metrics["metric.training/global_step"] == global_steps
        assert metrics["metric.timing_s/gen"] == expected["timing_s/gen"]
        assert metrics["metric.critic/score/mean"] == pytest.approx(expected["critic/score/mean"].item())
        assert all(r["attributes"]["global_steps"] == global_steps for r in records)
    # each generate_sequences call went to both Ray workers
    assert len({r["attributes"]["state_lane_id"] for r in workers if r["name"] == "agent_session"}) == 4


def test_report_shows_each_steps_phase_breakdown_beside_its_sessions(training_steps: dict[str, Any]) -> None:
    capture = str(training_steps["capture"])
    report = build_report([capture])
    assert [s.step for s in report.steps] == list(STEPS)
    for step in report.steps:
        assert step.sessions == 4 and step.trainer is not None
        phases = {p.name: p for p in step.trainer.phases}
        assert sorted(phases) == sorted(TOP_PHASES + STEP_PHASES)
        assert len(step.trainer.sessions_under("gen")) == 4
        share = step.trainer.share(phases["gen"])
        assert share is not None and 0 < share < 1
        assert step.trainer.metrics["training/global_step"] == step.step
    text = CliRunner().invoke(cli.build_cli(), ["report", capture], catch_exceptions=False)
    assert text.exit_code == 0, text.output
    assert text.output.count("phases: training_step") == len(STEPS)
    gen_rows = [line.split() for line in text.output.splitlines() if re.fullmatch(r"gen +[\d.]+ +\d+%.*", line.strip())]
    assert len(gen_rows) == len(STEPS) and all(row[2].endswith("%") and row[3] == "4" for row in gen_rows)
    page = render_html(report)
    assert page.count('<svg class="timeline"') == len(STEPS)
    assert page.count('<g class="timeline-session"') == 4 * len(STEPS)


# --------------------------------------------------------------------------- in-process: no Ray needed


def tracking(backend: str | None = "otel") -> Any:
    """verl's ``Tracking`` as ``fit`` makes it, over a config whose rollout-trace backend is ``backend``."""
    from verl.utils.tracking import Tracking

    config = {"trainer": {"project_name": "proj", "experiment_name": "exp"}}
    config["actor_rollout_ref"] = {"rollout": {"trace": {"backend": backend}}}  # type: ignore[dict-item]
    return Tracking(project_name="proj", experiment_name="exp", default_backend=[], config=config)


def test_import_verl_wraps_the_trainer_and_tracking() -> None:
    probe = (
        "import verl.trainer.ppo.ray_trainer as t, verl.utils.tracking as k; p = '__verl_otel_bridge_patched__'; "
        "print([getattr(f, p, False) for f in (t.marked_timer, vars(t.RayPPOTrainer)['fit'], "
        "vars(k.Tracking)['__init__'], vars(k.Tracking)['log'])])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["[True,", "True,", "True,", "True]"], done.stderr[-2000:]


def test_tracing_off_makes_no_span_and_verl_times_as_before() -> None:
    from verl.trainer.ppo.ray_trainer import marked_timer

    with capture_spans() as capture:
        logger = tracking(backend=None)
        timing_raw: dict[str, float] = {}
        with marked_timer("step", timing_raw), marked_timer("gen", timing_raw):
            pass
        logger.log(data={"timing_s/step": timing_raw["step"]}, step=1)
        assert capture.bridge.force_flush(30)
        assert capture.spans == []
    assert set(timing_raw) == {"step", "gen"}


def test_the_switch_traces_the_trainer_whatever_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer.ppo.ray_trainer import marked_timer

    monkeypatch.setenv(SWITCH_ENV, "1")
    with capture_spans() as capture:
        logger = tracking(backend=None)
        with marked_timer("step", {}):
            pass
        logger.log(data={}, step=4)
        assert capture.bridge.force_flush(30)
        assert sorted(s.name for s in capture.spans) == ["step", "training_step"]


def test_a_step_verl_did_not_log_ends_when_the_next_one_starts() -> None:
    from verl.trainer.ppo.ray_trainer import marked_timer

    with capture_spans() as capture:
        logger = tracking()
        for _ in range(2):
            with marked_timer("step", {}):
                pass
        logger.log(data={}, step=2)
        assert capture.bridge.force_flush(30)
        steps = sorted(capture.by_name("training_step"), key=lambda s: s.start_time)
        phases = sorted(capture.by_name("step"), key=lambda s: s.start_time)
    assert len(steps) == len(phases) == 2
    for step, phase in zip(steps, phases, strict=True):
        assert phase.parent is not None and phase.parent.span_id == step.context.span_id
    assert "global_steps" not in steps[0].attributes and steps[1].attributes["global_steps"] == 2


def test_an_exception_in_a_phase_passes_through_and_ends_the_step_with_error() -> None:
    from verl.trainer.ppo.ray_trainer import marked_timer

    class Boom(Exception):
        pass

    with capture_spans() as capture:
        tracking()
        with pytest.raises(Boom, match="update failed"), marked_timer("step", {}):
            with marked_timer("update_actor", {}):
                raise Boom("update failed")
        assert capture.bridge.force_flush(30)
        (step,) = capture.by_name("training_step")
        (phase,) = capture.by_name("update_actor")
    assert step.status.status_code.name == "ERROR" and phase.status.status_code.name == "ERROR"


def test_fit_ending_ends_a_step_still_open() -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, marked_timer

    with capture_spans() as capture:
        tracking()
        with marked_timer("step", {}):
            pass
        with pytest.raises(AttributeError):
            RayPPOTrainer.fit(types.SimpleNamespace())  # verl's own fit fails at its first line
        (step,) = capture.by_name("training_step")  # ended and exported by fit's end
    assert step.status.status_code.name == "ERROR"


def test_an_instrumentation_error_is_logged_once_and_verl_times_unchanged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from verl.trainer.ppo.ray_trainer import marked_timer

    def broken(self: Any, name: str, /, **attributes: Any) -> Any:
        raise RuntimeError("instrumentation bug")

    monkeypatch.setattr(wrapping, "_once", wrapping.OnceLogger(wrapping.logger))
    caplog.set_level(logging.WARNING, logger="verl_otel_bridge")
    with capture_spans() as capture:
        monkeypatch.setattr(type(capture.bridge), "span", broken)
        logger = tracking()
        timing_raw: dict[str, float] = {}
        for step in (1, 2):
            with marked_timer("step", timing_raw):
                pass
            logger.log(data={"x": 1}, step=step)
        assert capture.bridge.force_flush(30)
    assert "step" in timing_raw
    said = [r for r in caplog.records if "instrumentation bug" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


def test_a_trainer_not_as_expected_is_left_untraced_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wrapping, "_once", wrapping.OnceLogger(wrapping.logger))
    module = types.ModuleType("verl.trainer.ppo.ray_trainer")

    def marked_timer(label: str, timings: dict[str, float]) -> None:  # renamed parameters
        return None

    module.marked_timer = marked_timer  # type: ignore[attr-defined]
    caplog.set_level(logging.WARNING, logger="verl_otel_bridge")
    install.install(module)
    assert module.marked_timer is marked_timer  # type: ignore[attr-defined]
    said = [r for r in caplog.records if "is not the method the verl plugin knows" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.WARNING]  # marked_timer, RayPPOTrainer.fit
    assert "marked_timer" in said[0].getMessage() and "timing_raw" in said[0].getMessage()
