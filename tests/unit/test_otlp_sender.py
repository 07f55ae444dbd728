"""Sending OTLP/HTTP: OtlpHttpSender (kept-alive connections, retries within a deadline, OpenTelemetry's
env settings, clear errors), the otlp destination (size-limited requests) and the RL-Insight OtlpTransport."""

from __future__ import annotations

import gzip
import itertools
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import OtlpReceiver

import verl_otel_bridge as vob
from verl_otel_bridge import BridgeConfig
from verl_otel_bridge._internal.otlp.exporter import OtlpDestination
from verl_otel_bridge._internal.otlp.sender import MAX_ATTEMPTS, OtlpHttpSender, OtlpSendError
from verl_otel_bridge._internal.otlp.settings import DEFAULT_ENDPOINT, SenderSettings
from verl_otel_bridge._internal.rl_insight.exporter import forwarded_attributes
from verl_otel_bridge._internal.rl_insight.otlp import OtlpTransport, otlp_settings
from verl_otel_bridge._version import install_command

from .helpers import WAIT_S, StartReceiver, wait_until


def sender(url: str, timeout_s: float = 5, **settings: Any) -> OtlpHttpSender:
    return OtlpHttpSender(url, SenderSettings(timeout_s=timeout_s, **settings))


def sender_from(url: str, environ: dict[str, str]) -> OtlpHttpSender:
    """A sender for ``url`` configured from ``environ``'s ``OTEL_EXPORTER_OTLP_*`` and proxy variables."""
    return OtlpHttpSender.of(url, BridgeConfig.resolve(environ=environ), environ=environ)


def settings_from(environ: dict[str, str]) -> SenderSettings:
    return SenderSettings.of(BridgeConfig.resolve(environ=environ), environ=environ)


def otlp_from(environ: dict[str, str], endpoint: str | None = None) -> OtlpDestination:
    """The ``otlp`` destination configured from ``environ`` (and ``otlp_endpoint``, when given)."""
    explicit = {"otlp_endpoint": endpoint} if endpoint is not None else {}
    config = BridgeConfig.resolve(environ=environ, exporter="otlp", **explicit)
    return OtlpDestination(OtlpHttpSender.of(config.otlp_endpoint or DEFAULT_ENDPOINT, config, environ=environ))


def transport_from(server_url: str, environ: dict[str, str], **given: Any) -> OtlpTransport:
    """RL-Insight's OTLP transport configured from ``environ``."""
    settings = otlp_settings(BridgeConfig.resolve(environ=environ, rl_insight_transport="otlp"))
    assert settings is not None
    return OtlpTransport(server_url, settings, environ=environ, **given)


def test_posts_protobuf_bodies_over_one_kept_alive_connection(start_receiver: StartReceiver) -> None:
    receiver = start_receiver()
    posting = sender(receiver.url)
    for n in range(3):
        posting.send(f"batch {n}".encode())
    posting.close()
    assert [r.body for r in receiver.requests] == [b"batch 0", b"batch 1", b"batch 2"]
    assert {r.path for r in receiver.requests} == {"/v1/traces"}
    assert receiver.requests[0].headers["content-type"] == "application/x-protobuf"
    assert receiver.requests[0].headers["user-agent"] == f"verl-otel-bridge/{vob.__version__}"
    assert receiver.connections == 1


def test_a_connection_the_server_closed_is_replaced_without_posting_twice(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(close_after_reply=True)
    posting = sender(receiver.url)
    for n in range(4):
        posting.send(f"batch {n}".encode())
        # The server closes after answering; the next send must notice before writing.
        wait_until(lambda: receiver.closed > n, what="the server to close the connection")
    assert [r.body for r in receiver.requests] == [f"batch {n}".encode() for n in range(4)]
    assert receiver.connections == 4


@pytest.mark.parametrize(("compression", "decompress"), [("gzip", gzip.decompress), ("deflate", zlib.decompress)])
def test_compression_and_headers_come_from_opentelemetrys_variables(
    start_receiver: StartReceiver, compression: str, decompress: Any
) -> None:
    receiver = start_receiver()
    environ = {
        "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression.upper(),
        "OTEL_EXPORTER_OTLP_HEADERS": "x-general=1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20t0ken, x-tenant = team-a",
    }
    sender_from(receiver.url, environ).send(b"payload" * 100)
    (request,) = receiver.requests
    assert decompress(request.body) == b"payload" * 100
    assert request.size < 700  # compressed on the wire
    assert request.headers["content-encoding"] == compression
    assert request.headers["authorization"] == "Bearer t0ken"  # URL-decoded
    assert request.headers["x-tenant"] == "team-a"
    assert "x-general" not in request.headers  # the traces-specific variable wins, as in OpenTelemetry


def test_general_variables_apply_when_no_traces_variable_is_set(start_receiver: StartReceiver) -> None:
    receiver = start_receiver()
    environ = {"OTEL_EXPORTER_OTLP_HEADERS": "x-general=1", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    sender_from(receiver.url, environ).send(b"x")
    (request,) = receiver.requests
    assert request.headers["x-general"] == "1" and gzip.decompress(request.body) == b"x"


def test_an_error_answer_is_quoted_and_not_retried(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(status=400)
    posting = sender(receiver.url)
    with pytest.raises(OtlpSendError, match=r"answered 400 .*backend says no.*\(not retried\)") as raised:
        posting.send(b"x")
    assert raised.value.status == 400
    receiver.status = 200
    posting.send(b"y")  # the connection is still usable after an error answer
    assert [r.body for r in receiver.requests] == [b"x", b"y"]


def test_no_listener_is_a_send_error_after_bounded_retries() -> None:
    receiver = OtlpReceiver()
    url = receiver.url
    receiver.stop()  # the port is free again: nothing listens there
    with pytest.raises(OtlpSendError, match=r"Connection refused.*would pass the export deadline"):
        sender(url, timeout_s=2).send(b"x")  # the timeout bounds the retries: the next one would pass it


def test_an_endpoint_that_never_answers_times_out(start_receiver: StartReceiver) -> None:
    release = threading.Event()
    receiver = start_receiver(stall=release)
    try:
        with pytest.raises(OtlpSendError, match="no whole answer within the export deadline"):
            sender(receiver.url, timeout_s=0.3).send(b"x")
        assert not release.is_set()  # given up while the endpoint still holds the request
    finally:
        release.set()


# ------------------------------------------------------------------ retries


def test_429_and_503_are_retried_after_retry_after(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(answers=[(429, {"Retry-After": "1"}), (503, {"Retry-After": "0"})])
    sender(receiver.url).send(b"x")
    first, second, third = receiver.requests
    assert [r.body for r in receiver.requests] == [b"x"] * 3
    assert (second.received_ns - first.received_ns) / 1e9 >= 0.95  # waited as the 429 asked
    assert (third.received_ns - second.received_ns) / 1e9 < 0.9  # Retry-After: 0 wins over the backoff


def test_without_retry_after_the_backoff_grows_with_jitter(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(answers=[(503, {}), (502, {}), (504, {})])
    sender(receiver.url).send(b"x")
    times = [r.received_ns / 1e9 for r in receiver.requests]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(times) == 4
    # urllib3's schedule (backoff factor 0.5 s, jitter up to 0.5 s): at once, then 1-1.5 s, then 2-2.5 s
    assert gaps[0] < 0.5 and 0.95 <= gaps[1] < 1.5 + 0.5 and 1.95 <= gaps[2] < 2.5 + 0.5, gaps


def test_retries_stop_after_max_attempts(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(status=503, answers=[(503, {"Retry-After": "0"})] * 10)
    with pytest.raises(OtlpSendError, match=rf"answered 503 .*gave up after {MAX_ATTEMPTS} attempts"):
        sender(receiver.url).send(b"x")
    assert len(receiver.requests) == MAX_ATTEMPTS


def test_a_retry_after_beyond_the_deadline_fails_at_once(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(answers=[(503, {"Retry-After": "30"})])
    with pytest.raises(OtlpSendError, match=r"retry in 30.0 s would pass the export deadline"):
        sender(receiver.url, timeout_s=2).send(b"x")
    assert len(receiver.requests) == 1  # given up at once: no second attempt


def test_close_ends_a_wait_between_retries(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(answers=[(503, {"Retry-After": "20"})])
    posting = sender(receiver.url, timeout_s=60)
    errors: list[Exception] = []

    def send() -> None:
        try:
            posting.send(b"x")
        except OtlpSendError as exc:
            errors.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    wait_until(lambda: receiver.requests, what="the first attempt")
    posting.close()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(errors) == 1 and "shut down while waiting to retry" in str(errors[0])
    assert len(receiver.requests) == 1


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    ("environ", "explicit", "expected"),
    [
        ({}, None, "http://localhost:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, None, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318/base/"}, None, "https://c:4318/base/v1/traces"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://general:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1"},
            None,
            "http://t:1",  # the traces variable is used as it is: no path appended
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/custom"}, "http://explicit:2/x", "http://explicit:2/x"),
    ],
    ids=["default", "base-url", "base-url-with-path", "traces-as-is", "explicit-wins"],
)
def test_the_endpoint_follows_opentelemetrys_rules(
    environ: dict[str, str], explicit: str | None, expected: str
) -> None:
    exporter = otlp_from(environ, endpoint=explicit)
    assert exporter.sender.endpoint == expected


def test_the_timeout_is_read_in_seconds_the_traces_variable_first() -> None:
    assert settings_from({}).timeout_s == 10.0  # OpenTelemetry's default
    assert settings_from({"OTEL_EXPORTER_OTLP_TIMEOUT": "2.5"}).timeout_s == 2.5
    both = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2.5", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "7"}
    assert settings_from(both).timeout_s == 7.0


def test_the_timeout_variable_bounds_an_export(start_receiver: StartReceiver) -> None:
    release = threading.Event()
    receiver = start_receiver(stall=release)
    try:
        exporter = otlp_from({"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.3"}, endpoint=receiver.url)
        outcome = exporter.send(_two_spans())
        assert outcome.refused and "export deadline" in (outcome.reason or ""), outcome
        assert not release.is_set()  # given up while the endpoint still holds the request
    finally:
        release.set()


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"},
            r"OTEL_EXPORTER_OTLP_TIMEOUT = '10s' is not valid for 'otlp_timeout_s': expected a number of seconds",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0"},
            r"otlp_timeout_s=0.0 must be a positive.*OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        ),
        (
            {"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
            r"otlp_compression='zstd' is not one of: none, gzip.*OTEL_EXPORTER_OTLP_COMPRESSION",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318"},
            r"otlp_endpoint='colle.*http.*OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://c/"},
            r"otlp_endpoint='ftp://c/v1/traces' is not an http\(s\).*OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
            r"protocol='grpc'.*sends http/protobuf only.*OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
        (
            {"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem"},
            r"client_key='/k.pem' is set without a client certificate.*OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ),
        (
            {"OTEL_EXPORTER_OTLP_CERTIFICATE": "/absent.pem"},
            r"otlp_certificate='/absent.pem' cannot be.*OTEL_EXPORTER_OTLP_CERTIFICATE",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/absent.pem"},
            r"otlp_client_certificate='/absent.pem' cannot be loaded.*OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        ),
        (
            {"OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER": "mine"},
            r"CREDENTIAL_PROVIDER='mine'.*OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ),
    ],
)
def test_a_bad_variable_raises_at_construction_naming_it(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        otlp_from(environ)


def test_the_protocol_variable_may_say_http_protobuf() -> None:
    exporter = otlp_from({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert exporter.sender.endpoint == "http://localhost:4318/v1/traces"


def test_header_parsing_follows_opentelemetrys_format() -> None:
    parse = settings_from
    assert parse({"OTEL_EXPORTER_OTLP_HEADERS": "A=1,b=x%3Dy, c = two words ,,"}).headers == {
        "a": "1",
        "b": "x=y",
        "c": "two words",
    }


@pytest.mark.parametrize("text", ["novalue", "=empty-key", "bad name=1", "ok=1,Bearer s3cr3t-t0ken"])
def test_a_bad_header_entry_raises_without_showing_values(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"OTEL_EXPORTER_OTLP_TRACES_HEADERS = .*'otlp_headers'.*entry \d of \d"
    ) as raised:
        settings_from({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": text})
    assert "s3cr3t" not in str(raised.value) and "novalue" not in str(raised.value)


def test_header_values_and_url_passwords_never_show(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(status=401)
    url = receiver.url.replace("http://", "http://user:pa55word@")
    environ = {"OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cr3t-value"}
    posting = sender_from(url, environ)
    with pytest.raises(OtlpSendError) as raised:
        posting.send(b"x")
    shown = " ".join([repr(posting), repr(posting.settings), str(raised.value), posting.endpoint])
    assert "s3cr3t" not in shown and "pa55word" not in shown
    assert "x-api-key" in repr(posting.settings)
    (request,) = receiver.requests
    assert request.headers["x-api-key"] == "s3cr3t-value"
    assert request.headers["authorization"] == "Basic dXNlcjpwYTU1d29yZA=="  # user:pa55word, as requests sends it


def test_proxy_variables_are_honoured_unless_no_proxy_matches(start_receiver: StartReceiver) -> None:
    proxy = start_receiver()
    target = "http://127.0.0.1:9/v1/traces"  # nothing listens there: only the proxy can answer
    sender_from(target, {"HTTP_PROXY": proxy.base_url}).send(b"x")
    (request,) = proxy.requests
    assert request.path == target and request.body == b"x"  # a proxy request names the whole URL
    bypassing = {"http_proxy": proxy.base_url, "NO_PROXY": "127.0.0.1"}
    with pytest.raises(OtlpSendError, match="Connection refused"):
        sender_from(target, {**bypassing, "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5"}).send(b"y")
    assert len(proxy.requests) == 1


def test_exporter_otlp_needs_urllib3_and_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "urllib3", None)
    hint = re.escape(install_command("otlp"))
    with pytest.raises(vob.ConfigError, match=r"exporter 'otlp' needs urllib3>=2.*" + hint) as exporter:
        vob.configure(exporter="otlp")
    assert exporter.value.key == "exporter"
    with pytest.raises(vob.ConfigError, match=r"rl_insight_transport=otlp needs urllib3>=2.*" + hint) as transport:
        vob.configure(exporter="rl_insight", rl_insight_transport="otlp")
    assert transport.value.key == "rl_insight_transport"
    auto = vob.configure(exporter="rl_insight", rl_insight_transport="auto")  # auto: the hub, no error
    assert auto.status()["rl_insight_transport"] == "auto"


# ------------------------------------------------------------------------ TLS


def _self_signed(openssl: str, directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        pytest.skip("the openssl command is not installed")
    return found


@pytest.fixture
def certificate(tmp_path: Path, openssl: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command line."""
    return _self_signed(openssl, tmp_path, "server")


def _server_tls(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


def test_https_trusts_the_certificate_opentelemetrys_variable_names(
    start_receiver: StartReceiver, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    receiver = start_receiver(tls=_server_tls(cert, key))
    with pytest.raises(OtlpSendError, match="CERTIFICATE_VERIFY_FAILED"):
        sender(receiver.url).send(b"untrusted")
    environ = {"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(cert)}
    sender_from(receiver.url, environ).send(b"trusted")
    assert [r.body for r in receiver.requests] == [b"trusted"]


@pytest.mark.parametrize("key_apart", [True, False], ids=["CLIENT_KEY", "key-inside-certificate"])
def test_mutual_tls_sends_the_client_certificate_and_key(
    start_receiver: StartReceiver, certificate: tuple[Path, Path], openssl: str, tmp_path: Path, key_apart: bool
) -> None:
    cert, key = certificate
    client_cert, client_key = _self_signed(openssl, tmp_path, "client")
    receiver = start_receiver(tls=_server_tls(cert, key, client_ca=client_cert))
    trusted = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert), "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    with pytest.raises(OtlpSendError):
        sender_from(receiver.url, trusted).send(b"anonymous")  # the server wants a certificate
    if key_apart:
        mine = {
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(client_cert),
            "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(client_key),
        }
    else:
        combined = tmp_path / "combined.pem"
        combined.write_bytes(client_cert.read_bytes() + client_key.read_bytes())
        mine = {"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": str(combined)}
    sender_from(receiver.url, {**trusted, **mine}).send(b"known")
    assert [r.body for r in receiver.requests] == [b"known"]


def test_a_certificate_that_is_not_pem_raises_at_construction(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(
        ValueError, match=r"otlp_certificate='.*bogus.pem' cannot be loaded.*OTEL_EXPORTER_OTLP_CERTIFICATE"
    ):
        sender_from("https://127.0.0.1:1/v1/traces", {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(bogus)})


# --------------------------------------------------------- the span exporter


def _spans(count: int, payload: int = 0) -> list[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for i in range(count):
        with tracer.start_as_current_span(f"span-{i}", attributes={"i": i, "content": "x" * payload}):
            pass
    return list(exporter.get_finished_spans())


def _decoded(body: bytes) -> list[Any]:
    message = ExportTraceServiceRequest.FromString(body)
    return [span for rs in message.resource_spans for ss in rs.scope_spans for span in ss.spans]


def test_a_batch_over_the_size_limit_is_split_into_requests_under_it(start_receiver: StartReceiver) -> None:
    receiver = start_receiver()
    spans = _spans(20, payload=300)
    exporter = OtlpDestination(sender(receiver.url), max_request_bytes=2000)
    assert exporter.send(spans).accepted == len(spans)
    sizes = [r.size for r in receiver.requests]
    assert len(sizes) > 1 and max(sizes) <= 2000, sizes
    names = [span.name for r in receiver.requests for span in _decoded(r.body)]
    assert names == [span.name for span in spans]  # every span once, in order


def test_a_span_too_large_alone_is_left_out_and_the_rest_is_sent(
    start_receiver: StartReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = start_receiver()
    spans = [*_spans(2), *_spans(1, payload=5000), *_spans(2)]
    exporter = OtlpDestination(sender(receiver.url), max_request_bytes=2000)
    for _ in range(2):  # the rest is sent, and the destination says one span was left out (counted failed)
        outcome = exporter.send(spans)
        assert not outcome.refused and (outcome.accepted, outcome.left_out) == (4, 1)
    sent = [span.name for r in receiver.requests for span in _decoded(r.body)]
    assert sent == ["span-0", "span-1", "span-0", "span-1"] * 2
    warned = [r.getMessage() for r in caplog.records if "request limit" in r.getMessage()]
    assert len(warned) == 1 and "'span-0' alone encodes to" in warned[0]  # said once


def test_the_exporter_sends_gzip_requests_that_decode_to_the_spans(start_receiver: StartReceiver) -> None:
    receiver = start_receiver()
    exporter = otlp_from({"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}, endpoint=receiver.url)
    spans = _spans(5, payload=200)
    assert exporter.send(spans).accepted == 5
    (request,) = receiver.requests
    assert [s.name for s in _decoded(gzip.decompress(request.body))] == [s.name for s in spans]
    exporter.close()
    assert exporter.send(spans).refused  # after shutdown: refused, nothing sent
    assert len(receiver.requests) == 1


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


def test_the_transport_sends_what_the_hub_would_with_the_variables_applied(start_receiver: StartReceiver) -> None:
    receiver = start_receiver()
    server_url = receiver.base_url
    environ = {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-team=rl", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    transport = transport_from(server_url, environ, namespace="ns", labels={"project": "p", "experiment_name": "e"})
    assert transport.available() and transport.endpoint == receiver.url
    spans = _two_spans()
    assert transport.send(spans, [forwarded_attributes(span) for span in spans]).accepted == 2
    (request,) = receiver.requests
    assert request.headers["x-team"] == "rl"
    message = ExportTraceServiceRequest.FromString(gzip.decompress(request.body))
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


def test_a_refused_batch_reports_why_and_waits_for_the_backoff(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(status=400)
    transport = transport_from(receiver.base_url, {})
    assert transport.available()
    spans = _two_spans()
    assert transport.send(spans, [forwarded_attributes(span) for span in spans]).accepted == 0
    assert transport.last_error is not None and "400" in transport.last_error
    assert transport.available() is False  # retried after the backoff (1 s, doubling), not on the next batch


def test_a_split_batch_that_fails_part_way_says_how_many_were_delivered(start_receiver: StartReceiver) -> None:
    receiver = start_receiver(answers=[(200, {}), (400, {})])
    transport = transport_from(receiver.base_url, {})
    assert transport.available()
    transport._exporter.max_request_bytes = 2000  # type: ignore[union-attr]
    spans = _spans(20, payload=300)
    delivered = transport.send(spans, [forwarded_attributes(span) for span in spans]).accepted
    first = _decoded(receiver.requests[0].body)
    assert 0 < delivered == len(first) < 20  # the rest go through the hub, none twice


def test_the_transport_reads_the_export_timeout_from_opentelemetrys_variable() -> None:
    transport = transport_from("http://127.0.0.1:1", {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1.5"})
    assert transport._settings.timeout_s == 1.5
    assert transport_from("http://127.0.0.1:1", {})._settings.timeout_s == 5.0  # its own default
