"""After fork, a child owns nothing of its parent's: connections, threads, locks and spill files are its own.

Both ways a training job forks: ``os.fork`` and multiprocessing's ``fork`` start method.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from otlp_receiver import OtlpReceiver

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.pipeline.spill import FROM_QUEUE

from .helpers import WAIT_S, StartReceiver, forks_on_purpose
from .test_spill_files import Held, span

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork"), forks_on_purpose]

CHILDREN = 3
ROUNDS = 5
PER_ROUND = 20


def _spans(prefix: str, rounds: int = ROUNDS) -> bool:
    for r in range(rounds):
        for n in range(PER_ROUND):
            with vob.span(prefix, n=r * PER_ROUND + n):
                pass
        if not vob.force_flush(WAIT_S):
            return False
    return True


def _child_exit_code() -> int:
    counters = vob.status()["counters"]
    return 0 if counters["exported"].get("otlp") == ROUNDS * PER_ROUND and counters["failed"] == 0 else 2


def _reap(pid: int) -> int:
    deadline = time.monotonic() + WAIT_S * 2
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -999


def _check(sink: OtlpReceiver, parent: Bridge, names: dict[str, int]) -> None:
    counters = parent.status()["counters"]
    assert counters["exported"] == {"otlp": names["parent"]} and counters["failed"] == 0, counters
    assert sink.decode_errors == []  # every request decodes: none was interleaved with another
    assert all(r.status == 200 for r in sink.requests)
    assert Counter(span.name for span in sink.spans) == names


def _parent_with_an_open_connection(sink: OtlpReceiver, make_bridge: Callable[..., Bridge]) -> Bridge:
    """The current bridge, sending to ``sink``, its keep-alive connection open (a first round sent)."""
    parent = make_bridge(exporter="otlp", otlp_endpoint=sink.url, schedule_delay_ms=5)
    vob.set_bridge(parent)
    assert _spans("parent", rounds=1)
    return parent


def test_os_fork_children_send_on_connections_of_their_own(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge]
) -> None:
    sink = start_receiver()
    parent = _parent_with_an_open_connection(sink, make_bridge)
    pids = []
    for c in range(CHILDREN):
        pid = os.fork()
        if pid == 0:  # the child: whatever happens, it ends here
            code = 3
            try:
                code = _child_exit_code() if _spans(f"child-{c}") else 4
            finally:
                os._exit(code)
        pids.append(pid)
    assert _spans("parent", rounds=ROUNDS - 1)  # meanwhile, on its own connection
    assert [_reap(pid) for pid in pids] == [0] * CHILDREN
    _check(sink, parent, {"parent": ROUNDS * PER_ROUND, **{f"child-{c}": ROUNDS * PER_ROUND for c in range(CHILDREN)}})
    assert sink.connections >= 1 + CHILDREN


def _mp_child(c: int) -> None:
    if not _spans(f"mp-{c}"):
        raise SystemExit(4)
    raise SystemExit(_child_exit_code())


def test_multiprocessing_fork_children_send_on_connections_of_their_own(
    start_receiver: StartReceiver, make_bridge: Callable[..., Bridge]
) -> None:
    sink = start_receiver()
    parent = _parent_with_an_open_connection(sink, make_bridge)
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=_mp_child, args=(c,)) for c in range(CHILDREN)]
    for child in children:
        child.start()
    assert _spans("parent", rounds=ROUNDS - 1)
    for child in children:
        child.join(WAIT_S * 2)
        if child.is_alive():
            child.kill()
            child.join()
    assert [child.exitcode for child in children] == [0] * CHILDREN
    _check(sink, parent, {"parent": ROUNDS * PER_ROUND, **{f"mp-{c}": ROUNDS * PER_ROUND for c in range(CHILDREN)}})


def test_a_child_never_writes_into_its_parents_spill_files(tmp_path: Path) -> None:
    held = Held(tmp_path / "spill")
    try:
        (parents,) = held.write(5)
        size = parents.stat().st_size
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                held.spill.write([span(n) for n in range(100, 105)], FROM_QUEUE)
                files = held.spill.status()["files"]
                code = 0 if len(files) == 1 and files[0] != str(parents) else 2
            finally:
                os._exit(code)
        assert _reap(pid) == 0
        assert parents.stat().st_size == size and held.spill.status()["files"] == [str(parents)]
        held.release()
        counters = held.drained()
        assert counters["failed"] == 0 and sorted(held.received) == list(range(5))
    finally:
        held.spill.shutdown(5.0)
