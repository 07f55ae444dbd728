"""Sending spans straight to the trace endpoint RL-Insight's server advertises, over OTLP/HTTP.

RL-Insight's hub only re-exports each ``trace_span`` event over OTLP/HTTP to
``http://<server host>:<otlp_port>/v1/traces``, with resource ``service.name`` =
its namespace, after adding ``process_id`` and the ``init`` labels. One Ray call
per span into one hub actor caps delivery at a few hundred spans per second and
flattens every span into a root. This transport asks the server for the same
endpoint (``GET {server}/api/v1/services``) and sends batches there itself, with
the same resource and attributes as the hub would add, and real trace and parent
ids, so RL-Insight's dashboards cannot tell the difference.

Discovery runs on the export thread, once, with a short timeout; after a
failure it is retried with exponential backoff (1 s doubling to 60 s), and so
is the endpoint after a failed export. While either is down the RL-Insight
exporter uses the hub.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan

from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.otlp.deadline import get_bounded
from verl_otel_bridge._internal.otlp.encoding import PerSpan
from verl_otel_bridge._internal.otlp.exporter import OtlpDestination
from verl_otel_bridge._internal.otlp.sender import (
    OtlpHttpSender,
    credentials_from_url,
    environment_proxies,
    import_urllib3,
)
from verl_otel_bridge._internal.otlp.settings import SenderSettings
from verl_otel_bridge._internal.records import parse_json
from verl_otel_bridge._internal.secrets import Scrubber

logger = logging.getLogger(__name__)

#: RL-Insight's default namespace: the hub's resource ``service.name``.
DEFAULT_NAMESPACE = "rl_insight_monitor"
SERVICES_PATH = "/api/v1/services"
TRACES_PATH = "/v1/traces"

#: For discovery, and the export timeout unless ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`` says otherwise:
#: a batch the endpoint does not take within it goes through the hub.
DEFAULT_TIMEOUT_S = 5.0
_BACKOFF_START_S = 1.0
_BACKOFF_MAX_S = 60.0


def fetch_services(server_url: str, timeout_s: float) -> dict[str, Any]:
    """``GET {server_url}/api/v1/services``: the ports RL-Insight's server advertises.

    User info in the URL (``http://user:pass@host``) is sent as Basic auth, not
    as part of the address. Bounded by ``timeout_s`` in all and by
    :data:`~verl_otel_bridge._internal.otlp.deadline.MAX_ANSWER_BYTES`, however the server answers.

    Raises:
        OSError: the server did not answer in time (``urllib.error.URLError`` is an ``OSError``), or too much.
        ValueError: the answer is not a JSON object.
    """
    url, authorization = credentials_from_url(server_url.rstrip("/"))
    headers = {"Authorization": authorization} if authorization is not None else {}
    data = parse_json(get_bounded(url + SERVICES_PATH, headers, timeout_s).decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{SERVICES_PATH} answered a JSON {type(data).__name__}, not an object")
    return data


def trace_endpoint(server_url: str, otlp_port: Any) -> str:
    """The OTLP/HTTP traces URL on the server's host at ``otlp_port`` (as RL-Insight's hub builds it).

    Raises:
        ValueError: no host in ``server_url``, or ``otlp_port`` is not a port number.
    """
    parsed = urlparse(server_url)
    host = parsed.hostname or ""
    if not host:
        raise ValueError(f"cannot read a host from {server_url!r}")
    host = f"[{host}]" if ":" in host else host
    try:
        port = int(otlp_port)
    except (TypeError, ValueError):
        raise ValueError(f"otlp_port {otlp_port!r} is not a port number") from None
    return f"{parsed.scheme or 'http'}://{host}:{port}{TRACES_PATH}"


class _Backoff:
    """When the next attempt at something that failed is allowed."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.next_at = 0.0

    def ready(self) -> bool:
        return time.monotonic() >= self.next_at

    def failed(self) -> None:
        self.delay_s = min(_BACKOFF_MAX_S, max(_BACKOFF_START_S, self.delay_s * 2))
        self.next_at = time.monotonic() + self.delay_s

    def succeeded(self) -> None:
        self.delay_s = 0.0
        self.next_at = 0.0


def otlp_settings(config: BridgeConfig) -> SenderSettings | None:
    """The sender settings the ``otlp``/``auto`` transport will use, checked now; None for ``hub``.

    Under ``auto`` a missing urllib3 means the hub (logged once when RL-Insight is installed); under
    ``otlp`` it is a mistake.

    Raises:
        ConfigError: a bad ``otlp_*`` setting, or ``otlp`` without urllib3.
    """
    transport = config.rl_insight_transport
    if transport == "hub":
        return None
    try:
        import_urllib3("rl_insight_transport=otlp", "rl_insight_transport")
    except ValueError as exc:
        if transport == "otlp":
            raise
        if importlib.util.find_spec("rl_insight") is not None:  # else there is no hub either: nothing to say
            logger.info("%s; spans go through RL-Insight's hub", exc)
        return None
    return SenderSettings.of(config, default_timeout_s=DEFAULT_TIMEOUT_S)


class OtlpTransport:
    """Discovers RL-Insight's trace endpoint and sends span batches there as the hub would.

    Batches are encoded and posted by :class:`~verl_otel_bridge._internal.otlp.exporter.OtlpDestination`,
    with the same ``otlp_*`` settings (``OTEL_EXPORTER_OTLP_*``: headers, timeout,
    compression, TLS) the hub's exporter reads.

    Args:
        server_url: RL-Insight's server URL.
        settings: how batches are sent (:func:`otlp_settings`).
        namespace: the resource ``service.name`` (RL-Insight's ``server.namespace``).
        labels: what the hub adds to every span (``project``, ``experiment_name``).
        timeout_s: for discovery.
        environ: where the proxy variables are read (default ``os.environ``).
    """

    def __init__(
        self,
        server_url: str,
        settings: SenderSettings,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        labels: Mapping[str, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.server_url = server_url
        self.timeout_s = timeout_s
        self._environ = os.environ if environ is None else environ
        self._settings = settings
        # What the hub adds, in the order it adds it; the span's own attributes win.
        self._added = {"process_id": str(os.getpid()), **{k: v for k, v in (labels or {}).items() if v is not None}}
        self._resource = Resource.create({SERVICE_NAME: namespace})
        self._exporter: OtlpDestination | None = None
        self._new_lock()
        reinit_after_fork(self._new_lock)
        self._discovery = _Backoff()
        self._sending = _Backoff()
        self.last_error: str | None = None

    def _new_lock(self) -> None:
        self._lock = threading.Lock()  # also after a fork: the export thread may have held it

    @property
    def endpoint(self) -> str | None:
        """The trace endpoint, once discovered."""
        return self._exporter.sender.endpoint if self._exporter is not None else None

    def available(self) -> bool:
        """Discover if needed (never more often than the backoff allows); True when sending may be tried."""
        with self._lock:
            if self._exporter is None:
                if not self._discovery.ready():
                    return False
                self._discover()
            return (self._exporter is not None) and self._sending.ready()

    def send(self, spans: Sequence[ReadableSpan], attributes: Sequence[Mapping[str, Any]]) -> Outcome:
        """Export ``spans`` with ``attributes`` (one mapping per span, in the hub's shape).

        Refused spans (a request not accepted, and every span after it) are for the hub.
        """
        exporter = self._exporter
        if exporter is None:
            return Outcome.refusing(spans, "RL-Insight's trace endpoint is not discovered yet")
        added = self._added
        try:
            outcome = exporter.send_described(spans, PerSpan([{**added, **attrs} for attrs in attributes], None, None))
        except Exception as exc:  # noqa: BLE001 - an encoding bug must not lose the batch: the hub takes it
            outcome = Outcome.refusing(spans, f"{type(exc).__name__}: {exc}")
        with self._lock:
            if not outcome.refused:
                self._sending.succeeded()
                self.last_error = None  # recovered: status() must not keep reporting an old failure
            else:
                self._sending.failed()
                self.last_error = outcome.reason
        return outcome

    def shutdown(self) -> None:
        """Close the connection to the endpoint (ending a wait between retries)."""
        if self._exporter is not None:
            self._exporter.close()

    def _discover(self) -> None:
        try:
            port = fetch_services(self.server_url, self.timeout_s).get("otlp_port")
            if not port:
                self._discovery.failed()
                self.last_error = "RL-Insight's server advertises no otlp_port"
                return
            endpoint = trace_endpoint(self.server_url, port)
            sender = OtlpHttpSender(endpoint, self._settings, proxies=environment_proxies(self._environ))
        except Exception as exc:  # noqa: BLE001 - OSError, ValueError, http.client.InvalidURL...
            self._discovery.failed()
            self.last_error = Scrubber.of(self.server_url)(
                f"discovery at {self.server_url}{SERVICES_PATH} failed: {exc}"
            )
            logger.info("%s; retrying in %.0f s, spans use the hub meanwhile", self.last_error, self._discovery.delay_s)
            return
        self._exporter = OtlpDestination(sender, resource=self._resource)
        self._discovery.succeeded()
        logger.info("RL-Insight trace endpoint discovered: %s (spans go there directly)", sender.endpoint)
