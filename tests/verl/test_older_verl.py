"""verl 0.8.0, the oldest verl the plugin supports, which loads no ``verl.plugins`` entry point: the
``VERL_USE_EXTERNAL_MODULES=verl_otel_bridge.verl.plugin`` route wraps every target.

verl 0.8.0 is its published wheel unpacked (``tests/verl_sources.py``), put ahead of this environment's verl
0.9.1 on ``PYTHONPATH`` in a fresh process: its own source runs, on this environment's packages (all of
0.8.0's target modules import on CPU: nothing is stubbed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import verl_sources

from verl_otel_bridge._internal.verl import targets

#: Imports each module of the table and reports, per target, whether the plugin put its function in verl's place
#: (None: verl 0.8.0 has no such name), with the plugin's log records.
PROBE = """
import importlib, json, logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.levelname, record.getMessage()])
logging.getLogger("verl_otel_bridge").addHandler(Keep(logging.INFO))
import verl
from verl_otel_bridge._internal.verl import targets, wrapping
wrapped = {}
for module in json.loads(sys.argv[1]):
    imported = importlib.import_module(module)
    for target in targets.targets_of(module):
        found = wrapping.resolve(imported, target.name)
        wrapped[target.qualified_name] = None if found is None else getattr(found, wrapping.PATCHED, False)
print("RESULT " + json.dumps({"version": verl.__version__, "file": verl.__file__, "wrapped": wrapped,
                              "records": records}))
"""

#: Every module of the table but vLLM's and SGLang's servers (their engine is a GPU package; in 0.8.0 they do
#: not name RLInsightLogger, so nothing of theirs is a target there).
MODULES = [m for m in targets.MODULES if not m.endswith(("vllm_async_server", "async_sglang_server"))]


def probe(env: dict[str, str]) -> dict[str, Any]:
    source = verl_sources.wheel_source("0.8.0")
    path = [str(source), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    environ = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(MODULES)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    assert result["version"] == "0.8.0" and Path(result["file"]).is_relative_to(source)
    return result


@pytest.fixture
def state(tmp_path: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state")}


def test_the_external_modules_route_wraps_every_target_on_verl_0_8_0(state: dict[str, str]) -> None:
    result = probe({**state, targets.EXTERNAL_MODULES_ENV: targets.PLUGIN_MODULE})
    wrapped = result["wrapped"]
    expected = {
        t.qualified_name: None if t.optional else t.kind is not targets.Kind.READ
        for t in targets.TARGETS
        if t.module in MODULES
    }
    assert wrapped == expected  # every target wrapped; RLInsightLogger (optional) absent in 0.8.0
    assert [m for level, m in result["records"] if level == "WARNING"] == []


def test_without_it_verl_0_8_0_loads_no_plugin(state: dict[str, str]) -> None:
    """What the route is for: 0.8.0 ignores the ``verl.plugins`` entry point, silently."""
    result = probe(state)
    assert not any(result["wrapped"].values())
