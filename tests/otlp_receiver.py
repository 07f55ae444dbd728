"""The loopback OTLP/HTTP trace receiver of every test suite and benchmark, and the span type it decodes.

* :class:`OtlpReceiver`: an OTLP/HTTP protobuf endpoint on 127.0.0.1 served by a
  thread of this process; it records every request, decodes accepted ones into
  :class:`ReceivedSpan` (lazily, so serving keeps up with tens of thousands of spans
  per second) and answers as scripted: a status, a list of answers for the next
  requests, a delay per request, a stall until an event is set. It also answers
  RL-Insight's discovery API, advertising itself.
* :class:`OtlpReceiverProcess`: the same receiver in a process of its own, as a trace
  backend is in production, so that its HTTP handling and decoding do not compete
  with the measured process for the GIL and the CPU (the benchmarks).

Importing this module needs only the standard library; ``opentelemetry-proto`` is
imported when a body is decoded. Import it as ``otlp_receiver`` with ``tests/`` on
``sys.path`` (the suites' conftest files and the benchmarks put it there).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import multiprocessing
import socket
import ssl
import threading
import time
import weakref
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from typing_extensions import Self

LOOPBACK = "127.0.0.1"
TRACES_PATH = "/v1/traces"
#: RL-Insight's discovery API, which the receiver answers with its own port as ``otlp_port``.
SERVICES_PATH = "/api/v1/services"
#: Bound on every wait of this module; never reached when things work.
WAIT_S = 15.0


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as decoded from an OTLP ``ExportTraceServiceRequest``.

    Ids are lowercase hex; ``parent_span_id`` is ``None`` for a root span.
    ``attributes`` and ``resource`` hold plain Python values (str, int, float,
    bool, bytes, lists of them, dicts for key-value lists). ``received_ns`` is
    ``time.perf_counter_ns()`` when the request carrying the span had been read
    (0 when decoded elsewhere); it takes no part in comparisons.
    """

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_time_ns: int
    end_time_ns: int
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    resource: dict[str, Any] = field(default_factory=dict)
    received_ns: int = field(default=0, compare=False)


def _any_value(value: Any) -> Any:
    """Convert an OTLP ``AnyValue`` message to a Python value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _key_values(value.kvlist_value.values)
    return getattr(value, kind)


def _key_values(items: Any) -> dict[str, Any]:
    """Convert repeated OTLP ``KeyValue`` messages to a dict."""
    return {item.key: _any_value(item.value) for item in items}


def decode_export_request(body: bytes, content_encoding: str = "", received_ns: int = 0) -> list[ReceivedSpan]:
    """Decode an OTLP/HTTP protobuf trace export body (optionally gzip/deflate)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    encoding = content_encoding.strip().lower()
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    elif encoding not in ("", "identity"):
        raise ValueError(f"unsupported Content-Encoding {content_encoding!r}")
    spans: list[ReceivedSpan] = []
    for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
        resource = _key_values(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        start_time_ns=int(span.start_time_unix_nano),
                        end_time_ns=int(span.end_time_unix_nano),
                        attributes=_key_values(span.attributes),
                        status_code=int(span.status.code),
                        status_message=span.status.message,
                        resource=resource,
                        received_ns=received_ns,
                    )
                )
    return spans


def as_received(span: Any) -> ReceivedSpan:
    """An OpenTelemetry SDK ``ReadableSpan`` (e.g. from a memory exporter) as a receiver would decode it
    (tuples become lists), so that spans kept in memory and spans received are read alike."""
    context = span.get_span_context()
    return ReceivedSpan(
        name=span.name,
        trace_id=format(context.trace_id, "032x"),
        span_id=format(context.span_id, "016x"),
        parent_span_id=format(span.parent.span_id, "016x") if span.parent is not None else None,
        start_time_ns=span.start_time,
        end_time_ns=span.end_time,
        attributes={key: list(v) if isinstance(v, tuple) else v for key, v in (span.attributes or {}).items()},
        status_code=int(span.status.status_code.value),  # the SDK's StatusCode has OTLP's numbers
        status_message=span.status.description or "",
        resource=dict(span.resource.attributes),
    )


@dataclass(frozen=True)
class Request:
    """One POST the receiver got: header names are lowercase; ``status`` is what it answered."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    received_ns: int
    """``time.perf_counter_ns()`` once the body had been read."""

    @property
    def size(self) -> int:
        return len(self.body)


#: A scripted answer: the status and the headers to send with it (e.g. ``(429, {"Retry-After": "1"})``).
Answer = tuple[int, Mapping[str, str]]
SpanPredicate = Callable[[list[ReceivedSpan]], Any]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as OTLP exporters expect
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.receiver._connected(self.connection)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        received_ns = time.perf_counter_ns()
        headers = {name.lower(): value for name, value in self.headers.items()}
        status, reply_headers = self.server.receiver._answer(self.path, headers, body, received_ns)
        reply = self.server.receiver.reply
        if reply is not None:
            answer = reply(headers, body)
        else:
            answer = b"" if status == 200 else b"backend says no"  # an empty ExportTraceServiceResponse is b""
        self.send_response(status)
        for name, value in reply_headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        self.close_connection = self.server.receiver.close_after_reply

    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "otlp_port": self.server.receiver.port}).encode()
        self.send_response(200 if self.path == SERVICES_PATH else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, receiver: OtlpReceiver) -> None:
        super().__init__((LOOPBACK, port), _Handler)
        self.receiver = receiver

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up breaks the pipe; the tests check what arrived

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.receiver._disconnected()


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1 (a stand-in for Tempo or RL-Insight's collector), served by a thread.

    Every POST is recorded (:attr:`requests`) and answered, in this order of
    precedence: the next of ``answers``; else :attr:`status`. Before answering, a
    handler waits ``delay_s`` (a slow destination) and, with ``stall``, until that
    event is set (bounded by :data:`WAIT_S`). Only requests answered 200 count as
    received spans. With ``close_after_reply`` the connection is dropped after each
    answer without saying so (no ``Connection: close``), like a server whose idle
    timeout fired; ``tls`` serves HTTPS with that context; ``reply(headers, body)``,
    when given, makes each answer's body (else empty for 200, ``backend says no`` otherwise).

    It serves from construction until :meth:`stop`, which also cuts established
    connections, as a backend going down does (start another on the same ``port``
    to bring it back). Use as a context manager, or call :meth:`stop`.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        status: int = 200,
        answers: Iterable[Answer] = (),
        delay_s: float = 0.0,
        stall: threading.Event | None = None,
        close_after_reply: bool = False,
        tls: ssl.SSLContext | None = None,
        reply: Callable[[dict[str, str], bytes], bytes] | None = None,
    ) -> None:
        self.status = status
        self.reply = reply
        self.answers: list[Answer] = list(answers)
        self.delay_s = delay_s
        self.stall = stall
        self.close_after_reply = close_after_reply
        self.connections = 0
        """Connections accepted so far."""
        self.closed = 0
        """Connections closed so far (by either side)."""
        self._lock = threading.Lock()  # guards requests, the answers and the counters
        self._decoded_lock = threading.Lock()  # guards the decoded spans
        self._requests: list[Request] = []
        self._decoded = 0  # requests decoded so far
        self._spans: list[ReceivedSpan] = []
        self._errors: list[str] = []
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._server = _Server(port, self)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = int(self._server.server_address[1])
        scheme = "https" if tls is not None else "http"
        self.base_url = f"{scheme}://{LOOPBACK}:{self.port}"
        """The server's root, e.g. for ``RL_INSIGHT_SERVER_URL`` (the discovery API advertises this receiver)."""
        self.url = self.base_url + TRACES_PATH
        """The OTLP/HTTP traces endpoint."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"otlp-receiver-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def _connected(self, connection: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self._sockets.add(connection)

    def _disconnected(self) -> None:
        with self._lock:
            self.closed += 1

    def _answer(self, path: str, headers: dict[str, str], body: bytes, received_ns: int) -> Answer:
        if self.delay_s:
            time.sleep(self.delay_s)  # the destination's own slowness, not a wait of the test
        if self.stall is not None:
            self.stall.wait(WAIT_S)
        with self._lock:
            status, reply_headers = self.answers.pop(0) if self.answers else (self.status, {})
            self._requests.append(Request(path, headers, body, status, received_ns))
        return status, reply_headers

    @property
    def requests(self) -> list[Request]:
        """Every POST answered so far, in the order of the answers (``received_ns`` says when each arrived)."""
        with self._lock:
            return list(self._requests)

    @property
    def request_count(self) -> int:
        """How many requests were accepted (answered 200)."""
        return sum(request.status == 200 for request in self.requests)

    @property
    def rejected_count(self) -> int:
        """How many requests were answered with another status."""
        return sum(request.status != 200 for request in self.requests)

    def _drain(self) -> None:
        """Decode the requests accepted since the last call (outside the handlers' lock)."""
        with self._lock:
            pending = self._requests[self._decoded :]
            self._decoded = len(self._requests)
        for request in pending:
            if request.status != 200:
                continue
            try:
                self._spans += decode_export_request(
                    request.body, request.headers.get("content-encoding", ""), request.received_ns
                )
            except Exception as exc:  # noqa: BLE001 - reported by decode_errors and wait_for
                self._errors.append(f"{type(exc).__name__}: {exc}")

    @property
    def spans(self) -> list[ReceivedSpan]:
        """Every span of the accepted requests so far, decoded, in the order of :attr:`requests`."""
        return self._spans_since(0)

    def _spans_since(self, index: int) -> list[ReceivedSpan]:
        with self._decoded_lock:
            self._drain()
            return self._spans[index:]

    @property
    def decode_errors(self) -> list[str]:
        """Accepted bodies that could not be decoded, as ``"Type: message"`` strings."""
        with self._decoded_lock:
            self._drain()
            return list(self._errors)

    def clear(self) -> None:
        """Forget every request, span and decode error so far."""
        with self._decoded_lock, self._lock:
            self._requests.clear()
            self._decoded = 0
            self._spans.clear()
            self._errors.clear()

    def wait_for(
        self,
        expected: int | SpanPredicate,
        timeout_s: float = WAIT_S,
        *,
        where: Callable[[ReceivedSpan], bool] | None = None,
    ) -> list[ReceivedSpan]:
        """Wait until enough spans arrived, and return them.

        Args:
            expected: a span count (wait for at least that many) or a predicate
                called with the span list, truthy when done.
            timeout_s: bound on the wait; then ``AssertionError`` is raised with
                what did arrive.
            where: optional filter applied first; only matching spans are
                counted, passed to the predicate and returned.
        """
        if isinstance(expected, int):
            count = expected
            wanted = f"{count} spans"

            def done(spans: list[ReceivedSpan]) -> Any:
                return len(spans) >= count

        else:
            done, wanted = expected, getattr(expected, "__name__", "predicate")
        deadline = time.monotonic() + timeout_s
        seen, matching = 0, list[ReceivedSpan]()
        while True:
            new = self._spans_since(seen)  # only what is new: a wait for 100,000 spans stays linear
            seen += len(new)
            matching += [span for span in new if where(span)] if where is not None else new
            if done(matching):
                return matching
            if time.monotonic() >= deadline:
                names = Counter(span.name for span in self.spans).most_common(8)
                raise AssertionError(
                    f"timed out after {timeout_s:g}s waiting for {wanted}; {len(matching)} matching of "
                    f"{seen} received in {self.request_count} accepted requests; top names {names}; "
                    f"decode errors {self.decode_errors[:3]}"
                )
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop accepting, cut every open connection and close the socket (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=WAIT_S)
        self._server.server_close()
        for connection in list(self._sockets):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Arrivals(NamedTuple):
    """What :meth:`OtlpReceiverProcess.wait_arrivals` saw."""

    count: int
    """Matching spans received."""
    last_received_ns: int | None
    """``time.perf_counter_ns()`` (``CLOCK_MONOTONIC`` on Linux, one clock for every process) of the last one."""


class OtlpReceiverProcess:
    """An :class:`OtlpReceiver` in a (spawned) process of its own, queried over a pipe.

    For measurements: a trace backend is another process in production, and served
    from the measured process its HTTP handling and decoding would compete with the
    exporters' threads for the GIL and the CPU. Takes :class:`OtlpReceiver`'s
    options that can cross a process boundary (``port``, ``status``, ``answers``,
    ``delay_s``). Every call is bounded in time; the receiver process exits as soon
    as the pipe closes (:meth:`stop`, or this process ending in any way).
    """

    def __init__(self, *, start_timeout_s: float = 60.0, **options: Any) -> None:
        """Start the process and wait (``start_timeout_s``: a fresh interpreter) until it listens."""
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_serve_in_process, args=(child_conn, options), name="otlp-receiver", daemon=True
        )
        self._process.start()
        child_conn.close()  # so that this end sees EOF if the receiver process dies
        try:
            self.port: int = self._reply(start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.url = f"http://{LOOPBACK}:{self.port}{TRACES_PATH}"

    def wait_arrivals(
        self, expected: int, timeout_s: float = WAIT_S, *, attribute: tuple[str, Any] | None = None
    ) -> Arrivals:
        """Wait (bounded) for ``expected`` spans (with ``attribute``'s key and value); return what arrived."""
        self._conn.send(("wait", expected, timeout_s, attribute))
        return Arrivals(*self._reply(timeout_s + WAIT_S))

    @property
    def request_count(self) -> int:
        """Requests accepted so far."""
        return int(self._ask(("requests",)))

    @property
    def span_count(self) -> int:
        """Spans received so far."""
        return int(self._ask(("spans",)))

    def count_without(self, key: str) -> int:
        """Spans received so far without attribute ``key``."""
        return int(self._ask(("without", key)))

    def stop(self) -> None:
        """Close the pipe (the process then exits); kill it if it has not within a bound."""
        self._conn.close()
        self._process.join(WAIT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(WAIT_S)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ask(self, query: tuple[Any, ...]) -> Any:
        self._conn.send(query)
        return self._reply(WAIT_S)

    def _reply(self, timeout_s: float) -> Any:
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the receiver process did not answer within {timeout_s:.0f} s")
        try:
            return self._conn.recv()
        except EOFError:
            raise RuntimeError("the receiver process exited") from None


def _serve_in_process(conn: Connection, options: dict[str, Any]) -> None:
    """:class:`OtlpReceiverProcess`'s process: serve, send the port, answer queries until the pipe closes."""
    with OtlpReceiver(**options) as receiver:
        conn.send(receiver.port)
        while True:
            try:
                query = conn.recv()
            except EOFError:
                return
            if query[0] == "requests":
                conn.send(receiver.request_count)
            elif query[0] == "spans":
                conn.send(len(receiver.spans))
            elif query[0] == "without":
                conn.send(sum(query[1] not in span.attributes for span in receiver.spans))
            else:
                _, expected, timeout_s, attribute = query
                conn.send(_arrivals(receiver, expected, timeout_s, attribute))


def _arrivals(receiver: OtlpReceiver, expected: int, timeout_s: float, attribute: tuple[str, Any] | None) -> Arrivals:
    def matches(span: ReceivedSpan) -> bool:
        return attribute is None or span.attributes.get(attribute[0]) == attribute[1]

    with contextlib.suppress(AssertionError):  # a short count is the answer, not an error
        receiver.wait_for(expected, timeout_s, where=matches)
    spans = [span for span in receiver.spans if matches(span)]
    return Arrivals(len(spans), max((span.received_ns for span in spans), default=None))
