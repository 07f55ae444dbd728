"""Carrying the caller's context into the threads it starts: the one switch, :func:`propagate_to_threads`.

A thread starts with an empty :mod:`contextvars` context, so work handed to
``threading.Thread``, a ``ThreadPoolExecutor`` or ``loop.run_in_executor`` runs
outside the session it was handed off in: its spans lose the identity and start a
trace of their own. The switch makes ``Thread.start`` and ``ThreadPoolExecutor.submit``
(which ``run_in_executor`` and ``Executor.map`` call) run the work in a copy of the
caller's context, as ``asyncio.to_thread`` always does: the session identity, the
current span and every other context variable.

OpenTelemetry's ``ThreadingInstrumentor`` patches the same two places but carries
only OpenTelemetry's own context, not the bridge's identity (a context variable of
its own, see :mod:`verl_otel_bridge._internal.identity`); this carries both, and
needs nothing installed.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_PACKAGE = __name__.split(".", 1)[0] + "."
#: Set on the two replacements, so the switch knows its own and finds what they replaced.
_MARK = "_verl_otel_bridge_carries_context"


def _carrying_start(start: Callable[[threading.Thread], None]) -> Callable[[threading.Thread], None]:
    @functools.wraps(start)
    def carrying_start(self: threading.Thread) -> None:
        if not _the_bridges(self):
            # The instance attribute wins over the class's run, a subclass's own run included.
            self.run = functools.partial(contextvars.copy_context().run, self.run)  # type: ignore[method-assign]
        start(self)

    setattr(carrying_start, _MARK, True)
    return carrying_start


def _the_bridges(thread: threading.Thread) -> bool:
    """Whether ``thread`` is one of the bridge's own (export, progress, spill, ...). Those start in an empty
    context, as without the switch: they outlive whatever session happened to start them, and a progress
    thread running in one would stamp its identity on every session's progress records."""
    target = getattr(thread, "_target", None)  # threading.Thread's own attribute, set by its __init__
    module = getattr(target, "__module__", None) or type(thread).__module__
    return isinstance(module, str) and module.startswith(_PACKAGE)


def _carrying_submit(submit: Callable[..., Future[Any]]) -> Callable[..., Future[Any]]:
    @functools.wraps(submit)
    def carrying_submit(self: ThreadPoolExecutor, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        run = contextvars.copy_context().run
        # A worker thread this submit starts copies the empty context, not the caller's: it
        # outlives the caller's session and runs every later task, each in its own context.
        return contextvars.Context().run(submit, self, run, fn, *args, **kwargs)

    setattr(carrying_submit, _MARK, True)
    return carrying_submit


_PLACES: tuple[tuple[type, str, Callable[[Any], Any]], ...] = (
    (threading.Thread, "start", _carrying_start),
    (ThreadPoolExecutor, "submit", _carrying_submit),
)


def propagate_to_threads(enabled: bool = True) -> None:
    """Run work handed to another thread in the context of the code that handed it over.

    After this call, ``threading.Thread`` (and ``threading.Timer``) run in a copy of
    the context ``start()`` was called in, and each ``ThreadPoolExecutor`` task
    (``submit``, ``map``, ``loop.run_in_executor``) in a copy of the context it was
    submitted in: spans made there carry the session identity and are children of
    the span that was current. It holds for the whole process, for every bridge,
    until ``propagate_to_threads(False)``; calling it again changes nothing. Every
    context variable is carried, as ``asyncio.to_thread`` carries them; the bridge's
    own background threads start in an empty context all the same. Code that starts
    no thread runs exactly as without it.

    Without it, hand the context over yourself: ``contextvars.copy_context().run``
    as the callable, or ``resume(identity.to_dict())`` in the thread.
    """
    for owner, name, carrying in _PLACES:
        current = getattr(owner, name)
        ours = getattr(current, _MARK, False)
        if enabled and not ours:
            setattr(owner, name, carrying(current))
        elif not enabled and ours:
            setattr(owner, name, current.__wrapped__)
