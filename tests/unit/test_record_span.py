"""record_span: exact times, parent, identity; impossible times are counted, logged once, never raised."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from verl_otel_bridge.testing import SpanCapture

from .helpers import INVALID_TIMES, T0, identity_of


def test_exact_times_parent_and_identity(otel_spans: SpanCapture) -> None:
    bridge = otel_spans.bridge
    with bridge.session(sample=1, session=2, global_steps=3) as session:
        with bridge.span("turn") as turn:
            bridge.record_span("generate", start_time_ns=T0, end_time_ns=T0 + 987_654_321, attributes={"tokens": 5})
    span = otel_spans.one("generate")
    assert (span.start_time, span.end_time) == (T0, T0 + 987_654_321)
    assert span.parent is not None and span.parent.span_id == turn.get_span_context().span_id
    assert span.context.trace_id == turn.get_span_context().trace_id
    assert identity_of(span) == session.identity.to_dict()
    assert span.attributes["tokens"] == 5


def test_zero_length_span_is_valid(otel_spans: SpanCapture) -> None:
    otel_spans.bridge.record_span("instant", start_time_ns=T0, end_time_ns=T0)
    assert otel_spans.one("instant").end_time == T0


def test_float_nanoseconds_are_accepted_as_integers(otel_spans: SpanCapture) -> None:
    otel_spans.bridge.record_span("f", start_time_ns=float(T0), end_time_ns=float(T0 + 10**9))
    span = otel_spans.one("f")
    assert isinstance(span.start_time, int) and span.end_time - span.start_time == 10**9


@pytest.mark.parametrize(("start", "end", "kind"), INVALID_TIMES)
def test_invalid_times_are_not_recorded_and_counted(otel_spans: SpanCapture, start: Any, end: Any, kind: str) -> None:
    otel_spans.bridge.record_span("bad", start_time_ns=start, end_time_ns=end)
    assert otel_spans.spans == []
    counters = otel_spans.bridge.status()["counters"]
    assert counters["invalid"] == 1
    assert counters["started"] == 0


def test_each_kind_of_invalid_time_is_logged_once(otel_spans: SpanCapture, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="verl_otel_bridge")
    for _ in range(3):
        for start, end, _kind in INVALID_TIMES:
            otel_spans.bridge.record_span("bad", start_time_ns=start, end_time_ns=end)
    assert otel_spans.bridge.status()["counters"]["invalid"] == 3 * len(INVALID_TIMES)
    messages = [r.getMessage() for r in caplog.records if "record_span" in r.getMessage()]
    kinds = sorted({kind for _, _, kind in INVALID_TIMES})
    assert len(messages) == len(kinds), messages
    for kind in kinds:
        assert sum(kind in message for message in messages) == 1, (kind, messages)
    assert all(r.levelno == logging.WARNING for r in caplog.records if "record_span" in r.getMessage())
    assert all("'bad'" in message for message in messages)  # names the span it refused
    otel_spans.bridge.record_span("good", start_time_ns=T0, end_time_ns=T0 + 1)  # the bridge still works
    assert [span.name for span in otel_spans.spans] == ["good"]


def test_record_span_without_a_current_span_is_a_root(otel_spans: SpanCapture) -> None:
    otel_spans.bridge.record_span("root", start_time_ns=T0, end_time_ns=T0 + 1)
    span = otel_spans.one("root")
    assert span.parent is None
    assert identity_of(span) == {}
