"""Sending OTLP/HTTP: OtlpHttpSender (one POST per batch, kept-alive connections, OpenTelemetry's env
settings, clear errors) and the RL-Insight OtlpTransport built on it."""

from __future__ import annotations

import gzip
import os
import shutil
import ssl
import subprocess
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from verl_otel_bridge.otlp_http import OtlpHttpSender, OtlpSendError, parse_headers
from verl_otel_bridge.rl_insight.exporter import forwarded_attributes
from verl_otel_bridge.rl_insight.otlp import OtlpTransport

from .helpers import OtlpSink


def test_posts_protobuf_bodies_over_one_kept_alive_connection(serve: Any) -> None:
    receiver = serve(OtlpSink())
    sender = OtlpHttpSender(receiver.url, timeout_s=5)
    for n in range(3):
        sender.send(f"batch {n}".encode())
    sender.close()
    assert [r["body"] for r in receiver.requests] == [b"batch 0", b"batch 1", b"batch 2"]
    assert {r["path"] for r in receiver.requests} == {"/v1/traces"}
    assert receiver.requests[0]["headers"]["content-type"] == "application/x-protobuf"
    assert receiver.connections == 1


def test_a_connection_the_server_closed_is_replaced_without_posting_twice(serve: Any) -> None:
    receiver = serve(OtlpSink(close_after_reply=True))
    sender = OtlpHttpSender(receiver.url, timeout_s=5)
    for n in range(4):
        sender.send(f"batch {n}".encode())
        # The server closes after answering; the next send must notice before writing.
        deadline = time.monotonic() + 5
        while receiver.closed <= n and time.monotonic() < deadline:
            time.sleep(0.001)
    assert [r["body"] for r in receiver.requests] == [f"batch {n}".encode() for n in range(4)]
    assert receiver.connections == 4


@pytest.mark.parametrize(("compression", "decompress"), [("gzip", gzip.decompress), ("deflate", zlib.decompress)])
def test_compression_and_headers_come_from_opentelemetrys_variables(
    serve: Any, compression: str, decompress: Any
) -> None:
    receiver = serve(OtlpSink())
    environ = {
        "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression.upper(),
        "OTEL_EXPORTER_OTLP_HEADERS": "x-general=1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=Bearer%20t0ken, x-tenant = team-a",
    }
    sender = OtlpHttpSender.from_environment(receiver.url, timeout_s=5, environ=environ)
    sender.send(b"payload" * 100)
    (request,) = receiver.requests
    assert decompress(request["body"]) == b"payload" * 100
    assert request["headers"]["content-encoding"] == compression
    assert request["headers"]["authorization"] == "Bearer t0ken"
    assert request["headers"]["x-tenant"] == "team-a"
    assert "x-general" not in request["headers"]  # the traces-specific variable wins, as in OpenTelemetry


def test_general_variables_apply_when_no_traces_variable_is_set(serve: Any) -> None:
    receiver = serve(OtlpSink())
    environ = {"OTEL_EXPORTER_OTLP_HEADERS": "x-general=1", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    OtlpHttpSender.from_environment(receiver.url, timeout_s=5, environ=environ).send(b"x")
    (request,) = receiver.requests
    assert request["headers"]["x-general"] == "1" and gzip.decompress(request["body"]) == b"x"


def test_an_error_answer_is_quoted(serve: Any) -> None:
    receiver = serve(OtlpSink(status=503))
    sender = OtlpHttpSender(receiver.url, timeout_s=5)
    with pytest.raises(OtlpSendError, match=r"answered 503 .*backend says no"):
        sender.send(b"x")
    receiver.status = 200
    sender.send(b"y")  # the connection is still usable after an error answer
    assert [r["body"] for r in receiver.requests] == [b"x", b"y"]


def test_no_listener_is_a_send_error() -> None:
    receiver = OtlpSink()
    url = receiver.url
    receiver.server_close()  # the port is free again: nothing listens there
    with pytest.raises(OtlpSendError, match="ConnectionRefusedError"):
        OtlpHttpSender(url, timeout_s=2).send(b"x")


def test_an_endpoint_that_never_answers_times_out(serve: Any) -> None:
    release = threading.Event()
    receiver = serve(OtlpSink(hang=release))
    sender = OtlpHttpSender(receiver.url, timeout_s=0.3)
    started = time.monotonic()
    try:
        with pytest.raises(OtlpSendError, match="timed out"):
            sender.send(b"x")
        assert time.monotonic() - started < 5
    finally:
        release.set()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"endpoint": "ftp://host/v1/traces"}, "is not an http"),
        ({"endpoint": "http:///v1/traces"}, "is not an http"),
        ({"compression": "brotli"}, "compression 'brotli' is not one of none, gzip, deflate"),
    ],
)
def test_bad_settings_raise_with_the_fix(settings: dict[str, str], message: str) -> None:
    arguments: dict[str, Any] = {"endpoint": "http://127.0.0.1:4318/v1/traces", **settings}
    endpoint = arguments.pop("endpoint")
    with pytest.raises(ValueError, match=message):
        OtlpHttpSender(endpoint, **arguments)


def test_a_bad_compression_variable_is_named() -> None:
    with pytest.raises(ValueError, match=r"OTEL_EXPORTER_OTLP_\[TRACES_\]COMPRESSION='zstd'"):
        OtlpHttpSender.from_environment(
            "http://127.0.0.1:1/v1/traces", timeout_s=1, environ={"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}
        )


def test_header_parsing_follows_opentelemetrys_format(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_headers("a=1,b=x%3Dy, c = two words ,,") == {"a": "1", "b": "x=y", "c": "two words"}
    assert parse_headers("novalue,=empty-key,ok=1") == {"ok": "1"}
    assert sum("is not key=value" in r.getMessage() for r in caplog.records) == 2


# ------------------------------------------------------------------------ TLS


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command line."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def _tls_receiver(cert: Path, key: Path) -> OtlpSink:
    receiver = OtlpSink()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    receiver.socket = context.wrap_socket(receiver.socket, server_side=True)
    receiver.url = receiver.url.replace("http://", "https://")
    return receiver


def test_https_trusts_the_certificate_opentelemetrys_variable_names(serve: Any, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    receiver = serve(_tls_receiver(cert, key))
    with pytest.raises(OtlpSendError, match="CERTIFICATE_VERIFY_FAILED"):
        OtlpHttpSender(receiver.url, timeout_s=5).send(b"untrusted")
    environ = {"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(cert)}
    OtlpHttpSender.from_environment(receiver.url, timeout_s=5, environ=environ).send(b"trusted")
    assert [r["body"] for r in receiver.requests] == [b"trusted"]


def test_a_missing_certificate_file_is_a_send_error_not_a_crash(tmp_path: Path) -> None:
    environ = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(tmp_path / "absent.pem")}
    sender = OtlpHttpSender.from_environment("https://127.0.0.1:1/v1/traces", timeout_s=1, environ=environ)
    with pytest.raises(OtlpSendError, match="FileNotFoundError"):
        sender.send(b"x")


# ------------------------------------------------------------- the RL-Insight transport


def _two_spans() -> list[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("agent_session", attributes={"project": "mine", "global_steps": 3}):
        with tracer.start_as_current_span("agent_turn", attributes={"turn": 1}):
            pass
    return list(exporter.get_finished_spans())


def test_the_transport_sends_what_the_hub_would_with_the_variables_applied(serve: Any) -> None:
    receiver = serve(OtlpSink())
    server_url = receiver.url.removesuffix("/v1/traces")
    environ = {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-team=rl", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    transport = OtlpTransport(
        server_url, namespace="ns", labels={"project": "p", "experiment_name": "e"}, environ=environ
    )
    assert transport.available() and transport.endpoint == receiver.url
    spans = _two_spans()
    assert transport.send(spans, [forwarded_attributes(span) for span in spans])
    (request,) = receiver.requests
    assert request["headers"]["x-team"] == "rl"
    message = ExportTraceServiceRequest.FromString(gzip.decompress(request["body"]))
    (resource_spans,) = message.resource_spans
    assert {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}["service.name"] == "ns"
    sent = {span.name: span for span in resource_spans.scope_spans[0].spans}
    turn = {kv.key: kv.value for kv in sent["agent_turn"].attributes}
    session = {kv.key: kv.value for kv in sent["agent_session"].attributes}
    assert turn["process_id"].string_value == str(os.getpid())
    assert turn["project"].string_value == "p" and session["project"].string_value == "mine"  # the span's own wins
    assert session["global_steps"].int_value == 3 and turn["turn"].int_value == 1
    assert sent["agent_turn"].parent_span_id == sent["agent_session"].span_id  # a real link, not a root
    assert turn["otel.parent_span_id"].string_value == sent["agent_session"].span_id.hex()


def test_a_refused_batch_reports_why_and_waits_for_the_backoff(serve: Any) -> None:
    receiver = serve(OtlpSink(status=503))
    transport = OtlpTransport(receiver.url.removesuffix("/v1/traces"), environ={})
    assert transport.available()
    spans = _two_spans()
    assert transport.send(spans, [forwarded_attributes(span) for span in spans]) is False
    assert transport.last_error is not None and "503" in transport.last_error
    assert transport.available() is False  # retried after the backoff (1 s, doubling), not on the next batch
