"""Handing an ended span over so that an exception raised into span-end code never loses it or counts it twice.

A signal handler's exception (``KeyboardInterrupt`` under Ctrl-C, ``SystemExit`` from a
SIGTERM handler calling ``sys.exit``) can arrive in the main thread between any two
bytecodes, so also between counting a span ``ended`` and queueing it. CPython runs
signal handlers only between bytecodes, never inside one call into C: the steps that
must happen together here are done in one such call, and each marks the span's
*ticket* (a list) in that same call. The ticket then tells exactly how far the span
got. When an exception interrupts span-end code, its first call (a deque append, in
C: from Python 3.11 on, nothing runs before the first call of an ``except`` block)
keeps the span and its ticket; the next span end, flush or shutdown hands over the
spans not yet handed (their ticket unmarked), once.

Exact for the spans the export queue, the spill's buffer or a drop takes (every
exporter but ``memory`` and ``none``, without session sampling). A span given to
the session sampler or to an inline exporter is marked handed first: an exception
inside their own bookkeeping can still lose it, which the shutdown summary reports
as ``unaccounted`` (a WARNING). On Python 3.10, which looks for signals at almost
every bytecode, a second signal within the same few bytecodes can still interrupt
the rescue.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import islice
from operator import itemgetter, methodcaller
from typing import Any, TypeVar

T = TypeVar("T")

#: A span's ticket: ``[COUNTED or a count, HANDED?]``.
Ticket = list[object]
#: The first item of a ticket whose span was counted ``ended`` before (a span the sampler released).
COUNTED = "counted"
#: The mark of a span handed over (queued, given to the spill or the sampler, counted dropped).
HANDED = "handed"

_HANDED = (HANDED,)
_FIRST = itemgetter(0)
_CALL = methodcaller("__call__")
_consume: Callable[[Iterable[Any]], None] = collections.deque(maxlen=0).extend


def count_on(ticket: Ticket, counter: Iterator[int]) -> None:
    """Advance ``counter`` (an ``itertools.count``) and put its value on ``ticket``, in one call."""
    ticket.extend(islice(counter, 1))


def counted(ticket: Ticket) -> bool:
    """Whether the ticket's span was counted ``ended``."""
    return bool(ticket) and ticket[0] != HANDED


def handed(ticket: Ticket) -> bool:
    """Whether the ticket's span was handed over."""
    return HANDED in ticket


def mark_handed(ticket: Ticket) -> None:
    """Mark the span handed before giving it to code that cannot mark it in the same call (see the module doc)."""
    ticket.append(HANDED)


def append_on(ticket: Ticket, target: collections.deque[T], item: T, *counters: Iterator[int]) -> None:
    """``target.append(item)``, advance ``counters`` and mark ``ticket`` handed, in one call.

    ``zip`` takes ``item``, then a step of each counter, then the mark; ``deque.extend``
    appends what it yields; then ``zip`` stops at the exhausted ``(item,)``.
    """
    target.extend(map(_FIRST, zip((item,), *counters, map(ticket.append, _HANDED), strict=False)))


def remove_on(ticket: Ticket, target: collections.deque[T], item: T) -> None:
    """Undo :func:`append_on`: ``target.remove(item)`` (``ValueError`` if it is gone) and unmark ``ticket``."""
    _consume(map(_CALL, (partial(target.remove, item), partial(ticket.remove, HANDED))))


class Interrupted:
    """Spans whose hand-over an exception interrupted, with their tickets; lock-free."""

    def __init__(self) -> None:
        self._spans: collections.deque[tuple[Any, Ticket]] = collections.deque()
        # Bound methods of the deque, so that what an ``except`` block calls first is the call into C.
        #: ``keep((span, ticket))``: keep a span whose hand-over was interrupted.
        self.keep: Callable[[tuple[Any, Ticket]], None] = self._spans.append
        #: ``put_back(taken)``: return spans :meth:`take` moved and not (all) handed over, first in line.
        self.put_back: Callable[[Iterable[tuple[Any, Ticket]]], None] = self._spans.extendleft

    def __bool__(self) -> bool:
        return bool(self._spans)

    def take(self, into: list[tuple[Any, Ticket]]) -> bool:
        """Move the oldest span to ``into`` (one call: it is in one of the two, whatever interrupts);
        False when there is none."""
        try:
            into.extend(islice(iter(self._spans.popleft, None), 1))
        except IndexError:
            return False
        return True
