"""Ray actors continue the driver's trace and session identity, and lose no spans when they end.

Each process writes its own JSONL file (the actors are configured only by
``runtime_env`` variables, plus their pid in the file name); the test merges
them. The actors' background export is set to wait ``NEVER_MS``, so every span
found on disk got there through an explicit flush or an exit-time shutdown,
which is what these tests are about.

Uses the session's loopback Ray (``ray_local`` in ``conftest.py``), which is
shut down at the end of the session also when a test fails.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray is imported (conftest also sets it)

if os.environ.get("RL_INSIGHT_TEST_CASE", "").strip() == "0.3.0":
    try:  # rl-insight 0.3.0 depends on ray: missing here means a broken environment, so fail
        import ray
    except ImportError as exc:
        raise ImportError(
            f"the rl-insight 0.3.0 test environment must have ray (a dependency of rl-insight): {exc}"
        ) from exc
else:
    ray = pytest.importorskip("ray")

import stack

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.identity import IDENTITY_KEYS
from verl_otel_bridge._internal.tree import render_tree
from verl_otel_bridge.propagation import attach, flush_actors, inject

# Actor classes are defined here; ship them by value, workers cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Names the directory the actors write ``actor-<pid>.jsonl`` into.
SPAN_DIR_ENV = "PROPAGATION_TEST_SPAN_DIR"  # not VERL_OTEL_BRIDGE_*: the bridge rejects unknown keys
#: The actors' background export would wait this long: only flushes and exit-time shutdowns export.
NEVER_MS = "600000"
#: Bound of every wait on Ray.
RAY_TIMEOUT_S = 45.0
N_ACTORS = 4
N_TURNS = 2


def actor_env(span_dir: Path, **extra: str) -> dict[str, str]:
    """``runtime_env`` variables that make an actor's bridge write JSONL, with no code in the actor."""
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "VERL_OTEL_BRIDGE_EXPORTER": "jsonl",
        "VERL_OTEL_BRIDGE_SCHEDULE_DELAY_MS": NEVER_MS,
        "VERL_RL_INSIGHT_ENABLE": "0",
        SPAN_DIR_ENV: str(span_dir),
        **extra,
    }


@ray.remote(num_cpus=0)
class AgentWorker:
    """An agent-loop worker that never calls ``configure()``."""

    def __init__(self) -> None:
        span_dir = os.environ.get(SPAN_DIR_ENV)
        if span_dir and "VERL_OTEL_BRIDGE_JSONL_PATH" not in os.environ:  # one file per process
            os.environ["VERL_OTEL_BRIDGE_JSONL_PATH"] = f"{span_dir}/actor-{os.getpid()}.jsonl"

    def run(self, carrier: dict[str, str], turns: int, worker: int, flush: bool = True) -> dict[str, Any]:
        with attach(carrier, flush=flush):
            with vob.span("agent_loop", worker=worker):
                for turn in range(turns):
                    with vob.turn(turn) as handle:
                        handle.record(prompt_tokens=10 + turn, completion_tokens=5)
        return {"pid": os.getpid(), "status": vob.status()}

    def leave(self) -> None:
        ray.actor.exit_actor()


def read_records(span_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every JSONL file in ``span_dir``: file name -> records."""
    return {
        path.name: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for path in sorted(span_dir.glob("*.jsonl"))
    }


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def wait_gone(pids: set[int]) -> None:
    """Wait (bounded) until these processes have exited, so whatever they wrote at exit is on disk."""
    stack.wait_until(
        lambda: all(process_gone(pid) for pid in pids),
        RAY_TIMEOUT_S,
        message=lambda: f"actor processes still running: {sorted(p for p in pids if not process_gone(p))}",
    )


def kill_and_wait(actors: list[Any], pids: set[int]) -> None:
    """``ray.kill`` every actor (an immediate end: no atexit) and wait until their processes are gone."""
    for actor in actors:
        ray.kill(actor)
    wait_gone(pids)


@pytest.fixture
def span_dir(tmp_path: Path) -> Path:
    directory = tmp_path / f"spans-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    return directory


@pytest.fixture
def driver_bridge(span_dir: Path) -> Iterator[Bridge]:
    """The driver's bridge: JSONL into ``span_dir``, current for the test, restored after."""
    bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="jsonl", jsonl_path=str(span_dir / "driver.jsonl")))
    previous = vob.set_bridge(bridge)
    try:
        yield bridge
    finally:
        vob.set_bridge(previous)
        bridge.shutdown()


@pytest.fixture
def make_actors(ray_local: Any, span_dir: Path) -> Iterator[Any]:
    """``make_actors(n)``: ``AgentWorker`` actors configured through ``runtime_env`` only; killed afterwards."""
    made: list[Any] = []

    def make(count: int) -> list[Any]:
        new = [AgentWorker.options(runtime_env={"env_vars": actor_env(span_dir)}).remote() for _ in range(count)]
        made.extend(new)
        return new

    try:
        yield make
    finally:
        for actor in made:
            ray.kill(actor)


def test_driver_session_fans_out_to_actors_as_one_trace(
    make_actors: Any, driver_bridge: Bridge, span_dir: Path
) -> None:
    actors = make_actors(N_ACTORS)
    with vob.session(sample=7, session=1, global_steps=3, uid="uid-7", project="p", experiment_name="e") as session:
        with vob.span("fan_out") as fan_out:
            carrier = inject()
            results = ray.get(
                [actor.run.remote(carrier, N_TURNS, worker) for worker, actor in enumerate(actors)],
                timeout=RAY_TIMEOUT_S,
            )
    pids = {result["pid"] for result in results}
    # Hard-kill the actors before reading anything: attach(flush=True) already exported their spans.
    kill_and_wait(actors, pids)
    driver_bridge.force_flush(10)

    assert len(pids) == N_ACTORS and os.getpid() not in pids
    for result in results:  # configured from runtime_env alone
        assert result["status"]["exporter"] == "jsonl", result["status"]
    files = read_records(span_dir)
    assert set(files) == {"driver.jsonl"} | {f"actor-{pid}.jsonl" for pid in pids}

    driver = {r["name"]: r for r in files["driver.jsonl"]}
    assert set(driver) == {"agent_session", "fan_out"}
    trace_id = format(fan_out.get_span_context().trace_id, "032x")
    fan_out_id = format(fan_out.get_span_context().span_id, "016x")
    identity = session.identity.to_dict()
    assert driver["fan_out"]["parent_span_id"] == driver["agent_session"]["span_id"]

    workers_seen = set()
    for pid in pids:
        records = files[f"actor-{pid}.jsonl"]
        assert sorted(r["name"] for r in records) == ["agent_loop"] + ["agent_turn"] * N_TURNS, records
        loop = next(r for r in records if r["name"] == "agent_loop")
        workers_seen.add(loop["attributes"]["worker"])
        assert loop["parent_span_id"] == fan_out_id
        for record in records:
            assert record["trace_id"] == trace_id
            assert {key: record["attributes"].get(key) for key in IDENTITY_KEYS} == identity
            if record["name"] == "agent_turn":
                assert record["parent_span_id"] == loop["span_id"]
    assert workers_seen == set(range(N_ACTORS))

    merged = [record for records in files.values() for record in records]
    tree = render_tree(merged)
    print(f"\nmerged span tree ({len(files)} processes):\n{tree}")
    lines = tree.splitlines()
    assert len(lines) == 2 + N_ACTORS * (1 + N_TURNS)
    assert lines[0].startswith("agent_session ")  # the only root: one tree across processes
    assert lines[1].startswith("  fan_out ")
    assert [line for line in lines if not line.startswith("  ")] == [lines[0]]
    assert sum(line.startswith("    agent_loop ") for line in lines) == N_ACTORS
    assert sum(line.startswith("      agent_turn ") for line in lines) == N_ACTORS * N_TURNS
    for index, line in enumerate(lines):
        if line.startswith("    agent_loop "):
            assert all(
                following.startswith("      agent_turn ") for following in lines[index + 1 : index + 1 + N_TURNS]
            )
            assert "sample=7 session=1 traj=0 global_steps=3 uid=uid-7" in line


def test_flush_actors_before_a_hard_end_keeps_spans(make_actors: Any, driver_bridge: Bridge, span_dir: Path) -> None:
    """Without attach(flush=True), spans wait in the actors' queues; flush_actors() saves them."""
    actors = make_actors(2)
    kept, lost = actors[:1], actors[1:]
    with vob.session(sample=8, session=0):
        carrier = inject()
    results = ray.get([actor.run.remote(carrier, 1, i, False) for i, actor in enumerate(actors)], timeout=RAY_TIMEOUT_S)
    assert flush_actors(kept, timeout_s=RAY_TIMEOUT_S) == [True]
    kill_and_wait(actors, {result["pid"] for result in results})  # no atexit, no shutdown
    by_worker: dict[int, int] = {}
    for records in read_records(span_dir).values():
        for record in records:
            if record["name"] == "agent_loop":
                by_worker[record["attributes"]["worker"]] = by_worker.get(record["attributes"]["worker"], 0) + 1
    assert by_worker == {0: 1}, f"expected the flushed worker 0 only (worker 1 was killed unflushed): {by_worker}"
    assert flush_actors(lost, timeout_s=5) == [False]  # dead actors are reported, not raised


def test_exit_actor_runs_the_bridges_atexit_shutdown(ray_local: Any, span_dir: Path) -> None:
    """A normal actor exit (ray.actor.exit_actor) runs atexit: queued spans are exported then."""
    path = span_dir / "leaving.jsonl"
    actor = AgentWorker.options(
        runtime_env={"env_vars": actor_env(span_dir, VERL_OTEL_BRIDGE_JSONL_PATH=str(path))}
    ).remote()
    try:
        pid = ray.get(actor.run.remote({}, 1, 0, False), timeout=RAY_TIMEOUT_S)["pid"]
        assert not path.exists() or path.read_text() == ""  # still queued
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.leave.remote(), timeout=RAY_TIMEOUT_S)
        wait_gone({pid})
    finally:
        ray.kill(actor)
    names = sorted(json.loads(line)["name"] for line in path.read_text().splitlines())
    assert names == ["agent_loop", "agent_turn"]
