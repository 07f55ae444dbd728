"""Unit-test isolation: no outer environment, no real RL-Insight, no leftover bridges."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # `import otlp_receiver`, shared with every suite and bench

from otlp_receiver import OtlpReceiver

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.pipeline.spill import settings as spill_settings
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat

from .fake_rl_insight import hide_rl_insight

_ISOLATED_PREFIXES = ("VERL_OTEL_BRIDGE_", "OTEL_")
_ISOLATED_NAMES = ("RL_INSIGHT_SERVER_URL", "VERL_RL_INSIGHT_ENABLE")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Every test starts from the same world, whatever the outer process has.

    * no ``VERL_OTEL_BRIDGE_*``, ``OTEL_*``, ``RL_INSIGHT_SERVER_URL``, ``VERL_RL_INSIGHT_ENABLE``;
    * ``rl_insight`` and ``ray`` unimportable (tests install fakes explicitly);
    * a fresh once-per-process ``rl_insight.init`` record;
    * spill files in the test's own directory (``spill`` under ``tmp_path``), not the shared default;
    * an empty current-bridge slot, restored (and whatever the test left shut down) afterwards.
    """
    for name in list(os.environ):
        if name.startswith(_ISOLATED_PREFIXES) or name in _ISOLATED_NAMES:
            monkeypatch.delenv(name)
    hide_rl_insight(monkeypatch)
    monkeypatch.setattr(rl_insight_compat, "_INIT", rl_insight_compat._InitOnce())
    monkeypatch.setattr(spill_settings, "default_spill_dir", lambda: str(tmp_path / "spill"))
    previous = vob.set_bridge(None)
    yield
    leftover = vob.set_bridge(previous)
    if leftover is not None:
        leftover.shutdown(timeout_s=2)


@pytest.fixture
def make_bridge() -> Iterator[Callable[..., Bridge]]:
    """``make_bridge(**settings)``: a ``Bridge`` from these settings only (empty environment), shut down after."""
    made: list[Bridge] = []

    def make(*, environ: dict[str, str] | None = None, **settings: Any) -> Bridge:
        bridge = Bridge(BridgeConfig.resolve(environ=environ or {}, **settings))
        made.append(bridge)
        return bridge

    yield make
    for bridge in reversed(made):
        bridge.shutdown(timeout_s=2)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event hung exporters and fakes wait on; opened at teardown, before ``make_bridge`` shuts bridges down."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def start_receiver() -> Iterator[Callable[..., OtlpReceiver]]:
    """``start_receiver(**options)``: a loopback :class:`OtlpReceiver` with those options, stopped after the test."""
    started: list[OtlpReceiver] = []

    def start(**options: Any) -> OtlpReceiver:
        started.append(OtlpReceiver(**options))
        return started[-1]

    yield start
    for receiver in started:
        receiver.stop()


@pytest.fixture(scope="session")
def demo_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The capture ``make demo`` writes (its simulated step, with its planted straggler, error and zero-advantage
    group), made once per test run."""
    import asyncio

    from verl_otel_bridge.cli import demo  # the ``cli`` extra; only the tests that use the demo need it

    capture = tmp_path_factory.mktemp("demo") / "demo.jsonl"
    config = BridgeConfig.resolve(
        environ={}, exporter="jsonl", jsonl_path=str(capture), progress_interval_s=demo.DEMO_PROGRESS_INTERVAL_S
    )
    previous = vob.set_bridge(None)
    try:
        vob.configure(config)
        asyncio.run(demo.run())  # shuts the bridge down at the end
    finally:
        vob.set_bridge(previous)
    return capture
