"""POSTing encoded OTLP requests to one OTLP/HTTP traces endpoint.

RL-Insight's hub sends with OpenTelemetry's ``OTLPSpanExporter(endpoint=...)``,
which also reads the standard ``OTEL_EXPORTER_OTLP_[TRACES_]*`` variables for
headers, compression and TLS files. :meth:`OtlpHttpSender.from_environment`
reads the same ones, so spans sent directly carry what the hub's would.

One connection is kept open between batches. Before reusing it the sender
checks that the peer has not closed it (a server's idle timeout), so a batch is
never posted twice because a stale connection failed mid-request.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import select
import socket
import ssl
import threading
import zlib
from collections.abc import Mapping
from urllib.parse import unquote, urlparse

from verl_otel_bridge.secrets import mask_url

logger = logging.getLogger("verl_otel_bridge.otlp_http")

COMPRESSIONS = ("none", "gzip", "deflate")
#: How much of an error answer's body is quoted in the error.
_BODY_QUOTE = 200


class OtlpSendError(Exception):
    """The endpoint did not accept a request (no answer, or a status other than 2xx)."""


def _setting(environ: Mapping[str, str], name: str) -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``, else empty."""
    value = environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or environ.get(f"OTEL_EXPORTER_OTLP_{name}") or ""
    return value.strip()


def parse_headers(text: str) -> dict[str, str]:
    """``key1=value1,key2=value2`` (values URL-encoded), as OpenTelemetry's variables spell headers.

    Entries without ``=`` or with an empty key are left out with a warning.
    """
    headers: dict[str, str] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        key = unquote(key).strip()
        if not sep or not key:
            logger.warning("OTLP header entry %r is not key=value; left out", mask_url(entry.strip()))
            continue
        headers[key] = unquote(value).strip()
    return headers


class OtlpHttpSender:
    """Sends protobuf ``ExportTraceServiceRequest`` bodies to ``endpoint``, one request per call.

    Args:
        endpoint: ``http://`` or ``https://`` URL of the traces endpoint (``.../v1/traces``).
        timeout_s: for connecting and for each read or write on the socket.
        headers: extra request headers (e.g. an authorization token).
        compression: ``none``, ``gzip`` or ``deflate``.
        certificate: CA bundle to trust for ``https`` (default: the system's).
        client_certificate: client certificate for mutual TLS.
        client_key: its private key (default: inside ``client_certificate``).

    Raises:
        ValueError: the endpoint is not an http(s) URL with a host, or an unknown compression.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        compression: str = "none",
        certificate: str | None = None,
        client_certificate: str | None = None,
        client_key: str | None = None,
    ) -> None:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"OTLP endpoint {mask_url(endpoint)!r} is not an http(s) URL with a host")
        if compression not in COMPRESSIONS:
            raise ValueError(f"OTLP compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.compression = compression
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port
        self._path = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
        self._headers = {"Content-Type": "application/x-protobuf", **(headers or {})}
        if compression != "none":
            self._headers["Content-Encoding"] = compression
        self._tls_files = (certificate, client_certificate, client_key)
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, endpoint: str, *, timeout_s: float, environ: Mapping[str, str]) -> OtlpHttpSender:
        """A sender configured by ``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``, ``COMPRESSION``,
        ``CERTIFICATE``, ``CLIENT_CERTIFICATE`` and ``CLIENT_KEY``.

        Raises:
            ValueError: as the constructor; the message names the variable for a bad compression.
        """
        compression = _setting(environ, "COMPRESSION").lower() or "none"
        if compression not in COMPRESSIONS:
            raise ValueError(
                f"OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION={compression!r} is not one of {', '.join(COMPRESSIONS)}"
            )
        return cls(
            endpoint,
            timeout_s=timeout_s,
            headers=parse_headers(_setting(environ, "HEADERS")),
            compression=compression,
            certificate=_setting(environ, "CERTIFICATE") or None,
            client_certificate=_setting(environ, "CLIENT_CERTIFICATE") or None,
            client_key=_setting(environ, "CLIENT_KEY") or None,
        )

    def send(self, body: bytes) -> None:
        """POST ``body``; return once the endpoint answered 2xx.

        Raises:
            OtlpSendError: no connection, a timeout, or a non-2xx answer (quoted).
        """
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        elif self.compression == "deflate":
            body = zlib.compress(body)
        with self._lock:
            try:
                connection = self._open()
                connection.request("POST", self._path, body=body, headers=self._headers)
                response = connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                raise OtlpSendError(f"POST {self.endpoint}: {type(exc).__name__}: {exc}") from exc
            if response.will_close:
                self._close()
        if not 200 <= response.status < 300:
            quoted = answer[:_BODY_QUOTE].decode("utf-8", "replace")
            raise OtlpSendError(f"POST {self.endpoint} answered {response.status} {response.reason}: {quoted!r}")

    def close(self) -> None:
        """Close the kept-alive connection (a later ``send`` opens a new one)."""
        with self._lock:
            self._close()

    def _open(self) -> http.client.HTTPConnection:
        connection = self._connection
        if connection is not None and connection.sock is not None and _closed_by_peer(connection.sock):
            self._close()
            connection = None
        if connection is None:
            if self._https:
                connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout_s, context=self._tls_context()
                )
            else:
                connection = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
            self._connection = connection
        return connection

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _tls_context(self) -> ssl.SSLContext:
        certificate, client_certificate, client_key = self._tls_files
        context = ssl.create_default_context(cafile=certificate)
        if client_certificate:
            context.load_cert_chain(client_certificate, client_key)
        return context


def _closed_by_peer(sock: socket.socket) -> bool:
    """True if an idle kept-alive socket is readable: the peer closed it (or sent something unasked)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
