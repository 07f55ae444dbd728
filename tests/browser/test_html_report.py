"""The HTML report of the demo's own run, rendered by a real headless browser (Debian's chromium).

``nox -s browser`` installs chromium when it is missing (``apt-get``, as root); the
tests skip, saying why, only where it could not be installed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import subprocess
from pathlib import Path

import chromium
import pytest

import verl_otel_bridge as vob
from verl_otel_bridge import BridgeConfig, SessionIdentity
from verl_otel_bridge._internal.report.html import render_html
from verl_otel_bridge.cli import demo
from verl_otel_bridge.report import build_report


def render(page: Path, profile: Path, width: int = 1280) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran in a ``width`` px wide window, and every console message
    (uncaught errors among them)."""
    done = subprocess.run(
        [
            *chromium.command(profile),
            f"--window-size={width},2000",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
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


STRAGGLER = SessionIdentity.create(sample=demo.STRAGGLER[0], session=demo.STRAGGLER[1]).state_lane_id
FAILING = SessionIdentity.create(sample=demo.FAILING[0], session=demo.FAILING[1]).state_lane_id


def _row(dom: str, lane: str) -> str:
    found = re.search(rf'<g class="session" data-lane="{re.escape(lane)}"[^>]*>.*?</g>', dom, re.S)
    assert found is not None, lane
    return found.group(0)


def _marks(row: str) -> list[str]:
    found = re.search(r'data-marks="([^"]*)"', row)
    assert found is not None, row[:200]
    return found.group(1).split()


def _point(dom: str, lane: str) -> str:
    found = re.search(rf"<circle [^>]*><title>{re.escape(lane)}: [^<]*</title></circle>", dom)
    assert found is not None, lane
    return found.group(0)


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
    assert f"Zero advantage: uid 'uid-{demo.SOLVED_BY_ALL}': all {demo.GROUP} sessions" in dom
    assert dom.count('<svg class="scatter"') == 1 and dom.count("<circle") == demo.SESSIONS


def test_a_script_error_would_be_caught(demo_page: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(demo_page.read_text().replace("</body>", "<script>notDefined();</script></body>"))
    _dom, console = render(broken, tmp_path / "profile")
    assert any("notDefined is not defined" in line for line in console), console


def test_stragglers_and_errors_are_marked_with_a_legend_in_the_scatter_and_the_waterfall(
    demo_page: Path, tmp_path: Path
) -> None:
    dom, console = render(demo_page, tmp_path / "profile")
    assert console == [], console
    # Which sessions are stragglers is the report's call (a loaded machine can slow another one past
    # the factor); the planted straggler always is one, and the marks follow the report exactly.
    (step,) = build_report([demo_page.parent / "demo.jsonl"]).steps
    stragglers = {s.state_lane_id for s in step.stragglers}
    assert STRAGGLER in stragglers
    # The waterfall: the straggler and the session whose tool raised say so (it finished "success").
    assert "straggler" in _marks(_row(dom, STRAGGLER))
    assert "[success, straggler" in _row(dom, STRAGGLER)
    failing = _row(dom, FAILING)
    assert "error" in _marks(failing) and ", error]" in failing
    # The scatter: the stragglers (only they) red, the failing session with the error ring, the rest plain.
    marks = {lane: found for found, lane in re.findall(r'<circle [^>]*data-marks="([^"]*)"><title>([^:]+):', dom)}
    assert len(marks) == demo.SESSIONS
    assert {lane for lane, found in marks.items() if "straggler" in found} == stragglers
    assert {lane for lane, found in marks.items() if "error" in found} == {FAILING}
    scatter = dom[dom.index('<svg class="scatter"') :]
    assert 'fill="#d62728"' in _point(dom, STRAGGLER) and scatter.count('fill="#d62728"') == len(stragglers)
    assert 'stroke="#7b3294"' in _point(dom, FAILING)
    legends = re.findall(r'<div class="legend">(.*?)</div>', dom, re.S)
    assert len(legends) == 2 and all("straggler" in legend and "error" in legend for legend in legends)
    assert "finished session" in legends[1]


def test_a_hung_session_is_marked_hung_in_the_waterfall(demo_page: Path, tmp_path: Path) -> None:
    """The capture of a run killed while the straggler was open: its progress records, no session span."""
    capture = tmp_path / "killed.jsonl"
    lines = (demo_page.parent / "demo.jsonl").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if not (json.loads(line)["name"] == "agent_session" and STRAGGLER in line)]
    assert len(kept) == len(lines) - 1
    capture.write_text("\n".join(kept) + "\n", encoding="utf-8")
    page = tmp_path / "killed.html"
    page.write_text(render_html(build_report([capture])), encoding="utf-8")
    dom, console = render(page, tmp_path / "profile")
    assert console == [], console
    row = _row(dom, STRAGGLER)
    assert 'data-kind="hung"' in row and 'data-marks="hung"' in row and "[hung]" in row
    legends = re.findall(r'<div class="legend">(.*?)</div>', dom, re.S)
    assert "hung" in legends[0] and "no session span" in legends[0]


def test_readable_at_900_px_nothing_wider_than_the_window(demo_page: Path, tmp_path: Path) -> None:
    measure = (
        "<script>document.body.setAttribute('data-fit', JSON.stringify({page: document.documentElement.scrollWidth, "
        "window: window.innerWidth, right: Array.prototype.map.call(document.querySelectorAll('table, svg'), "
        "function (t) { return Math.ceil(t.getBoundingClientRect().right); })}));</script></body>"
    )
    page = tmp_path / "measured.html"
    page.write_text(demo_page.read_text(encoding="utf-8").replace("</body>", measure), encoding="utf-8")
    dom, console = render(page, tmp_path / "profile", width=900)
    assert console == [], console
    found = re.search(r"data-fit=\"([^\"]+)\"", dom)
    assert found is not None
    fit = json.loads(found.group(1).replace("&quot;", '"'))
    assert fit["window"] == 900 and fit["page"] <= 900, fit  # no horizontal scroll
    assert fit["right"] and max(fit["right"]) <= 900, fit  # the step table and both charts fit


def test_axis_ticks_are_round_numbers(demo_page: Path, tmp_path: Path) -> None:
    dom, _ = render(demo_page, tmp_path / "profile")
    for axis in ("x-tick", "y-tick"):
        ticks = [float(t) for t in re.findall(rf'<text class="{axis}"[^>]*>([^<]+)</text>', dom)]
        assert len(ticks) >= 3, (axis, ticks)
        steps = {round(b - a, 9) for a, b in itertools.pairwise(ticks)}
        assert len(steps) == 1, (axis, ticks)  # evenly spaced
        (step,) = steps
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1.0, 2.0, 5.0), (axis, ticks)
        assert all(abs(t / step - round(t / step)) < 1e-6 for t in ticks), (axis, ticks)  # multiples of the step
