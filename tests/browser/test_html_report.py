"""The HTML report of the demo's own run, rendered by a real headless browser (Debian's chromium).

``nox -s browser`` installs chromium when it is missing (``apt-get``, as root); the
tests skip, saying why, only where it could not be installed.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import chromium
import pytest

import verl_otel_bridge as vob
from verl_otel_bridge import BridgeConfig, SessionIdentity
from verl_otel_bridge.cli import demo
from verl_otel_bridge.report import build_report
from verl_otel_bridge.report.html import render_html


def render(page: Path, profile: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and every console message (uncaught errors among them)."""
    done = subprocess.run(
        [*chromium.command(profile), "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of one demo run (a planted straggler and zero-advantage group), as HTML."""
    directory = tmp_path_factory.mktemp("demo")
    capture = directory / "demo.jsonl"
    config = BridgeConfig.resolve(
        environ={}, exporter="jsonl", jsonl_path=str(capture), progress_interval_s=demo.DEMO_PROGRESS_INTERVAL_S
    )
    previous = vob.set_bridge(None)
    try:
        vob.configure(config)
        asyncio.run(demo.run())  # shuts the bridge down at the end
    finally:
        vob.set_bridge(previous)
    page = directory / "report.html"
    page.write_text(render_html(build_report([capture])), encoding="utf-8")
    return page


def test_the_report_renders_without_script_errors_and_shows_the_straggler(demo_page: Path, tmp_path: Path) -> None:
    dom, console = render(demo_page, tmp_path / "profile")
    assert console == [], console
    assert 'data-ready="1"' in dom  # the script ran and found the one step's section
    straggler = SessionIdentity.create(sample=demo.STRAGGLER[0], session=demo.STRAGGLER[1]).state_lane_id
    assert f'class="warn straggler" data-lane="{straggler}"' in dom
    rows = re.findall(r'<g class="session" data-lane="([^"]+)"', dom)
    assert rows and rows[0] == straggler, rows  # the waterfall's first row: the slowest session
    bars = re.search(rf'<g class="session" data-lane="{re.escape(straggler)}".*?</g>', dom, re.S)
    assert bars is not None and 'fill="#F58518"' in bars.group(0)  # its tool turn, as a bar
    assert f"Zero advantage: uid <b>uid-{demo.SOLVED_BY_ALL}</b>: all {demo.GROUP} sessions" in dom
    assert dom.count('<svg class="scatter"') == 1 and dom.count("<circle") == demo.SESSIONS


def test_a_script_error_would_be_caught(demo_page: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(demo_page.read_text().replace("</body>", "<script>notDefined();</script></body>"))
    _dom, console = render(broken, tmp_path / "profile")
    assert any("notDefined is not defined" in line for line in console), console
