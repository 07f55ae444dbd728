"""Reading from a destination bounded in total time and in bytes, not only per socket read.

A socket timeout bounds each read: a server that sends its answer one byte at a
time, each before the timeout, keeps a request going for as long as it likes.
:class:`Deadline` bounds the whole request: connections made or reused while it
is current register their socket with it, and when it expires a timer thread
shuts that socket down, which ends any read or write in progress with an error.
Answers are read at most :data:`MAX_ANSWER_BYTES` (status line and headers are
bounded by ``http.client`` itself).
"""

from __future__ import annotations

import contextlib
import contextvars
import http.client
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

#: Bytes of an answer's body read at most; an OTLP answer is a few bytes, RL-Insight's services a few hundred.
MAX_ANSWER_BYTES = 1024 * 1024


class AnswerTooLarge(OSError):
    """The destination's answer was longer than :data:`MAX_ANSWER_BYTES`."""


_CURRENT: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("verl_otel_bridge.deadline", default=None)


class Deadline:
    """The end of one request, as a ``time.monotonic()`` time; see the module docstring."""

    def __init__(self, end: float) -> None:
        self.end = end
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def watch(self, sock: socket.socket | None) -> None:
        """Shut ``sock`` down when the deadline passes (at once if it has)."""
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    @contextmanager
    def current(self) -> Iterator[Deadline]:
        """Make this the deadline of the connections used in the block (in this thread)."""
        timer = threading.Timer(max(0.0, self.end - time.monotonic()), self._expire)
        timer.daemon = True
        timer.start()
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)
            timer.cancel()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


def watch_current(sock: socket.socket | None) -> None:
    """Register ``sock`` with the current :class:`Deadline`, if there is one."""
    deadline = _CURRENT.get()
    if deadline is not None:
        deadline.watch(sock)


def watched(base: Any) -> Any:
    """A subclass of the HTTP(S) connection class ``base`` (``http.client`` or urllib3) whose socket the
    current :class:`Deadline` watches, whether the connection is made or reused."""

    class Watched(base):  # type: ignore[misc]
        def connect(self) -> None:
            super().connect()
            watch_current(self.sock)

        def request(self, *args: Any, **kwargs: Any) -> Any:
            watch_current(self.sock)
            return super().request(*args, **kwargs)

    Watched.__name__ = Watched.__qualname__ = f"Watched{base.__name__}"
    return Watched


def read_bounded(read: Any, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """``read(limit + 1)``, the body of an answer.

    Raises:
        AnswerTooLarge: there was more than ``limit`` bytes.
    """
    data: bytes = read(limit + 1)
    if len(data) > limit:
        raise AnswerTooLarge(f"the answer is larger than {limit} bytes")
    return data


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTP, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTPS, req, context=self._context)  # type: ignore[attr-defined]


_WatchedHTTP = watched(http.client.HTTPConnection)
_WatchedHTTPS = watched(http.client.HTTPSConnection)


def get_bounded(url: str, headers: Mapping[str, str], timeout_s: float) -> bytes:
    """``GET url`` with urllib (proxies from the environment), within ``timeout_s`` in all, at most
    :data:`MAX_ANSWER_BYTES` of body.

    Raises:
        OSError: no answer within ``timeout_s`` (the connection was cut), a refused
            answer (``urllib.error.HTTPError``), or :class:`AnswerTooLarge`.
    """
    request = urllib.request.Request(url, headers=dict(headers))  # noqa: S310
    opener = urllib.request.build_opener(_HTTPHandler, _HTTPSHandler)
    deadline = Deadline(time.monotonic() + timeout_s)
    try:
        with deadline.current(), opener.open(request, timeout=timeout_s) as response:
            return read_bounded(response.read)
    except (OSError, http.client.HTTPException) as exc:  # HTTPException: e.g. a status line cut by the deadline
        if deadline.expired and not isinstance(exc, AnswerTooLarge):
            raise TimeoutError(f"no whole answer within {timeout_s} s") from exc
        if isinstance(exc, OSError):
            raise
        raise OSError(f"{type(exc).__name__}: {exc}") from exc
