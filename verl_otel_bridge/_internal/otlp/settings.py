"""OpenTelemetry's ``OTEL_EXPORTER_OTLP_*`` variables, read as its OTLP/HTTP span exporter reads them.

Each setting comes from ``OTEL_EXPORTER_OTLP_TRACES_<NAME>`` when that is set
(and not empty), else from ``OTEL_EXPORTER_OTLP_<NAME>``; the two are never
merged (OpenTelemetry's ``opentelemetry-exporter-otlp-proto-http`` does the same). Where
OpenTelemetry logs a bad value and carries on with a default, the bridge
raises :class:`ValueError` naming the variable, the value and the fix, so a
job does not run with its spans silently refused. Header values are never
quoted in a message or a repr: they usually carry credentials.
"""

from __future__ import annotations

import math
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import unquote, urlparse

from verl_otel_bridge._internal.secrets import mask_url

#: What the exporter sends to with no endpoint configured (OpenTelemetry's default).
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
#: Appended to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL); never to the ``TRACES`` one.
TRACES_PATH = "v1/traces"
#: Bound of one export, retries included (OpenTelemetry's default).
DEFAULT_TIMEOUT_S = 10.0
COMPRESSIONS = ("none", "gzip", "deflate")
#: The only wire protocol this package speaks.
PROTOCOL = "http/protobuf"
#: OpenTelemetry Python's hooks that hand its exporter a ``requests.Session``; nothing here can take one.
CREDENTIAL_PROVIDER_VARIABLES = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
)

_SIGNAL_PREFIX = "OTEL_EXPORTER_OTLP_TRACES_"
_GENERAL_PREFIX = "OTEL_EXPORTER_OTLP_"
# RFC 9110 field-name token.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def lookup(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """``(variable, value)`` of ``OTEL_EXPORTER_OTLP_TRACES_<name>``, else of ``OTEL_EXPORTER_OTLP_<name>``.

    None when neither is set (an empty value counts as unset, as in OpenTelemetry).
    """
    for variable in (_SIGNAL_PREFIX + name, _GENERAL_PREFIX + name):
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None


def check_url(url: str, where: str) -> str:
    """``url`` if it is an ``http(s)`` URL with a host.

    Raises:
        ValueError: naming ``where`` (the variable or key it came from).
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(
            f"verl_otel_bridge: {where}={mask_url(url)!r} is not an http(s) URL with a host; "
            "write it as http://HOST:4318/v1/traces (or https://...)"
        )
    return url


def traces_endpoint(
    environ: Mapping[str, str], explicit: str | None = None, explicit_name: str = "endpoint"
) -> tuple[str, str]:
    """The traces URL and where it came from, by OpenTelemetry's rules.

    ``explicit`` (e.g. the config's ``otlp_endpoint``) and
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` are used as they are;
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is a base URL that gets ``/v1/traces``
    appended; without any of them, :data:`DEFAULT_ENDPOINT`.

    Raises:
        ValueError: the URL is not ``http(s)`` with a host; the message names its source.
    """
    if explicit:
        return check_url(explicit.strip(), explicit_name), explicit_name
    signal = environ.get(_SIGNAL_PREFIX + "ENDPOINT", "").strip()
    if signal:
        return check_url(signal, _SIGNAL_PREFIX + "ENDPOINT"), _SIGNAL_PREFIX + "ENDPOINT"
    base = environ.get(_GENERAL_PREFIX + "ENDPOINT", "").strip()
    if base:
        check_url(base, _GENERAL_PREFIX + "ENDPOINT")
        return f"{base.removesuffix('/')}/{TRACES_PATH}", _GENERAL_PREFIX + "ENDPOINT"
    return DEFAULT_ENDPOINT, "default"


def check_protocol(environ: Mapping[str, str]) -> None:
    """Refuse ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` other than ``http/protobuf``.

    OpenTelemetry's SDK reads it to choose between its gRPC and HTTP exporters;
    an application that asks for gRPC must not have its spans posted to a gRPC port.

    Raises:
        ValueError: naming the variable and the fix.
    """
    found = lookup(environ, "PROTOCOL")
    if found is not None and found[1].lower() != PROTOCOL:
        variable, value = found
        raise ValueError(
            f"verl_otel_bridge: {variable}={value!r}, but the bridge's OTLP exporter sends {PROTOCOL} only; "
            f"unset it or set {PROTOCOL}, with the endpoint at the collector's OTLP/HTTP port (4318 by default)"
        )


def parse_headers(text: str, where: str = "headers") -> dict[str, str]:
    """``key1=value1,key2=value2`` (URL-encoded) as OpenTelemetry's variables spell headers; names lowercased.

    Raises:
        ValueError: an entry is not ``name=value`` with a valid header name, or a
            value holds a line break; the message names ``where`` and the entry's
            position, never its value.
    """
    headers: dict[str, str] = {}
    entries = [entry for entry in text.split(",") if entry.strip()]
    for position, entry in enumerate(entries, 1):
        key, sep, value = entry.partition("=")
        key = unquote(key).strip().lower()
        value = unquote(value).strip()
        problem = None
        if not sep or not key:
            problem = "is not name=value"
        elif not _HEADER_NAME.fullmatch(key):
            problem = f"has the name {key!r}, which is not a valid header name"
        elif "\r" in value or "\n" in value:
            problem = "has a line break in its value"
        if problem is not None:
            raise ValueError(
                f"verl_otel_bridge: {where}: entry {position} of {len(entries)} {problem} (values are not shown: "
                "they may be secrets); write name1=value1,name2=value2 with ',' and '=' in values URL-encoded "
                "(%2C, %3D)"
            )
        headers[key] = value
    return headers


@dataclass(frozen=True)
class SenderSettings:
    """How requests are sent, wherever they go; see :meth:`from_environment`.

    Attributes:
        headers: extra request headers, names lowercased (shown by name only).
        timeout_s: bound of one export, retries included.
        compression: ``none``, ``gzip`` or ``deflate``.
        certificate: CA bundle to trust for ``https`` (default: the system's).
        client_certificate: client certificate (PEM) for mutual TLS.
        client_key: its private key (default: inside ``client_certificate``).
        sources: where each setting came from (variable names), for error messages.

    Raises:
        ValueError: a bad value, or a TLS file that cannot be loaded; the
            message names its source.
    """

    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: str = "none"
    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                f"verl_otel_bridge: {self._source('compression')}={self.compression!r} is not one of "
                f"{', '.join(COMPRESSIONS)}"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(
                f"verl_otel_bridge: {self._source('timeout_s')}={self.timeout_s!r} must be a positive number of seconds"
            )
        if self.client_key and not self.client_certificate:
            raise ValueError(
                f"verl_otel_bridge: {self._source('client_key')}={self.client_key!r} is set without a client "
                f"certificate; set {self._source('client_certificate')} too (or drop the key)"
            )
        if self.certificate or self.client_certificate:
            _ = self.tls_context  # load the files now, so a wrong path fails at start-up

    def __repr__(self) -> str:
        shown = ", ".join(
            [
                f"headers={sorted(self.headers)!r}",
                f"timeout_s={self.timeout_s!r}",
                f"compression={self.compression!r}",
                f"certificate={self.certificate!r}",
                f"client_certificate={self.client_certificate!r}",
                f"client_key={self.client_key!r}",
            ]
        )
        return f"SenderSettings({shown})"

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str], *, default_timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> SenderSettings:
        """Settings from ``OTEL_EXPORTER_OTLP_[TRACES_]`` ``HEADERS``, ``TIMEOUT``, ``COMPRESSION``,
        ``CERTIFICATE``, ``CLIENT_CERTIFICATE`` and ``CLIENT_KEY``.

        ``TIMEOUT`` is in seconds, as OpenTelemetry Python reads it (the OTLP
        specification says milliseconds; OpenTelemetry Python has always read seconds).

        Raises:
            ValueError: a bad value, or a credential-provider variable (see
                :data:`CREDENTIAL_PROVIDER_VARIABLES`); the message names the variable.
        """
        for variable in CREDENTIAL_PROVIDER_VARIABLES:
            if environ.get(variable, "").strip():
                raise ValueError(
                    f"verl_otel_bridge: {variable}={environ[variable].strip()!r} names a provider of a "
                    "requests.Session, which the bridge's OTLP sender cannot use; put the credentials in "
                    "OTEL_EXPORTER_OTLP_TRACES_HEADERS (e.g. authorization=Bearer%20TOKEN) and unset it"
                )
        sources: dict[str, str] = {}
        values: dict[str, str] = {}
        for name, key in (
            ("HEADERS", "headers"),
            ("TIMEOUT", "timeout_s"),
            ("COMPRESSION", "compression"),
            ("CERTIFICATE", "certificate"),
            ("CLIENT_CERTIFICATE", "client_certificate"),
            ("CLIENT_KEY", "client_key"),
        ):
            found = lookup(environ, name)
            sources[key] = found[0] if found else _SIGNAL_PREFIX + name
            if found is not None:
                values[key] = found[1]
        timeout_s = default_timeout_s
        if "timeout_s" in values:
            try:
                timeout_s = float(values["timeout_s"])
            except ValueError:
                raise ValueError(
                    f"verl_otel_bridge: {sources['timeout_s']}={values['timeout_s']!r} is not a number of seconds "
                    "(OpenTelemetry Python reads it in seconds, e.g. 10)"
                ) from None
        return cls(
            headers=parse_headers(values.get("headers", ""), sources["headers"]),
            timeout_s=timeout_s,
            compression=values.get("compression", "none").lower(),
            certificate=values.get("certificate"),
            client_certificate=values.get("client_certificate"),
            client_key=values.get("client_key"),
            sources=sources,
        )

    @cached_property
    def tls_context(self) -> ssl.SSLContext:
        """The TLS context for ``https`` endpoints: the CA bundle and client certificate loaded once.

        Raises:
            ValueError: a file is missing or not PEM; the message names its source.
        """
        try:
            context = ssl.create_default_context(cafile=self.certificate)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(self._file_problem(("certificate",), exc)) from None
        if self.client_certificate:
            try:
                context.load_cert_chain(self.client_certificate, self.client_key)
            except (OSError, ssl.SSLError) as exc:
                keys = ("client_certificate", "client_key") if self.client_key else ("client_certificate",)
                raise ValueError(self._file_problem(keys, exc)) from None
        return context

    def _source(self, key: str) -> str:
        return self.sources.get(key, key)

    def _file_problem(self, keys: tuple[str, ...], exc: Exception) -> str:
        named = " with ".join(f"{self._source(key)}={getattr(self, key)!r}" for key in keys)
        return (
            f"verl_otel_bridge: {named} cannot be loaded ({type(exc).__name__}: {exc}); point it at a readable PEM file"
        )
