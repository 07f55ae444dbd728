"""POSTing encoded OTLP requests to one OTLP/HTTP traces endpoint, over urllib3.

urllib3 keeps the connection open between requests and replaces one the peer
has closed (a server's idle timeout) before writing to it. Its
:class:`urllib3.Retry` decides what is retried and reads ``Retry-After``;
this module waits between attempts itself, so that the export's deadline
(``timeout_s``, OpenTelemetry's ``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT``) bounds
the retries too and :meth:`OtlpHttpSender.close` ends a wait at once.

The deadline bounds everything read from the endpoint: a request's connection is
cut when it passes (:mod:`verl_otel_bridge._internal.otlp.deadline`), so an answer sent one
byte at a time cannot hold an export past it, and at most
:data:`~verl_otel_bridge._internal.otlp.deadline.MAX_ANSWER_BYTES` of an answer's body are read
(a longer one fails the request; it is not retried).

What is retried, as in OpenTelemetry's exporter: answers 429, 502, 503 and
504 (after ``Retry-After`` when the server sends one, else after an
exponential backoff with jitter), and connections that could not be made or
broke, up to :data:`MAX_ATTEMPTS` attempts within the deadline. Any other
answer, and TLS errors, fail at once.
"""

from __future__ import annotations

import base64
import gzip
import os
import threading
import time
import urllib.request
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlparse

from verl_otel_bridge._internal.config import BridgeConfig, ConfigError, http_url_problem
from verl_otel_bridge._internal.exporter_names import NAMES
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.otlp.deadline import AnswerTooLarge, Deadline, read_bounded, watched
from verl_otel_bridge._internal.otlp.settings import DEFAULT_TIMEOUT_S, SenderSettings
from verl_otel_bridge._internal.secrets import Scrubber, mask_url
from verl_otel_bridge._version import __version__, install_command

if TYPE_CHECKING:
    import urllib3

#: What to install when urllib3 is missing.
INSTALL_HINT = install_command(NAMES["otlp"].needs or "otlp")
#: Answers that mean "later": retried.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
#: Attempts per request at most (OpenTelemetry's exporter makes six too).
MAX_ATTEMPTS = 6
#: urllib3's backoff: the first retry at once, then 1 s, 2 s, 4 s, ... (capped), each plus up to the jitter.
BACKOFF_FACTOR_S = 0.5
BACKOFF_JITTER_S = 0.5
BACKOFF_MAX_S = 30.0
#: How much of an error answer's body is quoted in the error.
_BODY_QUOTE = 200


class OtlpSendError(Exception):
    """The endpoint did not accept a request: no answer, a non-2xx answer, or retries that ran out.

    Attributes:
        status: the last HTTP status answered, if any.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def import_urllib3(needed_by: str, key: str | None = None) -> Any:
    """The ``urllib3`` module (2.x).

    Raises:
        ConfigError: it is not installed (or older than 2); the message names ``needed_by`` (the setting
            ``key`` asks for it) and the extra.
    """
    message = f"verl_otel_bridge: {needed_by} needs urllib3>=2; install it with: {INSTALL_HINT}"
    try:
        import urllib3
    except ImportError:
        raise ConfigError(message, key) from None
    if not hasattr(urllib3, "BaseHTTPResponse"):  # new in 2.0
        raise ConfigError(message, key)
    return urllib3


def credentials_from_url(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and that user info as a Basic ``Authorization`` value (or None).

    ``requests`` (under OpenTelemetry's exporter) sends user info in a URL this way; urllib3 does not.
    """
    parsed = urlparse(url)
    if parsed.username is None:
        return url, None
    host = parsed.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parsed.port is not None:
        netloc = f"{netloc}:{parsed.port}"
    token = base64.b64encode(f"{unquote(parsed.username)}:{unquote(parsed.password or '')}".encode()).decode()
    return parsed._replace(netloc=netloc).geturl(), f"Basic {token}"


def environment_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """``{scheme: proxy URL, "no": hosts}`` from ``<scheme>_proxy``/``NO_PROXY`` in ``environ``.

    As :func:`urllib.request.getproxies_environment` reads them (the lowercase
    name wins), but from any mapping; ``requests`` under OpenTelemetry's exporter honours the same.
    """
    proxies: dict[str, str] = {}
    for name, value in environ.items():
        lowered = name.lower()
        if value and lowered.endswith("_proxy") and (name == lowered or lowered[:-6] not in proxies):
            proxies[lowered[:-6]] = value
    return proxies


class OtlpHttpSender:
    """Sends protobuf ``ExportTraceServiceRequest`` bodies to ``endpoint``, retrying within a deadline.

    Thread-safe; one pooled connection is reused between requests.

    Args:
        endpoint: ``http://`` or ``https://`` URL of the traces endpoint (``.../v1/traces``);
            ``user:password@`` in it is sent as Basic auth.
        settings: headers, timeout, compression, TLS (default: none of them, 10 s).
        proxies: as :func:`environment_proxies` returns (default: none).

    Raises:
        ValueError: the endpoint is not an http(s) URL with a host; ConfigError: urllib3 is missing.
    """

    def __init__(
        self,
        endpoint: str,
        settings: SenderSettings | None = None,
        *,
        proxies: Mapping[str, str] | None = None,
    ) -> None:
        urllib3 = import_urllib3("the OTLP sender")
        problem = http_url_problem(endpoint)
        if problem is not None:
            raise ValueError(f"verl_otel_bridge: the OTLP endpoint {mask_url(endpoint)!r} {problem}")
        self.settings = settings if settings is not None else SenderSettings()
        self._url, authorization = credentials_from_url(endpoint)
        #: The endpoint as shown in logs and errors (no password, no query).
        self.endpoint = str(mask_url(endpoint))
        #: Every message about this endpoint goes through it: header values and the URL's secrets never show.
        self.scrub = Scrubber.of({"headers": dict(self.settings.headers)}, endpoint)
        # As OpenTelemetry's exporter, which names itself in User-Agent too.
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": f"verl-otel-bridge/{__version__}"}
        if authorization is not None:
            self._headers["Authorization"] = authorization
        self._headers.update(self.settings.headers)
        if self.settings.compression != "none":
            self._headers["Content-Encoding"] = self.settings.compression
        self._urllib3 = urllib3
        self._proxies = dict(proxies or {})
        self._policy = urllib3.Retry(
            total=MAX_ATTEMPTS - 1,
            connect=None,
            read=1,  # the request may have been processed: retried once (a connection that broke mid-answer)
            other=0,  # TLS and protocol errors will not go away by themselves
            redirect=0,
            status=None,
            status_forcelist=RETRYABLE_STATUSES,
            allowed_methods=None,  # any method: OTLP export requests are meant to be retried
            backoff_factor=BACKOFF_FACTOR_S,
            backoff_jitter=BACKOFF_JITTER_S,
            backoff_max=BACKOFF_MAX_S,
            respect_retry_after_header=True,
            raise_on_status=False,
        )
        self._connect()
        reinit_after_fork(self._connect)

    def _connect(self) -> None:
        # Also the after-fork hook: a forked child gets a pool of its own. The parent's
        # keep-alive connection stays the parent's (two processes writing requests on
        # one connection corrupt both), and a close() in the parent ends no wait here.
        self._pool = self._pool_manager(self._urllib3, self._proxies)
        self._closed = threading.Event()

    @classmethod
    def of(
        cls,
        endpoint: str,
        config: BridgeConfig,
        *,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
    ) -> OtlpHttpSender:
        """A sender for ``endpoint`` configured by ``config``'s ``otlp_*`` keys and the proxy variables of
        ``environ`` (default ``os.environ``).

        Raises:
            ValueError: as :meth:`SenderSettings.of` and the constructor.
        """
        env = os.environ if environ is None else environ
        settings = SenderSettings.of(config, default_timeout_s=default_timeout_s, environ=env)
        return cls(endpoint, settings, proxies=environment_proxies(env))

    def __repr__(self) -> str:
        return f"OtlpHttpSender({self.endpoint!r}, {self.settings!r})"

    @property
    def timeout_s(self) -> float:
        """Bound of one :meth:`send`, retries included."""
        return self.settings.timeout_s

    def _pool_manager(self, lib: Any, proxies: Mapping[str, str]) -> urllib3.PoolManager:
        parsed = urlparse(self._url)
        options: dict[str, Any] = {"num_pools": 1, "maxsize": 1, "retries": False}
        if parsed.scheme == "https":
            options["ssl_context"] = self.settings.tls_context
        proxy = proxies.get(parsed.scheme)
        if proxy and not urllib.request.proxy_bypass_environment(parsed.netloc, proxies):  # type: ignore[attr-defined]
            proxy_url, authorization = credentials_from_url(proxy)
            headers = {"Proxy-Authorization": authorization} if authorization else None
            manager = lib.ProxyManager(proxy_url, proxy_headers=headers, **options)
        else:
            manager = lib.PoolManager(**options)
        # Every connection's socket is watched by the deadline of the request using it.
        plain, tls = watched(lib.connection.HTTPConnection), watched(lib.connection.HTTPSConnection)
        manager.pool_classes_by_scheme = {
            "http": type("WatchedPool", (lib.HTTPConnectionPool,), {"ConnectionCls": plain}),
            "https": type("WatchedTLSPool", (lib.HTTPSConnectionPool,), {"ConnectionCls": tls}),
        }
        return cast("urllib3.PoolManager", manager)

    def send(self, body: bytes, *, deadline: float | None = None) -> bytes:
        """POST ``body`` (compressed as configured); return the body of the endpoint's 2xx answer.

        Args:
            body: the encoded request.
            deadline: a ``time.monotonic()`` time to give up by, if earlier than ``timeout_s`` from now.

        Raises:
            OtlpSendError: a refused answer (quoted), retries that ran out or would
                pass the deadline, or the sender was closed.
        """
        started = time.monotonic()
        end = started + self.settings.timeout_s if deadline is None else min(deadline, started + self.timeout_s)
        payload = self._compress(body)
        retry = self._policy
        attempt = 0
        while True:
            if self._closed.is_set():
                raise OtlpSendError(f"POST {self.endpoint}: the sender is shut down")
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise OtlpSendError(f"POST {self.endpoint}: no answer within the export deadline")
            attempt += 1
            response, answer, error = self._attempt(payload, remaining)
            if response is not None and 200 <= response.status < 300:
                return answer
            failure, status = self._describe(response, answer, error)
            if response is not None and not retry.is_retry("POST", response.status, "Retry-After" in response.headers):
                raise OtlpSendError(f"{failure} (not retried)", status)
            try:
                retry = retry.increment("POST", self._url, response=response, error=error)
            except Exception:  # noqa: BLE001 - MaxRetryError, or urllib3 re-raising an error it does not retry
                raise OtlpSendError(f"{failure} (gave up after {attempt} attempts)", status) from error
            delay = self._delay(retry, response)
            if time.monotonic() + delay >= end:
                raise OtlpSendError(
                    f"{failure} (attempt {attempt}; a retry in {delay:.1f} s would pass the export deadline)", status
                ) from error
            if self._closed.wait(delay):
                raise OtlpSendError(f"{failure} (shut down while waiting to retry)", status) from error

    def close(self) -> None:
        """Close the pooled connection and end any wait between retries; later sends fail."""
        self._closed.set()
        self._pool.clear()

    def _attempt(self, payload: bytes, remaining: float) -> tuple[Any, bytes, Exception | None]:
        """One POST within ``remaining`` seconds: the answer and its body, or the error."""
        urllib3 = self._urllib3
        deadline = Deadline(time.monotonic() + remaining)
        response = None
        try:
            with deadline.current():
                response = self._pool.urlopen(
                    "POST",
                    self._url,
                    body=payload,
                    headers=self._headers,
                    timeout=urllib3.Timeout(total=remaining),
                    retries=False,
                    redirect=False,
                    preload_content=False,
                    decode_content=False,  # quoted as sent: never inflated
                )
                body = read_bounded(response.read)
            response.release_conn()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if response is not None:
                response.close()  # the rest of the answer is never read: the connection is not reused
                response.release_conn()
            if isinstance(exc, AnswerTooLarge):
                status = response.status if response is not None else None
                raise OtlpSendError(f"POST {self.endpoint} answered {status}: {exc} (not retried)", status) from exc
            if deadline.expired:
                return None, b"", TimeoutError("timed out: no whole answer within the export deadline")
            return None, b"", exc
        return response, body, None

    def _describe(self, response: Any, body: bytes, error: Exception | None) -> tuple[str, int | None]:
        if response is None:
            return self.scrub(f"POST {self.endpoint}: {type(error).__name__}: {error}"), None
        quoted = self.scrub(body[:_BODY_QUOTE].decode("utf-8", "replace"))
        return f"POST {self.endpoint} answered {response.status} {response.reason}: {quoted!r}", response.status

    @staticmethod
    def _delay(retry: Any, response: Any) -> float:
        """``Retry-After`` when the answer has a valid one, else urllib3's backoff with jitter."""
        if response is not None:
            try:
                after = retry.get_retry_after(response)
            except Exception:  # noqa: BLE001 - urllib3's InvalidHeader: fall back to the backoff
                after = None
            if after is not None:
                return float(after)
        return float(retry.get_backoff_time())

    def _compress(self, body: bytes) -> bytes:
        if self.settings.compression == "gzip":
            return gzip.compress(body, compresslevel=6)
        if self.settings.compression == "deflate":
            return zlib.compress(body)
        return body
