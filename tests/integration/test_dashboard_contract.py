"""What a simulated agent loop sends satisfies RL-Insight's Agent Loop Trajectory dashboard.

The dashboard (Tempo/TraceQL for spans, Prometheus for the hierarchy gauges) finds
spans by attributes. Each query of its table is written out below as a Python
predicate over what the OTLP receiver (standing in for Tempo) decoded, and each
must select exactly the spans the loop produced, with every attribute it shows.
The gauges are read from the real hub's ``/metrics``.

The same loop code runs, unchanged, against RL-Insight 0.2.0 (and none, 0.1.0),
where the spans go to the fallback with the same attributes.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import stack
from otlp_receiver import ReceivedSpan, as_received
from stack import RlInsightHub, bridge_copy_exporter, count_metric, drain, hex_ids

import verl_otel_bridge as vob
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

SERVICE = "rl_insight_monitor"
PROJECT = "dash-proj"
STEP = 5
SAMPLES, SESSIONS = 2, 2
LANE = re.compile(r"experiment=(?P<e>[^/]+)/sample=(?P<s>[^/]+)/session=(?P<n>[^/]+)/traj=(?P<t>[^/]+)")

TURN_FIELDS = (
    "turn",
    "type",
    "tools",
    "tool_args",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "content",
    "reasoning",
)
TASK_FIELDS = ("task_name", "status", "reward", "accuracy", "finished", "error", "reward_posted")
SESSION_FIELDS = ("runner_name", "status", "num_trajectories", "reward_source", "finished")
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "turn": (int,),
    "type": (str,),
    "tools": (str,),
    "tool_args": (str,),
    "finish_reason": (str,),
    "prompt_tokens": (int,),
    "completion_tokens": (int,),
    "content": (str,),
    "reasoning": (str,),
    "task_name": (str,),
    "status": (str,),
    "reward": (float,),
    "accuracy": (float,),
    "finished": (bool,),
    "error": (str,),
    "reward_posted": (bool,),
    "runner_name": (str,),
    "num_trajectories": (int,),
    "reward_source": (str,),
}


# --------------------------------------------------------------------------- the simulated agent loop


@dataclass
class LoopRecord:
    """What the simulated loop did, to compare the dashboard's view with."""

    turns: int = 0
    tasks: int = 0
    failed_tasks: int = 0
    sessions: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (sample, session) -> trajectories


async def _session(experiment: str, sample: int, session: int, record: LoopRecord) -> None:
    with vob.session(
        experiment_name=experiment,
        sample=sample,
        session=session,
        global_steps=STEP,
        uid=f"uid-{sample}",
        session_id=f"conv-{sample}-{session}",
    ) as s:
        turn = 0
        with s.task("solve") as task:
            for round_ in range(2):
                with s.turn(turn, type="generate") as handle:
                    await asyncio.sleep(0.001)
                    calls_tool = round_ == 0
                    handle.record(
                        finish_reason="tool_calls" if calls_tool else "stop",
                        prompt_tokens=100 + turn,
                        completion_tokens=20 + turn,
                        tools=["search", "calculator"] if calls_tool else [],
                        tool_args={"query": f"s{sample}/t{turn}"} if calls_tool else {},
                        content=f"answer {sample}.{session}.{turn}",
                        reasoning="because",
                    )
                turn += 1
                record.turns += 1
                if not calls_tool:
                    break
                with s.turn(turn, type="tool") as handle:
                    await asyncio.sleep(0.001)
                    handle.record(
                        finish_reason="tool_result",
                        prompt_tokens=0,
                        completion_tokens=0,
                        tools="search",
                        tool_args={"query": f"s{sample}/t{turn}"},
                        content="42",
                        reasoning="",
                    )
                turn += 1
                record.turns += 1
            task.set_result(status="success", reward=1.0 * sample, accuracy=0.5, finished=True, reward_posted=True)
        record.tasks += 1
        if (sample, session) == (1, 1):  # a task that fails: the dashboard shows its error
            try:
                with s.task("verify"):
                    raise ValueError("verifier crashed")
            except ValueError:
                pass
            record.tasks += 1
            record.failed_tasks += 1
        trajectories: list[Any] = [SimpleNamespace(chain_id=1, reward_score=0.75, num_turns=turn)]
        if session == 1:
            trajectories.append({"chain_id": 2, "reward_score": 0.25, "num_turns": 1})
        s.finish(
            status="success", trajectories=trajectories, runner_name="sim-runner", reward_source="rule", finished=True
        )
        record.sessions[(str(sample), str(session))] = trajectories


def simulate(experiment: str) -> LoopRecord:
    """Run SAMPLES x SESSIONS concurrent sessions on the current bridge."""
    record = LoopRecord()

    async def main() -> None:
        await asyncio.gather(
            *(_session(experiment, sample, session, record) for sample in range(SAMPLES) for session in range(SESSIONS))
        )

    asyncio.run(main())
    return record


# --------------------------------------------------------------------------- the dashboard's queries


def _in_scope(span: ReceivedSpan, experiment: str) -> bool:
    """Every panel's common filter: lane id pattern, experiment, project, numeric global_steps."""
    a = span.attributes
    lane = LANE.fullmatch(str(a.get("state_lane_id", "")))
    steps = a.get("global_steps")
    return (
        lane is not None
        and lane["e"] == experiment
        and a.get("experiment_name") == experiment
        and a.get("project") == PROJECT
        and isinstance(steps, (int, float))
        and not isinstance(steps, bool)
        and steps == STEP
    )


def turn_details(
    spans: Iterable[ReceivedSpan], experiment: str, *, service: str | None = SERVICE
) -> list[ReceivedSpan]:
    """``span.turn >= 0 && resource.service.name = "rl_insight_monitor"`` (numeric ``turn``)."""
    return [
        s
        for s in spans
        if _in_scope(s, experiment)
        and type(s.attributes.get("turn")) is int
        and s.attributes["turn"] >= 0
        and (service is None or s.resource.get("service.name") == service)
    ]


def by_trace_source(spans: Iterable[ReceivedSpan], experiment: str, source: str) -> list[ReceivedSpan]:
    """``span.monitor.trace_source = "task"`` / ``"session"``."""
    return [s for s in spans if _in_scope(s, experiment) and s.attributes.get("monitor.trace_source") == source]


def check_queries(spans: list[ReceivedSpan], experiment: str, record: LoopRecord, *, service: str | None) -> None:
    """Every query of the dashboard's table selects what the loop made, with every attribute it shows."""
    mine = [s for s in spans if s.attributes.get("experiment_name") == experiment]
    for span in mine:  # identity keys present on everything the loop made
        missing = [key for key in IDENTITY_KEYS if key not in span.attributes]
        assert not missing, (span.name, missing)
        assert _in_scope(span, experiment), (span.name, {k: span.attributes[k] for k in IDENTITY_KEYS})
        lane = LANE.fullmatch(span.attributes["state_lane_id"])
        assert (lane["s"], lane["n"], lane["t"]) == tuple(span.attributes[k] for k in ("sample", "session", "traj"))
        if service is not None:
            assert span.resource.get("service.name") == service

    turns = turn_details(mine, experiment, service=service)
    assert len(turns) == record.turns and all(s.name == "agent_turn" for s in turns)
    for span in turns:  # Turn details, and Trajectory overview (turn, finish_reason)
        _assert_fields(span, TURN_FIELDS)
        assert span.attributes["type"] in ("generate", "tool")
    per_session: dict[tuple[str, str], list[int]] = {}
    for span in turns:
        per_session.setdefault((span.attributes["sample"], span.attributes["session"]), []).append(
            span.attributes["turn"]
        )
    assert {key: sorted(value) for key, value in per_session.items()} == {key: [0, 1, 2] for key in record.sessions}

    tasks = by_trace_source(mine, experiment, "task")
    assert len(tasks) == record.tasks and all(s.name == "agent_task" for s in tasks)
    failed = [s for s in tasks if s.attributes.get("status") == "error"]
    assert len(failed) == record.failed_tasks
    for span in tasks:  # Task summary
        if span in failed:
            _assert_fields(span, ("task_name", "status", "error"))
            assert span.attributes["error"] == "ValueError: verifier crashed"
        else:
            _assert_fields(span, tuple(f for f in TASK_FIELDS if f != "error"))
            assert span.attributes["status"] == "success" and span.attributes["finished"] is True

    sessions = by_trace_source(mine, experiment, "session")
    keys = sorted((s.attributes["sample"], s.attributes["session"]) for s in sessions)
    assert keys == sorted(record.sessions)  # exactly one session span per session
    for span in sessions:  # Session summary
        assert span.name == "agent_session"
        _assert_fields(span, SESSION_FIELDS)
        trajectories = record.sessions[(span.attributes["sample"], span.attributes["session"])]
        assert span.attributes["num_trajectories"] == len(trajectories)
        assert (span.attributes["status"], span.attributes["runner_name"], span.attributes["reward_source"]) == (
            "success",
            "sim-runner",
            "rule",
        )
        assert span.attributes["finished"] is True


def _assert_fields(span: ReceivedSpan, names: Iterable[str]) -> None:
    for name in names:
        assert name in span.attributes, (span.name, name, sorted(span.attributes))
        value = span.attributes[name]
        assert isinstance(value, FIELD_TYPES[name]) and not (
            isinstance(value, bool) and bool not in FIELD_TYPES[name]
        ), (
            span.name,
            name,
            value,
        )


# --------------------------------------------------------------------------- 0.3.0: at the receiver and /metrics


@pytest.mark.rl_insight("0.3.0")
@pytest.mark.parametrize("transport", ["hub", "otlp"])
def test_agent_loop_satisfies_every_dashboard_query(
    transport: str, rl_insight_hub: RlInsightHub, make_bridge: Callable[..., vob.Bridge], run_tag: str
) -> None:
    experiment = f"exp-{transport}-{run_tag}"
    bridge = make_bridge(
        exporter=["rl_insight", "memory"],
        rl_insight_transport=transport,
        rl_insight_server_url=rl_insight_hub.server.url,
        project=PROJECT,
        experiment_name=experiment,
        schedule_delay_ms=50,
    )
    record = simulate(experiment)
    assert bridge.force_flush(30)
    had = list(bridge_copy_exporter(bridge).get_finished_spans())
    receiver = rl_insight_hub.receiver
    # (with otlp, the drain span below also carries the bridge's experiment as a label, as the hub would add init's)
    mine = lambda s: s.attributes.get("experiment_name") == experiment and "drain" not in s.attributes  # noqa: E731
    receiver.wait_for(len(had), 60, where=mine)
    drain(bridge, receiver)
    received = [s for s in receiver.spans if mine(s)]
    assert len(received) == len(had)

    status = bridge.status()
    assert (status["reason"], status["rl_insight_transport"]) == ("ok", transport)
    exported_by = "rl_insight" if transport == "hub" else "rl_insight_otlp"
    assert status["counters"]["exported"] == {exported_by: len(had) + 1}  # + the drain span
    assert status["counters"]["session_gauges_published"] == len(record.sessions)

    check_queries(received, experiment, record, service=SERVICE)

    # the bridge's ids, and its real times (not export time), on every span
    arrived = {s.attributes["otel.span_id"]: s for s in received}
    assert len(arrived) == len(received)
    for span in had:
        got = arrived[hex_ids(span)["otel.span_id"]]
        assert (got.name, got.start_time_ns, got.end_time_ns) == (span.name, span.start_time, span.end_time)
        assert got.attributes["otel.parent_span_id"] == hex_ids(span)["otel.parent_span_id"]
        if transport == "otlp":  # real OTLP parent links and trace ids
            assert got.trace_id == hex_ids(span)["otel.trace_id"]
            assert got.parent_span_id == (hex_ids(span)["otel.parent_span_id"] or None)
        else:  # RL-Insight's hub re-creates every span as a root
            assert got.parent_span_id is None
    sessions = [s for s in had if s.name == "agent_session"]
    assert len(sessions) == len(record.sessions)
    for span in sessions:
        assert span.end_time - span.start_time > 1_000_000  # it spans the session's turns (>= 1 ms of sleeps)

    _check_gauges(rl_insight_hub, experiment, record, sessions)


def _check_gauges(hub: RlInsightHub, experiment: str, record: LoopRecord, sessions: list[Any]) -> None:
    prefix = "rl_insight_monitor_agent_loop_"
    step = str(STEP)
    expected: list[tuple[str, dict[str, str]]] = [
        ("run_info", {"experiment_name": experiment, "global_steps": step, "title": f"Experiment · {experiment}"})
    ]
    for sample in range(SAMPLES):
        expected.append(
            (
                "sample_info",
                {
                    "experiment_name": experiment,
                    "global_steps": step,
                    "sample": str(sample),
                    "title": f"Sample {sample}",
                },
            )
        )
    for (sample, session), trajectories in record.sessions.items():
        expected.append(
            (
                "session_info",
                {
                    "experiment_name": experiment,
                    "global_steps": step,
                    "sample": sample,
                    "session": session,
                    "sess_key": f"sample={sample}/session={session}",
                    "title": f"Session {session}",
                },
            )
        )
        for trajectory in trajectories:
            get = trajectory.get if isinstance(trajectory, dict) else lambda k, t=trajectory: getattr(t, k)
            traj = str(get("chain_id") - 1)
            expected.append(
                (
                    "traj_info",
                    {
                        "experiment_name": experiment,
                        "global_steps": step,
                        "sample": sample,
                        "session": session,
                        "traj": traj,
                        "leaf": f"sample={sample}/session={session}/traj={traj}",
                        "title": f"Trajectory #{traj} · reward {get('reward_score'):g} · {get('num_turns')} turns",
                    },
                )
            )

    def all_present() -> str | None:
        text = hub.metrics()
        missing = [(n, labels) for n, labels in expected if not count_metric(text, prefix + n, **labels)]
        return (
            text
            if not missing and count_metric(text, prefix + "last_turn_unixtime", experiment_name=experiment)
            else None
        )

    text = stack.wait_until(all_present, 30, interval_s=0.2, message=f"agent-loop gauges for {experiment} at /metrics")
    for name, labels in expected:
        (sample_,) = count_metric(text, prefix + name, **labels)
        assert sample_[1] == 1.0
    # first/last turn times: one series per (experiment, step), from a session's real start and end
    (first,) = count_metric(text, prefix + "first_turn_unixtime", experiment_name=experiment, global_steps=step)
    (last,) = count_metric(text, prefix + "last_turn_unixtime", experiment_name=experiment, global_steps=step)
    assert min(abs(first[1] - s.start_time / 1e9) for s in sessions) < 1e-6
    assert min(abs(last[1] - s.end_time / 1e9) for s in sessions) < 1e-6
    assert len(count_metric(text, prefix + "session_info", experiment_name=experiment)) == len(record.sessions)
    assert len(count_metric(text, prefix + "traj_info", experiment_name=experiment)) == sum(
        len(t) for t in record.sessions.values()
    )


# --------------------------------------------------------------------------- older releases: the fallback


@pytest.mark.rl_insight("none", "0.1.0", "0.2.0")
def test_same_agent_loop_runs_unchanged_on_the_fallback(
    make_bridge: Callable[..., vob.Bridge], run_tag: str, rl_insight_case: str
) -> None:
    experiment = f"exp-fallback-{run_tag}"
    bridge = make_bridge(rl_insight_enable=True, project=PROJECT, experiment_name=experiment, schedule_delay_ms=50)
    record = simulate(experiment)
    assert bridge.force_flush(30)
    status = bridge.status()
    expected_reason = {"none": "not_installed", "0.1.0": "import_failed", "0.2.0": "no_version"}[rl_insight_case]
    assert (status["exporter"], status["reason"]) == ("memory (fallback)", expected_reason)
    spans = list(bridge.memory_exporter.get_finished_spans())
    check_queries([as_received(s) for s in spans], experiment, record, service=None)
    assert status["counters"]["fallback"] == len(spans)
    assert "session_gauges_published" not in status["counters"]
    assert json.loads(next(s for s in spans if s.name == "agent_session").attributes["monitor.trajectories"])
