"""Work on threads of its own, started together and joined with a bound: for every suite and the benchmarks.

Import it as ``threads`` with ``tests/`` on ``sys.path`` (the suites' conftest files and the benchmarks put it
there). Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

#: Bound on a whole run; never reached when things work.
WAIT_S = 60.0


def run_threads(targets: Iterable[Callable[[], object]], timeout_s: float = WAIT_S) -> list[BaseException]:
    """Run each target on a thread of its own, all started before any is joined; wait (``timeout_s`` in
    all) for every one to end, and return what they raised. A thread still running then fails the caller."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - returned to the caller
            errors.append(exc)

    workers = [threading.Thread(target=guarded, args=(target,), daemon=True) for target in targets]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    assert not any(worker.is_alive() for worker in workers), f"a thread did not finish within {timeout_s:g} s"
    return errors


def burst(bridge: Any, spans: int, threads: int, timeout_s: float = WAIT_S, **attributes: Any) -> int:
    """End ``spans`` spans named ``burst`` from ``threads`` threads released together (each span with a
    unique ``n`` from 0, and ``attributes``); bounded, raising what a thread raised. Returns the spans made
    (``spans`` rounded down to a multiple of ``threads``)."""
    start = threading.Barrier(threads, timeout=timeout_s)
    per_thread = spans // threads

    def work(thread: int) -> None:
        start.wait()
        for i in range(per_thread):
            with bridge.span("burst", n=thread * per_thread + i, **attributes):
                pass

    errors = run_threads([lambda t=t: work(t) for t in range(threads)], timeout_s)
    if errors:
        raise errors[0]
    return per_thread * threads
