"""Fault classes of a third adversarial round: each test provokes the fault, then checks what must hold.

Worker pools ended by SIGTERM, values JSON cannot carry, ``os.fork()`` inside a session,
exceptions raised into span-end code, the default destination's parent directories,
and the rule that everything the bridge writes as JSON is JSON; docs/reliability.md
has a row for each.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import select
import signal
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.captures.run import run_folder
from verl_otel_bridge._internal.exporters.console import Console
from verl_otel_bridge._internal.exporters.jsonl import JsonlFile
from verl_otel_bridge._internal.records import JsonWriter, RecordLines
from verl_otel_bridge._internal.verl import destination

from .helpers import WAIT_S, StartReceiver, assert_balanced, forks_on_purpose, wait_until

Make = Callable[..., Bridge]


def records(path: Path) -> list[dict[str, object]]:
    """Every line of a JSON Lines file, parsed."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


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
    made = [home / ".local", home / ".local" / "state", home / ".local" / "state" / "verl_otel_bridge"]
    made.append(made[-1] / "spans")
    assert config.exporter == "jsonl" and config.capture_dir == str(made[-1])
    made.append(run_folder(config))
    assert {str(d.relative_to(home)): oct(stat.S_IMODE(d.stat().st_mode)) for d in made} == {
        str(d.relative_to(home)): "0o700" for d in made
    }
    assert stat.S_IMODE(home.stat().st_mode) == 0o755  # what existed is left as it was


@pytest.mark.usefixtures("umask_022")
def test_a_jsonl_path_in_missing_directories_makes_them_0700(tmp_path: Path) -> None:
    JsonlFile(tmp_path / "runs" / "today" / "spans.jsonl").close()
    for made in (tmp_path / "runs", tmp_path / "runs" / "today"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made


# -- class 6: a forked child never ends a span its parent will end -------------------------------


def _exit_code(pid: int) -> int:
    """The exit code of child ``pid``, waited for at most ``WAIT_S`` (then killed: -999)."""
    status: list[int] = []

    def ended() -> bool:
        done, raw = os.waitpid(pid, os.WNOHANG)
        status.extend([raw] if done else [])
        return bool(done)

    try:
        wait_until(ended, what=f"child {pid} to end")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return -999
    return os.waitstatus_to_exitcode(status[0])


def _fork_inside_blocks(bridge: Bridge) -> int:
    """Fork inside a session, task, turn and span; both processes leave the blocks. The fork's result."""
    with bridge.session(sample=0, session=0), bridge.task("t"), bridge.turn(0), bridge.span("outer"):
        pid = os.fork()
        if pid == 0:
            with bridge.span("in child"):
                pass
    return pid


@forks_on_purpose
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_inside_an_open_session_leaves_its_spans_to_the_parent(make_bridge: Make, tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path), schedule_delay_ms=10)
    parent = os.getpid()
    try:
        pid = _fork_inside_blocks(bridge)
        if pid == 0:
            bridge.shutdown(timeout_s=WAIT_S)
            os._exit(0)
    finally:
        if os.getpid() != parent:  # the child never returns into pytest
            os._exit(1)
    assert _exit_code(pid) == 0
    bridge.shutdown(timeout_s=WAIT_S)
    written = records(path)
    names = Counter(str(r["name"]) for r in written)
    assert names == {"agent_session": 1, "agent_task": 1, "agent_turn": 1, "outer": 1, "in child": 1}, names
    (in_child,) = [r for r in written if r["name"] == "in child"]
    (outer,) = [r for r in written if r["name"] == "outer"]
    (session,) = [r for r in written if r["name"] == "agent_session"]
    assert in_child["parent_span_id"] == outer["span_id"]  # the child's own spans still join the session's trace
    assert in_child["attributes"]["state_lane_id"] == session["attributes"]["state_lane_id"]  # type: ignore[index]
    assert session["attributes"]["status"] == "success"  # type: ignore[index]


# -- class 2: a value that cannot be encoded costs that value only ----------------------------

#: A file name as ``os.listdir`` returns it for bytes that are not UTF-8: a lone surrogate.
NOT_UNICODE = os.fsdecode(b"r\xe9sultat.txt")
SPANS = 400


def _spans_with_one_bad_value(bridge: Bridge) -> None:
    for i in range(SPANS):
        with bridge.span("work", i=i, file=NOT_UNICODE if i == 123 else "fine.txt"):
            pass


def _written(path: Path) -> list[dict[str, object]]:
    written = records(path)
    assert sorted(int(r["attributes"]["i"]) for r in written) == list(range(SPANS))  # type: ignore[index]
    (bad,) = [r for r in written if r["attributes"]["i"] == 123]  # type: ignore[index]
    assert bad["attributes"]["file"] == "r\ufffdsultat.txt"  # type: ignore[index]
    return written


def test_a_string_that_is_not_unicode_costs_that_value_only_in_json_lines(make_bridge: Make, tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path))
    _spans_with_one_bad_value(bridge)
    counters = assert_balanced(bridge)
    assert counters["exported"]["jsonl"] == SPANS and counters["failed"] == 0
    assert counters["converted"] == 1
    _written(path)


def test_a_string_that_is_not_unicode_costs_that_value_only_in_the_spill(make_bridge: Make, tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    # A queue smaller than one span: every span is spilled (written by the spill's own encoder), then drained.
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path), max_queue_bytes=1, spill_dir=str(tmp_path / "spill"))
    _spans_with_one_bad_value(bridge)

    def drained() -> bool:
        bridge.force_flush(WAIT_S)  # the drain sends the files back on its own thread, soon after
        return bool(bridge.status()["counters"].get("spill_drained") == SPANS)

    wait_until(drained, what="the spill to be drained")
    counters = assert_balanced(bridge)
    assert counters["spill_written"] == SPANS
    assert counters["exported"]["jsonl"] == SPANS and counters["failed"] == counters["dropped"] == 0
    assert counters["converted"] >= 1  # by the spill's encoder (and not again, the value being valid by then)
    _written(path)


def test_a_string_that_is_not_unicode_costs_that_value_only_in_a_json_lines_copy(
    make_bridge: Make, start_receiver: StartReceiver, tmp_path: Path
) -> None:
    sink = start_receiver()
    path = tmp_path / "copy.jsonl"
    bridge = make_bridge(exporter=["otlp", "jsonl"], otlp_endpoint=sink.url, jsonl_path=str(path))
    _spans_with_one_bad_value(bridge)
    counters = assert_balanced(bridge)
    assert counters["exported"]["otlp"] == SPANS and counters["copies.jsonl"] == SPANS
    assert counters.get("copies_failed.jsonl", 0) == 0 and counters["converted"] == 1
    _written(path)


def test_a_string_that_is_not_unicode_costs_that_value_only_on_the_console() -> None:
    out = io.StringIO()
    bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="memory"))
    try:
        _spans_with_one_bad_value(bridge)
        spans = bridge.memory_exporter.get_finished_spans()  # type: ignore[union-attr]
    finally:
        bridge.shutdown()
    assert len(spans) == SPANS  # the memory exporter keeps the span as it was made
    Console(out, format="json").send(spans)
    lines = out.getvalue().encode("utf-8").splitlines()  # UTF-8 can write every line
    assert [json.loads(line)["attributes"]["i"] for line in lines] == list(range(SPANS))


# -- class 1: worker pools keep every span, and never hang, whatever ends them ------------------

POOL = r"""
import json, multiprocessing, os, sys, time
import verl_otel_bridge as vob

def start_worker(path):
    vob.configure(exporter="jsonl", jsonl_path=path, environ={})

def work(task):
    for i in range(100):
        with vob.span("work", task=task, i=i):
            pass
    return task

if __name__ == "__main__":
    method, runs, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    context = multiprocessing.get_context(method)
    for run in range(runs):
        mode = "close" if run % 4 == 3 else "terminate"
        path = os.path.join(directory, f"{run}.jsonl")
        started = time.monotonic()
        pool = context.Pool(4, initializer=start_worker, initargs=(path,))
        if mode == "terminate":
            with pool:  # __exit__ calls terminate(): SIGTERM reaches workers that are flushing at exit
                pool.map(work, range(16))
        else:
            pool.map(work, range(16))
            pool.close()
            pool.join()
        with open(path, "rb") as written:
            lines = sum(1 for _ in written)
        print(json.dumps({"run": run, "mode": mode, "lines": lines, "s": round(time.monotonic() - started, 2)}), flush=True)
"""
POOL_RUNS = 20  # 15 ended by terminate() (a with block), 5 by close() and join()
POOL_RUN_BOUND_S = 60.0  # one run takes seconds; a hung worker would keep it forever


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs POSIX signals")
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_worker_pools_keep_every_span_and_never_hang(tmp_path: Path, method: str) -> None:
    script = tmp_path / "pool.py"  # a file: spawn and forkserver workers import the functions from it
    script.write_text(POOL, encoding="utf-8")
    driver = subprocess.Popen(
        [sys.executable, str(script), method, str(POOL_RUNS), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the pool's workers too: all killed together if a run hangs
    )
    assert driver.stdout is not None
    runs: list[dict[str, object]] = []
    try:
        for _ in range(POOL_RUNS):
            ready, _, _ = select.select([driver.stdout], [], [], POOL_RUN_BOUND_S)
            line = driver.stdout.readline() if ready else b""
            assert line, f"{method}: run {len(runs)} did not end within {POOL_RUN_BOUND_S} s (hung) after {runs}"
            runs.append(json.loads(line))
        assert driver.wait(timeout=POOL_RUN_BOUND_S) == 0
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        stderr = driver.stderr.read().decode(errors="replace") if driver.stderr is not None else ""
    lost = [run for run in runs if run["lines"] != 16 * 100]
    assert not lost, f"{method}: runs that lost spans: {lost}\n{stderr[-3000:]}"


# -- class 7: every ended span is written or counted once, whatever exception span-end code gets --

STORM = r"""
import json, signal, sys, time
import verl_otel_bridge as vob
from verl_otel_bridge._internal.accounting import balance

path, seconds = sys.argv[1], float(sys.argv[2])
bridge = vob.configure(exporter="jsonl", jsonl_path=path, environ={})
armed = False

def interrupt(signum, frame):  # Ctrl-C, again and again: each lands wherever the loop is
    global armed
    if armed:
        armed = False
        raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
caught = made = 0
end = time.monotonic() + seconds
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
while time.monotonic() < end:
    try:
        armed = True
        with vob.span("work", n=made):
            pass
        armed = False
        made += 1
    except KeyboardInterrupt:  # the application catches it and goes on
        caught += 1
signal.setitimer(signal.ITIMER_REAL, 0, 0)
vob.shutdown()
counters = bridge.status()["counters"]
print(json.dumps({"caught": caught, "counters": counters, "balance": balance(counters)}))
"""


def test_a_keyboard_interrupt_storm_in_span_end_code_loses_no_span(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    done = subprocess.run([sys.executable, "-c", STORM, str(path), "2.5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    counters = result["counters"]
    assert result["caught"] > 500  # the storm did interrupt, thousands of times
    written = sum(1 for _ in path.open("rb"))
    assert written == counters["exported"]["jsonl"] == counters["ended"], counters
    assert result["balance"] == 0 and counters["failed"] == counters["dropped"] == 0


EXITING = r"""
import atexit, json, os, signal, sys
import verl_otel_bridge as vob

path = sys.argv[1]
# Registered before the bridge's own hook, so it runs after it: the account once the bridge is shut down.
atexit.register(lambda: print(json.dumps(vob.get_bridge().status()["counters"]), flush=True))
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))  # the application's handler
vob.configure(exporter="jsonl", jsonl_path=path, environ={})
os.write(1, b"ready\n")
attributes = {f"key{i}": f"value {i}" for i in range(40)}  # a span whose hand-over takes a while
n = 0
while True:
    with vob.span("work", n=n, **attributes):
        pass
    n += 1
"""
EXIT_RUNS = 40


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs POSIX signals")
def test_a_sigterm_handler_calling_sys_exit_inside_span_end_code_loses_no_span(tmp_path: Path) -> None:
    chance = random.Random(20261204)
    unbalanced = []
    for run in range(EXIT_RUNS):
        path = tmp_path / f"{run}.jsonl"
        child = subprocess.Popen([sys.executable, "-c", EXITING, str(path)], stdout=subprocess.PIPE)
        assert child.stdout is not None
        try:
            assert child.stdout.readline() == b"ready\n"
            select.select([], [], [], chance.uniform(0.0, 0.05))  # a random point of the busy loop
            child.send_signal(signal.SIGTERM)
            out, _ = child.communicate(timeout=WAIT_S * 3)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 3
        counters = json.loads(out.decode().splitlines()[-1])
        written = sum(1 for _ in path.open("rb"))
        if not written == counters["exported"].get("jsonl", 0) == counters["ended"]:
            unbalanced.append((run, written, counters))
    assert not unbalanced, unbalanced


def test_an_unbalanced_account_at_shutdown_is_a_warning(make_bridge: Make, caplog: pytest.LogCaptureFixture) -> None:
    bridge = make_bridge(exporter="memory")
    with bridge.span("counted"):
        pass
    bridge.counts.incrementer("ended")()  # a span counted ended and then lost: what the account must show
    with caplog.at_level(logging.INFO, logger="verl_otel_bridge"):
        bridge.shutdown()
    (summary,) = [r for r in caplog.records if "shut down" in r.getMessage()]
    assert summary.levelno == logging.WARNING and "unaccounted=1" in summary.getMessage()


# -- the general rule: everything the bridge writes as JSON is JSON (RFC 8259) ------------------


def strict_json(text: str) -> object:
    """``text`` parsed as RFC 8259 JSON written as UTF-8: no NaN or Infinity, no lone surrogate."""

    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} is not JSON")

    text.encode("utf-8")  # raises on a lone surrogate, which UTF-8 cannot carry
    return json.loads(text, parse_constant=refuse)


#: Text with any code point, lone surrogates (``os.fsdecode`` of bytes that are not UTF-8) included.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=20)
#: Every kind of number, NaN, the infinities and an integer Python will not write in decimal included.
ANY_NUMBER = st.one_of(st.integers(), st.floats(), st.builds(pow, st.just(10), st.just(5000)), st.just(-(2**70)))
SCALAR = st.one_of(ANY_TEXT, ANY_NUMBER, st.booleans())
ATTRIBUTES = st.dictionaries(
    ANY_TEXT,
    st.one_of(SCALAR, st.lists(ANY_TEXT, max_size=3).map(tuple), st.lists(ANY_NUMBER, max_size=3).map(tuple)),
    max_size=5,
)


@st.composite
def hostile_spans(draw: st.DrawFn) -> ReadableSpan:
    """A span (as the SDK hands it to exporters) with hostile text and numbers in every text and value field."""
    context = SpanContext(draw(st.integers(1, 2**128 - 1)), draw(st.integers(1, 2**64 - 1)), is_remote=False)
    return ReadableSpan(
        name=draw(ANY_TEXT),
        context=context,
        attributes=draw(ATTRIBUTES),
        events=[Event(draw(ANY_TEXT), draw(ATTRIBUTES), 1) for _ in range(draw(st.integers(0, 2)))],
        resource=Resource(draw(ATTRIBUTES)),
        status=Status(StatusCode.ERROR, draw(ANY_TEXT)),
        start_time=1,
        end_time=2,
    )


@settings(max_examples=300, deadline=None)
@given(span=hostile_spans())
def test_every_record_line_is_json_whatever_the_span_holds(span: ReadableSpan) -> None:
    # The line of exporter jsonl, of exporter console (the same writer) and of the spill (with spilled_from).
    for line in (RecordLines().line(span), RecordLines().line(span, spilled_from="queue")):
        assert line.endswith("\n") and "\n" not in line[:-1]
        record = strict_json(line)
        assert isinstance(record, dict) and record["span_id"] == format(span.context.span_id, "016x")


@settings(max_examples=200, deadline=None)
@given(value=st.recursive(SCALAR | st.none(), lambda inner: st.lists(inner) | st.dictionaries(ANY_TEXT, inner)))
def test_status_and_doctor_json_is_json_whatever_they_hold(value: object) -> None:
    # What doctor --json and the demo's status.json write (a last_error may quote a file name that is not UTF-8).
    strict_json(JsonWriter(indent=2, default=str)({"status": value, "object": object()}))
