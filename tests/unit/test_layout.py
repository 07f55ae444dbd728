"""What a bridge loads: RL-Insight's modules only when it wants RL-Insight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
import verl_otel_bridge as vob
bridge = vob.configure(exporter=sys.argv[1], environ={})
with vob.session(sample=0, session=0):
    with vob.span("s"):
        pass
bridge.shutdown()
print(json.dumps(sorted(m for m in sys.modules if "rl_insight" in m)))
"""


def loaded_rl_insight_modules(exporter: str, cwd: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, exporter], capture_output=True, text=True, timeout=120, check=True, cwd=cwd
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("exporter", ["memory", "jsonl", "console", "none"])
def test_a_local_bridge_loads_no_rl_insight_module(exporter: str, tmp_path: Path) -> None:
    assert loaded_rl_insight_modules(exporter, tmp_path) == []


def test_a_bridge_that_wants_rl_insight_loads_its_modules(tmp_path: Path) -> None:
    assert "verl_otel_bridge.rl_insight.exporter" in loaded_rl_insight_modules("rl_insight", tmp_path)
