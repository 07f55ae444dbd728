"""Span processors: identity stamping, and accounting plus hand-off to export."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import Span as OtelSpan
from opentelemetry.trace import Tracer, get_current_span

from verl_otel_bridge._internal.accounting import DROPPED, SpanCounts
from verl_otel_bridge._internal.attributes import AttributeValue, has_attribute, set_clean_attributes, stamp_new_span
from verl_otel_bridge._internal.identity import SessionIdentity, current_identity
from verl_otel_bridge._internal.pipeline.chain import ExportChain, seconds_left
from verl_otel_bridge._internal.pipeline.handover import (
    COUNTED,
    Interrupted,
    Ticket,
    count_on,
    counted,
    handed,
    mark_handed,
)
from verl_otel_bridge._internal.pipeline.queue import ExportQueue, span_size
from verl_otel_bridge._internal.pipeline.sampling import SessionSampler
from verl_otel_bridge._internal.protocol import STATE_LANE_ID

logger = logging.getLogger(__name__)

#: At shutdown, a primary that stopped answering is closed this long (at most a quarter of the
#: timeout) before the deadline, so what it still holds is spilled before the process exits.
GIVE_UP_MARGIN_S = 1.0


def stamped(span: Span, identity: SessionIdentity) -> bool:
    """Whether ``span`` was created with ``identity``'s attributes."""
    attributes = span.attributes
    return attributes is not None and attributes.get("state_lane_id") is identity.state_lane_id


def _check_parent(span: Span, parent_context: Context | None, lost: Callable[[str], None]) -> None:
    """Call ``lost`` if ``span``, started outside any session, has a parent span that is in one.

    The context that carried the parent there (a thread handed OpenTelemetry's context
    only) left the session identity behind.
    """
    if not has_attribute(span, STATE_LANE_ID) and has_attribute(get_current_span(parent_context), STATE_LANE_ID):
        lost(span.name)  # (a span given its identity explicitly, as progress records are, is not lost)


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

    def __init__(self, on_lost_identity: Callable[[str], None] | None = None) -> None:
        self._active = True
        self._handed = _Handed()
        self._on_lost_identity = on_lost_identity

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
        lost = self._on_lost_identity
        if identity is None and span.parent is not None and lost is not None and self._active:
            _check_parent(span, parent_context, lost)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        self._active = False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class ExportSpanProcessor(SpanProcessor):
    """Counts spans and hands ended ones to the export ``chain``.

    With a ``queue`` the export happens on the queue's worker thread (and a span
    the full queue refuses goes to the chain's spill, or is counted dropped without
    one); without one it happens inline, which is only right for destinations that
    do no I/O (memory, none). With a ``sampler``, session spans are held until
    their session ends and passed on only if it is kept.
    """

    def __init__(
        self,
        chain: ExportChain,
        counts: SpanCounts,
        queue: ExportQueue | None,
        sampler: SessionSampler | None = None,
        *,
        network: bool = False,
    ) -> None:
        self.chain = chain
        #: Whether some destination sends over the network (see :meth:`flush_queued`).
        self.network = network
        self.counts = counts
        self.queue = queue
        self.spill = chain.spill if queue is not None else None
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
            self.chain.export([span])
            return
        size = span_size(span)  # once: the spill takes what the queue refuses at the same size
        if self.queue.put(span, size, ticket):
            return
        if self.spill is not None:
            self.spill.offer(span, size, ticket)
        else:
            mark_handed(ticket)
            self.counts.add(DROPPED)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        self._rescue()
        if self.sampler is not None:
            self._hand_over(self.sampler.release_all())
        self.chain.hurry(True)  # a primary that is failing is not waited for: its batches spill
        try:
            flushed = self.queue.force_flush(timeout_millis / 1000) if self.queue is not None else True
            if self.spill is not None:
                flushed = self.spill.force_flush(seconds_left(deadline)) and flushed
            return self.chain.flush_by(deadline, stuck=not flushed) and flushed
        finally:
            self.chain.hurry(False)

    def flush_queued(self, timeout_s: float, *, wait_for_network: bool = True) -> bool:
        """Wait (at most ``timeout_s``) until the spans queued so far were exported; False on timeout.

        Unlike :meth:`force_flush`, held sessions stay held, the spill is not drained and the
        destinations' own flush is not called: only what the export thread has in hand is waited for.
        With ``wait_for_network`` False and a destination that sends over the network, until the
        export thread has taken them (handed over, not yet sent).
        """
        if self.queue is None:
            return True
        if self.network and not wait_for_network:
            return self.queue.wait_taken(timeout_s)
        return self.queue.force_flush(timeout_s)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Export (or spill) what is queued and close the destinations, all within ``timeout_s``.

        A primary that does not answer is given up on: what it still has to take
        spills (:meth:`ExportChain.give_up`), so the spill keeps it for ``replay``.
        A destination stuck past the deadline (a write blocked in the kernel) is
        abandoned on its own thread, so shutdown and interpreter exit stay bounded.
        Idempotent: ``TracerProvider.shutdown()`` calls it again (with the 30 s
        default) after ``Bridge.shutdown`` did, and a hung one must not be waited for twice.
        """
        if self._shut_down:
            return
        self._rescue()
        if self.sampler is not None:
            self._hand_over(self.sampler.release_all())
        self._shut_down = True
        deadline = time.monotonic() + timeout_s
        self.chain.give_up()  # a primary failing now is not waited for
        stuck = False
        if self.queue is not None:
            # Leave time to spill what a primary that stopped answering meanwhile still holds.
            late = (min(GIVE_UP_MARGIN_S, timeout_s / 4), self.chain.give_up)
            self.counts.add(DROPPED, self.queue.shutdown(seconds_left(deadline), late=late))
            stuck = self.queue.running
        if self.spill is not None:
            self.chain.give_up()  # a primary failing by now: the drain's probe of it is not waited for
            self.spill.shutdown(seconds_left(deadline))
        self.chain.finish_by(deadline, stuck=stuck)


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
            [
                processor.force_flush(int(seconds_left(deadline) * 1000))
                for processor in (self.identity, self.inflight, self.export)
            ]
        )
