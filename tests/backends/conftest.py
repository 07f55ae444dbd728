"""Real Arize Phoenix and MLflow servers on loopback, each fed the simulated agent loop once.

Phoenix's OTLP gRPC listener binds ``[::]`` whatever ``PHOENIX_HOST`` says
(``phoenix/server/grpc_server.py``), so these tests run only inside a network
namespace whose one interface is ``lo`` (``nox -s backends`` runs pytest under
``unshare -n``): there a wildcard listener is reachable from loopback only.
Outside such a namespace every test here errors, naming the reason. Every
listener of every server process is checked after start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # stack: free_port, wait_until
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # chromium, otlp_receiver

import chromium
import simulated
import stack
from stack import LOOPBACK, free_port, wait_until

import verl_otel_bridge as vob
from verl_otel_bridge.cli import app as cli

BIN = Path(sys.executable).parent
START_S = 240.0  # Phoenix's first start migrates its database: ~25 s on an idle 2-core machine
ARRIVAL_S = 60.0
#: Wildcard listeners are only acceptable inside a loopback-only network namespace.
WILDCARDS = frozenset({"0.0.0.0", "::"})
LOOPBACKS = frozenset({LOOPBACK, "::1"})
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def loopback_only_namespace() -> bool:
    """Whether this process's network namespace has no interface but ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


@pytest.fixture(scope="session", autouse=True)
def _isolated_network() -> None:
    if not loopback_only_namespace():
        pytest.fail(
            "tests/backends start Phoenix, whose OTLP gRPC listener binds [::] whatever PHOENIX_HOST says; "
            f"this network namespace has interfaces {[n for _, n in socket.if_nameindex()]}. Run them with "
            "`nox -s backends`, which runs pytest in a loopback-only namespace (unshare -n; ip link set lo up)."
        )


def request(url: str, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> Any:
    """GET (or POST ``body`` as JSON) a loopback URL without any proxy; the decoded JSON answer."""
    assert url.startswith(f"http://{LOOPBACK}:"), url
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with _OPENER.open(req, timeout=timeout_s) as response:
        return json.loads(response.read())


@dataclass
class Server:
    """A server process started by a fixture."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def listeners(self) -> set[tuple[str, int]]:
        """Every TCP address the server's processes (it and its children) listen on."""
        found: set[tuple[str, int]] = set()
        root = psutil.Process(self.process.pid)
        for process in (root, *root.children(recursive=True)):
            try:
                connections = process.net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            found |= {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
        return found

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def start(name: str, command: list[str], env: dict[str, str], health_url: str, workdir: Path) -> Server:
    """Start ``command``, wait (bounded) until ``health_url`` answers, and check its listeners."""
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    server = Server(name, process, health_url.rsplit("/", 1)[0], log)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{server.log_tail()}")
        stack.http_get(health_url)
        return True

    try:
        wait_until(up, START_S, interval_s=0.5, retry_on=(OSError,), message=lambda: f"{name} did not start")
    except BaseException:
        stop(server)
        raise
    return server


def stop(server: Server) -> None:
    root = psutil.Process(server.process.pid)
    children = root.children(recursive=True)
    server.process.terminate()
    try:
        server.process.wait(20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(10)
    for child in children:  # workers that outlive their parent
        if child.is_running():
            child.kill()


def assert_loopback_listeners(server: Server) -> set[tuple[str, int]]:
    """Fail unless every listener is a loopback address (a wildcard only in a loopback-only namespace)."""
    listeners = server.listeners()
    assert listeners, f"{server.name} listens nowhere?"
    bad = {
        (ip, port)
        for ip, port in listeners
        if ip not in LOOPBACKS and not (ip in WILDCARDS and loopback_only_namespace())
    }
    assert not bad, f"{server.name} listens beyond loopback: {sorted(bad)}"
    return listeners


@dataclass
class Phoenix:
    server: Server
    grpc_port: int

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        answer = request(f"{self.server.url}/graphql", {"query": query, "variables": variables})
        assert not answer.get("errors"), answer["errors"]
        return dict(answer["data"])


@contextmanager
def running_phoenix(workdir: Path, command: Path = BIN / "phoenix") -> Iterator[Phoenix]:
    """``phoenix serve`` (``command``: this environment's, or another's, e.g. from tests/verl) on loopback ports,
    its database in ``workdir``; stopped on exit."""
    port, grpc_port = free_port(), free_port()
    env = {
        "PHOENIX_HOST": LOOPBACK,
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    server = start("phoenix", [str(command), "serve"], env, f"http://{LOOPBACK}:{port}/healthz", workdir)
    try:
        yield Phoenix(server, grpc_port)
    finally:
        stop(server)


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as server:
        yield server


@dataclass
class Mlflow:
    server: Server
    experiment_id: str

    @property
    def traces_endpoint(self) -> str:
        return f"{self.server.url}/v1/traces"


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mlflow]:
    workdir = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [
        str(BIN / "mlflow"),
        "server",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{workdir / 'mlflow.db'}",
        "--default-artifact-root",
        str(workdir / "artifacts"),
    ]
    server = start("mlflow", command, {}, f"http://{LOOPBACK}:{port}/health", workdir)
    try:
        created = request(f"{server.url}/api/2.0/mlflow/experiments/create", {"name": "verl-otel-bridge"})
        yield Mlflow(server, str(created["experiment_id"]))
    finally:
        stop(server)


def send_agent_loop(endpoint: str, experiment: str, headers: str = "") -> tuple[simulated.Sent, dict[str, Any]]:
    """Run the simulated loop through ``exporter: otlp`` to ``endpoint``; what was sent, and ``status()``."""
    spill = tempfile.TemporaryDirectory(prefix="verl-otel-bridge-spill-")  # what a refusing backend leaves
    bridge = vob.Bridge(
        vob.BridgeConfig.resolve(
            exporter="otlp",
            otlp_endpoint=endpoint,
            project=experiment,
            schedule_delay_ms=50,
            spill_dir=spill.name,
            environ={"OTEL_EXPORTER_OTLP_HEADERS": headers},
        )
    )
    previous = vob.set_bridge(bridge)
    try:
        sent = simulated.run_agent_loop(bridge, experiment)
        assert bridge.force_flush(30)
        return sent, bridge.status()
    finally:
        vob.set_bridge(previous)
        bridge.shutdown()
        spill.cleanup()


def doctor(monkeypatch: pytest.MonkeyPatch, endpoint: str, headers: str) -> tuple[int, dict[str, Any], str]:
    """``verl-otel-bridge doctor`` for ``exporter: otlp`` to ``endpoint``: exit code, JSON report, text report."""
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "otlp")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", headers)
    as_json = CliRunner().invoke(cli.build_cli(), ["doctor", "--json"], catch_exceptions=False)
    text = CliRunner().invoke(cli.build_cli(), ["doctor"], catch_exceptions=False)
    assert as_json.exit_code == text.exit_code, text.output
    return as_json.exit_code, json.loads(as_json.stdout), text.output


#: ``SCREENSHOT_DIR=docs/img nox -s backends`` refreshes the screenshots in docs/backends.md.
SCREENSHOT_DIR_ENV = "SCREENSHOT_DIR"


def screenshot(
    url: str,
    name: str,
    tmp_path: Path,
    *,
    shows: Sequence[str],
    hides: Sequence[str] = (),
    within: str = "body",
    local_storage: Mapping[str, str] | None = None,
) -> Path:
    """A PNG of ``url`` by headless Chromium (into ``$SCREENSHOT_DIR`` if set) once one element
    matching ``within`` shows every string of ``shows`` on screen (:func:`chromium.screenshot`).

    ``local_storage`` is set in the server's origin first (the app's "already seen" flags, column
    choices); the page must show none of ``hides`` (the popups those flags keep away). Skips
    without Chromium.
    """
    assert url.startswith(f"http://{LOOPBACK}:"), url
    target = Path(os.environ.get(SCREENSHOT_DIR_ENV) or tmp_path) / f"{name}.png"
    shot = chromium.screenshot(
        url,
        target,
        tmp_path / f"chromium-{name}",
        shows=shows,
        hides=hides,
        within=within,
        local_storage=local_storage,
    )
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), shot
    return shot
