"""How OTLP requests are sent, from the configuration's ``otlp_*`` keys (OpenTelemetry's ``OTEL_EXPORTER_OTLP_*``).

Each key reads ``OTEL_EXPORTER_OTLP_TRACES_<NAME>`` first, then
``OTEL_EXPORTER_OTLP_<NAME>`` (:mod:`verl_otel_bridge._internal.config` declares
them), as OpenTelemetry's OTLP/HTTP span exporter does; where OpenTelemetry logs a
bad value and carries on with a default, the bridge raises a ``ConfigError`` naming
the variable. Header values are never quoted in a message or a repr: they usually
carry credentials.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from verl_otel_bridge._internal.config import BridgeConfig, ConfigError

#: What the ``otlp`` exporter sends to with no endpoint configured (OpenTelemetry's default).
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
#: Bound of one export, retries included (OpenTelemetry's default).
DEFAULT_TIMEOUT_S = 10.0
#: OpenTelemetry Python's hooks that hand its exporter a ``requests.Session``; nothing here can take one.
CREDENTIAL_PROVIDER_VARIABLES = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
)


@dataclass(frozen=True)
class SenderSettings:
    """How requests are sent, wherever they go.

    Attributes:
        headers: extra request headers, names lowercased (shown by name only).
        timeout_s: bound of one export, retries included.
        compression: ``none``, ``gzip`` or ``deflate``.
        certificate: CA bundle to trust for ``https`` (default: the system's).
        client_certificate: client certificate (PEM) for mutual TLS.
        client_key: its private key (default: inside ``client_certificate``).
    """

    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: str = "none"
    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None

    def __repr__(self) -> str:
        return (
            f"SenderSettings(headers={sorted(self.headers)!r}, timeout_s={self.timeout_s!r}, "
            f"compression={self.compression!r}, certificate={self.certificate!r}, "
            f"client_certificate={self.client_certificate!r}, client_key={self.client_key!r})"
        )

    @classmethod
    def of(
        cls,
        config: BridgeConfig,
        *,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
    ) -> SenderSettings:
        """The settings ``config``'s ``otlp_*`` keys give (``otlp_timeout_s`` unset: ``default_timeout_s``),
        with the TLS files loaded now, so a wrong path fails at start-up.

        Raises:
            ConfigError: a client key without a certificate, a TLS file that cannot be loaded, or one of
                OpenTelemetry Python's credential-provider variables set in ``environ`` (default ``os.environ``).
        """
        env = os.environ if environ is None else environ
        for variable in CREDENTIAL_PROVIDER_VARIABLES:
            if env.get(variable, "").strip():
                raise ConfigError(
                    f"verl_otel_bridge: {variable}={env[variable].strip()!r} names a provider of a requests.Session, "
                    "which the bridge's OTLP sender cannot use; put the credentials in "
                    "OTEL_EXPORTER_OTLP_TRACES_HEADERS (e.g. authorization=Bearer%20TOKEN) and unset it",
                    "otlp_headers",
                )
        if config.otlp_client_key and not config.otlp_client_certificate:
            raise config.error(
                "otlp_client_key",
                f"verl_otel_bridge: otlp_client_key={config.otlp_client_key!r} is set without a client certificate; "
                "set otlp_client_certificate (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE) too, or drop the key.",
            )
        settings = cls(
            headers=dict(config.otlp_headers or {}),
            timeout_s=config.otlp_timeout_s if config.otlp_timeout_s is not None else default_timeout_s,
            compression=config.otlp_compression,
            certificate=config.otlp_certificate,
            client_certificate=config.otlp_client_certificate,
            client_key=config.otlp_client_key,
        )
        if settings.certificate or settings.client_certificate:
            try:
                _ = settings.tls_context
            except ConfigError as exc:
                raise config.error(exc.key or "otlp_certificate", str(exc)) from None
        return settings

    @cached_property
    def tls_context(self) -> ssl.SSLContext:
        """The TLS context for ``https`` endpoints: the CA bundle and client certificate loaded once.

        Raises:
            ConfigError: a file is missing or not PEM, naming its key.
        """
        try:
            context = ssl.create_default_context(cafile=self.certificate)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                self._file_problem("otlp_certificate", self.certificate, exc), "otlp_certificate"
            ) from None
        if self.client_certificate:
            try:
                context.load_cert_chain(self.client_certificate, self.client_key)
            except (OSError, ssl.SSLError) as exc:
                key = "otlp_client_certificate"
                raise ConfigError(self._file_problem(key, self.client_certificate, exc), key) from None
        return context

    @staticmethod
    def _file_problem(key: str, path: str | None, exc: Exception) -> str:
        return (
            f"verl_otel_bridge: {key}={path!r} cannot be loaded ({type(exc).__name__}: {exc}); point it at a "
            "readable PEM file"
        )
