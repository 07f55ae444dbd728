"""RL-Insight releases the bridge cannot forward to: none, 0.1.0, 0.2.0.

Asked for RL-Insight (``VERL_RL_INSIGHT_ENABLE=1``), the bridge must send every
span to the fallback with its full identity, say why exactly once (a WARNING
naming the installed and the required version), keep saying it in
``status()``, raise nothing, and send nothing anywhere RL-Insight would: no
discovery request, no OTLP traffic, and with 0.2.0 (whose online API exists)
no ``rl_insight`` call at all, so no hub actor, although Ray is up and a server
URL is set. The demo agent loop runs unchanged on that fallback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import stack
from otlp_receiver import OtlpReceiver
from stack import FakeDiscovery, PythonChild

import verl_otel_bridge as vob
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.identity import IDENTITY_KEYS
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge.cli import demo
from verl_otel_bridge.verl import RLInsightLogger

pytestmark = pytest.mark.rl_insight("none", "0.1.0", "0.2.0")

#: reason code, and what the one log line / status detail must say, per release.
EXPECTED: dict[str, tuple[str, list[str]]] = {
    "none": ("not_installed", ["rl-insight is not installed", "requires >= 0.3.0"]),
    "0.1.0": ("import_failed", ["rl-insight 0.1.0 is installed", "rl_insight.parser", "requires >= 0.3.0"]),
    "0.2.0": ("no_version", ["rl-insight 0.2.0 is installed", "no __version__", "requires >= 0.3.0"]),
}
PUBLIC_0_2_0 = (
    "init",
    "finish",
    "metric_count",
    "metric_gauge",
    "metric_histogram",
    "trace_op",
    "trace_state",
    "update_prometheus_config",
)


@dataclass
class Surroundings:
    """Where RL-Insight traffic would go if the bridge sent any."""

    discovery: FakeDiscovery
    receiver: OtlpReceiver
    rl_insight_calls: list[str]

    def assert_untouched(self) -> None:
        assert self.discovery.requests == [], self.discovery.requests
        assert (self.receiver.request_count, self.receiver.rejected_count) == (0, 0)
        assert self.rl_insight_calls == []


@pytest.fixture
def surroundings(
    request: pytest.FixtureRequest, rl_insight_case: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Surroundings]:
    """RL-Insight asked for, a server URL set (to a recording fake), Ray up where RL-Insight has it (0.2.0)."""
    calls: list[str] = []
    if rl_insight_case == "0.2.0":
        request.getfixturevalue("ray_local")  # every runtime precondition holds: only the version is wrong
        import rl_insight
        import rl_insight.api

        for name in PUBLIC_0_2_0:
            real = getattr(rl_insight, name)
            spy = _spy(name, real, calls)
            monkeypatch.setattr(rl_insight, name, spy)
            if hasattr(rl_insight.api, name):
                monkeypatch.setattr(rl_insight.api, name, spy)
    with OtlpReceiver() as receiver, FakeDiscovery(otlp_port=receiver.port) as discovery:
        monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
        monkeypatch.setenv("RL_INSIGHT_SERVER_URL", discovery.url)
        yield Surroundings(discovery, receiver, calls)


def _spy(name: str, real: Callable[..., Any], calls: list[str]) -> Callable[..., Any]:
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)

    return spy


def _session_work(round_: int) -> None:
    with vob.session(sample=round_, session=1, traj=2, uid=f"u{round_}", global_steps=10 + round_) as s:
        with s.task("solve") as task:
            with s.turn(0) as turn:
                turn.record(prompt_tokens=5, completion_tokens=2, finish_reason="stop")
            task.set_result(status="success", reward=1.0)
        vob.record_span(
            "timed.elsewhere", start_time_ns=1_764_000_000_000_000_000, end_time_ns=1_764_000_000_000_000_500
        )
        with vob.get_bridge().tracer.start_as_current_span("plain.tracer"):
            pass
        with pytest.raises(KeyError):
            with vob.span("raises"):
                raise KeyError("x")
        s.finish(status="success", trajectories=[{"chain_id": 1, "reward_score": 1.0, "num_turns": 1}])


def test_spans_fall_back_with_full_identity_and_one_warning(
    surroundings: Surroundings, rl_insight_case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="verl_otel_bridge")
    bridge = vob.configure(schedule_delay_ms=50)  # everything from the environment, as a worker would
    try:
        for round_ in range(4):  # four separate exports, and status() asked each time
            _session_work(round_)
            assert bridge.force_flush(30)
            status = bridge.status()
        reason, fragments = EXPECTED[rl_insight_case]
        assert (status["exporter"], status["reason"]) == ("memory (fallback)", reason)
        for fragment in fragments:
            assert fragment in status["detail"], (fragment, status["detail"])
        assert status["rl_insight_package_version"] == (None if rl_insight_case == "none" else rl_insight_case)
        assert status["rl_insight_installed"] is (rl_insight_case != "none")
        assert status["rl_insight_version"] is None  # none of these has a usable __version__

        said = [r for r in caplog.records if "is not usable" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert said[0].levelno == logging.WARNING
        for fragment in [reason, *fragments, "memory exporter"]:
            assert fragment in said[0].getMessage(), (fragment, said[0].getMessage())

        spans = bridge.memory_exporter.get_finished_spans()
        assert len(spans) == 4 * 6
        for span in spans:
            attributes = dict(span.attributes)
            assert all(key in attributes for key in IDENTITY_KEYS), span.name
            round_ = int(attributes["sample"])
            assert attributes["state_lane_id"] == f"experiment=default/sample={round_}/session=1/traj=2"
            assert attributes["global_steps"] == 10 + round_ and type(attributes["global_steps"]) is int
        counters = status["counters"]
        assert (counters["fallback"], counters["exported"], counters["failed"], balance(counters)) == (24, {}, 0, 0)
        surroundings.assert_untouched()
    finally:
        vob.shutdown()


@pytest.mark.rl_insight("0.2.0")
def test_0_2_0_is_never_called_so_no_hub_exists(
    surroundings: Surroundings, make_bridge: Callable[..., vob.Bridge], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    import rl_insight.api

    assert ray.is_initialized() and not hasattr(rl_insight, "__version__")
    for exporter in ("rl_insight", "auto"):
        bridge = make_bridge(
            exporter=exporter,
            rl_insight_enable=True,
            rl_insight_server_url=surroundings.discovery.url,
            rl_insight_transport="otlp",
        )
        _session_work(0)
        assert bridge.force_flush(30)
        assert bridge.status()["reason"] == "no_version"
        assert bridge.rl_insight_probe(initialize=True).reason == "no_version"
    # the verl facade, whose original would lazily call rl_insight.init() here
    RLInsightLogger.log({"loss": 1.0}, step=0)
    with RLInsightLogger.trace_state("rollout", state_lane_id="lane"):
        pass
    RLInsightLogger.register_metrics(["127.0.0.1:1"], job_name="j")
    RLInsightLogger.agent_loop_session(experiment_name="e", sample=0, session=0).finish(trajectories=[])
    RLInsightLogger.finish()

    surroundings.assert_untouched()  # not even init: its version alone rules it out
    assert rl_insight_compat.init_calls() == 0
    assert rl_insight.api._STATE.enabled is False and rl_insight.api._STATE.client is None
    actors = ray.util.list_named_actors(all_namespaces=True)
    assert not [a for a in actors if a.get("namespace") == "rl-insight-monitor"], actors


def test_demo_agent_loop_runs_unchanged_on_the_fallback(
    surroundings: Surroundings, make_bridge: Callable[..., vob.Bridge], capsys: pytest.CaptureFixture[str]
) -> None:
    bridge = make_bridge(rl_insight_enable=True, project="demo-proj", schedule_delay_ms=50)
    asyncio.run(demo.run())  # the demo's own code; it shuts the current bridge down at the end
    out = capsys.readouterr().out
    assert f"{demo.SESSIONS} sessions done; spans went to: memory (fallback)" in out
    spans = bridge.memory_exporter.get_finished_spans()
    in_sessions = [s for s in spans if "state_lane_id" in (s.attributes or {})]
    assert len(in_sessions) == len(spans) and len([s for s in spans if s.name == "agent_session"]) == demo.SESSIONS
    for span in spans:
        assert span.attributes["project"] == "demo-proj" and span.attributes["global_steps"] == 1
        assert span.attributes["state_lane_id"].startswith("experiment=default/sample=")
    counters = bridge.status()["counters"]
    assert counters["fallback"] == len(spans) and balance(counters) == 0
    surroundings.assert_untouched()


_DEMO = """
import sys
from pathlib import Path
from verl_otel_bridge.cli import demo
demo.main(Path(sys.argv[1]))
"""


def test_demo_process_warns_once_and_raises_nothing(
    surroundings: Surroundings, rl_insight_case: str, tmp_path: Path
) -> None:
    """``verl-otel-bridge demo`` in a fresh process: one WARNING for the reason, then only the shutdown summary."""
    with PythonChild(_DEMO, env={"VERL_OTEL_BRIDGE_SCHEDULE_DELAY_MS": "20"}, args=[str(tmp_path)]) as child:
        done = child.finish(timeout_s=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    reason, fragments = EXPECTED[rl_insight_case]
    said = [line for line in done.stderr.splitlines() if "is not usable" in line]
    assert len(said) == 1, said
    assert said[0].startswith("WARNING verl_otel_bridge")
    for fragment in [reason, *fragments]:
        assert fragment in said[0], (fragment, said[0])
    assert "status():\nverl_otel_bridge: spans go to memory (fallback)\n" in done.stdout  # printed for people
    status = json.loads((tmp_path / "status.json").read_text(encoding="utf-8"))  # kept beside the capture
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", reason)
    counters = status["counters"]
    assert counters["fallback"] == counters["ended"] > 0 and balance(counters) == 0
    summary = [line for line in done.stderr.splitlines() if "shut down" in line]
    assert len(summary) == 1 and summary[0].startswith("WARNING")  # asked for RL-Insight, got the fallback
    surroundings.assert_untouched()
    assert stack.LOOPBACK in surroundings.discovery.url


def test_auto_without_asking_says_it_once_at_info(
    surroundings: Surroundings, rl_insight_case: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``exporter: auto`` and nobody asked for RL-Insight: the same fallback, said once at INFO, not WARNING."""
    monkeypatch.delenv("VERL_RL_INSIGHT_ENABLE")
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    bridge = vob.configure(schedule_delay_ms=50)
    try:
        for round_ in range(2):
            _session_work(round_)
            assert bridge.force_flush(30)
        reason = EXPECTED[rl_insight_case][0]
        assert (bridge.status()["exporter"], bridge.status()["reason"]) == ("memory (fallback)", reason)
        said = [r for r in caplog.records if "is not usable" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.INFO
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        surroundings.assert_untouched()
    finally:
        vob.shutdown()


def test_verl_switch_off_keeps_auto_local_without_probing(
    surroundings: Surroundings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``VERL_RL_INSIGHT_ENABLE=0`` (verl's ``trainer.logger`` without ``rl_insight``): RL-Insight is not looked at."""
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "0")
    bridge = vob.configure()
    try:
        _session_work(0)
        status = bridge.status()
        assert (status["exporter"], status["reason"], status["rl_insight_version"]) == ("memory", "configured", None)
        assert status["counters"]["exported"] == {"memory": 6}
        assert bridge.rl_insight_probe() is None
        surroundings.assert_untouched()
    finally:
        vob.shutdown()


_RECONFIGURING_PROCESS = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
import verl_otel_bridge as vob
from verl_otel_bridge.verl import RLInsightLogger

# traced before the trainer's init: a bridge from the environment
with vob.session(sample=0, session=0, global_steps=1):
    pass
vob.force_flush()
RLInsightLogger.init("proj", "exp", {"trainer": {"logger": ["rl_insight"]}})  # a second bridge (configure)
with vob.session(sample=1, session=0, global_steps=1):
    pass
RLInsightLogger.trace_span("x", start_time_ns=10**18, end_time_ns=10**18 + 1)
RLInsightLogger.finish()
RLInsightLogger.init("proj", "exp2", {"trainer": {"logger": ["rl_insight"]}})  # a later run: a third bridge
with vob.session(sample=2, session=0, global_steps=1):
    pass
vob.force_flush()
report(vob.status())
"""


def test_one_warning_per_reason_per_process_across_bridges(surroundings: Surroundings, rl_insight_case: str) -> None:
    """A process whose bridge is replaced (early spans, then ``RLInsightLogger.init``, then a second run) still
    says the reason once: it cannot change while the process runs, and saying it per bridge is noise."""
    with PythonChild(_RECONFIGURING_PROCESS) as child:
        status = child.result(timeout_s=120)
        done = child.finish(timeout_s=60)
    assert done.returncode == 0, done.stderr[-3000:]
    reason, fragments = EXPECTED[rl_insight_case]
    assert status["reason"] == reason and status["exporter"] == "memory (fallback)"
    said = [line for line in done.stderr.splitlines() if "is not usable" in line]
    warned = [line for line in said if line.startswith("WARNING")]
    assert len(warned) == 1, said
    assert all(fragment in warned[0] for fragment in [reason, *fragments]), warned[0]
    surroundings.assert_untouched()
