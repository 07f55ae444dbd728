"""The bridge inside the OpenTelemetry ecosystem: what a user of the standard tools relies on.

* ``OTEL_TRACES_EXPORTER=rl_insight``: the SDK's own auto-configuration (and the
  ``opentelemetry-instrument`` command of ``opentelemetry-distro``) find the
  bridge's exporter through its entry point and build it with no arguments,
  from the environment alone.
* The standard ``OTEL_*`` variables the bridge honours. Already covered
  elsewhere, so not repeated here: ``OTEL_SERVICE_NAME`` on the resource and
  the ``OTEL_BSP_*`` aliases in the resolved config (``test_config.py``),
  ``OTEL_SDK_DISABLED=true`` making no spans (``test_disabled.py``).
* ``instrument(provider)`` on a ``TracerProvider`` the application owns.
* Exporter lists: the first gets every span, the others copies.

The subprocess tests run the interpreter of this test run (so its venv), with
the environment the autouse fixture cleaned plus the variables under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import verl_otel_bridge as vob
from verl_otel_bridge._internal.config import value_sources
from verl_otel_bridge._internal.exporters.destination import Outcome
from verl_otel_bridge._internal.exporters.jsonl import JsonlFile
from verl_otel_bridge._internal.identity import IDENTITY_KEYS

from .helpers import WAIT_S, assert_balanced, finished, identity_of, wait_until

#: Bound of every subprocess (each takes well under a second when things work).
CHILD_TIMEOUT_S = 60.0

#: Set under nox (the unit session sets NOX_CURRENT_SESSION, the integration ones
#: RL_INSIGHT_TEST_CASE) and in CI: there a missing ecosystem tool is a failure.
STRICT = any(os.environ.get(name) for name in ("RL_INSIGHT_TEST_CASE", "NOX_CURRENT_SESSION", "CI"))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_child(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with a copy of the (cleaned) environment plus ``env``; bounded, output captured."""
    return subprocess.run(
        args,
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# -- 1. OTEL_TRACES_EXPORTER=rl_insight: the entry point -----------------------

#: Plain OpenTelemetry spans (no bridge API), a parent and two children.
_APP_SPANS = """
from opentelemetry import trace
tracer = trace.get_tracer("my.app")
with tracer.start_as_current_span("request", attributes={"tag": TAG, "api_key": "hunter2"}):
    for i in range(2):
        with tracer.start_as_current_span("step", attributes={"tag": TAG, "i": i}):
            pass
provider = trace.get_tracer_provider()
processors = provider._active_span_processor._span_processors
print("EXPORTERS " + ",".join(type(getattr(p, "span_exporter", p)).__qualname__ for p in processors), flush=True)
"""

_AUTOCONFIGURE = (
    """
import sys
TAG = sys.argv[1]
from opentelemetry.sdk._configuration import _OTelSDKConfigurator
_OTelSDKConfigurator().configure()
"""
    + _APP_SPANS
    + """
trace.get_tracer_provider().shutdown()
"""
)

#: Under ``opentelemetry-instrument`` the script does nothing OpenTelemetry-specific
#: to set up or shut down: the provider's exit hook flushes the batch processor.
_INSTRUMENTED = (
    """
import sys
TAG = sys.argv[1]
"""
    + _APP_SPANS
)


def rl_insight_exporter_env(jsonl: Path) -> dict[str, str]:
    """Select the bridge's exporter by name; RL-Insight is not installed here, so its fallback is JSONL."""
    return {
        "OTEL_TRACES_EXPORTER": "rl_insight",
        "OTEL_METRICS_EXPORTER": "none",  # opentelemetry-distro defaults both to otlp
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "autoconfigured-app",
        "VERL_OTEL_BRIDGE_FALLBACK": "jsonl",
        "VERL_OTEL_BRIDGE_JSONL_PATH": str(jsonl),
        "VERL_OTEL_BRIDGE_REDACT_ATTRIBUTES": "api_key",
    }


def check_app_spans_in_fallback(done: subprocess.CompletedProcess[str], jsonl: Path, tag: str) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    # the SDK's processor wraps the bridge's class, found by name through the entry point
    assert "EXPORTERS RLInsightSpanExporter" in done.stdout, (done.stdout, done.stderr[-2000:])
    # ... built with no arguments: the fallback, its path and the redaction came from VERL_OTEL_BRIDGE_* variables
    records = [r for r in read_jsonl(jsonl) if r["attributes"].get("tag") == tag]
    assert sorted(r["name"] for r in records) == ["request", "step", "step"], (records, done.stderr[-2000:])
    (root,) = [r for r in records if r["name"] == "request"]
    steps = [r for r in records if r["name"] == "step"]
    assert root["parent_span_id"] is None
    # redact_attributes applies here too, though no bridge pipeline wraps the exporter
    assert root["attributes"]["api_key"] == "[REDACTED]" and "hunter2" not in jsonl.read_text()
    assert {r["parent_span_id"] for r in steps} == {root["span_id"]}
    assert {r["trace_id"] for r in records} == {root["trace_id"]}
    assert sorted(r["attributes"]["i"] for r in steps) == [0, 1]
    assert {r["scope"] for r in records} == {"my.app"}
    # the SDK's resource (OTEL_SERVICE_NAME) is kept: the exporter forwards the spans unchanged
    assert {r["resource"]["service.name"] for r in records} == {"autoconfigured-app"}
    said = [line for line in done.stderr.splitlines() if "RL-Insight is not usable" in line]
    assert len(said) == 1 and "jsonl exporter" in said[0], done.stderr[-2000:]


def test_otel_traces_exporter_rl_insight_with_sdk_autoconfiguration(tmp_path: Path) -> None:
    script = tmp_path / "autoconfigured.py"
    script.write_text(_AUTOCONFIGURE)
    jsonl = tmp_path / "fallback.jsonl"
    done = run_child([sys.executable, str(script), "autoconf"], rl_insight_exporter_env(jsonl), tmp_path)
    check_app_spans_in_fallback(done, jsonl, "autoconf")


def opentelemetry_instrument() -> Path:
    """The ``opentelemetry-instrument`` command of this interpreter's environment (skip or fail without it)."""
    command = Path(sys.executable).parent / "opentelemetry-instrument"
    if command.is_file():
        return command
    message = (
        f"opentelemetry-instrument is not installed next to {sys.executable}; "
        "the test extra needs 'opentelemetry-distro>=0.51b0' (pip install opentelemetry-distro)"
    )
    if STRICT:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def test_otel_traces_exporter_rl_insight_with_opentelemetry_instrument(tmp_path: Path) -> None:
    command = opentelemetry_instrument()
    script = tmp_path / "instrumented.py"
    script.write_text(_INSTRUMENTED)
    jsonl = tmp_path / "fallback.jsonl"
    done = run_child(
        [str(command), sys.executable, str(script), "instrumented"], rl_insight_exporter_env(jsonl), tmp_path
    )
    check_app_spans_in_fallback(done, jsonl, "instrumented")


# -- 2. standard variables -----------------------------------------------------


def test_otel_resource_attributes_reach_the_bridge_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,team=rl%20infra")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    bridge = vob.configure(exporter="memory")
    with vob.session(sample=0, session=0, global_steps=1):
        with vob.span("generate"):
            pass
    spans = finished(bridge)
    assert sorted(s.name for s in spans) == ["agent_session", "generate"]
    for span in spans:
        resource = dict(span.resource.attributes)
        assert resource["deployment.environment"] == "ci"
        assert resource["team"] == "rl infra"  # percent-decoded, as the SDK does
        assert resource["service.name"] == "trainer"  # OTEL_SERVICE_NAME wins over the bridge's default


def test_service_name_in_otel_resource_attributes_is_not_overridden_by_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without OTEL_SERVICE_NAME, ``service.name`` in OTEL_RESOURCE_ATTRIBUTES names the service (not the default)."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource,deployment.environment=ci")
    bridge = vob.configure(exporter="memory")
    assert bridge.config.service_name == "from-resource"
    with vob.span("s"):
        pass
    (span,) = finished(bridge)
    assert span.resource.attributes["service.name"] == "from-resource"
    assert value_sources()["service_name"] == "environment OTEL_RESOURCE_ATTRIBUTES"
    # and the usual precedence on top: OTEL_SERVICE_NAME, then the bridge's own variable, then keywords
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-otel-service-name")
    assert vob.BridgeConfig.resolve().service_name == "from-otel-service-name"
    monkeypatch.setenv("VERL_OTEL_BRIDGE_SERVICE_NAME", "from-prefixed")
    assert vob.BridgeConfig.resolve().service_name == "from-prefixed"
    assert vob.BridgeConfig.resolve(service_name="kw").service_name == "kw"


def test_otel_bsp_variables_bound_the_bridge_export_queue(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """OTEL_BSP_MAX_QUEUE_SIZE / _MAX_EXPORT_BATCH_SIZE / _SCHEDULE_DELAY from the environment shape the real queue.

    The JSONL exporter (queued) is held inside its first export: then at most
    ``OTEL_BSP_MAX_QUEUE_SIZE`` spans wait, the rest are counted as dropped,
    and every export call gets at most ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans.
    """
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "0")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_SPILL_MAX_BYTES", "0")  # spilling off: past the bound, dropped
    entered, release = threading.Event(), threading.Event()
    batches: list[int] = []
    real_export = JsonlFile.send

    def held_export(self: JsonlFile, spans: Any) -> Outcome:
        batches.append(len(spans))
        entered.set()
        release.wait(WAIT_S)
        return real_export(self, spans)

    monkeypatch.setattr(JsonlFile, "send", held_export)
    bridge = vob.configure(exporter="jsonl", jsonl_path=str(tmp_path / "spans.jsonl"))
    assert (bridge.config.max_queue_size, bridge.config.max_export_batch_size, bridge.config.schedule_delay_ms) == (
        4,
        2,
        0,
    )
    with vob.span("first"):
        pass
    # schedule delay 0: the worker takes the span at once, without a flush
    assert entered.wait(WAIT_S), "the first span was not exported without a flush"
    for i in range(10):
        with vob.span("more", i=i):
            pass
    release.set()
    counters = assert_balanced(bridge)
    assert counters["dropped"] == 10 - 4
    assert counters["exported"] == {"jsonl": 1 + 4}
    assert batches[0] == 1 and max(batches) <= 2 and sum(batches) == 5, batches
    assert len(read_jsonl(tmp_path / "spans.jsonl")) == 5


def test_otel_bsp_max_queue_size_alone_fits_the_default_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Setting only the queue below the default batch (512) is valid: the batch shrinks to it."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    bridge = vob.configure(exporter="memory")
    assert (bridge.config.max_queue_size, bridge.config.max_export_batch_size) == (100, 100)


# -- 3. instrument(provider) ---------------------------------------------------


def test_instrument_an_application_provider() -> None:
    global_before = trace.get_tracer_provider()
    app_exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "the-app"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(app_exporter))
    other_library = provider.get_tracer("other.library")
    try:
        bridge = vob.instrument(provider, exporter="memory", project="proj", experiment_name="exp")
        assert vob.get_bridge() is bridge

        with vob.session(sample=3, session=1, global_steps=9) as s:
            with other_library.start_as_current_span("http.request") as request:
                request.set_attribute("http.method", "GET")
                with vob.span("bridge.child"):
                    pass
        with other_library.start_as_current_span("outside.session"):
            pass

        ids = lambda spans: {span.context.span_id: span for span in spans}  # noqa: E731
        app_spans, bridge_spans = ids(app_exporter.get_finished_spans()), ids(finished(bridge))
        names = sorted(["agent_session", "http.request", "bridge.child", "outside.session"])
        assert sorted(span.name for span in app_spans.values()) == names
        assert set(bridge_spans) == set(app_spans)  # the same spans, in both places
        identity = {key: s.identity.attributes[key] for key in IDENTITY_KEYS if key in s.identity.attributes}
        assert identity["global_steps"] == 9 and identity["project"] == "proj"
        for spans in (app_spans, bridge_spans):
            by_name = {span.name: span for span in spans.values()}
            for name in ("agent_session", "http.request", "bridge.child"):
                assert identity_of(by_name[name]) == identity, name
            assert identity_of(by_name["outside.session"]) == {}
            assert by_name["http.request"].attributes["http.method"] == "GET"
            # one trace: the other library's span sits under the session, the bridge's span under it
            assert by_name["http.request"].parent.span_id == by_name["agent_session"].context.span_id
            assert by_name["bridge.child"].parent.span_id == by_name["http.request"].context.span_id
            # everything carries the application's resource, not one of the bridge's own
            assert {span.resource.attributes["service.name"] for span in spans.values()} == {"the-app"}
        assert_balanced(bridge)

        vob.shutdown()
        exported_by_bridge = bridge.status()["counters"]["ended"]
        # the application's provider keeps working, and the bridge no longer exports
        with other_library.start_as_current_span("after.bridge.shutdown"):
            pass
        assert app_exporter.get_finished_spans()[-1].name == "after.bridge.shutdown"
        assert len(bridge.memory_exporter.get_finished_spans()) == len(names)
        assert bridge.status()["counters"]["exported"] == {"memory": exported_by_bridge}
        assert trace.get_tracer_provider() is global_before  # never touched
        assert trace.get_tracer_provider() is not provider
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("variable", "value"),
    [(None, None), ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "6"), ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")],
)
def test_bridge_spans_carry_what_a_bare_sdk_span_with_the_same_attributes_carries(
    variable: str | None, value: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge hands its spans' attributes to the SDK already converted; the span still holds
    what a plain SDK span made with the same attributes holds, the SDK's limits applied."""
    if variable is not None:
        monkeypatch.setenv(variable, value)
    bridge = vob.Bridge(vob.BridgeConfig.resolve(environ={}, exporter="memory"))
    bare = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(bare))
    with bridge.session(sample="sample-1", session=2, uid="user-1", global_steps=7) as s:
        with bridge.turn(1, type="generate") as turn:
            turn.record(prompt_tokens=5, finish_reason="stop", content="a long answer")
        made = {**dict(finished(bridge)[-1].attributes or {})}
        own = {"turn": 1, "type": "generate", "gen_ai.operation.name": "chat"}
        with provider.get_tracer("bare").start_as_current_span(
            "agent_turn", attributes={**own, **s.identity.attributes}
        ) as span:
            span.set_attributes({k: v for k, v in made.items() if k not in own and k not in s.identity.attributes})
    expected = dict(bare.get_finished_spans()[-1].attributes or {})
    bridge.shutdown()
    assert made == expected
    if variable is None:
        assert identity_of(made) == dict(s.identity.attributes) and made["content"] == "a long answer"


# -- 4. exporter lists ---------------------------------------------------------


@pytest.mark.parametrize("source", ["list", "environment"])
def test_memory_and_jsonl_both_get_every_span(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "copies.jsonl"
    if source == "list":
        bridge = vob.configure(exporter=["memory", "jsonl"], jsonl_path=str(path))
    else:
        monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory, jsonl")
        monkeypatch.setenv("VERL_OTEL_BRIDGE_JSONL_PATH", str(path))
        bridge = vob.get_bridge()  # built from the environment alone
    assert bridge.config.exporters == ("memory", "jsonl")
    with vob.session(sample=0, session=0, global_steps=2):
        for turn in range(3):
            with vob.turn(turn):
                pass
        with bridge.tracer.start_as_current_span("plain"):
            pass
    vob.record_span("recorded", start_time_ns=1_764_000_000_000_000_000, end_time_ns=1_764_000_000_000_000_500)

    in_memory = {format(span.context.span_id, "016x"): span for span in finished(bridge)}
    in_file = {record["span_id"]: record for record in read_jsonl(path)}
    assert len(in_memory) == 6
    assert set(in_file) == set(in_memory)
    for span_id, span in in_memory.items():
        record = in_file[span_id]
        assert record["name"] == span.name
        assert (record["start_time_ns"], record["end_time_ns"]) == (span.start_time, span.end_time)
        assert record["attributes"].get("state_lane_id") == (span.attributes or {}).get("state_lane_id")
    counters = assert_balanced(bridge)
    assert counters["exported"] == {"memory": 6}  # the primary, in the accounting equation
    assert counters["copies.jsonl"] == 6  # the copy, counted apart
    assert "copies_failed.jsonl" not in counters
    wait_until(lambda: bridge.status()["pending"]["queued"] == 0, what="an empty queue")
