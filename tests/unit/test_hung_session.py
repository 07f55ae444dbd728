"""A session that hangs until its process is killed (SIGKILL): its progress records are already in the capture.

The child process writes JSONL (``exporter: jsonl``) and hangs inside a tool call;
the test polls the file (bounded) until progress records are there, kills the
child with SIGKILL (no shutdown, no atexit, nothing flushed at exit), then reads
the capture as a user would, and runs the report on it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from verl_otel_bridge._internal.captures.read import read_records
from verl_otel_bridge._internal.protocol import (
    PROGRESS_ELAPSED_S,
    PROGRESS_LAST_SPAN,
    PROGRESS_SPAN_NAME,
    PROGRESS_TURN,
    PROGRESS_TURNS,
    SESSION_SPAN_NAME,
)
from verl_otel_bridge.report import build_report

from .helpers import WAIT_S

_HANGS = """
import sys, threading
import verl_otel_bridge as vob

vob.configure(exporter="jsonl", jsonl_path=sys.argv[1], progress_interval_s=0.1, schedule_delay_ms=20)
with vob.session(sample=7, session=1, global_steps=4, uid="u-hang") as s:
    with s.turn(0) as turn:
        turn.record(prompt_tokens=10, completion_tokens=5)
    with s.turn(1, type="tool"), vob.span("stuck_tool"):
        print("hanging", flush=True)
        threading.Event().wait()  # forever: only SIGKILL ends this process
"""


def _progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [r for r in read_records(path).records if r["name"] == PROGRESS_SPAN_NAME]


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
def test_progress_records_of_a_hung_session_are_exported_before_it_is_killed(tmp_path: Path) -> None:
    capture = tmp_path / "worker.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-c", _HANGS, str(capture)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + WAIT_S * 3
        while len(_progress(capture)) < 3:
            assert child.poll() is None, f"the child exited early: {child.communicate(timeout=WAIT_S)}"
            assert time.monotonic() < deadline, "no progress records reached the file while the session hung"
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        _out, err = child.communicate(timeout=WAIT_S)
    assert child.returncode == -signal.SIGKILL
    assert "Traceback" not in err

    records = read_records(capture).records
    assert not [r for r in records if r["name"] == SESSION_SPAN_NAME]  # OpenTelemetry alone would show nothing
    progress = [r for r in records if r["name"] == PROGRESS_SPAN_NAME]
    last = max(progress, key=lambda r: r["attributes"][PROGRESS_ELAPSED_S])["attributes"]
    assert (last["uid"], last["sample"], last["session"], last["global_steps"]) == ("u-hang", "7", "1", 4)
    assert (last[PROGRESS_LAST_SPAN], last[PROGRESS_TURNS], last[PROGRESS_TURN]) == ("stuck_tool", 2, 1)
    assert last[PROGRESS_ELAPSED_S] >= 0.3  # three intervals at least
    assert len({r["parent_span_id"] for r in progress}) == 1  # all children of the one session span

    (step,) = build_report([capture]).steps
    (hung,) = step.hung
    assert (hung.uid, hung.sample, hung.session, hung.kind) == ("u-hang", "7", "1", "hung")
    assert hung.last_span == "stuck_tool" and hung.turns == 2 and hung.progress_records == len(progress)
    assert hung.duration_s == last[PROGRESS_ELAPSED_S]
    assert step.finished == 0 and step.p50_s is None and hung.state_lane_id == last["state_lane_id"]
