"""``verl-otel-bridge watch`` without a terminal: its figures are report's, it follows files as they grow
(plain and gzip, cut lines, new files, replaced files), it keeps two steps, it finds hung sessions, and
nothing from a capture reaches the screen raw. (In a real terminal: tests/terminal/test_watch.py.)"""

from __future__ import annotations

import gzip
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import zlib
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from verl_otel_bridge._internal.watch.follow import Follower, Tail
from verl_otel_bridge._internal.watch.live import KEPT_STEPS, LiveView
from verl_otel_bridge._internal.watch.loop import catch_up
from verl_otel_bridge._internal.watch.screen import plain_line, renderables
from verl_otel_bridge.cli import demo
from verl_otel_bridge.cli.app import build_cli
from verl_otel_bridge.report import build_report

from .test_hostile_captures import HOSTILE_TEXT, hostile_records

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000_000_000
S = 1_000_000_000


def readable(stream: Any, timeout_s: float) -> bool:
    """Whether ``stream`` has something to read within ``timeout_s`` (poll: any descriptor number, unlike select)."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        return bool(selector.select(timeout_s))


def record(name: str, lane: str, step: int, start: int, end: int, **attributes: Any) -> dict[str, Any]:
    number = abs(hash((name, lane, step, start))) % (1 << 60) + 1
    return {
        "name": name,
        "trace_id": f"{number:032x}",
        "span_id": f"{number:016x}",
        "parent_span_id": None,
        "start_time_ns": start,
        "end_time_ns": end,
        "kind": "INTERNAL",
        "status": {"code": "UNSET", "description": None},
        "attributes": {"state_lane_id": lane, "global_steps": step, "uid": f"uid-{lane}", **attributes},
        "events": [],
        "resource": {},
        "scope": "verl_otel_bridge",
    }


def line(r: dict[str, Any]) -> bytes:
    return json.dumps(r).encode() + b"\n"


def session(lane: str, step: int, seconds: float = 1.0) -> bytes:
    return line(record("agent_session", lane, step, T0, T0 + int(seconds * S), status="success"))


def screen(view: LiveView, now_ns: int = T0) -> str:
    console = Console(file=StringIO(), width=200, highlight=False, force_terminal=False)
    for part in renderables(view.snapshot(now_ns), "capture"):
        console.print(part)
    return console.file.getvalue()  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- one aggregation


def flat(text: str) -> str:
    return " ".join(text.split())


def test_watch_once_on_the_demos_capture_prints_reports_figures_for_its_step(demo_capture: Path) -> None:
    (step,) = build_report([demo_capture]).steps
    view = LiveView()
    catch_up(Follower([demo_capture]), view)
    shown = view.snapshot(T0).step
    assert shown is not None
    for figure in ("step", "sessions", "finished", "p50_s", "p90_s", "max_s", "error_spans", "reward_mean"):
        assert getattr(shown, figure) == getattr(step, figure), figure
    assert (shown.zero_advantage, shown.stragglers, shown.slowest) == (
        step.zero_advantage,
        step.stragglers,
        step.slowest,
    )
    assert shown.stragglers and shown.zero_advantage and shown.error_spans  # the demo's planted problems

    report = flat(CliRunner().invoke(build_cli(), ["report", str(demo_capture)]).output)
    watched = CliRunner().invoke(build_cli(), ["watch", "--once", str(demo_capture)])
    assert watched.exit_code == 0, watched.output
    once = flat(watched.output)
    said = [
        f"step 1: {step.sessions} sessions, {step.finished} finished; duration p50 {step.p50_s:.3f} s, "
        f"p90 {step.p90_s:.3f} s, max {step.max_s:.3f} s",
        f"reward: mean {step.reward_mean:.3f} over {step.rewarded} sessions",
        f"uid 'uid-{demo.SOLVED_BY_ALL}': all {demo.GROUP} sessions got reward 1",
        f"straggler: uid 'uid-{demo.STRAGGLER[0]}' sample {demo.STRAGGLER[0]} session {demo.STRAGGLER[1]}: "
        f"{step.stragglers[0].duration_s:.3f} s",
        "a straggler is a finished session longer than 3 x its step's median and longer than 1 s",
    ]
    for text in said:
        assert text in report and text in once, text
    assert f"errors: {step.error_spans} error spans" in once and "ToolError" in once


def test_watch_once_on_a_file_without_span_records_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "notes.jsonl"
    empty.write_text("not a span\n")
    result = CliRunner().invoke(build_cli(), ["watch", "--once", str(empty)])
    assert result.exit_code == 1 and "no span record" in result.output


# --------------------------------------------------------------------------- following files


def test_a_line_cut_short_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    whole = session("a", 1) + session("b", 1)
    cut = len(session("a", 1)) + 10
    path.write_bytes(whole[:cut])
    tail = Tail(path)
    assert [json.loads(x.data)["attributes"]["state_lane_id"] for x in tail.read()] == ["a"]
    with path.open("ab") as f:
        f.write(whole[cut:])
    assert [json.loads(x.data)["attributes"]["state_lane_id"] for x in tail.read()] == ["b"]
    assert tail.read() == []


def test_gzip_members_are_read_as_they_are_flushed_and_a_cut_member_waits(tmp_path: Path) -> None:
    path = tmp_path / "w-0.jsonl.gz"
    members = [gzip.compress(session(f"s{i}", 1)) for i in range(3)]
    data = b"".join(members)
    cut = len(members[0]) + len(members[1]) // 2  # inside the second member
    path.write_bytes(data[:cut])
    tail = Tail(path)
    assert len(tail.read()) == 1
    with path.open("ab") as f:
        f.write(data[cut:])
    assert [json.loads(x.data)["attributes"]["state_lane_id"] for x in tail.read()] == ["s1", "s2"]
    # one member written by a stream that flushes mid-member (zlib's Z_SYNC_FLUSH) is read up to the flush
    compress = zlib.compressobj(wbits=31)
    flushed = compress.compress(session("s3", 1)) + compress.flush(zlib.Z_SYNC_FLUSH)
    with path.open("ab") as f:
        f.write(flushed)
    assert [json.loads(x.data)["attributes"]["state_lane_id"] for x in tail.read()] == ["s3"]


def test_files_that_appear_while_it_runs_are_followed_in_a_runs_step_folders(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "global_steps=1").mkdir(parents=True)
    (run / "global_steps=1" / "host-1-0.jsonl").write_bytes(session("a", 1))
    follower, view = Follower([run]), LiveView()
    catch_up(follower, view)
    (run / "global_steps=2").mkdir()
    (run / "global_steps=2" / "host-1-0.jsonl.gz").write_bytes(gzip.compress(session("b", 2)))
    (run / "README.txt").write_text("not followed")
    catch_up(follower, view)
    snapshot = view.snapshot(T0)
    assert snapshot.files == 2 and snapshot.bad_lines == 0
    assert snapshot.step is not None and snapshot.step.step == 2
    assert snapshot.previous is not None and snapshot.previous.finished == 1


def test_a_replaced_file_is_read_again_and_broken_gzip_is_said_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_bytes(session("a", 1) + session("b", 1))
    broken = tmp_path / "x.jsonl.gz"
    broken.write_bytes(b"this is not gzip at all\n")
    follower, view = Follower([tmp_path]), LiveView()
    catch_up(follower, view)
    path.write_bytes(session("c", 1))  # rotated: a new, shorter file under the same name
    catch_up(follower, view)
    snapshot = view.snapshot(T0)
    assert snapshot.step is not None and snapshot.step.finished == 3
    assert [p for p, _ in snapshot.broken] == [str(broken)] and "not gzip" in snapshot.broken[0][1]
    assert "not gzip" in screen(view)


def test_memory_is_bounded_by_the_two_steps_shown(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    follower, view = Follower([path]), LiveView()
    for step in range(1, 11):
        with path.open("ab") as f:
            f.write(b"".join(session(f"s{i}", step) for i in range(50)))
        catch_up(follower, view)
        assert len(view.builder.steps) <= KEPT_STEPS
    with path.open("ab") as f:
        f.write(session("late", 3))  # a straggler of a step no longer shown
    catch_up(follower, view)
    snapshot = view.snapshot(T0)
    assert snapshot.step is not None and (snapshot.step.step, snapshot.step.finished) == (10, 50)
    assert snapshot.previous is not None and snapshot.previous.step == 9
    assert snapshot.forgotten_spans == 1 and "1 late spans of older steps not shown" in screen(view)


def test_an_open_session_idle_past_the_threshold_is_hung_with_its_last_span(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    progress = record(
        "agent_session.progress",
        "stuck",
        1,
        T0 + 60 * S,
        T0 + 60 * S,
        **{"progress.elapsed_s": 60.0, "progress.idle_s": 50.0, "progress.turns": 3, "progress.last_span": "tool_call"},
    )
    path.write_bytes(session("done", 1) + line(progress))
    view = LiveView(idle_after_s=100.0)
    catch_up(Follower([path]), view)
    assert view.snapshot(T0 + 60 * S).hung == []  # idle 50 s
    (hung,) = view.snapshot(T0 + 120 * S).hung  # 50 s at the record, 60 s since: 110 s
    assert (hung.state_lane_id, hung.last_span, hung.turns) == ("stuck", "tool_call", 3)
    assert hung.idle_at(T0 + 120 * S) == pytest.approx(110.0)
    shown = screen(view, T0 + 120 * S)
    assert "hung: open, idle longer than 100 s" in shown and "tool_call" in shown and "110.0" in shown


# --------------------------------------------------------------------------- hostile captures


@st.composite
def torn_capture(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """Lines of hostile records and raw junk, interleaved as two writers would, and where the file is cut
    between polls."""
    records = draw(st.lists(hostile_records(), min_size=1, max_size=6))
    junk = draw(st.lists(st.binary(max_size=40), max_size=3))
    lines = [line(r) for r in records] + [j.replace(b"\n", b"") + b"\n" for j in junk]
    order = draw(st.permutations(range(len(lines))))
    data = b"".join(lines[i] for i in order)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)], cuts


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capture=torn_capture())
def test_torn_hostile_and_interleaved_lines_never_crash_and_print_no_control_sequence(
    tmp_path: Path, capture: tuple[list[bytes], list[int]]
) -> None:
    pieces, _ = capture
    path = tmp_path / "torn.jsonl"
    path.unlink(missing_ok=True)
    follower, view = Follower([path]), LiveView(idle_after_s=0)
    for piece in pieces:
        with path.open("ab") as f:
            f.write(piece)
        catch_up(follower, view)
        shown = screen(view, T0 + 3600 * S) + plain_line(view.snapshot(T0 + 3600 * S))
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", shown), shown


def test_control_characters_from_a_capture_are_escaped_on_the_screen(tmp_path: Path) -> None:
    hostile = record("agent_turn", "s", 1, T0, T0 + S, type="tool", tools=HOSTILE_TEXT, uid=HOSTILE_TEXT)
    hostile["status"] = {"code": "ERROR", "description": HOSTILE_TEXT}
    path = tmp_path / "h.jsonl"
    path.write_bytes(line(hostile) + session("s", 1))
    result = CliRunner().invoke(build_cli(), ["watch", "--once", str(path)])
    assert result.exit_code == 0, result.output
    assert not any(ch in result.output for ch in "\x1b\x07\x9b\r\u202e"), result.output
    assert "\\x1b]52;c;cHduZWQ=" in result.output


# --------------------------------------------------------------------------- without a terminal


def test_without_a_terminal_one_plain_line_per_interval_and_sigint_ends_it_with_0(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_bytes(b"".join(session(f"s{i}", 2, 1.0 + i) for i in range(4)))
    process = subprocess.Popen(
        [sys.executable, "-m", "verl_otel_bridge.cli", "watch", str(path), "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
    )
    assert process.stdout is not None
    try:
        lines = []
        while len(lines) < 2:
            ready = readable(process.stdout, 60)
            assert ready, "no line within 60 s"
            lines.append(process.stdout.readline())
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    first = lines[0].rstrip("\n")
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d step 2: 4 sessions, 4 finished; duration p50 2\.500 s, p90 3\.700 s, max 4\.000 s; "
        r"reward mean -; 0 zero-advantage groups; 0 stragglers; 0 error spans; 4 spans, 0 bad lines",
        first,
    ), first
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    shown = re.search(r"test_without_a_terminal_one_plain_line[^>]*-->\n```text\n(.*?)\n```", page, re.S)
    assert shown is not None, "docs/cli.md lost its plain line"
    assert re.sub(r"\d", "#", shown.group(1).split(" ", 1)[1]) == re.sub(r"\d", "#", first.split(" ", 1)[1])


def test_sigterm_ends_it_with_0(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_bytes(session("a", 1))
    process = subprocess.Popen(
        [sys.executable, "-m", "verl_otel_bridge.cli", "watch", str(path), "--interval", "0.1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        ready = readable(process.stdout, 60)
        assert ready and process.stdout.readline()
        process.terminate()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
