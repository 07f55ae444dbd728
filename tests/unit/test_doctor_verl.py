"""``doctor``'s verl part, on the published verl packages' own sources (``tests/verl_sources.py``) put on
``sys.path``: doctor finds verl without importing it, so no verl dependency is needed here. The plugin itself
is this checkout's (its ``verl.plugins`` entry point is installed with the package). tests/verl/test_doctor.py
runs the command on the real verl 0.9.1 environment.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import verl_sources
from click.testing import CliRunner

from verl_otel_bridge._internal.verl import destination, targets
from verl_otel_bridge.cli import app as cli

VERL_VARIABLES = (
    targets.EXTERNAL_MODULES_ENV,
    targets.EXTERNAL_PLUGINS_ENV,
    "VERL_OTEL_TRACE",
    "VERL_OTEL_RL_INSIGHT_LOGGER",
)


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No verl variable of the caller's; the plugin's default directory under the test's own state directory."""
    for name in VERL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return destination.default_dir()


def with_verl(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.syspath_prepend(str(verl_sources.wheel_source(version)))


def doctor(*args: str) -> tuple[int, dict[str, Any], str]:
    runner = CliRunner()
    result = runner.invoke(cli.build_cli(), ["doctor", "--json", *args], catch_exceptions=False)
    text = runner.invoke(cli.build_cli(), ["doctor", *args], catch_exceptions=False)
    assert text.exit_code == result.exit_code
    return result.exit_code, json.loads(result.stdout), text.output


def test_without_verl_doctor_has_no_verl_part(state: Path) -> None:
    _, report, _ = doctor()
    assert report["verl"] is None


def test_verl_0_9_1_loads_the_plugin_and_doctor_names_the_default_directory(
    monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    with_verl(monkeypatch, "0.9.1")
    code, report, text = doctor()
    assert code == 0, report["problems"]
    verl = report["verl"]
    assert (verl["version"], verl["loads_plugins"]) == ("0.9.1", True)
    assert verl["plugin"] == {
        "entry_point": f"verl_otel_bridge = {targets.PLUGIN_MODULE}",
        "loaded_by": "the verl.plugins entry point 'verl_otel_bridge'",
        "error": None,
    }
    assert verl["targets"] == {"checked": len(targets.TARGETS), "not_as_expected": []}
    assert verl["destination"].startswith(f"the default directory {state} ")
    assert verl["rl_insight_logger"].startswith("verl's: RL-Insight is not selected")
    assert report["route"]["destination"] == "jsonl" and str(state) in report["route"]["local"]["detail"]
    words = " ".join(text.split())  # as wrapped for an 80-column terminal
    assert "verl 0.9.1 (" in words and "its spans go to: the default directory" in words
    assert not state.exists()  # doctor makes no file


def test_rl_insight_selected_verl_builds_the_bridges_class_unless_kept(
    monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    with_verl(monkeypatch, "0.9.1")
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    _, report, _ = doctor()
    assert report["verl"]["rl_insight_logger"].startswith("the bridge's: RL-Insight is selected")
    assert report["verl"]["destination"].startswith("RL-Insight when usable (it is selected), else the default")
    assert report["route"]["destination"] == "jsonl (fallback)"  # no RL-Insight here
    monkeypatch.setenv("VERL_OTEL_RL_INSIGHT_LOGGER", "verl")
    _, report, _ = doctor()
    assert report["verl"]["rl_insight_logger"].startswith("verl's: RL-Insight is selected, and")


def test_verl_0_8_0_needs_the_external_modules_route_and_doctor_says_so(
    monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    with_verl(monkeypatch, "0.8.0")
    code, report, _ = doctor()
    assert code == 1
    assert report["verl"]["loads_plugins"] is False and report["verl"]["plugin"]["loaded_by"] is None
    assert any("verl 0.8.0 loads no verl.plugins entry point" in p for p in report["problems"])
    assert f"export {targets.EXTERNAL_MODULES_ENV}={targets.PLUGIN_MODULE}" in " ".join(report["hints"])
    assert report["verl"]["rl_insight_logger"] == "none: verl 0.8.0 has no RLInsightLogger"
    monkeypatch.setenv(targets.EXTERNAL_MODULES_ENV, targets.PLUGIN_MODULE)
    code, report, _ = doctor()
    assert code == 0, report["problems"]
    assert report["verl"]["plugin"]["loaded_by"] == targets.EXTERNAL_MODULES_ENV
    assert report["verl"]["targets"]["not_as_expected"] == []


def test_verl_told_to_load_no_plugin_is_a_problem(monkeypatch: pytest.MonkeyPatch, state: Path) -> None:
    with_verl(monkeypatch, "0.9.1")
    monkeypatch.setenv(targets.EXTERNAL_PLUGINS_ENV, "none")
    code, report, _ = doctor()
    assert code == 1 and report["verl"]["plugin"]["loaded_by"] is None
    assert any("VERL_USE_EXTERNAL_PLUGINS='none' keeps verl from loading" in p for p in report["problems"])


def test_a_broken_plugin_import_exits_1_and_says_why(monkeypatch: pytest.MonkeyPatch, state: Path) -> None:
    with_verl(monkeypatch, "0.9.1")
    monkeypatch.delitem(sys.modules, targets.PLUGIN_MODULE, raising=False)
    monkeypatch.setitem(sys.modules, "verl_otel_bridge._internal.verl.switch", None)  # a broken install
    code, report, text = doctor()
    assert code == 1
    why = "ModuleNotFoundError: import of verl_otel_bridge._internal.verl.switch halted; None in sys.modules"
    assert report["verl"]["plugin"]["error"] == why
    assert f"the verl plugin ({targets.PLUGIN_MODULE}) does not load: {why}" in report["problems"]
    assert "NOT OK" in text


def test_the_plugin_without_wrapt_is_a_problem(monkeypatch: pytest.MonkeyPatch, state: Path) -> None:
    with_verl(monkeypatch, "0.9.1")
    monkeypatch.setitem(sys.modules, "wrapt", None)
    code, report, _ = doctor()
    assert code == 1 and report["verl"]["plugin"]["error"] == "wrapt is not installed"


def test_a_verl_not_as_the_plugin_knows_it_is_named(
    monkeypatch: pytest.MonkeyPatch, state: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "verl-renamed"
    shutil.copytree(verl_sources.wheel_source("0.9.1") / "verl", copy / "verl")
    loop = copy / "verl" / "experimental" / "agent_loop" / "tool_agent_loop.py"
    loop.write_text(loop.read_text().replace("async def _call_tool(", "async def _call_tool_renamed("))
    monkeypatch.syspath_prepend(str(copy))
    code, report, _ = doctor()
    assert code == 1
    (finding,) = report["verl"]["targets"]["not_as_expected"]
    assert finding.startswith("verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop._call_tool: ")
    assert any("1 of what the plugin wraps or reads is not as it knows it" in p for p in report["problems"])
