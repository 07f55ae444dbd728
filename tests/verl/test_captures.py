"""The capture layout on verl 0.9.1's real agent loops: with only the switch, killed mid-call, past a small disk
budget, the conversation rebuilt by ``show`` and ``report``, two Ray nodes, and the run name verl's driver hands
its workers (docs/protocol.md#capture-directories)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness
import pytest
from click.testing import CliRunner
from stack import wait_until
from test_conversation_and_failures import TOOL_ANSWER
from test_plugin import run, tools_config

import verl_otel_bridge as vob
from verl_otel_bridge._internal.captures import budget
from verl_otel_bridge._internal.captures.read import CaptureRecords, find_captures
from verl_otel_bridge._internal.verl import destination
from verl_otel_bridge.cli.app import build_cli
from verl_otel_bridge.report import build_report

HERE = Path(__file__).resolve().parent


def cli(*args: str) -> Any:
    return CliRunner().invoke(build_cli(), list(args))


def the_run(state: Path) -> Path:
    (run_dir,) = destination.default_dir({"XDG_STATE_HOME": str(state)}).iterdir()
    return run_dir


def test_show_and_report_rebuild_the_conversation_whole(verl_files: dict[str, Path], tmp_path: Path) -> None:
    """Only the switch and verl's token2text: the default run folder, each turn's new text once, read back whole."""
    run(tools_config(verl_files, token2text=True), verl_files["model"], harness.make_batch(1, agent_name="tool_agent"))
    vob.shutdown()
    run_dir = the_run(tmp_path / "state")
    records = list(CaptureRecords(find_captures([run_dir]).files))
    generates = sorted(
        (r for r in records if r["attributes"].get("type") == "generate"), key=lambda r: r["attributes"]["turn"]
    )
    first, last = (g["attributes"] for g in generates)
    assert last["input"].startswith(first["input"] + TOOL_ANSWER + "<|im_start|>tool")  # rebuilt whole
    (session,) = [r["attributes"] for r in records if r["name"] == "agent_session"]
    assert (session["input"], session["output"]) == (first["input"], harness.FINAL_ANSWER)
    shown = cli("show", "--text", str(run_dir))
    assert shown.exit_code == 0, shown.output
    assert "[tools] question 0" in shown.stdout and shown.stdout.count("<|im_start|>tool") >= 3, shown.stdout
    reported = cli("report", "--text", str(run_dir))
    assert reported.exit_code == 0, reported.output
    assert "first input" in reported.stdout and "[tools] question 0" in reported.stdout
    assert harness.FINAL_ANSWER.removesuffix("<|im_end|>") in reported.stdout
    out = tmp_path / "report.html"
    assert cli("report", str(run_dir), "--html", str(out)).exit_code == 0
    assert "[tools] question 0" in out.read_text() and "conversation of sample 100" in out.read_text()


def test_a_run_past_a_small_budget_keeps_its_newest_steps(
    verl_files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, budget.__name__)
    monkeypatch.setenv("VERL_OTEL_BRIDGE_CAPTURE_MAX_BYTES", "6000")
    monkeypatch.setattr(budget, "CHECK_INTERVAL_S", 0.0)  # check at every export (a real run's steps take minutes)
    config = tools_config(verl_files, token2text=True)
    for step in range(1, 7):
        run(config, verl_files["model"], harness.make_batch(2, step=step, agent_name="tool_agent"))
    status = vob.get_bridge().status()
    vob.shutdown()
    run_dir = the_run(tmp_path / "state")
    kept = sorted(int(p.name.split("=")[1]) for p in run_dir.glob("global_steps=*"))
    said = [r.getMessage() for r in caplog.records if r.name == budget.__name__]
    removed = [int(m.split("removed step ", 1)[1].split()[0]) for m in said]
    assert removed and kept == list(range(max(removed) + 1, 7)), (removed, kept)
    assert sum(f.stat().st_size for f in run_dir.glob("global_steps=*/*")) <= 6000 or kept == [6]
    assert status["counters"]["capture_steps_removed"] == len(removed) == len(set(removed))
    reported = cli("report", str(run_dir))
    assert reported.exit_code == 0 and "step" in reported.stdout


WORKER = """
import asyncio, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2], sys.argv[3]]  # the tool modules, tests/verl, examples
import harness
root = Path(sys.argv[1])
model = harness.build_model_dir(root)
config = harness.make_config(model, tools=harness.build_tools(root))

async def main():
    worker, server = harness.make_worker(config, model, latency_s=0.01)
    step = 0
    while True:
        step += 1
        await worker.generate_sequences(harness.make_batch(4, n=2, step=step, agent_name="tool_agent"))

asyncio.run(main())
"""


@pytest.mark.timeout(600)
def test_a_worker_killed_mid_call_leaves_files_every_reader_reads(tmp_path: Path) -> None:
    env = {**harness.user_environment(tmp_path), "VERL_OTEL_BRIDGE_SCHEDULE_DELAY_MS": "20"}
    root = tmp_path / "w"
    root.mkdir()
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(root), str(HERE), str(harness.EXAMPLES)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    spans = destination.default_dir(env)
    try:
        wait_until(lambda: len(list(spans.glob("*/global_steps=*"))) >= 3, 300, interval_s=0.05, message="no steps")
    finally:
        worker.send_signal(signal.SIGKILL)  # mid-call: calls follow each other without a pause
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == -signal.SIGKILL, err.decode(errors="replace")[-4000:]
    (run_dir,) = spans.iterdir()
    files = list(run_dir.glob("global_steps=*/*.jsonl.gz"))
    assert files
    shown = cli("show", str(run_dir))
    assert shown.exit_code == 0, shown.output
    reported = cli("report", str(run_dir))
    assert reported.exit_code == 0 and "sessions" in reported.stdout, reported.output
    assert cli("report", str(run_dir), "--html", str(tmp_path / "r.html")).exit_code == 0
    replayed = cli("replay", str(run_dir), "--to", "console")
    assert replayed.exit_code == 0, replayed.output
    assert sum(1 for line in replayed.stdout.splitlines() if line.startswith("{")) >= 8


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["shared", "default"])
def test_two_ray_nodes_write_into_one_run_folder_with_the_shared_setting_else_the_driver_warns(
    tmp_path: Path, mode: str
) -> None:
    env = {k: v for k, v in harness.user_environment(tmp_path).items() if k not in ("RAY_ADDRESS", "XDG_STATE_HOME")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(HERE / "two_nodes.py"), mode, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    (result,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(result.removeprefix("RESULT ")) == {"trajectories": 8}, time.monotonic() - started
    warned = [line for line in done.stderr.splitlines() if "Ray has 2 nodes" in line]
    if mode == "shared":
        assert not warned, warned
        (run_dir,) = (tmp_path / "shared").iterdir()  # both nodes agree on the run: Ray's job id
        files = list((run_dir / "global_steps=5").iterdir())
        assert len({f.name.rsplit("-", 2)[1] for f in files}) == 2, files  # one worker per node
        assert not (tmp_path / "node-0").exists() and not (tmp_path / "node-1").exists()
        assert cli("report", str(run_dir)).exit_code == 0
        (step,) = build_report([run_dir]).steps  # the report sees both nodes' sessions
        assert (step.step, step.sessions, step.finished) == (5, 8, 8)
    else:
        (said,) = warned
        assert destination.CAPTURE_DIR_ENV in said and said.count("127.0.0.1") >= 2
        for node in ("node-0", "node-1"):  # each node's sessions in its own node-local directory
            spans = destination.default_dir({"XDG_STATE_HOME": str(tmp_path / node)})
            records = list(CaptureRecords(find_captures([spans]).files))
            assert any(r["name"] == "agent_session" for r in records), node


def test_verls_driver_names_the_run_for_every_worker(
    verl_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    config = harness.make_config(verl_files["model"])
    env = get_ppo_ray_runtime_env(config)["env_vars"]
    assert env["VERL_OTEL_BRIDGE_CAPTURE_RUN"].startswith("exp-")
    assert (
        env["VERL_OTEL_BRIDGE_CAPTURE_RUN"]
        != get_ppo_ray_runtime_env(config)["env_vars"]["VERL_OTEL_BRIDGE_CAPTURE_RUN"]
    )
    monkeypatch.setenv("VERL_OTEL_BRIDGE_CAPTURE_RUN", "mine")  # the user's own name is kept
    assert "VERL_OTEL_BRIDGE_CAPTURE_RUN" not in get_ppo_ray_runtime_env(config)["env_vars"]
    untraced = harness.make_config(verl_files["model"], backend=None)
    monkeypatch.delenv("VERL_OTEL_BRIDGE_CAPTURE_RUN")
    assert "VERL_OTEL_BRIDGE_CAPTURE_RUN" not in get_ppo_ray_runtime_env(untraced)["env_vars"]
