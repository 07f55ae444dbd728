"""A bounded queue between span-ending code and exporters, drained by one thread.

The caller only estimates the span's size, adds it to a byte count under a lock held
for that one addition, and appends to a deque; all exporter work (I/O, Ray calls)
happens on the worker thread, so the caller's cost does not depend on the backend's
speed. When the queue is full (``max_bytes``, or ``max_size`` spans when set) the
*new* span is refused and the caller spills or drops it: the queue never blocks and
never grows past its bounds.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import HotCounter
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.pipeline.budget import ByteBudget, take_batch
from verl_otel_bridge._internal.pipeline.handover import HANDED, Ticket, Wakeup, append_on, remove_on
from verl_otel_bridge._internal.signals import start_thread
from verl_otel_bridge._internal.suppression import suppress_instrumentation_in_this_thread

logger = logging.getLogger(__name__)

ExportBatch = Callable[[list[ReadableSpan]], None]


@dataclass(frozen=True)
class QueueSettings:
    """Bounds of an :class:`ExportQueue`.

    Attributes:
        max_size: spans held at most, or None: bounded by ``max_bytes`` only.
        batch_size: spans per export call at most.
        delay_s: longest a span waits before the worker wakes up.
        max_bytes: estimated bytes held at most (:func:`~verl_otel_bridge._internal.pipeline.budget.span_size`).
    """

    max_size: int | None
    batch_size: int
    delay_s: float
    max_bytes: int


class ExportQueue:
    """Batches spans to ``export`` (called on a daemon worker thread, must not raise)."""

    def __init__(
        self,
        export: ExportBatch,
        settings: QueueSettings,
        on_late_batch: Callable[[int], None] | None = None,
        *,
        thread_name: str = "verl-otel-bridge-export",
    ) -> None:
        """``on_late_batch(n)`` is called if a batch of ``n`` spans that :meth:`shutdown`
        reported as abandoned is exported after all (so it can be uncounted)."""
        self._export = export
        self._thread_name = thread_name
        self._on_late_batch = on_late_batch
        self._max_size = settings.max_size
        self._max_bytes = settings.max_bytes
        self._batch_size = settings.batch_size
        self._delay_s = settings.delay_s
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
        self._wake = Wakeup()  # its set() is safe in span-end code (see handover)
        self._worker = start_thread(self._run, self._thread_name)

    def put(self, span: ReadableSpan, size: int, ticket: Ticket | None = None) -> bool:
        """Queue ``span`` of estimated ``size`` bytes (:func:`~verl_otel_bridge._internal.pipeline.budget.span_size`);
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

    def shutdown(self, timeout_s: float) -> int:
        """Export what is queued, stop the worker; returns spans abandoned on timeout.

        Abandoned means still queued, or in the batch the exporter has not returned
        from (should a hung exporter return later, ``on_late_batch`` says so).
        """
        with self._cond:
            self._stopping = True
        self._wake.set()
        self._worker.join(timeout_s)
        with self._cond:
            # Also spans a lock-free put() appended after the worker's last look.
            self._abandoned_in_flight = self._in_flight if self._worker.is_alive() else 0
            abandoned = len(self._items) + self._abandoned_in_flight
            self._budget.give(sum(size for _span, size in self._items))
            self._items.clear()
        if not abandoned or not self._worker.is_alive():
            return abandoned
        logger.warning(
            "export did not finish within %.1f s; %d queued spans abandoned (the exporter may be hung)",
            timeout_s,
            abandoned,
        )
        return abandoned

    def _run(self) -> None:
        suppress_instrumentation_in_this_thread()  # exporters' own requests make no spans
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
