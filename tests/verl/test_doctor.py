"""``verl-otel-bridge doctor`` in the real verl 0.9.1 environment (a fresh process, as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from verl_otel_bridge._internal.verl import targets


def doctor(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "verl_otel_bridge.cli", "doctor", "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def test_doctor_with_only_the_switch_exits_0_and_names_the_default_directory(tmp_path: Path) -> None:
    code, report = doctor({"VERL_OTEL_TRACE": "1", "XDG_STATE_HOME": str(tmp_path)})
    assert code == 0, report["problems"]
    verl = report["verl"]
    spans = tmp_path / "verl_otel_bridge" / "spans"
    assert (verl["version"], verl["loads_plugins"], verl["plugin"]["error"]) == ("0.9.1", True, None)
    assert verl["plugin"]["loaded_by"] == "the verl.plugins entry point 'verl_otel_bridge'"
    assert verl["tracing"] == "on (VERL_OTEL_TRACE=1)"
    assert (
        verl["destination"]
        == f"the default directory {spans} (gzip JSON Lines, a folder per run and step): no destination is configured"
    )
    assert report["route"]["destination"] == "jsonl" and str(spans) in report["route"]["local"]["detail"]
    assert verl["targets"]["not_as_expected"] == []
    assert not tmp_path.joinpath("verl_otel_bridge").exists()


def test_doctor_with_a_broken_plugin_exits_1_and_says_why(tmp_path: Path) -> None:
    """wrapt, which the plugin registers its hooks with, broken in this environment (it raises on import)."""
    broken = tmp_path / "broken" / "wrapt"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('this wrapt is broken')\n")
    path = os.pathsep.join([str(broken.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    code, report = doctor({"PYTHONPATH": path, "XDG_STATE_HOME": str(tmp_path)})
    assert code == 1
    why = "RuntimeError: this wrapt is broken"
    assert report["verl"]["plugin"]["error"] == why
    assert f"the verl plugin ({targets.PLUGIN_MODULE}) does not load: {why}" in report["problems"]
