"""Publishing sessions' dashboard gauges on a thread of their own.

Each finished session publishes five or more gauges through RL-Insight's Python
API, one Ray call each: about 5 ms per session measured on 2 cores, mostly
spent waiting. Done on the export thread, that wait held up every span batch
behind it and capped delivery at about 10,000 spans/s for sessions of 50 spans.
On their own thread the gauges wait in parallel with span delivery; they have
no ordering relation to the spans (Prometheus gauges, joined by labels).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from verl_otel_bridge._internal.accounting import SESSION_GAUGES_DROPPED, SESSION_GAUGES_FAILED, SpanCounts
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.signals import ThreadsRefused, start_thread

logger = logging.getLogger(__name__)

#: Sessions whose gauges may wait at once; more are dropped (counted, logged once).
DEFAULT_MAX_PENDING = 10_000

Item = TypeVar("Item")

_STOP = object()


class GaugePublisher(Generic[Item]):
    """Calls ``publish(item)`` for each submitted item, in order, on one daemon thread.

    ``submit`` never blocks: when ``max_pending`` items wait, or after
    :meth:`shutdown`, the item is dropped and counted as ``session_gauges_dropped``.
    ``publish`` handles its own errors; one that escapes is counted as
    ``session_gauges_failed`` and does not stop the thread.

    Args:
        publish: publishes one session's gauges.
        counts: where drops and escaped errors are counted.
        max_pending: how many items may wait.
    """

    def __init__(self, publish: Callable[[Item], None], counts: SpanCounts, max_pending: int = DEFAULT_MAX_PENDING):
        self._publish = publish
        self._counts = counts
        self._max_pending = max_pending
        self._once = OnceLogger(logger)
        self._reset()
        reinit_after_fork(self._reset)

    def _reset(self) -> None:
        self._queue: queue.Queue[object] = queue.Queue(self._max_pending)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    def submit(self, item: Item) -> None:
        """Queue ``item`` for publishing (starting the thread on first use)."""
        if self._closed:
            self._dropped("the exporter is shut down")
            return
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    try:
                        self._thread = start_thread(self._run, "verl-otel-bridge-gauges")
                    except ThreadsRefused:
                        self._dropped("the interpreter is exiting")
                        return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._dropped(f"{self._max_pending} sessions are already waiting")

    def flush(self, timeout_s: float) -> bool:
        """Wait until every item submitted so far is published; False on timeout."""
        done = self._queue.all_tasks_done
        with done:
            return done.wait_for(lambda: not self._queue.unfinished_tasks, timeout_s)

    def shutdown(self) -> None:
        """Stop taking items and let the thread end; items still waiting are dropped, not published."""
        self._closed = True
        with contextlib.suppress(queue.Full):  # if full, the thread drops what waits and ends when it is empty
            self._queue.put_nowait(_STOP)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._closed:
                    self._dropped("the exporter is shut down")
                    if self._queue.empty():
                        return
                else:
                    self._publish(item)  # type: ignore[arg-type]  # only submit() puts anything else
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any bug in publish
                self._counts.add(SESSION_GAUGES_FAILED)
                self._once.log(f"escaped:{type(exc).__name__}", logging.WARNING, "publishing gauges raised %r", exc)
            finally:
                self._queue.task_done()

    def _dropped(self, why: str) -> None:
        self._counts.add(SESSION_GAUGES_DROPPED)
        self._once.log(f"dropped:{why}", logging.WARNING, "a session's dashboard gauges were dropped: %s", why)
