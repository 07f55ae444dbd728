"""The bridge's default sampler decides as OpenTelemetry's default does, for every kind of parent."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from verl_otel_bridge import Bridge, BridgeConfig
from verl_otel_bridge._internal.sampler import ParentBasedAlwaysOn, default_sampler

STATE = TraceState([("vendor", "value")])


def _parent(*, remote: bool, sampled: bool, state: TraceState | None) -> trace.Span:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=remote, trace_flags=flags, trace_state=state))


PARENTS = [None] + [
    _parent(remote=remote, sampled=sampled, state=state)
    for remote in (False, True)
    for sampled in (False, True)
    for state in (None, STATE)
]


@pytest.mark.parametrize("parent", PARENTS, ids=lambda p: "root" if p is None else repr(p.get_span_context()))
@pytest.mark.parametrize("attributes", [None, {"k": "v", "n": 3}])
def test_the_same_span_as_the_sdks_parent_based_always_on(parent: trace.Span | None, attributes: dict | None) -> None:
    made = []
    for sampler in (ParentBased(ALWAYS_ON), ParentBasedAlwaysOn()):
        tracer = TracerProvider(sampler=sampler).get_tracer("t")
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = tracer.start_span("s", context=context, attributes=attributes)
        span_context = span.get_span_context()
        made.append(
            (
                span.is_recording(),
                span_context.trace_flags.sampled,
                dict(span_context.trace_state),
                dict(getattr(span, "attributes", None) or {}),
            )
        )
    assert made[0] == made[1]


def test_the_description_is_the_sdks() -> None:
    assert ParentBasedAlwaysOn().get_description() == ParentBased(ALWAYS_ON).get_description()


@pytest.mark.parametrize("value", [None, "parentbased_always_on", " ParentBased_Always_On "])
def test_the_bridge_uses_it_for_the_default_sampler(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    else:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", value)
    assert isinstance(default_sampler(), ParentBasedAlwaysOn)


def test_a_sampler_the_environment_names_is_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert default_sampler() is None
    bridge = Bridge(BridgeConfig.resolve(environ={}, exporter="memory"))
    try:
        with bridge.session(sample=0, session=0), bridge.span("kept?"):
            pass
        assert bridge.status()["counters"]["started"] == 0  # OTEL_TRACES_SAMPLER=always_off: nothing is recorded
    finally:
        bridge.shutdown()
