"""The ``otel_spans`` fixture (pytest11 entry point) and the helpers it offers."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import verl_otel_bridge as vob
from verl_otel_bridge._internal import current
from verl_otel_bridge._internal.tree import render_tree
from verl_otel_bridge.testing import SpanCapture, capture_spans

T0 = 1_700_000_000_000_000_000


def test_plugin_is_registered_through_the_entry_point(pytestconfig: pytest.Config) -> None:
    plugin = pytestconfig.pluginmanager.get_plugin("verl_otel_bridge")
    assert plugin is not None and plugin.__name__ == "verl_otel_bridge.pytest_plugin"


def test_module_level_api_records_into_the_fixture(otel_spans: SpanCapture) -> None:
    assert vob.get_bridge() is otel_spans.bridge
    with vob.session(sample=1, session=2, global_steps=3):
        with vob.span("turn", turn=0):
            vob.record_span("generate", start_time_ns=T0, end_time_ns=T0 + 5)
    assert [s.name for s in otel_spans.spans] == ["generate", "turn", "agent_session"]
    assert len(otel_spans.sessions()) == 1
    assert otel_spans.one("generate").end_time == T0 + 5
    otel_spans.clear()
    assert otel_spans.spans == []


@pytest.fixture
def sentinel_bridge(make_bridge) -> Iterator[vob.Bridge]:
    """A current bridge set before ``otel_spans``; checks at teardown (after otel_spans') that it is back."""
    sentinel = make_bridge(exporter="none")
    vob.set_bridge(sentinel)
    yield sentinel
    assert current._current is sentinel, "otel_spans did not restore the previous bridge"


def test_fixture_restores_the_previous_bridge(sentinel_bridge: vob.Bridge, otel_spans: SpanCapture) -> None:
    assert vob.get_bridge() is otel_spans.bridge is not sentinel_bridge


def test_capture_spans_restores_and_shuts_down() -> None:
    before = vob.set_bridge(None)
    assert before is None
    with capture_spans() as capture:
        assert vob.get_bridge() is capture.bridge
        with vob.span("inside"):
            pass
    assert current._current is None
    assert [s.name for s in capture.exporter.get_finished_spans()] == ["inside"]
    with vob.span("after"):  # the captured bridge is shut down; a fresh one serves this
        pass
    assert [s.name for s in capture.exporter.get_finished_spans()] == ["inside"]


def test_capture_spans_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "none")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with capture_spans() as capture:
        with vob.span("s"):
            pass
        assert [s.name for s in capture.spans] == ["s"]


def test_one_failure_shows_the_tree(otel_spans: SpanCapture) -> None:
    with vob.session(sample=1, session=2):
        with vob.span("turn"):
            pass
        with vob.span("turn"):
            pass
    with pytest.raises(AssertionError) as none_found:
        otel_spans.one("missing")
    message = str(none_found.value)
    assert "expected exactly one span named 'missing', found 0" in message
    assert "agent_session" in message and "\n  turn" in message
    with pytest.raises(AssertionError, match="named 'turn', found 2"):
        otel_spans.one("turn")


def test_assert_identity_diff(otel_spans: SpanCapture) -> None:
    with vob.span("outside"):
        pass
    with vob.session(sample=1, session=2, global_steps=3):
        with vob.span("inside"):
            pass
    otel_spans.assert_identity(otel_spans.one("inside"), {"sample": "1", "global_steps": 3})
    with pytest.raises(AssertionError) as wrong:
        otel_spans.assert_identity(otel_spans.one("inside"), {"sample": "9", "global_steps": 3})
    assert "span 'inside' identity differs" in str(wrong.value)
    assert "'sample': expected '9', got '1'" in str(wrong.value)
    with pytest.raises(AssertionError) as missing:
        otel_spans.assert_identity(otel_spans.one("outside"))
    assert "missing 'state_lane_id'" in str(missing.value) and "missing 'sample'" in str(missing.value)


def test_render_tree_shows_nesting_and_identity(otel_spans: SpanCapture) -> None:
    with vob.span("setup", phase="init"):
        pass
    with vob.session(sample=1, session=2, global_steps=3, uid="u7"):
        with vob.span("turn", turn=0):
            vob.record_span("generate", start_time_ns=T0, end_time_ns=T0 + 2_500_000)
        try:
            with vob.span("tool"):
                raise ValueError("x")
        except ValueError:
            pass
    lines = render_tree(otel_spans.spans).splitlines()
    assert otel_spans.tree() == "\n".join(lines)
    by_name = {line.strip().split(" ")[0]: line for line in lines}
    indent = {name: len(line) - len(line.lstrip(" ")) for name, line in by_name.items()}
    assert indent == {"setup": 0, "agent_session": 0, "turn": 2, "generate": 4, "tool": 2}
    assert "{sample=1 session=2 traj=0 global_steps=3 uid=u7}" in by_name["agent_session"]
    assert "turn=0" in by_name["turn"]
    assert "[2.5 ms]" in by_name["generate"]
    assert "ERROR" in by_name["tool"]
    assert "phase=init" in by_name["setup"] and "{" not in by_name["setup"]
    assert re.search(r"^agent_session \[\d+\.\d ms\]", by_name["agent_session"])


def test_render_tree_accepts_jsonl_records(otel_spans: SpanCapture) -> None:
    from verl_otel_bridge._internal.records import span_to_record

    with vob.session(sample=1, session=2):
        with vob.span("turn"):
            pass
    records = [span_to_record(span) for span in otel_spans.spans]
    assert render_tree(records) == otel_spans.tree()
