"""``verl_otel_bridge.verl.RLInsightLogger`` against the real RL-Insight 0.3.0, and with none installed.

One test per method and environment. In this process the session's hub fixture
already initialised RL-Insight (``project="p"``, ``experiment_name="e"``), so
the facade must not initialise it again (and must not ``finish`` what it did not
start); the exactly-once ``rl_insight.init`` of a fresh process, under 32
threads and 100 coroutines, runs in a child process attached to the session's
Ray cluster.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import stack
from stack import INIT_SPY_PREAMBLE, PythonChild, RlInsightHub, count_metric

import verl_otel_bridge as vob
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.identity import IDENTITY_KEYS, SessionIdentity
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge.verl import RLInsightLogger

WITH = pytest.mark.rl_insight("0.3.0")
WITHOUT = pytest.mark.rl_insight("none")
T0 = 1_764_000_000_987_654_321
ARRIVAL_S = 60.0


def verl_config(**bridge: Any) -> dict[str, Any]:
    """A verl trainer config excerpt (what verl hands ``RLInsightLogger.init``)."""
    return {
        "trainer": {"project_name": "ignored", "experiment_name": "ignored", "logger": ["console", "rl_insight"]},
        "actor_rollout_ref": {"rollout": {"trace": {"otel_bridge": {"schedule_delay_ms": 50, **bridge}}}},
    }


@pytest.fixture
def facade(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[RLInsightLogger]]:
    """The facade with verl's switch on, its per-process memory reset, and the bridge shut down after."""
    monkeypatch.setenv(RLInsightLogger.ENABLE_ENV, "1")
    monkeypatch.setattr(RLInsightLogger, "_once", OnceLogger(logging.getLogger("verl_otel_bridge.verl")))
    RLInsightLogger._registered_metrics.clear()
    yield RLInsightLogger
    RLInsightLogger._registered_metrics.clear()
    vob.shutdown()


@pytest.fixture
def init_spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Records calls of the real ``rl_insight.init`` (and still calls it)."""
    import rl_insight

    calls: list[dict[str, Any]] = []
    real = rl_insight.init

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(rl_insight, "init", spy)
    return calls


def metrics_when(fetch: Callable[[], str], ready: Callable[[str], Any], what: str) -> str:
    """The Prometheus text once ``ready(text)`` holds (bounded wait)."""

    def check() -> str | None:
        text = fetch()
        return text if ready(text) else None

    return stack.wait_until(check, 30, interval_s=0.2, message=f"{what} never appeared")


def init_with_hub(facade: type[RLInsightLogger], tag: str) -> vob.Bridge:
    """``RLInsightLogger.init`` forwarding through the hub, with a memory copy of each span."""
    facade.init(f"proj-{tag}", f"exp-{tag}", verl_config(exporter=["rl_insight", "memory"], rl_insight_transport="hub"))
    return vob.get_bridge()


# --------------------------------------------------------------------------- enabled, rollout_state_lane_id


@pytest.mark.rl_insight("0.3.0", "none")
@pytest.mark.parametrize(
    ("value", "expected"), [("1", True), ("0", False), ("true", True), ("perhaps", False), ("", False), (None, False)]
)
def test_enabled_follows_verls_switch(value: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("VERL_RL_INSIGHT_ENABLE", raising=False)
    else:
        monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", value)
    assert RLInsightLogger.ENABLE_ENV == "VERL_RL_INSIGHT_ENABLE"
    assert RLInsightLogger.enabled() is expected


@pytest.mark.rl_insight("0.3.0", "none")
def test_rollout_state_lane_id_is_verls() -> None:
    assert RLInsightLogger.rollout_state_lane_id(3) == "rollout_replica_3"
    assert RLInsightLogger.rollout_state_lane_id(0, prefix="actor") == "actor_replica_0"
    assert str(RLInsightLogger.MINIMUM_RL_INSIGHT_VERSION) == "0.3.0"


# --------------------------------------------------------------------------- init


@WITH
def test_init_configures_from_verl_and_reuses_an_existing_rl_insight_init(
    rl_insight_hub: RlInsightHub, facade: type[RLInsightLogger], init_spy: list[dict[str, Any]], run_tag: str
) -> None:
    import rl_insight.api

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bridge = init_with_hub(facade, run_tag)
        with vob.session(sample=run_tag, session=0, global_steps=1):
            pass
        assert bridge.force_flush(30)
    assert not [w for w in caught if "more than once" in str(w.message)]
    assert init_spy == []  # RL-Insight was already on in this process: not initialised twice
    assert (bridge.config.project, bridge.config.experiment_name) == (f"proj-{run_tag}", f"exp-{run_tag}")
    assert bridge.config.rl_insight_enable is True
    status = bridge.status()
    assert (status["exporter"], status["reason"], status["rl_insight_version"]) == ("rl_insight", "ok", "0.3.0")
    assert rl_insight.api._STATE.labels == {"project": "p", "experiment_name": "e"}
    (span,) = rl_insight_hub.receiver.wait_for(1, ARRIVAL_S, where=lambda s: s.attributes.get("sample") == run_tag)
    assert (span.attributes["project"], span.attributes["experiment_name"]) == (f"proj-{run_tag}", f"exp-{run_tag}")


@WITHOUT
def test_init_without_rl_insight_configures_the_fallback(
    facade: type[RLInsightLogger], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="verl_otel_bridge")
    facade.init("proj", "exp", verl_config())
    bridge = vob.get_bridge()
    assert (bridge.config.project, bridge.config.experiment_name, bridge.config.rl_insight_enable) == (
        "proj",
        "exp",
        True,
    )
    status = bridge.status()
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", "not_installed")
    said = [r for r in caplog.records if "is not usable" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert rl_insight_compat.init_calls() == 0


# --------------------------------------------------------------------------- log


@WITH
def test_log_publishes_gauges_with_slashes_replaced(
    rl_insight_hub: RlInsightHub, facade: type[RLInsightLogger], monkeypatch: pytest.MonkeyPatch, run_tag: str
) -> None:
    init_with_hub(facade, run_tag)
    monkeypatch.setenv(RLInsightLogger.ENABLE_ENV, "0")
    facade.log({f"off_{run_tag}/loss": 9.0}, step=1)  # verl's switch off: nothing published
    monkeypatch.setenv(RLInsightLogger.ENABLE_ENV, "1")
    facade.log(
        {f"t_{run_tag}/actor/loss": 0.5, f"t_{run_tag}/acc": 1, f"t_{run_tag}/name": "text", f"t_{run_tag}/none": None},
        step=7,
    )
    prefix = f"rl_insight_monitor_t_{run_tag}_"
    text = metrics_when(
        rl_insight_hub.metrics, lambda t: f"{prefix}acc" in t and f"{prefix}actor_loss" in t, "log() gauges at /metrics"
    )
    assert [value for _, value in count_metric(text, f"{prefix}actor_loss", project="p")] == [0.5]
    assert [value for _, value in count_metric(text, f"{prefix}acc")] == [1.0]
    assert f"{prefix}name" not in text and f"{prefix}none" not in text  # non-numbers skipped
    assert f"off_{run_tag}" not in text  # sent before the others, on the same ordered path
    assert "step" not in "".join(line for line in text.splitlines() if prefix in line)
    counters = vob.status()["counters"]
    assert "verl.metrics_skipped" not in counters and "verl.log_degraded" not in counters


@WITHOUT
def test_log_without_rl_insight_is_skipped_and_counted(facade: type[RLInsightLogger]) -> None:
    facade.init("proj", "exp", verl_config())
    facade.log({"a/b": 1.0, "c": 2.0}, step=1)
    facade.log({"d": 3.0}, step=2)
    counters = vob.status()["counters"]
    assert (counters["verl.metrics_skipped"], counters["verl.log_degraded"]) == (3, 2)


# --------------------------------------------------------------------------- trace_state


@WITH
def test_trace_state_uses_rl_insights_trace_state(
    rl_insight_hub: RlInsightHub, facade: type[RLInsightLogger], run_tag: str
) -> None:
    bridge = init_with_hub(facade, run_tag)
    lane = RLInsightLogger.rollout_state_lane_id(0, prefix=run_tag)
    started = time.time_ns()
    with facade.trace_state("generate_sequences", state_lane_id=lane, step=3):
        with facade.trace_state("generate_sequences", state_lane_id=lane):  # same-name overlap merges
            pass
    ended = time.time_ns()
    (span,) = rl_insight_hub.receiver.wait_for(1, ARRIVAL_S, where=lambda s: s.attributes.get("state_lane_id") == lane)
    assert span.name == "generate_sequences"
    assert started <= span.start_time_ns <= span.end_time_ns <= ended
    assert span.attributes == {
        "process_id": span.attributes["process_id"],
        "project": "p",
        "experiment_name": "e",
        "step": 3,
        "monitor.trace_segment": "state_interval",
        "state_name": "generate_sequences",
        "state_lane_id": lane,
    }
    assert bridge.status()["counters"]["ended"] == 0  # RL-Insight's own span, not the bridge's


@WITHOUT
def test_trace_state_without_rl_insight_is_a_bridge_span(facade: type[RLInsightLogger]) -> None:
    facade.init("proj", "exp", verl_config())
    with facade.trace_state("update_actor", state_lane_id="actor_replica_1", step=3):
        pass
    bridge = vob.get_bridge()
    assert bridge.force_flush(30)
    (span,) = bridge.memory_exporter.get_finished_spans()
    assert span.name == "update_actor"
    assert dict(span.attributes) == {
        "step": 3,
        "monitor.trace_segment": "state_interval",
        "state_name": "update_actor",
        "state_lane_id": "actor_replica_1",
    }
    assert vob.status()["counters"]["verl.trace_state_degraded"] == 1


# --------------------------------------------------------------------------- trace_span


@WITH
def test_trace_span_returns_while_rl_insight_is_stuck_and_arrives_with_its_exact_times_and_attributes(
    rl_insight_hub: RlInsightHub, facade: type[RLInsightLogger], run_tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl_insight

    real = rl_insight.trace_span
    released = threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> Any:
        released.wait(ARRIVAL_S)  # RL-Insight answers nothing until the test releases it
        return real(*args, **kwargs)

    monkeypatch.setattr(rl_insight, "trace_span", stuck)
    bridge = init_with_hub(facade, run_tag)
    returned = threading.Event()

    def call() -> None:
        facade.trace_span(
            "gateway_generation",
            start_time_ns=T0,
            end_time_ns=T0 + 5_000_001,
            attributes={"tag": run_tag, "tokens": 7, "ids": [1, 2], "meta": {"k": "v"}},
        )
        returned.set()

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    try:
        # A trace_span that waited for RL-Insight could not return while it is stuck; the bound only keeps
        # a failure from hanging.
        returned_while_stuck = returned.wait(ARRIVAL_S / 2)
    finally:
        released.set()
    caller.join(ARRIVAL_S)
    assert returned_while_stuck, "trace_span waited for a stuck RL-Insight"
    (span,) = rl_insight_hub.receiver.wait_for(1, ARRIVAL_S, where=lambda s: s.attributes.get("tag") == run_tag)
    assert span.name == "gateway_generation"
    assert (span.start_time_ns, span.end_time_ns) == (T0, T0 + 5_000_001)
    assert (span.attributes["tokens"], span.attributes["ids"], span.attributes["meta"]) == (7, [1, 2], '{"k": "v"}')
    assert span.attributes["otel.status_code"] == "UNSET" and len(span.attributes["otel.span_id"]) == 16
    assert bridge.status()["counters"]["exported"] == {"rl_insight": 1}


@WITHOUT
def test_trace_span_without_rl_insight_goes_to_the_fallback(facade: type[RLInsightLogger]) -> None:
    facade.init("proj", "exp", verl_config())
    facade.trace_span("gateway_generation", start_time_ns=T0, end_time_ns=T0 + 1, attributes={"tokens": 7})
    bridge = vob.get_bridge()
    assert bridge.force_flush(30)
    (span,) = bridge.memory_exporter.get_finished_spans()
    assert (span.name, span.start_time, span.end_time, dict(span.attributes)) == (
        "gateway_generation",
        T0,
        T0 + 1,
        {"tokens": 7},
    )
    counters = vob.status()["counters"]
    assert counters["fallback"] == 1 and balance(counters) == 0


# --------------------------------------------------------------------------- agent_loop_session


@WITH
def test_agent_loop_session_identity_and_finish(
    rl_insight_hub: RlInsightHub, facade: type[RLInsightLogger], run_tag: str
) -> None:
    from rl_insight.agent_loop import agent_loop_session

    bridge = init_with_hub(facade, run_tag)
    before = time.time_ns()
    session = facade.agent_loop_session(
        experiment_name=f"exp-{run_tag}", sample=run_tag, session=2, traj=1, uid="u/1", global_steps=9, session_id="c"
    )
    real = agent_loop_session(
        project=f"proj-{run_tag}",
        experiment_name=f"exp-{run_tag}",
        sample=run_tag,
        session=2,
        traj=1,
        uid="u/1",
        global_steps=9,
        session_id="c",
    )
    assert list(session.identity.items()) == list(real.identity.items())
    assert before <= session.start_ns <= time.time_ns()
    session.finish(
        trajectories=[SimpleNamespace(chain_id=1, reward_score=0.5, num_turns=3)],
        status="success",
        runner_name="uni-agent",
        reward_source="rm",
        finished=True,
    )
    session.finish(trajectories=[], status="again")  # ignored
    assert bridge.force_flush(30)
    stack.drain(bridge, rl_insight_hub.receiver)
    (span,) = [s for s in rl_insight_hub.receiver.spans if s.attributes.get("sample") == run_tag]
    assert span.name == "agent_session" and span.start_time_ns == session.start_ns
    had = stack.bridge_copy_exporter(bridge).get_finished_spans()
    assert span.end_time_ns == next(s for s in had if s.name == "agent_session").end_time
    assert {key: span.attributes[key] for key in IDENTITY_KEYS} == real.identity
    assert {
        k: span.attributes[k]
        for k in ("monitor.trace_source", "status", "runner_name", "reward_source", "num_trajectories", "finished")
    } == {
        "monitor.trace_source": "session",
        "status": "success",
        "runner_name": "uni-agent",
        "reward_source": "rm",
        "num_trajectories": 1,
        "finished": True,
    }
    text = metrics_when(
        rl_insight_hub.metrics,
        lambda t: count_metric(t, "rl_insight_monitor_agent_loop_traj_info", sample=run_tag),
        "agent_loop gauges for the facade's session",
    )
    ((labels, value),) = count_metric(text, "rl_insight_monitor_agent_loop_session_info", sample=run_tag)
    assert value == 1.0 and (labels["session"], labels["global_steps"]) == ("2", "9")
    ((labels, _),) = count_metric(text, "rl_insight_monitor_agent_loop_traj_info", sample=run_tag)
    assert labels["traj"] == "0" and labels["title"] == "Trajectory #0 · reward 0.5 · 3 turns"


@WITHOUT
def test_agent_loop_session_without_rl_insight(facade: type[RLInsightLogger]) -> None:
    facade.init("proj", "exp", verl_config())
    session = facade.agent_loop_session(sample=4, session=1, global_steps=2)
    expected = SessionIdentity.create(project="proj", experiment_name="exp", sample=4, session=1, global_steps=2)
    assert session.identity == expected.to_dict()
    assert session.identity["state_lane_id"] == "experiment=exp/sample=4/session=1/traj=0"
    session.finish(trajectories=[{"chain_id": 1}], status="failed", runner_name="r")
    bridge = vob.get_bridge()
    assert bridge.force_flush(30)
    (span,) = bridge.memory_exporter.get_finished_spans()
    assert span.name == "agent_session" and span.start_time == session.start_ns
    assert {k: span.attributes[k] for k in IDENTITY_KEYS} == session.identity
    assert (span.attributes["status"], span.attributes["num_trajectories"], span.attributes["runner_name"]) == (
        "failed",
        1,
        "r",
    )


# --------------------------------------------------------------------------- register_metrics


@WITH
def test_register_metrics_registers_targets_once(
    rl_insight_hub: RlInsightHub, facade: type[RLInsightLogger], monkeypatch: pytest.MonkeyPatch, run_tag: str
) -> None:
    import rl_insight

    calls: list[tuple[Any, ...]] = []
    real = rl_insight.update_prometheus_config
    monkeypatch.setattr(
        rl_insight, "update_prometheus_config", lambda *a, **kw: calls.append((a, kw)) or real(*a, **kw)
    )
    init_with_hub(facade, run_tag)
    target = f"127.0.0.1:{stack.free_port()}"
    for _ in range(3):
        facade.register_metrics([target], job_name=f"job-{run_tag}", labels=[{"role": "rollout"}])
    assert calls == [(([target],), {"job_name": f"job-{run_tag}", "labels": [{"role": "rollout"}]})]
    # the server wrote the target into its Prometheus file_sd store
    targets = Path(rl_insight_hub.server.config()["server"]["data_dir"]) / "targets" / "prometheus-targets.yml"
    written = targets.read_text()
    assert target in written and f"job-{run_tag}" in written and "rollout" in written
    facade.finish()  # verl's finish forgets registrations...
    facade.register_metrics([target], job_name=f"job-{run_tag}", labels=[{"role": "rollout"}])
    assert len(calls) == 2  # ...so the next run registers again


@WITHOUT
def test_register_metrics_without_rl_insight_does_nothing(facade: type[RLInsightLogger]) -> None:
    facade.init("proj", "exp", verl_config())
    facade.register_metrics(["127.0.0.1:1"], job_name="j")
    facade.register_metrics(["127.0.0.1:1"], job_name="j")  # de-duplicated before the check
    assert vob.status()["counters"]["verl.register_metrics_degraded"] == 1


# --------------------------------------------------------------------------- finish


@WITH
def test_finish_flushes_and_leaves_someone_elses_rl_insight_on(
    rl_insight_hub: RlInsightHub, facade: type[RLInsightLogger], run_tag: str
) -> None:
    import rl_insight.api

    bridge = init_with_hub(
        facade,
        run_tag,
    )
    for i in range(50):
        facade.trace_span(f"f{i}", start_time_ns=T0 + i, end_time_ns=T0 + i + 1, attributes={"tag": run_tag})
    facade.finish()
    status = bridge.status()
    assert status["pending"]["queued"] == 0 and status["counters"]["exported"] == {"rl_insight": 50}
    assert balance(status["counters"]) == 0
    # the session's fixture initialised RL-Insight, not the bridge: it stays on for others
    assert rl_insight.api._STATE.enabled is True and rl_insight_compat.init_calls() == 0
    assert (
        len(rl_insight_hub.receiver.wait_for(50, ARRIVAL_S, where=lambda s: s.attributes.get("tag") == run_tag)) == 50
    )


@WITHOUT
def test_finish_without_rl_insight_flushes(facade: type[RLInsightLogger]) -> None:
    facade.init("proj", "exp", verl_config(schedule_delay_ms=600_000))  # only a flush exports
    facade.trace_span("x", start_time_ns=T0, end_time_ns=T0 + 1)
    facade.finish()
    bridge = vob.get_bridge()
    assert bridge.status()["pending"]["queued"] == 0 and len(bridge.memory_exporter.get_finished_spans()) == 1


# --------------------------------------------------------------------------- concurrency, in a fresh process


_CONCURRENT = (
    INIT_SPY_PREAMBLE
    + """
import asyncio, time
from types import SimpleNamespace
from verl_otel_bridge.verl import RLInsightLogger

address, metrics_port, tag, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5]
ray.init(address=address, runtime_env={"env_vars": json.loads(sys.argv[4])})
config = {
    "trainer": {"logger": ["console", "rl_insight"],
                "rl_insight": {"prometheus": {"metrics_report_port": metrics_port}}},
    "actor_rollout_ref": {"rollout": {"trace": {"otel_bridge": {"schedule_delay_ms": 50}}}},
}
go = threading.Event()

def thread_work(i):
    go.wait(60)
    RLInsightLogger.log({f"conc_{tag}/t{i}": float(i)}, step=1)
    now = time.time_ns()
    RLInsightLogger.trace_span(f"thread.{i}", start_time_ns=now, end_time_ns=now + 1000, attributes={"tag": tag})
    s = RLInsightLogger.agent_loop_session(sample=f"{tag}-t{i}", session=0, global_steps=1)
    s.finish(trajectories=[SimpleNamespace(chain_id=1, reward_score=1.0, num_turns=1)], status="success")

async def coroutine_work(j):
    now = time.time_ns()
    RLInsightLogger.trace_span(f"coroutine.{j}", start_time_ns=now, end_time_ns=now + 1000, attributes={"tag": tag})
    s = RLInsightLogger.agent_loop_session(sample=f"{tag}-c{j}", session=0, global_steps=1)
    await asyncio.sleep(0)
    RLInsightLogger.log({f"conc_{tag}/c{j}": float(j)}, step=1)
    s.finish(trajectories=[], status="success")

async def coroutines():
    await asyncio.get_running_loop().run_in_executor(None, go.wait, 60)
    await asyncio.gather(*(coroutine_work(j) for j in range(100)))

threads = [threading.Thread(target=thread_work, args=(i,), name=f"w{i}") for i in range(32)]
threads.append(threading.Thread(target=asyncio.run, args=(coroutines(),), name="loop"))
for t in threads: t.start()
if mode == "after_init":  # the trainer: init, then everything at once
    RLInsightLogger.init(f"proj-{tag}", f"exp-{tag}", config)
# mode "first_use": a worker configured by its environment only; its first calls race to initialise
go.set()
for t in threads: t.join(120)
vob.force_flush(60)
status = vob.status()
from rl_insight.client.ray_monitor_client import _current_job_actor_name
hub = ray.get_actor(_current_job_actor_name(), namespace="rl-insight-monitor")
report({"calls": calls, "warnings": caught, "status": status, "alive": [t.name for t in threads if t.is_alive()],
        "hub": ray.get(hub.get_status.remote(), timeout=60),
        "init_calls": rl_insight_compat.init_calls(), "labels": rl_insight.api._STATE.labels})
wait_release()
RLInsightLogger.finish()
after_finish = {"enabled": rl_insight.api._STATE.enabled, "init_calls": rl_insight_compat.init_calls()}
RLInsightLogger.init(f"proj-{tag}", f"exp2-{tag}", config)  # a later run in the same process
report({"after_finish": after_finish, "calls": len(calls), "warnings": caught,
        "labels": rl_insight.api._STATE.labels, "reason": vob.status()["reason"]})
"""
)


@WITH
@pytest.mark.parametrize("mode", ["after_init", "first_use"])
def test_32_threads_and_100_coroutines_initialise_rl_insight_exactly_once(
    rl_insight_hub: RlInsightHub, run_tag: str, mode: str
) -> None:
    """``after_init``: verl's trainer (``init``, then everyone); ``first_use``: a worker that never calls
    ``init`` (configured by ``VERL_OTEL_BRIDGE_*``), whose first calls from 33 threads race to initialise."""
    metrics_port = stack.free_port()
    args = [rl_insight_hub.ray.gcs_address, str(metrics_port), run_tag, json.dumps(dict(rl_insight_hub.ray.env)), mode]
    env = {RLInsightLogger.ENABLE_ENV: "1"}
    if mode == "first_use":
        env.update(
            {
                "VERL_OTEL_BRIDGE_PROJECT": f"proj-{run_tag}",
                "VERL_OTEL_BRIDGE_EXPERIMENT_NAME": f"exp-{run_tag}",
                "VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG": json.dumps({"prometheus": {"metrics_report_port": metrics_port}}),
                "VERL_OTEL_BRIDGE_SCHEDULE_DELAY_MS": "50",
            }
        )
    with PythonChild(_CONCURRENT, args=args, env=env) as child:
        result = child.result(timeout_s=180)
        mine = lambda s: s.attributes.get("tag") == run_tag or str(s.attributes.get("sample", "")).startswith(run_tag)  # noqa: E731
        received = rl_insight_hub.receiver.wait_for(2 * (32 + 100), ARRIVAL_S, where=mine)
        prefix = f"rl_insight_monitor_conc_{run_tag}_"
        gauges = [f"{prefix}t{i}" for i in range(32)] + [f"{prefix}c{j}" for j in range(100)]
        text = metrics_when(
            lambda: stack.fetch_metrics(metrics_port),
            lambda t: all(count_metric(t, g) for g in gauges),
            f"log() gauges of the child's hub (child reported {result})",
        )
        done = child.finish(timeout_s=120)
        later = child.results()[1]
    assert done.returncode == 0, done.stderr[-3000:]
    assert result["alive"] == []
    assert len(result["calls"]) == 1, result["calls"]
    kwargs = result["calls"][0]["kwargs"]
    assert (kwargs["project"], kwargs["experiment_name"]) == (f"proj-{run_tag}", f"exp-{run_tag}")
    assert kwargs["config"]["prometheus"] == {"metrics_report_port": metrics_port}
    assert result["init_calls"] == 1 and result["labels"] == {
        "project": f"proj-{run_tag}",
        "experiment_name": f"exp-{run_tag}",
    }
    assert not [w for w in result["warnings"] if "more than once" in w]
    counters = result["status"]["counters"]
    assert result["status"]["reason"] == "ok" and balance(counters) == 0 and counters["ended"] == 264
    assert counters["dropped"] == counters["failed"] == counters["fallback"] == 0
    assert counters["session_gauges_published"] == 132

    assert len(received) == 264
    names = sorted(s.name for s in received)
    assert names == sorted(
        [f"thread.{i}" for i in range(32)] + [f"coroutine.{j}" for j in range(100)] + ["agent_session"] * 132
    )
    sessions = [s for s in received if s.name == "agent_session"]
    assert len({s.attributes["sample"] for s in sessions}) == 132
    assert {s.attributes["project"] for s in sessions} == {f"proj-{run_tag}"}
    for i in range(32):
        assert [v for _, v in count_metric(text, f"{prefix}t{i}")] == [float(i)]
    for j in range(100):
        assert [v for _, v in count_metric(text, f"{prefix}c{j}")] == [float(j)]

    assert later["after_finish"] == {"enabled": False, "init_calls": 0}  # finish() undid the bridge's own init
    assert later["calls"] == 2 and later["reason"] == "ok"  # so the next run initialised again...
    assert later["labels"] == {"project": f"proj-{run_tag}", "experiment_name": f"exp2-{run_tag}"}
    assert not [w for w in later["warnings"] if "more than once" in w]  # ...without RL-Insight's complaint
