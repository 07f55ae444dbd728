"""The drain: a thread that sends the oldest spill file back whenever the destination answers.

It survives any state of the files (:mod:`.segments` reads only what it wrote,
through descriptors it kept, and reports what it could not read back), and
any exception of the exporters it feeds: a span it cannot send or read back
leaves ``spilled`` as ``failed``. It waits, never spins: for spans to be written,
and while the destination is failing, for the next probe.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Mapping

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import FAILED, SPILL_DRAINED, SPILLED, SpanCounts
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.pipeline.queue import MAX_BATCH_BYTES
from verl_otel_bridge._internal.pipeline.spill.segments import SegmentStore, Taken
from verl_otel_bridge._internal.pipeline.spill.settings import FROM_QUEUE, SpillSettings
from verl_otel_bridge._internal.records import iter_lines, record_to_span
from verl_otel_bridge._internal.signals import start_thread

logger = logging.getLogger(__name__)

#: Where a drained batch goes, by its ``spilled_from``.
DrainTo = Callable[[list[ReadableSpan]], object]

#: Bytes of JSON per drained batch: a quarter of the batch bound, as spans take several times more in memory.
BATCH_JSON_BYTES = MAX_BATCH_BYTES // 4


class DrainThread:
    """Drains ``store`` to ``drains[spilled_from]`` (``drains[FROM_QUEUE]`` for any other origin).

    ``may_try()`` (when given) is asked before each batch: while it says no (the
    destination is failing), the drain waits for the next probe, ``probe_s`` later.
    """

    def __init__(
        self,
        store: SegmentStore,
        counts: SpanCounts,
        drains: Mapping[str, DrainTo],
        may_try: Callable[[], bool] | None,
        settings: SpillSettings,
    ) -> None:
        self._store = store
        self._counts = counts
        self._drains = drains
        self._may_try = may_try
        self._batch_size = settings.max_export_batch_size
        self._probe_s = settings.spill_probe_s
        self._once = OnceLogger(logger)
        self._start()
        reinit_after_fork(self._start)

    def _start(self) -> None:
        self._idle = threading.Condition(threading.Lock())
        self._draining = 0
        self._stopping = False
        self._wake = threading.Event()
        self._thread = start_thread(self._run, "verl-otel-bridge-drain")

    def is_current(self) -> bool:
        """Whether the caller is the drain thread."""
        return threading.current_thread() is self._thread

    def wake(self) -> None:
        """Something was written, or the destination answered: drain now if anything waits."""
        if self._store.backlog and not self._wake.is_set():
            self._wake.set()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no drained batch is in flight; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._draining, timeout_s)

    def stop(self, timeout_s: float) -> bool:
        """Stop after the batch in flight; whether the thread ended within ``timeout_s``."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping:
            backlog = self._store.backlog
            if not backlog or (self._may_try is not None and not self._may_try()):
                self._wake.wait(self._probe_s if backlog else None)
                self._wake.clear()
                continue
            try:
                self._drain_one()
            except Exception:
                logger.exception("draining the spill raised; trying again in %.1f s", self._probe_s)
                self._wake.wait(self._probe_s)
                self._wake.clear()
            finally:
                self._store.settle()
                with self._idle:
                    self._draining = 0
                    self._idle.notify_all()

    def _drain_one(self) -> None:
        taken = self._store.take(self._batch_size, BATCH_JSON_BYTES)
        if taken is None:
            return
        with self._idle:
            self._draining = len(taken.lines)
        batches, unreadable = self._parse(taken)
        if taken.why is not None:
            self._once.log(
                "lost", logging.WARNING, "spill file %s: %s; %d spans lost there", taken.path, taken.why, taken.lost
            )
        self._counts.add(SPILL_DRAINED, len(taken.lines))
        with self._counts.moving(SPILLED, unreadable + taken.lost):
            self._counts.add(FAILED, unreadable + taken.lost)
        for spilled_from, spans in batches.items():
            self._send(spilled_from, spans)

    def _parse(self, taken: Taken) -> tuple[dict[str, list[ReadableSpan]], int]:
        """The spans of ``taken`` by ``spilled_from``, and how many of its lines could not be read as spans."""
        batches: dict[str, list[ReadableSpan]] = {}
        good = 0
        for _number, _size, record, problem in iter_lines(io.BytesIO(b"".join(taken.lines))):
            if record is None:
                self._once.log("bad-line", logging.WARNING, "an unreadable line in %s: %s", taken.path, problem)
                continue
            try:
                span = record_to_span(record)
            except ValueError as exc:
                self._once.log("bad-record", logging.WARNING, "a bad record in %s: %s", taken.path, exc)
                continue
            good += 1
            origin = record.get("spilled_from")
            batches.setdefault(origin if isinstance(origin, str) else FROM_QUEUE, []).append(span)
        return batches, len(taken.lines) - good

    def _send(self, spilled_from: str, spans: list[ReadableSpan]) -> None:
        """Export drained ``spans``; they leave ``spilled`` as the exporters count them."""
        with self._counts.moving(SPILLED, len(spans)):
            try:
                (self._drains.get(spilled_from) or self._drains[FROM_QUEUE])(spans)
            except Exception:
                logger.exception("draining %d spilled spans raised; they are counted as failed", len(spans))
                self._counts.add(FAILED, len(spans))
