"""Span accounting: where every span went, counted once.

Each span that ends lands in exactly one terminal bucket, so after a flush::

    ended == sum(exported.values()) + fallback + spilled + sampled_out + discarded + dropped + failed

``exported.<name>`` counts spans the named exporter accepted, ``fallback``
spans the fallback exporter accepted because the preferred one was unusable or
failed, ``spilled`` spans waiting in the spill files (they leave it when the
drain sends them), ``sampled_out`` spans of sessions session sampling dropped, ``discarded`` spans the
``none`` exporter took (on purpose: the configuration asked for nothing to be kept),
``dropped`` spans discarded because the export queue and the spill were full,
and ``failed`` spans no exporter accepted. ``invalid`` counts calls rejected before
a span was made (e.g. ``record_span`` with an end before its start); those
spans never start, so they are outside the equation.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from verl_otel_bridge._internal.forks import reinit_after_fork

# Counter names (``status()["counters"]``), for every writer and reader; ``unfinished`` is
# :data:`~verl_otel_bridge._internal.protocol.UNFINISHED`, the status of the sessions it counts.
STARTED, ENDED = "started", "ended"
FALLBACK, SPILLED, SAMPLED_OUT, DROPPED, FAILED = "fallback", "spilled", "sampled_out", "dropped", "failed"
DISCARDED = "discarded"
INVALID, CONVERTED, PROGRESS = "invalid", "converted", "progress"
#: Spans started outside any session under a span that is in one (a thread not handed the session's context).
IDENTITY_LOST = "identity_lost"
SPILL_WRITTEN, SPILL_DRAINED, SAMPLING_RELEASED = "spill_written", "spill_drained", "sampling_released"
RL_INSIGHT_UNCONFIRMED, RL_INSIGHT_ERRORS = "rl_insight_unconfirmed", "rl_insight_errors"
OTLP_FAILED_BATCHES = "otlp_failed_batches"
SESSION_GAUGES_PUBLISHED, SESSION_GAUGES_FAILED = "session_gauges_published", "session_gauges_failed"
SESSION_GAUGES_DROPPED = "session_gauges_dropped"
VERL_METRICS_SKIPPED, VERL_METRICS_FAILED = "verl.metrics_skipped", "verl.metrics_failed"
#: Counted on every span start and end, so they get lock-free counters.
HOT_KEYS = (STARTED, ENDED)
#: The buckets of the equation besides ``exported.<name>``.
TERMINAL_KEYS = (FALLBACK, SPILLED, SAMPLED_OUT, DISCARDED, DROPPED, FAILED)


def exported(name: str) -> str:
    """The counter of spans exporter ``name`` accepted (a bucket of the equation)."""
    return f"exported.{name}"


def copied(name: str, *, ok: bool = True) -> str:
    """The counter of copies exporter ``name`` accepted (``ok``) or refused."""
    return f"copies.{name}" if ok else f"copies_failed.{name}"


class HotCounter:
    """A counter whose increment is one call of ``itertools.count.__next__``.

    That call is atomic under the GIL and takes no lock, so it is cheap enough for
    every span. Reading consumes one step of the count, which ``_base`` makes up for.
    """

    def __init__(self) -> None:
        self._count = itertools.count()
        #: The ``itertools.count`` itself, for code that must count in the same C call as it does
        #: something else (see :mod:`verl_otel_bridge._internal.pipeline.handover`).
        self.steps: Iterator[int] = self._count
        self.increment: Callable[[], int] = self._count.__next__
        self._base = 0

    def read(self) -> int:
        """The number of increments (readers must hold a lock of their own: reads are not atomic)."""
        value = next(self._count) - self._base
        self._base += 1
        return value

    def zero(self) -> None:
        """Start again from 0 (keeps ``increment`` valid for whoever holds it)."""
        self._base = next(self._count) + 1


class SpanCounts:
    """Thread-safe named counters (``"started"``, ``"exported.memory"``, ...).

    A forked child starts from zero: its counters describe its own spans (the
    parent's queued spans stay with the parent).
    """

    def __init__(self) -> None:
        self._hot = {key: HotCounter() for key in HOT_KEYS}
        self._reset()
        reinit_after_fork(self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._moving = threading.local()
        for counter in self._hot.values():
            counter.zero()

    def incrementer(self, key: str) -> Callable[[], int]:
        """A lock-free ``+1`` for one of :data:`HOT_KEYS`, to call on every span."""
        return self._hot[key].increment

    def steps(self, key: str) -> Iterator[int]:
        """The ``itertools.count`` behind one of :data:`HOT_KEYS` (each ``next`` is a ``+1``)."""
        return self._hot[key].steps

    def add(self, key: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``key`` (not one of :data:`HOT_KEYS`)."""
        if amount:
            with self._lock:
                self._counts[key] = self._counts.get(key, 0) + amount
                move: tuple[str, list[int]] | None = getattr(self._moving, "move", None)
                if move is not None and amount > 0 and (key in TERMINAL_KEYS or key.startswith(exported(""))):
                    source, left = move
                    taken = min(amount, left[0])
                    self._counts[source] = self._counts.get(source, 0) - taken
                    left[0] -= taken

    @contextlib.contextmanager
    def moving(self, key: str, amount: int) -> Iterator[None]:
        """Move ``amount`` spans out of bucket ``key`` into the buckets this thread counts them in next.

        Each terminal count this thread adds inside the block takes its share out of
        ``key`` under the same lock, so a snapshot never sees the spans in both buckets
        or in neither (the spill's drain re-exporting spans counted ``spilled``); what is
        left at the end leaves ``key`` then.
        """
        left = [amount]
        self._moving.move = (key, left)
        try:
            yield
        finally:
            self._moving.move = None
            self.add(key, -left[0])

    def get(self, key: str) -> int:
        """The current value of ``key`` (0 if never counted)."""
        with self._lock:
            hot = self._hot.get(key)
            return hot.read() if hot is not None else self._counts.get(key, 0)

    def snapshot(self) -> dict[str, Any]:
        """Counters for ``status()``: the terminal buckets, ``exported`` by exporter, then any others."""
        with self._lock:
            counts = dict(self._counts)
            counts.update({key: counter.read() for key, counter in self._hot.items()})
        prefix = exported("")
        summary: dict[str, Any] = {key: counts.get(key, 0) for key in (*HOT_KEYS, *TERMINAL_KEYS, INVALID, CONVERTED)}
        summary["exported"] = {k.removeprefix(prefix): v for k, v in counts.items() if k.startswith(prefix)}
        summary.update({k: v for k, v in counts.items() if k not in summary and not k.startswith(prefix)})
        return summary


def balance(snapshot: dict[str, Any]) -> int:
    """``ended`` minus every terminal bucket: 0 when no span is unaccounted for."""
    terminal: int = sum(snapshot["exported"].values()) + sum(snapshot[key] for key in TERMINAL_KEYS)
    ended: int = snapshot["ended"]
    return ended - terminal
