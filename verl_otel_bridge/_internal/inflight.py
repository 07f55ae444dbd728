"""Sessions still open: who they are, how long they have run, what they did last.

OpenTelemetry exports a span only when it ends, so a hung session is invisible
until the job is killed, and then lost. :class:`InflightSessions` is a span
processor that keeps a small record per open ``agent_session`` span and, on a
background thread of its own:

* exports an ``agent_session.progress`` span (a child of the session span, with
  the identity, elapsed time, turns so far and the last span started) for every
  session open longer than ``progress_interval_s``, once per interval;
* logs, at most once per step, the sessions open longer than
  ``straggler_factor`` times the median duration of their step's finished sessions
  and longer than the straggler rule's floor (:mod:`~verl_otel_bridge._internal.stragglers`).

At shutdown the sessions still open are ended with ``status="unfinished"`` and
counted (``unfinished``); ended like any span, they keep the accounting equation.

The span hot path takes no lock: a span start inside a session does one context
variable read, one dict lookup and a few attribute stores; a span end compares
the span's name. Dicts are only mutated by single, GIL-atomic operations and the
thread reads them through ``dict.copy()``.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
import time
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import Tracer, set_span_in_context

from verl_otel_bridge._internal.accounting import PROGRESS, SpanCounts
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.identity import SessionIdentity, current_identity
from verl_otel_bridge._internal.protocol import (
    PROGRESS_ELAPSED_S,
    PROGRESS_IDLE_S,
    PROGRESS_LAST_SPAN,
    PROGRESS_SPAN_NAME,
    PROGRESS_TURN,
    PROGRESS_TURNS,
    SESSION_SPAN_NAME,
    STATUS,
    TURN,
    TURN_SPAN_NAME,
    UNFINISHED,
)
from verl_otel_bridge._internal.signals import ThreadsRefused, start_thread
from verl_otel_bridge._internal.status import OpenSessionsStatus
from verl_otel_bridge._internal.stragglers import StragglerRule

logger = logging.getLogger(__name__)

#: ``status()["open_sessions"]["oldest"]`` lists at most this many sessions.
OLDEST_SHOWN = 5
#: The watchdog needs this many finished sessions in a step before it trusts the step's median.
MIN_FINISHED_FOR_MEDIAN = 3
#: With only the watchdog on (``progress_interval_s=0``), the thread looks this often.
WATCHDOG_TICK_S = 5.0
#: Finished-session durations kept per step (the median of the first ones is close enough),
#: and steps kept (older ones are forgotten).
_MAX_DURATIONS_PER_STEP = 10_000
_MAX_STEPS = 16
_NS = 1_000_000_000


class OpenSession:
    """What the bridge knows about one open session (plain attributes, written without a lock)."""

    __slots__ = ("identity", "last", "next_progress_ns", "span", "start_ns", "step", "turn_span", "turns")

    def __init__(self, identity: SessionIdentity, span: Span, start_ns: int, interval_ns: int) -> None:
        self.identity = identity
        #: ``global_steps`` as an attribute value: hashable, whatever the caller passed.
        self.step = identity.attributes.get("global_steps")
        self.span = span
        self.start_ns = start_ns
        # The span objects themselves: their name, start and turn are read off the hot path.
        self.last: Span | None = None
        self.turn_span: Span | None = None
        self.turns = 0
        self.next_progress_ns = start_ns + interval_ns

    @property
    def last_span(self) -> str:
        """Name of the last span started in the session (the session's own before any)."""
        return self.last.name if self.last is not None else SESSION_SPAN_NAME

    @property
    def last_ns(self) -> int:
        """When that span started."""
        return (self.last.start_time if self.last is not None else None) or self.start_ns

    @property
    def turn(self) -> Any:
        """The ``turn`` of the last turn span started, None before the first."""
        attributes = self.turn_span.attributes if self.turn_span is not None else None
        return attributes.get(TURN) if attributes is not None else None

    def describe(self, now_ns: int) -> dict[str, Any]:
        """The session for ``status()`` and the watchdog's log line: its identity, age, turn and last span."""
        return {
            **self.identity.to_dict(),
            "age_s": round((now_ns - self.start_ns) / _NS, 3),
            "turn": self.turn,
            "turns": self.turns,
            "last_span": self.last_span,
            "idle_s": round((now_ns - self.last_ns) / _NS, 3),
        }


class InflightSessions(SpanProcessor):
    """Tracks open sessions; exports progress spans and runs the straggler watchdog (see the module doc).

    Call :meth:`bind` with the tracer progress spans are made by, and :meth:`close`
    before the export processor shuts down.
    """

    def __init__(self, counts: SpanCounts, progress_interval_s: float, straggler_factor: float) -> None:
        self._counts = counts
        self._interval_ns = int(progress_interval_s * _NS)
        self._factor = straggler_factor
        self._rule = StragglerRule(straggler_factor)
        self._tracer: Tracer | None = None
        self._closed = False
        self._reset()
        reinit_after_fork(self._reset)

    def _reset(self) -> None:
        # Also the after-fork hook: the parent's open sessions are not the child's to report,
        # and the parent's thread does not exist in the child (it restarts with the next session).
        self._by_span: dict[int, OpenSession] = {}
        self._by_lane: dict[str, OpenSession] = {}
        self._durations: dict[Any, list[float]] = {}
        self._warned: set[Any] = set()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def bind(self, tracer: Tracer) -> None:
        """Progress spans are made by ``tracer`` (the bridge's)."""
        self._tracer = tracer

    @property
    def _wants_thread(self) -> bool:
        return bool(self._interval_ns or self._factor)

    # -- the span hot path -----------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        identity = current_identity()
        if identity is None:
            return
        name = span.name
        if name == SESSION_SPAN_NAME:
            self._opened(span, identity)
            return
        open_session = self._by_lane.get(identity.state_lane_id)
        if open_session is None:
            return
        open_session.last = span
        if name == TURN_SPAN_NAME:
            open_session.turns += 1
            open_session.turn_span = span

    def on_end(self, span: ReadableSpan) -> None:
        if span.name != SESSION_SPAN_NAME:
            return
        context = span.context
        open_session = self._by_span.pop(context.span_id, None) if context is not None else None
        if open_session is None:
            return
        lane = open_session.identity.state_lane_id
        if self._by_lane.get(lane) is open_session:
            self._by_lane.pop(lane, None)
        if self._factor and span.end_time is not None:
            durations = self._durations.get(open_session.step)
            if durations is None:
                durations = self._durations.setdefault(open_session.step, [])
            if len(durations) < _MAX_DURATIONS_PER_STEP:
                durations.append((span.end_time - open_session.start_ns) / _NS)

    def _opened(self, span: Span, identity: SessionIdentity) -> None:
        context = span.context
        if context is None or self._closed:
            return
        start = span.start_time or time.time_ns()
        open_session = OpenSession(identity, span, start, self._interval_ns)
        self._by_span[context.span_id] = open_session
        self._by_lane[identity.state_lane_id] = open_session
        if self._thread is None and self._wants_thread:
            self._start_thread()

    # -- reading ---------------------------------------------------------------

    def snapshot(self, oldest: int = OLDEST_SHOWN) -> OpenSessionsStatus:
        """``{"count": open sessions, "oldest": [the oldest ones, described]}``."""
        sessions = sorted(self._by_span.copy().values(), key=lambda s: s.start_ns)
        now = time.time_ns()
        return {"count": len(sessions), "oldest": [s.describe(now) for s in sessions[:oldest]]}

    # -- the background thread -------------------------------------------------

    def _start_thread(self) -> None:
        with self._start_lock:
            if self._thread is not None or self._closed:
                return
            with contextlib.suppress(ThreadsRefused):  # the interpreter is exiting: no progress records
                self._thread = start_thread(self._run, "verl-otel-bridge-progress")

    def _run(self) -> None:
        stop = self._stop
        while True:
            try:
                wait_s = self.tick(time.time_ns())
            except Exception:  # the thread must outlive a bad tick (it would otherwise stop reporting)
                logger.exception("progress reporting failed; trying again at the next interval")
                wait_s = self._interval_ns / _NS or WATCHDOG_TICK_S
            if stop.wait(wait_s):
                return

    def tick(self, now_ns: int) -> float:
        """Export the progress spans due at ``now_ns``, run the watchdog; seconds until the next look."""
        sessions = list(self._by_span.copy().values())
        next_due = now_ns + (self._interval_ns or int(WATCHDOG_TICK_S * _NS))
        if self._interval_ns:
            for open_session in sessions:
                if open_session.next_progress_ns <= now_ns:
                    self._progress(open_session, now_ns)
                    open_session.next_progress_ns = now_ns + self._interval_ns
                next_due = min(next_due, open_session.next_progress_ns)
        if self._factor:
            self._watch(sessions, now_ns)
            next_due = min(next_due, now_ns + int(WATCHDOG_TICK_S * _NS))
        return max(0.001, (next_due - now_ns) / _NS)

    def _progress(self, open_session: OpenSession, now_ns: int) -> None:
        tracer = self._tracer
        if tracer is None:
            return
        attributes: dict[str, Any] = {
            **open_session.identity.attributes,
            PROGRESS_ELAPSED_S: (now_ns - open_session.start_ns) / _NS,
            PROGRESS_TURNS: open_session.turns,
            PROGRESS_LAST_SPAN: open_session.last_span,
            PROGRESS_IDLE_S: (now_ns - open_session.last_ns) / _NS,
        }
        turn = open_session.turn
        if isinstance(turn, (int, str)):
            attributes[PROGRESS_TURN] = turn
        span = tracer.start_span(
            PROGRESS_SPAN_NAME, context=set_span_in_context(open_session.span), attributes=attributes, start_time=now_ns
        )
        span.end(end_time=now_ns)
        self._counts.add(PROGRESS)

    def _watch(self, sessions: list[OpenSession], now_ns: int) -> None:
        steps = self._durations.copy()
        for old in list(steps)[:-_MAX_STEPS]:
            self._durations.pop(old, None)
        for step, durations in steps.items():
            if step in self._warned or len(durations) < MIN_FINISHED_FOR_MEDIAN:
                continue
            median = statistics.median(durations)
            limit_ns = (self._rule.limit_s(median) or 0.0) * _NS
            late = [s for s in sessions if s.step == step and now_ns - s.start_ns > limit_ns]
            if not late:
                continue
            self._warned.add(step)
            late.sort(key=lambda s: s.start_ns)
            shown = "; ".join(_late_text(s.describe(now_ns)) for s in late[:OLDEST_SHOWN])
            more = f" (and {len(late) - OLDEST_SHOWN} more)" if len(late) > OLDEST_SHOWN else ""
            logger.warning(
                "step %s: %d sessions open longer than %g x the step's median session (%.3f s) and than %g s: %s%s",
                step,
                len(late),
                self._factor,
                median,
                self._rule.min_s,
                shown,
                more,
            )

    # -- shutdown ----------------------------------------------------------------

    def close(self, timeout_s: float) -> int:
        """Stop the thread (waiting at most ``timeout_s``), then end every open session as ``unfinished``.

        Returns how many sessions were ended so. Idempotent.
        """
        if self._closed:
            return 0
        with self._start_lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("the progress thread did not stop within %.1f s; leaving it (a daemon)", timeout_s)
        ended = 0
        for open_session in self._by_span.copy().values():
            span = open_session.span
            if span.is_recording():
                span.set_attribute(STATUS, UNFINISHED)
                span.end()
                ended += 1
        self._by_span.clear()
        self._by_lane.clear()
        if ended:
            self._counts.add(UNFINISHED, ended)
            logger.warning("%d sessions were still open at shutdown; ended with status=%r", ended, UNFINISHED)
        return ended

    def shutdown(self) -> None:
        self.close(0.0)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _late_text(described: dict[str, Any]) -> str:
    return (
        f"{described['state_lane_id']} uid={described['uid']!r} open {described['age_s']:.1f} s, "
        f"turn {described['turn']}, last span {described['last_span']!r}"
    )
