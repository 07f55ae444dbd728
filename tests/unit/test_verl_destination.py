"""The verl plugin's default destination (:mod:`verl_otel_bridge._internal.verl.destination`): a private JSON Lines
file per process in one directory when nothing says where spans go, else what the environment names.

verl's config is a plain mapping of the keys the bridge reads (no verl needed); the
real verl worker's use of it is in tests/verl.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.captures.layout import file_name
from verl_otel_bridge._internal.captures.read import read_records
from verl_otel_bridge._internal.captures.run import run_folder, run_name
from verl_otel_bridge._internal.verl import destination
from verl_otel_bridge.cli import app as cli

LOGGER = "verl_otel_bridge._internal.verl.destination"


def verl_config(*, loggers: tuple[str, ...] = ("console",), section: dict[str, Any] | None = None) -> dict[str, Any]:
    trace: dict[str, Any] = {"backend": "otel"}
    if section is not None:
        trace["otel_bridge"] = section
    return {
        "trainer": {"project_name": "proj", "experiment_name": "exp", "logger": list(loggers)},
        "actor_rollout_ref": {"rollout": {"trace": trace}},
    }


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "verl_otel_bridge" / "spans"


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_no_destination_writes_a_private_run_folder_and_warns_once(
    state_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    config = destination.worker_config(verl_config())
    run = run_folder(config)
    assert (
        config.exporter == "jsonl" and config.capture_dir == str(state_home) and state_home == destination.default_dir()
    )
    assert run.parent == state_home and run.name.startswith("exp-")  # verl's trainer.experiment_name
    assert stat.S_IMODE(state_home.stat().st_mode) == 0o700 and stat.S_IMODE(run.stat().st_mode) == 0o700
    (said,) = warnings(caplog)
    assert str(run) in said and f"verl-otel-bridge report {run}" in said and "global_steps=<n>/" in said
    assert "VERL_OTEL_BRIDGE_EXPORTER" in said and "docs/verl.md" in said
    # a later bridge of the same process writes into the same run folder, silently
    again = destination.worker_config(verl_config())
    assert run_folder(again) == run and len(warnings(caplog)) == 1
    bridge = Bridge(config)
    try:
        with bridge.session(sample=1, session=0, global_steps=4):
            pass
        assert bridge.force_flush(10)
        status = bridge.status()
        assert status["exporter"] == "jsonl" and str(run) in status["detail"]
    finally:
        bridge.shutdown()
    (path,) = (run / "global_steps=4").iterdir()
    assert path.name == file_name(0) and path.name.endswith(".jsonl.gz")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    (record,) = read_records(path).records
    assert record["name"] == "agent_session" and record["attributes"]["project"] == "proj"


def test_the_default_directory_is_under_the_home_directory_without_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert destination.default_dir() == tmp_path / ".local" / "state" / "verl_otel_bridge" / "spans"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: a relative path is invalid
    assert destination.default_dir() == tmp_path / ".local" / "state" / "verl_otel_bridge" / "spans"


def test_run_folder_names_differ_across_processes_without_ray() -> None:
    """Without Ray (and without the driver's VERL_OTEL_BRIDGE_CAPTURE_RUN) a process is its own run."""
    probe = "from verl_otel_bridge._internal.captures.run import run_name; print(run_name(None, 'exp'))"
    names = {
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60).stdout
        for _ in range(2)
    } | {run_name(None, "exp") + "\n"}
    assert len(names) == 3 and all(name.startswith("exp-") for name in names)
    assert run_name("driver's run", "exp") == "driver_s_run"


@pytest.mark.parametrize(
    ("environ", "section", "loggers", "exporter"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, None, ("console",), "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, None, ("console",), "otlp"),
        ({"VERL_OTEL_BRIDGE_OTLP_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, None, ("console",), "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, None, (), "console"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, None, ("console",), ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "none"}, None, ("console",), "none"),
        ({"VERL_OTEL_BRIDGE_EXPORTER": "memory"}, None, ("console",), "memory"),
        ({"OTEL_TRACES_EXPORTER": "console"}, {"exporter": "memory"}, ("console",), "memory"),
        ({}, {"fallback": "console"}, ("console",), "auto"),
        ({}, {"fallback": "console"}, ("console", "rl_insight"), "auto"),
        ({"VERL_OTEL_BRIDGE_EXPORTER": "otlp"}, None, ("console", "rl_insight"), "otlp"),
    ],
)
def test_a_configured_destination_wins_over_the_default(
    state_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    environ: dict[str, str],
    section: dict[str, Any] | None,
    loggers: tuple[str, ...],
    exporter: str | tuple[str, ...],
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = destination.worker_config(verl_config(loggers=loggers, section=section))
    assert config.exporter == exporter
    assert not state_home.exists() and not warnings(caplog)


def test_rl_insight_selected_falls_back_to_the_default_run_folder_said_at_info(
    state_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """RL-Insight selected with no destination: RL-Insight when usable, else the default capture layout (not
    memory, which is gone at exit); said at INFO, since the bridge warns when RL-Insight is not usable."""
    caplog.set_level(logging.INFO, LOGGER)
    config = destination.worker_config(verl_config(loggers=("console", "rl_insight")))
    run = run_folder(config)
    assert (config.exporter, config.fallback, config.rl_insight_enable) == ("auto", "jsonl", True)
    assert config.capture_dir == str(state_home) and stat.S_IMODE(run.stat().st_mode) == 0o700
    assert not warnings(caplog)
    (said,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "while RL-Insight is not usable" in said and str(run) in said


def test_rl_insight_selected_with_a_jsonl_path_falls_back_to_that_file(
    tmp_path: Path, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(tmp_path / "mine.jsonl"))
    config = destination.worker_config(verl_config(loggers=("rl_insight",)))
    assert (config.exporter, config.fallback, config.jsonl_path) == ("auto", "jsonl", str(tmp_path / "mine.jsonl"))
    assert not state_home.exists()


def test_jsonl_path_alone_makes_the_exporter_jsonl_to_that_file(
    tmp_path: Path, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(tmp_path / "mine-{pid}.jsonl"))
    config = destination.worker_config(verl_config())
    assert (config.exporter, config.jsonl_path) == ("jsonl", str(tmp_path / "mine-{pid}.jsonl"))
    assert not state_home.exists()


def test_capture_dir_alone_makes_the_exporter_jsonl_into_that_directory(
    tmp_path: Path, state_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(destination.CAPTURE_DIR_ENV, str(tmp_path / "shared"))
    config = destination.worker_config(verl_config())
    assert (config.exporter, config.capture_dir) == ("jsonl", str(tmp_path / "shared"))
    assert not state_home.exists() and not warnings(caplog)


def test_an_otel_traces_exporter_the_bridge_lacks_fails_naming_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(
        ValueError, match=r"exporter='zipkin' names 'zipkin'.*VERL_OTEL_BRIDGE_EXPORTER.*OTEL_TRACES_EXPORTER"
    ):
        destination.worker_config(verl_config())


def link_to_elsewhere(state_home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    state_home.parent.mkdir(parents=True)
    state_home.symlink_to(elsewhere)


def widen(state_home: Path, tmp_path: Path) -> None:
    state_home.mkdir(parents=True)
    state_home.chmod(0o755)


def run_is_a_link(state_home: Path, tmp_path: Path) -> None:
    state_home.mkdir(parents=True, mode=0o700)
    (tmp_path / "target").mkdir(mode=0o700)
    (state_home / run_name(None, "exp")).symlink_to(tmp_path / "target")


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [(link_to_elsewhere, "is a symbolic link"), (widen, "has mode 0755"), (run_is_a_link, "is a symbolic link")],
)
def test_a_default_directory_that_is_not_private_is_refused_and_said(
    state_home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, spoil: Any, reason: str
) -> None:
    spoil(state_home, tmp_path)
    config = destination.worker_config(verl_config())
    assert config.exporter == "auto" and config.fallback == "memory"  # spans stay in memory, and it is said
    (said,) = warnings(caplog)
    assert "cannot be used" in said and reason in said and "VERL_OTEL_BRIDGE_EXPORTER" in said
    assert not any((tmp_path / "elsewhere").glob("*")) if (tmp_path / "elsewhere").exists() else True
    assert not any((tmp_path / "target").glob("*")) if (tmp_path / "target").exists() else True


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli.build_cli(), list(args), catch_exceptions=False)


def test_show_and_report_read_every_file_of_a_run_folder(state_home: Path, tmp_path: Path) -> None:
    for worker in range(2):  # two workers' files, as two processes of one run write them
        config = BridgeConfig.resolve(exporter="jsonl", capture_dir=str(state_home), capture_run="r1")
        bridge = Bridge(config)
        with bridge.session(sample=worker, session=0, global_steps=4):
            pass
        bridge.shutdown()
    run = state_home / "r1"
    assert len(list((run / "global_steps=4").iterdir())) == 2
    (run / "notes.txt").write_text("not a capture\n")
    shown = run_cli("show", str(run))
    assert shown.exit_code == 0, shown.output
    assert "2 spans in 2 traces; 0 bad lines" in shown.stderr and "skipped" in shown.stderr
    reported = run_cli("report", str(run))
    assert reported.exit_code == 0, reported.output
    assert "2 spans in sessions from 2 files" in reported.stdout, reported.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in ("show", "report"):
        refused = run_cli(command, str(empty))
        assert refused.exit_code == 1 and f"no span record in {empty}" in refused.output
    assert os.listdir(empty) == []
