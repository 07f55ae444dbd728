"""Fault classes of the third adversarial round (issue 32): each test provokes the fault, then checks what must hold.

Classes 1, 2, 6, 7 and 8 of the issue, and the rule that everything the bridge writes
as JSON is valid JSON; docs/reliability.md has a row for each.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from verl_otel_bridge._internal.exporters.jsonl import JsonlSpanExporter
from verl_otel_bridge._internal.verl import destination

# -- class 8: every directory made for the default destination is 0700, parents included ------


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which a directory made without a mode is ``0755``."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.mark.usefixtures("umask_022")
def test_the_default_destination_makes_its_missing_parents_0700(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    config = destination.worker_config({}, environ={})
    assert config.exporter == "jsonl" and config.jsonl_path is not None
    made = [home / ".local", home / ".local" / "state", home / ".local" / "state" / "verl_otel_bridge"]
    made.append(made[-1] / "spans")
    assert Path(config.jsonl_path).parent == made[-1]
    assert {str(d.relative_to(home)): oct(stat.S_IMODE(d.stat().st_mode)) for d in made} == {
        str(d.relative_to(home)): "0o700" for d in made
    }
    assert stat.S_IMODE(home.stat().st_mode) == 0o755  # what existed is left as it was


@pytest.mark.usefixtures("umask_022")
def test_a_jsonl_path_in_missing_directories_makes_them_0700(tmp_path: Path) -> None:
    exporter = JsonlSpanExporter(tmp_path / "runs" / "today" / "spans.jsonl")
    exporter.shutdown()
    for made in (tmp_path / "runs", tmp_path / "runs" / "today"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made
