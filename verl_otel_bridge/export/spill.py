"""The spill: spans that cannot wait in memory, or that the destination refused, wait in local files.

Files are JSON Lines of :mod:`verl_otel_bridge.records` (plus ``spilled_from``), one
set per process in ``spill_dir`` (``spill-<host>-<pid>-<n>.jsonl``), each at most a
quarter of ``spill_max_bytes``, together at most ``spill_max_bytes``. Two threads
serve them: one writes spans the export queue refused (the caller only appends them
to a byte-bounded buffer), one drains the oldest file in the background whenever the
destination answers, deleting each file once it is read. Spans refused by the
destination are written by the export thread itself, after the sender gave up.

Accounting: a span written is counted ``spilled`` (and ``spill_written``); when the
drain reads it back, it leaves ``spilled`` (counted ``spill_drained``) and is counted
wherever the exporters put it (``exported``, ``fallback``, ``failed``, or ``spilled``
again if the destination refused it again).
A span that finds the spill full (or unwritable) is ``dropped``.

The bridge never sends a span twice: a span is spilled only after the destination
refused it, and the drain reads each line once. Delivery from the files is
at-least-once: a file the drain had begun stays whole on disk until read to its end,
so replaying it (``verl-otel-bridge replay``) after the process died may resend
spans the drain had already delivered.
"""

from __future__ import annotations

import collections
import io
import itertools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from verl_otel_bridge.accounting import HotCounter, SpanCounts
from verl_otel_bridge.config import BridgeConfig, default_spill_dir
from verl_otel_bridge.export.budget import MAX_BATCH_BYTES, ByteBudget, span_size, take_batch
from verl_otel_bridge.exporters.base import WrappingSpanExporter, left_out_reader
from verl_otel_bridge.exporters.redacting import redact
from verl_otel_bridge.forks import reinit_after_fork
from verl_otel_bridge.logs import OnceLogger, Reminder
from verl_otel_bridge.records import iter_lines, record_to_span, span_to_record
from verl_otel_bridge.suppression import suppress_instrumentation_in_this_thread

logger = logging.getLogger(__name__)

#: Spilled by the export queue (never exported): drained through the whole exporter chain.
FROM_QUEUE = "queue"
#: Refused by the destination (copies and redaction already done): drained straight back to it.
FROM_DESTINATION = "destination"

Drain = Callable[[list[ReadableSpan]], object]

_SEGMENT_NUMBERS = itertools.count()

#: The spill's write buffer holds a quarter of ``max_queue_bytes``, and at least this much.
MIN_BUFFER_BYTES = 16 * 1024 * 1024
#: While spans are being dropped, the WARNING that says so is repeated at most this often.
DROP_WARNING_INTERVAL_S = 60.0


@dataclass(frozen=True)
class SpillSettings:
    """Where and how much to spill.

    Attributes:
        directory: the spill files' directory.
        max_bytes: the files' total size at most (> 0).
        buffer_bytes: estimated bytes of refused spans waiting to be written at most.
        batch_size: spans per drained batch.
        after_s: the destination counts as down once it refused every batch this long.
        probe_s: while it is down, one batch is tried this often.
        redact_keys: attribute keys replaced by ``[REDACTED]`` before a queue span is written.
    """

    directory: str
    max_bytes: int
    buffer_bytes: int
    batch_size: int
    after_s: float
    probe_s: float
    redact_keys: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, config: BridgeConfig) -> SpillSettings | None:
        """The settings ``config`` asks for, or None when spilling is off (``spill_max_bytes=0``)."""
        if not config.spill_max_bytes:
            return None
        return cls(
            directory=config.spill_dir or default_spill_dir(),
            max_bytes=config.spill_max_bytes,
            buffer_bytes=max(config.max_queue_bytes // 4, MIN_BUFFER_BYTES),
            batch_size=config.max_export_batch_size,
            after_s=config.spill_after_s,
            probe_s=config.spill_probe_s,
            redact_keys=frozenset(config.redact_attributes),
        )


class Health:
    """Whether the destination answers: up, failing (since when), or down (failing longer than ``after_s``)."""

    def __init__(self, after_s: float, probe_s: float) -> None:
        self._after_s = after_s
        self._probe_s = probe_s
        self._failing_since: float | None = None
        self._last_try = 0.0

    @property
    def up(self) -> bool:
        """The last batch tried was accepted."""
        return self._failing_since is None

    def should_try(self) -> bool:
        """Whether the export thread sends a batch: unless the destination is down (then only the drain tries)."""
        since = self._failing_since
        return since is None or time.monotonic() - since < self._after_s

    def retry_due(self) -> bool:
        """Whether ``probe_s`` has passed since the last batch was tried (the drain waits for it while failing)."""
        return time.monotonic() - self._last_try >= self._probe_s

    def succeeded(self) -> None:
        """The destination accepted a batch."""
        self._failing_since = None

    def failed(self) -> None:
        """The destination refused a batch."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._last_try = now


@dataclass
class _Segment:
    path: Path
    size: int = 0  # bytes written (whole lines only)
    spans: int = 0  # spans written
    read: int = 0  # bytes the drain has read


class Spill:
    """The spill files of one bridge and the two threads that write and drain them.

    ``drains`` maps ``spilled_from`` (:data:`FROM_QUEUE`, :data:`FROM_DESTINATION`)
    to where a drained batch goes; set it before the first span. With ``health``,
    the drain waits while the destination is failing (one batch per ``probe_s``).
    """

    def __init__(self, settings: SpillSettings, counts: SpanCounts, health: Health | None = None) -> None:
        self.settings = settings
        self.counts = counts
        self.health = health
        self.drains: dict[str, Drain] = {}
        self._once = OnceLogger(logger)
        self._drop_warning = Reminder(logger, DROP_WARNING_INTERVAL_S)
        self._start()
        reinit_after_fork(self._start)

    def _start(self) -> None:
        # Also the after-fork hook: the child starts with no files (the parent's stay the parent's).
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._segments: collections.deque[_Segment] = collections.deque()
        self._backlog = 0
        self._draining = 0
        self._dropping = 0
        self._buffer: collections.deque[tuple[ReadableSpan, int]] = collections.deque()
        self._budget = ByteBudget(self.settings.buffer_bytes)
        self._offered = HotCounter()
        self._count_offered = self._offered.increment
        self._written = 0
        self._stopping = False
        self._wake_writer = threading.Event()
        self._wake_drain = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="verl-otel-bridge-spill", daemon=True)
        self._drainer = threading.Thread(target=self._drain_loop, name="verl-otel-bridge-drain", daemon=True)
        self._writer.start()
        self._drainer.start()

    # -- the caller's side -------------------------------------------------------

    def offer(self, span: ReadableSpan) -> None:
        """Take a span the export queue refused, to be written on the spill thread; never blocks.

        When the write buffer is full too (the disk is slower than the burst), the span is dropped.
        """
        size = span_size(span)
        if self._stopping or not self._budget.take(size):
            self._drop(1, "the spill's write buffer is full")
            return
        self._buffer.append((span, size))
        self._count_offered()
        if not self._wake_writer.is_set():
            self._wake_writer.set()

    # -- writing -------------------------------------------------------------------

    def write(self, spans: Sequence[ReadableSpan], spilled_from: str) -> bool:
        """Append ``spans`` to the spill, counted ``spilled``; those that find it full are counted ``dropped``.

        True when all of them were written.
        """
        lines = [
            (json.dumps({**span_to_record(span), "spilled_from": spilled_from}, ensure_ascii=False) + "\n").encode()
            for span in spans
        ]
        with self._lock:
            room = self.settings.max_bytes - sum(segment.size for segment in self._segments)
            fit = 0
            for line in lines:
                room -= len(line)
                if room < 0:
                    break
                fit += 1
            if fit and not self._append(b"".join(lines[:fit]), fit):
                fit = 0
            if fit:
                self._backlog += fit
                self._changed.notify_all()
        if fit:
            self.counts.add("spilled", fit)
            self.counts.add("spill_written", fit)
            self._wake_drain.set()
        if fit < len(lines):
            self._drop(
                len(lines) - fit, f"the spill is full ({self.settings.max_bytes} bytes in {self.settings.directory})"
            )
            return False
        if self._dropping:
            logger.info("the spill takes spans again; %d were dropped while it could not", self._dropping)
            self._dropping = 0
        return True

    def _append(self, data: bytes, spans: int) -> bool:
        """Write ``data`` (that fits the cap) whole to the newest file, holding the lock; False if it cannot."""
        segment = self._segments[-1] if self._segments else None
        if segment is None or (segment.size and segment.size + len(data) > self.settings.max_bytes // 4):
            segment = self._new_segment()
            if segment is None:
                return False
        try:
            fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            self._log_write_error(segment.path, exc)
            return False
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            try:
                os.ftruncate(fd, segment.size)  # a batch is written whole or not at all
            except OSError:
                logger.warning("could not cut %s back after a failed write: it may end in a partial line", segment.path)
            self._log_write_error(segment.path, exc)
            return False
        finally:
            os.close(fd)
        segment.size += len(data)
        segment.spans += spans
        return True

    def _new_segment(self) -> _Segment | None:
        directory = Path(self.settings.directory).expanduser()
        prefix = f"spill-{socket.gethostname()}-{os.getpid()}"
        while True:
            # Numbered across the process, so two bridges never share a file; an old
            # file of the same name (a reused pid) is skipped, never appended to.
            path = directory / f"{prefix}-{next(_SEGMENT_NUMBERS)}.jsonl"
            try:
                directory.mkdir(parents=True, exist_ok=True)
                path.open("xb").close()
                break
            except FileExistsError:
                continue
            except OSError as exc:
                self._log_write_error(path, exc)
                return None
        segment = _Segment(path)
        self._segments.append(segment)
        return segment

    def _log_write_error(self, path: Path, exc: OSError) -> None:
        self._once.log(f"write:{exc.errno}", logging.WARNING, "writing the spill file %s failed: %s", path, exc)

    def _drop(self, spans: int, why: str) -> None:
        self.counts.add("dropped", spans)
        first = not self._dropping
        self._dropping += spans
        if first and self._drop_warning.due():
            logger.warning("%s: %d spans dropped (counted as dropped; more follow until it has room)", why, spans)

    def _write_loop(self) -> None:
        suppress_instrumentation_in_this_thread()
        keys = self.settings.redact_keys
        while True:
            self._wake_writer.wait()
            self._wake_writer.clear()
            while self._buffer:
                taken = take_batch(self._buffer, self.settings.batch_size)
                spans = [redact(span, keys) if keys else span for span, _size in taken]
                try:
                    self.write(spans, FROM_QUEUE)
                except Exception:
                    logger.exception("spilling %d spans raised; they are counted as dropped", len(spans))
                    self._drop(len(spans), "spilling raised")
                self._budget.give(sum(size for _span, size in taken))
                with self._lock:
                    self._written += len(taken)
                    self._changed.notify_all()
            if self._stopping:
                return

    # -- draining ------------------------------------------------------------------

    def on_drain_thread(self) -> bool:
        """Whether the caller is the drain thread (whose batches always try the destination)."""
        return threading.current_thread() is self._drainer

    def wake_drain(self) -> None:
        """The destination answered: drain now if anything waits."""
        if self._backlog and not self._wake_drain.is_set():
            self._wake_drain.set()

    def _drain_loop(self) -> None:
        suppress_instrumentation_in_this_thread()
        while not self._stopping:
            health = self.health
            if not self._backlog or (health is not None and not health.up and not health.retry_due()):
                self._wake_drain.wait(self.settings.probe_s if self._backlog else None)
                self._wake_drain.clear()
                continue
            batches = self._read_batch()
            for spilled_from, spans in batches.items():
                self._send(spilled_from, spans)
            with self._lock:
                self._draining = 0
                self._changed.notify_all()

    def _read_batch(self) -> dict[str, list[ReadableSpan]]:
        """Up to ``batch_size`` spans from the oldest file, by ``spilled_from`` (unreadable lines: ``failed``)."""
        with self._lock:
            segment = self._segments[0]
            end = segment.size
            start = segment.read
        lines: list[bytes] = []
        read = 0  # bytes of JSON: a quarter of the batch bound, as spans take several times more in memory
        with segment.path.open("rb") as stream:
            stream.seek(start)
            left = end - start
            while left > 0 and len(lines) < self.settings.batch_size and read < MAX_BATCH_BYTES // 4:
                line = stream.readline(left)
                if not line:
                    break
                lines.append(line)
                left -= len(line)
                read += len(line)
        taken = len(lines)
        batches: dict[str, list[ReadableSpan]] = {}
        for _number, _size, record, problem in iter_lines(io.BytesIO(b"".join(lines))):
            if record is None:
                self._once.log("bad-line", logging.WARNING, "an unreadable line in %s: %s", segment.path, problem)
                continue
            try:
                span = record_to_span(record)
            except ValueError as exc:
                self._once.log("bad-record", logging.WARNING, "a bad record in %s: %s", segment.path, exc)
                continue
            batches.setdefault(str(record.get("spilled_from", FROM_QUEUE)), []).append(span)
        with self._lock:
            segment.read = start + read
            self._backlog -= taken
            self._draining = taken
            if segment.read >= segment.size:
                self._segments.popleft()
                segment.path.unlink(missing_ok=True)
        unreadable = taken - sum(len(spans) for spans in batches.values())
        self.counts.add("spill_drained", taken)
        with self.counts.moving("spilled", unreadable):
            self.counts.add("failed", unreadable)
        return batches

    def _send(self, spilled_from: str, spans: list[ReadableSpan]) -> None:
        """Export drained ``spans``; they leave ``spilled`` as the exporters count them."""
        drain = self.drains.get(spilled_from) or self.drains[FROM_QUEUE]
        with self.counts.moving("spilled", len(spans)):
            try:
                drain(spans)
            except Exception:
                logger.exception("draining %d spilled spans raised; they are counted as failed", len(spans))
                self.counts.add("failed", len(spans))

    # -- flush, shutdown, status ---------------------------------------------------------

    def force_flush(self, timeout_s: float) -> bool:
        """Wait until every span offered before the call is written and no drained batch is in flight."""
        with self._lock:
            target = self._offered.read()
        self._wake_writer.set()
        with self._changed:
            return self._changed.wait_for(lambda: self._written >= target and not self._draining, timeout_s)

    def shutdown(self, timeout_s: float) -> None:
        """Write what is buffered and stop both threads within ``timeout_s``; the files stay for replay."""
        deadline = time.monotonic() + timeout_s
        self._stopping = True
        self._wake_writer.set()
        self._wake_drain.set()
        self._writer.join(max(0.0, deadline - time.monotonic()))
        self._drainer.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            left = len(self._buffer)
            self._buffer.clear()
        if left:
            self._drop(left, "the bridge shut down before the spill thread wrote them")
        status = self.status()
        if status["backlog"]:
            logger.warning(
                "%d spans are left in the spill (%s); send them with: verl-otel-bridge replay FILE --to ...",
                status["backlog"],
                ", ".join(status["files"]),
            )

    def status(self) -> dict[str, Any]:
        """``file`` (the newest), ``files``, ``bytes`` on disk and ``backlog`` (spans not drained yet)."""
        with self._lock:
            files = [str(segment.path) for segment in self._segments]
            size = sum(segment.size for segment in self._segments)
            backlog = self._backlog
        return {
            "dir": self.settings.directory,
            "file": files[-1] if files else None,
            "files": files,
            "bytes": size,
            "backlog": backlog,
        }


class SpillingSpanExporter(WrappingSpanExporter):
    """The destination, counted as ``key``; a batch it refuses is spilled instead of failed.

    Once it has refused every batch for ``spill_after_s``, batches go straight to
    the spill without waiting out the sender's retries; the drain thread then tries
    one spilled batch every ``spill_probe_s``, and the first one accepted brings
    the destination back for everyone.
    Spans the destination left out of a batch it took (see
    :class:`~verl_otel_bridge.exporters.base.LeavesOut`) count as failed.
    """

    def __init__(self, inner: SpanExporter, counts: SpanCounts, key: str, spill: Spill) -> None:
        super().__init__(inner)
        self._left_out = left_out_reader(inner)
        self.counts = counts
        self.key = key
        self.spill = spill
        self.health = spill.health or Health(spill.settings.after_s, spill.settings.probe_s)
        spill.health = self.health
        spill.drains[FROM_DESTINATION] = self.send

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # While down, only the drain thread tries the destination (waiting out the
        # sender there holds up no queue); what the export thread gets, it spills.
        if self.health.should_try() or self.spill.on_drain_thread():
            return self.send(spans)
        return self._spill(spans)

    def send(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Try the destination with ``spans`` (whatever its health); spill them if it refuses."""
        try:
            result = self.inner.export(spans)
        except Exception:
            logger.exception("%s exporter raised on %d spans", self.key, len(spans))
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.health.failed()
            return self._spill(spans)
        self.health.succeeded()
        skipped = self._left_out()
        self.counts.add(self.key, len(spans) - skipped)
        self.counts.add("failed", skipped)
        self.spill.wake_drain()
        return result

    def _spill(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS if self.spill.write(spans, FROM_DESTINATION) else SpanExportResult.FAILURE
