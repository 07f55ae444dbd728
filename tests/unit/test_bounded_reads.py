"""Everything read from a destination is bounded in total time and in bytes, however it answers.

Two loopback receivers misbehave: one sends its answer one byte every 0.5 s (each
byte well within a socket timeout), one sends an endless body. The OTLP sender
(exporter ``otlp`` and RL-Insight's direct transport) and RL-Insight's discovery
must give up within their timeout, read a bounded number of bytes, and fail the
export, so the destination is marked down and the batch spilled.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.otlp.deadline import MAX_ANSWER_BYTES
from verl_otel_bridge._internal.otlp.sender import OtlpHttpSender, OtlpSendError
from verl_otel_bridge._internal.otlp.settings import SenderSettings
from verl_otel_bridge._internal.rl_insight.otlp import fetch_services

from .helpers import wait_until

TIMEOUT_S = 1.0
#: Allowed past the timeout: scheduling on a loaded machine, never another dribbled byte's worth of waits.
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Hostile(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.stop = threading.Event()
        self.sent = 0
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(socketserver.StreamRequestHandler):
    server: Hostile

    def handle(self) -> None:
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        self.rfile.read(length)
        try:
            if self.server.behaviour == "dribble":
                for byte in ANSWER:
                    if self.server.stop.wait(0.5):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
            else:  # an endless body, as fast as the connection takes it
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n")
                chunk = b"x" * 65536
                while not self.server.stop.is_set():
                    self.wfile.write(chunk)
                    self.server.sent += len(chunk)
        except OSError:
            return  # the client cut the connection: what the bounds are for


@pytest.fixture(params=["dribble", "endless"])
def hostile(request: pytest.FixtureRequest) -> Iterator[Hostile]:
    server = Hostile(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stop.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


def bounded(call: Callable[[], Any]) -> BaseException:
    """The error ``call`` ends with (the test fails if it returns, and pytest's timeout if it never ends)."""
    with pytest.raises((OtlpSendError, OSError)) as raised:
        call()
    return raised.value


def test_an_otlp_export_gives_up_within_its_timeout_with_a_bounded_read(hostile: Hostile) -> None:
    sender = OtlpHttpSender(f"{hostile.url}/v1/traces", SenderSettings(timeout_s=TIMEOUT_S))
    try:
        error = bounded(lambda: sender.send(b"\x00" * 100))
    finally:
        sender.close()
    if hostile.behaviour == "endless":
        assert f"larger than {MAX_ANSWER_BYTES} bytes" in str(error)
        assert hostile.sent < 64 * MAX_ANSWER_BYTES  # what the socket buffers held besides, not a gigabyte
    else:
        assert "export deadline" in str(error)


def test_rl_insight_discovery_gives_up_within_its_timeout_with_a_bounded_read(hostile: Hostile) -> None:
    error = bounded(lambda: fetch_services(hostile.url, TIMEOUT_S))
    if hostile.behaviour == "endless":
        assert "larger than" in str(error)
    else:  # given up at the deadline, not when the server stopped
        assert f"no whole answer within {TIMEOUT_S} s" in str(error) and not hostile.stop.is_set(), error


def test_a_destination_that_dribbles_is_marked_down_and_the_batch_spilled(
    hostile: Hostile, make_bridge: Callable[..., Bridge], monkeypatch: pytest.MonkeyPatch
) -> None:
    bridge = make_bridge(
        exporter="otlp", otlp_endpoint=f"{hostile.url}/v1/traces", otlp_timeout_s=TIMEOUT_S, schedule_delay_ms=10
    )
    with bridge.span("s"):
        pass
    wait_until(lambda: bridge.status()["counters"]["spilled"] == 1, what="the batch spilled")
    assert bridge.status()["exporters"]["otlp"]["last_error"]
