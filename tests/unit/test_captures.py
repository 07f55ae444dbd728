"""The capture layout (``capture_dir``): run and step folders of private gzip files, read back by every reader.

docs/protocol.md#capture-directories says what is tested here: the folders and names, gzip
members that any gzip reader reads, rotation, a file cut short by a crash, ``--step N``
opening only its folder, files without spans skipped and said (never fatal), bounded
reading, the conversation stored once and rebuilt, and the disk budget.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import stat
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.captures.budget import BYTES_REMOVED, STEPS_REMOVED
from verl_otel_bridge._internal.captures.files import gzip_member
from verl_otel_bridge._internal.captures.layout import LOCK_NAME, NO_STEP
from verl_otel_bridge._internal.captures.lines import Position
from verl_otel_bridge._internal.captures.read import CaptureRecords, find_captures, follow, read_records
from verl_otel_bridge._internal.conversation import Conversations
from verl_otel_bridge._internal.exporters.capture_dir import CaptureDir
from verl_otel_bridge._internal.exporters.memory import BoundedMemorySpanExporter
from verl_otel_bridge._internal.pipeline.chain import ExportChain, Named
from verl_otel_bridge._internal.vocabulary import Translator
from verl_otel_bridge.cli.app import build_cli
from verl_otel_bridge.cli.replay import replay_records
from verl_otel_bridge.report import build_report


def run(*args: str) -> Any:
    """The command line's result, printed 1,000 columns wide (a temporary path is not wrapped at its spaces)."""
    return CliRunner().invoke(build_cli(), list(args), env={"COLUMNS": "1000"})


def write_steps(
    make_bridge: Callable[..., Bridge], root: Path, steps: range, run_name: str = "r1", **settings: Any
) -> Bridge:
    bridge = make_bridge(exporter="jsonl", capture_dir=str(root), capture_run=run_name, **settings)
    vob.set_bridge(bridge)
    for step in steps:
        for sample in range(2):
            with vob.session(sample=sample, session=0, global_steps=step, uid=f"u{sample}") as s, s.turn(0):
                pass
        assert bridge.force_flush(10)
    return bridge


def test_a_run_folder_holds_a_folder_per_step_of_private_gzip_files(
    tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    bridge = write_steps(make_bridge, tmp_path, range(1, 3))
    with vob.span("outside any step"):
        pass
    assert bridge.force_flush(10)
    run_dir = tmp_path / "r1"
    assert sorted(p.name for p in run_dir.iterdir()) == [
        LOCK_NAME,
        "global_steps=1",
        "global_steps=2",
        f"global_steps={NO_STEP}",
    ]
    for folder in (run_dir, *run_dir.glob("global_steps=*")):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(run_dir.glob("global_steps=*/*.jsonl.gz"))
    assert len(files) == 3 and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    for file in files:  # any gzip reader reads each file whole, member after member
        lines = gzip.decompress(file.read_bytes()).decode().splitlines()
        step = file.parent.name.split("=", 1)[1]
        for line in lines:
            assert str(json.loads(line)["attributes"].get("global_steps", NO_STEP)) == step
    assert "global_steps=<n>" in bridge.status()["detail"]


def test_files_rotate_in_the_order_written(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    write_steps(make_bridge, tmp_path, range(1, 2), capture_rotate_bytes=1, max_export_batch_size=1)
    names = sorted(p.name for p in (tmp_path / "r1" / "global_steps=1").iterdir())
    assert len(names) >= 3 and names == sorted(names, key=lambda n: int(n.rsplit("-", 1)[1].split(".")[0]))
    records = [r for f in find_captures([tmp_path / "r1"]).files for r in read_records(f).records]
    assert len(records) == 4  # 2 sessions x (session + turn)


def test_every_reader_reads_plain_and_gzip_files_run_and_step_folders_and_several(
    tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    write_steps(make_bridge, tmp_path / "dir", range(1, 4))
    plain = tmp_path / "plain.jsonl"
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(plain))
    vob.set_bridge(bridge)
    with vob.session(sample=9, session=0, global_steps=7):
        pass
    assert bridge.force_flush(10)
    run_dir = tmp_path / "dir" / "r1"
    cases = {
        (str(run_dir),): 12,
        (str(run_dir / "global_steps=2"),): 4,
        (str(tmp_path / "dir"),): 12,  # the folder of runs
        (str(run_dir / "global_steps=1"), str(run_dir / "global_steps=3"), str(plain)): 9,
    }
    for paths, spans in cases.items():
        shown = run("show", *paths)
        assert shown.exit_code == 0 and f"{spans} spans in" in shown.stderr, (paths, shown.output)
        reported = run("report", *paths)
        assert reported.exit_code == 0 and f"{spans} spans in sessions" in reported.stdout, (paths, reported.output)
        counts = SpanCounts()
        files = find_captures(paths).files
        summary = replay_records(
            files, ExportChain(Named("m", BoundedMemorySpanExporter()), counts), counts, batch_size=5
        )
        assert (summary.read, summary.exported, summary.bad_lines) == (spans, spans, 0)


def test_report_and_watch_on_a_folder_of_runs_read_its_newest_run_and_name_the_others(
    tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    write_steps(make_bridge, tmp_path, range(1, 3), run_name="older")
    os.utime(tmp_path / "older", (1_000_000_000, 1_000_000_000))  # changed long before the second run
    write_steps(make_bridge, tmp_path, range(1, 2), run_name="newer")
    reported = run("report", str(tmp_path))
    assert reported.exit_code == 0, reported.output
    assert "step 1: 2 sessions, 2 finished" in reported.stdout  # not the 4 of two runs' step 1 put together
    assert "4 spans in sessions" in reported.stdout and "step 2" not in reported.stdout
    said = " ".join(reported.output.split())
    assert f"skipped {tmp_path / 'older'}: another run: only the newest, newer, is read" in said
    watched = run("watch", "--once", str(tmp_path))
    assert watched.exit_code == 0, watched.output
    title = " ".join(watched.stdout.split())
    assert f"{tmp_path / 'newer'} (the newest of 2 runs: name a run folder to watch another)" in title
    assert "2 finished" in title and "4 spans in sessions" in title
    assert run("report", str(tmp_path / "older")).stdout.count("2 sessions, 2 finished") == 2  # named: read


def test_report_step_opens_only_that_steps_folder(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    write_steps(make_bridge, tmp_path, range(1, 6))
    run_dir = tmp_path / "r1"
    built = build_report([run_dir], step=3)
    assert built.files and all(Path(f).parent.name == "global_steps=3" for f in built.files)
    assert [s.step for s in built.steps] == [3] and built.steps[0].sessions == 2
    assert all(Path(f).parent.name == "global_steps=3" for f in find_captures([run_dir], step=3).files)
    for command in (["report"], ["show"], ["replay", "--to", "console"]):
        missing = run(*command, str(run_dir), "--step", "9")
        assert missing.exit_code == 1, (command, missing.output)
        assert f"no step 9 in {run_dir}; the step folders there: 1, 2, 3, 4, 5" in missing.output, command


def test_a_file_cut_mid_member_by_a_crash_is_read_to_its_last_whole_member(tmp_path: Path) -> None:
    good = {"name": "x", "span_id": "1" * 16, "trace_id": "2" * 32, "attributes": {}}
    path = tmp_path / "w.jsonl.gz"
    path.write_bytes(gzip_member(json.dumps(good).encode() + b"\n") + gzip_member(b'{"name": "y", "span')[:-7])
    read = read_records(path)
    assert [r["name"] for r in read.records] == ["x"] and "cut short" in read.bad[-1][1]
    for command in ("show", "report"):
        result = run(command, str(path))
        assert result.exit_code == 0, result.output
    assert "1 spans in 1 traces" in run("show", str(path)).stderr


def test_readers_skip_empty_partial_and_unrelated_files_and_say_so(tmp_path: Path) -> None:
    """verl's default directory with a worker that traced nothing (an empty file), a file cut
    inside its only line, and files that are no captures at all: skipped and listed, never fatal."""
    good = {
        "name": "agent_session",
        "span_id": "1" * 16,
        "trace_id": "2" * 32,
        "start_time_ns": 1,
        "end_time_ns": 2,
        "attributes": {"state_lane_id": "l", "global_steps": 1, "status": "success"},
    }
    folder = tmp_path / "spans"
    folder.mkdir()
    (folder / "spans-a.jsonl").write_text(json.dumps(good) + "\n")
    (folder / "spans-b.jsonl").write_text("")  # a worker that traced nothing
    (folder / "spans-c.jsonl").write_text('{"name": "agent_se')  # cut inside its first line
    (folder / "notes.jsonl").write_text("# not JSON at all\n")
    for command in ("show", "report"):
        result = run(command, str(folder))
        assert result.exit_code == 0, (command, result.output)
        for name, why in (("spans-b.jsonl", "empty"), ("spans-c.jsonl", "no span record"), ("notes.jsonl", "no span")):
            assert f"{folder / name}: {why}" in result.output.replace("\n", ""), (command, name, result.output)
    counts = SpanCounts()
    summary = replay_records(
        find_captures([folder]).files,
        ExportChain(Named("m", BoundedMemorySpanExporter()), counts),
        counts,
        batch_size=5,
    )
    assert summary.exported == 1 and len(summary.empty) == 3


def test_what_a_reader_holds_is_bounded_whatever_a_file_holds(tmp_path: Path) -> None:
    """What a reader holds is bounded: a 160 MB line, and a gzip member inflating to 256 MB without a newline,
    are skipped as they are read; report, show's reading and replay hold a bounded amount meanwhile."""
    good = json.dumps({"name": "x", "span_id": "1" * 16, "trace_id": "2" * 32, "attributes": {}}).encode() + b"\n"
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as f:
        f.write(good)
        for _ in range(160):
            f.write(b"x" * (1 << 20))
        f.write(b"\n" + good)
    bomb = tmp_path / "bomb.jsonl.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with bomb.open("wb") as f:
        for _ in range(256):
            f.write(packer.compress(b"y" * (1 << 20)))
        f.write(packer.compress(b"\n" + good) + packer.flush())
    tracemalloc.start()
    try:
        built = build_report([huge, bomb])
        records = list(CaptureRecords([huge, bomb]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert built.bad_lines == 2 and len(records) == 3
    assert peak < 100 * 1024 * 1024, f"readers held {peak / 2**20:.0f} MiB"


def test_a_follower_resumes_where_it_stopped_as_a_gzip_file_grows(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl.gz"
    path.write_bytes(gzip_member(b"1\n2\n"))
    member = gzip_member(b"3\n4\n")
    with path.open("ab") as f:
        f.write(member[:10])  # a member being written
    lines, position = follow(path)
    assert [line.data for line in lines] == [b"1", b"2"]
    with path.open("ab") as f:
        f.write(member[10:] + gzip_member(b"5\n"))
    lines, position = follow(path, position)
    assert [(line.number, line.data) for line in lines] == [(3, b"3"), (4, b"4"), (5, b"5")]
    assert follow(path, position) == ([], position) and position == Position(path.stat().st_size, 0, 5)


TURN = {"name": "agent_turn", "trace_id": "a" * 32}


def turn_record(turn: int, content: str, **text: Any) -> dict[str, Any]:
    attributes = {"state_lane_id": "l0", "global_steps": 1, "turn": turn, "type": "generate", "content": content}
    return {**TURN, "span_id": f"{turn + 1:016x}", "attributes": {**attributes, **text}}


def test_the_conversation_stored_once_is_rebuilt_whole_for_every_turn_and_the_session(tmp_path: Path) -> None:
    records = [
        turn_record(0, "A1", input="P0"),
        {
            **TURN,
            "name": "agent_turn",
            "span_id": "f" * 16,
            "attributes": {"state_lane_id": "l0", "turn": 1, "type": "tool"},
        },
        turn_record(2, "A2", **{"input.appended": "T1", "input.after_turn": 0}),
        turn_record(3, "A3", **{"input.appended": "T2", "input.after_turn": 2}),
        {**TURN, "name": "agent_session", "span_id": "e" * 16, "attributes": {"state_lane_id": "l0"}},
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rebuilt = read_records(path).records
    inputs = [r["attributes"].get("input") for r in rebuilt]
    assert inputs == ["P0", None, "P0A1T1", "P0A1T1A2T2", "P0"]
    assert rebuilt[-1]["attributes"]["output"] == "A3"
    assert all("input.appended" not in r["attributes"] for r in rebuilt)
    shown = run("show", "--text", str(path))
    assert shown.exit_code == 0 and "P0A1T1A2T2" in shown.stdout, shown.output
    # a turn whose previous turn was never seen keeps its delta, never a wrong whole
    alone = Conversations().rebuilt("t", "agent_turn", records[3]["attributes"])
    assert alone is None


def test_what_the_rebuild_keeps_is_bounded() -> None:
    conversations = Conversations(max_length=100, max_chars=1000)
    for lane in range(100):
        attributes = {
            "state_lane_id": f"l{lane}",
            "turn": 0,
            "type": "generate",
            "input": "p" * 500,
            "content": "c" * 500,
        }
        conversations.rebuilt("t", "agent_turn", attributes)
    assert conversations._chars <= 1000 and len(conversations._trajectories) <= 5


def test_otlp_gets_each_llm_calls_whole_input_rebuilt_from_the_deltas(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory")
    vob.set_bridge(bridge)
    with vob.session(sample=1, session=0, global_steps=1) as s:
        with s.turn(0) as t:
            t.record(content="A1")
            t.span.set_attribute("input", "P0")
        with s.turn(1) as t:
            t.record(content="A2")
            t.span.set_attributes({"input.appended": "T1", "input.after_turn": 0})
    spans = bridge.memory_exporter.get_finished_spans()  # type: ignore[union-attr]
    parts = Translator().batch(spans)  # what the otlp destination sends each span with
    sent = {(s.name, p["attributes"].get("turn")): p["attributes"] for s, p in zip(spans, parts, strict=True)}
    assert sent[("agent_turn", 1)]["input.value"] == "P0A1T1" and "input.appended" not in sent[("agent_turn", 1)]
    assert (
        sent[("agent_session", None)]["input.value"] == "P0" and sent[("agent_session", None)]["output.value"] == "A2"
    )


def test_the_disk_budget_removes_whole_oldest_steps_counts_and_names_each(
    tmp_path: Path, make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "verl_otel_bridge._internal.captures.budget")
    run_dir = tmp_path / "r1"
    counts = SpanCounts()  # the first process's (the one that checks the budget below)
    writers = [
        CaptureDir(run_dir, counts if n == 0 else SpanCounts(), rotate_bytes=1 << 20, budget_bytes=6000)
        for n in range(2)  # two processes
    ]
    bridge = make_bridge(exporter="memory")
    vob.set_bridge(bridge)
    for step in range(1, 9):
        with vob.session(sample=step, session=0, global_steps=step) as s:
            s.span.set_attribute("padding", os.urandom(900).hex())  # incompressible
        spans = bridge.memory_exporter.get_finished_spans()  # type: ignore[union-attr]
        writers[step % 2].send([spans[-1]])
    removed = writers[0].budget.check(force=True)
    kept = sorted(int(p.name.split("=")[1]) for p in run_dir.glob("global_steps=*"))
    assert removed == list(range(1, removed[-1] + 1)) and kept == list(range(removed[-1] + 1, 9))
    total = sum(f.stat().st_size for f in run_dir.glob("global_steps=*/*"))
    assert total <= 6000 and 8 in kept
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == len(removed) and all(f"removed step {n} " in m for n, m in zip(removed, said, strict=True))
    assert counts.get(STEPS_REMOVED) == len(removed) and counts.get(BYTES_REMOVED) > 0
    # a writer whose file the budget removed writes its next spans to a new file: nothing else is lost
    with vob.session(sample=99, session=0, global_steps=removed[0]):
        pass
    writers[removed[0] % 2].send([bridge.memory_exporter.get_finished_spans()[-1]])  # type: ignore[union-attr]
    assert [
        r["attributes"]["sample"]
        for f in find_captures([run_dir], step=removed[0]).files
        for r in read_records(f).records
    ] == ["99"]
    for writer in writers:
        writer.close()


def test_the_default_budget_is_a_quarter_of_the_free_space_the_same_for_every_process(tmp_path: Path) -> None:
    first = CaptureDir(tmp_path / "r", SpanCounts(), rotate_bytes=1 << 20)
    second = CaptureDir(tmp_path / "r", SpanCounts(), rotate_bytes=1 << 20)
    info = os.statvfs(tmp_path)
    free_quarter = info.f_bavail * info.f_frsize // 4
    assert first.budget.max_bytes == second.budget.max_bytes
    assert abs((first.budget.max_bytes or 0) - free_quarter) < 64 * 1024 * 1024
    assert (tmp_path / "r" / LOCK_NAME).read_text().strip() == str(first.budget.max_bytes)
    first.close()
    second.close()


def test_a_plain_jsonl_path_is_still_one_file_and_gz_makes_it_gzip(
    tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    for name in ("one.jsonl", "one.jsonl.gz"):
        path = tmp_path / name
        bridge = make_bridge(exporter="jsonl", jsonl_path=str(path))
        vob.set_bridge(bridge)
        for sample in range(2):
            with vob.session(sample=sample, session=0, global_steps=sample):
                pass
            assert bridge.force_flush(10)
        assert list(tmp_path.glob("*")) and path.is_file() and len(read_records(path).records) == 2
        if name.endswith(".gz"):
            assert len(gzip.decompress(path.read_bytes()).splitlines()) == 2
        else:
            assert len(path.read_text().splitlines()) == 2


def test_doctor_says_where_the_run_folder_is_its_budget_and_what_the_directory_holds(
    tmp_path: Path, make_bridge: Callable[..., Bridge]
) -> None:
    from verl_otel_bridge.cli.doctor import diagnose

    write_steps(make_bridge, tmp_path / "spans", range(1, 4))
    env = {"VERL_OTEL_BRIDGE_EXPORTER": "jsonl", "VERL_OTEL_BRIDGE_CAPTURE_DIR": str(tmp_path / "spans")}
    report = diagnose(env, timeout_s=1)
    assert report["ok"] and "global_steps=<n>" in report["route"]["local"]["detail"]
    assert "a quarter of the free space" in report["route"]["local"]["detail"]
    (run,) = report["captures"]["runs"]
    assert (run["run"], run["steps"], run["newest_step"], run["files"]) == ("r1", 3, 3, 3) and run["bytes"] > 0


def test_sessions_without_a_step_are_shown_as_such(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> None:
    path = tmp_path / "spans.jsonl"
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path))
    vob.set_bridge(bridge)
    with vob.session(sample=0, session=0, uid="u0"):
        pass
    assert bridge.force_flush(10)
    reported = run("report", str(path))
    assert reported.exit_code == 0, reported.output
    assert "step (no global_steps): 1 sessions, 1 finished" in reported.stdout
