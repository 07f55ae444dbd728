"""RL-Insight version gate and runtime checks, with fakes shaped like each release (edge cases only).

Real releases are exercised by ``tests/integration``.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from threads import run_threads

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal import logs
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge._internal.rl_insight.exporter import RLInsightSpanExporter
from verl_otel_bridge.testing import SpanCapture

from .fake_rl_insight import (
    FakeRLInsight,
    install_broken_rl_insight,
    install_ray,
    install_rl_insight,
    usable_rl_insight,
)
from .helpers import WAIT_S, assert_balanced, identity_of

T0 = 1_700_000_000_000_000_000
OTEL_TYPES = (str, bool, int, float)


def make_session(bridge: Bridge, **identity: Any) -> dict[str, Any]:
    """A session with a turn, a recorded span and a failed tool span; returns the identity dict."""
    identity = {"sample": 3, "session": 1, "traj": 2, "uid": "u", "global_steps": 8, **identity}
    with bridge.session(**identity) as session:
        with bridge.span("turn", turn=0, tools=["search", "calc"]):
            bridge.record_span("generate", start_time_ns=T0, end_time_ns=T0 + 123_456_789, attributes={"tokens": 5})
        try:
            with bridge.span("tool"):
                raise ValueError("bad args")
        except ValueError:
            pass
    return session.identity.to_dict()


# -- unusable RL-Insight: every reason ------------------------------------------------


@dataclass
class Case:
    setup: Callable[[pytest.MonkeyPatch], FakeRLInsight | None]
    reason: str
    detail: list[str]
    version: str | None = None
    installed: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _runtime_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    install_ray(monkeypatch, initialized=True)
    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", "http://127.0.0.1:1")


def _release(release: str, **kwargs: Any) -> Callable[[pytest.MonkeyPatch], FakeRLInsight]:
    def setup(monkeypatch: pytest.MonkeyPatch) -> FakeRLInsight:
        _runtime_ok(monkeypatch)
        return install_rl_insight(monkeypatch, release, **kwargs)

    return setup


def _broken(exc: BaseException) -> Callable[[pytest.MonkeyPatch], None]:
    def setup(monkeypatch: pytest.MonkeyPatch) -> None:
        _runtime_ok(monkeypatch)
        install_broken_rl_insight(monkeypatch, exc, installed="0.3.0")

    return setup


def _missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _runtime_ok(monkeypatch)  # rl_insight itself stays hidden (conftest)


def _no_url(monkeypatch: pytest.MonkeyPatch) -> FakeRLInsight:
    fake = usable_rl_insight(monkeypatch)
    monkeypatch.delenv("RL_INSIGHT_SERVER_URL")
    return fake


def _ray(initialized: bool | None) -> Callable[[pytest.MonkeyPatch], FakeRLInsight]:
    def setup(monkeypatch: pytest.MonkeyPatch) -> FakeRLInsight:
        fake = usable_rl_insight(monkeypatch)
        if initialized is None:
            monkeypatch.setitem(sys.modules, "ray", None)  # ray not installed
        else:
            install_ray(monkeypatch, initialized=initialized)
        return fake

    return setup


def _init_does_nothing(monkeypatch: pytest.MonkeyPatch) -> FakeRLInsight:
    fake = usable_rl_insight(monkeypatch)
    fake.module.init = lambda **kwargs: fake.init_calls.append(kwargs)  # e.g. a config RL-Insight rejected
    return fake


def _init_raises(monkeypatch: pytest.MonkeyPatch) -> FakeRLInsight:
    fake = usable_rl_insight(monkeypatch)

    def init(**kwargs: Any) -> None:
        fake.init_calls.append(kwargs)
        raise ConnectionError("hub unreachable")

    fake.module.init = init
    return fake


def _claiming(version: str, reason: str, phrases: list[str], **kwargs: Any) -> Case:
    """A case of a 0.3.0-shaped release whose ``__version__`` and metadata both say ``version``."""
    setup = _release("0.3.0", version=version, installed=version, **kwargs)
    return Case(setup, reason, phrases, version=version, installed=version)


#: ``version`` and ``installed`` of a case where the release says 0.3.0 both ways.
SAYS_0_3_0: dict[str, Any] = {"version": "0.3.0", "installed": "0.3.0"}

UNUSABLE: dict[str, Case] = {
    "0.1.0": Case(_release("0.1.0"), "no_version", ["rl-insight 0.1.0", ">= 0.3.0"], installed="0.1.0"),
    "0.2.0": Case(_release("0.2.0"), "no_version", ["rl-insight 0.2.0", ">= 0.3.0"], installed="0.2.0"),
    "0.2.0-no-metadata": Case(
        _release("0.2.0", installed=None), "no_version", ["version unknown", ">= 0.3.0"], installed=None
    ),
    "0.3.0rc1": _claiming("0.3.0rc1", "version_too_old", ["0.3.0rc1", ">= 0.3.0"]),
    "0.2.9-claims": _claiming("0.2.9", "version_too_old", ["0.2.9", ">= 0.3.0"]),
    "unknown": Case(
        _release("0.3.0", version="unknown", installed=None),
        "version_unparsable",
        ["'unknown'", ">= 0.3.0"],
        version="unknown",
    ),
    "1.0-without-trace_span": _claiming("1.0", "no_trace_span", ["1.0", "trace_span"], trace_span=None),
    "trace_span-not-callable": Case(
        _release("0.3.0", trace_span="trace_span"),
        "no_trace_span",
        ["0.3.0", "trace_span"],
        **SAYS_0_3_0,
    ),
    "missing": Case(_missing, "not_installed", ["not installed", ">= 0.3.0"]),
    "import-raises": Case(
        _broken(RuntimeError("libfoo.so: cannot open shared object")),
        "import_failed",
        ["RuntimeError", "libfoo.so"],
        installed="0.3.0",
    ),
    "dependency-missing": Case(
        _broken(ModuleNotFoundError("No module named 'omegaconf'", name="omegaconf")),
        "import_failed",
        ["omegaconf"],
        installed="0.3.0",
    ),
    "no-server-url": Case(_no_url, "no_server_url", ["rl-insight 0.3.0", "RL_INSIGHT_SERVER_URL"], **SAYS_0_3_0),
    "ray-not-initialized": Case(
        _ray(False),
        "ray_not_initialized",
        ["rl-insight 0.3.0", "Ray is not initialized"],
        **SAYS_0_3_0,
    ),
    "ray-not-installed": Case(_ray(None), "ray_not_initialized", ["Ray is not initialized"], **SAYS_0_3_0),
    "init-leaves-it-off": Case(_init_does_nothing, "init_failed", ["0.3.0", "off after init"], **SAYS_0_3_0),
    "init-raises": Case(_init_raises, "init_failed", ["ConnectionError", "hub unreachable"], **SAYS_0_3_0),
}


@pytest.mark.parametrize("case_id", list(UNUSABLE))
def test_unusable_rl_insight_falls_back_with_full_identity(
    case_id: str,
    monkeypatch: pytest.MonkeyPatch,
    make_bridge: Callable[..., Bridge],
    caplog: pytest.LogCaptureFixture,
) -> None:
    case = UNUSABLE[case_id]
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    fake = case.setup(monkeypatch)
    bridge = make_bridge(exporter="rl_insight", project="p", experiment_name="e")

    identities = []
    for round_ in range(4):  # four separate exports
        identities.append(make_session(bridge, sample=round_))
        assert bridge.force_flush(WAIT_S)
    counters = assert_balanced(bridge)
    status = bridge.status()

    spans = bridge.memory_exporter.get_finished_spans()
    assert len(spans) == 4 * 4 and counters["fallback"] == 4 * 4 and counters["exported"] == {}
    for span in spans:
        assert identity_of(span) in identities, span.name
    assert status["exporter"] == "memory (fallback)"
    assert status["reason"] == case.reason
    for fragment in case.detail:
        assert fragment in status["detail"], (fragment, status["detail"])
    assert status["rl_insight_version"] == case.version
    assert status["rl_insight_package_version"] == case.installed
    assert status["rl_insight_installed"] is (case.reason != "not_installed")
    # every destination that received spans is listed with its count, the fallback included
    assert status["exporters"]["memory"] == {
        "role": "fallback",
        "exported": 4 * 4,
        "failed": 0,
        "spilled": 0,
        "discarded": 0,
        "endpoint": None,
        "path": None,
        "last_error": None,
    }
    assert status["exporters"]["rl_insight"]["exported"] == 0
    # said once (a WARNING: rl_insight was asked for by name), however many exports and status() calls
    bridge.status()
    said = [r for r in caplog.records if "not usable" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert case.reason in said[0].getMessage()
    if fake is not None:  # nothing was sent into a void
        assert fake.calls == [] and fake.ignored == 0
        if case.reason != "init_failed":
            assert fake.init_calls == []
        else:
            assert len(fake.init_calls) == 1  # tried once, not per export


def test_each_bridge_logs_its_own_reason_once(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    _no_url(monkeypatch)
    bridges = [make_bridge(exporter="rl_insight") for _ in range(2)]
    for bridge in bridges:
        for _ in range(3):
            make_session(bridge)
            assert bridge.force_flush(WAIT_S)
    said = [r for r in caplog.records if "not usable" in r.getMessage()]
    assert len(said) == 2


def test_reminder_while_rl_insight_stays_unusable(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge], caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    monkeypatch.setattr(logs, "time", SimpleNamespace(monotonic=lambda: now[0]))
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    bridge = make_bridge(exporter="rl_insight", reminder_interval_s=600)

    def export_and_count() -> list[str]:
        make_session(bridge)
        assert bridge.force_flush(WAIT_S)
        return [r.getMessage() for r in caplog.records if "not usable" in r.getMessage()]

    assert len(export_and_count()) == 1
    now[0] += 599
    assert len(export_and_count()) == 1
    now[0] += 2
    said = export_and_count()
    assert (
        len(said) == 2
        and "still not usable" in said[1]
        and re.search(r"\d+ spans sent to the memory exporter", said[1])
    )
    assert len(export_and_count()) == 2


def test_runtime_preconditions_are_rechecked(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]
) -> None:
    fake = _no_url(monkeypatch)
    bridge = make_bridge(exporter="rl_insight")
    make_session(bridge)
    assert bridge.force_flush(WAIT_S)
    assert bridge.status()["reason"] == "no_server_url"

    monkeypatch.setenv("RL_INSIGHT_SERVER_URL", "http://127.0.0.1:1")
    make_session(bridge)
    assert bridge.force_flush(WAIT_S)
    assert (bridge.status()["reason"], bridge.status()["exporter"]) == ("ok", "rl_insight")
    assert len(fake.calls) == 4

    sys.modules["ray"].initialized = False  # Ray shut down
    make_session(bridge)
    counters = assert_balanced(bridge)
    assert bridge.status()["reason"] == "ray_not_initialized"
    assert (counters["fallback"], counters["exported"]) == (8, {"rl_insight": 4})
    assert fake.ignored == 0


# -- usable RL-Insight --------------------------------------------------------------


def _is_otel_value(value: Any) -> bool:
    if isinstance(value, OTEL_TYPES):
        return True
    return (
        isinstance(value, tuple)
        and len({type(v) for v in value}) <= 1
        and all(isinstance(v, OTEL_TYPES) for v in value)
    )


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "1.0"])
def test_usable_rl_insight_receives_every_span_exactly(
    version: str, monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]
) -> None:
    fake = usable_rl_insight(monkeypatch, version)
    bridge = make_bridge(
        exporter="rl_insight",
        project="p",
        experiment_name="e",
        rl_insight_config={"prometheus": {"metrics_report_port": 19092}},
    )
    identity = make_session(bridge)
    counters = assert_balanced(bridge)

    assert counters["exported"] == {"rl_insight": 4} and counters["fallback"] == 0
    assert bridge.status()["reason"] == "ok" and bridge.status()["rl_insight_version"] == version
    assert len(fake.init_calls) == 1
    init = fake.init_calls[0]
    assert (init["project"], init["experiment_name"]) == ("p", "e")
    assert init["config"]["prometheus"] == {"metrics_report_port": 19092}

    calls = {call.name: call for call in fake.calls}
    assert sorted(calls) == ["agent_session", "generate", "tool", "turn"]
    session, turn, generate, tool = (calls[n] for n in ("agent_session", "turn", "generate", "tool"))
    trace_id = session.attributes["otel.trace_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id)
    for call in calls.values():
        assert identity_of(call.attributes) == identity
        assert call.attributes["otel.trace_id"] == trace_id
        assert re.fullmatch(r"[0-9a-f]{16}", call.attributes["otel.span_id"])
        assert all(_is_otel_value(v) for v in call.attributes.values()), call.attributes
        assert isinstance(call.start_time_ns, int) and call.end_time_ns >= call.start_time_ns
    assert (generate.start_time_ns, generate.end_time_ns) == (T0, T0 + 123_456_789)
    assert generate.attributes == {
        **identity,
        "tokens": 5,
        "otel.trace_id": trace_id,
        "otel.span_id": generate.attributes["otel.span_id"],
        "otel.parent_span_id": turn.attributes["otel.span_id"],
        "otel.status_code": "UNSET",
    }
    assert turn.attributes["tools"] == ("search", "calc") and turn.attributes["turn"] == 0
    assert turn.attributes["otel.parent_span_id"] == session.attributes["otel.span_id"]
    assert session.attributes["otel.parent_span_id"] == ""
    assert session.attributes["monitor.trace_source"] == "session"
    assert session.attributes["status"] == "success"
    assert tool.attributes["otel.status_code"] == "ERROR"
    assert tool.attributes["exception.type"] == "ValueError"
    assert tool.attributes["exception.message"] == "bad args"
    assert "bad args" in tool.attributes["otel.status_description"]


def test_server_url_from_bridge_config_is_enough(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]
) -> None:
    """``rl_insight_server_url`` in the bridge config (no environment variable) must reach rl_insight.init."""
    fake = _no_url(monkeypatch)
    bridge = make_bridge(exporter="rl_insight", rl_insight_server_url="http://127.0.0.1:2")
    make_session(bridge)
    counters = assert_balanced(bridge)
    assert bridge.status()["reason"] == "ok", bridge.status()["detail"]
    assert counters["exported"] == {"rl_insight": 4}
    assert len(fake.calls) == 4 and fake.ignored == 0


def test_0_2_0_is_never_initialized(monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]) -> None:
    fake = _release("0.2.0")(monkeypatch)
    bridge = make_bridge(exporter="auto")
    make_session(bridge)
    assert_balanced(bridge)
    assert fake.init_calls == [] and not fake.enabled
    assert rl_insight_compat.init_calls() == 0


# -- exactly-once init ----------------------------------------------------------------


def _export_concurrently(exporter: RLInsightSpanExporter, spans: list[Any]) -> None:
    barrier = threading.Barrier(len(spans), timeout=WAIT_S)

    def run(span: Any) -> None:
        barrier.wait()
        exporter.export([span])

    assert not run_threads(lambda span=span: run(span) for span in spans)


def _spans(capture: SpanCapture, n: int) -> list[Any]:
    with capture.bridge.session(sample=0, session=0):
        for i in range(n - 1):
            with capture.bridge.span(f"s{i}"):
                pass
    return capture.spans


def test_32_threads_exporting_at_once_init_exactly_once(
    monkeypatch: pytest.MonkeyPatch, otel_spans: SpanCapture
) -> None:
    fake = usable_rl_insight(monkeypatch)
    fake.init_delay_s = 0.05  # a slow init (the real one creates a Ray actor) widens the race
    exporter = RLInsightSpanExporter(config=BridgeConfig.resolve(environ={}, project="p", experiment_name="e"))
    _export_concurrently(exporter, _spans(otel_spans, 32))
    assert len(fake.init_calls) == 1
    assert rl_insight_compat.init_calls() == 1
    assert len(fake.calls) == 32 and fake.ignored == 0
    assert exporter.counts.get("exported.rl_insight") == 32


def test_init_done_elsewhere_is_not_repeated(monkeypatch: pytest.MonkeyPatch, otel_spans: SpanCapture) -> None:
    fake = usable_rl_insight(monkeypatch)
    fake.enable()  # the trainer already called rl_insight.init
    exporter = RLInsightSpanExporter(config=BridgeConfig.resolve(environ={}))
    _export_concurrently(exporter, _spans(otel_spans, 8))
    assert fake.init_calls == []
    assert rl_insight_compat.init_calls() == 0
    assert len(fake.calls) == 8


def test_two_bridges_init_once(monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]) -> None:
    fake = usable_rl_insight(monkeypatch)
    for _ in range(2):
        bridge = make_bridge(exporter="rl_insight")
        make_session(bridge)
        assert_balanced(bridge)
    assert len(fake.init_calls) == 1 and len(fake.calls) == 8


def test_server_url_in_rl_insight_config_is_enough(
    monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]
) -> None:
    """``rl_insight.init`` also takes the URL from ``config["server"]["url"]``; the runtime check must agree."""
    fake = _no_url(monkeypatch)
    bridge = make_bridge(exporter="rl_insight", rl_insight_config={"server": {"url": "http://127.0.0.1:3"}})
    make_session(bridge)
    assert_balanced(bridge)
    assert bridge.status()["reason"] == "ok", bridge.status()["detail"]
    assert len(fake.calls) == 4
