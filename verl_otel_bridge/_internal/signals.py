"""Flushing queued spans when the process is asked to stop (SIGTERM), then stopping as it would have.

Under Python's default SIGTERM handling a process dies at once: no ``atexit`` hook
runs, and every span still queued is lost without a word. Ray and batch schedulers
stop workers exactly this way. So a bridge made in the main thread installs a
handler that has its spans flushed (bounded by ``shutdown_timeout_s``) and then hands
over to whatever handled SIGTERM before: the default (the bridge is shut down, so
sessions still open end as ``unfinished``, and the process then dies of SIGTERM, as
it would have), or the application's own handler (the bridge is only flushed: the
application may go on). A process that ignores SIGTERM is left alone. ``handle_sigterm=false`` turns it off.

The handler itself does no work that takes a lock: it runs between two bytecodes of
whatever the main thread was doing, which may hold any lock the flush needs (the
span counters', the queue's, the logging module's). It only writes one byte to a
pipe; a thread started with the handler, blocked reading that pipe, does the flush.
Under the default handling the handler first restores it, so the flush thread's
own SIGTERM (once the bridge is shut down), or a second one from outside, ends the
process; meanwhile the main thread runs on and releases what it held. Under an
application's handler, that handler is called at once and the flush runs beside it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from verl_otel_bridge._internal.forks import reinit_after_fork

logger = logging.getLogger(__name__)

#: Called with ``final=True`` when the process is about to die of the signal.
Flush = Callable[[bool], object]

_FLUSH, _FINAL, _STOP = b"f", b"F", b"q"


class _FlushThread:
    """The thread a SIGTERM handler hands its flush to, through a pipe (one ``write(2)``: no lock)."""

    def __init__(self, flush: Flush) -> None:
        self._flush = flush
        self._pid = -1
        self._read = self._write = -1
        self._stopped = False
        self._start()
        reinit_after_fork(self._start)

    def _start(self) -> None:
        if self._pid != -1:  # a forked child: the parent's pipe is the parent's
            for fd in (self._read, self._write):
                os.close(fd)
            if self._stopped:
                return
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._pid = os.getpid()
        self._stopped = False
        threading.Thread(target=self._run, args=(self._read,), name="verl-otel-bridge-sigterm", daemon=True).start()

    def ask(self, final: bool) -> bool:
        """Have the flush run (safe in a signal handler); False when no thread can take it."""
        if self._stopped or self._pid != os.getpid():
            return False
        try:
            os.write(self._write, _FINAL if final else _FLUSH)
        except OSError:  # a full pipe: flushes are already asked for
            return not final
        return True

    def stop(self) -> None:
        """End the thread (after the flush it is running, if any)."""
        if not self._stopped:
            self._stopped = True
            try:
                os.write(self._write, _STOP)
            except OSError:
                logger.debug("stopping the SIGTERM thread failed", exc_info=True)

    def _run(self, read: int) -> None:
        while True:
            try:
                asked = os.read(read, 1)
            except OSError:
                return
            if asked in (b"", _STOP):
                return
            try:
                self._flush(asked == _FINAL)
            except Exception:
                logger.exception("flushing spans on SIGTERM failed")
            if asked == _FINAL:
                os.kill(os.getpid(), signal.SIGTERM)  # handled by default by now: die of it, as the process would have
                return


class SigtermHandler:
    """Has one bridge flushed, then hands over to the handler that was there before."""

    def __init__(self, flush: Flush, alive: Callable[[], bool], previous: object) -> None:
        self.alive = alive
        self.previous = _live(previous)
        self._thread = _FlushThread(flush)

    def close(self) -> None:
        """The bridge is shut down: end the flush thread (the handler stays, passing SIGTERM on)."""
        self._thread.stop()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        previous = _live(self.previous)
        final = not callable(previous)
        if final:
            # Default handling again: the flush thread's own SIGTERM, or a second one, ends the process.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        asked = self.alive() and self._thread.ask(final)
        if callable(previous):
            previous(signum, frame)
        elif not asked:
            os.kill(os.getpid(), signal.SIGTERM)  # die of SIGTERM, as the default handling would have


def _live(handler: object) -> object:
    """``handler``, past the bridge handlers whose bridge is gone (so replacing bridges never grows a chain)."""
    while isinstance(handler, SigtermHandler) and not handler.alive():
        handler = handler.previous
    return handler


def flush_on_sigterm(flush: Flush, alive: Callable[[], bool]) -> SigtermHandler | None:
    """Make SIGTERM have ``flush`` called (while ``alive()``); None when it cannot or should not be installed."""
    if threading.current_thread() is not threading.main_thread():
        return None  # only the main thread may set signal handlers
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN or previous is None:  # ignored, or set outside Python: not ours to change
        return None
    handler = SigtermHandler(flush, alive, previous)
    signal.signal(signal.SIGTERM, handler)
    return handler
