"""The trainer's steps in the HTML report, rendered by headless chromium: a capture of tests/verl/test_trainer.py.

``fixtures/verl-training-steps.jsonl`` is what that test's two training steps wrote
(the trainer's spans and its Ray workers', refreshed with ``CAPTURE_DIR=tests/browser/fixtures
nox -s verl -- -k training_steps``). ``SCREENSHOT_DIR=docs/img nox -s browser`` retakes
docs/verl.md's picture of a step.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import chromium
import pytest
from test_html_report import render

from verl_otel_bridge._internal.report.html import render_html
from verl_otel_bridge.report import build_report

CAPTURE = Path(__file__).resolve().parent / "fixtures" / "verl-training-steps.jsonl"
SCREENSHOT_DIR_ENV = "SCREENSHOT_DIR"
#: verl's timers the test ran per step (``step`` holds ``gen``, ``reward``, ``adv``).
PHASES = ["start_profile", "step", "gen", "reward", "adv", "stop_profile"]


@pytest.fixture(scope="module")
def steps_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    page = tmp_path_factory.mktemp("steps") / "report.html"
    page.write_text(render_html(build_report([CAPTURE])), encoding="utf-8")
    return page


def test_each_step_is_drawn_as_its_phases_with_the_sessions_under_gen(steps_page: Path, tmp_path: Path) -> None:
    dom, console = render(steps_page, tmp_path / "profile")
    assert console == [], console
    timelines = re.findall(r'<svg class="timeline".*?</svg>', dom, re.S)
    assert len(timelines) == 2  # one per training step
    for timeline in timelines:
        drawn = re.findall(r'<g class="(phase|timeline-session)" data-(?:phase|lane)="([^"]+)"', timeline)
        assert [name for kind, name in drawn if kind == "phase"] == PHASES
        # the four sessions of the step, drawn right under gen
        gen = drawn.index(("phase", "gen"))
        assert [kind for kind, _ in drawn[gen + 1 : gen + 5]] == ["timeline-session"] * 4
        assert drawn[gen + 5] == ("phase", "reward")
    phases = re.findall(r'<table class="phases">.*?</table>', dom, re.S)
    gen_row = r"<td[^>]*>\s*gen</td><td[^>]*>[\d.]+</td><td[^>]*>\d+%</td><td[^>]*>4</td>"
    assert len(phases) == 2 and all(re.search(gen_row, table) for table in phases)
    assert dom.count('<details class="metrics">') == 2


def test_screenshot_of_a_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/verl.md's picture: the second step's section (the report of that step alone; the first step's
    ``gen`` also waited for the Ray workers to start)."""
    target = Path(os.environ.get(SCREENSHOT_DIR_ENV) or tmp_path).resolve() / "verl-training-step.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    page = tmp_path / "step.html"
    monkeypatch.chdir(CAPTURE.parent)  # the page names the capture as given: no path of this machine
    page.write_text(render_html(build_report([CAPTURE.name], step=2)), encoding="utf-8")
    command = [
        *chromium.command(tmp_path / "profile"),
        "--window-size=1000,1000",
        f"--screenshot={target}",
        page.as_uri(),
    ]
    subprocess.run(command, check=True, timeout=120, capture_output=True)
    assert target.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
