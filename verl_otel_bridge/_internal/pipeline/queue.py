"""A bounded queue between span-ending code and the export chain, drained by one thread.

The caller only estimates the span's size, adds it to a byte count under a lock held
for that one addition, and appends to a deque; all exporter work (I/O, Ray calls)
happens on the worker thread, so the caller's cost does not depend on the backend's
speed. When the queue is full (``max_bytes``, or ``max_size`` spans when set) the
*new* span is refused and the caller spills or drops it: the queue never blocks and
never grows past its bounds.

Bounds are in bytes: a cheap estimate of a span's size (:func:`span_size`) that
follows what CPython keeps for an ended span (measured with ``tracemalloc``): about
3 KB for a bridge span with the identity and a few small attributes, plus what each
attribute value holds. A sequence item counts as an int object and its pointer (40
bytes) or as a string of its length (57 + length), since items of a token-id list are
distinct objects; shared values (the identity's, small ints) are counted as if they
were not, so the estimate errs high.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import HotCounter
from verl_otel_bridge._internal.attributes import attributes_dict, span_attributes, span_events
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.pipeline.handover import HANDED, Ticket, append_on, remove_on
from verl_otel_bridge._internal.signals import start_thread

logger = logging.getLogger(__name__)

#: A span, its context, status, resource reference and attribute container.
SPAN_BYTES = 1_500
#: An event and its attribute container.
EVENT_BYTES = 400
#: One attribute's dict slot and key, before its value.
ATTRIBUTE_BYTES = 100
#: One scalar value (int, float, bool: a 32-byte pymalloc block) with its pointer.
SCALAR_BYTES = 40
#: A str object's header.
STR_BYTES = 57
#: A tuple's header.
TUPLE_BYTES = 56
#: Estimated bytes of one batch at most (exported, spilled or drained), whatever the
#: span count, so encoding a batch of spans with large attributes stays bounded too.
MAX_BATCH_BYTES = 8 * 1024 * 1024

T = TypeVar("T")


def span_size(span: ReadableSpan) -> int:
    """The estimated bytes ``span`` holds in memory (attributes and events included)."""
    size = SPAN_BYTES + values_size(span_attributes(span).values())
    events = span_events(span)
    if events:
        for event in events:
            size += EVENT_BYTES + attributes_size(event.attributes)
    return size


def attributes_size(attributes: Mapping[str, Any] | None) -> int:
    """The estimated bytes of ``attributes``' values and keys."""
    return values_size(attributes_dict(attributes).values()) if attributes else 0


def values_size(values: Iterable[Any]) -> int:
    """The estimated bytes of attribute ``values`` with their keys and dict slots."""
    size = 0
    for value in values:
        cls = value.__class__
        if cls is str:
            size += ATTRIBUTE_BYTES + STR_BYTES + len(value)
        elif cls is tuple:
            if value and value[0].__class__ is str:
                size += ATTRIBUTE_BYTES + TUPLE_BYTES + sum(STR_BYTES + 8 + len(item) for item in value)
            else:
                size += ATTRIBUTE_BYTES + TUPLE_BYTES + SCALAR_BYTES * len(value)
        else:
            size += ATTRIBUTE_BYTES + SCALAR_BYTES
    return size


def take_batch(items: collections.deque[tuple[T, int]], max_count: int) -> list[tuple[T, int]]:
    """Pop ``(item, size)`` pairs from the left: at most ``max_count``, and past :data:`MAX_BATCH_BYTES`
    only the first (a span larger than a batch goes alone)."""
    taken: list[tuple[T, int]] = []
    size = 0
    while items and len(taken) < max_count and size < MAX_BATCH_BYTES:
        item = items.popleft()
        taken.append(item)
        size += item[1]
    return taken


class ByteBudget:
    """At most ``limit`` bytes taken at once; ``take`` and ``give`` hold a lock for one addition."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        """Take ``size`` bytes; False (nothing taken) when that would pass the limit."""
        with self._lock:
            if self.used + size > self.limit:
                return False
            self.used += size
            return True

    def give(self, size: int) -> None:
        """Return ``size`` bytes taken before."""
        with self._lock:
            self.used -= size


ExportBatch = Callable[[list[ReadableSpan]], object]


class Wakeup:
    """``threading.Event``'s ``set``, ``is_set``, ``wait`` and ``clear``, for one waiting thread, where ``set``
    is one call into C (``SimpleQueue.put``).

    ``Event.set`` enters a ``Condition`` in Python: an exception raised into it right after
    the lock's acquire, before the ``with`` block holds it, leaves the lock held for good,
    and the thread waiting on the event hangs at its next wait.
    """

    def __init__(self) -> None:
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._set = False

    def set(self) -> None:
        """Wake the waiting thread (also if it is not waiting yet: its next wait returns at once)."""
        self._tokens.put(None)  # first: interrupted before the flag, a later set() only adds a token
        self._set = True

    def is_set(self) -> bool:
        """Whether :meth:`set` was called since the last :meth:`clear`."""
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set, at most ``timeout`` seconds (None: no bound); whether it was set."""
        try:
            self._tokens.get(timeout=timeout)
        except queue.Empty:
            return self._set
        return True

    def clear(self) -> None:
        """Forget every :meth:`set` so far."""
        self._set = False
        try:
            while True:
                self._tokens.get_nowait()
        except queue.Empty:
            pass


class ExportQueue:
    """Batches spans to ``export`` (called on a daemon worker thread, must not raise).

    Args:
        export: takes each batch.
        max_bytes: estimated bytes held at most (:func:`span_size`).
        max_spans: spans held at most, or None: bounded by ``max_bytes`` only.
        batch_size: spans per ``export`` call at most.
        delay_s: longest a span waits before the worker wakes up (0: at once).
        on_late_batch: ``on_late_batch(n)`` is called if a batch of ``n`` spans that
            :meth:`shutdown` reported as abandoned is exported after all (so it can be uncounted).
        thread_name: the worker thread's name.
    """

    def __init__(
        self,
        export: ExportBatch,
        *,
        max_bytes: int,
        max_spans: int | None,
        batch_size: int,
        delay_s: float,
        on_late_batch: Callable[[int], None] | None = None,
        thread_name: str = "verl-otel-bridge-export",
    ) -> None:
        self._export = export
        self._thread_name = thread_name
        self._on_late_batch = on_late_batch
        self._max_size = max_spans
        self._max_bytes = max_bytes
        self._batch_size = batch_size
        self._delay_s = delay_s
        self._start()
        reinit_after_fork(self._start)

    def _start(self) -> None:
        # Also the after-fork hook: the child starts empty, so spans the parent
        # had queued are exported once, by the parent.
        self._cond = threading.Condition(threading.Lock())
        self._items: collections.deque[tuple[ReadableSpan, int]] = collections.deque()
        self._budget = ByteBudget(self._max_bytes)
        self._enqueued = HotCounter()
        self._settled = 0
        self._taken = 0
        self._in_flight = 0
        self._abandoned_in_flight = 0
        self._stopping = False
        self._wake = Wakeup()  # its set() is safe in span-end code
        self._worker = start_thread(self._run, self._thread_name)

    def put(self, span: ReadableSpan, size: int, ticket: Ticket | None = None) -> bool:
        """Queue ``span`` of estimated ``size`` bytes (:func:`span_size`);
        False (nothing queued) when full or shut down.

        Only the byte count takes a lock: ``deque.append`` and the counter are
        atomic, and a race on the length check can overfill ``max_size`` by at
        most one span per thread. The append, the count and the ``ticket``'s mark
        happen in one call (:mod:`~verl_otel_bridge._internal.pipeline.handover`).
        """
        items = self._items
        if self._stopping or (self._max_size is not None and len(items) >= self._max_size):
            return False
        if not self._budget.take(size):
            return False
        item = (span, size)
        append_on(ticket if ticket is not None else [], items, item, self._enqueued.steps)
        if self._stopping:  # shutdown began meanwhile: take the span back unless it was already taken
            try:
                remove_on(ticket if ticket is not None else [HANDED], items, item)
            except ValueError:
                return True
            self._budget.give(size)
            return False
        if (len(items) >= self._batch_size or not self._delay_s) and not self._wake.is_set():
            self._wake.set()  # a zero delay means: export at once
        return True

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """Estimated bytes of the spans queued now."""
        return self._budget.used

    def force_flush(self, timeout_s: float) -> bool:
        """Wait until every span queued before the call was exported; False on timeout."""
        return self._wait_for(lambda: self._settled, timeout_s)

    def wait_taken(self, timeout_s: float) -> bool:
        """Wait until the worker has taken every span queued before the call (it may still be exporting
        them); False on timeout."""
        return self._wait_for(lambda: self._taken, timeout_s)

    def _wait_for(self, reached: Callable[[], int], timeout_s: float) -> bool:
        """Wake the worker and wait until ``reached()`` (read under the lock) counts every span queued now."""
        with self._cond:
            target = self._enqueued.read()
        self._wake.set()
        with self._cond:
            return (
                self._cond.wait_for(lambda: reached() >= target or not self._worker.is_alive(), timeout_s)
                and reached() >= target
            )

    @property
    def running(self) -> bool:
        """Whether the worker thread is still running (after :meth:`shutdown`: it did not finish in time)."""
        return self._worker.is_alive()

    def shutdown(self, timeout_s: float, *, late: tuple[float, Callable[[], object]] | None = None) -> int:
        """Export what is queued, stop the worker; returns spans abandoned on timeout.

        Abandoned means still queued, or in the batch the exporter has not returned
        from (should a hung exporter return later, ``on_late_batch`` says so).
        With ``late=(margin_s, call)``, ``call()`` is made if the worker is still
        running ``margin_s`` before the end of ``timeout_s`` (in the caller's thread).
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._stopping = True
        self._wake.set()
        if late is not None:
            margin_s, call = late
            self._worker.join(max(0.0, timeout_s - margin_s))
            if self._worker.is_alive():
                call()
        self._worker.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            # Also spans a lock-free put() appended after the worker's last look.
            self._abandoned_in_flight = self._in_flight if self._worker.is_alive() else 0
            abandoned = len(self._items) + self._abandoned_in_flight
            self._budget.give(sum(size for _span, size in self._items))
            self._items.clear()
        if abandoned and self._worker.is_alive():
            logger.warning(
                "export did not finish within %.1f s; %d queued spans abandoned (the exporter may be hung)",
                timeout_s,
                abandoned,
            )
        return abandoned

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay_s or None)  # zero: sleep until woken, never spin
            self._wake.clear()
            while True:
                with self._cond:
                    if not self._items:
                        stopping = self._stopping
                        break
                    taken = take_batch(self._items, self._batch_size)
                    self._in_flight = len(taken)
                    self._taken += len(taken)
                    self._cond.notify_all()
                self._budget.give(sum(size for _span, size in taken))
                batch = [span for span, _size in taken]
                try:
                    self._export(batch)
                except Exception:
                    logger.exception("exporting a batch of %d spans raised", len(batch))
                with self._cond:
                    self._settled += len(batch)
                    self._in_flight = 0
                    late, self._abandoned_in_flight = self._abandoned_in_flight, 0
                    self._cond.notify_all()
                if late and self._on_late_batch is not None:
                    self._on_late_batch(late)
            if stopping:
                return
