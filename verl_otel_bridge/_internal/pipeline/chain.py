"""The export chain: what happens to one batch on the export thread, in one function.

:meth:`ExportChain.export` redacts the batch, sends a copy to each copy
destination, sends it to the primary, routes what the primary refused (to the
fallback when RL-Insight is the primary, else to the spill, else failed) and
counts each span in exactly one bucket of the equation in
:mod:`verl_otel_bridge._internal.accounting`. Destinations only say what they did
(:class:`~verl_otel_bridge._internal.exporters.destination.Outcome`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.accounting import DISCARDED, FAILED, FALLBACK, SpanCounts, copied, exported
from verl_otel_bridge._internal.exporters.destination import Destination, Outcome
from verl_otel_bridge._internal.pipeline.spill import FROM_DESTINATION, FROM_QUEUE, Spill, SpillSettings
from verl_otel_bridge._internal.records import redact, redaction_keys
from verl_otel_bridge._internal.signals import ThreadsRefused, start_thread, untraced

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Named:
    """A destination with its configured name; ``discards``: what it takes is counted ``discarded``."""

    name: str
    destination: Destination
    discards: bool = False


class Health:
    """Whether the primary answers: up, failing (since when), or down (failing longer than ``after_s``).

    While it is down only the spill's drain tries it, one batch every ``probe_s``; while
    the bridge hurries (a flush or shutdown is waiting) a failing primary counts as down.
    """

    def __init__(self, after_s: float, probe_s: float) -> None:
        self._after_s = after_s
        self._probe_s = probe_s
        self._failing_since: float | None = None
        self._last_try = 0.0
        self.hurrying = False

    @property
    def up(self) -> bool:
        """The last batch tried was taken."""
        return self._failing_since is None

    def should_try(self) -> bool:
        """Whether the export thread sends a batch (else it spills it and the drain probes)."""
        since = self._failing_since
        return since is None or (not self.hurrying and time.monotonic() - since < self._after_s)

    def retry_due(self) -> bool:
        """Whether ``probe_s`` has passed since the last batch was tried."""
        return time.monotonic() - self._last_try >= self._probe_s

    def note(self, outcome: Outcome) -> bool:
        """What the primary did with a batch (refusing any of it is failing); True when it answers again."""
        if not outcome.refused:
            recovered = self._failing_since is not None
            self._failing_since = None
            return recovered
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._last_try = now
        return False


class ExportChain:
    """Where every batch goes: the copies, the primary, then the fallback or the spill.

    Args:
        primary: the destination whose outcome is the batch's (counted ``exported.<name>``).
        copies: destinations that get a copy of every batch (counted ``copies.<name>``, apart).
        fallback: where what the primary refused goes (RL-Insight's local fallback); None: the spill.
        counts: where every outcome is counted.
        redact_keys: attribute keys whose values become ``[REDACTED]`` before any destination sees them.
        spill: where spans the primary refused, or the queue could not hold, wait (None: off).
    """

    def __init__(
        self,
        primary: Named,
        counts: SpanCounts,
        *,
        copies: Sequence[Named] = (),
        fallback: Named | None = None,
        redact_keys: Sequence[str] = (),
        spill: SpillSettings | None = None,
    ) -> None:
        self.primary = primary
        self.copies = tuple(copies)
        self.fallback = fallback
        self.counts = counts
        self.redact_keys = redaction_keys(redact_keys)
        health = Health(spill.spill_after_s, spill.spill_probe_s) if spill is not None and fallback is None else None
        self.health = health
        self.spill = (
            Spill(
                spill,
                counts,
                {FROM_QUEUE: self.export, FROM_DESTINATION: self.deliver},
                (lambda: health.up or health.retry_due()) if health is not None else None,
            )
            if spill is not None
            else None
        )
        self._given_up = False

    @property
    def destinations(self) -> tuple[Named, ...]:
        """Every destination: the primary, the fallback, the copies."""
        return (self.primary, *((self.fallback,) if self.fallback is not None else ()), *self.copies)

    def export(self, spans: Sequence[ReadableSpan]) -> bool:
        """One batch: redact it, copy it, deliver it to the primary (see :meth:`deliver`)."""
        if self.redact_keys:
            spans = [redact(span, self.redact_keys) for span in spans]
        for copy in self.copies:
            outcome = _send(copy, spans)
            self.counts.add(copied(copy.name), outcome.accepted)
            self.counts.add(copied(copy.name, ok=False), len(spans) - outcome.accepted)
        return self.deliver(spans)

    def deliver(self, spans: Sequence[ReadableSpan]) -> bool:
        """The primary's part of a batch: sent (unless the primary is down: then spilled), what it
        refused sent to the fallback, else spilled, else failed; each span counted once.

        True when no span of the batch failed.
        """
        if self.health is not None and not self.health.should_try() and not self._on_drain_thread():
            return self._spill(spans)
        outcome = _send(self.primary, spans)
        self._count_taken(self.primary, outcome)
        self.counts.add(FAILED, outcome.left_out)
        if self.health is not None and self.health.note(outcome) and self.spill is not None:
            self.spill.wake_drain()  # what was spilled while it did not answer goes now
        refused = outcome.refused
        if not refused:
            return not outcome.left_out
        if self.fallback is not None:
            fallen = _send(self.fallback, refused)
            self._count_taken(self.fallback, fallen, as_fallback=True)
            self.counts.add(FAILED, fallen.left_out + len(fallen.refused))
            return not (outcome.left_out or fallen.left_out or fallen.refused)
        if self.spill is not None:
            return self._spill(refused) and not outcome.left_out
        self.counts.add(FAILED, len(refused))
        return False

    def _count_taken(self, named: Named, outcome: Outcome, *, as_fallback: bool = False) -> None:
        if named.discards:
            self.counts.add(DISCARDED, outcome.accepted)
        elif as_fallback:
            self.counts.add(FALLBACK, outcome.accepted)
        elif outcome.accepted_via:
            for way, taken in outcome.accepted_via.items():
                self.counts.add(exported(way), taken)
        else:
            self.counts.add(exported(named.name), outcome.accepted)

    def _spill(self, spans: Sequence[ReadableSpan]) -> bool:
        assert self.spill is not None
        try:
            return self.spill.write(spans, FROM_DESTINATION)
        except Exception:
            logger.exception("spilling %d spans raised; they are counted as failed", len(spans))
            self.counts.add(FAILED, len(spans))
            return False

    def _on_drain_thread(self) -> bool:
        return self.spill is not None and self.spill.on_drain_thread()

    # -- flush and shutdown: never wait on a primary that does not answer -------------------

    def hurry(self, hurrying: bool) -> None:
        """While a flush or shutdown waits: a failing primary is not tried (its batches spill)."""
        if self.health is not None:
            self.health.hurrying = hurrying

    def give_up(self) -> None:
        """Shutting down, near its deadline, the export thread still busy: close a failing primary, so the
        batch waiting on it ends refused and spills before the process exits."""
        self.hurry(True)
        if self.health is not None and self.spill is not None and not self.health.up and not self._given_up:
            self._given_up = True
            logger.info("the %s destination does not answer; closing it so that its spans spill", self.primary.name)
            _close(self.primary)

    def flush(self, timeout_s: float) -> bool:
        """Wait (bounded) for work the destinations do after ``send`` returned."""
        deadline = time.monotonic() + timeout_s
        return all([named.destination.flush(seconds_left(deadline)) for named in self.destinations])

    def flush_by(self, deadline: float, *, stuck: bool = False) -> bool:
        """:meth:`flush` on a thread of its own, given up at ``deadline`` (a destination may be stuck;
        ``stuck``: one is known to be, see :func:`within`)."""
        return within(deadline, lambda: self.flush(seconds_left(deadline)), "flush", stuck=stuck)

    def finish_by(self, deadline: float, *, stuck: bool = False) -> None:
        """Flush (what a destination still does in the background, RL-Insight's gauges, gets the time left)
        and close every destination, on a thread of its own, given up at ``deadline`` (``stuck``: see
        :func:`within`)."""

        def finish() -> bool:
            self.flush(seconds_left(deadline))
            self.close()
            return True

        within(deadline, finish, "shutdown", stuck=stuck)

    def close(self) -> None:
        """Close every destination (the files stay; a send still waiting ends)."""
        for named in self.destinations:
            _close(named)


def within(deadline: float, work: Callable[[], bool], what: str, *, stuck: bool = False) -> bool:
    """Run ``work`` on a thread of its own until ``deadline`` (``time.monotonic()``); False if it
    did not return True by then (it is left running: nothing can interrupt a blocked system call).

    When the interpreter is exiting and starts no thread, ``work`` runs in the caller,
    unbounded, unless a destination is known to be ``stuck`` (the export thread did not
    return by its deadline): then it is skipped, with a WARNING, and the result is False.
    """
    done: list[bool] = []

    def run() -> None:
        try:
            done.append(bool(work()))
        except Exception:
            logger.exception("the export chain's %s raised", what)
            done.append(False)

    try:
        worker = start_thread(run, f"verl-otel-bridge-{what}")
    except ThreadsRefused:
        if stuck:
            logger.warning("the export chain's %s was skipped: a destination is stuck, the interpreter exiting", what)
            return False
        with untraced():
            run()
        return done == [True]
    worker.join(seconds_left(deadline))
    if worker.is_alive():
        logger.warning(
            "the export chain's %s did not return by its deadline; abandoned (a destination may be stuck)", what
        )
        return False
    return done == [True]


def seconds_left(deadline: float) -> float:
    """Seconds until ``deadline`` (``time.monotonic()``), never negative."""
    return max(0.0, deadline - time.monotonic())


def _send(named: Named, spans: Sequence[ReadableSpan]) -> Outcome:
    """``named``'s outcome for ``spans``; a destination that raises refused them all (logged)."""
    try:
        return named.destination.send(spans)
    except Exception as exc:
        logger.exception("the %s destination raised on %d spans", named.name, len(spans))
        return Outcome.refusing(spans, f"{type(exc).__name__}: {exc}")


def _close(named: Named) -> None:
    try:
        named.destination.close()
    except Exception:
        logger.exception("closing the %s destination raised", named.name)
