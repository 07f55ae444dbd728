"""``verl-otel-bridge watch`` in a real terminal (tmux) on a capture a running process is writing.

The screen is read as a user reads it (``tmux capture-pane``): the step, finished and
open counts that change as the writer goes on, the hung session with the span it is
stuck in, the tool error, the reward so far; then Ctrl-C (``send-keys``) and the exit
code. docs/cli.md shows the screen this test reads (``WATCH_SCREEN_OUT=FILE`` writes it
to FILE; the test fails when the page's copy no longer has its lines).
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import writer

ROOT = Path(__file__).resolve().parents[2]
#: Set by nox (noxfile.py's ``terminal``) when tmux could not be installed, saying why.
UNAVAILABLE_ENV = "VERL_OTEL_TMUX_UNAVAILABLE"
SCREEN_OUT_ENV = "WATCH_SCREEN_OUT"
#: Bound of every wait; never reached when watch keeps up.
WAIT_S = 60.0
WIDTH, HEIGHT = 104, 48
#: The last line of every frame.
FRAME_END = "a straggler is a finished session"
DOC_MARK = "test_watch_shows_a_run_as_it_is_written_and_ends_on_ctrl_c -->"


def readable(stream: Any, timeout_s: float) -> bool:
    """Whether ``stream`` has something to read within ``timeout_s`` (poll: any descriptor number, unlike select)."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        return bool(selector.select(timeout_s))


@dataclass
class Terminal:
    socket: str
    exit_file: Path

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30, check=True
        )
        return done.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "watch")

    def wait_for(self, what: str, *shows: str) -> str:
        """The screen once it shows every one of ``shows`` in a whole frame (its last line drawn, and the
        same twice running: not caught in the middle of a redraw)."""
        deadline = time.monotonic() + WAIT_S
        before = ""
        while True:
            shown = self.screen()
            whole = FRAME_END in shown and masked(shown) == masked(before)
            if whole and all(text in shown for text in shows):
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed {what}; it shows:\n{shown}")
            before = shown
            time.sleep(0.1)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        pytest.skip(os.environ.get(UNAVAILABLE_ENV) or "tmux is not installed: apt-get install tmux")
    (tmp_path / "capture").mkdir()
    term = Terminal(f"vob-{uuid.uuid4().hex[:12]}", tmp_path / "exit-code")
    command = (  # the pane's size, not COLUMNS and LINES a caller may have exported (rich would take those)
        f"env -u COLUMNS -u LINES {sys.executable} -m verl_otel_bridge.cli watch capture --interval 0.2 "
        f"--hung-after 0.5; echo $? > {term.exit_file}"
    )
    term.tmux("new-session", "-d", "-s", "watch", "-x", str(WIDTH), "-y", str(HEIGHT), "-c", str(tmp_path), command)
    try:
        yield term
    finally:
        subprocess.run(["tmux", "-L", term.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """``run(stage)``: the writer does that stage (see tests/terminal/writer.py) and has flushed it."""
    process = subprocess.Popen(
        [sys.executable, writer.__file__, str(tmp_path / "capture")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None

    def stage(name: str) -> None:
        process.stdin.write(f"{name}\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        ready = readable(process.stdout, WAIT_S)
        assert ready, f"the writer did not finish {name!r} within {WAIT_S} s"
        assert process.stdout.readline().strip() == f"ready {name}"  # type: ignore[union-attr]

    try:
        yield stage
    finally:
        process.stdin.write("exit\n")
        process.stdin.close()
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def masked(text: str) -> list[str]:
    """Screen lines with every number as ``#``, rules and runs of spaces made one: what stays from run to run."""
    lines = []
    for line in text.splitlines():
        line = re.sub(r"\d+(?:[.:]\d+)*", "#", line)
        line = re.sub(r"─+", "─", line)
        line = " ".join(line.split())
        if line:
            lines.append(line)
    return lines


def test_watch_shows_a_run_as_it_is_written_and_ends_on_ctrl_c(terminal: Terminal, run: Callable[[str], None]) -> None:
    terminal.wait_for("that it waits for spans", "waiting for the first session's spans")

    run("first")
    terminal.wait_for(
        "step 1", "step 1: 8 sessions, 8 finished", "zero advantage: 1 groups: uid 'uid-1': all 4 sessions got reward 1"
    )

    run("second")
    second = terminal.wait_for(
        "step 2 with its hung session and its tool error",
        "step 2: 5 sessions, 4 finished",
        writer.HUNG_UID,
        "ToolError",
        "previous step 1: 8 sessions, 8 finished",
    )
    assert "sessions: 4 finished (tool_agent 4), 1 open;" in second
    hung, error = _only_line(second, writer.HUNG_UID), _only_line(second, "ToolError search")
    assert hung.split()[:3] == [writer.HUNG_UID, "9", "0"] and hung.split()[-1] == "tool_call", hung
    assert error.split()[:3] == ["ToolError", "search", "1"] and writer.ERROR_TEXT in error, error
    assert "reward: mean 0.375 over 4 sessions" in second  # three sessions of 0.5 and the failed one's 0
    _check_docs_screen(second)

    run("third")
    third = terminal.wait_for("four more sessions", "step 2: 9 sessions, 8 finished")
    assert writer.HUNG_UID in third  # still hung

    terminal.tmux("send-keys", "-t", "watch", "C-c")
    deadline = time.monotonic() + WAIT_S
    while not (terminal.exit_file.is_file() and terminal.exit_file.read_text().strip()):
        assert time.monotonic() < deadline, "watch did not end on Ctrl-C"
        time.sleep(0.1)
    assert terminal.exit_file.read_text().strip() == "0"


def _only_line(screen: str, text: str) -> str:
    found = [line for line in screen.splitlines() if text in line]
    assert len(found) == 1, f"{len(found)} lines with {text!r} on the screen:\n{screen}"
    return found[0]


def _check_docs_screen(screen: str) -> None:
    """docs/cli.md shows this screen: the same lines, numbers aside (they are times and rates)."""
    out = os.environ.get(SCREEN_OUT_ENV)
    if out:
        Path(out).write_text("\n".join(line.rstrip() for line in screen.rstrip().splitlines()) + "\n")
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    found = re.search(re.escape(DOC_MARK) + r"\n```text\n(.*?)```", page, re.S)
    assert found is not None, "docs/cli.md lost its watch screen"
    assert masked(found.group(1)) == masked(screen), (
        f"docs/cli.md's watch screen differs from what watch shows now (rerun with {SCREEN_OUT_ENV}=FILE "
        f"and paste FILE):\n{screen}"
    )
