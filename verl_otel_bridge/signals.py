"""Flushing queued spans when the process is asked to stop (SIGTERM), then stopping as it would have.

Under Python's default SIGTERM handling a process dies at once: no ``atexit`` hook
runs, and every span still queued is lost without a word. Ray and batch schedulers
stop workers exactly this way. So a bridge made in the main thread installs a
handler that flushes (bounded by ``shutdown_timeout_s``) and then hands over to
whatever handled SIGTERM before: the default (the bridge is shut down first, so
sessions still open end as ``unfinished``, and the process then dies of SIGTERM, as
it would have), or the application's own handler (the bridge is only flushed: the
application may go on). A process that ignores SIGTERM is left alone. ``handle_sigterm=false`` turns it off.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger(__name__)

#: Called with ``final=True`` when the process is about to die of the signal.
Flush = Callable[[bool], object]


class _Handler:
    """Flushes one bridge, then hands over to the handler that was there before."""

    def __init__(self, flush: Flush, alive: Callable[[], bool], previous: object) -> None:
        self.flush = flush
        self.alive = alive
        self.previous = _live(previous)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        previous = _live(self.previous)
        if self.alive():
            try:
                self.flush(not callable(previous))
            except Exception:
                logger.exception("flushing spans on SIGTERM failed")
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)  # die of SIGTERM, as the default handling would have


def _live(handler: object) -> object:
    """``handler``, past the bridge handlers whose bridge is gone (so replacing bridges never grows a chain)."""
    while isinstance(handler, _Handler) and not handler.alive():
        handler = handler.previous
    return handler


def flush_on_sigterm(flush: Flush, alive: Callable[[], bool]) -> bool:
    """Make SIGTERM call ``flush`` first (while ``alive()``); False when it cannot or should not be installed."""
    if threading.current_thread() is not threading.main_thread():
        return False  # only the main thread may set signal handlers
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is None:  # ignored, or set outside Python: not ours to change
        return False
    signal.signal(signal.SIGTERM, _Handler(flush, alive, previous))
    return True
