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

A SIGTERM that arrives while the bridge is already shutting down (at interpreter
exit, in multiprocessing's exit hook: a pool's ``terminate()`` signals workers that
are flushing) is handed to the flush thread too: it waits for that shutdown (bounded
by ``shutdown_timeout_s``), then the process dies of SIGTERM, its spans written.

Every thread the bridge starts (:func:`start_thread`) runs :func:`untraced` (see there), and
blocks the signals a process is sent to ask something of it (SIGTERM, SIGINT, ...), so the kernel delivers them to a
thread of the application's, usually the main thread. Python runs a handler only in
the main thread: a signal delivered to another thread merely marks it pending, and a
main thread blocked in a wait that only a signal would end (a pool worker waiting for
the task queue's lock, which its pool's ``terminate()`` took) would never run it.

Even in the main thread, a signal that arrives just before such a wait (after the
last point where Python checks for signals) leaves the handler pending for as long
as the wait lasts. So the flush thread also reads Python's wakeup fd
(``signal.set_wakeup_fd``, to which Python's C-level handler writes the number of
every signal, whatever the main thread is doing), when the application has not set
one: on SIGTERM it flushes without waiting for the handler, then, under the default
handling, sends SIGTERM to the main thread itself, which interrupts its wait and runs
the handler (the process dies of SIGTERM); if the main thread still cannot run it
within :data:`MAIN_THREAD_GRACE_S`, the process exits with status 143 (128 + SIGTERM).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from types import FrameType

from opentelemetry import context

from verl_otel_bridge._internal.forks import reinit_after_fork

logger = logging.getLogger(__name__)

#: Called with ``final=True`` when the process is about to die of the signal.
Flush = Callable[[bool], object]

_FLUSH, _FINAL, _STOP = b"f", b"F", b"q"

#: Whether the flush thread watches Python's wakeup fd and can send a signal to the main thread (POSIX).
_WAKES_MAIN_THREAD = hasattr(signal, "pthread_kill")
#: After the flush thread has handled a SIGTERM itself and sent SIGTERM to the main thread, how long the
#: main thread has to run the handler (and die of it) before the process exits with status 143.
MAIN_THREAD_GRACE_S = 5.0

#: Signals sent to a process to ask something of it (stop, interrupt, reload, a timer, a child's end):
#: the bridge's threads block them. Signals a fault raises in the faulting thread (SIGSEGV, ...) are left alone.
ASKING_SIGNALS = frozenset(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD", "SIGWINCH")
    if hasattr(signal, name)
)


# As opentelemetry-instrumentation's public ``suppress_instrumentation()`` (not a
# runtime dependency): the API's key, which the SDK's processors set and current
# instrumentations check, and the plain string older instrumentations check.
_SUPPRESS_KEYS = (context._SUPPRESS_INSTRUMENTATION_KEY, "suppress_instrumentation")


@contextmanager
def untraced() -> Iterator[None]:
    """Instrumented libraries (urllib3, requests, grpc, ...) make no spans in the block.

    OpenTelemetry's span processors set the suppress-instrumentation key around every
    export. Without it, with ``instrument(provider)`` and an instrumented HTTP library on
    the same provider, each batch the bridge posts would make spans that are exported in
    the next batch, and so on. Every thread :func:`start_thread` starts runs in it whole.
    """
    current = context.get_current()
    for key in _SUPPRESS_KEYS:
        current = context.set_value(key, True, current)
    token = context.attach(current)
    try:
        yield
    finally:
        context.detach(token)


def _run_untraced(target: Callable[..., object], *args: object) -> None:
    with untraced():
        target(*args)


class ThreadsRefused(RuntimeError):
    """The interpreter is exiting and starts no thread (Python 3.12 refuses them in ``atexit`` hooks)."""


def start_thread(target: Callable[..., object], name: str, *args: object) -> threading.Thread:
    """Start a daemon thread running ``target(*args)`` :func:`untraced`, that never takes one of
    :data:`ASKING_SIGNALS`.

    Raises :class:`ThreadsRefused` when the interpreter is exiting and refuses new
    threads: the caller then does the work itself or leaves it (see its docstring).

    The signals are blocked in the starting thread around ``start()``, so the new
    thread has them blocked from its first instruction (a thread inherits its
    creator's signal mask); the starting thread's mask is then restored, and a
    signal that arrived meanwhile is delivered to it then.
    """
    thread = threading.Thread(target=_run_untraced, args=(target, *args), name=name, daemon=True)
    masks = hasattr(signal, "pthread_sigmask")  # (not on Windows)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ASKING_SIGNALS) if masks else None
    try:
        thread.start()
    except RuntimeError as exc:
        if threading.main_thread().is_alive():
            raise
        raise ThreadsRefused(f"the interpreter is exiting and starts no thread ({exc})") from exc
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread


def _die_of_sigterm() -> None:
    """End the process with SIGTERM (whose handling is the default by now), from any thread."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # a bridge thread blocks it
    os.kill(os.getpid(), signal.SIGTERM)


class _FlushThread:
    """The thread a SIGTERM handler hands its flush to, through a pipe (one ``write(2)``: no lock).

    It also watches a second pipe, which :meth:`claim_wakeup_fd` makes Python's wakeup
    fd, and calls ``signalled()`` when that says SIGTERM arrived.
    """

    def __init__(self, flush: Flush, signalled: Callable[[], object]) -> None:
        self._flush = flush
        self._signalled = signalled
        self._pid = -1
        self._read = self._write = self._wake_read = self.wake_write = -1
        self._stopped = False
        self._start()
        reinit_after_fork(self._start)

    def _start(self) -> None:
        inherited = self._pid != -1  # a forked child: the parent's pipes are the parent's
        old = (self._read, self._write, self._wake_read, self.wake_write)
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        if _WAKES_MAIN_THREAD:
            self._wake_read, self.wake_write = os.pipe()
            os.set_blocking(self._wake_read, False)
            os.set_blocking(self.wake_write, False)  # as set_wakeup_fd requires
        if inherited:
            if self._stopped or not self.claim_wakeup_fd({old[3]}):
                _release_wakeup_fd(old[3])
            for fd in old:
                if fd != -1:
                    os.close(fd)
        self._pid = os.getpid()
        if inherited and self._stopped:
            return
        self._stopped = False
        start_thread(self._run, "verl-otel-bridge-sigterm", self._read, self._wake_read)

    def claim_wakeup_fd(self, ours: Collection[int]) -> bool:
        """Make this thread's pipe Python's wakeup fd, unless the application set one (any fd not in ``ours``).

        Only in the main thread; True when it is now.
        """
        if self.wake_write == -1:
            return False
        try:
            old = signal.set_wakeup_fd(self.wake_write, warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread
            return False
        if old != -1 and old not in ours:
            signal.set_wakeup_fd(old)  # the application's: left to it
            return False
        return True

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
        """End the thread (after the flush it is running, if any); give the wakeup fd back if this is the
        main thread (otherwise the next bridge takes it over)."""
        if not self._stopped:
            self._stopped = True
            try:
                os.write(self._write, _STOP)
            except OSError:
                logger.debug("stopping the SIGTERM thread failed", exc_info=True)
            _release_wakeup_fd(self.wake_write)

    def _run(self, read: int, wake_read: int) -> None:
        try:
            while self._serve(read, wake_read):
                pass
        finally:
            # Forgotten before closed, so a child forked meanwhile never closes a number reused by then.
            # The write ends stay open: a handler may write to them at any time.
            self._read = self._wake_read = -1
            for fd in (read, wake_read):
                if fd != -1:
                    os.close(fd)

    def _serve(self, read: int, wake_read: int) -> bool:
        """Wait for a request or a signal and serve it; False when the thread is to end."""
        try:
            if wake_read != -1:
                poller = select.poll()  # not select(): a process may hold descriptors past FD_SETSIZE (1024)
                poller.register(read, select.POLLIN)
                poller.register(wake_read, select.POLLIN)
                ready = {fd for fd, _event in poller.poll()}
                if wake_read in ready and signal.SIGTERM in os.read(wake_read, 512):
                    self._signalled()
                if read not in ready:
                    return True
            asked = os.read(read, 1)
        except OSError:
            return False
        except Exception:  # once, not in a loop: the thread ends, SIGTERM does what it would without the bridge
            logger.exception("handling SIGTERM failed; queued spans are no longer flushed on SIGTERM")
            return False
        if asked in (b"", _STOP):
            return False
        try:
            self._flush(asked == _FINAL)
        except Exception:
            logger.exception("flushing spans on SIGTERM failed")
        if asked == _FINAL:
            _die_of_sigterm()  # as the process would have
            return False
        return True


def _release_wakeup_fd(fd: int) -> None:
    """Unset Python's wakeup fd if it is ``fd`` and this is the main thread (only it may)."""
    if fd == -1 or threading.current_thread() is not threading.main_thread():
        return
    try:
        old = signal.set_wakeup_fd(-1)
        if old != fd:
            signal.set_wakeup_fd(old)
    except (ValueError, OSError):
        logger.debug("giving the wakeup fd back failed", exc_info=True)


def _wake_main_thread_to_die() -> None:
    """SIGTERM to the main thread, whose handler is pending (it may be blocked in a wait only a signal
    ends): it runs the handler and dies of SIGTERM. If it cannot within :data:`MAIN_THREAD_GRACE_S`
    (a long call into C that does not look at signals), the process exits with status 143."""
    main = threading.main_thread().ident
    if main is None:
        return
    signal.pthread_kill(main, signal.SIGTERM)
    time.sleep(MAIN_THREAD_GRACE_S)  # the process normally dies during this wait
    logger.warning("the main thread did not handle SIGTERM within %.0f s; exiting", MAIN_THREAD_GRACE_S)
    os._exit(128 + signal.SIGTERM)


class SigtermHandler:
    """Has one bridge flushed, then hands over to the handler that was there before."""

    def __init__(self, flush: Flush, alive: Callable[[], bool], previous: object) -> None:
        self.alive = alive
        self.previous = _live(previous)
        self._flush = flush
        self._thread = _FlushThread(flush, self._signalled)
        self._dying = False

    @property
    def wakeup_fd(self) -> int:
        """The write end of the pipe this handler's thread watches as Python's wakeup fd."""
        return self._thread.wake_write

    def claim_wakeup_fd(self, ours: Collection[int]) -> bool:
        """See :meth:`_FlushThread.claim_wakeup_fd`."""
        return self._thread.claim_wakeup_fd(ours)

    def close(self) -> None:
        """The bridge is shut down: end the flush thread (the handler stays, passing SIGTERM on).

        If a SIGTERM under the default handling came during the shutdown, the process dies of it now.
        """
        if self._dying:
            _die_of_sigterm()
        self._thread.stop()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        previous = _live(self.previous)
        final = not callable(previous)
        if final:
            # Default handling again: the flush thread's own SIGTERM, or a second one, ends the process.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._dying = True
        # Also while the bridge shuts down (not alive any more): the thread waits for that shutdown.
        asked = self._thread.ask(final)
        if callable(previous):
            previous(signum, frame)
        elif not asked:
            os.kill(os.getpid(), signal.SIGTERM)  # die of SIGTERM, as the default handling would have

    def _signalled(self) -> None:
        """In the flush thread, told by the wakeup fd that SIGTERM arrived: flush as the handler would have
        asked, without waiting for the main thread to run it; then, under the default handling, have the
        main thread run it (the process dies of SIGTERM)."""
        final = not callable(_live(self.previous))
        self._flush(final)
        if final:
            _wake_main_thread_to_die()


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
    handler.claim_wakeup_fd(_wakeup_fds(previous))
    return handler


def _wakeup_fds(handler: object) -> set[int]:
    """The wakeup fds of ``handler`` and the bridge handlers before it, gone or not (a new bridge takes theirs over)."""
    fds: set[int] = set()
    while isinstance(handler, SigtermHandler):
        fds.add(handler.wakeup_fd)
        handler = handler.previous
    return fds
