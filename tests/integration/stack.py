"""A local, loopback-only RL-Insight stack for integration tests.

Pieces (all bound to 127.0.0.1, all stoppable, all waits bounded):

* ``otlp_receiver.OtlpReceiver`` (tests/otlp_receiver.py) stands in for Tempo.
* :class:`DiscoveryServer`: RL-Insight's own discovery API
  (``rl_insight.server.http_api``) in a subprocess, advertising the receiver.
* :func:`ray_loopback`: a local Ray cluster pinned to loopback, in which
  ``rl_insight.init`` creates its monitor hub actor.
* :func:`fetch_metrics`: reads the hub's Prometheus text.

Importing this module needs only the standard library; ``opentelemetry-proto``,
``ray`` and ``rl_insight`` are imported when a helper that needs them is used.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from otlp_receiver import OtlpReceiver

if TYPE_CHECKING:
    from typing_extensions import Self

LOOPBACK = "127.0.0.1"
"""The only address anything in this stack binds or talks to."""

RAY_LOOPBACK_ENV: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # Ray reports usage statistics to an outside host unless told not to.
    "RAY_USAGE_STATS_ENABLED": "0",
}
"""Environment every process that starts (or runs inside) Ray gets."""

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
# urllib honours *_proxy variables; loopback requests must never go through one.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def installed_rl_insight_version() -> str:
    """The installed ``rl-insight`` distribution's version, or ``"none"``.

    Read from package metadata, so it works even when ``import rl_insight``
    fails (0.1.0's wheel cannot be imported).
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rl-insight")
    except PackageNotFoundError:
        return "none"


def free_port() -> int:
    """Return a TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], _T | None],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    message: str | Callable[[], str] = "condition not met",
    retry_on: tuple[type[Exception], ...] = (Exception,),
) -> _T:
    """Poll ``condition`` until it returns a truthy value, and return that value.

    Exceptions of the ``retry_on`` types raised by ``condition`` count as "not
    yet" (the last one is reported); others propagate. Raises
    ``AssertionError`` after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except retry_on as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            suffix = f" (last error: {last_error!r})" if last_error else ""
            raise AssertionError(f"timed out after {timeout_s:g}s: {text}{suffix}")
        time.sleep(interval_s)


def http_get(url: str, timeout_s: float = 2.0) -> bytes:
    """GET a loopback URL without any proxy; raise on non-2xx or network errors."""
    if not url.startswith(f"http://{LOOPBACK}:"):
        raise ValueError(f"refusing to contact a non-loopback URL: {url}")
    with _NO_PROXY_OPENER.open(url, timeout=timeout_s) as response:
        return bytes(response.read())


def fetch_metrics(port: int, timeout_s: float = 2.0) -> str:
    """Return the Prometheus text served at ``http://127.0.0.1:<port>/metrics``."""
    return http_get(f"http://{LOOPBACK}:{port}/metrics", timeout_s).decode("utf-8")


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (Linux ``/proc``).

    Lets a test check that a server binds loopback only without sending
    anything to another address. Returns e.g. ``{"127.0.0.1"}`` or ``{"0.0.0.0"}``.
    """
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address_hex, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port or len(address_hex) != width:
                continue  # 0A = LISTEN
            raw = bytes.fromhex(address_hex)
            if width == 8:
                found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:  # /proc prints IPv6 as four little-endian 32-bit words
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


# ---------------------------------------------------------------- discovery server

# Runs RL-Insight's own ``http_api.main`` with its address detection replaced:
# released versions bind 0.0.0.0 (or ::), found by a UDP "connect" to 8.8.8.8,
# and have no host setting. The app, config loading and port come from RL-Insight.
_DISCOVERY_LAUNCHER = """
import sys
from rl_insight.server import http_api
from rl_insight.utils import prometheus_utils

def _loopback_only():
    return {"ipv4": "127.0.0.1", "ipv6": "", "host": "127.0.0.1",
            "bind": "127.0.0.1", "loopback": "127.0.0.1", "family": "ipv4"}

http_api.local_addresses = _loopback_only
prometheus_utils.local_addresses = _loopback_only
sys.exit(http_api.main(sys.argv[1:]))
"""

_LIVE_SERVERS: weakref.WeakSet[DiscoveryServer] = weakref.WeakSet()


class DiscoveryServer:
    """RL-Insight's discovery server (``GET /api/v1/services``) as a subprocess.

    It advertises ``otlp_port`` (``None``: tracing disabled, the response says
    ``"otlp_port": null``) and no Prometheus or Grafana. State it writes
    (Prometheus target registrations) goes to a private temporary directory,
    not ``~/.rl-insight``. :meth:`stop` may be called mid-test and
    :meth:`start` again later, on the same port.
    """

    def __init__(
        self,
        otlp_port: int | None,
        *,
        port: int | None = None,
        python: str = sys.executable,
        startup_timeout_s: float = 30.0,
    ) -> None:
        """Prepare (not start) a server on 127.0.0.1:``port`` (default: a free port)."""
        self.otlp_port = otlp_port
        self.port = port if port is not None else free_port()
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self._workdir = tempfile.TemporaryDirectory(prefix="rl-insight-discovery-")
        self.config_path = Path(self._workdir.name) / "server.yaml"
        self.log_path = Path(self._workdir.name) / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Value for ``RL_INSIGHT_SERVER_URL``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the subprocess is alive."""
        return self._process is not None and self._process.poll() is None

    def config(self) -> dict[str, Any]:
        """The server config written for RL-Insight (merged over its defaults)."""
        state = Path(self._workdir.name)
        return {
            "server": {
                "port": self.port,
                "data_dir": str(state / "data"),
                "runtime_dir": str(state / "runtime"),
            },
            "otel": {"otel_port": self.otlp_port or 0},
            "tempo": {"enable": self.otlp_port is not None},
            # Disabled, but target registration still POSTs a reload to this
            # port: point it at a port nothing listens on, on loopback.
            "prometheus": {"enable": False, "prometheus_port": free_port()},
            "grafana": {"enable": False},
        }

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's combined stdout/stderr."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def services(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """``GET /api/v1/services`` as a dict."""
        return dict(json.loads(http_get(f"{self.url}/api/v1/services", timeout_s)))

    def start(self) -> Self:
        """Start the subprocess and wait (bounded) until the API answers."""
        if self.running:
            return self
        # JSON is YAML, so no YAML writer is needed here.
        self.config_path.write_text(json.dumps(self.config(), indent=2))
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [self.python, "-c", _DISCOVERY_LAUNCHER, "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK},
            )
        _LIVE_SERVERS.add(self)

        def answered() -> bool:
            if not self.running:
                code = self._process.returncode if self._process else None
                raise _Exited(f"it exited with code {code}")
            return self.services(timeout_s=1.0).get("status") == "ok"

        try:
            wait_until(
                answered,
                self.startup_timeout_s,
                interval_s=0.1,
                message=lambda: f"discovery server on {self.url} did not answer",
                retry_on=(OSError, ValueError),
            )
        except (_Exited, AssertionError) as exc:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"RL-Insight discovery server failed to start: {exc}; log tail:\n{tail}") from None
        _log.info("discovery server %s up (otlp_port=%s)", self.url, self.otlp_port)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate, then kill after ``timeout_s``; idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)
        _LIVE_SERVERS.discard(self)

    def close(self) -> None:
        """Stop and delete the working directory."""
        self.stop()
        self._workdir.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Exited(Exception):
    """The discovery subprocess exited during startup."""


@atexit.register
def _stop_leftover_servers() -> None:
    for server in list(_LIVE_SERVERS):
        server.stop(timeout_s=2.0)


# ------------------------------------------------------------------------- Ray


@dataclass(frozen=True)
class RayLoopback:
    """What a test needs to know about the Ray cluster started by :func:`ray_loopback`."""

    metrics_port: int
    """Free port for the RL-Insight hub's Prometheus endpoint."""
    gcs_address: str
    """``host:port`` of the cluster, for ``ray.init(address=...)`` in a subprocess."""
    env: Mapping[str, str]
    """Environment given to the driver and, as ``runtime_env`` env_vars, to workers."""

    def init_config(self) -> dict[str, Any]:
        """The ``config=`` argument for ``rl_insight.init``."""
        return {"prometheus": {"metrics_report_port": self.metrics_port}}


@contextlib.contextmanager
def ray_loopback(extra_env: Mapping[str, str] | None = None, *, num_cpus: int = 2) -> Iterator[RayLoopback]:
    """Start a local Ray cluster on 127.0.0.1 and shut it down on exit.

    Sets :data:`RAY_LOOPBACK_ENV` (plus ``extra_env``) in ``os.environ`` for the
    duration and passes the same variables to every worker through the job's
    ``runtime_env``. Raises ``RuntimeError`` if Ray is already initialized.
    """
    env = {**RAY_LOOPBACK_ENV, "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK, **(extra_env or {})}
    saved = {key: os.environ.get(key) for key in env}
    # Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is first imported.
    os.environ.update(env)
    import ray
    from ray._private import ray_constants

    if ray_constants.ENABLE_RAY_CLUSTER:
        _restore_env(saved)
        raise RuntimeError(
            "ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set, so it "
            "would bind a non-loopback address; set it before anything imports ray"
        )
    if ray.is_initialized():
        _restore_env(saved)
        raise RuntimeError("Ray is already initialized in this process")
    try:
        started = time.monotonic()
        ray.init(
            address="local",  # a cluster of its own, even when another one runs on this machine
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            runtime_env={"env_vars": dict(env)},
        )
        wait_until(ray.is_initialized, 30.0, message="ray.is_initialized() stayed false")
        _log.info("ray up in %.1fs", time.monotonic() - started)
        yield RayLoopback(
            metrics_port=free_port(),
            gcs_address=str(ray.get_runtime_context().gcs_address),
            env=env,
        )
    finally:
        ray.shutdown()  # also cleans up after a failed ray.init
        _restore_env(saved)


def _restore_env(saved: Mapping[str, str | None]) -> None:
    """Put back environment variables saved as ``{name: value or None}``."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@dataclass(frozen=True)
class RlInsightHub:
    """An initialized RL-Insight client process and the stack around its hub."""

    metrics_port: int
    receiver: OtlpReceiver
    server: DiscoveryServer
    ray: RayLoopback

    def metrics(self) -> str:
        """The hub's current Prometheus text."""
        return fetch_metrics(self.metrics_port)


def run_python(
    code: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
    args: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with this interpreter in a fresh process (bounded).

    For cases that need a fresh process, e.g. a second ``rl_insight.init`` or a
    new hub (one per Ray job) that discovers a stopped server. ``env`` is added
    to a copy of ``os.environ``. Output is captured; the caller checks
    ``returncode``.
    """
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# ------------------------------------------------- child processes and fakes

CHILD_RELEASE_ENV = "STACK_CHILD_RELEASE_FILE"
"""Names the file whose appearance lets a :class:`PythonChild` exit (not a bridge variable)."""

CHILD_PRELUDE = '''
import json as _stack_json, os as _stack_os, time as _stack_time

def report(value):
    """Hand ``value`` (JSON-able) to the test: one ``RESULT`` line on stdout."""
    print("RESULT " + _stack_json.dumps(value, default=str), flush=True)

def wait_release(timeout_s=180.0):
    """Block until the test calls ``release()`` (bounded)."""
    path = _stack_os.environ["STACK_CHILD_RELEASE_FILE"]
    deadline = _stack_time.monotonic() + timeout_s
    while not _stack_os.path.exists(path):
        if _stack_time.monotonic() > deadline:
            raise SystemExit("never released by the test")
        _stack_time.sleep(0.05)
'''
"""Defines ``report(value)`` and ``wait_release()`` in every :class:`PythonChild`."""


class PythonChild:
    """A fresh Python process that reports results and exits only when the test releases it.

    For work whose effects outlive the call inside the child: a child attached to
    the session's Ray cluster owns a Ray job, and its RL-Insight hub actor dies
    with that job, so the child must stay alive until the test has seen the
    child's spans at the receiver. The child's code can call ``report(value)``
    (read with :meth:`result`) and ``wait_release()`` (unblocked by
    :meth:`release`). stdout and stderr go to files, so no pipe can fill up.
    """

    def __init__(
        self,
        code: str,
        *,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        drop_env: Sequence[str] = (),
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="stack-child-")
        base = Path(self._dir.name)
        self.release_path = base / "release"
        self.stdout_path = base / "stdout"
        self.stderr_path = base / "stderr"
        environ = {**os.environ, **(env or {}), CHILD_RELEASE_ENV: str(self.release_path)}
        for name in drop_env:
            environ.pop(name, None)
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self._process = subprocess.Popen(
                [sys.executable, "-c", CHILD_PRELUDE + code, *args],
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def results(self) -> list[Any]:
        """Every value reported so far."""
        return [json.loads(line[7:]) for line in self.stdout.splitlines() if line.startswith("RESULT ")]

    def result(self, index: int = 0, timeout_s: float = 120.0) -> Any:
        """The ``index``-th reported value, waiting for it (bounded); fails if the child exits first."""

        def reported() -> list[Any] | None:
            found = self.results()
            if len(found) > index:
                return found
            if self._process.poll() is not None:
                found = self.results()  # it may have reported just before exiting
                if len(found) > index:
                    return found
                raise _Exited(f"child exited with code {self._process.returncode}")
            return None

        try:
            return wait_until(reported, timeout_s, interval_s=0.05, retry_on=())[index]
        except (_Exited, AssertionError) as exc:
            raise AssertionError(f"{exc}; child stderr tail:\n{self.stderr[-4000:]}") from None

    def release(self) -> None:
        """Let the child's ``wait_release()`` return."""
        self.release_path.touch()

    def finish(self, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Release the child, wait for it (bounded; killed after ``timeout_s``), return its outputs."""
        self.release()
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        return subprocess.CompletedProcess(self._process.args, self._process.returncode, self.stdout, self.stderr)

    def close(self) -> None:
        """Kill the child if still running and delete its files."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._dir.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeDiscovery:
    """A stand-in for RL-Insight's discovery API that counts every request it gets.

    For environments where RL-Insight's own server cannot run (none, 0.1.0), to
    prove the bridge asks nobody anything: ``RL_INSIGHT_SERVER_URL`` points
    here, and here advertises ``otlp_port`` (e.g. a :class:`OtlpReceiver`).
    """

    def __init__(self, otlp_port: int | None) -> None:
        owner = self
        self.otlp_port = otlp_port
        self._lock = threading.Lock()
        self._requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with owner._lock:
                    owner._requests.append(f"GET {self.path}")
                body = json.dumps(
                    {"status": "ok", "otlp_port": owner.otlp_port, "prometheus_port": None, "grafana_port": None}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                with owner._lock:
                    owner._requests.append(f"POST {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def requests(self) -> list[str]:
        with self._lock:
            return list(self._requests)

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bridge_copy_exporter(bridge: Any, name: str = "memory") -> Any:
    """The exporter that receives *copies* in a bridge configured with ``exporter=[primary, name]``.

    (``bridge.memory_exporter`` is the fallback's memory exporter when the
    fallback is ``memory``, so tests that check what the primary forwarded read
    the copy instead.)
    """
    chain = bridge.pipeline.chain
    copies = {named.name: named.destination for named in (chain.copies if chain is not None else ())}
    if name not in copies:
        raise ValueError("the bridge has no exporter copies (configure exporter=[primary, copy])")
    return copies[name]


def hex_ids(span: Any) -> dict[str, str]:
    """A bridge span's ids as the RL-Insight exporter writes them (``otel.*`` attributes)."""
    context = span.get_span_context()
    return {
        "otel.trace_id": format(context.trace_id, "032x"),
        "otel.span_id": format(context.span_id, "016x"),
        "otel.parent_span_id": format(span.parent.span_id, "016x") if span.parent is not None else "",
    }


def count_metric(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` in Prometheus text whose labels include ``labels``."""
    import re

    found = []
    pattern = re.compile(r"^" + re.escape(name) + r"(?:\{(.*)\})?\s+(\S+)$")
    label_re = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        pairs = label_re.findall(match.group(1) or "")
        got = {key: value.replace('\\"', '"').replace("\\\\", "\\") for key, value in pairs}
        if all(got.get(key) == value for key, value in labels.items()):
            found.append((got, float(match.group(2))))
    return found


def drain(bridge: Any, receiver: OtlpReceiver, timeout_s: float = 60.0) -> None:
    """Wait until everything ``bridge`` exported so far has reached ``receiver``.

    Sends one more span through the same path (the bridge's single export
    thread, then RL-Insight's hub or the OTLP transport, each in order) and waits
    for it, so a later "nothing else arrived" check does not race spans in flight.
    """
    import uuid

    token = uuid.uuid4().hex
    with bridge.span("drain", drain=token):
        pass
    assert bridge.force_flush(timeout_s)
    receiver.wait_for(1, timeout_s, where=lambda s: s.attributes.get("drain") == token)


#: Start of a child script (for :class:`PythonChild`) that records, without changing
#: them, every ``rl_insight.init`` call (``calls``: args, kwargs, thread) and every
#: Python warning (``caught``), e.g. RL-Insight's "called more than once".
INIT_SPY_PREAMBLE = """
import json, sys, threading, warnings
import ray, rl_insight, rl_insight.api
import verl_otel_bridge as vob
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat

caught = []
warnings.simplefilter("always")
warnings.showwarning = lambda message, category, *a, **k: caught.append(f"{category.__name__}: {message}")
calls = []
real_init = rl_insight.init
def spy(*args, **kwargs):
    calls.append({"args": list(args), "kwargs": kwargs, "thread": threading.current_thread().name})
    return real_init(*args, **kwargs)
rl_insight.init = spy
"""
