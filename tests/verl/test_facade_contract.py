"""The facade side by side with verl 0.9.1's installed ``verl.utils.tracking.RLInsightLogger``.

Same members and signatures; then verl's own call sequence (``Tracking`` constructs
the class, logs, ``llm_server.py`` registers the rollout servers, ...) on both classes,
with verl's switch off and on, RL-Insight usable (the integration suite's real
stack: discovery server, Ray on loopback, hub) and unusable (no server URL). A spy
on the real ``rl_insight`` module records what each class asks of RL-Insight.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stack
from stack import RlInsightHub

import verl_otel_bridge as vob
from verl_otel_bridge._internal import current
from verl_otel_bridge.verl import RLInsightLogger as Facade

T0 = 1_764_000_000_123_456_789
#: What RL-Insight offers that either class may call.
SPIED = ("init", "finish", "metric_gauge", "trace_state", "trace_span", "update_prometheus_config")


def verls_class() -> type:
    from verl.utils.tracking import RLInsightLogger

    return RLInsightLogger


def _public(cls: type) -> dict[str, Any]:
    return {name: inspect.getattr_static(cls, name) for name in dir(cls) if not name.startswith("_")}


def _shape(obj: Any) -> list[tuple[str, Any, Any]]:
    """A signature without annotations: what a caller depends on."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]


def test_every_public_member_of_verls_class_with_the_same_signature() -> None:
    verl_cls = verls_class()
    theirs, ours = _public(verl_cls), _public(Facade)
    missing = sorted(set(theirs) - set(ours))
    assert missing == [], f"facade lacks {missing}"
    assert _shape(Facade) == _shape(verl_cls)  # the constructor: (project_name, experiment_name, config=None)
    for name, member in theirs.items():
        if callable(getattr(verl_cls, name)):
            assert type(ours[name]) is type(member), (name, "classmethod/staticmethod kind differs")
            assert _shape(getattr(Facade, name)) == _shape(getattr(verl_cls, name)), name
        else:
            assert getattr(Facade, name) == getattr(verl_cls, name), name


class Spy:
    """Records calls of ``rl_insight``'s functions; ``through`` decides whether the real one runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import rl_insight

        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.through: set[str] = set()
        for name in SPIED:
            real = getattr(rl_insight, name)
            monkeypatch.setattr(rl_insight, name, self._wrap(name, real))

    def _wrap(self, name: str, real: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            if name in self.through:
                return real(*args, **kwargs)
            return _NullState() if name == "trace_state" else None

        return spy

    def take(self) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        calls, self.calls = self.calls, []
        return calls


class _NullState:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    verl_cls = verls_class()
    # both classes start as a fresh process would
    for name, value in (("_init_done", False), ("_registered_metrics", set()), ("_warned_unsupported_features", set())):
        monkeypatch.setattr(verl_cls, name, value)
    monkeypatch.setattr(Facade, "_init_done", False)
    monkeypatch.setattr(Facade, "_registered_metrics", set())
    monkeypatch.setattr(Facade, "_pending_metrics", {})
    yield Spy(monkeypatch)
    vob.shutdown()


def trainer_config(tag: str) -> dict[str, Any]:
    return {"trainer": {"project_name": f"proj-{tag}", "experiment_name": f"exp-{tag}", "logger": ["rl_insight"]}}


def verls_calls(cls: type, tag: str, target: str) -> dict[str, Any]:
    """What verl 0.9.1 does with the class over a run, in order; returns what the caller got back."""
    cls(f"proj-{tag}", f"exp-{tag}", trainer_config(tag))  # Tracking
    cls.log(data={f"{tag}/actor/loss": 0.25, f"{tag}/note": "text"}, step=1)  # Tracking.log
    with cls.trace_state("generate_sequences", state_lane_id="replica_0", step=1):  # vLLM server
        pass
    cls.trace_span("gateway_generation", start_time_ns=T0, end_time_ns=T0 + 1000, attributes={"tag": tag})
    session = cls.agent_loop_session(sample=f"{tag}-s", session=1, uid="u", global_steps=2)  # Uni-Agent
    identity = dict(session.identity)
    session.finish(trajectories=[], status="success")
    for _ in range(2):  # llm_server.py, and a repeat that must be de-duplicated
        cls.register_rollout_metrics([target], "vllm", labels=[{"replica": 0}])
    cls.register_transfer_queue_metrics({"transfer_queue": {"metrics": {"enabled": False}}})
    cls.finish()
    return {"identity": identity}


def rl_insight_uses(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """Each call normalised (verl passes positionally what the facade passes by keyword)."""
    out: list[tuple[Any, ...]] = []
    for name, args, kwargs in calls:
        if name == "update_prometheus_config":
            bound = {**dict(zip(("addresses", "job_name", "labels"), args)), **kwargs}
            out.append((name, tuple(bound["addresses"]), bound.get("job_name"), repr(bound.get("labels"))))
        elif name == "metric_gauge":
            out.append((name, *args))
        elif name == "trace_state":
            out.append((name, *args, tuple(sorted(kwargs.items()))))
        else:
            out.append((name,))
    return out


def _switch_off(spy: Spy, monkeypatch: pytest.MonkeyPatch, run_tag: str) -> None:
    monkeypatch.delenv("VERL_RL_INSIGHT_ENABLE", raising=False)
    target = f"127.0.0.1:{stack.free_port()}"
    theirs = verls_calls(verls_class(), run_tag, target)
    assert spy.take() == []
    ours = verls_calls(Facade, run_tag, target)
    assert spy.take() == []
    assert ours["identity"] == theirs["identity"]  # verl's call returns RL-Insight's session object
    assert current.current_bridge() is None  # nothing made, so nothing exported anywhere


def test_switch_off_rl_insight_usable_neither_touches_it(
    rl_insight_hub: RlInsightHub, spy: Spy, monkeypatch: pytest.MonkeyPatch, run_tag: str
) -> None:
    _switch_off(spy, monkeypatch, run_tag)


def test_switch_off_rl_insight_unusable_neither_touches_it(
    spy: Spy, monkeypatch: pytest.MonkeyPatch, run_tag: str
) -> None:
    monkeypatch.delenv("RL_INSIGHT_SERVER_URL", raising=False)
    _switch_off(spy, monkeypatch, run_tag)


def test_switch_on_rl_insight_usable_same_effects(
    spy: Spy, rl_insight_hub: RlInsightHub, monkeypatch: pytest.MonkeyPatch, run_tag: str
) -> None:
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    spy.through = {"metric_gauge", "trace_state", "trace_span", "update_prometheus_config"}  # init/finish: the hub's
    target = f"127.0.0.1:{stack.free_port()}"
    theirs_tag, ours_tag = f"v{run_tag}", f"f{run_tag}"
    theirs = verls_calls(verls_class(), theirs_tag, target)
    verl_uses = rl_insight_uses(spy.take())
    ours = verls_calls(Facade, ours_tag, target)
    facade_uses = rl_insight_uses(spy.take())

    # verl: init with the run's identity, and finish; the facade finds RL-Insight on (the hub) and leaves it on
    assert verl_uses[0] == ("init",) and verl_uses[-1] == ("finish",)
    assert ("init",) not in facade_uses and ("finish",) not in facade_uses

    # the same gauges, states and registrations (one per distinct call)
    def same(uses: list[tuple[Any, ...]], tag: str) -> list[tuple[Any, ...]]:
        kept = [u for u in uses if u[0] in ("metric_gauge", "trace_state", "update_prometheus_config")]
        return [tuple(str(x).replace(tag, "TAG") for x in u) for u in kept]

    assert same(facade_uses, ours_tag) == same(verl_uses, theirs_tag)
    assert [u for u in verl_uses if u[0] == "update_prometheus_config"] == [
        ("update_prometheus_config", (target,), "vllm", "[{'replica': 0}]")
    ]
    # the span arrives in RL-Insight's trace store from both (the facade's from a background thread)
    for tag in (theirs_tag, ours_tag):
        (span,) = rl_insight_hub.receiver.wait_for(1, 60, where=lambda s, t=tag: s.attributes.get("tag") == t)
        assert (span.name, span.start_time_ns, span.end_time_ns) == ("gateway_generation", T0, T0 + 1000)
    # the identity verl's caller gets; with verl's RolloutTraceConfig empty, the facade names the run
    # (init's project and experiment) where verl gives project "" and experiment "default"
    for key in ("session", "traj", "uid", "global_steps", "session_id"):
        assert ours["identity"][key] == theirs["identity"][key], key
    assert (theirs["identity"]["project"], theirs["identity"]["experiment_name"]) == ("", "default")
    assert (ours["identity"]["project"], ours["identity"]["experiment_name"]) == (f"proj-{ours_tag}", f"exp-{ours_tag}")
    targets = Path(rl_insight_hub.server.config()["server"]["data_dir"]) / "targets" / "prometheus-targets.yml"
    assert target in targets.read_text()


def test_switch_on_rl_insight_unusable(spy: Spy, monkeypatch: pytest.MonkeyPatch, run_tag: str) -> None:
    """No server URL: verl still calls into RL-Insight (which switches itself off, silently); the facade does
    not, keeps the spans in its fallback and counts each degraded call."""
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    monkeypatch.delenv("RL_INSIGHT_SERVER_URL", raising=False)
    target = f"127.0.0.1:{stack.free_port()}"
    verls_calls(verls_class(), run_tag, target)
    assert {u[0] for u in rl_insight_uses(spy.take())} == set(SPIED)
    Facade.init("p", "e", trainer_config(run_tag))
    bridge = vob.get_bridge()
    Facade.log({"a": 1.0}, step=1)
    with Facade.trace_state("generate_sequences", state_lane_id="replica_0"):
        pass
    Facade.trace_span("gateway_generation", start_time_ns=T0, end_time_ns=T0 + 1000)
    Facade.register_rollout_metrics([target], "vllm")
    assert spy.take() == []
    status = bridge.status()
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", "no_server_url")
    counters = status["counters"]
    assert {k: counters[k] for k in counters if k.startswith("verl.")} == {
        "verl.log_degraded": 1,
        "verl.metrics_skipped": 1,
        "verl.trace_state_degraded": 1,
        "verl.register_metrics_degraded": 1,
    }
    assert bridge.force_flush(30)
    assert sorted(s.name for s in bridge.memory_exporter.get_finished_spans()) == [
        "gateway_generation",
        "generate_sequences",
    ]


def test_a_registration_made_while_unusable_is_made_once_rl_insight_is_usable(
    spy: Spy, rl_insight_hub: RlInsightHub, monkeypatch: pytest.MonkeyPatch, run_tag: str
) -> None:
    monkeypatch.setenv("VERL_RL_INSIGHT_ENABLE", "1")
    spy.through = {"update_prometheus_config", "metric_gauge"}
    url = rl_insight_hub.server.url
    monkeypatch.delenv("RL_INSIGHT_SERVER_URL")
    target = f"127.0.0.1:{stack.free_port()}"
    Facade.init("p", "e", trainer_config(run_tag))
    Facade.register_rollout_metrics([target], f"job-{run_tag}", labels=[{"replica": 0}])
    assert spy.take() == []
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", url)  # the server is reachable now
    Facade.log({f"{run_tag}/x": 1.0}, step=1)  # any later call finds RL-Insight usable
    uses = rl_insight_uses(spy.take())
    assert ("update_prometheus_config", (target,), f"job-{run_tag}", "[{'replica': 0}]") in uses
    Facade.register_rollout_metrics([target], f"job-{run_tag}", labels=[{"replica": 0}])
    assert spy.take() == []  # made once
    targets = Path(rl_insight_hub.server.config()["server"]["data_dir"]) / "targets" / "prometheus-targets.yml"
    stack.wait_until(lambda: target in targets.read_text(), 30, interval_s=0.2, message="target never written")
