"""A session still open at shutdown is ended once, as unfinished: leaving its block afterwards does nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.protocol import SESSION_SPAN_NAME, STATUS, UNFINISHED


def _ended_once(bridge: Bridge, caplog: pytest.LogCaptureFixture) -> None:
    assert bridge.memory_exporter is not None
    sessions = [s for s in bridge.memory_exporter.get_finished_spans() if s.name == SESSION_SPAN_NAME]
    assert [s.attributes[STATUS] for s in sessions if s.attributes] == [UNFINISHED]
    otel = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")]
    assert otel == [], otel  # no "Setting attribute on ended span", no "Calling end() on an ended span"


def test_a_session_left_after_shutdown(make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture) -> None:
    bridge = make_bridge(exporter="memory")
    block = bridge.session(sample=0, session=0)
    block.__enter__()
    bridge.shutdown()
    with caplog.at_level(logging.DEBUG):
        block.__exit__(None, None, None)
    _ended_once(bridge, caplog)


def test_a_session_held_open_by_a_generator_closed_after_shutdown(
    make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    bridge = make_bridge(exporter="memory")

    def steps() -> Iterator[int]:
        with bridge.session(sample=0, session=1) as session:
            with session.turn(0):
                pass
            yield 1
            yield 2

    generator = steps()
    next(generator)
    bridge.shutdown()
    with caplog.at_level(logging.DEBUG):
        generator.close()  # GeneratorExit inside the session block
    _ended_once(bridge, caplog)
