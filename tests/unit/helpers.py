"""Small helpers shared by the unit tests."""

from __future__ import annotations

import http.server
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from otlp_spans import ReceivedSpan, decode_export_request

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.identity import IDENTITY_KEYS
from verl_otel_bridge._internal.rl_insight.otlp import SERVICES_PATH

#: Upper bound for any wait on another thread; never reached when things work.
WAIT_S = 10.0
#: A plausible span time in nanoseconds.
T0 = 1_700_000_000_123_456_789

#: ``record_span`` times it refuses: (start, end, a phrase of the one WARNING for this kind).
INVALID_TIMES: list[tuple[Any, Any, str]] = [
    (T0, T0 - 1, "end before start"),
    (-5, T0, "negative time"),
    (T0, -1, "negative time"),
    (int(time.time()), int(time.time()) + 1, "look like seconds or milliseconds"),
    (time.time(), time.time() + 0.5, "look like seconds or milliseconds"),
    (int(time.time() * 1000), int(time.time() * 1000) + 5, "look like seconds or milliseconds"),
    (str(T0), T0, "integer nanoseconds"),
    (None, T0, "integer nanoseconds"),
    (T0, [T0], "integer nanoseconds"),
    (True, T0, "integer nanoseconds"),
    (math.nan, T0, "integer nanoseconds"),
    (T0, math.inf, "integer nanoseconds"),
    (-math.inf, T0, "integer nanoseconds"),
]

#: On a test that forks a process with the bridge's threads running, on purpose: Python 3.12+
#: warns that such a child may deadlock; what the child may touch is what the test checks.
forks_on_purpose = pytest.mark.filterwarnings(
    r"ignore:This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks:DeprecationWarning"
)


def wait_until(predicate: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def run_threads(targets: Iterable[Callable[[], object]], timeout_s: float = WAIT_S) -> list[BaseException]:
    """Run each target on a thread of its own, all started before any is joined; wait (``timeout_s`` in
    all) for every one to end, and return what they raised."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    return errors


def identity_of(span: ReadableSpan | Mapping[str, Any]) -> dict[str, Any]:
    """The identity keys present on a span (SDK span or forwarded attribute dict)."""
    attributes = span if isinstance(span, Mapping) else dict(span.attributes or {})
    return {key: attributes[key] for key in IDENTITY_KEYS if key in attributes}


def finished(bridge: Bridge) -> list[ReadableSpan]:
    """Flush ``bridge`` and return what its memory exporter (primary or fallback) holds."""
    assert bridge.force_flush(WAIT_S)
    assert bridge.memory_exporter is not None
    return list(bridge.memory_exporter.get_finished_spans())


def named(spans: Iterable[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"expected one {name!r}, got {[s.name for s in spans]}"
    return found[0]


def assert_balanced(bridge: Bridge) -> dict[str, Any]:
    """Flush and check every ended span landed in exactly one bucket; returns the counters."""
    bridge.force_flush(WAIT_S)
    counters = bridge.status()["counters"]
    assert balance(counters) == 0, counters
    return counters


def span_count(bridge: Bridge) -> int:
    return bridge.status()["counters"]["ended"]


class OtlpSink(http.server.ThreadingHTTPServer):
    """A loopback OTLP/HTTP endpoint (and RL-Insight-like discovery API advertising it) that
    records every request and answers ``status``; serve it with the ``serve`` fixture.

    With ``close_after_reply`` it drops the connection after each answer without
    saying so (no ``Connection: close``), like a server whose idle timeout fired.
    ``answers`` are ``(status, headers)`` for the next POSTs in turn (e.g. a 429
    with ``Retry-After``); after them, ``status``. Each recorded request has its
    arrival time (``time.monotonic()``) and body size.
    """

    daemon_threads = True

    def __init__(
        self,
        *,
        status: int = 200,
        close_after_reply: bool = False,
        hang: threading.Event | None = None,
        answers: Iterable[tuple[int, Mapping[str, str]]] = (),
        port: int = 0,
    ):
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.closed = 0
        self.status = status
        self.answers = list(answers)
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                receiver.connections += 1

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if hang is not None:
                    hang.wait(10)
                status, headers = receiver.answers.pop(0) if receiver.answers else (receiver.status, {})
                receiver.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "size": len(body),
                        "time": time.monotonic(),
                        "status": status,
                    }
                )
                answer = b"" if status == 200 else b"backend says no"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                self.close_connection = close_after_reply

            def do_GET(self) -> None:  # also RL-Insight's discovery API, advertising this server
                body = json.dumps({"status": "ok", "otlp_port": receiver.server_address[1]}).encode()
                self.send_response(200 if self.path == SERVICES_PATH else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def spans(self, *, accepted_only: bool = False) -> list[ReceivedSpan]:
        """Every span received so far (only in requests answered 200: ``accepted_only``), decoded, in arrival order."""
        received = []
        for request in self.requests:
            if accepted_only and request["status"] != 200:
                continue
            received += decode_export_request(request["body"], request["headers"].get("content-encoding", ""))
        return received

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (the timeout test) breaks the pipe; the tests check what arrived

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.closed += 1
