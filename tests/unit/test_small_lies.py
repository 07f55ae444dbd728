"""Small things a new user trips on: a typo in a status or a setting's value, a closed pipe, empty attributes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.tree import render_tree

WAIT_S = 120

# -- status values outside the protocol's -------------------------------------------------------


def status_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "status" in r.getMessage()]


def test_a_status_outside_the_protocol_is_kept_and_warned_about_once_per_value(
    make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    bridge = make_bridge(exporter="memory")
    with caplog.at_level(logging.WARNING, logger="verl_otel_bridge"):
        for status in ("sucess", "sucess", "Success", "timeout", "unfinished", "ok"):
            with bridge.session(sample=0, session=0) as s:
                s.finish(status=status)
    spans = bridge.memory_exporter.get_finished_spans()  # type: ignore[union-attr]
    assert [span.attributes["status"] for span in spans] == [  # type: ignore[index]
        "sucess",
        "sucess",
        "Success",
        "timeout",
        "unfinished",
        "ok",
    ]
    warned = status_warnings(caplog)
    assert len(warned) == 2, warned  # 'sucess' once, 'ok' once; the protocol's (any case) never
    assert "'sucess'" in warned[0] and "Did you mean 'success'?" in warned[0] and "kept" in warned[0]
    assert "'ok'" in warned[1] and "Did you mean" not in warned[1]


def test_a_task_status_outside_the_protocol_is_warned_about_too(
    make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    bridge = make_bridge(exporter="memory")
    with caplog.at_level(logging.WARNING, logger="verl_otel_bridge"):
        with bridge.session(sample=0, session=0), bridge.task("solve") as task:
            task.set_result(status="faild", reward=0.0)
    (warned,) = status_warnings(caplog)
    assert "'faild'" in warned and "Did you mean 'failed'?" in warned
    task_span = next(s for s in bridge.memory_exporter.get_finished_spans() if s.name == "agent_task")  # type: ignore[union-attr]
    assert task_span.attributes["status"] == "faild"  # type: ignore[index]


# -- "did you mean" for values, as for keys -------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "meant"),
    [
        ({"exporter": "Console"}, "console"),
        ({"exporter": ["auto", "jsnol"]}, "jsonl"),
        ({"fallback": "consol"}, "console"),
        ({"rl_insight_transport": "HUB"}, "hub"),
    ],
    ids=["exporter", "exporter list", "fallback", "rl_insight_transport"],
)
def test_a_value_outside_a_keys_choices_gets_did_you_mean(settings: dict[str, object], meant: str) -> None:
    with pytest.raises(ValueError, match=rf"is not one of: .*Did you mean '{meant}'\?"):
        BridgeConfig.resolve(environ={}, **settings)


def test_did_you_mean_from_the_environment_and_only_when_something_is_close() -> None:
    with pytest.raises(ValueError, match=r"Did you mean 'console'\?.*VERL_OTEL_BRIDGE_EXPORTER"):
        BridgeConfig.resolve(environ={"VERL_OTEL_BRIDGE_EXPORTER": "Console"})
    with pytest.raises(ValueError) as raised:
        BridgeConfig.resolve(environ={}, exporter="kafka")
    assert "Did you mean" not in str(raised.value)


def test_the_exporter_error_speaks_of_otel_traces_exporter_only_when_that_variable_set_the_value() -> None:
    with pytest.raises(ValueError) as raised:
        BridgeConfig.resolve(environ={"OTEL_TRACES_EXPORTER": "zipkin"})
    said = str(raised.value)
    assert "(set by environment OTEL_TRACES_EXPORTER)" in said
    assert "the bridge reads rl_insight, otlp, otlp_proto_http, console, none" in said
    assert "VERL_OTEL_BRIDGE_EXPORTER wins over OTEL_TRACES_EXPORTER" in said  # how to override it, left set
    for where in ({"exporter": "zipkin"}, {"environ": {"VERL_OTEL_BRIDGE_EXPORTER": "zipkin"}}):
        with pytest.raises(ValueError) as raised:
            BridgeConfig.resolve(**{"environ": {}, **where})  # type: ignore[arg-type]
        assert "OTEL_TRACES_EXPORTER" not in str(raised.value), where


# -- the command line on a closed pipe ----------------------------------------------------------------


@pytest.fixture
def big_capture(tmp_path: Path, make_bridge: Callable[..., Bridge]) -> Path:
    """A capture whose tree, report and replay are each far larger than a pipe's buffer (64 KiB)."""
    path = tmp_path / "spans.jsonl"
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path))
    for sample in range(400):
        with bridge.session(sample=sample, session=0, global_steps=sample % 4, uid=f"u{sample % 50}") as s:
            with s.turn(0):
                pass
    assert bridge.force_flush(10)
    return path


def _cli(args: list[str], read_first_line: bool) -> subprocess.CompletedProcess[str]:
    """Run the command with standard output a pipe whose reader closes before it writes, or after one line."""
    read, write = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VERL_OTEL_BRIDGE_"))}
    with subprocess.Popen(
        [sys.executable, "-m", "verl_otel_bridge.cli", *args],
        stdout=write,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as proc:
        os.close(write)
        with os.fdopen(read, "rb") as reader:
            if read_first_line:
                assert reader.readline()  # as `| head -1`
        stderr = proc.communicate(timeout=WAIT_S)[1]
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("read_first_line", [False, True], ids=["reader gone at once", "reader gone after a line"])
@pytest.mark.parametrize("command", [["show"], ["report"], ["replay", "--to", "console"]], ids=lambda c: c[0])
def test_show_report_and_replay_end_quietly_when_the_reader_goes_away(
    big_capture: Path, command: list[str], read_first_line: bool
) -> None:
    done = _cli([command[0], str(big_capture), *command[1:]], read_first_line)
    assert done.stderr == ""  # no traceback, no "exporter raised", no summary of a cut-short run
    assert done.returncode == 1


# -- the tree printer -------------------------------------------------------------------------------------


def test_the_tree_leaves_out_empty_attributes(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory")
    with bridge.session(sample=0, session=0) as s:
        s.finish(status="success")  # runner_name, reward_source and finished become ""
        with bridge.span("tool", args=[], note=None, given=0, flag=False):
            pass
    tree = render_tree(bridge.memory_exporter.get_finished_spans())  # type: ignore[union-attr]
    session_line, tool_line = tree.splitlines()
    assert "status=success" in session_line and "num_trajectories=0" in session_line
    for empty in ("runner_name=", "reward_source=", "finished="):
        assert empty not in session_line
    assert "given=0" in tool_line and "flag=False" in tool_line
    assert "args=" not in tool_line and "note=" not in tool_line
