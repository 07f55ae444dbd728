"""The hand-written OTLP encoder decodes to exactly what OpenTelemetry's own encoder produces."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from verl_otel_bridge._internal.otlp.encoding import SpanEncoder
from verl_otel_bridge._internal.records import replace_span

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
FLOATS = st.floats(allow_nan=False)  # NaN != NaN would fail the comparison, not the encoder
TEXT = st.text(max_size=40)
KEYS = st.text(min_size=1, max_size=20)
SCALARS = st.one_of(TEXT, st.booleans(), INT64, FLOATS)
VALUES = st.one_of(
    SCALARS,
    st.lists(TEXT, max_size=4).map(tuple),
    st.lists(INT64, max_size=4).map(tuple),
    st.lists(st.booleans(), max_size=3),
    st.lists(FLOATS, max_size=3),
    st.binary(max_size=16),
    st.none(),
    st.dictionaries(KEYS, SCALARS, max_size=3),
)
ATTRIBUTES = st.dictionaries(KEYS, VALUES, max_size=8)
IDS_128 = st.integers(min_value=1, max_value=(1 << 128) - 1)
IDS_64 = st.integers(min_value=1, max_value=(1 << 64) - 1)
TIMES = st.integers(min_value=0, max_value=(1 << 64) - 1)
TRACE_STATES = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9_\-*/]{0,8}", fullmatch=True),
    st.from_regex(r"[a-zA-Z0-9]{1,8}", fullmatch=True),
    max_size=3,
).map(lambda items: TraceState(list(items.items())))


@st.composite
def contexts(draw: st.DrawFn, *, remote: bool | None = None) -> SpanContext:
    return SpanContext(
        trace_id=draw(IDS_128),
        span_id=draw(IDS_64),
        is_remote=draw(st.booleans()) if remote is None else remote,
        trace_flags=TraceFlags(draw(st.sampled_from([0, 1]))),
        trace_state=draw(TRACE_STATES),
    )


SCOPES = st.sampled_from(
    [
        InstrumentationScope("verl_otel_bridge", "0.1.0"),
        InstrumentationScope("other", None, "https://opentelemetry.io/schemas/1.21.0", {"a": 1}),
        None,
    ]
)
RESOURCES = st.sampled_from(
    [
        Resource.create({"service.name": "trainer"}),
        Resource({"service.name": "other", "n": 3}, "https://opentelemetry.io/schemas/1.21.0"),
        Resource({}),
    ]
)


@st.composite
def spans(draw: st.DrawFn) -> ReadableSpan:
    start = draw(TIMES)
    return ReadableSpan(
        name=draw(TEXT),
        context=draw(contexts(remote=False)),
        parent=draw(st.none() | contexts()),
        resource=draw(RESOURCES),
        attributes=draw(ATTRIBUTES),
        events=draw(
            st.lists(
                st.builds(Event, name=TEXT, attributes=ATTRIBUTES, timestamp=TIMES),
                max_size=2,
            )
        ),
        links=draw(st.lists(st.builds(Link, contexts(), ATTRIBUTES), max_size=2)),
        kind=draw(st.sampled_from(list(SpanKind))),
        status=draw(
            st.one_of(
                st.just(Status()),
                st.just(Status(StatusCode.OK)),
                st.builds(Status, st.just(StatusCode.ERROR), TEXT),
            )
        ),
        start_time=start,
        end_time=draw(st.none() | st.integers(min_value=start, max_value=(1 << 64) - 1)),
        instrumentation_scope=draw(SCOPES),
    )


def decoded(body: bytes) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(body)


def expected_message(batch: list[ReadableSpan]) -> ExportTraceServiceRequest:
    """OpenTelemetry's encoding, with the same grouping as ours (by object, in first-seen order)."""
    message: ExportTraceServiceRequest = encode_spans(batch)
    return message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spans(), min_size=1, max_size=6))
def test_the_same_message_as_opentelemetrys_encoder(batch: list[ReadableSpan]) -> None:
    assert decoded(SpanEncoder().encode(batch)) == expected_message(batch)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(spans(), ATTRIBUTES), min_size=1, max_size=5))
def test_resource_and_attribute_overrides_equal_rewritten_spans(
    pairs: list[tuple[ReadableSpan, dict[str, Any]]],
) -> None:
    resource = Resource.create({"service.name": "rl_insight_monitor"})
    batch = [span for span, _ in pairs]
    attributes = [attrs for _, attrs in pairs]
    rewritten = [replace_span(span, resource=resource, attributes=attrs) for span, attrs in pairs]
    assert decoded(SpanEncoder().encode(batch, resource=resource, attributes=attributes)) == expected_message(rewritten)


EVENT_LISTS = st.lists(
    st.builds(Event, name=TEXT, attributes=st.dictionaries(KEYS, SCALARS, max_size=3), timestamp=TIMES), max_size=2
)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(spans(), ATTRIBUTES, EVENT_LISTS, st.booleans()), min_size=1, max_size=5))
def test_per_span_attribute_event_and_resource_overrides_equal_rewritten_spans(
    rows: list[tuple[ReadableSpan, dict[str, Any], list[Event], bool]],
) -> None:
    """What the generic vocabulary hands ``otlp`` beside each span instead of a copy of it."""
    other = Resource.create({"openinference.project.name": "p"})
    batch = [span for span, *_ in rows]
    attributes = [attrs for _, attrs, _, _ in rows]
    events = [listed for _, _, listed, _ in rows]
    resources = [other if moved else span.resource for span, _, _, moved in rows]
    rewritten = [
        replace_span(span, attributes=attrs, events=listed, resource=resource)
        for (span, attrs, listed, _), resource in zip(rows, resources, strict=True)
    ]
    body = SpanEncoder().encode(batch, attributes=attributes, events=events, resources=resources)
    assert decoded(body) == expected_message(rewritten)


def test_remembered_attribute_pairs_keep_their_type() -> None:
    """``True == 1`` and they hash alike; the memo must still encode a bool as a bool and an int as an int."""
    encoder = SpanEncoder()
    resource = Resource({})
    first = ReadableSpan(name="a", context=SpanContext(1, 1, False), resource=resource, attributes={"k": True})
    second = ReadableSpan(name="b", context=SpanContext(1, 2, False), resource=resource, attributes={"k": 1})
    values = [
        span.attributes[0].value
        for resource_spans in decoded(encoder.encode([first, second])).resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]
    assert [value.WhichOneof("value") for value in values] == ["bool_value", "int_value"]


def test_the_memo_stays_within_its_bound() -> None:
    encoder = SpanEncoder(memo_size=50)
    resource = Resource({})
    many = [
        ReadableSpan(
            name="s", context=SpanContext(1, n + 1, False), resource=resource, attributes={"n": n, "s": f"v{n}"}
        )
        for n in range(500)
    ]
    message = decoded(encoder.encode(many))
    assert len(encoder._memo) <= 50
    assert message == expected_message(many)


def test_values_opentelemetry_cannot_encode_are_left_out_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    resource = Resource({})
    batch = [
        ReadableSpan(
            name="s",
            context=SpanContext(1, n + 1, False),
            resource=resource,
            attributes={"big": 1 << 70, "surrogate": "\udc80", "ok": n, "object": object()},
        )
        for n in range(3)
    ]
    with caplog.at_level(logging.WARNING, logger="verl_otel_bridge._internal.otlp.encoding"):
        message = decoded(SpanEncoder().encode(batch))
    kept = [[kv.key for kv in span.attributes] for span in message.resource_spans[0].scope_spans[0].spans]
    assert kept == [["ok"]] * 3
    ours = [r.getMessage() for r in caplog.records if r.name == "verl_otel_bridge._internal.otlp.encoding"]
    assert len(ours) == 3 and all("left out of OTLP spans" in m for m in ours), ours


def test_attribute_lists_must_match_the_spans() -> None:
    span = ReadableSpan(name="s", context=SpanContext(1, 1, False), resource=Resource({}))
    with pytest.raises(ValueError, match="2 attribute mappings for 1 spans"):
        SpanEncoder().encode([span], attributes=[{}, {}])
    with pytest.raises(ValueError, match="0 event lists for 1 spans"):
        SpanEncoder().encode([span], events=[])
    with pytest.raises(ValueError, match="2 resources for 1 spans"):
        SpanEncoder().encode([span], resources=[Resource({}), Resource({})])


def test_empty_batch_is_an_empty_request() -> None:
    assert SpanEncoder().encode([]) == b""
    assert decoded(b"") == ExportTraceServiceRequest()
