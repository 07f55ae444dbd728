"""The main job: a simulated step of a multi-turn agent loop, traced, then the report of its own run.

One training step: four prompts (``uid``), each rolled out by four concurrent
sessions (a GRPO group); every session runs one task made of generation turns,
some of which call tools. Nothing here talks to a model: the "LLM" and the tools
are stand-ins that sleep for a moment. Three things are planted for the report
to find: a straggler (one session whose tool call takes about a second), a
zero-advantage group (every session of ``uid-2`` gets reward 1.0) and a tool that
raises. Run it with ``make demo``, ``verl-otel-bridge demo`` or
``python examples/agent_loop.py``.

With the default configuration (``exporter: auto``) the spans go to RL-Insight
when it is installed, reachable and Ray is running; otherwise to the local
in-memory fallback, whose span tree of the straggler this script prints. Either
way :func:`main` also copies the run to ``demo_spans.jsonl`` in its output
directory (``./demo-output`` by default, kept after the demo; ``exporter:
<yours>,jsonl``), with progress records every 0.25 s, writes ``status.json``
beside it, and ends with the report of that file and the two commands that make
it again (text and HTML).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import verl_otel_bridge as vob
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.private_files import UnsafePathError, open_private_new, private_dir
from verl_otel_bridge._internal.protocol import PROGRESS_SPAN_NAME
from verl_otel_bridge._internal.records import JsonWriter
from verl_otel_bridge._internal.status import BridgeStatus
from verl_otel_bridge._internal.tree import render_tree
from verl_otel_bridge._version import install_command

TOOLS = ("search", "calculator", "python")
#: The step simulated, its prompts and the sessions per prompt.
STEP, PROMPTS, GROUP = 1, 4, 4
SESSIONS = PROMPTS * GROUP
#: Planted for the report: the straggler (sample, session) and how long its tool call takes,
#: the prompt every session solves, and the session whose tool raises.
STRAGGLER, STRAGGLER_TOOL_S = (0, 3), 1.0
SOLVED_BY_ALL = 2
FAILING = (1, 1)
#: Progress records while the demo runs (the straggler gets a few).
DEMO_PROGRESS_INTERVAL_S = 0.25
#: Where the demo keeps its capture, status and report, relative to the working directory (git ignores it).
OUTPUT_DIR = Path("demo-output")
CAPTURE_NAME = "demo_spans.jsonl"
STATUS_NAME = "status.json"


class ToolError(RuntimeError):
    """What the planted failing tool raises."""


async def fake_llm(rng: random.Random, turn: int) -> dict[str, object]:
    """Pretend to generate: returns token counts and maybe a tool call."""
    await asyncio.sleep(rng.uniform(0.002, 0.01))
    wants_tool = turn < 2 and rng.random() < 0.7
    return {
        "prompt_tokens": rng.randint(50, 400),
        "completion_tokens": rng.randint(10, 200),
        "finish_reason": "tool_calls" if wants_tool else "stop",
        "tool": rng.choice(TOOLS) if wants_tool else None,
    }


@vob.traced("tool_call")
async def run_tool(name: str, args: Mapping[str, object], seconds: float = 0.003, fail: bool = False) -> str:
    """A tool's own work; ``traced`` makes it a span inside whatever session is current."""
    await asyncio.sleep(seconds)
    if fail:
        raise ToolError(f"{name} failed for {json.dumps(args)}")
    return f"{name} result for {json.dumps(args)}"


async def agent_session(sample: int, session: int, global_steps: int, rng: random.Random) -> float:
    """One session: a task of up to three generation turns, with tool turns in between."""
    straggler, failing = (sample, session) == STRAGGLER, (sample, session) == FAILING
    with vob.session(
        sample=sample,
        session=session,
        global_steps=global_steps,
        uid=f"uid-{sample}",
        session_id=f"conv-{sample}-{session}",
    ) as s:
        turn_index = 0
        with s.task("solve") as task:
            for _ in range(3):
                with s.turn(turn_index, type="generate") as turn:
                    out = await fake_llm(rng, turn_index)
                    if turn_index == 0 and (straggler or failing):  # the planted ones call a tool first
                        out.update(tool="search", finish_reason="tool_calls")
                    turn.record(
                        prompt_tokens=int(out["prompt_tokens"]),  # type: ignore[call-overload]
                        completion_tokens=int(out["completion_tokens"]),  # type: ignore[call-overload]
                        finish_reason=str(out["finish_reason"]),
                        tools=str(out["tool"]) if out["tool"] else None,
                    )
                turn_index += 1
                if out["tool"] is None:
                    break
                tool = str(out["tool"])
                args = {"query": f"s{sample}/t{turn_index}"}
                with s.turn(turn_index, type="tool") as turn:
                    turn.record(tools=tool, tool_args=args)
                    try:
                        await run_tool(tool, args, STRAGGLER_TOOL_S if straggler else 0.003, failing)
                    except ToolError as exc:
                        turn.record(content=f"tool error: {exc}")
                turn_index += 1
            reward = 1.0 if sample == SOLVED_BY_ALL else round(rng.random(), 3)
            task.set_result(status="success", reward=reward, finished=True, reward_posted=True)
        # Work timed elsewhere (here: a reward model call measured by another component).
        end = time.time_ns()
        vob.record_span("reward_model", start_time_ns=end - 2_000_000, end_time_ns=end, attributes={"reward": reward})
        s.finish(
            status="success",
            trajectories=[{"chain_id": 1, "reward_score": reward, "num_turns": turn_index}],
            runner_name="demo",
            reward_source="rule",
            finished=True,
        )
        return reward


async def run() -> BridgeStatus:
    """Run one step's sessions on the current bridge, print where the spans went, the straggler's span tree
    (without its progress records) and ``status()``; shut down; the status at the end of the run."""
    rng = random.Random(7)  # noqa: S311 - simulated model outputs, not security
    bridge = vob.get_bridge()  # default configuration, from the environment
    rewards = await asyncio.gather(
        *(agent_session(sample, session, STEP, rng) for sample in range(PROMPTS) for session in range(GROUP))
    )
    bridge.force_flush()
    status = bridge.status()
    print(f"{len(rewards)} sessions done; spans went to: {destinations(status, bridge.config.jsonl_path)}\n")
    memory = bridge.memory_exporter
    if memory is not None and memory.get_finished_spans():
        spans = memory.get_finished_spans()
        lane = vob.SessionIdentity.create(sample=STRAGGLER[0], session=STRAGGLER[1]).state_lane_id
        print(f"the straggler, sample {STRAGGLER[0]} session {STRAGGLER[1]}:")
        print(
            render_tree(
                [
                    s
                    for s in spans
                    if s.attributes and s.attributes.get("state_lane_id") == lane and s.name != PROGRESS_SPAN_NAME
                ]
            )
        )
    print("\nstatus():")
    print(status)
    vob.shutdown()
    return status


def destinations(status: BridgeStatus, jsonl_path: str) -> str:
    """Every destination of ``status`` in words: where spans went and why, then each copy (a file by its path)."""
    said = [f"{status['exporter']} ({status['detail']})"]
    for name, entry in status["exporters"].items():
        if entry["role"] != "copy" or (name == "jsonl" and jsonl_path in status["detail"]):
            continue  # the detail already names the JSON Lines file
        where = str(capture_path(jsonl_path)) if name == "jsonl" else entry["endpoint"]
        said.append(f"a copy to {name}" + (f" {where}" if where else ""))
    return "; ".join(said)


def capture_path(jsonl_path: str) -> Path:
    """The file the ``jsonl`` exporter of this process writes for ``jsonl_path``."""
    return Path(jsonl_path.replace("{pid}", str(os.getpid()))).expanduser()


def capture_config(directory: Path) -> BridgeConfig:
    """The environment's configuration plus a JSONL capture in ``directory`` and frequent progress records.

    An ``exporter`` that already lists ``jsonl`` keeps its own file.
    """
    config = BridgeConfig.resolve()
    exporters = config.exporters
    if "jsonl" in exporters:
        return BridgeConfig.resolve(config, progress_interval_s=DEMO_PROGRESS_INTERVAL_S)
    wanted = ("jsonl",) if exporters == ("none",) else (*exporters, "jsonl")
    return BridgeConfig.resolve(
        config,
        exporter=wanted,
        jsonl_path=str(directory / CAPTURE_NAME),
        progress_interval_s=DEMO_PROGRESS_INTERVAL_S,
    )


def prepare_output(directory: Path) -> None:
    """Make ``directory`` private to the user (``0700``, refused when it is a link or open to others) and
    remove the last run's capture and status."""
    try:
        private_dir(directory)
    except UnsafePathError as exc:
        raise SystemExit(f"verl-otel-bridge demo: {exc}") from None
    for name in (CAPTURE_NAME, STATUS_NAME):
        (directory / name).unlink(missing_ok=True)


def command_prefix() -> str:
    """How to run ``verl-otel-bridge`` from this shell: the name when it is on ``PATH`` and this
    environment's, else the script beside this interpreter (e.g. ``.venv/bin/verl-otel-bridge``)."""
    beside = Path(sys.executable).parent / "verl-otel-bridge"
    found = shutil.which("verl-otel-bridge")
    if found is not None and (not beside.exists() or Path(found).resolve() == beside.resolve()):
        return "verl-otel-bridge"
    if not beside.exists():
        return f"{_relative(Path(sys.executable))} -m verl_otel_bridge.cli"
    return _relative(beside)


def _relative(path: Path) -> str:
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(output_dir: Path = OUTPUT_DIR) -> None:
    """Entry point of ``make demo`` and ``verl-otel-bridge demo``: the run, its report, and the commands
    that make the report again from what the run left in ``output_dir``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    prepare_output(output_dir)
    config = capture_config(output_dir)
    vob.configure(config)
    status = asyncio.run(run())
    with open(open_private_new(output_dir / STATUS_NAME, os.O_WRONLY), "w", encoding="utf-8") as out:
        out.write(JsonWriter(indent=2, default=str)(status) + "\n")
    capture = capture_path(config.jsonl_path)
    try:
        from rich.console import Console

        from verl_otel_bridge._internal.report.text import renderables
        from verl_otel_bridge.report import build_report
    except ImportError:
        print(f"(the report needs the cli extra: {install_command('cli')})")
        return
    print(f"\nthe report of {capture}:\n")
    console = Console(highlight=False)
    for part in renderables(build_report([capture])):
        console.print(part)
    prefix, shown = command_prefix(), _relative(capture)
    print(f"\nkept: {shown} and {_relative(output_dir / STATUS_NAME)}; the report again, as text and as HTML:")
    print(f"  {prefix} report {shown}")
    print(f"  {prefix} report {shown} --html {_relative(output_dir / 'report.html')}")
