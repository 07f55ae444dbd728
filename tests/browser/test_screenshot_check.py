"""The screenshot helper's check (tests/chromium.py) that the docs' screenshots rely on: a string
counts only where a reader of the picture sees it, and all strings in one element when asked."""

from __future__ import annotations

from pathlib import Path

import chromium
import pytest

PAGE = """<!doctype html>
<html><body style="margin: 0; font: 16px sans-serif">
  <p style="position: absolute; top: 10px">in plain sight</p>
  <p style="position: absolute; top: 100px">under a popup</p>
  <div style="position: fixed; top: 90px; height: 60px; width: 100%; background: #fff">Welcome!</div>
  <div style="position: absolute; top: 200px; width: 120px; overflow: hidden; white-space: nowrap">
    <span style="padding-left: 400px">scrolled out of its box</span>
  </div>
  <table style="position: absolute; top: 300px">
    <tr><td>alpha</td><td>one</td></tr>
    <tr><td>beta</td><td>two</td></tr>
  </table>
  <p style="position: absolute; top: 3000px">below the fold</p>
</body></html>
"""


@pytest.fixture
def page(tmp_path: Path) -> str:
    path = tmp_path / "page.html"
    path.write_text(PAGE)
    return path.as_uri()


def test_a_shot_is_taken_once_every_string_is_on_screen_in_one_element(page: str, tmp_path: Path) -> None:
    shot = chromium.screenshot(
        page, tmp_path / "shot.png", tmp_path / "profile", shows=["in plain sight", "beta", "two"], within="body, tr"
    )
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    shot = chromium.screenshot(page, tmp_path / "row.png", tmp_path / "profile", shows=["beta", "two"], within="tr")
    assert shot.is_file()


@pytest.mark.parametrize(
    ("shows", "within"),
    [
        (["under a popup"], "body"),  # in the DOM, behind the fixed banner
        (["scrolled out of its box"], "body"),  # clipped by its overflow: hidden container
        (["below the fold"], "body"),  # outside the viewport
        (["alpha", "two"], "tr"),  # each on screen, but in two rows
    ],
    ids=["covered", "clipped", "outside-viewport", "split-over-rows"],
)
def test_a_string_that_is_not_seen_fails_the_shot(page: str, tmp_path: Path, shows: list[str], within: str) -> None:
    target = tmp_path / "shot.png"
    with pytest.raises(AssertionError, match="never showed"):
        chromium.screenshot(page, target, tmp_path / "profile", shows=shows, within=within, timeout_s=2)
    assert not target.exists()


def test_a_popups_text_fails_the_shot(page: str, tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"shows \['Welcome!'\] over the view"):
        chromium.screenshot(
            page, tmp_path / "shot.png", tmp_path / "profile", shows=["in plain sight"], hides=["Welcome!"]
        )
