"""``examples/verl_agent_loop.py`` end to end, as a verl user runs it: a fresh process with only verl's switch
(``actor_rollout_ref.rollout.trace.backend=otel``), no bridge variable, verl's default log level.

It must say, in one WARNING on stderr, where its spans went (the default directory,
a private file of its own) and end with ``report`` on that directory; ``show``
reads the same directory as it is.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import harness
import pytest

from verl_otel_bridge._internal.captures.read import read_records
from verl_otel_bridge._internal.verl import destination

CLI = Path(sys.executable).parent / "verl-otel-bridge"
#: 2 prompts x 2 rollouts of ToolAgentLoop (session, task, 2 generate and 3 tool turns) and of SingleTurnAgentLoop
#: (session, task, 1 generate turn).
SPANS = 4 * 7 + 4 * 3
#: docs/verl.md shows the example's output in the blocks under this mark: stdout's, then the WARNING on stderr.
DOC_MARK = (
    "<!-- doc-test: checked-by "
    "tests/verl/test_example.py::test_the_example_writes_the_default_directory_says_so_once_and_reports_on_it -->"
)
DOC_STATE = "/tmp/vv-state"  # the XDG_STATE_HOME the page shows


def docs_output() -> tuple[str, str]:
    """What docs/verl.md shows the example printing: stdout after verl's own lines, and the WARNING."""
    page = (harness.EXAMPLES.parent / "docs" / "verl.md").read_text(encoding="utf-8")
    shown = re.findall(re.escape(DOC_MARK) + r"\n```text\n(.*?)```", page, re.S)
    assert len(shown) == 2, "docs/verl.md lost the example's output"
    stdout, stderr = shown
    return stdout.split("(verl's own output: its dataset class, the tools' schemas)\n", 1)[1], stderr


def shape(text: str, state: str) -> list[str]:
    """``text`` line by line with what changes from run to run masked: the state directory, the run folder, the
    host and pid in a file name, every number, and the runs of spaces that follow numbers' widths."""
    text = text.replace(state, DOC_STATE)
    text = re.sub(r"exp-\d{8}T\d{6}-[0-9a-f]+", "exp-RUN", text)
    text = re.sub(r"global_steps=<n>/\S*?-\d+-(\d+)\.jsonl", r"global_steps=<n>/<host>-<pid>-\1.jsonl", text)
    text = re.sub(r"\d+(?:\.\d+)?", "0", text)
    return [" ".join(line.split()) for line in text.strip().splitlines()]


@pytest.mark.timeout(600)  # a fresh process imports verl (torch, ray) and runs 8 trajectories
def test_the_example_writes_the_default_directory_says_so_once_and_reports_on_it(tmp_path: Path) -> None:
    env = harness.user_environment(tmp_path)
    done = subprocess.run(
        [sys.executable, str(harness.EXAMPLE)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    directory = destination.default_dir(env)
    (run_dir,) = directory.iterdir()  # the run folder: the experiment, the process's start, a random part
    (path,) = (run_dir / "global_steps=1").iterdir()
    assert run_dir.name.startswith("exp-") and path.name.endswith(".jsonl.gz")
    assert f"-{os.getpid()}-" not in path.name  # the example's own process
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    said = [line for line in done.stderr.splitlines() if "verl_otel_bridge" in line]
    assert len(said) == 1, done.stderr[-4000:]
    # verl's logging format, at its default level: "WARNING:<time>:<message>"
    assert said[0].startswith("WARNING:") and "verl_otel_bridge: no destination is configured for spans" in said[0]
    assert str(run_dir) in said[0] and "VERL_OTEL_BRIDGE_EXPORTER=otlp with OTEL_EXPORTER_OTLP_ENDPOINT" in said[0]
    records = read_records(path).records
    assert len(records) == SPANS
    assert sorted(r["attributes"]["sample"] for r in records if r["name"] == "agent_session") == [
        "100", "100", "101", "101", "102", "102", "103", "103"
    ]  # fmt: skip
    directory = run_dir
    report = done.stdout.split(f"$ verl-otel-bridge report {directory}\n", 1)[1]
    assert f"{SPANS} spans in sessions from 1 files" in report, done.stdout
    step = next(line.split() for line in report.splitlines() if line.strip().startswith("1 "))
    assert step[:3] == ["1", "8", "8"], report  # step 1: 8 sessions, 8 finished
    state = env["XDG_STATE_HOME"]
    shown_stdout, shown_stderr = docs_output()
    printed = done.stdout[done.stdout.index("verl generated") :]
    assert shape(shown_stdout, state) == shape(printed, state), f"docs/verl.md shows other output; now:\n{printed}"
    assert shape(shown_stderr, state) == shape(said[0], state), f"docs/verl.md shows another WARNING; now:\n{said[0]}"

    shown = subprocess.run([str(CLI), "show", str(directory)], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"{SPANS} spans in 8 traces; 0 bad lines" in shown.stderr
    assert shown.stdout.count("agent_session [") == 8
