"""The OTLP path inside a bridge: its own requests are never traced, and its deadlines hold while it retries."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import OtlpReceiver

import verl_otel_bridge as vob
from verl_otel_bridge import Bridge
from verl_otel_bridge._internal.accounting import balance
from verl_otel_bridge._internal.rl_insight.otlp import SERVICES_PATH

from .fake_rl_insight import usable_rl_insight
from .helpers import WAIT_S, StartReceiver, wait_until

urllib3 = pytest.importorskip("urllib3")
instrumentation = pytest.importorskip("opentelemetry.instrumentation.urllib3")


@pytest.fixture
def instrumented_urllib3() -> Iterator[Callable[[TracerProvider], None]]:
    """``instrument(provider)``: OpenTelemetry's urllib3 instrumentation on ``provider``, removed after the test."""
    instrumentor = instrumentation.URLLib3Instrumentor()

    def instrument(provider: TracerProvider) -> None:
        instrumentor.instrument(tracer_provider=provider)

    yield instrument
    instrumentor.uninstrument()


def _posted_span_names(sink: OtlpReceiver) -> list[str]:
    return [span.name for span in sink.spans]


@pytest.mark.parametrize("route", ["exporter-otlp", "rl-insight-otlp-transport"])
def test_an_instrumented_http_library_traces_the_users_requests_not_the_bridges(
    start_receiver: StartReceiver,
    monkeypatch: pytest.MonkeyPatch,
    instrumented_urllib3: Callable[[TracerProvider], None],
    route: str,
) -> None:
    sink = start_receiver()
    app_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(app_spans))
    instrumented_urllib3(provider)
    if route == "exporter-otlp":
        settings: dict[str, Any] = {"exporter": "otlp", "otlp_endpoint": sink.url}
        exported = "otlp"
    else:
        usable_rl_insight(monkeypatch)
        monkeypatch.setenv("RL_INSIGHT_SERVER_URL", sink.base_url)
        settings = {"exporter": "rl_insight", "rl_insight_transport": "otlp"}
        exported = "rl_insight_otlp"
    bridge = vob.instrument(provider, schedule_delay_ms=50, **settings)
    with bridge.span("work"):
        answer = urllib3.PoolManager().request("GET", sink.base_url + SERVICES_PATH)
        assert answer.status == 200
    assert bridge.force_flush(WAIT_S)
    for _ in range(3):  # more export rounds: an untraced exporter stays untraced
        with bridge.span("more"):
            pass
        assert bridge.force_flush(WAIT_S)
    http_spans = [s for s in app_spans.get_finished_spans() if s.instrumentation_scope.name.endswith("urllib3")]
    assert [s.name for s in http_spans] == ["GET"], [s.name for s in http_spans]  # the user's, and only that
    assert sum(r.path == "/v1/traces" for r in sink.requests) >= 1  # the bridge did post, untraced
    posted = _posted_span_names(sink)
    assert {"work", "GET", "more"} <= set(posted) and "POST" not in posted, posted
    counters = bridge.status()["counters"]
    assert counters["exported"] == {exported: counters["ended"]} and balance(counters) == 0, counters


def _export_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "verl-otel-bridge-export" and t.is_alive()]


def test_flush_and_shutdown_deadlines_hold_while_the_exporter_retries(
    start_receiver: StartReceiver, monkeypatch: pytest.MonkeyPatch, make_bridge: Callable[..., Bridge]
) -> None:
    sink = start_receiver(answers=[(503, {"Retry-After": "3"})] * 50)
    before = set(_export_threads())
    # otlp_timeout_s (OTEL_EXPORTER_OTLP_TIMEOUT): the export alone would retry for a minute
    bridge = make_bridge(exporter="otlp", otlp_endpoint=sink.url, otlp_timeout_s=60, schedule_delay_ms=600_000)
    (worker,) = set(_export_threads()) - before
    for i in range(3):
        with bridge.span("s", i=i):
            pass
    assert bridge.force_flush(0.5) is False
    wait_until(lambda: sink.requests, what="the first attempt")
    assert worker.is_alive()  # the flush returned while the export still waits to retry
    bridge.shutdown(timeout_s=0.5)
    worker.join(WAIT_S)  # the exporter's shutdown ended the wait for the next retry
    assert not worker.is_alive()
    assert len(sink.requests) <= 2
    counters = bridge.status()["counters"]
    # Refused: spilled, to be sent again when the destination answers.
    assert balance(counters) == 0 and counters["spilled"] == 3 and counters["exported"] == {}, counters
