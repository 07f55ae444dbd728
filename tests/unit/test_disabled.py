"""A disabled bridge: every API works, nothing is produced, nothing raises."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge


@pytest.fixture(params=["enabled=False", "OTEL_SDK_DISABLED=true"])
def disabled(
    request: pytest.FixtureRequest, make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch
) -> Bridge:
    if request.param == "enabled=False":
        return make_bridge(enabled=False)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    return vob.configure()  # through the environment and the module-level slot


def test_every_api_works_and_produces_nothing(disabled: Bridge) -> None:
    assert disabled.enabled is False

    @disabled.traced("sync")
    def sync(x: int) -> int:
        return x + 1

    @disabled.traced
    async def run(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    with disabled.session(sample=3, session=4, global_steps=5, project="p", experiment_name="e") as session:
        assert vob.current_identity() == session.identity
        with disabled.span("turn", payload={"a": 1}) as span:
            assert not span.is_recording()
            span.set_attribute("k", "v")  # harmless
        disabled.record_span("r", start_time_ns=1_700_000_000_000_000_000, end_time_ns=1_700_000_000_000_000_001)
        disabled.record_span("bad", start_time_ns=-1, end_time_ns="x")  # type: ignore[arg-type]
        assert sync(1) == 2
        assert asyncio.run(run(2)) == 4
        session.finish(status="success", trajectories=[1, 2])
    assert vob.current_identity() is None
    assert session.identity.to_dict() == {
        "project": "p",
        "experiment_name": "e",
        "sample": "3",
        "session": "4",
        "traj": "0",
        "state_lane_id": "experiment=e/sample=3/session=4/traj=0",
        "uid": "",
        "global_steps": 5,
        "session_id": "",
    }
    assert disabled.memory_exporter is None
    status = disabled.status()
    assert (status["enabled"], status["exporter"], status["reason"]) == (False, "none", "disabled")
    assert status["counters"]["started"] == 0 and status["counters"]["invalid"] == 0
    assert disabled.force_flush() is True
    disabled.shutdown()
    disabled.shutdown()


def test_exceptions_still_propagate(disabled: Bridge) -> None:
    error = RuntimeError("x")
    with pytest.raises(RuntimeError) as raised:
        with disabled.session(sample=0, session=0):
            with disabled.span("s"):
                raise error
    assert raised.value is error


def test_module_level_api_on_a_disabled_bridge(disabled: Bridge) -> None:
    vob.set_bridge(disabled)
    with vob.session(sample=1, session=1) as session:
        with vob.span("s"):
            vob.record_span("r", start_time_ns=1, end_time_ns=0)
        assert vob.current_identity() == session.identity
    assert vob.status()["enabled"] is False
