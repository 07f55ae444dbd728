"""How a session ends: success, explicit finish, error, cancellation."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from opentelemetry.trace import StatusCode

from verl_otel_bridge.testing import SpanCapture

from .helpers import WAIT_S


def _attrs(span: object) -> dict:
    return dict(span.attributes or {})  # type: ignore[attr-defined]


def test_default_finish_is_success(otel_spans: SpanCapture) -> None:
    with otel_spans.bridge.session(sample=0, session=0) as session:
        pass
    span = otel_spans.one("agent_session")
    assert session.status == "success"
    assert (
        _attrs(span).items()
        >= {
            "monitor.trace_source": "session",
            "status": "success",
            "num_trajectories": 0,
            "runner_name": "",
            "reward_source": "",
            "finished": "",
        }.items()
    )
    assert span.status.status_code is StatusCode.UNSET


def test_explicit_finish_sets_every_attribute(otel_spans: SpanCapture) -> None:
    trajectories = [SimpleNamespace(chain_id=1), SimpleNamespace(chain_id=2), SimpleNamespace(chain_id=3)]
    with otel_spans.bridge.session(sample=0, session=0) as session:
        session.finish(
            status="timeout", trajectories=trajectories, runner_name="runner", reward_source="rm", finished=True
        )
    attributes = _attrs(otel_spans.one("agent_session"))
    assert {k: attributes[k] for k in ("status", "num_trajectories", "runner_name", "reward_source", "finished")} == {
        "status": "timeout",
        "num_trajectories": 3,
        "runner_name": "runner",
        "reward_source": "rm",
        "finished": True,
    }
    assert session.trajectories == tuple(trajectories)


def test_finish_twice_keeps_the_first_and_warns(otel_spans: SpanCapture, caplog: pytest.LogCaptureFixture) -> None:
    with otel_spans.bridge.session(sample=0, session=0) as session:
        session.finish(status="success", finished=False)
        with caplog.at_level(logging.WARNING, logger="verl_otel_bridge"):
            session.finish(status="error")
    assert _attrs(otel_spans.one("agent_session"))["status"] == "success"
    assert session.status == "success"
    assert "finished twice" in caplog.text


def test_exception_marks_the_session_and_propagates_unchanged(otel_spans: SpanCapture) -> None:
    error = ValueError("tool blew up")
    with pytest.raises(ValueError) as raised:
        with otel_spans.bridge.session(sample=0, session=0):
            with otel_spans.bridge.span("tool"):
                raise error
    assert raised.value is error
    span = otel_spans.one("agent_session")
    assert span.status.status_code is StatusCode.ERROR
    assert "tool blew up" in (span.status.description or "")
    assert _attrs(span)["status"] == "error"
    (event,) = [event for event in span.events if event.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "tool blew up"
    assert otel_spans.one("tool").status.status_code is StatusCode.ERROR


def test_exception_after_explicit_finish_keeps_the_explicit_status(otel_spans: SpanCapture) -> None:
    with pytest.raises(KeyError):
        with otel_spans.bridge.session(sample=0, session=0) as session:
            session.finish(status="partial")
            raise KeyError("late")
    span = otel_spans.one("agent_session")
    assert _attrs(span)["status"] == "partial"
    assert span.status.status_code is StatusCode.ERROR


def test_cancelled_task_finishes_as_cancelled(otel_spans: SpanCapture) -> None:
    async def main() -> None:
        entered = asyncio.Event()

        async def run_session() -> None:
            with otel_spans.bridge.session(sample=0, session=0):
                entered.set()
                await asyncio.Event().wait()  # until cancelled

        task = asyncio.create_task(run_session())
        await asyncio.wait_for(entered.wait(), WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)

    asyncio.run(main())
    span = otel_spans.one("agent_session")
    assert _attrs(span)["status"] == "cancelled"
    assert span.status.status_code is StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]
