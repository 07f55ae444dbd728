"""Fixtures for integration tests against the real RL-Insight.

The environment variable ``RL_INSIGHT_TEST_CASE`` names the case the
environment was built for: ``none``, ``0.1.0``, ``0.2.0`` or ``0.3.0`` (the nox
sessions set it). Unset, the case is whatever ``rl-insight`` is installed.

A test declares the cases it applies to with ``@pytest.mark.rl_insight(...)``:
in other cases it is skipped; in its own case a missing or different install
(or, for 0.2.0/0.3.0, a failing ``import rl_insight``) makes it fail, never skip.

The RL-Insight fixtures are session-scoped because RL-Insight only allows it:
``rl_insight.init`` is once per process, and the hub actor (one per Ray job)
asks the discovery server for the OTLP endpoint once, when it starts. So all
tests in a session share one receiver, one server, one Ray and one hub; tell
your spans apart with the ``run_tag`` fixture rather than clearing the receiver.
For a fresh process (second ``init``, a hub that finds the server down) use
``stack.run_python``.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import stack`, any import mode
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `import otlp_receiver`

import stack
from otlp_receiver import OtlpReceiver

CASE_ENV = "RL_INSIGHT_TEST_CASE"
CASES = ("none", "0.1.0", "0.2.0", "0.3.0")

# Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when first imported: set it before
# any test module (or the package under test) can import ray.
os.environ.update(stack.RAY_LOOPBACK_ENV)

# The hub exports spans with an OpenTelemetry BatchSpanProcessor whose default
# delay is 5 s; 200 ms makes span waits short. Production keeps the default.
HUB_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BSP_MAX_QUEUE_SIZE": "8192"}

_case_key = pytest.StashKey[str]()
_checked_key = pytest.StashKey[dict[str, str]]()  # case -> failure message ("" = ok)


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker and resolve the rl-insight case once."""
    config.addinivalue_line("markers", "rl_insight(*cases): run only in these rl-insight cases (none, 0.1.0, ...)")
    declared = os.environ.get(CASE_ENV, "").strip()
    if declared and declared not in CASES:
        raise pytest.UsageError(f"{CASE_ENV}={declared!r}; expected one of {CASES}")
    config.stash[_case_key] = declared or stack.installed_rl_insight_version()
    config.stash[_checked_key] = {}


def pytest_report_header(config: pytest.Config) -> str:
    """Show the case and what is actually installed."""
    source = "declared" if os.environ.get(CASE_ENV, "").strip() else "detected"
    return (
        f"rl-insight case: {config.stash[_case_key]} ({source} via {CASE_ENV}); "
        f"installed: {stack.installed_rl_insight_version()}"
    )


def _installation_problem(case: str) -> str:
    """Why the environment does not match ``case`` ("" when it does)."""
    installed = stack.installed_rl_insight_version()
    if installed != case:
        return f"{CASE_ENV} case is {case!r} but the installed rl-insight is {installed!r}"
    if case in ("0.2.0", "0.3.0"):
        try:  # without ray, rl_insight imports but init() raises ValueError
            importlib.import_module("ray")
            importlib.import_module("rl_insight.api")
        except Exception as exc:  # noqa: BLE001 - reported as a test failure
            return f"rl-insight {case} is installed but not importable: {exc!r}"
    return ""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip tests of other cases; fail tests of this case if the install is wrong."""
    marker = item.get_closest_marker("rl_insight")
    if marker is None:
        return
    unknown = set(marker.args) - set(CASES)
    if unknown:
        pytest.fail(f"unknown rl_insight case(s) {sorted(unknown)} in marker", pytrace=False)
    case = item.config.stash[_case_key]
    if case not in marker.args:
        pytest.skip(f"needs rl-insight {' or '.join(marker.args)}; this environment is {case!r}")
    checked = item.config.stash[_checked_key]
    if case not in checked:
        checked[case] = _installation_problem(case)
    if checked[case]:
        pytest.fail(checked[case], pytrace=False)


@pytest.fixture(scope="session")
def rl_insight_case(pytestconfig: pytest.Config) -> str:
    """The rl-insight case of this run: ``none``, ``0.1.0``, ``0.2.0`` or ``0.3.0``."""
    return pytestconfig.stash[_case_key]


@pytest.fixture
def run_tag() -> str:
    """A unique value to tag this test's spans/metrics with and filter on."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """The OTLP/HTTP receiver the session's discovery server advertises."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def fresh_otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver of this test's own, for an exporter the test configures (not the hub)."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def rl_insight_server(otlp_receiver: OtlpReceiver) -> Iterator[stack.DiscoveryServer]:
    """RL-Insight's discovery server, with ``RL_INSIGHT_SERVER_URL`` set to it."""
    with stack.DiscoveryServer(otlp_port=otlp_receiver.port) as server, pytest.MonkeyPatch.context() as patch:
        patch.setenv("RL_INSIGHT_SERVER_URL", server.url)
        yield server


@pytest.fixture(scope="session")
def ray_local() -> Iterator[stack.RayLoopback]:
    """A local Ray cluster on loopback, started once per session (about 3-4 s)."""
    with stack.ray_loopback(HUB_ENV) as ray_info:
        yield ray_info


@pytest.fixture(scope="session")
def rl_insight_hub(
    rl_insight_server: stack.DiscoveryServer,
    ray_local: stack.RayLoopback,
    otlp_receiver: OtlpReceiver,
) -> Iterator[stack.RlInsightHub]:
    """Call ``rl_insight.init`` once for the session and wait until its hub serves.

    Every span therefore carries ``project="p"``, ``experiment_name="e"`` and
    ``process_id``. Written for rl-insight 0.3.0 (0.2.0's hub reads
    ``RL_INSIGHT_SERVER_URL`` only from the worker environment).
    """
    import rl_insight
    import rl_insight.api

    if rl_insight.api._STATE.enabled:
        pytest.fail("rl_insight.init was already called in this process", pytrace=False)
    rl_insight.init(project="p", experiment_name="e", config=ray_local.init_config())
    if not rl_insight.api._STATE.enabled:
        pytest.fail(f"rl_insight.init left monitoring disabled: {rl_insight.api._STATE}")
    stack.wait_until(
        lambda: stack.fetch_metrics(ray_local.metrics_port),
        60.0,
        interval_s=0.2,
        message=f"hub metrics endpoint on port {ray_local.metrics_port} never answered",
    )
    try:
        yield stack.RlInsightHub(ray_local.metrics_port, otlp_receiver, rl_insight_server, ray_local)
    finally:
        # The hub dies with Ray; emits after that would raise, so disable them.
        rl_insight.finish()


# --------------------------------------------------------------------------
# Added for the bridge-level integration tests (test_forwarding, test_old_releases,
# test_identity_parity, test_dashboard_contract, test_verl_facade).

from typing import Any  # noqa: E402


@pytest.fixture
def make_bridge() -> Iterator[Any]:
    """``make_bridge(**settings)``: a ``Bridge`` from exactly these settings (and ``environ``, empty by default),
    shut down after.

    Also sets it as the current bridge (for ``verl_otel_bridge.session`` & co.) and
    restores the previous one at the end.
    """
    from verl_otel_bridge import Bridge, BridgeConfig, set_bridge

    made: list[Any] = []
    previous: list[Any] = []

    def make(*, environ: dict[str, str] | None = None, **settings: Any) -> Any:
        bridge = Bridge(BridgeConfig.resolve(environ=environ or {}, **settings))
        made.append(bridge)
        previous.append(set_bridge(bridge))
        return bridge

    yield make
    if previous:
        set_bridge(previous[0])
    for bridge in made:
        bridge.shutdown(timeout_s=10)


@pytest.fixture(autouse=True)
def _fresh_unusable_reason_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test logs "RL-Insight is not usable" as a fresh process would.

    The bridge says a reason fixed by what is installed (``not_installed``,
    ``no_version``, ...) once per *process*; tests here share one process, so
    each gets an empty record of what was said (``rl_insight.init``'s own
    once-per-process record is left alone: the session's hub fixture owns it).
    """
    from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat

    monkeypatch.setattr(rl_insight_compat._INIT, "said", set())
