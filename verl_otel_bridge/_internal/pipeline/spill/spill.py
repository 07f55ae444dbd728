"""Writing spans to the spill, counting those that do not fit, and the spill's flush, shutdown and status."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import DROPPED, SPILL_WRITTEN, SPILLED, SpanCounts
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.logs import Reminder
from verl_otel_bridge._internal.pipeline.handover import Ticket, mark_handed
from verl_otel_bridge._internal.pipeline.queue import ExportQueue
from verl_otel_bridge._internal.pipeline.spill.drain import DrainThread, DrainTo
from verl_otel_bridge._internal.pipeline.spill.segments import SegmentStore
from verl_otel_bridge._internal.pipeline.spill.settings import FROM_QUEUE, SpillSettings
from verl_otel_bridge._internal.records import RecordLines, redact
from verl_otel_bridge._internal.signals import ThreadsRefused

logger = logging.getLogger(__name__)

#: While spans are being dropped, the WARNING that says so is repeated at most this often.
DROP_WARNING_INTERVAL_S = 60.0


class Spill:
    """The spill files of one bridge, the thread that writes refused spans and the one that drains them.

    ``drains`` maps ``spilled_from`` (:data:`FROM_QUEUE`, :data:`FROM_DESTINATION`)
    to where a drained batch goes. With ``may_try``, the drain waits while it says
    no (the destination is failing and no probe is due).
    """

    def __init__(
        self,
        settings: SpillSettings,
        counts: SpanCounts,
        drains: Mapping[str, DrainTo],
        may_try: Callable[[], bool] | None = None,
    ) -> None:
        self.settings = settings
        self.counts = counts
        self._dropping = 0
        self._drop_warning = Reminder(logger, DROP_WARNING_INTERVAL_S)
        self._store = SegmentStore(settings.spill_dir, settings.spill_max_bytes)
        self._lines = RecordLines(counts)
        self._drains = drains
        self._may_try = may_try
        # Their threads start with the first span spilled: most runs never spill.
        self._buffer: ExportQueue | None = None
        self._drain: DrainThread | None = None
        #: Shut down: no thread starts any more, and a span offered now is counted dropped.
        self._closed = False
        self._new_lock()
        reinit_after_fork(self._new_lock)

    def _new_lock(self) -> None:
        self._starting = threading.Lock()

    def _buffered(self) -> ExportQueue | None:
        """The byte-bounded queue the caller appends refused spans to; its thread writes the files
        (None once the spill is shut down; raises :class:`ThreadsRefused` when the interpreter is exiting)."""
        if self._buffer is None:
            with self._starting:
                if self._buffer is None and not self._closed:
                    self._buffer = ExportQueue(
                        self._write_buffered,
                        max_bytes=self.settings.buffer_bytes,
                        max_spans=None,
                        batch_size=self.settings.max_export_batch_size,
                        delay_s=0.0,
                        thread_name="verl-otel-bridge-spill",
                    )
        return self._buffer

    def _wake_drain(self) -> None:
        """Start the thread that sends the spilled spans back, or wake it. When the interpreter is
        exiting or the spill is shut down it starts none: the spans stay in the files, for ``replay``."""
        with contextlib.suppress(ThreadsRefused):
            if self._drain is None:
                with self._starting:
                    if self._drain is None and not self._closed:
                        self._drain = DrainThread(self._store, self.counts, self._drains, self._may_try, self.settings)
            if self._drain is not None:
                self._drain.wake()

    def offer(self, span: ReadableSpan, size: int, ticket: Ticket | None = None) -> None:
        """Take a span the export queue refused (estimated ``size`` bytes), to be written on the spill
        thread; never blocks. ``ticket`` is marked when it is taken or counted dropped (see ``handover``).

        When the write buffer is full too (the disk is slower than the burst), or the spill is shut
        down (a span ending while the bridge shuts down), the span is counted dropped.
        """
        try:
            buffer = self._buffered()
        except ThreadsRefused:  # the interpreter is exiting: written in the caller
            if ticket is not None:
                mark_handed(ticket)
            self._write_buffered([span])
            return
        if buffer is None or not buffer.put(span, size, ticket):
            if ticket is not None:
                mark_handed(ticket)
            if self._closed:  # the shutdown summary reports it
                self.counts.add(DROPPED)
            else:
                self._drop(1, "the spill's write buffer is full")

    def write(self, spans: Sequence[ReadableSpan], spilled_from: str) -> bool:
        """Append ``spans`` to the spill, counted ``spilled``; those that find it full are counted ``dropped``.

        True when all of them were written.
        """
        lines = [self._lines.line(span, spilled_from=spilled_from).encode() for span in spans]
        fit = self._store.append(lines, again=self.on_drain_thread())
        if fit:
            self.counts.add(SPILLED, fit)
            self.counts.add(SPILL_WRITTEN, fit)
            self._wake_drain()
        if fit < len(lines):
            self._drop(
                len(lines) - fit,
                f"the spill is full or unwritable ({self.settings.spill_max_bytes} bytes in {self.settings.spill_dir})",
            )
            return False
        if self._dropping:
            logger.info("the spill takes spans again; %d were dropped while it could not", self._dropping)
            self._dropping = 0
        return True

    def _write_buffered(self, taken: list[ReadableSpan]) -> None:
        keys = self.settings.redact_attributes
        spans = [redact(span, keys) for span in taken] if keys else taken
        try:
            self.write(spans, FROM_QUEUE)
        except Exception:
            logger.exception("spilling %d spans raised; they are counted as dropped", len(spans))
            self._drop(len(spans), "spilling raised")

    def _drop(self, spans: int, why: str) -> None:
        self.counts.add(DROPPED, spans)
        first = not self._dropping
        self._dropping += spans
        if first and self._drop_warning.due():
            logger.warning("%s: %d spans dropped (counted as dropped; more follow until it has room)", why, spans)

    def on_drain_thread(self) -> bool:
        """Whether the caller is the drain thread (whose batches always try the destination)."""
        return self._drain is not None and self._drain.is_current()

    def wake_drain(self) -> None:
        """The destination answered: drain now if anything waits."""
        if self._drain is not None:
            self._drain.wake()

    def force_flush(self, timeout_s: float) -> bool:
        """Wait until every span offered before the call is written and no drained batch is in flight."""
        deadline = time.monotonic() + timeout_s
        written = self._buffer.force_flush(timeout_s) if self._buffer is not None else True
        if self._drain is None:
            return written
        return self._drain.wait_idle(max(0.0, deadline - time.monotonic())) and written

    def shutdown(self, timeout_s: float) -> None:
        """Write what is buffered and stop both threads within ``timeout_s``; the files stay for replay."""
        deadline = time.monotonic() + timeout_s
        with self._starting:  # a span offered from now on finds no buffer to start
            self._closed = True
        left = self._buffer.shutdown(timeout_s) if self._buffer is not None else 0
        if left:
            self._drop(left, "the bridge shut down before the spill thread wrote them")
        if self._drain is None or self._drain.stop(max(0.0, deadline - time.monotonic())):
            self._store.close()
        status = self.status()
        if status["backlog"]:
            logger.warning(
                "%d spans are left in the spill (%s); send them with: verl-otel-bridge replay FILE --to ...",
                status["backlog"],
                ", ".join(status["files"]),
            )

    def status(self) -> dict[str, Any]:
        """``file`` (the newest), ``files``, ``bytes`` on disk and ``backlog`` (spans not drained yet)."""
        files, size, backlog = self._store.status()
        return {
            "dir": self.settings.spill_dir,
            "file": files[-1] if files else None,
            "files": files,
            "bytes": size,
            "backlog": backlog,
        }
