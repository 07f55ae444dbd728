"""Where spans go for each ``exporter``/``fallback`` choice, and what ``status()`` says about it."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

from .fake_rl_insight import usable_rl_insight
from .helpers import WAIT_S, assert_balanced, identity_of

T0 = 1_700_000_000_000_000_007
HEX32 = re.compile(r"[0-9a-f]{32}")
HEX16 = re.compile(r"[0-9a-f]{16}")


#: Keys every ``status()`` has, whatever the route.
STATUS_KEYS = {"enabled", "exporter", "reason", "detail", "rl_insight_version", "counters", "pending"}


def route(bridge: Bridge) -> tuple[str, str]:
    """``(exporter, reason)`` from ``status()``, after checking its shape."""
    status = bridge.status()
    assert STATUS_KEYS <= set(status), sorted(status)
    assert status["enabled"] is True and isinstance(status["detail"], str) and status["detail"]
    return status["exporter"], status["reason"]


def make_spans(bridge: Bridge) -> None:
    """One session with a child span and a recorded span: 3 spans."""
    with bridge.session(sample=5, session=6, global_steps=7):
        with bridge.span("turn", turn=0):
            bridge.record_span("generate", start_time_ns=T0, end_time_ns=T0 + 1_000_001)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def check_records(records: list[dict[str, Any]]) -> None:
    """The JSON records of ``make_spans``: exact times, hex ids, parents, identity."""
    by_name = {record["name"]: record for record in records}
    assert set(by_name) == {"agent_session", "turn", "generate"}
    generate, turn, session = by_name["generate"], by_name["turn"], by_name["agent_session"]
    assert (generate["start_time_ns"], generate["end_time_ns"]) == (T0, T0 + 1_000_001)
    for record in records:
        assert HEX32.fullmatch(record["trace_id"]) and HEX16.fullmatch(record["span_id"])
        assert record["trace_id"] == session["trace_id"]
        assert record["attributes"]["state_lane_id"] == "experiment=default/sample=5/session=6/traj=0"
        assert record["attributes"]["global_steps"] == 7
        assert set(IDENTITY_KEYS) <= set(record["attributes"])
    assert session["parent_span_id"] is None
    assert turn["parent_span_id"] == session["span_id"]
    assert generate["parent_span_id"] == turn["span_id"]


def test_memory(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory")
    make_spans(bridge)
    assert {s.name for s in bridge.memory_exporter.get_finished_spans()} == {"agent_session", "turn", "generate"}
    assert route(bridge) == ("memory", "configured")
    status = bridge.status()
    assert (status["rl_insight_version"], status["pending"]["queued"]) == (None, 0)
    assert "memory" in status["detail"]
    assert status["counters"]["exported"] == {"memory": 3}


def test_memory_keeps_only_the_most_recent_spans(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory", memory_max_spans=5)
    for i in range(12):
        with bridge.span(f"s{i}"):
            pass
    assert [s.name for s in bridge.memory_exporter.get_finished_spans()] == [f"s{i}" for i in range(7, 12)]
    assert assert_balanced(bridge)["exported"] == {"memory": 12}


def test_console_prints_one_json_line_per_span(
    make_bridge: Callable[..., Bridge], capsys: pytest.CaptureFixture[str]
) -> None:
    bridge = make_bridge(exporter="console", console_format="json")
    make_spans(bridge)
    assert bridge.force_flush(WAIT_S)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    check_records([json.loads(line) for line in lines])
    assert route(bridge) == ("console", "configured")
    assert bridge.status()["counters"]["exported"] == {"console": 3}
    assert bridge.memory_exporter is None


def test_jsonl_writes_parseable_lines_with_exact_times(make_bridge: Callable[..., Bridge], tmp_path: Path) -> None:
    path = tmp_path / "sub" / "spans.jsonl"
    bridge = make_bridge(exporter="jsonl", jsonl_path=str(path))
    make_spans(bridge)
    assert bridge.force_flush(WAIT_S)
    check_records(read_jsonl(path))
    assert route(bridge) == ("jsonl", "configured")
    assert bridge.status()["counters"]["exported"] == {"jsonl": 3}


def test_jsonl_appends_across_bridges(make_bridge: Callable[..., Bridge], tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    for _ in range(2):
        bridge = make_bridge(exporter="jsonl", jsonl_path=str(path))
        make_spans(bridge)
        bridge.shutdown()
    assert len(read_jsonl(path)) == 6


def test_none_discards_but_counts(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="none")
    make_spans(bridge)
    assert bridge.memory_exporter is None
    assert route(bridge) == ("none", "configured")
    counters = assert_balanced(bridge)
    assert (counters["exported"], counters["discarded"]) == ({}, 3)  # discarded, not "exported"
    assert bridge.status()["exporters"]["none"]["discarded"] == 3


@pytest.mark.parametrize("exporter", ["auto", "rl_insight"])
@pytest.mark.parametrize("fallback", ["memory", "console", "jsonl", "none"])
def test_unusable_rl_insight_goes_to_each_fallback(
    make_bridge: Callable[..., Bridge], tmp_path: Path, capsys: pytest.CaptureFixture[str], exporter: str, fallback: str
) -> None:
    path = tmp_path / "fallback.jsonl"
    bridge = make_bridge(exporter=exporter, fallback=fallback, jsonl_path=str(path), console_format="json")
    make_spans(bridge)
    counters = assert_balanced(bridge)
    assert route(bridge) == (f"{fallback} (fallback)", "not_installed")
    status = bridge.status()
    assert status["rl_insight_version"] is None
    assert "not installed" in status["detail"] and "0.3.0" in status["detail"]
    taken = "discarded" if fallback == "none" else "fallback"  # none keeps nothing: it discards
    assert counters[taken] == 3 and counters["exported"] == {}
    if fallback == "memory":
        assert all(identity_of(s) for s in bridge.memory_exporter.get_finished_spans())
        assert len(bridge.memory_exporter.get_finished_spans()) == 3
    elif fallback == "console":
        check_records([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    elif fallback == "jsonl":
        check_records(read_jsonl(path))


def test_auto_uses_usable_rl_insight(make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = usable_rl_insight(monkeypatch)
    bridge = make_bridge(exporter="auto")
    make_spans(bridge)
    counters = assert_balanced(bridge)
    assert route(bridge) == ("rl_insight", "ok")
    assert bridge.status()["rl_insight_version"] == "0.3.0"
    assert counters["exported"] == {"rl_insight": 3} and counters["fallback"] == 0
    assert sorted(call.name for call in fake.calls) == ["agent_session", "generate", "turn"]
    assert bridge.memory_exporter.get_finished_spans() == ()


@pytest.mark.parametrize("enable", ["0", "false", "off"])
def test_rl_insight_disabled_by_verl_keeps_auto_local(
    make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, enable: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    fake = usable_rl_insight(monkeypatch)  # usable, but verl said no
    bridge = make_bridge(environ={"VERL_RL_INSIGHT_ENABLE": enable})
    make_spans(bridge)
    assert_balanced(bridge)
    assert route(bridge) == ("memory", "configured")
    assert "VERL_RL_INSIGHT_ENABLE=0" in bridge.status()["detail"]
    assert fake.calls == [] and fake.init_calls == []
    assert len(bridge.memory_exporter.get_finished_spans()) == 3
    assert not [r for r in caplog.records if "RL-Insight" in r.getMessage()]


@pytest.mark.parametrize(
    ("environ", "settings", "level"),
    [
        ({}, {"exporter": "auto"}, logging.INFO),
        ({"VERL_RL_INSIGHT_ENABLE": "1"}, {"exporter": "auto"}, logging.WARNING),
        ({}, {"exporter": "rl_insight"}, logging.WARNING),
    ],
    ids=["auto-unset-info", "auto-enabled-warning", "explicit-warning"],
)
def test_unusable_rl_insight_log_level(
    make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture, environ: dict, settings: dict, level: int
) -> None:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    bridge = make_bridge(environ=environ, **settings)
    make_spans(bridge)
    assert bridge.force_flush(WAIT_S)
    records = [r for r in caplog.records if "RL-Insight is not usable" in r.getMessage()]
    assert [r.levelno for r in records] == [level]
    assert "not_installed" in records[0].getMessage()


@pytest.mark.parametrize(
    ("settings", "worrying"),
    [({"exporter": "auto"}, False), ({"exporter": "rl_insight"}, True), ({"exporter": "memory"}, False)],
)
def test_shutdown_summary_level(
    make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture, settings: dict, worrying: bool
) -> None:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    bridge = make_bridge(**settings)
    make_spans(bridge)
    bridge.shutdown()
    (summary,) = [r for r in caplog.records if "shut down" in r.getMessage()]
    assert summary.levelno == (logging.WARNING if worrying else logging.INFO)
    assert "ended=3" in summary.getMessage() and "unaccounted=0" in summary.getMessage()


def test_every_exporter_name_the_config_accepts_is_a_kind_or_the_routes() -> None:
    from verl_otel_bridge._internal.config import EXPORTERS, FALLBACKS
    from verl_otel_bridge._internal.exporter_names import NAMES, destination_module

    assert set(EXPORTERS) == set(NAMES) and NAMES["auto"].module is None
    for name in set(NAMES) - {"auto"}:  # each builds; each local one (and otlp) has doctor's check too
        module = destination_module(name)
        assert callable(module.build), name
        assert name == "rl_insight" or callable(module.check), name
    assert set(FALLBACKS) <= set(NAMES) - {"auto", "rl_insight"}
