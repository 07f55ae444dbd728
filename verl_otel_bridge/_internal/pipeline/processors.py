"""Span processors: identity stamping, and accounting plus hand-off to export."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Span as OtelSpan
from opentelemetry.trace import Tracer

from verl_otel_bridge._internal.accounting import DROPPED, FAILED, SpanCounts
from verl_otel_bridge._internal.attributes import AttributeValue, set_clean_attributes, stamp_new_span
from verl_otel_bridge._internal.identity import SessionIdentity, current_identity
from verl_otel_bridge._internal.pipeline.budget import span_size
from verl_otel_bridge._internal.pipeline.handover import (
    COUNTED,
    Interrupted,
    Ticket,
    count_on,
    counted,
    handed,
    mark_handed,
)
from verl_otel_bridge._internal.pipeline.queue import ExportQueue, QueueSettings
from verl_otel_bridge._internal.pipeline.sampling import SessionSampler
from verl_otel_bridge._internal.pipeline.spill import FROM_QUEUE, Spill
from verl_otel_bridge._internal.signals import start_thread
from verl_otel_bridge._internal.suppression import suppress_instrumentation_in_this_thread

logger = logging.getLogger(__name__)


def within(deadline: float, work: Callable[[], bool], what: str) -> bool:
    """Run ``work`` on a thread of its own until ``deadline`` (``time.monotonic()``); False if it
    did not return True by then (it is left running: nothing can interrupt a blocked system call)."""
    done: list[bool] = []

    def run() -> None:
        suppress_instrumentation_in_this_thread()  # an exporter's flush may send, untraced like its exports
        try:
            done.append(bool(work()))
        except Exception:
            logger.exception("exporter %s raised", what)
            done.append(False)

    worker = start_thread(run, f"verl-otel-bridge-{what}")
    worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        logger.warning("exporter %s did not return by its deadline; abandoned (the exporter may be stuck)", what)
        return False
    return done == [True]


def _millis_left(deadline: float) -> int:
    return max(0, int((deadline - time.monotonic()) * 1000))


def stamped(span: Span, identity: SessionIdentity) -> bool:
    """Whether ``span`` was created with ``identity``'s attributes."""
    attributes = span.attributes
    return attributes is not None and attributes.get("state_lane_id") is identity.state_lane_id


_NO_ATTRIBUTES: Mapping[str, AttributeValue] = MappingProxyType({})


class _Handed(threading.local):
    """The attributes :meth:`IdentitySpanProcessor.start_span` hands to ``on_start``, per thread."""

    attributes: Mapping[str, AttributeValue] | None = None


class IdentitySpanProcessor(SpanProcessor):
    """Stamps the current session identity on every span that starts inside a session.

    Works for spans from any tracer on the provider, so plain
    ``tracer.start_as_current_span`` calls and other instrumented libraries get
    the identity too. The identity's attributes were converted once per session,
    so they are put on each span whole (:func:`set_clean_attributes`). After
    :meth:`shutdown` it stamps nothing (the SDK cannot remove a processor from a
    provider the application keeps using).
    """

    def __init__(self) -> None:
        self._active = True
        self._handed = _Handed()

    def start_span(
        self, tracer: Tracer, name: str, attributes: Mapping[str, AttributeValue] | None, start_time: int | None = None
    ) -> OtelSpan:
        """``tracer.start_span(name)`` whose span gets ``attributes`` (already clean, e.g. from
        :func:`~verl_otel_bridge._internal.attributes.clean_attributes`) and then the identity, in :meth:`on_start`.

        The SDK does not check either again. Only for a provider this processor comes
        first on: processors before it would see the span without attributes, and so
        does the sampler.
        """
        handed = self._handed
        handed.attributes = attributes if attributes is not None else _NO_ATTRIBUTES  # not None: ours
        try:
            return tracer.start_span(name, start_time=start_time)
        finally:
            handed.attributes = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        handed = self._handed
        own = handed.attributes
        if own is not None:
            handed.attributes = None
        identity = current_identity() if self._active else None
        # A span start_span handed attributes to is the bridge's own, still unseen by other code: no locks.
        if own is not None:
            if identity is not None:
                stamp_new_span(span, own, identity.attributes)
            elif own:
                stamp_new_span(span, own)
        elif identity is not None and not stamped(span, identity):
            set_clean_attributes(span, identity.attributes)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        self._active = False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class ExportSpanProcessor(SpanProcessor):
    """Counts spans and hands ended ones to ``exporter``.

    With a ``queue`` the export happens on the queue's worker thread (and a span
    the full queue refuses goes to the ``spill``, or is counted dropped without
    one); without one it happens inline, which is only right for exporters that
    do no I/O (memory, discard). With a ``sampler``, session spans are held until
    their session ends and passed on only if it is kept.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        counts: SpanCounts,
        queue: QueueSettings | None,
        spill: Spill | None = None,
        sampler: SessionSampler | None = None,
        *,
        network: bool = False,
    ) -> None:
        self.exporter = exporter
        #: Whether some destination sends over the network (see :meth:`flush_queued`).
        self.network = network
        self.counts = counts
        self.queue = ExportQueue(self.export_batch, queue, self._uncount_dropped) if queue is not None else None
        self.spill = spill if self.queue is not None else None
        if self.spill is not None:
            self.spill.drains[FROM_QUEUE] = self.export_batch
        self.sampler = sampler
        self._shut_down = False
        self._count_start = counts.incrementer("started")
        self._ended = counts.steps("ended")
        self._interrupted = Interrupted()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if not self._shut_down:  # spans of an application's provider after the bridge is gone are not ours
            self._count_start()

    def on_end(self, span: ReadableSpan) -> None:
        if self._shut_down:
            return
        ticket: Ticket = []
        try:
            count_on(ticket, self._ended)
            if self._interrupted:
                self._rescue()
            if self.sampler is None:
                self._hand_over_one(span, ticket)
            else:
                mark_handed(ticket)
                self._hand_over(self.sampler.on_end(span))
        except BaseException:  # raised into span-end code (a signal handler's): keep the span first
            self._interrupted.keep((span, ticket))
            raise

    def _rescue(self) -> None:
        """Hand over, once, the spans whose hand-over an exception interrupted (see ``handover``)."""
        taken: list[tuple[ReadableSpan, Ticket]] = []
        try:
            while self._interrupted.take(taken):
                span, ticket = taken[-1]
                if not counted(ticket):
                    count_on(ticket, self._ended)
                if not handed(ticket):
                    self._hand_over_one(span, ticket)
                taken.pop()
        except BaseException:
            self._interrupted.put_back(taken)
            raise

    def _hand_over(self, spans: list[ReadableSpan]) -> None:
        """Hand over spans counted ``ended`` before (released by the sampler)."""
        for span in spans:
            self._hand_over_one(span, [COUNTED])

    def _hand_over_one(self, span: ReadableSpan, ticket: Ticket) -> None:
        if self.queue is None:
            mark_handed(ticket)
            self.export_batch([span])
            return
        size = span_size(span)  # once: the spill takes what the queue refuses at the same size
        if self.queue.put(span, size, ticket):
            return
        if self.spill is not None:
            self.spill.offer(span, size, ticket)
        else:
            mark_handed(ticket)
            self.counts.add(DROPPED)

    def _uncount_dropped(self, spans: int) -> None:
        # A batch counted as dropped at shutdown was exported (and counted) after all.
        self.counts.add(DROPPED, -spans)

    def export_batch(self, spans: Sequence[ReadableSpan]) -> None:
        """Export ``spans``; exporters in the bridge count their own outcome."""
        try:
            self.exporter.export(spans)
        except Exception:
            self.counts.add(FAILED, len(spans))
            logger.exception("exporter %s raised; %d spans lost", type(self.exporter).__name__, len(spans))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        self._rescue()
        if self.sampler is not None:
            self._hand_over(self.sampler.release_all())
        flushed = self.queue.force_flush(timeout_millis / 1000) if self.queue is not None else True
        if self.spill is not None:
            flushed = self.spill.force_flush(_millis_left(deadline) / 1000) and flushed
        return flushed and within(deadline, lambda: self.exporter.force_flush(_millis_left(deadline)), "flush")

    def flush_queued(self, timeout_s: float, *, wait_for_network: bool = True) -> bool:
        """Wait (at most ``timeout_s``) until the spans queued so far were exported; False on timeout.

        Unlike :meth:`force_flush`, held sessions stay held, the spill is not drained and the
        exporter's own flush is not called: only what the export thread has in hand is waited for.
        With ``wait_for_network`` False and a destination that sends over the network, until the
        export thread has taken them (handed over, not yet sent).
        """
        if self.queue is None:
            return True
        if self.network and not wait_for_network:
            return self.queue.wait_taken(timeout_s)
        return self.queue.force_flush(timeout_s)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Flush what is queued and shut the exporter down, all within ``timeout_s``.

        An exporter stuck past the deadline (a write blocked in the kernel, a hung
        server) is abandoned on its own thread, so shutdown and interpreter exit stay
        bounded. Idempotent: ``TracerProvider.shutdown()`` calls it again (with the
        30 s default) after ``Bridge.shutdown`` did, and a hung exporter must not be
        waited for twice.
        """
        if self._shut_down:
            return
        self._rescue()
        if self.sampler is not None:
            self._hand_over(self.sampler.release_all())
        self._shut_down = True
        deadline = time.monotonic() + timeout_s
        if self.queue is not None:
            self.counts.add(DROPPED, self.queue.shutdown(timeout_s))
        if self.spill is not None:
            self.spill.shutdown(_millis_left(deadline) / 1000)

        def finish() -> bool:
            # What the exporter still does in the background (RL-Insight's gauges) gets the time left.
            self.exporter.force_flush(_millis_left(deadline))
            self.exporter.shutdown()
            return True

        within(deadline, finish, "shutdown")


class BridgeSpanProcessors(SpanProcessor):
    """The bridge's processors as one on the provider: identity stamping, ``inflight``, then export.

    The SDK calls every processor it holds at each span start, end and ending in a
    loop of its own; as one processor, a span costs one such call per event and the
    processors that do nothing there (identity at the end, every ``_on_ending``) are
    not called at all.
    """

    def __init__(self, identity: IdentitySpanProcessor, inflight: SpanProcessor, export: ExportSpanProcessor) -> None:
        self.identity = identity
        self.inflight = inflight
        self.export = export

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.identity.on_start(span, parent_context)
        self.inflight.on_start(span, parent_context)
        self.export.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.inflight.on_end(span)
        self.export.on_end(span)

    def shutdown(self) -> None:
        for processor in (self.identity, self.inflight, self.export):
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        return all(
            [processor.force_flush(_millis_left(deadline)) for processor in (self.identity, self.inflight, self.export)]
        )
