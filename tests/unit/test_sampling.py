"""Whole-session sampling: groups kept or dropped whole, at about the rate, the same in every process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.pipeline.sampling import group_sampled

from .helpers import assert_balanced, finished

GROUPS = 300
ROLLOUTS = 4


def _run_step(bridge: Bridge, step: int = 1, fail_every: int = 7) -> dict[str, list[str]]:
    """GROUPS prompts of ROLLOUTS sessions (a task and two turns each); every ``fail_every``-th session fails.

    Returns the status of each session by uid.
    """
    statuses: dict[str, list[str]] = defaultdict(list)
    index = 0
    for group in range(GROUPS):
        uid = f"prompt-{group}"
        for rollout in range(ROLLOUTS):
            index += 1
            status = "error" if index % fail_every == 0 else "success"
            with bridge.session(sample=str(group), session=str(rollout), uid=uid, global_steps=step) as session:
                with session.task("solve") as task:
                    for turn in range(2):
                        with session.turn(turn):
                            pass
                    task.set_result(reward=rollout + group / GROUPS)  # distinct rewards
                session.finish(status=status)
            statuses[uid].append(status)
    return statuses


def _sessions_by_uid(bridge: Bridge) -> dict[str, list[tuple[str, int]]]:
    """``uid -> [(span name, session number)]`` of every exported span."""
    found: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for span in finished(bridge):
        attributes = span.attributes or {}
        found[str(attributes["uid"])].append((span.name, int(str(attributes["session"]))))
    return found


def test_sampling_keeps_whole_groups_at_about_the_rate_and_every_failure(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory", memory_max_spans=100_000, session_sample_rate=0.25)
    statuses = _run_step(bridge)
    counters = assert_balanced(bridge)
    exported = _sessions_by_uid(bridge)

    sampled = {uid for uid in statuses if group_sampled(uid, 0.25)}
    assert 0.18 < len(sampled) / GROUPS < 0.32
    for uid, outcomes in statuses.items():
        kept_sessions = {number for name, number in exported.get(uid, []) if name == "agent_session"}
        if uid in sampled:
            assert kept_sessions == set(range(ROLLOUTS)), uid  # the whole group
        else:
            assert kept_sessions == {n for n, status in enumerate(outcomes) if status == "error"}, uid
        for number in kept_sessions:  # a kept session keeps all its spans: session, task, two turns
            assert sorted(name for name, n in exported[uid] if n == number) == sorted(
                ["agent_session", "agent_task", "agent_turn", "agent_turn"]
            )
    spans_per_session = 4
    kept = sum(len(spans) for spans in exported.values())
    assert counters["sampled_out"] == GROUPS * ROLLOUTS * spans_per_session - kept > 0
    assert counters["exported"] == {"memory": kept}


def test_rate_one_holds_nothing_and_spans_outside_sessions_pass_at_once(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory", session_sample_rate=0.5)
    with bridge.span("outside"):
        pass
    assert [span.name for span in finished(bridge)] == ["outside"]  # not held: exported before any flush
    assert make_bridge(exporter="memory").pipeline.sampler is None  # type: ignore[union-attr]


def test_an_open_session_is_released_kept_at_a_flush_and_its_later_spans_follow(
    make_bridge: Callable[..., Bridge],
) -> None:
    bridge = make_bridge(exporter="memory", session_sample_rate=0.0)
    with bridge.session(sample="0", session="0", uid="never-sampled", global_steps=1) as session:
        with session.task("solve"):
            pass
        assert bridge.force_flush(5)
        assert [span.name for span in finished(bridge)] == ["agent_task"]  # unfinished: kept
        with session.task("again"):
            pass
    assert sorted(span.name for span in finished(bridge)) == ["agent_session", "agent_task", "agent_task"]
    counters = assert_balanced(bridge)
    assert counters["sampled_out"] == 0 and counters["sampling_released"] == 1


def test_the_held_spans_stay_within_their_byte_bound(make_bridge: Callable[..., Bridge]) -> None:
    bridge = make_bridge(exporter="memory", session_sample_rate=0.0, session_hold_max_bytes=50_000)
    with bridge.session(sample="0", session="0", uid="u", global_steps=1) as session:
        for i in range(100):
            with session.task("t", payload="p" * 1000, i=i):
                pass
        sampler = bridge.pipeline.sampler  # type: ignore[union-attr]
        assert sampler is not None and sampler.held * 1_000 <= 50_000
        assert len(finished(bridge)) >= 50  # pushed out, kept
    assert_balanced(bridge)


def test_slowest_and_reward_extreme_rules_keep_sessions_the_rate_would_drop(
    make_bridge: Callable[..., Bridge],
) -> None:
    bridge = make_bridge(
        exporter="memory", memory_max_spans=100_000, session_sample_rate=0.0, session_keep_reward_extremes=0.1
    )
    _run_step(bridge, fail_every=10**9)
    kept = [dict(s.attributes or {}) for s in finished(bridge) if s.name == "agent_session"]
    rewards = sorted(int(str(a["session"])) + int(str(a["sample"])) / GROUPS for a in kept)
    everyone = GROUPS * ROLLOUTS
    # Decided online, so more than a tenth at each end; but mostly the extremes.
    assert 0.2 * everyone <= len(rewards) <= 0.4 * everyone
    extremes = [r for r in rewards if r < 0.5 or r > ROLLOUTS - 1.5]
    assert len(extremes) >= 0.8 * len(rewards)
    assert_balanced(bridge)

    slow = make_bridge(exporter="memory", session_sample_rate=0.0, session_keep_slowest=0.5)
    for i in range(20):
        with slow.session(sample=str(i), session="0", uid=f"u{i}", global_steps=1) as session:
            with session.task("t", i=i):
                pass
    assert 0 < len([s for s in finished(slow) if s.name == "agent_session"]) < 20


DECISIONS = """
import json, sys
from verl_otel_bridge._internal.pipeline.sampling import group_sampled
print(json.dumps([uid for uid in json.loads(sys.argv[1]) if group_sampled(uid, 0.25)]))
"""


def test_every_process_keeps_the_same_groups() -> None:
    uids = [f"prompt-{i}" for i in range(GROUPS)]
    here = [uid for uid in uids if group_sampled(uid, 0.25)]
    for seed in ("0", "12345"):  # str hashing differs between these processes; the decision must not
        done = subprocess.run(
            [sys.executable, "-c", DECISIONS, json.dumps(uids)],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PYTHONHASHSEED": seed},
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == here
