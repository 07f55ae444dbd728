"""``status()`` as a newcomer reads it: every destination with its count, pending spans and where they go,
fields that say what they hold, a readable text for people beside the mapping for programs."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from opentelemetry.trace import Span

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.status import BridgeStatus

WAIT_S = 10.0


def three_spans(bridge: Bridge) -> None:
    """The quickstart's session: a session, its task and its turn."""
    with bridge.session(sample=0, session=0, global_steps=1, uid="u0") as s:
        with s.task("solve") as task:
            with s.turn(0) as turn:
                turn.record(prompt_tokens=120, completion_tokens=48, finish_reason="stop")
            task.set_result(status="success", reward=1.0)
        s.finish(status="success")


def test_after_the_quickstart_queued_spans_are_pending_to_the_fallback_which_is_listed(
    make_bridge: Callable[..., Bridge],
) -> None:
    # A long batch delay holds the spans in the queue until the flush, as right after the quickstart.
    bridge = make_bridge(schedule_delay_ms=600_000)
    three_spans(bridge)

    before = bridge.status()
    assert before["exporter"] == "memory (fallback)" and before["reason"] == "not_installed"
    assert before["pending"]["queued"] == 3
    assert before["pending"]["to"] == "memory (fallback)" and before["pending"]["bytes"] > 0
    assert {name: entry["role"] for name, entry in before["exporters"].items()} == {
        "rl_insight": "primary",
        "memory": "fallback",
    }
    assert "pending: 3 queued" in str(before) and "going to memory (fallback)" in str(before)

    assert bridge.force_flush(WAIT_S)
    after = bridge.status()
    assert after["pending"] == {"queued": 0, "bytes": 0, "spilled": 0, "to": "memory (fallback)"}
    assert after["exporters"]["memory"]["exported"] == 3 == after["counters"]["fallback"]
    assert after["exporters"]["rl_insight"]["exported"] == 0
    assert bridge.memory_exporter is not None and len(bridge.memory_exporter.get_finished_spans()) == 3


def test_installed_is_a_boolean_and_the_versions_are_apart(make_bridge: Callable[..., Bridge]) -> None:
    for settings in ({}, {"exporter": "memory"}, {"enabled": False}):
        status = make_bridge(**settings).status()
        assert status["rl_insight_installed"] is False, settings
        assert status["rl_insight_version"] is None and status["rl_insight_package_version"] is None


def test_every_copy_is_listed_with_its_count(make_bridge: Callable[..., Bridge], tmp_path: Path) -> None:
    """The demo's route: ``auto`` plus a JSON Lines copy; the copy and the fallback both show their spans."""
    bridge = make_bridge(exporter="auto,jsonl", jsonl_path=str(tmp_path / "copy.jsonl"))
    three_spans(bridge)
    assert bridge.force_flush(WAIT_S)
    exporters = bridge.status()["exporters"]
    assert [(name, entry["role"], entry["exported"]) for name, entry in exporters.items()] == [
        ("rl_insight", "primary", 0),
        ("memory", "fallback", 3),
        ("jsonl", "copy", 3),
    ]


def test_a_fallback_also_configured_as_a_copy_keeps_both_entries(
    make_bridge: Callable[..., Bridge], tmp_path: Path
) -> None:
    bridge = make_bridge(exporter="auto,jsonl", fallback="jsonl", jsonl_path=str(tmp_path / "s.jsonl"))
    three_spans(bridge)
    assert bridge.force_flush(WAIT_S)
    exporters = bridge.status()["exporters"]
    assert exporters["jsonl (fallback)"]["role"] == "fallback" and exporters["jsonl (fallback)"]["exported"] == 3
    assert exporters["jsonl"]["role"] == "copy" and exporters["jsonl"]["exported"] == 3


def test_printed_it_is_a_few_readable_lines_and_programs_keep_the_mapping(
    make_bridge: Callable[..., Bridge],
) -> None:
    bridge = make_bridge(exporter="memory")
    three_spans(bridge)
    status = bridge.status()
    text = str(status)
    assert text.splitlines() == [
        "verl_otel_bridge: spans go to memory",
        "  why: exporter='memory' configured [configured]",
        "  RL-Insight: not installed",
        "  spans: 3 started, 3 ended",
        "  exporters:",
        "    memory  primary   3 exported  (read them: vob.get_bridge().memory_exporter.get_finished_spans())",
        "  pending: none",
        "  open sessions: 0",
    ]
    plain = json.loads(json.dumps(status))
    assert plain == status and isinstance(plain, dict)
    assert repr(status).startswith("{'enabled': True")  # repr stays the mapping's
    assert str(make_bridge(enabled=False).status()).splitlines()[0] == "verl_otel_bridge: spans go to none"


def test_status_and_span_are_typed() -> None:
    """What an editor and mypy see: the status's keys and the span ``span()`` yields, not ``Any``."""
    hints = typing.get_type_hints(Bridge.status)
    assert hints["return"] is BridgeStatus
    assert typing.get_type_hints(Bridge.span)["return"] == AbstractContextManager[Span]
    assert typing.get_type_hints(vob.span)["return"] == AbstractContextManager[Span]
    assert typing.get_type_hints(vob.status)["return"] is BridgeStatus
    assert set(BridgeStatus.__annotations__) >= {"exporter", "reason", "counters", "exporters", "pending", "shut_down"}
