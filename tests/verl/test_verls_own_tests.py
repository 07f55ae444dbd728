"""With the plugin installed and neither tracing nor RL-Insight selected, nothing of verl changes: verl's own CPU
tests of its agent loops and tools (from verl 0.9.1's source distribution, ``tests/verl_sources.py``) give the same
outcome, test by test, with the plugin loaded and with verl told to load no plugin (``VERL_USE_EXTERNAL_PLUGINS=none``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import verl_sources

#: verl's CPU tests of the agent loops and the tools (their file names end ``_on_cpu``).
SUITES = ("tests/experimental/agent_loop", "tests/tools")

#: Runs pytest in-process on the files given, then reports each test's outcome and whether the plugin wrapped verl.
RUNNER = """
import json, sys, pytest
outcomes = {}
class Outcomes:
    def pytest_runtest_logreport(self, report):
        if report.failed or report.nodeid not in outcomes or report.when == "call":
            outcomes[report.nodeid] = "failed" if report.failed else report.outcome
code = pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", *sys.argv[1:]], plugins=[Outcomes()])
import verl.experimental.agent_loop.agent_loop as agent_loop
wrapped = getattr(vars(agent_loop.AgentLoopWorker)["_run_agent_loop"], "__verl_otel_bridge_patched__", False)
print("RESULT " + json.dumps({"code": int(code), "outcomes": outcomes, "wrapped": wrapped,
                              "plugin": "verl_otel_bridge.verl.plugin" in sys.modules}))
"""


def run_verls_tests(source: Path, files: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *files],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def test_verls_agent_loop_and_tool_tests_give_the_same_outcomes_with_the_plugin(tmp_path: Path) -> None:
    source = verl_sources.sdist_source("0.9.1")
    files = sorted(str(path.relative_to(source)) for suite in SUITES for path in (source / suite).glob("*_on_cpu.py"))
    assert len(files) >= 8, files
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_RL_INSIGHT_ENABLE", "VERL_OTEL_TRACE")}
    base["XDG_STATE_HOME"] = str(tmp_path / "state")
    with_plugin = run_verls_tests(source, files, base)
    without = run_verls_tests(source, files, {**base, "VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert (with_plugin["plugin"], with_plugin["wrapped"]) == (True, True)  # loaded, and verl's methods wrapped
    assert (without["plugin"], without["wrapped"]) == (False, False)
    assert with_plugin["outcomes"] == without["outcomes"]
    passed = [test for test, outcome in with_plugin["outcomes"].items() if outcome == "passed"]
    assert len(passed) >= 60, with_plugin["outcomes"]
    assert not (tmp_path / "state").exists()  # nothing traced, nothing written
